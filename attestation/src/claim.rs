//! The signer's claim: which node identity a Machine (or MachinePool instance) was issued to.
//!
//! Written at first issuance, before approval, under a resourceVersion precondition, so that of
//! two racing CSRs for one Machine at most one can ever be approved (SPEC rule 11).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{ANNOTATION_CLAIM, ANNOTATION_POOL_CLAIMS};
use crate::target::TargetRef;

/// One claim record: `{"nodeName","providerID","csrUID","ekSHA256"?,"instance"?,"claimedAt"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeletClaim {
    /// The node name the identity was issued for.
    #[serde(rename = "nodeName")]
    pub node_name: String,
    /// The provider ID it was issued for.
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// UID of the CSR that claimed it.
    #[serde(rename = "csrUID")]
    pub csr_uid: String,
    /// SHA-256 of the canonical EK SubjectPublicKeyInfo, for TPM-attested claims.
    #[serde(rename = "ekSHA256", default, skip_serializing_if = "Option::is_none")]
    pub ek_sha256: Option<String>,
    /// The cloud instance a cloud identity provider proved (`gcp:<project_id>/<instance_id>`,
    /// `aws:<accountId>/<instanceId>`): from then on only that provider proving that instance
    /// may renew (SPEC rule 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// RFC 3339 time of the claim.
    #[serde(rename = "claimedAt")]
    pub claimed_at: String,
}

/// A [`KubeletClaim`] read in place (from a cached Machine's packed strings), so a rule that
/// scans every Machine of a Cluster for a node name or an EK allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRecord<'a> {
    /// The node name the identity was issued for.
    pub node_name: &'a str,
    /// The provider ID it was issued for.
    pub provider_id: &'a str,
    /// UID of the CSR that claimed it.
    pub csr_uid: &'a str,
    /// SHA-256 of the canonical EK SubjectPublicKeyInfo, for TPM-attested claims.
    pub ek_sha256: Option<&'a str>,
    /// The cloud instance a cloud identity provider proved.
    pub instance: Option<&'a str>,
    /// RFC 3339 time of the claim.
    pub claimed_at: &'a str,
}

impl ClaimRecord<'_> {
    /// The record as an owned claim.
    pub fn to_owned(self) -> KubeletClaim {
        KubeletClaim {
            node_name: self.node_name.to_owned(),
            provider_id: self.provider_id.to_owned(),
            csr_uid: self.csr_uid.to_owned(),
            ek_sha256: self.ek_sha256.map(str::to_owned),
            instance: self.instance.map(str::to_owned),
            claimed_at: self.claimed_at.to_owned(),
        }
    }
}

/// The claim as found on an object, relative to the provider ID being asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// No claim.
    Unclaimed,
    /// A claim for this provider ID.
    Valid(KubeletClaim),
    /// A claim for another provider ID (the Machine's was changed): ignored and replaced.
    Stale(KubeletClaim),
    /// The annotation does not decode. Treated as claimed: only an operator removing the
    /// annotation releases the Machine, since ignoring it would let anyone re-claim.
    Unreadable(String),
}

impl ClaimState {
    /// Reads a Machine's claim annotation against the Machine's provider ID.
    pub fn of_machine(annotation: Option<&str>, provider_id: Option<&str>) -> Self {
        let Some(raw) = annotation else {
            return Self::Unclaimed;
        };
        match serde_json::from_str::<KubeletClaim>(raw) {
            Ok(claim) if Some(claim.provider_id.as_str()) == provider_id => Self::Valid(claim),
            Ok(claim) => Self::Stale(claim),
            Err(e) => Self::Unreadable(format!("{ANNOTATION_CLAIM} does not decode: {e}")),
        }
    }

    /// The valid claim, if any.
    pub fn valid(&self) -> Option<&KubeletClaim> {
        match self {
            Self::Valid(c) => Some(c),
            _ => None,
        }
    }
}

/// A MachinePool's claims, keyed by instance provider ID.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PoolClaims {
    /// Decoded records.
    #[default]
    None,
    /// Decoded records.
    Records(BTreeMap<String, KubeletClaim>),
    /// The annotation does not decode: every instance counts as claimed.
    Unreadable(String),
}

impl PoolClaims {
    /// Reads a MachinePool's claims annotation.
    pub fn parse(annotation: Option<&str>) -> Self {
        let Some(raw) = annotation else {
            return Self::None;
        };
        match serde_json::from_str::<BTreeMap<String, KubeletClaim>>(raw) {
            Ok(records) if records.iter().all(|(k, v)| *k == v.provider_id) => Self::Records(records),
            Ok(_) => Self::Unreadable(format!(
                "{ANNOTATION_POOL_CLAIMS}: a key differs from its record's providerID"
            )),
            Err(e) => Self::Unreadable(format!("{ANNOTATION_POOL_CLAIMS} does not decode: {e}")),
        }
    }

    /// Every decoded record.
    pub fn records(&self) -> impl Iterator<Item = &KubeletClaim> {
        match self {
            Self::Records(r) => Some(r.values()),
            Self::None | Self::Unreadable(_) => None,
        }
        .into_iter()
        .flatten()
    }

    /// The claim state of one instance.
    pub fn instance(&self, provider_id: &str) -> ClaimState {
        match self {
            Self::None => ClaimState::Unclaimed,
            Self::Records(r) => r
                .get(provider_id)
                .cloned()
                .map_or(ClaimState::Unclaimed, ClaimState::Valid),
            Self::Unreadable(why) => ClaimState::Unreadable(why.clone()),
        }
    }
}

/// A claim the controller must write before approving: one annotation, set to `value`, on
/// `target`, with `resource_version` as the precondition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimWrite {
    /// The Machine or MachinePool.
    pub target: TargetRef,
    /// The resourceVersion the decision was made on.
    #[serde(rename = "resourceVersion", skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The new record.
    pub record: KubeletClaim,
    /// Annotation key.
    pub annotation: &'static str,
    /// Whole annotation value to write (for a pool: every live instance's record).
    pub value: String,
}

impl ClaimWrite {
    /// The write for a Machine.
    pub fn machine(target: TargetRef, resource_version: Option<String>, record: KubeletClaim) -> Self {
        let value = serde_json::to_string(&record).unwrap_or_default();
        Self {
            target,
            resource_version,
            record,
            annotation: ANNOTATION_CLAIM,
            value,
        }
    }

    /// The write for a MachinePool: existing records of instances still listed, plus this one.
    pub fn pool(
        target: TargetRef,
        resource_version: Option<String>,
        existing: &PoolClaims,
        live_provider_ids: &[String],
        record: KubeletClaim,
    ) -> Self {
        let mut records = match existing {
            PoolClaims::Records(r) => r.clone(),
            _ => BTreeMap::new(),
        };
        records.retain(|k, _| live_provider_ids.iter().any(|p| p == k));
        records.insert(record.provider_id.clone(), record.clone());
        let value = serde_json::to_string(&records).unwrap_or_default();
        Self {
            target,
            resource_version,
            record,
            annotation: ANNOTATION_POOL_CLAIMS,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: &str) -> KubeletClaim {
        KubeletClaim {
            node_name: "n".into(),
            provider_id: pid.into(),
            csr_uid: "u".into(),
            ek_sha256: None,
            instance: None,
            claimed_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn machine_claims_are_valid_stale_or_unreadable() {
        let raw = serde_json::to_string(&record("p1")).unwrap();
        assert!(matches!(
            ClaimState::of_machine(Some(&raw), Some("p1")),
            ClaimState::Valid(_)
        ));
        assert!(matches!(
            ClaimState::of_machine(Some(&raw), Some("p2")),
            ClaimState::Stale(_)
        ));
        assert!(matches!(
            ClaimState::of_machine(Some("{"), Some("p1")),
            ClaimState::Unreadable(_)
        ));
        assert!(matches!(
            ClaimState::of_machine(Some(r#"{"nodeName":"n"}"#), Some("p1")),
            ClaimState::Unreadable(_)
        ));
        assert_eq!(ClaimState::of_machine(None, Some("p1")), ClaimState::Unclaimed);
    }

    #[test]
    fn pool_writes_prune_instances_no_longer_listed() {
        let existing = PoolClaims::Records(BTreeMap::from([
            ("gone".into(), record("gone")),
            ("p1".into(), record("p1")),
        ]));
        let target = TargetRef::pool("pool", "ns", "uid");
        let write = ClaimWrite::pool(target, None, &existing, &["p1".into(), "p2".into()], record("p2"));
        let PoolClaims::Records(written) = PoolClaims::parse(Some(&write.value)) else {
            panic!("{}", write.value)
        };
        assert_eq!(written.keys().collect::<Vec<_>>(), ["p1", "p2"]);
    }

    #[test]
    fn pool_claims_with_mismatched_keys_are_unreadable() {
        let raw = serde_json::to_string(&BTreeMap::from([("p9", record("p1"))])).unwrap();
        assert!(matches!(
            PoolClaims::parse(Some(&raw)).instance("p9"),
            ClaimState::Unreadable(_)
        ));
    }
}
