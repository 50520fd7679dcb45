//! SPEC section 7's first duty, before any other: with the signer's own identity, its workload
//! RBAC is put in place with the Cluster API admin kubeconfig ([`workload_access::rbac`]), and
//! the admin client is dropped. Retried with backoff while the apiserver does not answer; a
//! refusal (the kubeconfig may not write RBAC, say, because an operator pointed it at a less
//! privileged user) is reported once, and the worker goes on as its own user: if the RBAC was
//! put there some other way, nothing is lost, and if not, every request says so (403) and the
//! Event said what to do.

use kube::runtime::events::EventType;

use crate::controller::backoff::Backoff;
use crate::controller::metrics::ClusterState;
use crate::controller::workload::worker::Worker;
use crate::controller::workload_access::own_identity::USER;
use crate::controller::workload_access::rbac::{self, Applied, ApplyRbacError};
use crate::locks::lock;

impl Worker {
    /// Applies the workload RBAC when this worker holds an admin client (its own identity);
    /// returns once it is in place, refused, or the file is broken.
    pub(in crate::controller::workload) async fn put_own_rbac_in_place(&self) {
        let Some(admin) = lock(&self.admin).take() else {
            return;
        };
        let objects = match rbac::objects() {
            Ok(objects) => objects,
            Err(e) => {
                tracing::error!(error = %e, "the signer's workload RBAC cannot be applied");
                return;
            }
        };
        let kubeconfig = format!("{}-kubeconfig", self.cluster_ref.name.as_deref().unwrap_or_default());
        let mut backoff = Backoff::default();
        let mut said_unreachable = false;
        loop {
            match rbac::apply(&admin, &objects).await {
                Ok(Applied::All) => {
                    self.shared.metrics.workload_rbac_apply("applied");
                    tracing::info!(
                        user = USER,
                        objects = objects.len(),
                        "workload RBAC in place; the signer acts as its own user from here on"
                    );
                    break;
                }
                Ok(Applied::AllServed { missing }) => {
                    self.shared.metrics.workload_rbac_apply("applied");
                    let text = format!(
                        "the workload apiserver does not serve {missing:?} (Kubernetes before 1.30): the signer's RBAC is in place, but the admission policy that limits its Secret writes to bootstrap tokens is not"
                    );
                    tracing::warn!("{text}");
                    self.cluster_event(EventType::Warning, "WorkloadRbacPartial", &text);
                    break;
                }
                Err(e @ ApplyRbacError::Refused { .. }) => {
                    self.shared.metrics.workload_rbac_apply("refused");
                    let text = format!(
                        "cannot put the signer's RBAC in place with Secret {kubeconfig}: {e}. The signer goes on as user {USER}; unless config/workload was applied in the workload cluster some other way, apply it there (kubectl apply -k config/workload) or give {kubeconfig} an identity that may write RBAC"
                    );
                    tracing::warn!("{text}");
                    self.cluster_event(EventType::Warning, "WorkloadRbacRefused", &text);
                    break;
                }
                Err(e @ ApplyRbacError::Unreachable { .. }) => {
                    self.shared.metrics.workload_rbac_apply("failed");
                    if !said_unreachable {
                        said_unreachable = true;
                        tracing::warn!(error = %e, "cannot put the signer's RBAC in place yet; retrying with backoff");
                    }
                    self.set_state(ClusterState::Unreachable);
                    backoff.wait().await;
                }
            }
        }
        // Its failures said Unreachable; the CSR watch (which says Ready) may have been up all
        // along, and says nothing more unless it fails.
        if said_unreachable && self.csr_watch_up.load(std::sync::atomic::Ordering::Relaxed) {
            self.watch_up();
        }
    }
}
