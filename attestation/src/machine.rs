//! Read-only views of the Cluster API objects the rules consult (`cluster.x-k8s.io` v1beta2 and
//! v1beta1 Machines, MachinePools and Clusters, `bootstrap.cluster.x-k8s.io` KubeadmConfigs)
//! and of workload-cluster Nodes, built from the objects' JSON.
//!
//! Views are built from `serde_json::Value` rather than generated types: the signer must read
//! both API versions, and only a handful of fields matter.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::claim::{ClaimState, PoolClaims};
use crate::names::{
    ANNOTATION_ALLOWED_ATTESTORS, ANNOTATION_CLAIM, ANNOTATION_EK_PIN, ANNOTATION_OPT_IN, ANNOTATION_POOL_CLAIMS,
};

/// Why an object cannot be read as the view asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// Another kind or API group.
    #[error("expected {expected}, got {api_version:?} {kind:?}")]
    WrongKind {
        /// What was expected.
        expected: &'static str,
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// A field the view needs is missing or of the wrong type.
    #[error("{kind} {name:?}: field {field} is missing or not a {expected}")]
    Field {
        /// The object's kind.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// Dotted path.
        field: &'static str,
        /// Expected JSON type.
        expected: &'static str,
    },
}

/// Cluster API version of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ApiVersion {
    /// `cluster.x-k8s.io/v1beta1` (served, not stored).
    #[serde(rename = "v1beta1")]
    V1beta1,
    /// `cluster.x-k8s.io/v1beta2` (served and stored).
    #[serde(rename = "v1beta2")]
    V1beta2,
}

/// Machine or MachinePool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TargetKind {
    /// A Machine.
    Machine,
    /// A MachinePool instance.
    MachinePool,
}

/// The object a CSR maps to, for claims and Events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetRef {
    /// Machine or MachinePool.
    pub kind: TargetKind,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
}

impl TargetRef {
    /// A Machine reference.
    pub fn machine(name: &str, namespace: &str, uid: &str) -> Self {
        Self {
            kind: TargetKind::Machine,
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }

    /// A MachinePool reference.
    pub fn pool(name: &str, namespace: &str, uid: &str) -> Self {
        Self {
            kind: TargetKind::MachinePool,
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }
}

/// An entry of `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MachineAddress {
    /// `Hostname`, `InternalDNS`, `ExternalDNS`, `InternalIP` or `ExternalIP` (borrowed when
    /// it is one of those: a fleet's cache holds these once, not once per address).
    #[serde(rename = "type")]
    pub kind: Cow<'static, str>,
    /// The address.
    pub address: String,
}

impl MachineAddress {
    /// A DNS-kind address (`Hostname`, `InternalDNS`, `ExternalDNS`).
    pub fn is_dns(&self) -> bool {
        matches!(&*self.kind, "Hostname" | "InternalDNS" | "ExternalDNS")
    }

    /// An IP-kind address (`InternalIP`, `ExternalIP`).
    pub fn is_ip(&self) -> bool {
        matches!(&*self.kind, "InternalIP" | "ExternalIP")
    }
}

/// `spec.bootstrap.configRef`, either version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRef {
    /// API group (`bootstrap.cluster.x-k8s.io`), from `apiGroup` or `apiVersion` (borrowed when
    /// it is a known one, like the kind).
    pub api_group: Cow<'static, str>,
    /// Kind, e.g. `KubeadmConfig`.
    pub kind: Cow<'static, str>,
    /// Name, in the Machine's namespace.
    pub name: String,
}

impl ConfigRef {
    /// Whether this names a kubeadm bootstrap config.
    pub fn is_kubeadm(&self) -> bool {
        self.kind == "KubeadmConfig" && self.api_group == "bootstrap.cluster.x-k8s.io"
    }
}

/// What the rules read of a Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineView {
    /// metadata.name
    pub name: String,
    /// metadata.namespace (shared: the shard cache holds one per Cluster, not per object)
    pub namespace: Arc<str>,
    /// metadata.uid
    pub uid: String,
    /// metadata.resourceVersion (the claim precondition).
    pub resource_version: Option<String>,
    /// Which API version it was read as.
    pub api_version: ApiVersion,
    /// spec.clusterName (shared, like the namespace)
    pub cluster_name: Arc<str>,
    /// spec.providerID
    pub provider_id: Option<String>,
    /// metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// Bootstrap data is ready (see [`MachineView::from_object`]).
    pub bootstrap_ready: bool,
    /// spec.bootstrap.configRef
    pub bootstrap_config: Option<ConfigRef>,
    /// spec.infrastructureRef.name
    pub infrastructure_name: Option<String>,
    /// status.nodeRef.name
    pub node_ref: Option<String>,
    /// status.addresses
    pub addresses: Vec<MachineAddress>,
    /// EK pins from the annotation, lowercased.
    pub ek_pins: Vec<String>,
    /// The signer's claim, relative to spec.providerID.
    pub claim: ClaimState,
}

/// What the rules read of a MachinePool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePoolView {
    /// metadata.name
    pub name: String,
    /// metadata.namespace (shared: the shard cache holds one per Cluster, not per object)
    pub namespace: Arc<str>,
    /// metadata.uid
    pub uid: String,
    /// metadata.resourceVersion (the claim precondition).
    pub resource_version: Option<String>,
    /// Which API version it was read as.
    pub api_version: ApiVersion,
    /// spec.clusterName (shared, like the namespace)
    pub cluster_name: Arc<str>,
    /// spec.providerIDList
    pub provider_ids: Vec<String>,
    /// metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// Bootstrap data is ready.
    pub bootstrap_ready: bool,
    /// spec.template.spec.bootstrap.configRef
    pub bootstrap_config: Option<ConfigRef>,
    /// status.nodeRefs[].name
    pub node_refs: Vec<String>,
    /// EK pins from the annotation, lowercased (they apply to every instance).
    pub ek_pins: Vec<String>,
    /// The signer's per-instance claims.
    pub claims: PoolClaims,
}

/// A KubeadmConfig's join token, reduced to the bootstrap-token user it authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeadmConfigView {
    /// metadata.name
    pub name: String,
    /// metadata.namespace (shared: the shard cache holds one per Cluster, not per object)
    pub namespace: Arc<str>,
    /// The token ID of `spec.joinConfiguration.discovery.bootstrapToken.token` (`<id>.<secret>`);
    /// the secret half is never kept.
    pub join_token_id: Option<String>,
}

impl KubeadmConfigView {
    /// The username the join token authenticates as.
    pub fn join_username(&self) -> Option<String> {
        self.join_token_id
            .as_ref()
            .map(|id| format!("{}{id}", crate::names::BOOTSTRAP_USER_PREFIX))
    }
}

/// What the signer reads of a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// metadata.name
    pub name: String,
    /// metadata.namespace
    pub namespace: String,
    /// metadata.uid
    pub uid: String,
    /// The opt-in annotation is `"true"`.
    pub opted_in: bool,
    /// Allowed attestor providers; `["tpm"]` when the annotation is absent.
    pub allowed_attestors: Vec<String>,
    /// The Cluster's `cluster.x-k8s.io/kubelet-*` annotations (a provider's own settings, such
    /// as the cloud allow-lists, read by that provider's verifier); nothing else is kept.
    pub kubelet_annotations: std::collections::BTreeMap<String, String>,
}

impl ClusterView {
    /// A Cluster with only a name and namespace (offline use); opted in, allowing `allowed`.
    pub fn named(name: &str, namespace: &str, allowed: &[&str]) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            uid: String::new(),
            opted_in: true,
            allowed_attestors: allowed.iter().map(|s| (*s).to_owned()).collect(),
            kubelet_annotations: std::collections::BTreeMap::new(),
        }
    }

    /// The same Cluster with one more `cluster.x-k8s.io/kubelet-*` annotation (offline use and
    /// tests).
    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        self.kubelet_annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// A `cluster.x-k8s.io/kubelet-*` annotation of the Cluster.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.kubelet_annotations.get(key).map(String::as_str)
    }

    /// Reads a `cluster.x-k8s.io` Cluster.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(
            object,
            "Cluster",
            &["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"],
        )?;
        let allowed_attestors = match meta.annotation(ANNOTATION_ALLOWED_ATTESTORS) {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            None => vec!["tpm".to_owned()],
        };
        let kubelet_annotations = object
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|all| {
                all.iter()
                    .filter(|(k, _)| k.starts_with(KUBELET_ANNOTATION_PREFIX))
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            opted_in: meta.annotation(ANNOTATION_OPT_IN) == Some("true"),
            allowed_attestors,
            kubelet_annotations,
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
        })
    }

    /// Whether `provider` is allowed for this Cluster.
    pub fn allows(&self, provider: &str) -> bool {
        self.allowed_attestors.iter().any(|a| a == provider)
    }
}

/// The prefix of the Cluster annotations a [`ClusterView`] keeps.
const KUBELET_ANNOTATION_PREFIX: &str = "cluster.x-k8s.io/kubelet-";

/// What the rules read of a workload-cluster Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// metadata.name
    pub name: String,
    /// spec.providerID (written by the kubelet or cloud provider).
    pub provider_id: Option<String>,
}

impl NodeView {
    /// Reads a core/v1 Node.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(object, "Node", &["v1"])?;
        Ok(Self {
            provider_id: str_at(object, &["spec", "providerID"]).map(str::to_owned),
            name: meta.name,
        })
    }
}

/// Everything a Cluster's namespace holds that the rules consult.
///
/// The views are shared (`Arc`), not owned: the controller hands every decision the views its
/// watch caches hold, and copying a 500-Machine cluster's views for each of its 500 CSRs made
/// a scale-up quadratic.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Machines of the Cluster (spec.clusterName matches).
    pub machines: Vec<std::sync::Arc<MachineView>>,
    /// MachinePools of the Cluster.
    pub pools: Vec<std::sync::Arc<MachinePoolView>>,
    /// KubeadmConfigs in the Cluster's namespace.
    pub kubeadm_configs: Vec<std::sync::Arc<KubeadmConfigView>>,
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
        let api_version = meta.capi_version();
        let provider_id = str_at(object, &["spec", "providerID"])
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let addresses = match object.pointer("/status/addresses") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|a| {
                    Some(MachineAddress {
                        kind: known(a.get("type")?.as_str()?, ADDRESS_TYPES),
                        address: a.get("address")?.as_str()?.to_owned(),
                    })
                })
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let mut addresses = addresses;
        addresses.shrink_to_fit();
        Ok(Self {
            cluster_name: meta
                .required_str(object, "Machine", &["spec", "clusterName"], "spec.clusterName")?
                .into(),
            bootstrap_ready: bootstrap_ready(object),
            bootstrap_config: config_ref(object.pointer("/spec/bootstrap/configRef")),
            infrastructure_name: str_at(object, &["spec", "infrastructureRef", "name"]).map(str::to_owned),
            node_ref: str_at(object, &["status", "nodeRef", "name"])
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            addresses,
            ek_pins: meta.ek_pins(),
            claim: ClaimState::of_machine(meta.annotation(ANNOTATION_CLAIM), provider_id.as_deref()),
            provider_id,
            deleting: meta.deleting,
            api_version,
            resource_version: meta.resource_version,
            name: meta.name,
            namespace: meta.namespace.into(),
            uid: meta.uid,
        })
    }

    /// A reference for claims and Events.
    pub fn target(&self) -> TargetRef {
        TargetRef::machine(&self.name, &self.namespace, &self.uid)
    }
}

impl MachinePoolView {
    /// Reads a MachinePool of either version.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(
            object,
            "MachinePool",
            &["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"],
        )?;
        let api_version = meta.capi_version();
        let strings = |pointer: &str, field: &str| match object.pointer(pointer) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|i| i.pointer(field).and_then(Value::as_str))
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        Ok(Self {
            cluster_name: meta
                .required_str(object, "MachinePool", &["spec", "clusterName"], "spec.clusterName")?
                .into(),
            provider_ids: strings("/spec/providerIDList", ""),
            bootstrap_ready: bootstrap_ready(object),
            bootstrap_config: config_ref(object.pointer("/spec/template/spec/bootstrap/configRef")),
            node_refs: strings("/status/nodeRefs", "/name"),
            ek_pins: meta.ek_pins(),
            claims: PoolClaims::parse(meta.annotation(ANNOTATION_POOL_CLAIMS)),
            deleting: meta.deleting,
            api_version,
            resource_version: meta.resource_version,
            name: meta.name,
            namespace: meta.namespace.into(),
            uid: meta.uid,
        })
    }

    /// A reference for claims and Events.
    pub fn target(&self) -> TargetRef {
        TargetRef::pool(&self.name, &self.namespace, &self.uid)
    }
}

impl KubeadmConfigView {
    /// Reads a `bootstrap.cluster.x-k8s.io` KubeadmConfig (v1beta2 or v1beta1).
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(
            object,
            "KubeadmConfig",
            &[
                "bootstrap.cluster.x-k8s.io/v1beta2",
                "bootstrap.cluster.x-k8s.io/v1beta1",
            ],
        )?;
        let join_token_id = str_at(
            object,
            &["spec", "joinConfiguration", "discovery", "bootstrapToken", "token"],
        )
        .and_then(|token| token.split_once('.'))
        .map(|(id, _secret)| id.to_owned())
        .filter(|id| !id.is_empty());
        Ok(Self {
            name: meta.name,
            namespace: meta.namespace.into(),
            join_token_id,
        })
    }
}

/// Any of the objects above, told apart by kind.
#[derive(Debug, Clone)]
pub enum CapiObject {
    /// A Machine.
    Machine(MachineView),
    /// A MachinePool.
    MachinePool(MachinePoolView),
}

impl CapiObject {
    /// Reads a Machine or MachinePool, by its `kind`.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        match object.get("kind").and_then(Value::as_str) {
            Some("MachinePool") => MachinePoolView::from_object(object).map(Self::MachinePool),
            _ => MachineView::from_object(object).map(Self::Machine),
        }
    }
}

/// The address types Cluster API defines.
const ADDRESS_TYPES: &[&str] = &["Hostname", "InternalDNS", "ExternalDNS", "InternalIP", "ExternalIP"];

/// `value`, borrowed from `table` when it is there, so a cache of many objects does not hold
/// the same few words once per object.
fn known(value: &str, table: &[&'static str]) -> Cow<'static, str> {
    match table.iter().find(|known| **known == value) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(value.to_owned()),
    }
}

fn str_at<'a>(object: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(object, |v, key| v.get(key))?.as_str()
}

/// Bootstrap data is ready by any of the signals the versions carry: v1beta2's
/// `status.initialization` and conditions, v1beta1's `status.bootstrapReady` and its
/// `status.v1beta2.conditions` (what Cluster API's conversion fills in for v1beta1 readers).
fn bootstrap_ready(object: &Value) -> bool {
    let true_at = |pointer: &str| object.pointer(pointer).and_then(Value::as_bool) == Some(true);
    let condition = |pointer: &str| {
        matches!(object.pointer(pointer), Some(Value::Array(conditions)) if conditions.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("BootstrapConfigReady")
                && c.get("status").and_then(Value::as_str) == Some("True")
        }))
    };
    true_at("/status/initialization/bootstrapDataSecretCreated")
        || true_at("/status/bootstrapReady")
        || condition("/status/conditions")
        || condition("/status/v1beta2/conditions")
}

fn config_ref(value: Option<&Value>) -> Option<ConfigRef> {
    let value = value?;
    let api_group = match value.get("apiGroup").and_then(Value::as_str) {
        Some(group) => group,
        // v1beta1 ObjectReference: apiVersion is group/version.
        None => value.get("apiVersion")?.as_str()?.split('/').next()?,
    };
    Some(ConfigRef {
        api_group: known(api_group, &["bootstrap.cluster.x-k8s.io"]),
        kind: known(value.get("kind")?.as_str()?, &["KubeadmConfig"]),
        name: value.get("name")?.as_str()?.to_owned(),
    })
}

struct Meta<'a> {
    object: &'a Value,
    api_version: String,
    name: String,
    namespace: String,
    uid: String,
    resource_version: Option<String>,
    deleting: bool,
}

impl<'a> Meta<'a> {
    fn read(object: &'a Value, kind: &'static str, versions: &[&str]) -> Result<Self, ObjectError> {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let object_kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        if object_kind != kind || !versions.contains(&api_version) {
            return Err(ObjectError::WrongKind {
                expected: kind,
                api_version: crate::identity::truncate(api_version, 64),
                kind: crate::identity::truncate(object_kind, 64),
            });
        }
        let name = str_at(object, &["metadata", "name"]).ok_or(ObjectError::Field {
            kind,
            name: String::new(),
            field: "metadata.name",
            expected: "string",
        })?;
        Ok(Self {
            object,
            api_version: api_version.to_owned(),
            name: name.to_owned(),
            namespace: str_at(object, &["metadata", "namespace"])
                .unwrap_or("default")
                .to_owned(),
            uid: str_at(object, &["metadata", "uid"]).unwrap_or_default().to_owned(),
            resource_version: str_at(object, &["metadata", "resourceVersion"]).map(str::to_owned),
            deleting: object
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()),
        })
    }

    fn capi_version(&self) -> ApiVersion {
        if self.api_version.ends_with("/v1beta1") {
            ApiVersion::V1beta1
        } else {
            ApiVersion::V1beta2
        }
    }

    fn annotation(&self, key: &str) -> Option<&'a str> {
        self.object.pointer("/metadata/annotations")?.get(key)?.as_str()
    }

    fn ek_pins(&self) -> Vec<String> {
        self.annotation(ANNOTATION_EK_PIN)
            .map(|list| {
                list.split(',')
                    .map(|p| p.trim().to_ascii_lowercase())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn required_str(
        &self,
        object: &Value,
        kind: &'static str,
        path: &[&str],
        field: &'static str,
    ) -> Result<String, ObjectError> {
        str_at(object, path)
            .map(str::to_owned)
            .ok_or_else(|| ObjectError::Field {
                kind,
                name: self.name.clone(),
                field,
                expected: "string",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert!(b.bootstrap_ready && b.bootstrap_config.as_ref().is_some_and(ConfigRef::is_kubeadm));
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

    #[test]
    fn wrong_kinds_and_missing_fields_are_clear_errors() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        assert!(matches!(
            MachineView::from_object(&node),
            Err(ObjectError::WrongKind { .. })
        ));
        let no_cluster =
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"}, "spec": {}});
        assert!(matches!(
            MachineView::from_object(&no_cluster),
            Err(ObjectError::Field {
                field: "spec.clusterName",
                ..
            })
        ));
        assert!(matches!(
            MachineView::from_object(&json!(null)),
            Err(ObjectError::WrongKind { .. })
        ));
    }

    #[test]
    fn kubeadm_join_token_keeps_only_the_id() {
        let kc = json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "metadata": {"name": "kc"},
            "spec": {"joinConfiguration": {"discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef"}}}}
        });
        let view = KubeadmConfigView::from_object(&kc).unwrap();
        assert_eq!(view.join_username().as_deref(), Some("system:bootstrap:abcdef"));
        assert!(!format!("{view:?}").contains("0123456789abcdef"));
    }

    #[test]
    fn cluster_attestors_default_to_tpm_only() {
        let c = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c",
            "annotations": {"cluster.x-k8s.io/kubelet-authentication": "true"}}});
        let view = ClusterView::from_object(&c).unwrap();
        assert!(view.opted_in && view.allows("tpm") && !view.allows("insecure"));
    }
}
