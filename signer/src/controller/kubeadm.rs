//! What kubeadm leaves in a workload cluster that the signer acts on: its auto-approve bindings
//! by name (shared by the duty that removes them and the metrics that report them) and its
//! bootstrap token Secrets as the join-token duty and `explain` read them.

use attestation::join_tokens::TokenSecret;
use k8s_openapi::api::core::v1::Secret;

/// What the signer reads of a bootstrap token Secret: its type, `token-id` and `expiration`
/// (the token's secret half is never read out of it).
pub fn token_secret(secret: &Secret) -> TokenSecret {
    TokenSecret::from_data(secret.type_.as_deref(), |key| {
        secret.data.as_ref()?.get(key).map(|v| v.0.as_slice())
    })
}

/// A kubeadm ClusterRoleBinding that lets kube-controller-manager hand out kubelet identities
/// around this signer, and what it lets through.
#[derive(Debug, Clone, Copy)]
pub struct LegacyBinding {
    /// The ClusterRoleBinding's name.
    pub name: &'static str,
    /// What it lets through, for the log and the Event.
    pub hole: &'static str,
}

/// kubeadm's rotation binding: kept while a Node outside attestation renews through it (SPEC
/// section 7, "No silent expiry").
pub const LEGACY_ROTATION_BINDING: &str = "kubeadm:node-autoapprove-certificate-rotation";

/// kubeadm's auto-approve bindings (SPEC section 3): both are removed and reported.
pub const LEGACY_AUTOAPPROVE_BINDINGS: [LegacyBinding; 2] = [
    LegacyBinding {
        name: "kubeadm:node-autoapprove-bootstrap",
        hole: "lets any bootstrap token holder get any node identity from kube-controller-manager",
    },
    LegacyBinding {
        name: LEGACY_ROTATION_BINDING,
        hole: "lets a node renew through kube-controller-manager without attestation (a stolen node key outlives its Machine's EK binding, and kubelet's own rotation replaces the attested certificate)",
    },
];
