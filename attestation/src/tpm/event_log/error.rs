//! Why a log did not parse, replay, or prove what a view reads from it.

use super::HashAlg;

/// Why an event log, or one of its events, was refused. Every variant about an event names its
/// index (0-based, the header included) and, when parsing, the byte offset where it starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventLogError {
    /// The log has no bytes.
    #[error("the event log is empty")]
    Empty,
    /// The log ended inside a field.
    #[error("event {index} at byte {offset}: truncated in {what}")]
    Truncated {
        /// The event.
        index: usize,
        /// Where the event starts.
        offset: usize,
        /// The field being read.
        what: &'static str,
    },
    /// A structurally wrong event.
    #[error("event {index} at byte {offset}: {reason}")]
    Malformed {
        /// The event.
        index: usize,
        /// Where the event starts.
        offset: usize,
        /// What is wrong.
        reason: String,
    },
    /// More events than [`super::MAX_EVENTS`].
    #[error("the event log has more than {limit} events")]
    TooManyEvents {
        /// The cap.
        limit: usize,
    },
    /// Replay asked for a bank the log does not have.
    #[error("the event log has no {alg} digests")]
    NoBank {
        /// The bank.
        alg: HashAlg,
    },
    /// An event that extends a PCR has no digest in the bank being replayed or read.
    #[error("{event}: no {alg} digest")]
    MissingDigest {
        /// The event, as [`super::Event::describe`] names it.
        event: String,
        /// The bank.
        alg: HashAlg,
    },
    /// The event's digest is not the digest of its data, so the data proves nothing.
    #[error("{event}: the {alg} digest does not cover the event data")]
    DigestMismatch {
        /// The event, as [`super::Event::describe`] names it.
        event: String,
        /// The bank.
        alg: HashAlg,
    },
    /// The event data does not decode as its type says it should.
    #[error("{event}: {reason}")]
    BadEventData {
        /// The event, as [`super::Event::describe`] names it.
        event: String,
        /// What is wrong.
        reason: String,
    },
}
