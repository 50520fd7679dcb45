//! What the two-phase providers (`tpm/v1`, `azure/v1`, SPEC section 5) share: CSR #1 carries a
//! challenge the signer wrote (an annotation authenticated under the signer's challenge key,
//! [`crate::tpm::challenge_key`]), and CSR #2, from the same requester with the same key, answers
//! it. Each provider has its own annotation and its own answer; the rules for finding CSR #1,
//! for a challenge's age, and for a mac no key held verifies are the same, and live here.

use time::{Duration, OffsetDateTime};

use crate::attestor::{Evidence, Verification};
use crate::cloud::CloudCall;
use crate::csr::ParsedCsr;
use crate::csr_object::CsrObject;
use crate::decision::DenyReason;
use crate::tpm::challenge_key::{ChallengeKey, Keys};

/// How far in the future an `issuedAt` may lie (replicas' clocks differ a little).
pub(crate) const CLOCK_SKEW: Duration = Duration::seconds(60);

/// Said of a challenge read without the challenge key.
pub(crate) const UNCHECKED_MAC: &str = " (its mac is the signer's to check: explain holds no challenge key)";

/// A refusal: reason and message.
pub(crate) type Refusal = (DenyReason, String);

/// A `ChallengeFailed` refusal.
pub(crate) fn challenge_failed(message: impl Into<String>) -> Refusal {
    (DenyReason::ChallengeFailed, message.into())
}

/// Why a challenge annotation does not count.
pub(crate) enum Unverified {
    /// Malformed, expired or ahead: refused.
    Refused(Refusal),
    /// Its mac verifies under no key held: a forgery, or a challenge of a key the Secret holds
    /// since this replica last read it.
    UnknownKey,
}

impl Unverified {
    /// The verdict on a CSR of `provider` whose challenge did not count: refused, or (a key
    /// maybe rotated since it was read before the CSR was first seen) held while the key is
    /// read again.
    pub(crate) fn judge(
        self,
        provider: &str,
        keys: Option<&Keys>,
        evidence: &Evidence<'_>,
    ) -> Result<Verification, Refusal> {
        match self {
            Self::Refused(refusal) => Err(refusal),
            Self::UnknownKey if keys.is_some_and(|k| k.may_be_stale(evidence.first_seen, evidence.now)) => {
                Ok(Verification::NeedsCloud {
                    call: CloudCall::ReloadChallengeKey,
                    message: format!(
                        "{provider}: the challenge annotation's mac verifies under no challenge key this replica holds; reading the key again (it may have been rotated)"
                    ),
                })
            }
            Self::UnknownKey => Err(challenge_failed(
                "the challenge annotation's mac does not verify: this signer did not write it (forged by the requester?); file a new CSR #1",
            )),
        }
    }
}

/// The keys a verifier of `provider` judges with: `Ok(None)` when withheld on purpose
/// (`explain`: everything but the mac is checked); while the signer has not loaded its key yet,
/// why the CSR waits.
pub(crate) fn held_keys(key: &ChallengeKey, provider: &str) -> Result<Option<Keys>, String> {
    match key.keys() {
        Some(keys) => Ok(Some(keys)),
        None if key.is_withheld() => Ok(None),
        None => Err(format!(
            "the signer has not loaded its challenge key yet, which {provider} needs (see the signer's log and the Cluster's Events)"
        )),
    }
}

/// Checks a challenge issued at `issued_at` (as `written`, for messages) is neither ahead of
/// `now` nor older than `ttl`.
pub(crate) fn check_age(
    written: &str,
    issued_at: OffsetDateTime,
    now: OffsetDateTime,
    ttl: Duration,
) -> Result<(), Unverified> {
    if issued_at > now + CLOCK_SKEW {
        return Err(Unverified::Refused(challenge_failed(format!(
            "the challenge was issued at {written}, in the future: not this signer's"
        ))));
    }
    if now - issued_at > ttl {
        return Err(Unverified::Refused(challenge_failed(format!(
            "the challenge issued at {written} expired after {}s unanswered; start again from phase 1",
            ttl.whole_seconds()
        ))));
    }
    Ok(())
}

/// CSR #1 as CSR #2 names it (`csr_name`, `csr_uid`): it exists, is that very CSR, is still
/// open (a challenge answers once), and came from the same requester for the same signer.
pub(crate) fn first_csr(evidence: &Evidence<'_>, csr_name: &str, csr_uid: &str) -> Result<CsrObject, Refusal> {
    let first = evidence
        .csrs
        .csr(csr_name)
        .ok_or_else(|| challenge_failed(format!("CSR #1 {csr_name:?} does not exist")))?;
    if first.uid != csr_uid {
        return Err(challenge_failed(format!(
            "CSR #1 {:?} has UID {:?}, not {csr_uid:?}",
            first.name, first.uid
        )));
    }
    if first.finished {
        return Err(challenge_failed(format!("CSR #1 {:?} is already finished", first.name)));
    }
    if first.signer_name != evidence.object.signer_name || first.username != evidence.object.username {
        return Err(challenge_failed(format!(
            "CSR #1 {:?} was filed by {:?} for {:?}: CSR #2 must come from the same requester",
            first.name, first.username, first.signer_name
        )));
    }
    Ok(first)
}

/// CSR #2 must be CSR #1 again: byte-equal key, same subject and provider ID.
pub(crate) fn same_request(second: &ParsedCsr, first: &ParsedCsr) -> Result<(), Refusal> {
    if second.spki_der != first.spki_der {
        return Err(challenge_failed("CSR #2's key differs from CSR #1's"));
    }
    if second.subject != first.subject {
        return Err(challenge_failed("CSR #2's subject differs from CSR #1's"));
    }
    let pid = |c: &ParsedCsr| c.provider_id_extensions().map(|e| e.value.clone()).collect::<Vec<_>>();
    if pid(second) != pid(first) {
        return Err(challenge_failed("CSR #2's provider-ID extension differs from CSR #1's"));
    }
    Ok(())
}
