//! What the two cloud identity providers (`gcp/v1`, `aws/v1`, SPEC section 5) share: the key
//! binding, freshness, the instance recorded in the claim, and the calls the signer makes to
//! the cloud on a verifier's behalf.
//!
//! A cloud's signed statement says "this is instance X"; on its own it is a bearer token that
//! anyone who reads it off the node could replay. Both providers therefore bind it to the CSR's
//! key: the statement (GCE: the token's audience; AWS: a signed STS header) carries
//! [`binding`] of the CSR's SubjectPublicKeyInfo, so a copied statement is useless with any
//! other key, and it must be minutes old, so a stolen one expires.
//!
//! Verification stays pure: the cloud's keys and answers reach the verifiers through traits
//! ([`crate::gcp::GoogleKeys`], [`crate::aws::CallerIdentity`]) that the signer implements
//! over caches. When a verifier needs something the cache does not hold yet, it answers
//! [`crate::attestor::Verification::NeedsCloud`] with the [`CloudCall`] to make; the
//! controller makes it and decides again.

use base64::Engine as _;
use time::{Duration, OffsetDateTime};

use crate::digest::sha256;

/// Default of `--cloud-attestation-max-age`: how old a cloud statement may be.
pub const DEFAULT_MAX_AGE: Duration = Duration::minutes(10);

/// How far clocks may disagree (the node's, the cloud's, the signer's).
pub const CLOCK_SKEW: Duration = Duration::seconds(60);

/// The key binding `B` of SPEC section 5: base64url without padding of SHA-256 over the CSR's
/// SubjectPublicKeyInfo DER.
pub fn binding(spki_der: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha256(spki_der))
}

/// Checks that a statement made at `at` is fresh at `now`: no older than `max_age`, and not
/// from the future beyond [`CLOCK_SKEW`]. The error names both times.
pub fn check_fresh(what: &str, at: OffsetDateTime, now: OffsetDateTime, max_age: Duration) -> Result<(), String> {
    if at > now + CLOCK_SKEW {
        return Err(format!(
            "{what} {} lies in the future (now {})",
            rfc3339(at),
            rfc3339(now)
        ));
    }
    if now - at > max_age + CLOCK_SKEW {
        return Err(format!(
            "{what} {} is older than --cloud-attestation-max-age {}m (now {})",
            rfc3339(at),
            max_age.whole_minutes(),
            rfc3339(now)
        ));
    }
    Ok(())
}

/// RFC 3339, for messages.
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}

/// A call to a cloud that a verifier needs made before it can judge a CSR. The controller makes
/// it (through the same traits' implementations) and decides again; offline, `check` says
/// which call it could not make.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloudCall {
    /// Fetch Google's signing keys again: a token names a key the cached set lacks, or no set
    /// is loaded yet. The fetcher rate-limits itself.
    RefreshGoogleKeys,
    /// Send this STS `GetCallerIdentity` request (the node's, replayed to the signer's own
    /// endpoint) and keep the answer.
    CallerIdentity(crate::aws::StsCall),
}

/// Reads a comma-list allow-list annotation of the Cluster (`kubelet-aws-accounts`,
/// `kubelet-gcp-projects`): `None` when absent or empty (anyone may attest).
pub(crate) fn allow_list(cluster: &crate::machine::ClusterView, annotation: &str) -> Option<Vec<String>> {
    let list: Vec<String> = cluster
        .annotation(annotation)?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (!list.is_empty()).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_is_unpadded_base64url_of_the_spki_hash() {
        let b = binding(b"spki");
        assert_eq!(b.len(), 43);
        assert!(!b.contains('=') && !b.contains('+') && !b.contains('/'));
        assert_ne!(binding(b"spki"), binding(b"other"));
    }

    #[test]
    fn freshness_allows_skew_and_refuses_stale_or_future_statements() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let max = Duration::minutes(10);
        assert!(check_fresh("t", now, now, max).is_ok());
        assert!(check_fresh("t", now - Duration::minutes(10) - Duration::seconds(59), now, max).is_ok());
        assert!(check_fresh("t", now - Duration::minutes(12), now, max).is_err());
        assert!(check_fresh("t", now + Duration::seconds(59), now, max).is_ok());
        let future = check_fresh("t", now + Duration::minutes(2), now, max).unwrap_err();
        assert!(future.contains("future"), "{future}");
    }
}
