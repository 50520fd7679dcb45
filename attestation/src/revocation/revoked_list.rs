//! The parameter object of the workload cluster's `node-attestation-revoked-certificates`
//! ValidatingAdmissionPolicy (`config/workload/workload-cluster.yaml`): the ConfigMap
//! `kube-system/node-attestation-revoked`, which the policy reads on every write a node
//! identity makes.
//!
//! kube-apiserver converts the parameter object to an unstructured map on every evaluation, so
//! its cost grows with its number of keys, not its bytes (measured: 5,000 keys cost a Lease
//! update 15 times the apiserver CPU of no policy; `tests/src/bin/revocation-cost.rs`). So the
//! list has few keys, each holding many entries:
//!
//! - `x509sha256.<d>` for each first hex digit `d` of a credential ID: the revoked certificates
//!   of that digit, as space-separated tokens `<64 hex digits>@<NotAfter, Unix seconds>@<reason>`.
//!   The policy asks `contains(<hex> + "@")` of one key's value: a run of 64 lowercase hex digits
//!   followed by `@` occurs only at a token's start (`@`, space and the reasons' capitals are not
//!   lowercase hex), so only a listed ID matches (kube-apiserver 1.32 and later).
//! - `node.<node name>` (`<NotAfter>@<reason>`): every certificate of that node name is refused
//!   (before 1.32, which names no credential ID); listed only while no live Machine or pool
//!   instance uses the name, so a new Machine of the same name keeps working.
//!
//! An entry is pruned once its NotAfter has passed (nothing is left to refuse). At about 93
//! bytes a token the object holds about 9,900 under [`LIST_BYTES`]; past it the signer adds
//! nothing more and says so (Event). Entries the signer did not add (an operator's `revoke`) are
//! kept like its own until their NotAfter; a token or key that does not read is removed.

use std::collections::{BTreeMap, HashSet};

use super::triggers::Revoked;
use super::{CredentialId, RevokeReason};

/// The ConfigMap's name (in `kube-system`).
pub const NAME: &str = "node-attestation-revoked";

/// Most bytes of `data` the signer writes, below the 1 MiB object limit with room for
/// metadata and managed fields.
pub const LIST_BYTES: usize = 900 * 1024;

const ID_PREFIX: &str = "x509sha256.";
const NODE_PREFIX: &str = "node.";

/// The key holding the certificates whose ID starts with `id`'s first hex digit.
pub fn certificate_key(id: &CredentialId) -> String {
    format!("{ID_PREFIX}{:x}", id.shard())
}

/// The key listing node name `node`.
pub fn node_key(node: &str) -> String {
    format!("{NODE_PREFIX}{node}")
}

/// One listed certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    /// Its credential ID.
    pub id: CredentialId,
    /// Its NotAfter, Unix seconds.
    pub not_after: i64,
    /// Why.
    pub why: RevokeReason,
}

impl Listed {
    /// Its token in its key's value.
    pub fn token(&self) -> String {
        format!("{}@{}@{}", self.id, self.not_after, self.why)
    }

    /// Reads a token.
    pub fn parse(token: &str) -> Option<Self> {
        let mut parts = token.split('@');
        let id = CredentialId::from_hex(parts.next()?)?;
        let not_after = parts.next()?.parse().ok()?;
        let why = RevokeReason::parse(parts.next()?)?;
        parts.next().is_none().then_some(Self { id, not_after, why })
    }
}

/// A node name's entry value.
pub fn node_value(not_after: i64, why: RevokeReason) -> String {
    format!("{not_after}@{why}")
}

/// A node name entry's NotAfter and reason, when it reads.
pub fn read_node_value(value: &str) -> Option<(i64, RevokeReason)> {
    let (not_after, why) = value.split_once('@')?;
    Some((not_after.parse().ok()?, RevokeReason::parse(why)?))
}

/// Every certificate `data` lists (tokens that do not read are left out).
pub fn listed_certificates(data: &BTreeMap<String, String>) -> Vec<Listed> {
    data.iter()
        .filter(|(key, _)| key.starts_with(ID_PREFIX))
        .flat_map(|(_, value)| value.split(' ').filter_map(Listed::parse))
        .collect()
}

/// Every node name `data` lists, with its NotAfter and reason.
pub fn listed_nodes(data: &BTreeMap<String, String>) -> Vec<(String, i64, RevokeReason)> {
    data.iter()
        .filter_map(|(key, value)| {
            let node = key.strip_prefix(NODE_PREFIX)?;
            let (not_after, why) = read_node_value(value)?;
            Some((node.to_owned(), not_after, why))
        })
        .collect()
}

/// Adds `listed` to `data` (its key's value rewritten; a token already there is kept).
pub fn with_certificates(data: &BTreeMap<String, String>, listed: &[Listed]) -> BTreeMap<String, String> {
    let mut changed = BTreeMap::new();
    for l in listed {
        let key = certificate_key(&l.id);
        let value: &mut String = changed
            .entry(key.clone())
            .or_insert_with(|| data.get(&key).cloned().unwrap_or_default());
        if !value.split(' ').filter_map(Listed::parse).any(|t| t.id == l.id) {
            if !value.is_empty() {
                value.push(' ');
            }
            value.push_str(&l.token());
        }
    }
    changed
}

/// What to change in the list: keys to set (whole values), keys to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListChange {
    /// Keys to set, with their new values.
    pub set: BTreeMap<String, String>,
    /// Keys to remove: emptied, unreadable, or a node name a live Machine uses again.
    pub remove: Vec<String>,
    /// The certificates newly listed, and why (for the report).
    pub added: Vec<Listed>,
    /// Node names newly listed.
    pub added_nodes: Vec<String>,
    /// Revocations left out: the list is full.
    pub left_out: usize,
}

impl ListChange {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
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
    // What stays of the current list, by key.
    let mut shards: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
    let mut nodes: BTreeMap<String, (i64, RevokeReason)> = BTreeMap::new();
    let mut dirty: HashSet<String> = HashSet::new();
    for (key, value) in current {
        if let Some(digit) = key.strip_prefix(ID_PREFIX) {
            let tokens: Vec<&str> = value.split(' ').filter(|t| !t.is_empty()).collect();
            let kept: Vec<Listed> = tokens
                .iter()
                .filter_map(|t| Listed::parse(t))
                .filter(|l| l.not_after > now && certificate_key(&l.id) == *key)
                .collect();
            let valid_key = digit.len() == 1 && digit.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
            if !valid_key || kept.is_empty() {
                change.remove.push(key.clone());
                continue;
            }
            if kept.len() != tokens.len() {
                dirty.insert(key.clone());
            }
            shards.insert(key.clone(), kept);
        } else if let Some(node) = key.strip_prefix(NODE_PREFIX) {
            match read_node_value(value) {
                Some((not_after, why)) if not_after > now && by_name && !live.contains(node) => {
                    nodes.insert(node.to_owned(), (not_after, why));
                }
                _ => change.remove.push(key.clone()),
            }
        } else {
            change.remove.push(key.clone());
        }
    }
    let mut bytes: usize = shards
        .iter()
        .map(|(k, v)| k.len() + v.iter().map(|l| l.token().len() + 1).sum::<usize>())
        .sum::<usize>()
        + nodes
            .iter()
            .map(|(n, (t, w))| n.len() + 6 + node_value(*t, *w).len())
            .sum::<usize>();
    let listed: HashSet<CredentialId> = shards.values().flatten().map(|l| l.id).collect();
    let mut added_ids = HashSet::new();
    for r in revoked.iter().filter(|r| r.certificate.not_after > now) {
        let c = r.certificate;
        if !listed.contains(&c.id) && added_ids.insert(c.id) {
            let entry = Listed {
                id: c.id,
                not_after: c.not_after,
                why: r.why,
            };
            // The token and its separating space (the sixteen keys are counted as they come).
            let key = certificate_key(&c.id);
            let size = entry.token().len() + 1 + if shards.contains_key(&key) { 0 } else { key.len() };
            if bytes + size > LIST_BYTES {
                change.left_out += 1;
            } else {
                bytes += size;
                shards.entry(key.clone()).or_default().push(entry);
                dirty.insert(key);
                change.added.push(entry);
            }
        }
        if by_name && !live.contains(c.node.as_str()) {
            let later = nodes.get(&c.node).is_none_or(|(listed, _)| *listed < c.not_after);
            if later {
                let value = node_value(c.not_after, r.why);
                let size = c.node.len() + NODE_PREFIX.len() + value.len();
                if bytes + size > LIST_BYTES {
                    change.left_out += 1;
                    continue;
                }
                bytes += size;
                if !nodes.contains_key(&c.node) {
                    change.added_nodes.push(c.node.clone());
                }
                nodes.insert(c.node.clone(), (c.not_after, r.why));
            }
        }
    }
    for key in dirty {
        let mut tokens: Vec<Listed> = shards.get(&key).cloned().unwrap_or_default();
        tokens.sort();
        let value = tokens.iter().map(Listed::token).collect::<Vec<_>>().join(" ");
        if tokens.is_empty() {
            change.remove.push(key);
        } else if current.get(&key) != Some(&value) {
            change.set.insert(key, value);
        }
    }
    for (node, (not_after, why)) in nodes {
        let key = node_key(&node);
        let value = node_value(not_after, why);
        if current.get(&key) != Some(&value) {
            change.set.insert(key, value);
        }
    }
    change.remove.sort();
    change.remove.dedup();
    change
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::TargetKind;
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

    fn apply(current: &BTreeMap<String, String>, change: &ListChange) -> BTreeMap<String, String> {
        let mut next = current.clone();
        for k in &change.remove {
            next.remove(k);
        }
        next.extend(change.set.clone());
        next
    }

    /// What the policy's CEL asks of the list for a credential ID.
    fn refused(list: &BTreeMap<String, String>, id: &CredentialId) -> bool {
        let hex = id.to_string();
        list.get(&format!("x509sha256.{}", &hex[..1]))
            .is_some_and(|v| v.contains(&format!("{hex}@")))
    }

    #[test]
    fn revoked_certificates_are_listed_until_they_expire() {
        let c = cert("worker-1", NOW + 60);
        let revoked = [Revoked {
            certificate: &c,
            why: RevokeReason::MachineGone,
        }];
        let first = change(&BTreeMap::new(), &revoked, false, &HashSet::new(), NOW);
        assert_eq!(first.added.len(), 1);
        let listed = apply(&BTreeMap::new(), &first);
        assert!(refused(&listed, &c.id));
        assert_eq!(
            listed[&certificate_key(&c.id)],
            format!("{}@{}@MachineGone", c.id, NOW + 60)
        );
        assert!(
            change(&listed, &revoked, false, &HashSet::new(), NOW).is_empty(),
            "listed once"
        );
        // Expired: pruned, even if still revoked.
        let later = change(&listed, &revoked, false, &HashSet::new(), NOW + 60);
        assert_eq!(later.remove, vec![certificate_key(&c.id)]);
        assert!(later.added.is_empty());
    }

    #[test]
    fn only_a_listed_id_matches_the_policys_question() {
        let certs: Vec<IssuedCertificate> = (0..200).map(|i| cert(&format!("n{i}"), NOW + 60)).collect();
        let revoked: Vec<Revoked<'_>> = certs
            .iter()
            .step_by(2)
            .map(|c| Revoked {
                certificate: c,
                why: RevokeReason::ClaimReplaced,
            })
            .collect();
        let list = apply(
            &BTreeMap::new(),
            &change(&BTreeMap::new(), &revoked, false, &HashSet::new(), NOW),
        );
        assert!(list.len() <= 16, "one key per first hex digit: {}", list.len());
        for (i, c) in certs.iter().enumerate() {
            assert_eq!(refused(&list, &c.id), i % 2 == 0, "{i}");
        }
    }

    #[test]
    fn before_1_32_a_node_name_is_listed_only_while_no_live_machine_uses_it() {
        let c = cert("ip-10-0-1-17", NOW + 60);
        let revoked = [Revoked {
            certificate: &c,
            why: RevokeReason::MachineReleased,
        }];
        let first = change(&BTreeMap::new(), &revoked, true, &HashSet::new(), NOW);
        assert_eq!(first.added_nodes, vec!["ip-10-0-1-17".to_owned()]);
        let listed = apply(&BTreeMap::new(), &first);
        assert!(listed.contains_key("node.ip-10-0-1-17"), "{listed:?}");
        // A new Machine of the same name: the name goes, the certificate stays listed.
        let live: HashSet<&str> = ["ip-10-0-1-17"].into();
        let reused = change(&listed, &revoked, true, &live, NOW);
        assert_eq!(reused.remove, vec!["node.ip-10-0-1-17".to_owned()]);
        assert!(reused.set.is_empty());
        // Upgraded to 1.32: names are no longer listed.
        let upgraded = change(&listed, &revoked, false, &HashSet::new(), NOW);
        assert_eq!(upgraded.remove, vec!["node.ip-10-0-1-17".to_owned()]);
    }

    #[test]
    fn unreadable_entries_go_and_an_operators_stay() {
        let operator = Listed {
            id: CredentialId::of_certificate(b"x"),
            not_after: NOW + 10,
            why: RevokeReason::Operator,
        };
        let mut current = with_certificates(&BTreeMap::new(), &[operator]);
        let key = certificate_key(&operator.id);
        current.get_mut(&key).unwrap().push_str(" junk");
        current.insert("x509sha256.G".to_owned(), operator.token());
        current.insert("other".to_owned(), "1".to_owned());
        current.insert("node.x".to_owned(), "soon".to_owned());
        let c = change(&current, &[], true, &HashSet::new(), NOW);
        assert_eq!(
            c.set.get(&key),
            Some(&operator.token()),
            "the junk token goes, the operator's stays"
        );
        assert_eq!(
            c.remove,
            vec!["node.x".to_owned(), "other".to_owned(), "x509sha256.G".to_owned()]
        );
    }

    #[test]
    fn a_full_list_says_how_many_it_left_out() {
        let certs: Vec<IssuedCertificate> = (0..12_000).map(|i| cert(&format!("n{i}"), NOW + 60)).collect();
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
            c.added.len() >= 9_000,
            "the module doc says about 9,900 fit: {}",
            c.added.len()
        );
        let bytes: usize = c.set.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= LIST_BYTES);
    }

    #[test]
    fn an_operators_certificates_are_added_to_what_is_there() {
        let a = Listed {
            id: CredentialId::of_certificate(b"a"),
            not_after: NOW + 10,
            why: RevokeReason::MachineGone,
        };
        let b = Listed {
            id: CredentialId::of_certificate(b"b"),
            not_after: NOW + 10,
            why: RevokeReason::Operator,
        };
        let one = with_certificates(&BTreeMap::new(), &[a]);
        let both = {
            let mut next = one.clone();
            next.extend(with_certificates(&one, &[b, a]));
            next
        };
        let listed = listed_certificates(&both);
        assert_eq!(listed.len(), 2, "{both:?}");
    }
}
