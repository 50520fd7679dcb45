//! The per-workload-cluster worker: all the signer does in one workload cluster, through that
//! cluster's client.
//!
//! - [`worker`]: the [`Worker`] type, what it holds, and the helpers every step uses.
//! - [`watch`]: watching and queueing the cluster's CSRs; [`intake`]: what the watch cache keeps
//!   of them (only the signer's names, slimmed, requests over their limit withheld).
//! - [`csr`]: what happens to one CSR: inputs fetched, the rule engine's decision taken.
//! - [`apply`]: the decision written (claim, approval, certificate, denial, challenge);
//!   [`record`]: each certificate written recorded once, whoever finishes the work.
//! - [`duties`]: the cluster's duties that are not CSR decisions (the signer's own RBAC,
//!   kubeadm's bindings, join tokens, the apiserver's minor, revocation).
//! - [`issued`]: what it knows of the certificates it issued and of the revoked list.
//! - [`nodes`]: the cluster's Nodes by name and provider ID; [`queue`]: its bounded queue;
//!   [`inflight`]: the fleet's slots for CSRs in flight; [`shared`]: what every worker shares.
//!
//! It owns its cluster's watches and writes. It reads the management cluster only through
//! [`crate::controller::management::Management`] (the cache, the claim write, the fresh
//! re-read), and never decides which Clusters are served: the fleet starts and stops workers.
//! Decisions are the rule engine's ([`attestation::decide`]): this room fetches their inputs and
//! applies their results.

pub mod apply;
pub mod csr;
pub mod duties;
pub mod inflight;
pub mod intake;
pub mod issued;
pub mod nodes;
pub mod queue;
pub mod record;
pub mod resumed;
pub mod shared;
pub mod watch;
pub mod worker;

pub use shared::{Settings, Shared};
pub use worker::Worker;

use std::sync::Arc;

use tracing::Instrument;

impl Worker {
    /// Runs until aborted; aborting it ends every task of this worker.
    pub async fn run(self: Arc<Self>) {
        let span = tracing::info_span!("cluster", cluster = %self.key);
        async move {
            // Before anything else: its own rights, with the admin kubeconfig (own identity).
            self.put_own_rbac_in_place().await;
            // Owned by this future: aborting the worker drops the set, which aborts them all.
            let mut tasks = tokio::task::JoinSet::new();
            tasks.spawn(Arc::clone(&self).legacy_binding_loop().in_current_span());
            tasks.spawn(Arc::clone(&self).join_token_loop().in_current_span());
            tasks.spawn(Arc::clone(&self).resync_loop().in_current_span());
            tasks.spawn(Arc::clone(&self).apiserver_version_loop().in_current_span());
            tasks.spawn(Arc::clone(&self).revocation_loop().in_current_span());
            tasks.spawn({
                let worker = Arc::clone(&self);
                async move { worker.nodes.watch(worker.client.clone()).await }.in_current_span()
            });
            tasks.spawn(Arc::clone(&self).dispatch_loop().in_current_span());
            self.watch().await;
            tasks.shutdown().await;
        }
        .instrument(span)
        .await;
    }
}
