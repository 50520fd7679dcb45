//! What kubeadm leaves in a workload cluster that the signer acts on, by name: shared by the
//! duty that removes it and the metrics that report it.

/// A kubeadm ClusterRoleBinding that lets kube-controller-manager hand out kubelet identities
/// around this signer, and what it lets through.
#[derive(Debug, Clone, Copy)]
pub struct LegacyBinding {
    /// The ClusterRoleBinding's name.
    pub name: &'static str,
    /// What it lets through, for the log and the Event.
    pub hole: &'static str,
}

/// kubeadm's auto-approve bindings (SPEC section 3): both are removed and reported.
pub const LEGACY_AUTOAPPROVE_BINDINGS: [LegacyBinding; 2] = [
    LegacyBinding {
        name: "kubeadm:node-autoapprove-bootstrap",
        hole: "lets any bootstrap token holder get any node identity from kube-controller-manager",
    },
    LegacyBinding {
        name: "kubeadm:node-autoapprove-certificate-rotation",
        hole: "lets a node renew through kube-controller-manager without attestation (a stolen node key outlives its Machine's EK binding, and kubelet's own rotation replaces the attested certificate)",
    },
];
