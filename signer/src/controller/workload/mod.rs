//! One workload cluster: a watch of its CSRs, a bounded queue, and the fetch -> decide -> apply
//! loop for each CSR.
//!
//! The order of writes for a client CSR is the SPEC's: the claim (with the resourceVersion the
//! decision was made on), `/approval`, a fresh re-read of the claim, then `/status`. A conflict
//! at the claim means another CSR got there first: the CSR is decided again on fresh state,
//! which denies it. A claim lost between approval and signing marks the CSR `Failed`. So of two
//! racing CSRs for one Machine, at most one is ever signed, whatever the interleaving and
//! however many replicas or restarts.

pub mod inflight;
pub mod nodes;
pub mod queue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attestation::attestor::Verifiers;
use attestation::ca::{ClusterCa, Validity};
use attestation::claim::ClaimState;
use attestation::decision::{CsrKind, Decision, DenyReason, Issuance, Outcome};
use attestation::machine::{ClusterView, TargetRef};
use attestation::names::{GROUP_NODES, NODE_USER_PREFIX};
use attestation::{Clock, CsrObject, Inputs};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tracing::Instrument;

use self::inflight::{Answer, InFlight};
use self::nodes::NodeIndex;
use self::queue::{Pushed, WorkQueue};
use crate::controller::events::{EventSink, Report};
use crate::controller::management::{ApplyError, Backoff, Management};
use crate::controller::metrics::{ClusterState, DecisionLabels, Metrics};
use crate::csr_object::{Stage, csr_object, stage};

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

/// The controller's tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Longest client certificate lifetime.
    pub client_cert_duration: time::Duration,
    /// How long transient gaps are retried before `Expired`.
    pub csr_max_age: time::Duration,
    /// Leave kubeadm's auto-approve binding in place (still reported).
    pub keep_legacy_autoapprove: bool,
    /// How often every undecided CSR is looked at again, the legacy binding checked, and the
    /// Secrets of a Cluster that could not be served re-read.
    pub resync: Duration,
    /// How often a served Cluster's Secrets are read again (rotation takes effect within it).
    pub secret_resync: Duration,
    /// Bound of each cluster's queue.
    pub queue_capacity: usize,
    /// Most CSRs of one cluster in flight at once (the fleet's adaptive limit applies on top).
    pub concurrency: usize,
    /// Timeout of each workload-cluster request.
    pub request_timeout: Duration,
}

/// What every worker shares.
pub struct Shared {
    /// The management cluster.
    pub management: Arc<Management>,
    /// Metrics.
    pub metrics: Metrics,
    /// Events in the management cluster written at once (cluster duties of the fleet).
    pub recorder: Recorder,
    /// Events of decisions and cluster duties: queued, rate-limited, folded under load.
    pub events: EventSink,
    /// The fleet's slots for CSRs in flight, adapted to how the apiservers answer.
    pub in_flight: Arc<InFlight>,
    /// Attestation verifiers.
    pub verifiers: Verifiers,
    /// Loads the `tpm/v1` challenge key the verifiers derive under, when a TPM CSR needs it.
    pub challenge_key: Arc<crate::controller::challenge_key::ChallengeKeyLoader>,
    /// Google's keys and STS's answers, fetched when a cloud verifier asks.
    pub cloud: Arc<crate::cloud::Cloud>,
    /// Decisions (the CPU-bound part) across all clusters, as many at once as cores.
    pub crypto: Semaphore,
    /// Tunables.
    pub settings: Settings,
    /// A worker's state changed: the fleet reports the cluster gauges again at once, not at its
    /// next pass (up to `--resync-period` later, when a gained Cluster would show `Unreachable`
    /// for 30 s after its CSRs are watched).
    pub states_changed: tokio::sync::Notify,
}

/// One workload cluster's worker.
pub struct Worker {
    /// `<namespace>/<name>` of the Cluster.
    pub key: String,
    /// The same, shared with the fleet's slot queue.
    turn: Arc<str>,
    cluster_ref: ObjectReference,
    client: Client,
    ca: Result<Arc<ClusterCa>, String>,
    shared: Arc<Shared>,
    queue: WorkQueue,
    csrs: Store<CertificateSigningRequest>,
    nodes: NodeIndex,
    writer: Mutex<Option<reflector::store::Writer<CertificateSigningRequest>>>,
    first_seen: Mutex<HashMap<String, OffsetDateTime>>,
    attempts: Mutex<HashMap<String, u32>>,
    /// UIDs of CSRs this worker finished (signed, denied, failed) whose final state the watch
    /// cache may not show yet: the `Approved` event of our own approval queues the CSR again,
    /// and deciding it from the stale copy would only re-read the Machine and have the
    /// certificate write refused (409). Forgotten once the cache shows it finished, or after
    /// [`FINISHED_MEMORY`], whichever is first.
    finished: Mutex<HashMap<String, std::time::Instant>>,
    state: Mutex<ClusterState>,
    /// When this cluster's owner was last told the `tpm/v1` challenge key is missing.
    key_warned: Mutex<Option<std::time::Instant>>,
}

/// How long a CSR this worker finished is left alone while the watch cache catches up. The
/// resync after it looks again, so a lost watch event costs at most this and a resync period.
const FINISHED_MEMORY: Duration = Duration::from_secs(60);

/// How soon a CSR of a Cluster whose Machines are still being listed is looked at again.
const UNLISTED_RETRY: Duration = Duration::from_millis(250);

/// Least time between two `TpmChallengeKeyUnavailable` Events on one Cluster.
const KEY_WARNING_INTERVAL: Duration = Duration::from_secs(300);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The workload cluster's CSRs, from the watch cache.
struct StoreCsrs<'a>(&'a Store<CertificateSigningRequest>);

impl attestation::CsrDirectory for StoreCsrs<'_> {
    fn csr(&self, name: &str) -> Option<CsrObject> {
        self.0.get(&ObjectRef::new(name)).map(|c| csr_object(&c))
    }

    fn pending_with(&self, annotation: &str) -> Vec<CsrObject> {
        self.0
            .state()
            .iter()
            .filter(|c| c.annotations().contains_key(annotation) && stage(c) != Stage::Done)
            .map(|c| csr_object(c))
            .collect()
    }
}

/// True when `csr` is ours and still needs this signer.
fn needs_us(csr: &CertificateSigningRequest) -> bool {
    match attestation::rules::classify(&csr.spec.signer_name) {
        Some(CsrKind::KubeletClient) => stage(csr) != Stage::Done,
        // The workload cluster's kube-controller-manager signs approved serving CSRs.
        Some(CsrKind::KubeletServing) => stage(csr) == Stage::Pending,
        None => false,
    }
}

/// Kubernetes caps an Event note at 1 KiB.
fn note(text: &str) -> String {
    attestation::identity::truncate(text, 1000)
}

/// Records an Event on `reference`; a failure is logged, never fatal (Events are a report, the
/// CSR conditions are the record).
pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    text: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note(text)),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, reason, "cannot record an Event");
    }
}

fn condition(type_: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    CertificateSigningRequestCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

impl Worker {
    /// A worker for `cluster`, talking to its apiserver through `client` and signing with `ca`.
    pub fn new(
        cluster: &ClusterView,
        client: Client,
        ca: Result<Arc<ClusterCa>, String>,
        shared: Arc<Shared>,
    ) -> Arc<Self> {
        let (csrs, writer) = reflector::store();
        let capacity = shared.settings.queue_capacity;
        let key = format!("{}/{}", cluster.namespace, cluster.name);
        Arc::new(Self {
            turn: Arc::from(key.as_str()),
            key,
            cluster_ref: cluster_reference(cluster),
            client,
            ca,
            shared,
            queue: WorkQueue::new(capacity),
            csrs,
            nodes: NodeIndex::default(),
            writer: Mutex::new(Some(writer)),
            first_seen: Mutex::default(),
            attempts: Mutex::default(),
            finished: Mutex::default(),
            state: Mutex::new(ClusterState::Unreachable),
            key_warned: Mutex::default(),
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
    fn set_state(&self, state: ClusterState) -> bool {
        let changed = std::mem::replace(&mut *lock(&self.state), state) != state;
        if changed {
            self.shared.states_changed.notify_one();
        }
        changed
    }

    /// Whether its Cluster's Machines are listed (the worker decides nothing before).
    fn listed(&self) -> bool {
        self.shared
            .management
            .clusters
            .get(&self.key)
            .is_some_and(|cluster| self.shared.management.listed(&cluster))
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
    fn apply_failed(&self) {
        self.shared.metrics.apply_error(&self.key);
    }

    /// NotAfter of the cluster's CA, when it loaded.
    pub fn ca_not_after(&self) -> Option<time::OffsetDateTime> {
        self.ca.as_ref().ok().map(|ca| ca.not_after())
    }

    /// Stops taking work (the tasks end when [`Worker::run`] is aborted).
    pub fn stop(&self) {
        self.queue.close();
    }

    /// Runs until aborted; aborting it ends every task of this worker.
    pub async fn run(self: Arc<Self>) {
        let span = tracing::info_span!("cluster", cluster = %self.key);
        async move {
            // Owned by this future: aborting the worker drops the set, which aborts them all.
            let mut tasks = tokio::task::JoinSet::new();
            tasks.spawn(Arc::clone(&self).legacy_binding_loop().in_current_span());
            tasks.spawn(Arc::clone(&self).resync_loop().in_current_span());
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

    fn enqueue(&self, name: &str) {
        if self.queue.push(name) == Pushed::Dropped {
            self.shared.metrics.queue_dropped(&self.key);
        }
    }

    async fn watch(&self) {
        let Some(writer) = lock(&self.writer).take() else {
            return;
        };
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default())
            .modify(slim)
            .reflect(writer)
            .boxed();
        let mut backoff = Backoff::default();
        // A list's objects reach the store only at its end (the reflector swaps the whole list
        // in at InitDone): names queued earlier were taken while the store did not hold them
        // yet, and so left for the next resync (30 s after every restart or hand-over).
        let mut listed: Vec<String> = Vec::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(csr)) => {
                    if needs_us(&csr) {
                        self.enqueue(&csr.name_any());
                    }
                }
                Ok(watcher::Event::InitApply(csr)) => {
                    if needs_us(&csr) {
                        listed.push(csr.name_any());
                    }
                }
                Ok(watcher::Event::Delete(csr)) => {
                    if let Some(uid) = csr.uid() {
                        lock(&self.first_seen).remove(&uid);
                        lock(&self.attempts).remove(&uid);
                        lock(&self.finished).remove(&uid);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    for name in listed.drain(..) {
                        self.enqueue(&name);
                    }
                    if self.set_state(ClusterState::Ready) {
                        tracing::info!("watching CSRs of the workload cluster");
                        self.nodes.retry_now();
                    }
                    backoff.reset();
                }
                Ok(watcher::Event::Init) => listed.clear(),
                Err(e) => {
                    if self.set_state(ClusterState::Unreachable) {
                        tracing::warn!(error = %e, "workload apiserver unreachable; retrying with backoff");
                    }
                    backoff.wait().await;
                }
            }
        }
    }

    async fn resync_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.shared.settings.resync).await;
            let pending: Vec<_> = self.csrs.state().into_iter().filter(|c| needs_us(c)).collect();
            let live: std::collections::HashSet<String> = pending.iter().filter_map(|c| c.uid()).collect();
            lock(&self.first_seen).retain(|uid, _| live.contains(uid));
            lock(&self.attempts).retain(|uid, _| live.contains(uid));
            lock(&self.finished).retain(|uid, at| live.contains(uid) && at.elapsed() < FINISHED_MEMORY);
            for csr in pending {
                self.enqueue(&csr.name_any());
            }
        }
    }

    /// Takes CSR names from the queue and works on each in its own task, once this cluster
    /// is under `--concurrency-per-cluster` and the fleet has a slot. An idle cluster costs
    /// this one task; a busy one waits for at most one slot at a time, so the fleet's slots go
    /// round the busy clusters whatever their queue lengths.
    async fn dispatch_loop(self: Arc<Self>) {
        let per_cluster = Arc::new(Semaphore::new(self.shared.settings.concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        while let Some(name) = self.queue.pop().await {
            let Ok(own) = Arc::clone(&per_cluster).acquire_owned().await else {
                break;
            };
            let mut slot = self.shared.in_flight.acquire(&self.turn).await;
            let worker = Arc::clone(&self);
            running.spawn(
                async move {
                    let span = tracing::info_span!("csr", csr = %name, machine = tracing::field::Empty);
                    let answer = worker.process(&name).instrument(span).await;
                    slot.answer(answer);
                    drop(slot);
                    drop(own);
                    worker.queue.done(&name);
                }
                .in_current_span(),
            );
            while running.try_join_next().is_some() {}
        }
    }

    fn retry(&self, csr: &CertificateSigningRequest, why: &str) {
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

    /// The rule engine's decision, in turn with the other CPU-bound decisions.
    async fn decide(
        &self,
        csr: &attestation::CsrObject,
        cluster: &ClusterView,
        inventory: &attestation::machine::Inventory,
        clock: Clock,
    ) -> Option<attestation::Decision> {
        let _turn = self.shared.crypto.acquire().await;
        let inputs = Inputs {
            csr,
            cluster,
            inventory,
            nodes: &self.nodes,
            csrs: &StoreCsrs(&self.csrs),
            verifiers: &self.shared.verifiers,
            clock,
        };
        attestation::decide(&inputs).ok()
    }

    /// Decides `name` and applies the decision; says how the apiservers answered.
    async fn process(&self, name: &str) -> Answer {
        let Some(csr) = self.csrs.get(&ObjectRef::new(name)) else {
            return Answer::Idle;
        };
        if !needs_us(&csr) {
            return Answer::Idle;
        }
        if csr
            .uid()
            .and_then(|uid| lock(&self.finished).get(&uid).copied())
            .is_some_and(|at| at.elapsed() < FINISHED_MEMORY)
        {
            tracing::debug!("finished by this worker; the watch cache has not caught up yet");
            return Answer::Idle;
        }
        let Some(cluster) = self.shared.management.clusters.get(&self.key).filter(|c| c.opted_in) else {
            return Answer::Idle;
        };
        // A Cluster just gained is decided only once its Machines are listed: an unlisted
        // Machine would be denied MachineNotFound, which is final.
        let Some(inventory) = self.shared.management.inventory(&cluster) else {
            tracing::debug!("the Cluster's Machines are not listed yet");
            self.queue.push_after(name.to_owned(), UNLISTED_RETRY);
            return Answer::Idle;
        };
        if csr.spec.signer_name == attestation::names::SIGNER_TPM
            && let Err(failure) = self.shared.challenge_key.ensure().await
        {
            // The verifier holds the CSR (pending) until the key is there; the Cluster's owner
            // hears why, once per KEY_WARNING_INTERVAL.
            let due = {
                let mut warned = lock(&self.key_warned);
                let due = warned.is_none_or(|at| at.elapsed() >= KEY_WARNING_INTERVAL);
                if due {
                    *warned = Some(std::time::Instant::now());
                }
                due
            };
            if due {
                self.cluster_event(EventType::Warning, "TpmChallengeKeyUnavailable", &failure.message);
            }
        }
        let now = OffsetDateTime::now_utc();
        let object = csr_object(&csr);
        let first_seen = *lock(&self.first_seen).entry(object.uid.clone()).or_insert(now);
        let clock = Clock {
            now,
            first_seen,
            max_age: self.shared.settings.csr_max_age,
        };
        let Some(mut decision) = self.decide(&object, &cluster, &inventory, clock).await else {
            return Answer::Idle;
        };
        if !decision.cloud_calls.is_empty() {
            // A cloud verifier needs Google's keys or STS's answer: ask, then decide once more
            // (a second miss waits for the retry, like any transient gap).
            self.shared.cloud.make(&decision.cloud_calls).await;
            let Some(again) = self.decide(&object, &cluster, &inventory, clock).await else {
                return Answer::Idle;
            };
            decision = again;
        }
        if let Some(target) = &decision.target {
            tracing::Span::current().record("machine", tracing::field::display(&target.name));
        }
        let approved_already = stage(&csr) == Stage::Approved;
        // A decision applied without a request says nothing about the apiservers.
        let mut asked = true;
        let result = match &decision.outcome {
            Outcome::Retry { message } if !decision.annotations.is_empty() => {
                self.challenge(&csr, &decision, message).await
            }
            Outcome::Retry { message } => {
                self.count(&csr, "Retry", "Pending");
                self.retry(&csr, message);
                asked = false;
                Ok(())
            }
            Outcome::Denied { reason, message } => self.refuse(&csr, &decision, reason.as_str(), message).await,
            Outcome::Approved { .. } if decision.issuance.is_some() && self.ca.is_err() => {
                // No claim, no approval: nothing is written until the CA can sign.
                let why = self.ca.as_ref().err().cloned().unwrap_or_default();
                if now - first_seen > self.shared.settings.csr_max_age {
                    let message = format!("still pending after --csr-max-age: {why}");
                    self.refuse(&csr, &decision, DenyReason::Expired.as_str(), &message)
                        .await
                } else {
                    self.count(&csr, "Retry", "Pending");
                    self.retry(&csr, &why);
                    asked = false;
                    Ok(())
                }
            }
            Outcome::Approved { reason, message } => {
                self.approve(&csr, &object, &decision, reason, message, approved_already)
                    .await
            }
            _ => {
                asked = false;
                Ok(())
            }
        };
        match result {
            Ok(()) if asked => Answer::Answered,
            Ok(()) => Answer::Idle,
            Err(ApplyError::Conflict(why)) => {
                tracing::debug!(%why, "conflict; deciding again on fresh state");
                self.queue.push_after(name.to_owned(), Duration::from_millis(100));
                Answer::Answered
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the decision; retrying");
                self.apply_failed();
                self.retry(&csr, &e.to_string());
                if e.is_overload() {
                    Answer::Overloaded
                } else {
                    Answer::Answered
                }
            }
        }
    }

    fn mark_finished(&self, csr: &CertificateSigningRequest) {
        if let Some(uid) = csr.uid() {
            lock(&self.finished).insert(uid, std::time::Instant::now());
        }
    }

    fn count(&self, csr: &CertificateSigningRequest, decision: &str, reason: &str) {
        self.shared.metrics.decision(DecisionLabels {
            cluster: self.key.clone(),
            signer: csr.spec.signer_name.clone(),
            decision: decision.to_owned(),
            reason: reason.to_owned(),
        });
    }

    fn csr_api(&self) -> Api<CertificateSigningRequest> {
        Api::all(self.client.clone())
    }

    /// Refuses `csr`: `Denied` through `/approval` (with the decision's CSR annotations), or,
    /// when it is already approved, `Failed` through `/status` (the API refuses `Denied` on an
    /// approved CSR). Either way it is never signed.
    async fn refuse(
        &self,
        csr: &CertificateSigningRequest,
        decision: &Decision,
        reason: &str,
        message: &str,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let mut current = csr.clone();
        let approved = stage(csr) == Stage::Approved;
        if !approved && !decision.annotations.is_empty() {
            let patch = serde_json::json!({"metadata": {"annotations": decision.annotations}});
            current = self
                .csr_api()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(ApplyError::from_kube)?;
        }
        let (condition_type, event_reason, what) = if approved {
            ("Failed", "CSRFailed", "was approved but is not signed")
        } else {
            ("Denied", "CSRDenied", "denied")
        };
        push_condition(&mut current, condition(condition_type, reason, message));
        let written = if approved {
            self.csr_api()
                .replace_status(&name, &PostParams::default(), &current)
                .await
        } else {
            self.csr_api()
                .replace_subresource("approval", &name, &PostParams::default(), &current)
                .await
        };
        written.map_err(ApplyError::from_kube)?;
        tracing::info!(reason, message, "{what}");
        self.mark_finished(csr);
        self.count(csr, condition_type, reason);
        let text = format!("CSR {name} {what} ({reason}): {message}");
        self.event(decision, EventType::Warning, event_reason, &text);
        Ok(())
    }

    async fn approve(
        &self,
        csr: &CertificateSigningRequest,
        object: &CsrObject,
        decision: &Decision,
        reason: &str,
        message: &str,
        approved_already: bool,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let mut written = None;
        if let Some(claim) = &decision.claim {
            written = Some(self.shared.management.write_claim(claim).await?);
            // Said at info by the one line of a signed join ("approved and signed", in this
            // span, naming the Machine); a claim whose CSR is not signed logs why it was not.
            tracing::debug!(node = %claim.record.node_name, "claimed {}", claim.target.name);
        }
        let mut current = csr.clone();
        if !approved_already {
            push_condition(&mut current, condition("Approved", reason, message));
            // The CSR as written is ours with a new resourceVersion (the apiserver keeps the
            // Approved condition as sent; its managed fields stay when an update sends none),
            // so only that version is read from the answer.
            let version = self.put_csr("approval", &name, &current).await?.ok_or_else(|| {
                ApplyError::Transient("the apiserver's answer to the approval carries no resourceVersion".into())
            })?;
            current.metadata.resource_version = Some(version);
            self.count(csr, "Approved", reason);
        }
        let Some(issuance) = &decision.issuance else {
            // Serving: the workload cluster's kube-controller-manager signs.
            tracing::info!(reason, "approved");
            self.event(
                decision,
                EventType::Normal,
                "CSRApproved",
                &format!("CSR {name} approved: {message}"),
            );
            return Ok(());
        };
        let Some(target) = &decision.target else {
            return Err(ApplyError::Transient("an approved client CSR without a Machine".into()));
        };
        let claimed_now = written.is_some();
        if let Err(why) = self.recheck_claim(target, object, issuance, written).await? {
            return self.refuse(&current, decision, "MachineAlreadyClaimed", &why).await;
        }
        let validity = Validity {
            now: OffsetDateTime::now_utc(),
            requested_seconds: object.expiration_seconds,
            max: self.shared.settings.client_cert_duration,
        };
        let ca = self.ca.as_ref().map_err(|why| ApplyError::Transient(why.clone()))?;
        let certificate = match ca.issue(&issuance.csr, &issuance.provider_id, validity) {
            Ok(c) => c,
            Err(e) => return Err(ApplyError::Transient(format!("cannot sign with the cluster CA: {e}"))),
        };
        current.status.get_or_insert_default().certificate =
            Some(k8s_openapi::ByteString(certificate.pem().into_bytes()));
        self.put_csr("status", &name, &current).await?;
        if let Some(created) = object.created {
            self.shared
                .metrics
                .issued_after((OffsetDateTime::now_utc() - created).as_seconds_f64());
        }
        // A bootstrap-token requester joins; the node itself renews (rule 7).
        let kind = if object.username.starts_with(attestation::names::BOOTSTRAP_USER_PREFIX) {
            "join"
        } else {
            "renewal"
        };
        self.shared.metrics.issued(&self.key, kind);
        tracing::info!(
            reason,
            claimed_now,
            not_after = %certificate.not_after,
            "approved and signed"
        );
        self.mark_finished(csr);
        if let Some(earlier) = &decision.supersedes {
            self.supersede(earlier, &name, decision).await;
        }
        self.event(
            decision,
            EventType::Normal,
            "CertificateIssued",
            &format!(
                "CSR {name} approved and signed until {}: {message}",
                certificate.not_after
            ),
        );
        Ok(())
    }

    /// Replaces `csr`'s `subresource` (`approval`, `status`) and returns its new
    /// resourceVersion (`None` when the answer carries none: the write was made all the same).
    /// The answer (the whole CSR again) is not parsed beyond that version: nothing else of it
    /// is read, and parsing it whole was two of the five CSR decodes of every join.
    async fn put_csr(
        &self,
        subresource: &str,
        name: &str,
        csr: &CertificateSigningRequest,
    ) -> Result<Option<String>, ApplyError> {
        let body = serde_json::to_vec(csr).map_err(|e| ApplyError::Transient(format!("cannot encode the CSR: {e}")))?;
        let mut request = kube::core::Request::new(self.csr_api().resource_url())
            .replace_subresource(subresource, name, &PostParams::default(), body)
            .map_err(|e| ApplyError::Transient(format!("cannot build the {subresource} update: {e}")))?;
        request.extensions_mut().insert("replace_subresource");
        let answer = self.client.request_text(request).await.map_err(ApplyError::from_kube)?;
        Ok(written_version(&answer))
    }

    /// Writes a verifier's challenge on the CSR (with the resourceVersion it was decided on, so
    /// two replicas or workers never write two) and looks again when it may have expired.
    async fn challenge(
        &self,
        csr: &CertificateSigningRequest,
        decision: &Decision,
        message: &str,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": csr.resource_version(),
            "annotations": decision.annotations,
        }});
        self.csr_api()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(ApplyError::from_kube)?;
        tracing::info!(message, "challenged");
        self.count(csr, "Challenged", "Pending");
        self.event(
            decision,
            EventType::Normal,
            "CSRChallenged",
            &format!("CSR {name} challenged: {message}"),
        );
        self.retry(csr, message);
        Ok(())
    }

    /// Denies the CSR an approved one replaced (TPM CSR #1 once CSR #2 is signed), unless it
    /// is already finished; it is never signed.
    async fn supersede(&self, earlier: &attestation::CsrRef, by: &str, decision: &Decision) {
        let Some(first) = self.csrs.get(&ObjectRef::new(&earlier.name)) else {
            return;
        };
        if first.uid().as_deref() != Some(earlier.uid.as_str()) || stage(&first) != Stage::Pending {
            return;
        }
        let quiet = Decision {
            annotations: Default::default(),
            ..decision.clone()
        };
        let message = format!("its challenge was answered by CSR {by}, which was signed instead");
        if let Err(e) = self
            .refuse(&first, &quiet, DenyReason::Superseded.as_str(), &message)
            .await
        {
            // It stays pending and ends ChallengeFailed when its challenge expires: never signed.
            tracing::warn!(csr = %earlier.name, error = %e, "could not mark the superseded CSR");
        }
    }

    /// The claim, read fresh, must still be this identity's: held by this CSR, or (a renewal by
    /// the node itself) naming this node. `Ok(Err(why))` when it is not. `written`: the claim
    /// this pass wrote, as the PATCH returned it (the API server's state after the write, as
    /// fresh as a GET would be); otherwise it is read.
    async fn recheck_claim(
        &self,
        target: &TargetRef,
        csr: &CsrObject,
        issuance: &Issuance,
        written: Option<ClaimState>,
    ) -> Result<Result<(), String>, ApplyError> {
        let state = match written {
            Some(state) => state,
            None => {
                self.shared
                    .management
                    .fresh_claim(target, issuance.provider_id.as_str())
                    .await?
            }
        };
        let node = issuance
            .csr
            .common_names()
            .find_map(|a| a.value.as_deref())
            .and_then(|cn| cn.strip_prefix(NODE_USER_PREFIX))
            .unwrap_or_default();
        let renewal =
            csr.username == format!("{NODE_USER_PREFIX}{node}") && csr.groups.iter().any(|g| g == GROUP_NODES);
        Ok(match state {
            ClaimState::Valid(claim) if claim.node_name == node && (claim.csr_uid == csr.uid || renewal) => Ok(()),
            ClaimState::Valid(claim) => Err(format!(
                "re-check before signing: {} is now claimed by node {} (CSR {})",
                target.name, claim.node_name, claim.csr_uid
            )),
            other => Err(format!(
                "re-check before signing: {} holds no claim for this CSR ({other:?})",
                target.name
            )),
        })
    }

    fn event(&self, decision: &Decision, type_: EventType, reason: &str, text: &str) {
        let regarding = match &decision.target {
            Some(target) => self.target_reference(target),
            None => self.cluster_ref.clone(),
        };
        self.report(regarding, type_, reason, "Decide", text);
    }

    fn report(&self, regarding: ObjectReference, type_: EventType, reason: &str, action: &'static str, text: &str) {
        self.shared.events.record(Report {
            regarding,
            cluster: self.cluster_ref.clone(),
            type_,
            reason: reason.to_owned(),
            action,
            note: note(text),
        });
    }

    fn target_reference(&self, target: &TargetRef) -> ObjectReference {
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

    /// SPEC section 3's cluster duty: kubeadm's auto-approve bindings are reported while they
    /// exist and removed unless `--keep-legacy-autoapprove`.
    async fn legacy_binding_loop(self: Arc<Self>) {
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

    fn cluster_event(&self, type_: EventType, reason: &str, text: &str) {
        self.report(self.cluster_ref.clone(), type_, reason, "Reconcile", text);
    }
}

/// What the watch cache keeps of a CSR. A decided CSR is only ever looked at for its stage,
/// names and annotations (a TPM CSR #1 that is finished fails phase 2 before its request is
/// read), so its request is dropped: 5,000 junk CSRs denied in a flood then cost their
/// metadata, not their payloads, until kube-controller-manager's cleaner deletes them. An issued
/// certificate becomes [`ISSUED`]: a certificate is what makes an issued CSR finished
/// ([`stage`]), and without one the CSR would look approved and unsigned and be signed again
/// (refused by the apiserver, forever); nothing reads the certificate itself from the cache.
fn slim(csr: &mut CertificateSigningRequest) {
    csr.managed_fields_mut().clear();
    if stage(csr) == Stage::Done {
        csr.spec.request = k8s_openapi::ByteString(Vec::new());
        if let Some(certificate) = csr.status.as_mut().and_then(|s| s.certificate.as_mut()) {
            *certificate = k8s_openapi::ByteString(ISSUED.to_vec());
        }
    }
}

/// `metadata.resourceVersion` of a written object's JSON; the rest is skipped by the parser.
fn written_version(answer: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Written {
        metadata: WrittenMeta,
    }
    #[derive(serde::Deserialize)]
    struct WrittenMeta {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    serde_json::from_str::<Written>(answer)
        .ok()?
        .metadata
        .resource_version
        .filter(|v| !v.is_empty())
}

/// What the watch cache keeps of an issued certificate (about 1 KiB of PEM otherwise).
const ISSUED: &[u8] = b"issued";

fn push_condition(csr: &mut CertificateSigningRequest, condition: CertificateSigningRequestCondition) {
    csr.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(condition);
}

/// An Event reference to a Cluster.
pub fn cluster_reference(cluster: &ClusterView) -> ObjectReference {
    ObjectReference {
        api_version: Some("cluster.x-k8s.io/v1beta2".to_owned()),
        kind: Some("Cluster".to_owned()),
        name: Some(cluster.name.clone()),
        namespace: Some(cluster.namespace.clone()),
        uid: Some(cluster.uid.clone()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(signer: &str, conditions: &[&str], certificate: bool) -> CertificateSigningRequest {
        let mut csr = CertificateSigningRequest::default();
        csr.spec.signer_name = signer.to_owned();
        for c in conditions {
            push_condition(&mut csr, condition(c, "R", "m"));
        }
        if certificate {
            csr.status.get_or_insert_default().certificate = Some(k8s_openapi::ByteString(b"x".to_vec()));
        }
        csr
    }

    #[test]
    fn a_written_csrs_version_is_read_and_nothing_else_must_parse() {
        let answer = r#"{"kind": "CertificateSigningRequest", "metadata": {"name": "c",
            "resourceVersion": "812", "managedFields": [{"manager": "x"}]},
            "spec": {"request": "not even base64"}, "status": {"certificate": 5}}"#;
        assert_eq!(written_version(answer).as_deref(), Some("812"));
        for answer in [
            "",
            "{}",
            r#"{"metadata": {}}"#,
            r#"{"metadata": {"resourceVersion": ""}}"#,
            r#"{"metadata": {"resourceVersion": 812}}"#,
            "[1]",
        ] {
            assert_eq!(written_version(answer), None, "{answer}");
        }
    }

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

    #[test]
    fn the_watch_cache_drops_what_a_finished_csr_no_longer_needs_and_keeps_it_finished() {
        use attestation::names::SIGNER_INSECURE;
        let mut issued = csr(SIGNER_INSECURE, &["Approved"], true);
        issued.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut issued);
        assert!(issued.spec.request.0.is_empty());
        assert_eq!(
            issued
                .status
                .as_ref()
                .and_then(|s| s.certificate.as_ref())
                .map(|c| c.0.as_slice()),
            Some(ISSUED)
        );
        assert_eq!(stage(&issued), Stage::Done, "still finished: never signed again");
        assert!(!needs_us(&issued));

        let mut denied = csr(SIGNER_INSECURE, &["Denied"], false);
        denied.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut denied);
        assert!(denied.spec.request.0.is_empty());
        assert!(!needs_us(&denied));

        let mut approved = csr(SIGNER_INSECURE, &["Approved"], false);
        approved.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut approved);
        assert_eq!(
            approved.spec.request.0, b"request",
            "an approved, unsigned CSR is still to sign"
        );
    }

    #[test]
    fn event_notes_fit_the_api_limit() {
        assert!(note(&"x".repeat(5000)).len() <= 1024);
    }
}
