//! What a cloud's signed statement must satisfy before a verifier believes it, for every cloud
//! provider alike: bound to the CSR's key ([`binding`]), fresh ([`check_fresh`]), and from an
//! account the Cluster allows ([`allow_list`]). Nothing here knows a particular cloud.

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

/// Reads a comma-list allow-list annotation of the Cluster (`kubelet-aws-roles`,
/// `kubelet-aws-accounts`, `kubelet-gcp-projects`): `Ok(None)` when absent. An annotation that
/// is there but names no one (`""`, `" , "`) is a configuration error, never "anyone".
pub(crate) fn allow_list(
    cluster: &crate::machine::ClusterView,
    annotation: &str,
) -> Result<Option<Vec<String>>, String> {
    let Some(value) = cluster.annotation(annotation) else {
        return Ok(None);
    };
    let list: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if list.is_empty() {
        return Err(format!(
            "the Cluster's {annotation} is {:?}, which names no one: list who may attest, or remove the annotation",
            crate::identity::truncate(value, 64)
        ));
    }
    Ok(Some(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_list_that_names_no_one_is_an_error_not_anyone() {
        use crate::machine::ClusterView;
        let cluster = ClusterView::named("c", "ns", &["aws"]);
        assert_eq!(allow_list(&cluster, "list"), Ok(None));
        for value in ["", " ", " , ", ",,"] {
            let why = allow_list(&cluster.clone().with_annotation("list", value), "list").unwrap_err();
            assert!(why.contains("names no one"), "{value:?}: {why}");
        }
        assert_eq!(
            allow_list(&cluster.with_annotation("list", " a, ,b "), "list"),
            Ok(Some(vec!["a".to_owned(), "b".to_owned()]))
        );
    }

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
