//! What the rules read of a MachinePool ([`MachinePoolView`]), in either `cluster.x-k8s.io`
//! version: its provider IDs and node references (one per instance), its template's bootstrap
//! config, the EK pins that apply to every instance and the signer's per-instance claims. A
//! join into a pool is checked against these as a join of a Machine is against its
//! [`MachineView`](super::MachineView).

use std::sync::Arc;

use serde_json::Value;

use super::machines::{ConfigRef, config_ref};
use super::object::{Meta, bootstrap_ready};
use super::{ApiVersion, ObjectError};
use crate::claim::PoolClaims;
use crate::names::ANNOTATION_POOL_CLAIMS;
use crate::target::TargetRef;

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
