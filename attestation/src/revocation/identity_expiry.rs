//! When a Cluster's first node loses its identity if nothing renews (SPEC section 7, "Told before
//! it breaks"): the earliest, over the live nodes, of each node's newest recorded certificate's
//! NotAfter. While the signer or the management cluster is away, or the Cluster is paused, no
//! node renews, and this is the deadline; a node whose renewals fail for its own reasons brings
//! it near too. The alert `NodeAttestationIdentitiesExpiring` compares it with the outage
//! tolerance (45% of the certificate lifetime, the plugin renewing from half of it).

use std::collections::{HashMap, HashSet};

use super::CredentialId;
use super::record::IssuedCertificate;

/// The earliest NotAfter, in seconds since the epoch, among the newest unexpired, unrevoked
/// certificate of each node in `live` (the names live Machines and pool instances use:
/// [`super::triggers::live_node_names`]); `None` when no live node has one recorded (nodes that
/// joined before the record existed, or outside attestation, are not counted).
pub fn earliest_identity_expiry<'a>(
    issued: impl IntoIterator<Item = &'a IssuedCertificate>,
    revoked: &HashSet<CredentialId>,
    live: &HashSet<&str>,
    now: i64,
) -> Option<i64> {
    let mut newest: HashMap<&str, i64> = HashMap::new();
    for certificate in issued {
        if certificate.expired(now) || revoked.contains(&certificate.id) || !live.contains(certificate.node.as_str()) {
            continue;
        }
        let at = newest.entry(certificate.node.as_str()).or_insert(certificate.not_after);
        *at = (*at).max(certificate.not_after);
    }
    newest.into_values().min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetKind;

    const NOW: i64 = 1_800_000_000;

    fn certificate(seed: u8, node: &str, not_after: i64) -> IssuedCertificate {
        IssuedCertificate {
            id: CredentialId::of_certificate(&[seed]),
            not_after,
            kind: TargetKind::Machine,
            target_uid: format!("uid-{node}"),
            target_name: node.to_owned(),
            node: node.to_owned(),
            provider_id: format!("aws:///us-east-1a/i-{node}"),
        }
    }

    #[test]
    fn the_first_node_to_lose_its_newest_certificate_sets_the_deadline() {
        let day = 86_400;
        let record = [
            // worker-a renewed: its newest certificate counts, not the old one.
            certificate(1, "worker-a", NOW + day),
            certificate(2, "worker-a", NOW + 7 * day),
            certificate(3, "worker-b", NOW + 3 * day),
            // A node no live Machine uses any more, and one revoked: neither counts.
            certificate(4, "gone", NOW + 60),
            certificate(5, "worker-c", NOW + 120),
            // Expired: its node renewed long ago or is gone.
            certificate(6, "worker-b", NOW - 1),
        ];
        let live: HashSet<&str> = ["worker-a", "worker-b", "worker-c"].into();
        let revoked: HashSet<CredentialId> = [record[4].id].into();
        assert_eq!(
            earliest_identity_expiry(&record, &revoked, &live, NOW),
            Some(NOW + 3 * day)
        );
        assert_eq!(
            earliest_identity_expiry(&record, &HashSet::new(), &live, NOW),
            Some(NOW + 120),
            "unrevoked, worker-c's is the first to go"
        );
        assert_eq!(
            earliest_identity_expiry(&record, &revoked, &HashSet::new(), NOW),
            None,
            "no live node"
        );
        assert_eq!(earliest_identity_expiry([], &revoked, &live, NOW), None);
    }
}
