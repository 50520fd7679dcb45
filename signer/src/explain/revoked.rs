//! `explain --pending`'s revoked certificates (SPEC section 7, "Taking an identity back"): the
//! workload cluster's revoked list joined with the signer's record, so each entry names its
//! node, its Machine or MachinePool, why and until when; read-only.

use std::collections::{BTreeMap, HashMap};

use attestation::revocation::record::{self, IssuedCertificate};
use attestation::revocation::{CredentialId, revoked_list};
use serde::Serialize;

/// One revoked entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokedEntry {
    /// `X509SHA256=<hex>`, or `node <name>` for a name listed before 1.32.
    pub credential: String,
    /// The node name.
    pub node: Option<String>,
    /// `Machine <name>` or `MachinePool <name> (<provider ID>)`, from the record.
    pub target: Option<String>,
    /// Why (`MachineReleased`, `Operator`...).
    pub reason: String,
    /// Until when it is listed (RFC 3339): the certificate's NotAfter.
    pub until: String,
}

/// What explain could read of revocation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RevokedReport {
    /// Every listed entry, by node name.
    pub entries: Vec<RevokedEntry>,
    /// Why the list or the record could not be read, when it could not.
    pub unreadable: Option<String>,
}

/// Joins `list` (the revoked list's data; `None`: there is none) with the record's entries.
pub fn report(list: Option<&BTreeMap<String, String>>, issued: &[IssuedCertificate]) -> RevokedReport {
    let Some(list) = list else {
        return RevokedReport {
            entries: Vec::new(),
            unreadable: Some(format!(
                "there is no ConfigMap kube-system/{}: nothing revoked is refused in this cluster",
                revoked_list::NAME
            )),
        };
    };
    let by_id: HashMap<CredentialId, &IssuedCertificate> = issued.iter().map(|c| (c.id, c)).collect();
    let until = |not_after: i64| {
        time::OffsetDateTime::from_unix_timestamp(not_after)
            .ok()
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .unwrap_or_else(|| not_after.to_string())
    };
    let mut entries: Vec<RevokedEntry> = revoked_list::listed_nodes(list)
        .into_iter()
        .map(|(node, not_after, why)| RevokedEntry {
            credential: format!("node {node}"),
            node: Some(node),
            target: None,
            reason: why.to_string(),
            until: until(not_after),
        })
        .collect();
    entries.extend(revoked_list::listed_certificates(list).into_iter().map(|l| {
        let recorded = by_id.get(&l.id);
        RevokedEntry {
            credential: l.id.user_extra(),
            node: recorded.map(|c| c.node.clone()),
            target: recorded.map(|c| match c.kind {
                attestation::machine::TargetKind::Machine => format!("Machine {}", c.target_name),
                attestation::machine::TargetKind::MachinePool => {
                    format!("MachinePool {} ({})", c.target_name, c.provider_id)
                }
            }),
            reason: l.why.to_string(),
            until: until(l.not_after),
        }
    }));
    entries.sort_by(|a, b| a.node.cmp(&b.node).then(a.credential.cmp(&b.credential)));
    RevokedReport {
        entries,
        unreadable: None,
    }
}

/// The report for people.
pub fn render(report: &RevokedReport) -> String {
    let mut out = String::new();
    if let Some(why) = &report.unreadable {
        out.push_str(&format!("Revoked certificates: {why}\n"));
        return out;
    }
    out.push_str(&format!(
        "Revoked certificates ({}, refused by the workload apiserver until they would have expired):\n",
        report.entries.len()
    ));
    for e in &report.entries {
        out.push_str(&format!(
            "  {} node {} {} {} until {}\n",
            e.credential,
            e.node.as_deref().unwrap_or("?"),
            e.target.as_deref().unwrap_or("(not in the record)"),
            e.reason,
            e.until
        ));
    }
    out
}

/// The record's entries as the shards' data give them.
pub fn issued<'a>(shards: impl IntoIterator<Item = &'a BTreeMap<String, String>>) -> Vec<IssuedCertificate> {
    shards.into_iter().flat_map(|data| record::read_shard(data).0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use attestation::machine::TargetKind;
    use attestation::revocation::RevokeReason;

    #[test]
    fn listed_entries_are_named_from_the_record() {
        let c = IssuedCertificate {
            id: CredentialId::of_certificate(b"c"),
            not_after: 1_900_000_000,
            kind: TargetKind::Machine,
            target_uid: "u".into(),
            target_name: "prod-md-0-x".into(),
            node: "worker-1".into(),
            provider_id: "aws:///a/i-1".into(),
        };
        let mut list = revoked_list::with_certificates(
            &BTreeMap::new(),
            &[revoked_list::Listed {
                id: c.id,
                not_after: c.not_after,
                why: RevokeReason::MachineReleased,
            }],
        );
        list.insert(
            revoked_list::node_key("worker-9"),
            revoked_list::node_value(1_900_000_000, RevokeReason::MachineGone),
        );
        list.insert("junk".to_owned(), "junk".to_owned());
        let report = report(Some(&list), &[c]);
        assert_eq!(report.entries.len(), 2);
        let text = render(&report);
        assert!(
            text.contains("node worker-1 Machine prod-md-0-x MachineReleased until 2030-03-17"),
            "{text}"
        );
        assert!(
            text.contains("node worker-9 node worker-9 (not in the record) MachineGone"),
            "{text}"
        );
        assert!(render(&super::report(None, &[])).contains("nothing revoked is refused"));
    }
}
