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

pub mod index;
mod packed;

use crate::claim::{ClaimRecord, ClaimState, PoolClaims};
use crate::names::{
    ANNOTATION_ALLOWED_ATTESTORS, ANNOTATION_CLAIM, ANNOTATION_EK_PIN, ANNOTATION_OPT_IN, ANNOTATION_PAUSED,
    ANNOTATION_POOL_CLAIMS, LABEL_CLUSTER_NAME,
};

pub use crate::target::{TargetKind, TargetRef};

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

/// What the rules read of a Machine. Its strings are packed (see [`packed`]): a replica holds
/// one of these for every Machine of the Clusters it serves, so they are read through methods.
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
    pub bootstrap_config: Option<ConfigRef<'static>>,
    /// status.nodeRefs[].name
    pub node_refs: Vec<String>,
    /// EK pins from the annotation, lowercased (they apply to every instance).
    pub ek_pins: Vec<String>,
    /// The signer's per-instance claims.
    pub claims: PoolClaims,
}

/// A KubeadmConfig's join token, reduced to the bootstrap-token user it authenticates as.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeadmConfigView {
    /// metadata.namespace (shared: the shard cache holds one per Cluster, not per object)
    pub namespace: Arc<str>,
    /// The `cluster.x-k8s.io/cluster-name` label (shared like the namespace): a config labeled
    /// for another Cluster is not one a Machine of this Cluster bootstraps from.
    pub cluster_name: Option<Arc<str>>,
    /// metadata.name, then the join token's ID (one allocation: a replica holds one of these
    /// per Machine it serves).
    text: Box<str>,
    /// Where the name ends and the token ID starts.
    name_end: u32,
}

impl KubeadmConfigView {
    /// metadata.name
    pub fn name(&self) -> &str {
        self.text.get(..self.name_end as usize).unwrap_or_default()
    }

    /// The token ID of `spec.joinConfiguration.discovery.bootstrapToken.token` (`<id>.<secret>`);
    /// the secret half is never kept.
    pub fn join_token_id(&self) -> Option<&str> {
        self.text.get(self.name_end as usize..).filter(|id| !id.is_empty())
    }

    /// Whether a Machine of `cluster` may bootstrap from it: it is labeled for that Cluster or
    /// not labeled at all.
    pub fn serves_cluster(&self, cluster: &str) -> bool {
        self.cluster_name.as_deref().is_none_or(|c| c == cluster)
    }

    /// The username the join token authenticates as.
    pub fn join_username(&self) -> Option<String> {
        self.join_token_id()
            .map(|id| format!("{}{id}", crate::names::BOOTSTRAP_USER_PREFIX))
    }
}

impl std::fmt::Debug for KubeadmConfigView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeadmConfigView")
            .field("name", &self.name())
            .field("namespace", &self.namespace)
            .field("cluster_name", &self.cluster_name)
            .field("join_token_id", &self.join_token_id())
            .finish()
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
    /// as the cloud allow-lists, read by that provider's verifier); no other annotation is
    /// kept (the pause annotation is read into [`ClusterView::paused`]).
    pub kubelet_annotations: std::collections::BTreeMap<String, String>,
    /// How the Cluster is paused, `None` when it is not: the signer then decides and writes
    /// nothing for it (SPEC section 7, "Paused Clusters").
    pub paused: Option<Paused>,
    /// The `tpm/v1` boot policy (SPEC section 5, revision 5): as the annotation names it
    /// (unresolved), until the signer reads the ConfigMap (or its default) for a decision.
    pub boot_policy: crate::tpm::boot_policy::PolicyState,
}

/// How a Cluster is paused, read as Cluster API's own controllers read it
/// (`annotations.IsPaused` in sigs.k8s.io/cluster-api `util/annotations`): `spec.paused` is
/// true (a `bool` in v1beta1, a `*bool` in v1beta2: both `true` in JSON), or the
/// `cluster.x-k8s.io/paused` annotation is present, whatever its value (`clusterctl move` and
/// operators set it empty). Reading it as they do matters: `clusterctl move` pauses the source
/// Cluster and unpauses its copy by these two, and a signer that read them otherwise would
/// write claims or certificates for a Cluster in mid-move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// `spec.paused: true`.
    Spec,
    /// The `cluster.x-k8s.io/paused` annotation is present.
    Annotation,
    /// Both.
    SpecAndAnnotation,
}

impl Paused {
    /// How `object` (a Cluster of either version) is paused, `None` when it is not.
    pub fn of(object: &Value) -> Option<Self> {
        let spec = object.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
        let annotation = object
            .pointer("/metadata/annotations")
            .and_then(|annotations| annotations.get(ANNOTATION_PAUSED))
            .is_some();
        match (spec, annotation) {
            (true, true) => Some(Self::SpecAndAnnotation),
            (true, false) => Some(Self::Spec),
            (false, true) => Some(Self::Annotation),
            (false, false) => None,
        }
    }
}

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Spec => write!(f, "spec.paused is true"),
            Self::Annotation => write!(f, "it carries the {ANNOTATION_PAUSED} annotation"),
            Self::SpecAndAnnotation => write!(
                f,
                "spec.paused is true and it carries the {ANNOTATION_PAUSED} annotation"
            ),
        }
    }
}

impl ClusterView {
    /// `<namespace>/<name>`: how the signer names a Cluster in its caches, logs and metrics.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// A Cluster with only a name and namespace (offline use); opted in, allowing `allowed`.
    pub fn named(name: &str, namespace: &str, allowed: &[&str]) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            uid: String::new(),
            opted_in: true,
            allowed_attestors: allowed.iter().map(|s| (*s).to_owned()).collect(),
            kubelet_annotations: std::collections::BTreeMap::new(),
            boot_policy: crate::tpm::boot_policy::PolicyState::None,
            paused: None,
        }
    }

    /// Whether the Cluster is paused (see [`Paused`]).
    pub fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// The same Cluster with one more `cluster.x-k8s.io/kubelet-*` annotation (offline use and
    /// tests).
    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        if key == crate::names::ANNOTATION_TPM_BOOT_POLICY {
            self.boot_policy = crate::tpm::boot_policy::PolicyState::named(&self.namespace, Some(value));
        }
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
            boot_policy: crate::tpm::boot_policy::PolicyState::named(
                &meta.namespace,
                meta.annotation(crate::names::ANNOTATION_TPM_BOOT_POLICY),
            ),
            opted_in: meta.annotation(ANNOTATION_OPT_IN) == Some("true"),
            allowed_attestors,
            kubelet_annotations,
            paused: Paused::of(object),
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
    /// The lookups the rules make, built on the first ([`index::InventoryIndex`]). Leave it
    /// `Default::default()`: it is built from the fields above, which must not change after.
    pub index: std::sync::OnceLock<index::InventoryIndex>,
}

impl Inventory {
    /// An inventory of these objects.
    pub fn new(
        machines: Vec<std::sync::Arc<MachineView>>,
        pools: Vec<std::sync::Arc<MachinePoolView>>,
        kubeadm_configs: Vec<std::sync::Arc<KubeadmConfigView>>,
    ) -> Self {
        Self {
            machines,
            pools,
            kubeadm_configs,
            index: std::sync::OnceLock::new(),
        }
    }

    /// The lookups, built on first use.
    pub fn index(&self) -> &index::InventoryIndex {
        self.index.get_or_init(|| index::InventoryIndex::build(self))
    }
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
            bootstrap_config: config_ref(object.pointer("/spec/template/spec/bootstrap/configRef"))
                .map(ConfigRef::into_owned),
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
        .map(|(id, _secret)| id)
        .unwrap_or_default();
        let name_end = u32::try_from(meta.name.len()).map_err(|_| ObjectError::Field {
            kind: "KubeadmConfig",
            name: String::new(),
            field: "metadata.name",
            expected: "name",
        })?;
        Ok(Self {
            namespace: meta.namespace.as_str().into(),
            cluster_name: meta.label(LABEL_CLUSTER_NAME).map(Into::into),
            text: format!("{}{join_token_id}", meta.name).into_boxed_str(),
            name_end,
        })
    }
}

/// Any of the objects above, told apart by kind.
#[derive(Debug, Clone)]
pub enum CapiObject {
    /// A Machine.
    Machine(MachineView),
    /// A MachinePool.
    MachinePool(Box<MachinePoolView>),
}

impl CapiObject {
    /// Reads a Machine or MachinePool, by its `kind`.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        match object.get("kind").and_then(Value::as_str) {
            Some("MachinePool") => MachinePoolView::from_object(object).map(|p| Self::MachinePool(Box::new(p))),
            _ => MachineView::from_object(object).map(Self::Machine),
        }
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

fn config_ref(value: Option<&Value>) -> Option<ConfigRef<'_>> {
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

    fn label(&self, key: &str) -> Option<&'a str> {
        self.object.pointer("/metadata/labels")?.get(key)?.as_str()
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

    #[test]
    fn a_cluster_is_paused_by_spec_paused_or_the_annotation_in_either_version() {
        let cluster = |version: &str, spec: Value, annotations: Value| {
            let object = json!({"apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns", "annotations": annotations}, "spec": spec});
            ClusterView::from_object(&object).unwrap().paused
        };
        let opted_in = json!({"cluster.x-k8s.io/kubelet-authentication": "true"});
        for version in ["v1beta1", "v1beta2"] {
            assert_eq!(cluster(version, json!({}), opted_in.clone()), None, "{version}");
            assert_eq!(
                cluster(version, json!({"paused": false}), opted_in.clone()),
                None,
                "{version}"
            );
            assert_eq!(
                cluster(version, json!({"paused": true}), opted_in.clone()),
                Some(Paused::Spec),
                "{version}"
            );
            // Present is paused, whatever the value: Cluster API reads it so.
            for value in ["", "true", "false"] {
                let annotations =
                    json!({"cluster.x-k8s.io/kubelet-authentication": "true", "cluster.x-k8s.io/paused": value});
                assert_eq!(
                    cluster(version, json!({}), annotations.clone()),
                    Some(Paused::Annotation),
                    "{version} {value:?}"
                );
                assert_eq!(
                    cluster(version, json!({"paused": true}), annotations),
                    Some(Paused::SpecAndAnnotation),
                    "{version} {value:?}"
                );
            }
        }
        // Not a bool, or another annotation: not paused.
        assert_eq!(
            cluster(
                "v1beta2",
                json!({"paused": "true"}),
                json!({"cluster.x-k8s.io/paused-not": ""})
            ),
            None
        );
        let paused = ClusterView::from_object(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "annotations": {"cluster.x-k8s.io/paused": ""}}}))
        .unwrap();
        assert!(paused.is_paused() && paused.kubelet_annotations.is_empty());
        assert!(paused.paused.unwrap().to_string().contains("cluster.x-k8s.io/paused"));
        assert!(!ClusterView::named("c", "ns", &["tpm"]).is_paused());
    }
}
