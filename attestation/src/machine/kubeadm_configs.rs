//! What the rules read of a `bootstrap.cluster.x-k8s.io` KubeadmConfig
//! ([`KubeadmConfigView`]): its name, the Cluster it is labeled for, and the ID of its join
//! token, the bootstrap-token user a joining kubelet authenticates as (the token's secret half
//! is never kept). A CSR from `system:bootstrap:<id>` is matched to a Machine through the
//! config it bootstraps from.

use std::sync::Arc;

use serde_json::Value;

use super::ObjectError;
use super::object::{Meta, str_at};
use crate::names::LABEL_CLUSTER_NAME;

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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
}
