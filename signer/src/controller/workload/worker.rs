//! The worker of one workload cluster, as a type: what it holds (its client and CA, the CSR
//! watch cache and queue, the Node index, what it remembers of each CSR) and the small helpers
//! every step uses (counting, Events, retries). The steps themselves are beside it:
//! [`super::watch`] (watching and queueing), [`super::csr`] (what happens to one CSR),
//! [`super::apply`] (writing a decision) and [`super::duties`] (the cluster's other duties).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attestation::ca::ClusterCa;
use attestation::decision::{CsrKind, Decision};
use attestation::machine::{ClusterView, TargetRef};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::{Api, Client, ResourceExt};
use time::OffsetDateTime;

use super::nodes::NodeIndex;
use super::queue::{Pushed, WorkQueue};
use super::shared::Shared;
use crate::controller::backoff::Backoff;
use crate::controller::events::{Report, cluster_reference, note};
use crate::controller::metrics::{ClusterState, DecisionLabels};
use crate::controller::workload_access::WorkloadAccess;
use crate::csr_object::{Stage, stage};
use crate::locks::lock;

/// One workload cluster's worker.
pub struct Worker {
    /// `<namespace>/<name>` of the Cluster.
    pub key: String,
    /// The same, shared with the fleet's slot queue.
    pub(super) turn: Arc<str>,
    pub(super) cluster_ref: ObjectReference,
    /// Everything but the RBAC apply goes through it: the signer's own identity, or an
    /// operator's kubeconfig.
    pub(super) client: Client,
    /// The Cluster API admin client, held only until the signer's RBAC is in place
    /// (`duties::own_rbac`); `None` with an operator's kubeconfig.
    pub(super) admin: Mutex<Option<Client>>,
    pub(super) ca: Result<Arc<ClusterCa>, String>,
    pub(super) shared: Arc<Shared>,
    pub(super) queue: WorkQueue,
    pub(super) csrs: Store<CertificateSigningRequest>,
    /// The request bytes its watch cache holds, under `--csr-request-bytes-per-cluster`.
    pub(super) request_budget: Arc<Mutex<super::intake::RequestBudget>>,
    pub(super) nodes: NodeIndex,
    pub(super) writer: Mutex<Option<reflector::store::Writer<CertificateSigningRequest>>>,
    pub(super) first_seen: Mutex<HashMap<String, OffsetDateTime>>,
    pub(super) attempts: Mutex<HashMap<String, u32>>,
    /// UIDs of CSRs this worker finished (signed, denied, failed) whose final state the watch
    /// cache may not show yet: the `Approved` event of our own approval queues the CSR again,
    /// and deciding it from the stale copy would only re-read the Machine and have the
    /// certificate write refused (409). Forgotten once the cache shows it finished, or after
    /// [`FINISHED_MEMORY`], whichever is first.
    pub(super) finished: Mutex<HashMap<String, std::time::Instant>>,
    pub(super) state: Mutex<ClusterState>,
    /// When this cluster's owner was last told the `tpm/v1` challenge key is missing.
    pub(super) key_warned: Mutex<Option<std::time::Instant>>,
    /// A claim was written: the join-token duty looks closely for a while (a claimed Machine's
    /// token goes within seconds of its node joining) instead of once per resync.
    pub(super) claim_written: tokio::sync::Notify,
    /// The CSR watch is up (listed, and not failing since): what the RBAC duty's own retries
    /// go back to once they succeed.
    pub(super) csr_watch_up: std::sync::atomic::AtomicBool,
    /// The workload apiserver's version, once read (`duties::apiserver_version`).
    pub(super) apiserver: Mutex<Option<attestation::kubernetes_minor::ApiserverVersion>>,
    /// The record of issued certificates and the revoked list (`duties::revocation`).
    pub(super) revocation: Mutex<super::issued::RevocationState>,
}

/// How long a CSR this worker finished is left alone while the watch cache catches up. The
/// resync after it looks again, so a lost watch event costs at most this and a resync period.
pub(super) const FINISHED_MEMORY: Duration = Duration::from_secs(60);

/// True when `csr` is ours and still needs this signer.
pub(super) fn needs_us(csr: &CertificateSigningRequest) -> bool {
    match attestation::rules::classify(&csr.spec.signer_name) {
        Some(CsrKind::KubeletClient) => stage(csr) != Stage::Done,
        // The workload cluster's kube-controller-manager signs approved serving CSRs.
        Some(CsrKind::KubeletServing) => stage(csr) == Stage::Pending,
        None => false,
    }
}

impl Worker {
    /// A worker for `cluster`, reaching its apiserver through `access` and signing with `ca`.
    pub fn new(
        cluster: &ClusterView,
        access: WorkloadAccess,
        ca: Result<Arc<ClusterCa>, String>,
        shared: Arc<Shared>,
    ) -> Arc<Self> {
        let (client, admin) = match access {
            WorkloadAccess::OwnIdentity { client, admin } => (client, Some(admin)),
            WorkloadAccess::Given { client } => (client, None),
        };
        let (csrs, writer) = reflector::store();
        let request_bytes = shared.settings.csr_request_bytes;
        let capacity = shared.settings.queue_capacity;
        let key = cluster.key();
        Arc::new(Self {
            turn: Arc::from(key.as_str()),
            key,
            cluster_ref: cluster_reference(cluster),
            client,
            admin: Mutex::new(admin),
            ca,
            shared,
            queue: WorkQueue::new(capacity),
            csrs,
            request_budget: Arc::new(Mutex::new(super::intake::RequestBudget::new(request_bytes))),
            nodes: NodeIndex::default(),
            writer: Mutex::new(Some(writer)),
            first_seen: Mutex::default(),
            attempts: Mutex::default(),
            finished: Mutex::default(),
            state: Mutex::new(ClusterState::Unreachable),
            key_warned: Mutex::default(),
            claim_written: tokio::sync::Notify::new(),
            csr_watch_up: std::sync::atomic::AtomicBool::new(false),
            apiserver: Mutex::default(),
            revocation: Mutex::default(),
        })
    }

    /// The cluster's state, for metrics: a served cluster without a usable CA counts as
    /// `SecretsInvalid`.
    pub fn state(&self) -> ClusterState {
        match (*lock(&self.state), &self.ca) {
            (ClusterState::Ready, Err(_)) => ClusterState::SecretsInvalid,
            (ClusterState::Ready, _) if !self.listed() => ClusterState::Listing,
            (state, _) => state,
        }
    }

    /// Sets the state; true when it changed (and the fleet is told).
    pub(super) fn set_state(&self, state: ClusterState) -> bool {
        let changed = std::mem::replace(&mut *lock(&self.state), state) != state;
        if changed {
            self.shared.states_changed.notify_one();
        }
        changed
    }

    /// Whether its Cluster's Machines are listed (the worker decides nothing before).
    pub(super) fn listed(&self) -> bool {
        self.shared
            .management
            .clusters
            .get(&self.key)
            .is_some_and(|cluster| self.shared.management.listed(&cluster))
    }

    /// Its Cluster as the management cache holds it now, while it is still to be served: opted
    /// in and not paused. `None` when it is gone, opted out or paused since the fleet started
    /// this worker: the fleet stops the worker at its next pass (within a second of the change),
    /// and until then no step starts a decision or a write (SPEC section 7, "Paused Clusters").
    pub(super) fn served_cluster(&self) -> Option<ClusterView> {
        self.shared
            .management
            .clusters
            .get(&self.key)
            .filter(|cluster| cluster.opted_in && !cluster.is_paused())
    }

    /// When the oldest CSR still waiting for this signer was created (none waiting: `None`).
    pub fn oldest_waiting(&self) -> Option<OffsetDateTime> {
        self.csrs
            .state()
            .iter()
            .filter(|csr| needs_us(csr))
            .filter_map(|csr| csr.metadata.creation_timestamp.as_ref())
            .filter_map(|t| OffsetDateTime::from_unix_timestamp_nanos(t.0.as_nanosecond()).ok())
            .min()
    }

    /// Counts a decision that could not be applied (an apiserver error, not a conflict).
    pub(super) fn apply_failed(&self) {
        self.shared.metrics.apply_error(&self.key);
    }

    /// The client it reaches its workload cluster with (kept by its successor through a CA
    /// gap).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// NotAfter of the cluster's CA, when it loaded.
    pub fn ca_not_after(&self) -> Option<time::OffsetDateTime> {
        self.ca.as_ref().ok().map(|ca| ca.not_after())
    }

    /// Stops taking work (the tasks end when [`Worker::run`] is aborted).
    pub fn stop(&self) {
        self.queue.close();
    }

    pub(super) fn enqueue(&self, name: &str) {
        if self.queue.push(name) == Pushed::Dropped {
            self.shared.metrics.queue_dropped(&self.key);
        }
    }

    pub(super) fn retry(&self, csr: &CertificateSigningRequest, why: &str) {
        let uid = csr.uid().unwrap_or_default();
        let failures = {
            let mut attempts = lock(&self.attempts);
            let n = attempts.entry(uid).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let delay = Backoff::delay(failures);
        tracing::debug!(why, delay_ms = delay.as_millis() as u64, "retrying");
        self.queue.push_after(csr.name_any(), delay);
    }

    pub(super) fn mark_finished(&self, csr: &CertificateSigningRequest) {
        if let Some(uid) = csr.uid() {
            lock(&self.finished).insert(uid, std::time::Instant::now());
        }
    }

    pub(super) fn count(&self, csr: &CertificateSigningRequest, decision: &str, reason: &str) {
        self.shared.metrics.decision(DecisionLabels {
            cluster: self.key.clone(),
            signer: csr.spec.signer_name.clone(),
            decision: decision.to_owned(),
            reason: reason.to_owned(),
        });
    }

    pub(super) fn csr_api(&self) -> Api<CertificateSigningRequest> {
        Api::all(self.client.clone())
    }

    pub(super) fn event(&self, decision: &Decision, type_: EventType, reason: &str, text: &str) {
        let regarding = match &decision.target {
            Some(target) => self.target_reference(target),
            None => self.cluster_ref.clone(),
        };
        self.report(regarding, type_, reason, "Decide", text);
    }

    pub(super) fn report(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &'static str,
        text: &str,
    ) {
        self.shared.events.record(Report {
            regarding,
            cluster: self.cluster_ref.clone(),
            type_,
            reason: reason.to_owned(),
            action,
            note: note(text),
        });
    }

    pub(super) fn target_reference(&self, target: &TargetRef) -> ObjectReference {
        let (kind, api_version) = match target.kind {
            attestation::machine::TargetKind::Machine => ("Machine", self.shared.management.machine_api_version()),
            attestation::machine::TargetKind::MachinePool => ("MachinePool", self.shared.management.pool_api_version()),
        };
        ObjectReference {
            api_version: Some(api_version),
            kind: Some(kind.to_owned()),
            name: Some(target.name.clone()),
            namespace: Some(target.namespace.clone()),
            uid: Some(target.uid.clone()),
            ..ObjectReference::default()
        }
    }

    pub(super) fn cluster_event(&self, type_: EventType, reason: &str, text: &str) {
        self.report(self.cluster_ref.clone(), type_, reason, "Reconcile", text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::workload::apply::tests::csr;

    #[test]
    fn only_our_undecided_csrs_are_queued() {
        use attestation::names::{SIGNER_INSECURE, SIGNER_KUBELET_SERVING};
        assert!(needs_us(&csr(SIGNER_INSECURE, &[], false)));
        assert!(
            needs_us(&csr(SIGNER_INSECURE, &["Approved"], false)),
            "approved, never signed"
        );
        assert!(!needs_us(&csr(SIGNER_INSECURE, &["Approved"], true)));
        assert!(!needs_us(&csr(SIGNER_INSECURE, &["Denied"], false)));
        assert!(!needs_us(&csr(SIGNER_INSECURE, &["Approved", "Failed"], false)));
        assert!(needs_us(&csr(SIGNER_KUBELET_SERVING, &[], false)));
        assert!(
            !needs_us(&csr(SIGNER_KUBELET_SERVING, &["Approved"], false)),
            "kcm signs it"
        );
        assert!(!needs_us(&csr(
            "kubernetes.io/kube-apiserver-client-kubelet",
            &[],
            false
        )));
    }
}
