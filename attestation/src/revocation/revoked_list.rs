//! The parameter object of the workload cluster's `node-attestation-revoked-certificates`
//! ValidatingAdmissionPolicy (`config/workload/workload-cluster.yaml`): the ConfigMap
//! `kube-system/node-attestation-revoked`, whose keys the policy looks up for every write a node
//! identity makes.
//!
//! - `x509sha256.<credential ID>`: that certificate is refused (kube-apiserver 1.32 and later).
//! - `node.<node name>`: every certificate of that node name is refused (before 1.32, which
//!   names no credential ID); listed only while no live Machine or pool instance uses the name,
//!   so a new Machine of the same name keeps working.
//!
//! Each value is `<NotAfter, Unix seconds> <reason>`; an entry is pruned once its NotAfter has
//! passed (nothing is left to refuse). At about 100 bytes an entry, the object holds about 9,000
//! under [`LIST_BYTES`]; past it the signer adds nothing more and says so (metric, alert).
//! Entries the signer did not add (an operator's `revoke`) are kept like its own until their
//! NotAfter; an entry that does not read is removed.

use std::collections::{BTreeMap, HashSet};

use super::RevokeReason;
use super::triggers::Revoked;

/// The ConfigMap's name (in `kube-system`).
pub const NAME: &str = "node-attestation-revoked";

/// Most bytes of `data` the signer writes, below the 1 MiB object limit with room for
/// metadata and managed fields.
pub const LIST_BYTES: usize = 900 * 1024;

const ID_PREFIX: &str = "x509sha256.";
const NODE_PREFIX: &str = "node.";

/// The key listing certificate `id`.
pub fn certificate_key(id: &super::CredentialId) -> String {
    format!("{ID_PREFIX}{id}")
}

/// The key listing node name `node`.
pub fn node_key(node: &str) -> String {
    format!("{NODE_PREFIX}{node}")
}

/// An entry's value.
pub fn value(not_after: i64, why: RevokeReason) -> String {
    format!("{not_after} {why}")
}

/// A listed entry's NotAfter and reason, when it reads.
pub fn read_value(value: &str) -> Option<(i64, RevokeReason)> {
    let (not_after, why) = value.split_once(' ')?;
    Some((not_after.parse().ok()?, RevokeReason::parse(why)?))
}

/// What to change in the list: keys to set, keys to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListChange {
    /// Keys to add, with their values.
    pub add: BTreeMap<String, String>,
    /// Keys to remove: expired, unreadable, or a node name a live Machine uses again.
    pub remove: Vec<String>,
    /// Revocations left out: the list is full.
    pub left_out: usize,
}

impl ListChange {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// The change that makes `current` list `revoked` at `now`: by credential ID always, and by
/// node name too when `by_name` (an apiserver before 1.32), except for names in `live`.
pub fn change(
    current: &BTreeMap<String, String>,
    revoked: &[Revoked<'_>],
    by_name: bool,
    live: &HashSet<&str>,
    now: i64,
) -> ListChange {
    let mut change = ListChange::default();
    let mut bytes = 0usize;
    for (key, value) in current {
        let keep = match (
            key.strip_prefix(ID_PREFIX),
            key.strip_prefix(NODE_PREFIX),
            read_value(value),
        ) {
            (_, _, None) => false,
            (_, _, Some((not_after, _))) if not_after <= now => false,
            (Some(id), _, _) => super::CredentialId::from_hex(id).is_some(),
            (_, Some(node), _) => by_name && !live.contains(node),
            _ => false,
        };
        if keep {
            bytes += key.len() + value.len();
        } else {
            change.remove.push(key.clone());
        }
    }
    let mut room = |key: &str, value: &str, change: &mut ListChange| {
        let size = key.len() + value.len();
        if bytes + size > LIST_BYTES {
            change.left_out += 1;
            return false;
        }
        bytes += size;
        true
    };
    for r in revoked {
        let c = r.certificate;
        let key = certificate_key(&c.id);
        if !current.contains_key(&key) && !change.add.contains_key(&key) {
            let value = value(c.not_after, r.why);
            if room(&key, &value, &mut change) {
                change.add.insert(key, value);
            }
        }
        if by_name && !live.contains(c.node.as_str()) {
            let key = node_key(&c.node);
            let later = current
                .get(&key)
                .or(change.add.get(&key))
                .and_then(|v| read_value(v))
                .is_none_or(|(listed, _)| listed < c.not_after);
            if later {
                let value = value(c.not_after, r.why);
                if room(&key, &value, &mut change) {
                    change.remove.retain(|k| *k != key);
                    change.add.insert(key, value);
                }
            }
        }
    }
    change
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::TargetKind;
    use crate::revocation::CredentialId;
    use crate::revocation::record::IssuedCertificate;

    const NOW: i64 = 1_800_000_000;

    fn cert(node: &str, not_after: i64) -> IssuedCertificate {
        IssuedCertificate {
            id: CredentialId::of_certificate(format!("{node}{not_after}").as_bytes()),
            not_after,
            kind: TargetKind::Machine,
            target_uid: "u".into(),
            target_name: node.into(),
            node: node.into(),
            provider_id: "aws:///a/i-1".into(),
        }
    }

    #[test]
    fn revoked_certificates_are_listed_until_they_expire() {
        let c = cert("worker-1", NOW + 60);
        let revoked = [Revoked {
            certificate: &c,
            why: RevokeReason::MachineGone,
        }];
        let first = change(&BTreeMap::new(), &revoked, false, &HashSet::new(), NOW);
        assert_eq!(first.add.len(), 1);
        let key = certificate_key(&c.id);
        assert_eq!(first.add[&key], format!("{} MachineGone", NOW + 60));
        let listed: BTreeMap<String, String> = first.add.clone();
        assert!(
            change(&listed, &revoked, false, &HashSet::new(), NOW).is_empty(),
            "listed once"
        );
        // Expired: pruned, even if still revoked.
        let later = change(&listed, &[], false, &HashSet::new(), NOW + 60);
        assert_eq!(later.remove, vec![key]);
    }

    #[test]
    fn before_1_32_a_node_name_is_listed_only_while_no_live_machine_uses_it() {
        let c = cert("ip-10-0-1-17", NOW + 60);
        let revoked = [Revoked {
            certificate: &c,
            why: RevokeReason::MachineReleased,
        }];
        let first = change(&BTreeMap::new(), &revoked, true, &HashSet::new(), NOW);
        assert!(first.add.contains_key("node.ip-10-0-1-17"), "{first:?}");
        // A new Machine of the same name: the name goes, the certificate stays listed.
        let live: HashSet<&str> = ["ip-10-0-1-17"].into();
        let reused = change(&first.add, &revoked, true, &live, NOW);
        assert_eq!(reused.remove, vec!["node.ip-10-0-1-17".to_owned()]);
        assert!(reused.add.is_empty());
        // Upgraded to 1.32: names are no longer listed.
        let upgraded = change(&first.add, &revoked, false, &HashSet::new(), NOW);
        assert_eq!(upgraded.remove, vec!["node.ip-10-0-1-17".to_owned()]);
    }

    #[test]
    fn unreadable_entries_go_and_an_operators_stay() {
        let operator = certificate_key(&CredentialId::of_certificate(b"x"));
        let current: BTreeMap<String, String> = [
            (operator.clone(), value(NOW + 10, RevokeReason::Operator)),
            ("x509sha256.nothex".to_owned(), value(NOW + 10, RevokeReason::Operator)),
            (certificate_key(&CredentialId::of_certificate(b"y")), "soon".to_owned()),
            ("other".to_owned(), value(NOW + 10, RevokeReason::Operator)),
        ]
        .into();
        let c = change(&current, &[], false, &HashSet::new(), NOW);
        assert_eq!(c.remove.len(), 3);
        assert!(!c.remove.contains(&operator));
    }

    #[test]
    fn a_full_list_says_how_many_it_left_out() {
        let certs: Vec<IssuedCertificate> = (0..10_000).map(|i| cert(&format!("n{i}"), NOW + 60)).collect();
        let revoked: Vec<Revoked<'_>> = certs
            .iter()
            .map(|c| Revoked {
                certificate: c,
                why: RevokeReason::PoolInstanceGone,
            })
            .collect();
        let c = change(&BTreeMap::new(), &revoked, false, &HashSet::new(), NOW);
        assert!(c.left_out > 0);
        assert!(
            c.add.len() >= 9_000,
            "the module doc says about 9,000 fit: {}",
            c.add.len()
        );
        let bytes: usize = c.add.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= LIST_BYTES);
    }
}
