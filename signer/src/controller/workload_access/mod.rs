//! How the signer talks to a workload cluster (SPEC section 7, no per-cluster setup).
//!
//! Opting a Cluster in is the only step. Two ways, chosen by the Secrets in the Cluster's
//! namespace:
//!
//! - **Its own identity** (the default): `<cluster>-kubeconfig` is what Cluster API writes, an
//!   admin identity. The signer uses it for one thing, when a worker starts (a Cluster newly
//!   served, its Secrets changed, a replica taking it over): to server-side apply its own
//!   workload RBAC ([`rbac`]). Everything else goes as user [`own_identity::USER`] with a client
//!   certificate the signer issues itself from `<cluster>-ca` and renews ahead of expiry
//!   ([`own_identity`]), so every write it makes in the workload cluster is audited under its
//!   own name and bounded by its own role, and a bug in the signer cannot use admin rights.
//! - **An operator's kubeconfig**: when `<cluster>-node-attestation-kubeconfig` (key `value`)
//!   exists, it is used as it is, for everything, and no RBAC is applied: whoever wrote it
//!   chose its identity and its rights (`kubectl apply -k config/workload` binds the signer's
//!   user).

pub mod config_map_data;
pub mod own_identity;
pub mod rbac;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The Secret an operator writes to give the signer a kubeconfig of their own for `cluster`.
pub fn operator_kubeconfig_secret(cluster: &str) -> String {
    format!("{cluster}-node-attestation-kubeconfig")
}

/// How one worker reaches its workload cluster.
pub enum WorkloadAccess {
    /// As [`own_identity::USER`] (`client`); `admin` (the Cluster API kubeconfig) only puts the
    /// RBAC in place first.
    OwnIdentity {
        /// The signer's own client.
        client: Client,
        /// The admin client, for the RBAC apply and nothing else.
        admin: Client,
    },
    /// A client used as it is: the operator's kubeconfig, or the client a worker ran on,
    /// kept through a CA gap.
    Given {
        /// The client.
        client: Client,
    },
}

/// The connection settings and credentials of a kubeconfig read from Secret `secret_name`.
/// Messages name the Secret, never its contents.
pub async fn kubeconfig(secret_name: &str, bytes: &[u8], timeout: std::time::Duration) -> Result<kube::Config, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| format!("Secret {secret_name}: not UTF-8"))?;
    let parsed = Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {secret_name}: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("Secret {secret_name}: {e}"))?;
    config.connect_timeout = Some(timeout);
    Ok(config)
}
