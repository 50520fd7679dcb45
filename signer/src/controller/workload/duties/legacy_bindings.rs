//! SPEC sections 3 and 7's duty: kubeadm's auto-approve ClusterRoleBindings
//! ([`LEGACY_AUTOAPPROVE_BINDINGS`]) are reported while they exist in the workload cluster and
//! removed unless `--keep-legacy-autoapprove` or the Cluster's
//! `cluster.x-k8s.io/kubelet-legacy-autoapprove: keep` (an opt-out in progress):
//! `kubeadm:node-autoapprove-bootstrap` at once,
//! `kubeadm:node-autoapprove-certificate-rotation` once no Node is outside attestation (or at
//! once under `cluster.x-k8s.io/kubelet-legacy-rotation: remove`), so an opt-in never leaves a
//! node without a way to renew. While it is kept on purpose, it is reported as kept, naming the
//! Nodes that still need it.

use std::sync::Arc;

use attestation::outside_attestation::{
    ANNOTATION_LEGACY_AUTOAPPROVE, LEGACY_AUTOAPPROVE_KEEP, RotationBinding, keeps_legacy_autoapprove, rotation_binding,
};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::runtime::events::EventType;

use super::outside_attestation::{OutsideReport, Reported};
use crate::controller::kubeadm::{LEGACY_AUTOAPPROVE_BINDINGS, LEGACY_ROTATION_BINDING, LegacyBinding};
use crate::controller::workload::worker::Worker;

/// Most Node names an Event or log line names (the metric counts them all).
const NAMED: usize = 10;

/// What the duty remembers of one binding between passes.
#[derive(Default)]
struct BindingState {
    /// Its presence was reported.
    reported: bool,
    /// The Nodes it was last reported kept for.
    kept_for: Option<Vec<String>>,
}

impl Worker {
    /// Runs until the worker stops: every resync, the Nodes outside attestation, then both
    /// bindings.
    pub(in crate::controller::workload) async fn legacy_binding_loop(self: Arc<Self>) {
        let api: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let mut states: [BindingState; LEGACY_AUTOAPPROVE_BINDINGS.len()] = Default::default();
        let mut reported = Reported::default();
        loop {
            // A Cluster paused since the worker started gets no binding removed and no report
            // (the fleet stops this worker at its next pass).
            if self.served_cluster().is_some() {
                let outside = self.outside_attestation(&mut reported);
                for (binding, state) in LEGACY_AUTOAPPROVE_BINDINGS.iter().zip(states.iter_mut()) {
                    self.legacy_binding(&api, binding, &outside, state).await;
                }
            }
            tokio::time::sleep(self.shared.settings.resync).await;
        }
    }

    /// Whether `binding` stays: the flag, then (for the rotation binding) the Nodes outside
    /// attestation. `Err` names the Nodes it is kept for; `Ok` says why it goes.
    fn binding_goes(&self, binding: &LegacyBinding, outside: &OutsideReport) -> Option<Result<String, Vec<String>>> {
        if self.shared.settings.keep_legacy_autoapprove {
            return None;
        }
        let cluster = self.shared.management.clusters.get(&self.key)?;
        if keeps_legacy_autoapprove(&cluster) {
            return None;
        }
        if binding.name != LEGACY_ROTATION_BINDING {
            return Some(Ok("no new node gets an identity without the signer".to_owned()));
        }
        match &outside.nodes {
            Some(nodes) => Some(match rotation_binding(&cluster, nodes) {
                RotationBinding::Remove { why } => Ok(why),
                RotationBinding::Keep { nodes } => Err(nodes),
            }),
            // The Nodes cannot be told yet: as it is, until they can.
            None => match rotation_binding(&cluster, &[]) {
                RotationBinding::Remove { why } if why.contains("annotated") => Some(Ok(why)),
                _ => None,
            },
        }
    }

    async fn legacy_binding(
        &self,
        api: &Api<ClusterRoleBinding>,
        binding: &LegacyBinding,
        outside: &OutsideReport,
        state: &mut BindingState,
    ) {
        let name = binding.name;
        match api.get_opt(name).await {
            Ok(Some(_)) => {
                self.shared.metrics.legacy_autoapprove(&self.key, name, true);
                let goes = self.binding_goes(binding, outside);
                if !state.reported {
                    let kept = match &goes {
                        None if self.shared.settings.keep_legacy_autoapprove => {
                            Some("kept (--keep-legacy-autoapprove)".to_owned())
                        }
                        None if self.keeps_legacy_autoapprove() => Some(format!(
                            "kept (the Cluster is annotated {ANNOTATION_LEGACY_AUTOAPPROVE}: {LEGACY_AUTOAPPROVE_KEEP}: an opt-out in progress)"
                        )),
                        _ => None,
                    };
                    let what = match (&kept, &goes) {
                        (Some(kept), _) => format!("; {kept}"),
                        (None, Some(Ok(_))) => "; removing it".to_owned(),
                        _ => String::new(),
                    };
                    tracing::warn!(
                        binding = name,
                        kept = kept.as_deref(),
                        "the workload cluster {}",
                        binding.hole
                    );
                    // A binding kept on purpose is its own action: Events of one action,
                    // reason and object within 6 minutes are one Event series for the
                    // recorder, whose note stays the first one's, and a binding restored for an
                    // opt-out soon after the signer removed it ("removing it") must not read
                    // as being removed again.
                    self.report(
                        self.cluster_ref.clone(),
                        EventType::Warning,
                        "LegacyAutoapproveBinding",
                        if kept.is_some() { "Keep" } else { "Reconcile" },
                        &format!(
                            "ClusterRoleBinding {name} in the workload cluster {}{what}",
                            binding.hole
                        ),
                    );
                    state.reported = true;
                }
                match goes {
                    Some(Ok(why)) => self.remove_binding(api, name, &why, state).await,
                    Some(Err(nodes)) => self.keep_binding(name, nodes, state),
                    None => self.shared.metrics.legacy_binding_kept(&self.key, name, false),
                }
            }
            Ok(None) => {
                self.shared.metrics.legacy_autoapprove(&self.key, name, false);
                self.shared.metrics.legacy_binding_kept(&self.key, name, false);
                state.reported = false;
                state.kept_for = None;
            }
            Err(e) => tracing::debug!(error = %e, "cannot check {name}"),
        }
    }

    fn keeps_legacy_autoapprove(&self) -> bool {
        self.shared
            .management
            .clusters
            .get(&self.key)
            .is_some_and(|c| keeps_legacy_autoapprove(&c))
    }

    async fn remove_binding(&self, api: &Api<ClusterRoleBinding>, name: &str, why: &str, state: &mut BindingState) {
        match api.delete(name, &Default::default()).await {
            Ok(_) => {
                tracing::info!(binding = name, why, "removed");
                self.shared.metrics.legacy_autoapprove(&self.key, name, false);
                self.shared.metrics.legacy_binding_kept(&self.key, name, false);
                self.cluster_event(
                    EventType::Normal,
                    "LegacyAutoapproveRemoved",
                    &format!("removed ClusterRoleBinding {name} from the workload cluster: {why}"),
                );
                state.reported = false;
                state.kept_for = None;
            }
            Err(e) => tracing::warn!(error = %e, "cannot remove {name}"),
        }
    }

    fn keep_binding(&self, name: &str, nodes: Vec<String>, state: &mut BindingState) {
        self.shared.metrics.legacy_binding_kept(&self.key, name, true);
        if state.kept_for.as_ref() == Some(&nodes) {
            return;
        }
        let named = nodes.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
        let more = nodes.len().saturating_sub(NAMED);
        let named = if more > 0 {
            format!("{named} and {more} more")
        } else {
            named
        };
        tracing::warn!(binding = name, nodes = nodes.len(), named = %named, "kept: Nodes outside attestation renew through it");
        self.cluster_event(
            EventType::Warning,
            "LegacyRotationKept",
            &format!(
                "kept ClusterRoleBinding {name}: {} Node(s) outside attestation still renew through it ({named}); it is removed once every Node is adopted (install kubelet-authenticator on them), or at once with the Cluster annotation {}: {}",
                nodes.len(),
                attestation::outside_attestation::ANNOTATION_LEGACY_ROTATION,
                attestation::outside_attestation::LEGACY_ROTATION_REMOVE
            ),
        );
        state.kept_for = Some(nodes);
    }
}
