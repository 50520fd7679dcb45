//! `explain`'s Nodes outside attestation (SPEC section 7): for the Cluster
//! (`--pending`), each Node whose Machine or pool instance holds no valid claim for it and the
//! legacy kubelet CSRs left pending, with what becomes of kubeadm's rotation binding; for one
//! node (`--node`), why it is outside and what brings it in.

use std::fmt::Write as _;

use attestation::machine::{ClusterView, Inventory, NodeView};
use attestation::outside_attestation::{LEGACY_KUBELET_SIGNER, RotationBinding, nodes_outside, rotation_binding};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde::Serialize;

/// What to do about a Node outside attestation.
pub const REMEDY: &str = "install kubelet-authenticator on it (the image-builder role, or its drop-in: `kubelet-authenticator kubeconfig --adopt` takes kubelet's kubeconfig over); its first request, made with the identity it holds and carrying its attestation, is an adoption (rule 7)";

/// One Node outside attestation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutsideLine {
    /// The Node's name.
    pub node: String,
    /// Its Machine or MachinePool (`Machine/<name>`), if any.
    pub target: Option<String>,
    /// Why it is outside.
    pub why: String,
}

/// The Cluster's Nodes outside attestation, its pending legacy CSRs, and the rotation binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutsideReport {
    /// The Nodes.
    pub nodes: Vec<OutsideLine>,
    /// Names of the pending CSRs for `kubernetes.io/kube-apiserver-client-kubelet`.
    pub legacy_csrs: Vec<String>,
    /// What the signer does with `kubeadm:node-autoapprove-certificate-rotation`.
    pub rotation_binding: String,
}

/// The report, from what `explain` read.
pub fn report(
    cluster: &ClusterView,
    inventory: &Inventory,
    nodes: &[NodeView],
    csrs: &[CertificateSigningRequest],
) -> OutsideReport {
    let outside = nodes_outside(cluster, inventory, nodes);
    let rotation = match rotation_binding(cluster, &outside) {
        RotationBinding::Remove { why } => {
            format!("removed ({why}), unless the signer runs with --keep-legacy-autoapprove")
        }
        RotationBinding::Keep { nodes } => format!(
            "kept while {} Node(s) of Machines or pool instances outside attestation renew through it",
            nodes.len()
        ),
    };
    let legacy_csrs = csrs
        .iter()
        .filter(|c| c.spec.signer_name == LEGACY_KUBELET_SIGNER)
        .filter(|c| crate::csr_object::stage(c) == crate::csr_object::Stage::Pending)
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    OutsideReport {
        nodes: outside
            .iter()
            .map(|n| OutsideLine {
                node: n.name.clone(),
                target: n.target().map(|t| format!("{}/{}", t.kind_name(), t.name)),
                why: n.describe(),
            })
            .collect(),
        legacy_csrs,
        rotation_binding: rotation,
    }
}

/// The report for people.
pub fn render(report: &OutsideReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Nodes outside attestation: {}", report.nodes.len());
    for n in &report.nodes {
        let _ = writeln!(out, "  {:<24} {}", n.node, n.why);
    }
    if !report.nodes.is_empty() {
        let _ = writeln!(out, "  to bring one in: {REMEDY}");
    }
    let _ = writeln!(
        out,
        "kubeadm:node-autoapprove-certificate-rotation: {}",
        report.rotation_binding
    );
    if !report.legacy_csrs.is_empty() {
        let _ = writeln!(
            out,
            "Legacy kubelet CSRs pending ({LEGACY_KUBELET_SIGNER}, no binding serves them): {}",
            report.legacy_csrs.join(", ")
        );
    }
    out
}

/// For `--node`: why `node` is outside attestation, if it is.
pub fn for_node(report: &OutsideReport, node: &str) -> Option<String> {
    report
        .nodes
        .iter()
        .find(|n| n.node == node)
        .map(|n| format!("{}\nTo bring it under attestation: {REMEDY}.\n", n.why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_of_an_unclaimed_machine_is_listed_with_the_remedy_and_the_binding_kept() {
        let cluster = ClusterView::named("c", "ns", &["tpm"]);
        let machine = attestation::machine::MachineView::from_object(&serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "cp-0", "namespace": "ns", "uid": "u"},
            "spec": {"clusterName": "c", "providerID": "aws:///a/i-1"}
        }))
        .unwrap();
        let inventory = Inventory {
            machines: vec![machine.into()],
            ..Inventory::default()
        };
        let nodes = [NodeView {
            name: "ip-10-0-0-1".into(),
            provider_id: Some("aws:///a/i-1".into()),
        }];
        let report = report(&cluster, &inventory, &nodes, &[]);
        let text = render(&report);
        assert!(text.contains("Nodes outside attestation: 1"), "{text}");
        assert!(text.contains("ip-10-0-0-1"), "{text}");
        assert!(text.contains("kept while 1 Node(s)"), "{text}");
        assert!(for_node(&report, "ip-10-0-0-1").unwrap().contains("kubeconfig --adopt"));
        assert!(for_node(&report, "other").is_none());
        assert_eq!(report.nodes[0].target.as_deref(), Some("Machine/cp-0"));
    }
}
