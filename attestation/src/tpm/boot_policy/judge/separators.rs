//! Where a PCR's pre-OS measurements end: its `EV_SEPARATOR`, found by its digest, not by its
//! label.
//!
//! The replay proves each PCR's sequence of digests; an event's type is the log writer's word.
//! The firmware extends the separator value (`00000000`) into PCRs 0 to 7 before it hands over
//! to a boot application, and nothing before it extends that digest, so the first event of the
//! PCR carrying the separator's digest is the firmware's separator. It must say so (typed
//! `EV_SEPARATOR`, its data the value its digest covers), and no other event of the PCR may be
//! typed a separator or carry a separator's digest: a forged log that types the real separator
//! `EV_POST_CODE` and a later event (an application that ran first) `EV_SEPARATOR` is refused
//! at one or the other.

use super::{BootRefusal, of_pcr, refuse};
use crate::tpm::event_log::{Event, EventLog, HashAlg, event_type};

/// The values a separator carries: `00000000` (normal) and the two error values.
const NORMAL: [u8; 4] = [0, 0, 0, 0];
const ERRORS: [[u8; 4]; 2] = [[1, 0, 0, 0], [0xff, 0xff, 0xff, 0xff]];

/// A PCR cut at its separator.
#[derive(Debug)]
pub(super) struct Split<'l> {
    /// The firmware's events before the separator.
    pub before: Vec<&'l Event>,
    /// The events after it, in order.
    pub after: Vec<&'l Event>,
}

/// Whether a PCR without any separator is judged whole (its every event after the separator
/// that never came), or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Missing {
    /// Refused: the firmware never handed over.
    Refused,
    /// Judged whole. The quirk of GCE's 2019 firmware, which logs no separator in PCRs 0 to 6
    /// (`sb_cert_eventlog`, whose replay gives the PCR 4 go-attestation recorded): with no event
    /// carrying the separator's digest there is no firmware part to pass anything off as.
    JudgedWhole,
}

/// Cuts `pcr`'s events (those that extend it) at its one separator.
pub(super) fn split(log: &EventLog, alg: HashAlg, pcr: u32, missing: Missing) -> Result<Split<'_>, BootRefusal> {
    let values: Vec<Vec<u8>> = std::iter::once(NORMAL).chain(ERRORS).map(|v| alg.digest(&v)).collect();
    let carries_separator = |e: &Event| e.digest(alg).is_some_and(|d| values.iter().any(|v| v == d));
    let events: Vec<&Event> = of_pcr(log, pcr).collect();
    let Some(at) = events.iter().position(|e| carries_separator(e)) else {
        if let Some(labelled) = events.iter().find(|e| e.event_type == event_type::SEPARATOR) {
            return Err(refuse(format!(
                "{}: typed a separator, but its digest is not the separator value's: PCR {pcr}'s separator is not where the log says",
                labelled.describe()
            )));
        }
        if missing == Missing::JudgedWhole {
            return Ok(Split {
                before: Vec::new(),
                after: events,
            });
        }
        return Err(refuse(format!(
            "PCR {pcr} has no separator: the firmware never handed over to a boot loader in this log"
        )));
    };
    let separator = events[at];
    if let Some(early) = events[..at].iter().find(|e| e.event_type == event_type::SEPARATOR) {
        return Err(refuse(format!(
            "{}: typed a separator, but its digest is not the separator value's (PCR {pcr}'s separator is {})",
            early.describe(),
            separator.describe()
        )));
    }
    if separator.event_type != event_type::SEPARATOR {
        return Err(refuse(format!(
            "{}: carries the separator value's digest, so it is PCR {pcr}'s separator, but the log types it {}",
            separator.describe(),
            separator.type_name()
        )));
    }
    if separator.digest(alg) != Some(alg.digest(&separator.data).as_slice()) {
        return Err(refuse(format!(
            "{}: its data is not the value its digest covers",
            separator.describe()
        )));
    }
    if separator.data.as_slice() != NORMAL {
        return Err(refuse(format!(
            "{}: the firmware logged an error separator ({}): its pre-OS measurements of PCR {pcr} did not end normally",
            separator.describe(),
            crate::digest::hex(&separator.data)
        )));
    }
    let after: Vec<&Event> = events[at + 1..].to_vec();
    if let Some(second) = after
        .iter()
        .find(|e| e.event_type == event_type::SEPARATOR || carries_separator(e))
    {
        return Err(refuse(format!(
            "{}: a second separator in PCR {pcr} (the firmware's is {}): extended after the boot, not by it",
            second.describe(),
            separator.describe()
        )));
    }
    Ok(Split {
        before: events[..at].to_vec(),
        after,
    })
}

/// Whether `event`'s digest in `alg` covers its data, with or without one trailing NUL.
pub(super) fn covers(event: &Event, alg: HashAlg) -> bool {
    let Some(digest) = event.digest(alg) else {
        return false;
    };
    let without_nul = event.data.strip_suffix(&[0]);
    std::iter::once(event.data.as_slice())
        .chain(without_nul)
        .any(|data| digest == alg.digest(data).as_slice())
}
