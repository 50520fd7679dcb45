//! What the rules read of a Machine ([`MachineView`]), in either `cluster.x-k8s.io` version:
//! its names, provider ID, bootstrap config and infrastructure references, node reference,
//! addresses, EK pins and the signer's claim. A replica caches one for every Machine of the
//! Clusters it serves, so the view keeps its strings [`packed`] and lends them out through
//! methods ([`MachineAddress`], [`ConfigRef`]) rather than owning a `String` per field.
//!
//! The reading of a `spec.bootstrap.configRef` lives here too: a MachinePool's template
//! carries the same reference.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::object::{Meta, bootstrap_ready, str_at};
use super::packed;
use super::{ApiVersion, ObjectError};
use crate::claim::{ClaimRecord, ClaimState};
use crate::names::ANNOTATION_CLAIM;
use crate::target::TargetRef;

/// An entry of `status.addresses`, borrowed from its Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MachineAddress<'a> {
    /// `Hostname`, `InternalDNS`, `ExternalDNS`, `InternalIP`, `ExternalIP` or another word.
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The address.
    pub address: &'a str,
}

impl MachineAddress<'_> {
    /// A DNS-kind address (`Hostname`, `InternalDNS`, `ExternalDNS`).
    pub fn is_dns(&self) -> bool {
        matches!(self.kind, "Hostname" | "InternalDNS" | "ExternalDNS")
    }

    /// An IP-kind address (`InternalIP`, `ExternalIP`).
    pub fn is_ip(&self) -> bool {
        matches!(self.kind, "InternalIP" | "ExternalIP")
    }
}

/// `spec.bootstrap.configRef`, either version: borrowed from a Machine, owned by a MachinePool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRef<'a> {
    /// API group (`bootstrap.cluster.x-k8s.io`), from `apiGroup` or `apiVersion`.
    pub api_group: Cow<'a, str>,
    /// Kind, e.g. `KubeadmConfig`.
    pub kind: Cow<'a, str>,
    /// Name, in the Machine's namespace.
    pub name: Cow<'a, str>,
}

impl ConfigRef<'_> {
    /// Whether this names a kubeadm bootstrap config.
    pub fn is_kubeadm(&self) -> bool {
        self.kind == "KubeadmConfig" && self.api_group == "bootstrap.cluster.x-k8s.io"
    }

    /// The same reference, owning its strings (the group and kind borrowed when they are the
    /// kubeadm config's: a cache of many pools does not hold them once per pool).
    pub fn into_owned(self) -> ConfigRef<'static> {
        ConfigRef {
            api_group: known(&self.api_group, &["bootstrap.cluster.x-k8s.io"]),
            kind: known(&self.kind, &["KubeadmConfig"]),
            name: Cow::Owned(self.name.into_owned()),
        }
    }

    /// The same reference, borrowed.
    pub fn borrowed(&self) -> ConfigRef<'_> {
        ConfigRef {
            api_group: Cow::Borrowed(&self.api_group),
            kind: Cow::Borrowed(&self.kind),
            name: Cow::Borrowed(&self.name),
        }
    }
}

/// What the rules read of a Machine. Its strings are packed (see the `packed` module): a
/// replica holds one of these for every Machine of the Clusters it serves, so they are read
/// through methods.
#[derive(Clone, PartialEq, Eq)]
pub struct MachineView {
    /// metadata.namespace (shared: the shard cache holds one per Cluster, not per object)
    pub namespace: Arc<str>,
    /// spec.clusterName (shared, like the namespace)
    pub cluster_name: Arc<str>,
    /// Which API version it was read as.
    pub api_version: ApiVersion,
    /// metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// Cluster API is done with its node: its v1beta2 `Deleting` condition is past the drain
    /// and the volume detach (see [`MachineView::node_released`]).
    released: bool,
    /// Bootstrap data is ready (see [`MachineView::from_object`]).
    pub bootstrap_ready: bool,
    /// What the claim annotation held; its fields are in `strings`.
    claim: ClaimKind,
    /// How many `status.addresses` follow the fixed fields in `strings` (two fields each).
    addresses: u32,
    /// The fixed fields (see [`field`]), then each address's type and address, then EK pins.
    strings: packed::Packed,
}

/// Indices of a [`MachineView`]'s fixed fields in its packed strings.
mod field {
    pub(super) const NAME: usize = 0;
    pub(super) const UID: usize = 1;
    pub(super) const RESOURCE_VERSION: usize = 2;
    pub(super) const PROVIDER_ID: usize = 3;
    pub(super) const CONFIG_GROUP: usize = 4;
    pub(super) const CONFIG_KIND: usize = 5;
    pub(super) const CONFIG_NAME: usize = 6;
    pub(super) const INFRASTRUCTURE_NAME: usize = 7;
    pub(super) const NODE_REF: usize = 8;
    pub(super) const CLAIM_NODE_NAME: usize = 9;
    pub(super) const CLAIM_PROVIDER_ID: usize = 10;
    pub(super) const CLAIM_CSR_UID: usize = 11;
    pub(super) const CLAIM_EK: usize = 12;
    pub(super) const CLAIM_INSTANCE: usize = 13;
    pub(super) const CLAIM_AT: usize = 14;
    /// Why an unreadable claim does not decode.
    pub(super) const CLAIM_ERROR: usize = 15;
    /// The first address.
    pub(super) const FIXED: usize = 16;
}

/// Which [`ClaimState`] a Machine's claim fields make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimKind {
    Unclaimed,
    Valid,
    Stale,
    Unreadable,
}

impl MachineView {
    /// Reads a Machine of either version. Bootstrap readiness: v1beta2
    /// `status.initialization.bootstrapDataSecretCreated` or a true `BootstrapConfigReady`
    /// condition; v1beta1 `status.bootstrapReady` (any of them, in either version).
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(
            object,
            "Machine",
            &["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"],
        )?;
        let cluster_name = meta.required_str(object, "Machine", &["spec", "clusterName"], "spec.clusterName")?;
        let provider_id = str_at(object, &["spec", "providerID"]).filter(|s| !s.is_empty());
        let config = config_ref(object.pointer("/spec/bootstrap/configRef"));
        let claim = ClaimState::of_machine(meta.annotation(ANNOTATION_CLAIM), provider_id);
        let (claim_kind, record, error) = match &claim {
            ClaimState::Unclaimed => (ClaimKind::Unclaimed, None, None),
            ClaimState::Valid(c) => (ClaimKind::Valid, Some(c), None),
            ClaimState::Stale(c) => (ClaimKind::Stale, Some(c), None),
            ClaimState::Unreadable(e) => (ClaimKind::Unreadable, None, Some(e.as_str())),
        };
        let mut strings = packed::Packer::default();
        strings.push(Some(&meta.name));
        strings.push(Some(&meta.uid));
        strings.push(meta.resource_version.as_deref());
        strings.push(provider_id);
        strings.push(config.as_ref().map(|c| &*c.api_group));
        strings.push(config.as_ref().map(|c| &*c.kind));
        strings.push(config.as_ref().map(|c| &*c.name));
        strings.push(str_at(object, &["spec", "infrastructureRef", "name"]));
        strings.push(str_at(object, &["status", "nodeRef", "name"]).filter(|s| !s.is_empty()));
        strings.push(record.map(|c| c.node_name.as_str()));
        strings.push(record.map(|c| c.provider_id.as_str()));
        strings.push(record.map(|c| c.csr_uid.as_str()));
        strings.push(record.and_then(|c| c.ek_sha256.as_deref()));
        strings.push(record.and_then(|c| c.instance.as_deref()));
        strings.push(record.map(|c| c.claimed_at.as_str()));
        strings.push(error);
        let mut addresses = 0u32;
        if let Some(Value::Array(items)) = object.pointer("/status/addresses") {
            for item in items {
                let kind = item.get("type").and_then(Value::as_str);
                let address = item.get("address").and_then(Value::as_str);
                if let (Some(kind), Some(address)) = (kind, address) {
                    strings.push(Some(kind));
                    strings.push(Some(address));
                    addresses = addresses.saturating_add(1);
                }
            }
        }
        for pin in meta.ek_pins() {
            strings.push(Some(&pin));
        }
        Ok(Self {
            namespace: meta.namespace.as_str().into(),
            cluster_name: cluster_name.into(),
            api_version: meta.capi_version(),
            deleting: meta.deleting,
            released: meta.deleting && node_released(object),
            bootstrap_ready: bootstrap_ready(object),
            claim: claim_kind,
            addresses,
            strings: strings.finish(),
        })
    }

    /// metadata.name
    pub fn name(&self) -> &str {
        self.strings.get(field::NAME).unwrap_or_default()
    }

    /// metadata.uid
    pub fn uid(&self) -> &str {
        self.strings.get(field::UID).unwrap_or_default()
    }

    /// metadata.resourceVersion (the claim precondition).
    pub fn resource_version(&self) -> Option<&str> {
        self.strings.get(field::RESOURCE_VERSION)
    }

    /// spec.providerID, when set and not empty.
    pub fn provider_id(&self) -> Option<&str> {
        self.strings.get(field::PROVIDER_ID)
    }

    /// spec.bootstrap.configRef
    pub fn bootstrap_config(&self) -> Option<ConfigRef<'_>> {
        Some(ConfigRef {
            api_group: Cow::Borrowed(self.strings.get(field::CONFIG_GROUP)?),
            kind: Cow::Borrowed(self.strings.get(field::CONFIG_KIND)?),
            name: Cow::Borrowed(self.strings.get(field::CONFIG_NAME)?),
        })
    }

    /// spec.infrastructureRef.name
    pub fn infrastructure_name(&self) -> Option<&str> {
        self.strings.get(field::INFRASTRUCTURE_NAME)
    }

    /// status.nodeRef.name, when set and not empty.
    pub fn node_ref(&self) -> Option<&str> {
        self.strings.get(field::NODE_REF)
    }

    /// status.addresses
    pub fn addresses(&self) -> impl Iterator<Item = MachineAddress<'_>> {
        (0..self.addresses as usize).filter_map(|i| {
            Some(MachineAddress {
                kind: self.strings.get(field::FIXED + 2 * i)?,
                address: self.strings.get(field::FIXED + 2 * i + 1)?,
            })
        })
    }

    /// EK pins from the annotation, lowercased.
    pub fn ek_pins(&self) -> impl Iterator<Item = &str> {
        let from = field::FIXED + 2 * self.addresses as usize;
        self.strings.range(from, self.strings.len().saturating_sub(from))
    }

    /// The signer's claim, relative to spec.providerID (built on each call: use
    /// [`MachineView::valid_claim`] to look without allocating).
    pub fn claim(&self) -> ClaimState {
        match self.claim {
            ClaimKind::Unclaimed => ClaimState::Unclaimed,
            ClaimKind::Unreadable => {
                ClaimState::Unreadable(self.strings.get(field::CLAIM_ERROR).unwrap_or_default().to_owned())
            }
            ClaimKind::Valid => ClaimState::Valid(self.record().to_owned()),
            ClaimKind::Stale => ClaimState::Stale(self.record().to_owned()),
        }
    }

    /// The claim, when it is valid for spec.providerID.
    pub fn valid_claim(&self) -> Option<ClaimRecord<'_>> {
        (self.claim == ClaimKind::Valid).then(|| self.record())
    }

    /// The node name of the claim, when it is valid for spec.providerID: rule 10 asks it of
    /// every Machine of the Cluster, so it reads one field, not the whole record.
    pub fn claimed_node(&self) -> Option<&str> {
        (self.claim == ClaimKind::Valid).then(|| self.strings.get(field::CLAIM_NODE_NAME).unwrap_or_default())
    }

    fn record(&self) -> ClaimRecord<'_> {
        let get = |i| self.strings.get(i).unwrap_or_default();
        ClaimRecord {
            node_name: get(field::CLAIM_NODE_NAME),
            provider_id: get(field::CLAIM_PROVIDER_ID),
            csr_uid: get(field::CLAIM_CSR_UID),
            ek_sha256: self.strings.get(field::CLAIM_EK),
            instance: self.strings.get(field::CLAIM_INSTANCE),
            claimed_at: get(field::CLAIM_AT),
        }
    }

    /// A reference for claims and Events.
    pub fn target(&self) -> TargetRef {
        TargetRef::machine(self.name(), &self.namespace, self.uid())
    }

    /// Being deleted, and Cluster API is done with its node: the drain and the volume detach are
    /// over, as its v1beta2 `Deleting` condition says (SPEC section 7, "Taking an identity
    /// back"). Its kubelet needs no identity any more.
    pub fn node_released(&self) -> bool {
        self.released
    }
}

/// The `Deleting` condition's reasons after the drain and the volume detach, in the order
/// Cluster API's Machine controller goes through them (`internal/controllers/machine`,
/// `reconcileDelete`; `api/core/v1beta2`'s `MachineDeleting*Reason`): pre-terminate hooks, the
/// infrastructure, the bootstrap config, the Node, done. Before them (pre-drain hooks,
/// `DrainingNode`, `WaitingForVolumeDetach`) and for any other reason the node is still needed.
const RELEASED_REASONS: [&str; 5] = [
    "WaitingForPreTerminateHook",
    "WaitingForInfrastructureDeletion",
    "WaitingForBootstrapDeletion",
    "DeletingNode",
    "DeletionCompleted",
];

/// Whether the Machine's `Deleting` condition (v1beta2 `status.conditions`, or a v1beta1
/// Machine's `status.v1beta2.conditions`) is true with a reason past the drain.
fn node_released(object: &Value) -> bool {
    ["/status/conditions", "/status/v1beta2/conditions"]
        .iter()
        .any(|pointer| {
            matches!(object.pointer(pointer), Some(Value::Array(conditions)) if conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Deleting")
                    && c.get("status").and_then(Value::as_str) == Some("True")
                    && c.get("reason").and_then(Value::as_str).is_some_and(|r| RELEASED_REASONS.contains(&r))
            }))
        })
}

impl std::fmt::Debug for MachineView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineView")
            .field("name", &self.name())
            .field("namespace", &self.namespace)
            .field("uid", &self.uid())
            .field("resource_version", &self.resource_version())
            .field("api_version", &self.api_version)
            .field("cluster_name", &self.cluster_name)
            .field("provider_id", &self.provider_id())
            .field("deleting", &self.deleting)
            .field("bootstrap_ready", &self.bootstrap_ready)
            .field("bootstrap_config", &self.bootstrap_config())
            .field("infrastructure_name", &self.infrastructure_name())
            .field("node_ref", &self.node_ref())
            .field("addresses", &self.addresses().collect::<Vec<_>>())
            .field("ek_pins", &self.ek_pins().collect::<Vec<_>>())
            .field("claim", &self.claim())
            .finish()
    }
}

/// `value`, borrowed from `table` when it is there, so a cache of many objects does not hold
/// the same few words once per object.
fn known(value: &str, table: &[&'static str]) -> Cow<'static, str> {
    match table.iter().find(|known| **known == value) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(value.to_owned()),
    }
}

/// Reads a `configRef` of either version (v1beta2 `apiGroup`, v1beta1 `apiVersion`).
pub(super) fn config_ref(value: Option<&Value>) -> Option<ConfigRef<'_>> {
    let value = value?;
    let api_group = match value.get("apiGroup").and_then(Value::as_str) {
        Some(group) => group,
        // v1beta1 ObjectReference: apiVersion is group/version.
        None => value.get("apiVersion")?.as_str()?.split('/').next()?,
    };
    Some(ConfigRef {
        api_group: Cow::Borrowed(api_group),
        kind: Cow::Borrowed(value.get("kind")?.as_str()?),
        name: Cow::Borrowed(value.get("name")?.as_str()?),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn v1beta2_and_v1beta1_machines_read_the_same_facts() {
        let v2 = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": {"clusterName": "c", "providerID": "aws:///i-1",
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "kc"}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine", "name": "im"}},
            "status": {"initialization": {"bootstrapDataSecretCreated": true}, "nodeRef": {"name": "n"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}
        });
        let v1 = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": {"clusterName": "c", "providerID": "aws:///i-1",
                     "bootstrap": {"configRef": {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": "kc"}},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "AWSMachine", "name": "im"}},
            "status": {"bootstrapReady": true, "nodeRef": {"kind": "Node", "name": "n"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}
        });
        let a = MachineView::from_object(&v2).unwrap();
        let b = MachineView::from_object(&v1).unwrap();
        assert_eq!(a.api_version, ApiVersion::V1beta2);
        assert_eq!(b.api_version, ApiVersion::V1beta1);
        assert_eq!(
            MachineView {
                api_version: ApiVersion::V1beta1,
                ..a
            },
            b
        );
        assert!(b.bootstrap_ready && b.bootstrap_config().as_ref().is_some_and(ConfigRef::is_kubeadm));
    }

    /// A running, claimed Machine as Cluster API and a provider write it.
    fn running_machine() -> Value {
        let claim = json!({"nodeName": "ip-10-0-0-7.ec2.internal", "providerID": "aws:///us-east-1a/i-0abc",
                           "csrUID": "7d1c1f9e-2c4b-4f7a-9a58-0f3f5d7b9e21", "ekSHA256": "ab12", "claimedAt": "2026-11-25T10:00:00Z"});
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "c-md-0-x", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                         "annotations": {"cluster.x-k8s.io/kubelet-claim": claim.to_string(),
                                         "cluster.x-k8s.io/tpm-ek-sha256": "AB12, cd34"}},
            "spec": {"clusterName": "c", "providerID": "aws:///us-east-1a/i-0abc",
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "c-md-0-x"}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine", "name": "c-md-0-x"}},
            "status": {"nodeRef": {"name": "ip-10-0-0-7.ec2.internal"},
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.7"},
                                     {"type": "InternalDNS", "address": "ip-10-0-0-7.ec2.internal"},
                                     {"type": "Custom", "address": "x"}, {"type": "Hostname"}]}
        })
    }

    #[test]
    fn a_packed_machine_reads_back_what_the_object_says_and_holds_each_name_once() {
        let object = running_machine();
        let m = MachineView::from_object(&object).unwrap();
        assert_eq!(
            (m.name(), m.uid(), m.resource_version()),
            ("c-md-0-x", "u-1", Some("42"))
        );
        assert_eq!((&*m.namespace, &*m.cluster_name), ("ns", "c"));
        assert_eq!(m.provider_id(), Some("aws:///us-east-1a/i-0abc"));
        assert_eq!(m.infrastructure_name(), Some("c-md-0-x"));
        assert_eq!(m.node_ref(), Some("ip-10-0-0-7.ec2.internal"));
        assert!(
            m.bootstrap_config()
                .is_some_and(|c| c.is_kubeadm() && c.name == "c-md-0-x")
        );
        let addresses: Vec<(&str, &str)> = m.addresses().map(|a| (a.kind, a.address)).collect();
        assert_eq!(
            addresses,
            [
                ("InternalIP", "10.0.0.7"),
                ("InternalDNS", "ip-10-0-0-7.ec2.internal"),
                ("Custom", "x")
            ]
        );
        assert_eq!(m.ek_pins().collect::<Vec<_>>(), ["ab12", "cd34"]);
        let expected = ClaimState::of_machine(
            object
                .pointer("/metadata/annotations/cluster.x-k8s.io~1kubelet-claim")
                .and_then(Value::as_str),
            m.provider_id(),
        );
        assert!(matches!(expected, ClaimState::Valid(_)));
        assert_eq!(m.claim(), expected);
        assert_eq!(m.valid_claim().map(ClaimRecord::to_owned).as_ref(), expected.valid());
        assert_eq!(m.claimed_node(), expected.valid().map(|c| c.node_name.as_str()));
        // The Machine's name, provider ID and node name each appear once in its text.
        let packed = &m.strings;
        let stored: String = (0..packed.len()).filter_map(|i| packed.get(i)).collect();
        assert!(stored.matches("c-md-0-x").count() >= 3, "read back through every field");
        assert_eq!(packed.text_len(), "c-md-0-xu-142aws:///us-east-1a/i-0abcip-10-0-0-7.ec2.internal7d1c1f9e-2c4b-4f7a-9a58-0f3f5d7b9e21ab122026-11-25T10:00:00Z10.0.0.7Customxcd34".len());
    }

    #[test]
    fn stale_and_unreadable_claims_survive_packing() {
        let mut object = running_machine();
        object["spec"]["providerID"] = json!("aws:///us-east-1a/i-0new");
        let stale = MachineView::from_object(&object).unwrap();
        assert!(matches!(stale.claim(), ClaimState::Stale(c) if c.provider_id == "aws:///us-east-1a/i-0abc"));
        assert_eq!((stale.valid_claim(), stale.claimed_node()), (None, None));
        object["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"] = json!("{not json");
        let unreadable = MachineView::from_object(&object).unwrap();
        assert!(matches!(unreadable.claim(), ClaimState::Unreadable(e) if e.contains("does not decode")));
        object["metadata"]["annotations"] = json!({});
        assert_eq!(
            MachineView::from_object(&object).unwrap().claim(),
            ClaimState::Unclaimed
        );
    }

    #[test]
    fn v1beta2_bootstrap_readiness_also_comes_from_the_condition() {
        let m = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m"}, "spec": {"clusterName": "c"},
            "status": {"conditions": [{"type": "BootstrapConfigReady", "status": "True"}]}
        });
        assert!(MachineView::from_object(&m).unwrap().bootstrap_ready);
        let converted_v1beta1 = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "m"}, "spec": {"clusterName": "c"},
            "status": {"v1beta2": {"conditions": [{"type": "BootstrapConfigReady", "status": "True"}]}}
        });
        assert!(MachineView::from_object(&converted_v1beta1).unwrap().bootstrap_ready);
        let not_ready = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"}, "spec": {"clusterName": "c"}});
        assert!(!MachineView::from_object(&not_ready).unwrap().bootstrap_ready);
    }
}
