//! SPEC section 7, "Nodes outside attestation": per Cluster, the Nodes whose
//! Machine or pool instance holds no valid claim for them, and the legacy kubelet CSRs left
//! pending, as a metric per Cluster and a Warning Event on the Machine (or MachinePool, or the
//! Cluster for a Node of no Machine). Which Nodes those are is
//! [`attestation::outside_attestation`]'s; the legacy-binding duty asks for the report before
//! it decides about kubeadm's rotation binding.

use std::collections::HashSet;

use attestation::outside_attestation::{LEGACY_KUBELET_SIGNER, OutsideNode, nodes_outside};
use kube::runtime::events::EventType;

use crate::controller::workload::worker::Worker;
use crate::csr_object::{Stage, stage};

/// What one look found.
pub(in crate::controller::workload) struct OutsideReport {
    /// The Nodes outside attestation; `None` when they cannot be told (the Cluster's objects or
    /// its Nodes are not listed): the rotation binding then stays as it is.
    pub nodes: Option<Vec<OutsideNode>>,
}

/// What the duty remembers between looks: whom it has told (a Node, a CSR), so each is reported
/// once while it stays.
#[derive(Default)]
pub(in crate::controller::workload) struct Reported {
    nodes: HashSet<String>,
    csrs: HashSet<String>,
}

impl Worker {
    /// Looks at the Cluster's Nodes and legacy CSRs, reports what is new, sets the gauges.
    pub(in crate::controller::workload) fn outside_attestation(&self, reported: &mut Reported) -> OutsideReport {
        let legacy: HashSet<String> = self
            .csrs
            .state()
            .iter()
            .filter(|csr| csr.spec.signer_name == LEGACY_KUBELET_SIGNER)
            .filter(|csr| stage(csr) == Stage::Pending)
            .filter_map(|csr| csr.metadata.name.clone())
            .collect();
        reported.csrs.retain(|name| legacy.contains(name));
        for name in &legacy {
            if reported.csrs.insert(name.clone()) {
                self.cluster_event(
                    EventType::Warning,
                    "LegacyKubeletCsrPending",
                    &format!("CSR {name} asks kube-controller-manager for a kubelet identity ({LEGACY_KUBELET_SIGNER}): kubeadm's TLS bootstrap or rotation, which no removed binding serves any more; the node needs kubelet-authenticator"),
                );
            }
        }
        let management = &self.shared.management;
        let nodes = management
            .clusters
            .get(&self.key)
            .and_then(|cluster| Some((management.inventory(&cluster)?, cluster)))
            .and_then(|(inventory, cluster)| Some(nodes_outside(&cluster, &inventory, &self.nodes.all().ok()?)));
        if let Some(outside) = &nodes {
            let names: HashSet<&str> = outside.iter().map(|n| n.name.as_str()).collect();
            reported.nodes.retain(|name| names.contains(name.as_str()));
            for node in outside {
                if reported.nodes.insert(node.name.clone()) {
                    tracing::warn!(node = %node.name, "{}", node.describe());
                    let text = format!(
                        "{}. It renews through kubeadm's rotation binding, kept while it does: install kubelet-authenticator on it to bring it under attestation (it is adopted at its first request)",
                        node.describe()
                    );
                    match node.target() {
                        Some(target) => self.report(
                            self.target_reference(target),
                            EventType::Warning,
                            "NodeOutsideAttestation",
                            "Reconcile",
                            &text,
                        ),
                        None => self.cluster_event(EventType::Warning, "NodeOutsideAttestation", &text),
                    }
                }
            }
        }
        self.shared.metrics.outside_attestation(
            &self.key,
            nodes.as_ref().map_or(reported.nodes.len(), Vec::len),
            legacy.len(),
        );
        OutsideReport { nodes }
    }
}
