//! `node-attestation-signer opt-out-bindings`: what the documented opt-out (SPEC section 7,
//! revision 5) restores in a workload cluster before its nodes roll to stock kubeadm templates:
//! kubeadm's two auto-approve ClusterRoleBindings, which the signer removed at opt-in and never
//! recreates. A node with the stock configuration gets its first certificate through
//! `kubeadm:node-autoapprove-bootstrap` (kube-controller-manager approves a bootstrap token's
//! CSR) and renews through `kubeadm:node-autoapprove-certificate-rotation`; without them a
//! stock node's `kubeadm join` waits for a certificate nobody approves.
//!
//! The objects are exactly those kubeadm v1.32 creates (`cmd/kubeadm/app/phases/bootstraptoken/
//! node/tlsbootstrap.go`, `AutoApproveNodeBootstrapTokens` and
//! `AutoApproveNodeCertificateRotation`; names from `cmd/kubeadm/app/constants/constants.go`), so
//! a later `kubeadm upgrade`, which creates or updates them the same way, finds them as it would
//! have left them. Pure: printed, for `kubectl apply -f -` against the workload cluster; no
//! cluster is asked, as `explain-rbac` prints RBAC.

use anyhow::Result;
use serde_json::{Value, json};

/// kubeadm's two auto-approve ClusterRoleBindings, as one YAML stream on stdout.
pub fn run() -> Result<()> {
    for object in objects() {
        print!("---\n{}", serde_yaml::to_string(&object)?);
    }
    Ok(())
}

/// The two ClusterRoleBindings, as kubeadm v1.32 writes them.
pub fn objects() -> [Value; 2] {
    let binding = |name: &str, role: &str, group: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        })
    };
    [
        // kubeadm's NodeBootstrapTokenAuthGroup: the group its join tokens authenticate in.
        binding(
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers:kubeadm:default-node-token",
        ),
        binding(
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::kubeadm::LEGACY_AUTOAPPROVE_BINDINGS;

    /// The bindings printed are the ones the signer removes, in the same order.
    #[test]
    fn the_printed_bindings_are_the_ones_the_signer_removes() {
        let objects = objects();
        let printed: Vec<&str> = objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or_default())
            .collect();
        let removed: Vec<&str> = LEGACY_AUTOAPPROVE_BINDINGS.iter().map(|b| b.name).collect();
        assert_eq!(printed, removed);
    }
}
