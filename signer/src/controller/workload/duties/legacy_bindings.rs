//! SPEC section 3's cluster duty: kubeadm's auto-approve ClusterRoleBindings
//! ([`LEGACY_AUTOAPPROVE_BINDINGS`]) are reported while they exist in the workload cluster and
//! removed unless `--keep-legacy-autoapprove`.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::runtime::events::EventType;

use crate::controller::kubeadm::{LEGACY_AUTOAPPROVE_BINDINGS, LegacyBinding};
use crate::controller::workload::worker::Worker;

impl Worker {
    /// SPEC section 3's cluster duty: kubeadm's auto-approve bindings are reported while they
    /// exist and removed unless `--keep-legacy-autoapprove`.
    pub(in crate::controller::workload) async fn legacy_binding_loop(self: Arc<Self>) {
        let api: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let mut reported = [false; LEGACY_AUTOAPPROVE_BINDINGS.len()];
        loop {
            for (binding, reported) in LEGACY_AUTOAPPROVE_BINDINGS.iter().zip(reported.iter_mut()) {
                self.legacy_binding(&api, binding, reported).await;
            }
            tokio::time::sleep(self.shared.settings.resync).await;
        }
    }

    async fn legacy_binding(&self, api: &Api<ClusterRoleBinding>, binding: &LegacyBinding, reported: &mut bool) {
        let name = binding.name;
        match api.get_opt(name).await {
            Ok(Some(_)) => {
                self.shared.metrics.legacy_autoapprove(&self.key, name, true);
                let keep = self.shared.settings.keep_legacy_autoapprove;
                if !*reported {
                    tracing::warn!(binding = name, keep, "the workload cluster {}", binding.hole);
                    self.cluster_event(
                        EventType::Warning,
                        "LegacyAutoapproveBinding",
                        &format!(
                            "ClusterRoleBinding {name} in the workload cluster {}{}",
                            binding.hole,
                            if keep {
                                "; kept (--keep-legacy-autoapprove)"
                            } else {
                                "; removing it"
                            }
                        ),
                    );
                    *reported = true;
                }
                if !keep {
                    match api.delete(name, &Default::default()).await {
                        Ok(_) => {
                            tracing::info!(binding = name, "removed");
                            self.shared.metrics.legacy_autoapprove(&self.key, name, false);
                            self.cluster_event(
                                EventType::Normal,
                                "LegacyAutoapproveRemoved",
                                &format!("removed ClusterRoleBinding {name} from the workload cluster"),
                            );
                            *reported = false;
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot remove {name}"),
                    }
                }
            }
            Ok(None) => {
                self.shared.metrics.legacy_autoapprove(&self.key, name, false);
                *reported = false;
            }
            Err(e) => tracing::debug!(error = %e, "cannot check {name}"),
        }
    }
}
