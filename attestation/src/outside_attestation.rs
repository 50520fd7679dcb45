//! SPEC section 7, "Nodes outside attestation" and "No silent expiry": which Nodes
//! of an opted-in Cluster hold an identity the signer did not issue, and therefore still renew
//! through kubeadm's `kubeadm:node-autoapprove-certificate-rotation` binding, and whether that
//! binding may go. Pure: the signer's duty lists the Nodes and CSRs, asks here, reports and
//! applies.
//!
//! A Node is under attestation when the Machine (or MachinePool instance) carrying its
//! `spec.providerID` holds a valid claim for that Node's name. Anything else is outside: it
//! joined before the Cluster opted in, or by kubeadm's own path (the first control-plane node
//! until it is adopted), or it is not a Machine's at all. Such a Node renews only through the
//! rotation binding, so the binding stays while one exists: an opt-in never leaves a node
//! without a way to renew.

use std::collections::HashMap;

use crate::machine::{ClusterView, Inventory, NodeView};
use crate::target::TargetRef;

/// Cluster annotation: `"remove"` removes the rotation binding at once, Nodes outside
/// attestation or not (they then lose their identity when their certificates expire).
pub const ANNOTATION_LEGACY_ROTATION: &str = "cluster.x-k8s.io/kubelet-legacy-rotation";

/// The value of [`ANNOTATION_LEGACY_ROTATION`] that removes the binding at once.
pub const LEGACY_ROTATION_REMOVE: &str = "remove";

/// Cluster annotation: `"keep"` keeps both of kubeadm's auto-approve bindings as they are: the
/// signer neither removes nor recreates them (the per-Cluster form of
/// `--keep-legacy-autoapprove`). It is the first step of an opt-out (SPEC section 7, revision
/// 5): the bindings are restored and kept while nodes roll to stock templates, which join and
/// renew through kubeadm's own TLS bootstrap, and the signer still serves the nodes that use
/// the plugin until the Cluster's opt-in annotation goes.
pub const ANNOTATION_LEGACY_AUTOAPPROVE: &str = "cluster.x-k8s.io/kubelet-legacy-autoapprove";

/// The value of [`ANNOTATION_LEGACY_AUTOAPPROVE`] that keeps the bindings.
pub const LEGACY_AUTOAPPROVE_KEEP: &str = "keep";

/// Whether the Cluster keeps kubeadm's auto-approve bindings ([`ANNOTATION_LEGACY_AUTOAPPROVE`]).
pub fn keeps_legacy_autoapprove(cluster: &ClusterView) -> bool {
    cluster.annotation(ANNOTATION_LEGACY_AUTOAPPROVE) == Some(LEGACY_AUTOAPPROVE_KEEP)
}

/// kubeadm's signer for kubelet client certificates, whose CSRs the removed bindings served.
pub const LEGACY_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// Why a Node is outside attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outside {
    /// Its Machine or pool instance holds no valid claim (it joined before the opt-in, or is the
    /// first control-plane node not adopted yet).
    Unclaimed(TargetRef),
    /// Its Machine's or instance's valid claim is for another node name.
    ClaimedForAnother {
        /// The Machine or pool.
        target: TargetRef,
        /// The claim's node name.
        claimed: String,
    },
    /// No Machine or MachinePool of the Cluster carries its provider ID (or it has none).
    NoMachine,
}

/// A Node outside attestation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideNode {
    /// The Node's name.
    pub name: String,
    /// Its provider ID.
    pub provider_id: Option<String>,
    /// Why.
    pub why: Outside,
}

impl OutsideNode {
    /// The Machine or MachinePool its Event goes to, if it has one.
    pub fn target(&self) -> Option<&TargetRef> {
        match &self.why {
            Outside::Unclaimed(t) | Outside::ClaimedForAnother { target: t, .. } => Some(t),
            Outside::NoMachine => None,
        }
    }

    /// Whether this Node keeps kubeadm's rotation binding (SPEC section 7, revision 5): only a
    /// Node of a Machine or pool instance that holds no valid claim yet, which renews through
    /// that binding until it is adopted. A Node that no Machine names, or that carries the
    /// provider ID of a Machine claimed for another node, is reported but keeps nothing: any
    /// kept legacy identity (valid for up to a year) can register such a Node, and it would
    /// otherwise hold kubeadm's renewal path open for every node of the cluster.
    pub fn keeps_rotation_binding(&self) -> bool {
        matches!(self.why, Outside::Unclaimed(_))
    }

    /// Why, for people.
    pub fn describe(&self) -> String {
        match &self.why {
            Outside::Unclaimed(t) => format!(
                "Node {} of {} {} holds an identity the signer did not issue ({} {} has no valid claim: it joined before the Cluster opted in, or by kubeadm's own path)",
                self.name,
                t.kind_name(),
                t.name,
                t.kind_name(),
                t.name
            ),
            Outside::ClaimedForAnother { target, claimed } => format!(
                "Node {} carries the provider ID of {} {}, whose claim is for node {claimed}",
                self.name,
                target.kind_name(),
                target.name
            ),
            Outside::NoMachine => format!(
                "Node {} belongs to no Machine or MachinePool of the Cluster (provider ID {})",
                self.name,
                self.provider_id.as_deref().unwrap_or("none")
            ),
        }
    }
}

/// Every Node of the Cluster outside attestation, by name.
pub fn nodes_outside(cluster: &ClusterView, inventory: &Inventory, nodes: &[NodeView]) -> Vec<OutsideNode> {
    let ours = |namespace: &str, cluster_name: &str| namespace == cluster.namespace && cluster_name == cluster.name;
    // provider ID -> (target, claimed node name if a valid claim)
    let mut by_provider_id: HashMap<&str, (TargetRef, Option<String>)> = HashMap::new();
    for m in inventory
        .machines
        .iter()
        .filter(|m| ours(&m.namespace, &m.cluster_name))
    {
        if let Some(pid) = m.provider_id() {
            by_provider_id.insert(pid, (m.target(), m.claimed_node().map(str::to_owned)));
        }
    }
    for p in inventory.pools.iter().filter(|p| ours(&p.namespace, &p.cluster_name)) {
        for pid in &p.provider_ids {
            let claimed = p
                .claims
                .records()
                .find(|c| c.provider_id == *pid)
                .map(|c| c.node_name.clone());
            by_provider_id.insert(pid.as_str(), (p.target(), claimed));
        }
    }
    let mut outside: Vec<OutsideNode> = nodes
        .iter()
        .filter_map(|node| {
            let found = node.provider_id.as_deref().and_then(|pid| by_provider_id.get(pid));
            let why = match found {
                None => Outside::NoMachine,
                Some((_, Some(claimed))) if *claimed == node.name => return None,
                Some((target, Some(claimed))) => Outside::ClaimedForAnother {
                    target: target.clone(),
                    claimed: claimed.clone(),
                },
                Some((target, None)) => Outside::Unclaimed(target.clone()),
            };
            Some(OutsideNode {
                name: node.name.clone(),
                provider_id: node.provider_id.clone(),
                why,
            })
        })
        .collect();
    outside.sort_by(|a, b| a.name.cmp(&b.name));
    outside
}

/// What becomes of kubeadm's rotation binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RotationBinding {
    /// Removed: no Node is outside attestation (or the Cluster says so).
    Remove {
        /// Why, for the log and the Event.
        why: String,
    },
    /// Kept: these Nodes still renew through it.
    Keep {
        /// Their names.
        nodes: Vec<String>,
    },
}

/// Whether `kubeadm:node-autoapprove-certificate-rotation` may go (SPEC section 7, "No silent
/// expiry", revision 5): at once under `cluster.x-k8s.io/kubelet-legacy-rotation: remove`, else
/// once no Node of a Machine or pool instance is outside attestation
/// ([`OutsideNode::keeps_rotation_binding`]).
pub fn rotation_binding(cluster: &ClusterView, outside: &[OutsideNode]) -> RotationBinding {
    if cluster.annotation(ANNOTATION_LEGACY_ROTATION) == Some(LEGACY_ROTATION_REMOVE) {
        return RotationBinding::Remove {
            why: format!("the Cluster is annotated {ANNOTATION_LEGACY_ROTATION}: {LEGACY_ROTATION_REMOVE}"),
        };
    }
    let keepers: Vec<String> = outside
        .iter()
        .filter(|n| n.keeps_rotation_binding())
        .map(|n| n.name.clone())
        .collect();
    match (keepers.is_empty(), outside.len()) {
        (true, 0) => RotationBinding::Remove {
            why: "every Node is under attestation".to_owned(),
        },
        (true, reported) => RotationBinding::Remove {
            why: format!(
                "every Node of a Machine or pool instance is under attestation ({reported} Node(s) that no unclaimed Machine names are reported, and keep nothing)"
            ),
        },
        (false, _) => RotationBinding::Keep { nodes: keepers },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::machine::{MachinePoolView, MachineView};

    fn machine(name: &str, pid: &str, claimed_node: Option<&str>) -> Arc<MachineView> {
        let mut annotations = serde_json::json!({});
        if let Some(node) = claimed_node {
            annotations["cluster.x-k8s.io/kubelet-claim"] = serde_json::json!(
                serde_json::json!({"nodeName": node, "providerID": pid, "csrUID": "u", "claimedAt": "2026-11-01T00:00:00Z"})
                    .to_string()
            );
        }
        Arc::new(
            MachineView::from_object(&serde_json::json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "annotations": annotations},
                "spec": {"clusterName": "c", "providerID": pid}
            }))
            .unwrap(),
        )
    }

    fn node(name: &str, pid: Option<&str>) -> NodeView {
        NodeView {
            name: name.into(),
            provider_id: pid.map(str::to_owned),
        }
    }

    #[test]
    fn a_node_is_outside_until_its_machine_is_claimed_for_it() {
        let cluster = ClusterView::named("c", "ns", &["tpm"]);
        let mut pool = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "pool", "namespace": "ns", "uid": "uid-pool", "annotations": {
                "cluster.x-k8s.io/kubelet-claims": serde_json::json!({"p1": {"nodeName": "pool-1", "providerID": "p1", "csrUID": "u", "claimedAt": "2026-11-01T00:00:00Z"}}).to_string()}},
            "spec": {"clusterName": "c", "providerIDList": ["p1", "p2"]}
        });
        let _ = &mut pool;
        let inventory = Inventory {
            index: Default::default(),
            machines: vec![
                machine("cp-0", "m-cp", None),
                machine("w-0", "m-w0", Some("w-0")),
                machine("w-1", "m-w1", Some("somebody-else")),
            ],
            pools: vec![Arc::new(MachinePoolView::from_object(&pool).unwrap())],
            kubeadm_configs: vec![],
        };
        let nodes = [
            node("cp-0", Some("m-cp")),
            node("w-0", Some("m-w0")),
            node("w-1", Some("m-w1")),
            node("pool-1", Some("p1")),
            node("pool-2", Some("p2")),
            node("stray", None),
        ];
        let outside = nodes_outside(&cluster, &inventory, &nodes);
        let names: Vec<&str> = outside.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["cp-0", "pool-2", "stray", "w-1"]);
        assert!(matches!(outside[0].why, Outside::Unclaimed(ref t) if t.name == "cp-0"));
        assert!(matches!(outside[1].why, Outside::Unclaimed(ref t) if t.name == "pool"));
        assert_eq!(outside[2].why, Outside::NoMachine);
        assert!(matches!(outside[3].why, Outside::ClaimedForAnother { ref claimed, .. } if claimed == "somebody-else"));
        assert!(outside[0].describe().contains("did not issue"));

        // Only the Nodes of unclaimed Machines and instances keep the binding: "stray" (no
        // Machine) and "w-1" (its Machine claimed for another node) are reported only.
        assert_eq!(
            rotation_binding(&cluster, &outside),
            RotationBinding::Keep {
                nodes: vec!["cp-0".into(), "pool-2".into()]
            }
        );
        // A kept legacy identity's own Node, belonging to no Machine, does not hold kubeadm's
        // renewal path open for the cluster (an attack review's finding).
        let only_strays: Vec<OutsideNode> = outside
            .iter()
            .filter(|n| !n.keeps_rotation_binding())
            .cloned()
            .collect();
        assert_eq!(only_strays.len(), 2);
        assert!(matches!(
            rotation_binding(&cluster, &only_strays),
            RotationBinding::Remove { ref why } if why.contains("2 Node(s)")
        ));
        assert!(matches!(
            rotation_binding(&cluster, &[]),
            RotationBinding::Remove { .. }
        ));
        assert!(!keeps_legacy_autoapprove(&cluster));
        assert!(keeps_legacy_autoapprove(
            &cluster.clone().with_annotation(ANNOTATION_LEGACY_AUTOAPPROVE, "keep")
        ));
        assert!(!keeps_legacy_autoapprove(
            &cluster.clone().with_annotation(ANNOTATION_LEGACY_AUTOAPPROVE, "Keep")
        ));
        let remove = cluster.with_annotation(ANNOTATION_LEGACY_ROTATION, "remove");
        assert!(matches!(
            rotation_binding(&remove, &outside),
            RotationBinding::Remove { .. }
        ));
    }
}
