//! Read-only views of the Cluster API objects the rules consult (`cluster.x-k8s.io` v1beta2 and
//! v1beta1 Machines, MachinePools and Clusters, `bootstrap.cluster.x-k8s.io` KubeadmConfigs)
//! and of workload-cluster Nodes, built from the objects' JSON.
//!
//! Views are built from `serde_json::Value` rather than generated types: the signer must read
//! both API versions, and only a handful of fields matter.
//!
//! One room per object read, each with its own tests: [`MachineView`] (and the
//! [`MachineAddress`] and [`ConfigRef`] it lends) in `machines`, [`MachinePoolView`] in
//! `machine_pools`, [`KubeadmConfigView`] in `kubeadm_configs`, [`ClusterView`] and [`Paused`] in
//! `clusters`, [`NodeView`] in `nodes`; `object` reads the metadata and fields they share, and
//! [`index`] looks an [`Inventory`]'s views up. This module keeps what spans them: the
//! [`ObjectError`] they fail with, the [`ApiVersion`] they were read as, the [`Inventory`] of a
//! Cluster's namespace and the [`CapiObject`] either kind of target reads as.

use serde::Serialize;
use serde_json::Value;

mod clusters;
pub mod index;
mod kubeadm_configs;
mod machine_pools;
mod machines;
mod nodes;
mod object;
mod packed;

pub use clusters::{ClusterView, Paused};
pub use kubeadm_configs::KubeadmConfigView;
pub use machine_pools::MachinePoolView;
pub use machines::{ConfigRef, MachineAddress, MachineView};
pub use nodes::NodeView;

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
