//! Events without one write per decision under load.
//!
//! Every decision is worth an Event on its Machine (`kubectl describe machine` is where an
//! operator looks first), but a scale-up of 500 nodes, or a flood of junk CSRs, would make them
//! half the signer's writes and put them on the critical path of every join. So decisions hand
//! their Events to an [`EventSink`] and go on; one task writes them, the way client-go's
//! recorder does (a bounded queue, a token bucket, similar Events folded into one):
//!
//! - up to [`Budget::burst`] Events at once, then [`Budget::per_second`], are written as they
//!   are, on their own object;
//! - beyond that, Events are folded per Cluster, type and reason; every [`Budget::fold_period`]
//!   each fold is written as one Event on the Cluster, with the count, the first few objects
//!   and the last note ("`CertificateIssued` x 137 in 10s: Machines a, b, c, …");
//! - the queue holds [`Budget::queue`] Events; beyond that they are dropped and counted, never
//!   waited for. The CSR's conditions are the record; Events are the report.
//!
//! Nothing is written for a paused Cluster (SPEC section 7): the fleet tells the sink which
//! Clusters are paused ([`EventSink::withhold`]), and what a worker queued before its Cluster
//! was paused, or folded, is dropped when its turn comes (counted as `paused`).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use attestation::machine::ClusterView;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;

use super::metrics::EventOutcomeLabels;

/// One Event a decision or a cluster duty reports.
#[derive(Debug, Clone)]
pub struct Report {
    /// The object it is about (a Machine, a MachinePool or the Cluster).
    pub regarding: ObjectReference,
    /// The Cluster, where folded Events go.
    pub cluster: ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// What the signer was doing.
    pub action: &'static str,
    /// The text (already cut to the API's limit by the caller).
    pub note: String,
}

/// How many Events are written as they are.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Events written at once before the rate applies.
    pub burst: f64,
    /// Events written per second after the burst.
    pub per_second: f64,
    /// How often folds are written.
    pub fold_period: Duration,
    /// Events waiting to be written; beyond it they are dropped.
    pub queue: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            burst: 25.0,
            per_second: 5.0,
            fold_period: Duration::from_secs(10),
            queue: 1024,
        }
    }
}

/// Objects named in a folded Event's note.
const FOLD_EXAMPLES: usize = 5;

#[derive(Debug)]
struct Fold {
    cluster: ObjectReference,
    type_: EventType,
    reason: String,
    count: u64,
    examples: Vec<String>,
    last_note: String,
}

/// The pure part: which Events are written as they are, which are folded, and the folds.
#[derive(Debug)]
pub struct Folder {
    budget: Budget,
    tokens: f64,
    refilled: Instant,
    folds: BTreeMap<(String, String, String), Fold>,
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Folder {
    /// A folder with a full bucket at `now`.
    pub fn new(budget: Budget, now: Instant) -> Self {
        Self {
            budget,
            tokens: budget.burst,
            refilled: now,
            folds: BTreeMap::new(),
        }
    }

    /// `Some(report)` to write now, `None` when it was folded.
    pub fn offer(&mut self, report: Report, now: Instant) -> Option<Report> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.budget.per_second).min(self.budget.burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Some(report);
        }
        let key = (
            report.cluster.uid.clone().unwrap_or_default(),
            type_name(report.type_).to_owned(),
            report.reason.clone(),
        );
        let fold = self.folds.entry(key).or_insert_with(|| Fold {
            cluster: report.cluster.clone(),
            type_: report.type_,
            reason: report.reason.clone(),
            count: 0,
            examples: Vec::new(),
            last_note: String::new(),
        });
        fold.count += 1;
        if fold.examples.len() < FOLD_EXAMPLES {
            let kind = report.regarding.kind.clone().unwrap_or_default();
            let name = report.regarding.name.clone().unwrap_or_default();
            fold.examples.push(format!("{kind} {name}"));
        }
        fold.last_note = report.note;
        None
    }

    /// The folds since the last call, each as one Event on its Cluster.
    pub fn flush(&mut self) -> Vec<Report> {
        let period = humantime::format_duration(self.budget.fold_period);
        std::mem::take(&mut self.folds)
            .into_values()
            .map(|fold| {
                let more = if fold.count > fold.examples.len() as u64 {
                    ", …"
                } else {
                    ""
                };
                let note = format!(
                    "{} x {} within {period} (folded to spare the apiserver): {}{more}; last: {}",
                    fold.reason,
                    fold.count,
                    fold.examples.join(", "),
                    fold.last_note
                );
                Report {
                    regarding: fold.cluster.clone(),
                    cluster: fold.cluster,
                    type_: fold.type_,
                    reason: fold.reason,
                    action: "Decide",
                    note: attestation::identity::truncate(&note, 1000),
                }
            })
            .collect()
    }
}

/// Takes Events from decisions without waiting, and writes them from one task.
#[derive(Debug)]
pub struct EventSink {
    sender: mpsc::Sender<Report>,
    outcomes: Outcomes,
    /// UIDs of the paused Clusters, whose Events are not written.
    withheld: Withheld,
}

/// UIDs of the Clusters whose Events are not written (paused), shared with the writing task.
#[derive(Debug, Clone, Default)]
struct Withheld(Arc<RwLock<HashSet<String>>>);

impl Withheld {
    /// Whether `report`'s Cluster is paused.
    fn holds(&self, report: &Report) -> bool {
        let uid = report.cluster.uid.as_deref().unwrap_or_default();
        !uid.is_empty() && crate::locks::read(&self.0).contains(uid)
    }
}

/// `node_attestation_events_total{outcome}`.
#[derive(Debug, Clone)]
struct Outcomes(Family<EventOutcomeLabels, Counter>);

impl Outcomes {
    /// Counts one `outcome`; the count before it.
    fn count(&self, outcome: &str) -> u64 {
        self.0
            .get_or_create(&EventOutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc()
    }
}

impl EventSink {
    /// Starts the writing task (it ends when the sink is dropped), counting into `outcomes`.
    pub fn start(recorder: Recorder, budget: Budget, outcomes: Family<EventOutcomeLabels, Counter>) -> Self {
        let (sender, receiver) = mpsc::channel(budget.queue.max(1));
        let outcomes = Outcomes(outcomes);
        let withheld = Withheld::default();
        let writer = Writer {
            recorder,
            outcomes: outcomes.clone(),
            withheld: withheld.clone(),
        };
        tokio::spawn(write_loop(writer, budget, receiver));
        Self {
            sender,
            outcomes,
            withheld,
        }
    }

    /// From now on, Events of the Clusters of `uids` (the paused ones) are not written, those
    /// queued already included; the others' are again.
    pub fn withhold(&self, uids: HashSet<String>) {
        *crate::locks::write(&self.withheld.0) = uids;
    }

    /// Queues `report`; never waits.
    pub fn record(&self, report: Report) {
        if self.sender.try_send(report).is_err() {
            let dropped = self.outcomes.count("dropped") + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "Event queue full; Events dropped (the CSR conditions still say everything)"
                );
            }
        }
    }
}

/// What the writing task writes with.
struct Writer {
    recorder: Recorder,
    outcomes: Outcomes,
    withheld: Withheld,
}

impl Writer {
    /// Writes `report` unless its Cluster is paused.
    async fn write(&self, report: &Report) {
        if self.withheld.holds(report) {
            self.outcomes.count("paused");
            return;
        }
        write(&self.recorder, report).await;
        self.outcomes.count("written");
    }
}

async fn write_loop(writer: Writer, budget: Budget, mut receiver: mpsc::Receiver<Report>) {
    let mut folder = Folder::new(budget, Instant::now());
    let mut tick = tokio::time::interval(budget.fold_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            report = receiver.recv() => {
                let Some(report) = report else { break };
                if writer.withheld.holds(&report) {
                    writer.outcomes.count("paused");
                    continue;
                }
                match folder.offer(report, Instant::now()) {
                    Some(report) => writer.write(&report).await,
                    None => {
                        writer.outcomes.count("folded");
                    }
                }
            }
            _ = tick.tick() => {
                for report in folder.flush() {
                    writer.write(&report).await;
                }
            }
        }
    }
    for report in folder.flush() {
        writer.write(&report).await;
    }
}

async fn write(recorder: &Recorder, report: &Report) {
    publish(
        recorder,
        &report.regarding,
        report.type_,
        &report.reason,
        report.action,
        &report.note,
    )
    .await;
}

/// Kubernetes caps an Event note at 1 KiB.
pub fn note(text: &str) -> String {
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

/// A fact recorded by one Event at most: the Event's name is the fact's.
pub struct Once {
    /// The Event's name (a DNS subdomain unique to the fact).
    pub name: String,
    /// What it is about; the Event lives in its namespace.
    pub regarding: ObjectReference,
    /// `reason`.
    pub reason: &'static str,
    /// `action`.
    pub action: &'static str,
    /// `note`, at most 1 KiB ([`note`]).
    pub note: String,
}

/// Creates `once`'s Event unless it exists, at once (not through the [`EventSink`]: the caller
/// acts only on what this call created); true when it created it.
pub async fn record_once(client: &kube::Client, reporter: &Reporter, once: &Once) -> Result<bool, kube::Error> {
    use k8s_openapi::api::events::v1::Event as EventV1;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let namespace = once.regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
    let event = EventV1 {
        metadata: ObjectMeta {
            name: Some(once.name.clone()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some(once.action.to_owned()),
        reason: Some(once.reason.to_owned()),
        note: Some(once.note.clone()),
        regarding: Some(once.regarding.clone()),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone().unwrap_or_else(|| reporter.controller.clone())),
        type_: Some("Normal".to_owned()),
        ..EventV1::default()
    };
    let api: kube::Api<EventV1> = kube::Api::namespaced(client.clone(), &namespace);
    match api.create(&kube::api::PostParams::default(), &event).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(kind: &str, name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            kind: Some(kind.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    fn issued(machine: usize, cluster: &str) -> Report {
        Report {
            regarding: reference("Machine", &format!("m-{machine}"), &format!("u-{machine}")),
            cluster: reference("Cluster", cluster, cluster),
            type_: EventType::Normal,
            reason: "CertificateIssued".into(),
            action: "Decide",
            note: format!("CSR n-{machine} approved and signed"),
        }
    }

    #[test]
    fn a_burst_is_written_then_the_rest_is_folded_per_cluster_and_reason() {
        let start = Instant::now();
        let budget = Budget::default();
        let mut folder = Folder::new(budget, start);
        let written = (0..500)
            .filter(|i| {
                folder
                    .offer(issued(*i, if i % 2 == 0 { "a" } else { "b" }), start)
                    .is_some()
            })
            .count();
        assert_eq!(written, 25, "the burst");
        let folds = folder.flush();
        assert_eq!(folds.len(), 2, "one per Cluster");
        let a = folds.iter().find(|f| f.regarding.name.as_deref() == Some("a")).unwrap();
        assert!(a.note.starts_with("CertificateIssued x 237 within 10s"), "{}", a.note);
        assert!(a.note.contains("Machine m-26, Machine m-28"), "{}", a.note);
        assert!(a.note.ends_with("last: CSR n-498 approved and signed"), "{}", a.note);
        assert!(folder.flush().is_empty(), "a fold is written once");

        // The bucket refills at the rate.
        let later = start + Duration::from_secs(2);
        let written = (0..20)
            .filter(|i| folder.offer(issued(*i, "a"), later).is_some())
            .count();
        assert_eq!(written, 10);
    }

    #[tokio::test]
    async fn recording_never_waits_and_counts_what_it_drops() {
        let (sender, _receiver) = mpsc::channel(2);
        let sink = EventSink {
            sender,
            outcomes: Outcomes(Family::default()),
            withheld: Withheld::default(),
        };
        for i in 0..5 {
            sink.record(issued(i, "a"));
        }
        assert_eq!(sink.outcomes.count("dropped"), 3, "three dropped before");
    }

    #[test]
    fn a_paused_clusters_events_are_withheld_and_the_others_are_not() {
        let withheld = Withheld::default();
        assert!(!withheld.holds(&issued(0, "a")));
        *crate::locks::write(&withheld.0) = HashSet::from(["a".to_owned()]);
        assert!(withheld.holds(&issued(0, "a")), "queued before the pause: not written");
        assert!(!withheld.holds(&issued(1, "b")));
        let mut no_uid = issued(2, "a");
        no_uid.cluster.uid = None;
        assert!(!withheld.holds(&no_uid));
        // A fold is an Event on its Cluster: withheld alike.
        let start = Instant::now();
        let mut folder = Folder::new(
            Budget {
                burst: 0.0,
                ..Budget::default()
            },
            start,
        );
        assert!(folder.offer(issued(3, "a"), start).is_none());
        let folds = folder.flush();
        assert!(folds.iter().all(|fold| withheld.holds(fold)), "{folds:?}");
    }

    #[test]
    fn event_notes_fit_the_api_limit() {
        assert!(note(&"x".repeat(5000)).len() <= 1024);
    }
}
