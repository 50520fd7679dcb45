//! The key `tpm/v1` challenge secrets and challenge annotation macs are derived under (SPEC
//! section 5), as the verifier holds it: the newest key, under which new challenges are written,
//! and the keys it replaced, which still verify the challenges written under them until those
//! expire.
//!
//! The key lives in a Secret of the signer that every replica reads, and an operator may rotate
//! it (delete the Secret, or replace its bytes). Replicas read it again every few seconds
//! ([`ChallengeKey::follow`]), so they agree again within that period; in between, a replica may
//! meet a challenge written under a key it has not read yet, which is why an annotation whose
//! mac verifies under no key held is a forgery only once the key was read after the CSR was
//! first seen (the verifier asks for a read first: [`crate::cloud::CloudCall::ReloadChallengeKey`]).
//!
//! A replaced key verifies only challenges issued before it was replaced: whoever learns an old
//! key cannot write a fresh challenge under it, and the challenges it did write expire within the
//! challenge lifetime.

use std::sync::{Arc, PoisonError, RwLock};

use time::{Duration, OffsetDateTime};
use zeroize::Zeroizing;

/// Shortest challenge key accepted.
pub const MIN_CHALLENGE_KEY: usize = 32;

/// Replaced keys kept: a burst of rotations cannot grow the ring, and a key replaced four times
/// over is older than any live challenge at the default lifetime.
const REPLACED_KEPT: usize = 4;

/// How far replicas' clocks may disagree about when a key was replaced.
const CLOCK_SKEW: Duration = Duration::seconds(60);

/// How long after its key changed a reader may still lack a replaced key: replicas read the
/// Secret every 10 s, and the first one that held the replaced key records it there on its next
/// read. Until then an annotation no key held verifies is not yet called a forgery.
pub const SETTLE: Duration = Duration::seconds(30);

/// The challenge key slot, shared between the verifier and whoever reads the Secret. Until a key
/// is there the verifier holds `tpm/v1` CSRs back instead of judging them.
///
/// `explain` judges with the key [withheld](ChallengeKey::withheld): whoever holds the key can
/// answer a challenge without the TPM, so a read-only tool must never read it.
#[derive(Clone, Default)]
pub struct ChallengeKey {
    ring: Arc<RwLock<Ring>>,
    withheld: bool,
}

#[derive(Default)]
struct Ring {
    current: Option<Zeroizing<Vec<u8>>>,
    /// Newest first.
    replaced: Vec<Replaced>,
    /// When the Secret was last read (`None`: a key given once, never read again).
    read_at: Option<OffsetDateTime>,
    /// When the current key was first read.
    current_since: Option<OffsetDateTime>,
}

#[derive(Clone)]
struct Replaced {
    key: Zeroizing<Vec<u8>>,
    at: OffsetDateTime,
}

impl std::fmt::Debug for ChallengeKey {
    // The key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_loaded() {
            "ChallengeKey(loaded)"
        } else if self.withheld {
            "ChallengeKey(withheld)"
        } else {
            "ChallengeKey(not loaded)"
        })
    }
}

/// The challenge key is too short to be a secret.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the tpm/v1 challenge key has {0} bytes; it needs at least {MIN_CHALLENGE_KEY} random bytes")]
pub struct WeakChallengeKey(pub usize);

/// What one read of the key's Secret changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRead {
    /// The first key.
    Loaded,
    /// The key held already.
    Unchanged,
    /// Another key: it replaced the one held, which still verifies its challenges.
    Rotated,
}

impl ChallengeKey {
    /// A key given once (offline `check`, tests): never read again, so an annotation none of
    /// its keys verifies is a forgery at once.
    pub fn loaded(key: Vec<u8>) -> Result<Self, WeakChallengeKey> {
        let slot = Self::default();
        {
            let mut ring = slot.write();
            ring.current = Some(strong(key)?);
        }
        Ok(slot)
    }

    /// No key, on purpose (`explain`): the verifier checks all it can without one (EK trust,
    /// AK, quote, a challenge's age, CSR #2 against CSR #1) and says what only the signer can
    /// check: whether a challenge annotation is the signer's, and CSR #2's answer.
    pub fn withheld() -> Self {
        Self {
            ring: Arc::default(),
            withheld: true,
        }
    }

    /// Takes the key as its Secret held it at `read_at` (the reader's clock): the first key,
    /// the same one again, or another, which replaces the one held.
    pub fn follow(&self, key: Vec<u8>, read_at: OffsetDateTime) -> Result<KeyRead, WeakChallengeKey> {
        let key = strong(key)?;
        let mut ring = self.write();
        ring.read_at = Some(read_at);
        let read = match ring.current.take() {
            None => KeyRead::Loaded,
            Some(held) if *held == *key => {
                ring.current = Some(held);
                return Ok(KeyRead::Unchanged);
            }
            Some(held) => {
                ring.replaced.insert(0, Replaced { key: held, at: read_at });
                ring.replaced.truncate(REPLACED_KEPT);
                KeyRead::Rotated
            }
        };
        // A key that comes back (a rotation undone) is current again, not also a replaced one.
        ring.replaced.retain(|r| *r.key != *key);
        ring.current = Some(key);
        ring.current_since = Some(read_at);
        Ok(read)
    }

    /// Also verifies challenges under `key`, replaced at `replaced_at`: a key the Secret records
    /// as replaced, which this reader may never have held (it started after the rotation).
    pub fn remember(&self, key: Vec<u8>, replaced_at: OffsetDateTime) -> Result<(), WeakChallengeKey> {
        let key = strong(key)?;
        let mut ring = self.write();
        if ring.current.as_deref().is_some_and(|current| **current == *key)
            || ring.replaced.iter().any(|r| *r.key == *key)
        {
            return Ok(());
        }
        let at = ring.replaced.partition_point(|r| r.at > replaced_at);
        ring.replaced.insert(at, Replaced { key, at: replaced_at });
        ring.replaced.truncate(REPLACED_KEPT);
        Ok(())
    }

    /// The key replaced last, and when, for whoever records it beside the new one.
    pub fn last_replaced(&self) -> Option<(Zeroizing<Vec<u8>>, OffsetDateTime)> {
        self.read().replaced.first().map(|r| (r.key.clone(), r.at))
    }

    /// Whether a key is there.
    pub fn is_loaded(&self) -> bool {
        self.read().current.is_some()
    }

    /// Whether the key is withheld on purpose (`explain`).
    pub fn is_withheld(&self) -> bool {
        self.withheld
    }

    /// The keys as they stand, for one verification.
    pub(crate) fn keys(&self) -> Option<Keys> {
        let ring = self.read();
        Some(Keys {
            current: ring.current.clone()?,
            replaced: ring.replaced.clone(),
            read_at: ring.read_at,
            current_since: ring.current_since,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Ring> {
        self.ring.write().unwrap_or_else(PoisonError::into_inner)
    }
}

fn strong(key: Vec<u8>) -> Result<Zeroizing<Vec<u8>>, WeakChallengeKey> {
    let key = Zeroizing::new(key);
    if key.len() < MIN_CHALLENGE_KEY {
        return Err(WeakChallengeKey(key.len()));
    }
    Ok(key)
}

/// The keys at one moment.
pub(crate) struct Keys {
    current: Zeroizing<Vec<u8>>,
    replaced: Vec<Replaced>,
    read_at: Option<OffsetDateTime>,
    current_since: Option<OffsetDateTime>,
}

impl Keys {
    /// The key new challenges are written under.
    pub(crate) fn current(&self) -> &[u8] {
        &self.current
    }

    /// The key a challenge issued at `issued_at` was written under: the one whose mac
    /// `authentic` accepts, among the current key and the keys replaced after `issued_at`.
    pub(crate) fn find(&self, issued_at: OffsetDateTime, authentic: impl Fn(&[u8]) -> bool) -> Option<&[u8]> {
        if authentic(&self.current) {
            return Some(&self.current);
        }
        self.replaced
            .iter()
            .filter(|r| issued_at <= r.at + CLOCK_SKEW)
            .map(|r| r.key.as_slice())
            .find(|key| authentic(key))
    }

    /// Whether an annotation no key held verifies may still be a challenge of a key this reader
    /// lacks: the Secret was last read before the CSR was first seen, or its key changed within
    /// [`SETTLE`] (the replaced key may not be recorded yet). A key given once never is.
    pub(crate) fn may_be_stale(&self, first_seen: OffsetDateTime, now: OffsetDateTime) -> bool {
        self.read_at.is_some_and(|read| read <= first_seen)
            || self.current_since.is_some_and(|since| now < since + SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_rotation_keeps_the_replaced_key_for_the_challenges_issued_before_it() {
        let slot = ChallengeKey::default();
        assert!(slot.keys().is_none());
        assert_eq!(slot.follow(vec![1; 32], at(0)), Ok(KeyRead::Loaded));
        assert_eq!(slot.follow(vec![1; 32], at(10)), Ok(KeyRead::Unchanged));
        assert_eq!(slot.follow(vec![2; 32], at(100)), Ok(KeyRead::Rotated));
        let keys = slot.keys().unwrap();
        assert_eq!(keys.current(), [2; 32]);
        let under = |k: u8| move |key: &[u8]| key == [k; 32];
        // Issued under the old key before the rotation: still verifies, under the old key.
        assert_eq!(keys.find(at(50), under(1)), Some([1u8; 32].as_slice()));
        // Issued "under the old key" well after it was replaced: whoever wrote it held an old key.
        assert_eq!(keys.find(at(100 + 61), under(1)), None);
        assert_eq!(keys.find(at(500), under(2)), Some([2u8; 32].as_slice()));
        assert_eq!(keys.find(at(50), under(3)), None);
    }

    #[test]
    fn only_a_key_read_before_the_csr_was_seen_may_be_stale() {
        let slot = ChallengeKey::default();
        slot.follow(vec![1; 32], at(0)).unwrap();
        slot.follow(vec![1; 32], at(100)).unwrap();
        let keys = slot.keys().unwrap();
        assert!(
            keys.may_be_stale(at(105), at(106)),
            "read before the CSR was seen: read again"
        );
        assert!(
            !keys.may_be_stale(at(95), at(106)),
            "read after: the annotation is forged"
        );
        slot.follow(vec![2; 32], at(200)).unwrap();
        let keys = slot.keys().unwrap();
        assert!(
            keys.may_be_stale(at(150), at(210)),
            "a key that just changed: the replaced one may not be recorded yet"
        );
        assert!(!keys.may_be_stale(at(150), at(200) + SETTLE));
        let given = ChallengeKey::loaded(vec![1; 32]).unwrap().keys().unwrap();
        assert!(
            !given.may_be_stale(at(5), at(6)),
            "a key given once is never read again"
        );
    }

    #[test]
    fn rotations_keep_a_bounded_ring_and_a_key_that_comes_back_is_current_once() {
        let slot = ChallengeKey::default();
        for k in 1..=10u8 {
            slot.follow(vec![k; 32], at(i64::from(k))).unwrap();
        }
        assert_eq!(slot.keys().unwrap().replaced.len(), REPLACED_KEPT);
        slot.follow(vec![9; 32], at(20)).unwrap();
        let keys = slot.keys().unwrap();
        assert_eq!(keys.current(), [9; 32]);
        assert!(keys.replaced.iter().all(|r| *r.key != [9; 32]));
        assert_eq!(keys.replaced[0].key.as_slice(), [10; 32]);
    }

    #[test]
    fn a_key_the_secret_records_as_replaced_verifies_its_challenges_on_a_reader_that_never_held_it() {
        let restarted = ChallengeKey::default();
        restarted.follow(vec![2; 32], at(200)).unwrap();
        restarted.remember(vec![1; 32], at(100)).unwrap();
        restarted.remember(vec![2; 32], at(150)).unwrap();
        let keys = restarted.keys().unwrap();
        assert_eq!(keys.current(), [2; 32], "the current key is never a replaced one");
        assert_eq!(keys.find(at(90), |k| k == [1; 32]), Some([1u8; 32].as_slice()));
        assert_eq!(keys.find(at(300), |k| k == [1; 32]), None);
        assert_eq!(
            restarted.last_replaced().map(|(k, t)| (k.to_vec(), t)),
            Some((vec![1; 32], at(100)))
        );
    }

    #[test]
    fn short_keys_are_refused_and_keys_never_print() {
        assert_eq!(ChallengeKey::loaded(vec![1; 31]).unwrap_err(), WeakChallengeKey(31));
        assert_eq!(
            ChallengeKey::default().follow(vec![0; 8], at(0)),
            Err(WeakChallengeKey(8))
        );
        let slot = ChallengeKey::loaded(vec![7; 32]).unwrap();
        assert_eq!(format!("{slot:?}"), "ChallengeKey(loaded)");
        assert_eq!(format!("{:?}", ChallengeKey::withheld()), "ChallengeKey(withheld)");
    }
}
