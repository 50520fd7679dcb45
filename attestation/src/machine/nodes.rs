//! What the rules read of a workload-cluster core/v1 Node ([`NodeView`]): its name and the
//! `spec.providerID` the kubelet or cloud provider wrote, to tell which Machine a serving
//! certificate's Node is.

use serde_json::Value;

use super::ObjectError;
use super::object::{Meta, str_at};

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
