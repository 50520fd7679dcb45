//! Events without one write per decision (SPEC section 3, revision 5).
//!
//! The record of each decision is the CSR's own condition (its reason, and for an approval a
//! message naming the Machine and the replica); an Event is the report an operator reads on the
//! Machine (`kubectl describe machine`) or the Cluster. Decisions hand their Events to an
//! [`EventSink`] and go on; one task writes them, aggregated and rate-limited the way
//! client-go's event correlator does, so that a flood of refused CSRs, or one node retrying,
//! costs the management apiserver a few writes, not one per decision:
//!
//! - **per object and reason** (client-go's correlator: its logger counts an Event identical to
//!   the last instead of writing it again, its spam filter gives each object a bucket of
//!   Events refilled every 5 minutes): an Event whose note is the one last written for its
//!   Machine (or MachinePool, or Cluster) and reason is counted, not written; one with a new
//!   note is written while the object and reason have [`Budget::series_burst`] writes left,
//!   refilled one per [`Budget::series_period`], and counted beyond; what was counted is written
//!   as one Event on the same object once a period has passed since the last write
//!   ("`CSRDenied` x 14 more within 5m; last: …");
//! - **per Cluster**, to bound the writes of many objects at once: up to [`Budget::burst`]
//!   Events at once, then [`Budget::per_second`], are written; beyond that, Events are folded
//!   per Cluster, type and reason, and every [`Budget::fold_period`] each fold is written as
//!   one Event on the Cluster, with the count, the first few objects and the last note;
//! - the queue holds [`Budget::queue`] Events; beyond that they are dropped and counted, never
//!   waited for.
//!
//! No certificate is reported by an Event (workload::record): the approval condition is its
//! record, so a join's only management write is its claim.
//!
//! Nothing is written for a paused Cluster (SPEC section 7): the fleet tells the sink which
//! Clusters are paused ([`EventSink::withhold`]), and what a worker queued before its Cluster
//! was paused, or folded, is dropped when its turn comes (counted as `paused`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use attestation::machine::ClusterView;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
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
    /// An object and reason's bucket refills one write per period, and what was counted is
    /// written once a period has passed since its last write (client-go's spam filter refills
    /// one Event per object every 5 minutes).
    pub series_period: Duration,
    /// Writes with new notes an object and reason may make at once (client-go's aggregator
    /// lets 10 similar Events through before it combines them).
    pub series_burst: f64,
    /// Objects and reasons tracked at once; beyond it, a new one is folded per Cluster.
    pub series_kept: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            burst: 25.0,
            per_second: 5.0,
            fold_period: Duration::from_secs(10),
            queue: 1024,
            series_period: Duration::from_secs(300),
            series_burst: 10.0,
            series_kept: 10_000,
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

/// What is known of one object and reason: when it was last written and with which note, the
/// Events counted since, and its bucket of writes.
#[derive(Debug)]
struct Series {
    written: Instant,
    written_note: String,
    repeats: u64,
    last: Report,
    tokens: f64,
    refilled: Instant,
}

impl Series {
    /// Whether a write is left in the bucket at `now` (taking it when there is).
    fn take(&mut self, budget: &Budget, now: Instant) -> bool {
        let refill =
            now.saturating_duration_since(self.refilled).as_secs_f64() / budget.series_period.as_secs_f64().max(1e-9);
        self.tokens = (self.tokens + refill).min(budget.series_burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The pure part: which Events are written as they are, which are counted into a series or
/// folded, and the Events those become.
#[derive(Debug)]
pub struct Folder {
    budget: Budget,
    tokens: f64,
    refilled: Instant,
    folds: BTreeMap<(String, String, String), Fold>,
    series: HashMap<(String, &'static str, String), Series>,
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// The object a report is about, as a key: its UID, else its kind, namespace and name.
fn object_key(reference: &ObjectReference) -> String {
    match reference.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => format!(
            "{}/{}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        ),
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
            series: HashMap::new(),
        }
    }

    /// `Some(report)` to write now, `None` when it was counted into its series or folded.
    pub fn offer(&mut self, report: Report, now: Instant) -> Option<Report> {
        let key = (
            object_key(&report.regarding),
            type_name(report.type_),
            report.reason.clone(),
        );
        let budget = self.budget;
        if let Some(series) = self.series.get_mut(&key) {
            // The same note as last written, or a new one beyond the object's bucket: counted.
            if series.written_note == report.note || !series.take(&budget, now) {
                series.repeats += 1;
                series.last = report;
                return None;
            }
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * budget.per_second).min(budget.burst);
        self.refilled = now;
        let tracked = self.series.contains_key(&key) || self.series.len() < budget.series_kept;
        if self.tokens >= 1.0 && tracked {
            self.tokens -= 1.0;
            match self.series.get_mut(&key) {
                Some(series) => {
                    series.written = now;
                    series.written_note = report.note.clone();
                    series.last = report.clone();
                }
                None => {
                    self.series.insert(
                        key,
                        Series {
                            written: now,
                            written_note: report.note.clone(),
                            repeats: 0,
                            last: report.clone(),
                            tokens: budget.series_burst - 1.0,
                            refilled: now,
                        },
                    );
                }
            }
            return Some(report);
        }
        self.fold(report);
        None
    }

    fn fold(&mut self, report: Report) {
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
    }

    /// What is due at `now`: the folds since the last call, each as one Event on its Cluster,
    /// and the series whose period has passed with repeats, each as one Event on its object.
    /// Series whose period passed without repeats are forgotten.
    pub fn flush(&mut self, now: Instant) -> Vec<Report> {
        let period = humantime::format_duration(self.budget.fold_period);
        let mut due: Vec<Report> = std::mem::take(&mut self.folds)
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
            .collect();
        let series_period = self.budget.series_period;
        let within = humantime::format_duration(series_period);
        self.series.retain(|_, series| {
            if now.saturating_duration_since(series.written) < series_period {
                return true;
            }
            if series.repeats == 0 {
                return false;
            }
            let note = format!(
                "{} x {} more within {within} (one Event per object and reason per {within}); last: {}",
                series.last.reason, series.repeats, series.last.note
            );
            due.push(Report {
                note: attestation::identity::truncate(&note, 1000),
                ..series.last.clone()
            });
            series.written = now;
            series.written_note = series.last.note.clone();
            series.repeats = 0;
            true
        });
        due
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
                for report in folder.flush(Instant::now()) {
                    writer.write(&report).await;
                }
            }
        }
    }
    // The sink is gone (shutting down): whatever is counted is written now.
    for report in folder.flush(Instant::now() + budget.series_period) {
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

    fn denied(machine: usize, cluster: &str) -> Report {
        Report {
            regarding: reference("Machine", &format!("m-{machine}"), &format!("u-{machine}")),
            cluster: reference("Cluster", cluster, cluster),
            type_: EventType::Warning,
            reason: "CSRDenied".into(),
            action: "Decide",
            note: format!("CSR n-{machine} denied"),
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
                    .offer(denied(*i, if i % 2 == 0 { "a" } else { "b" }), start)
                    .is_some()
            })
            .count();
        assert_eq!(written, 25, "the burst");
        let folds = folder.flush(start);
        assert_eq!(folds.len(), 2, "one per Cluster");
        let a = folds.iter().find(|f| f.regarding.name.as_deref() == Some("a")).unwrap();
        assert!(a.note.starts_with("CSRDenied x 237 within 10s"), "{}", a.note);
        assert!(a.note.contains("Machine m-26, Machine m-28"), "{}", a.note);
        assert!(a.note.ends_with("last: CSR n-498 denied"), "{}", a.note);
        assert!(folder.flush(start).is_empty(), "a fold is written once");

        // The bucket refills at the rate.
        let later = start + Duration::from_secs(2);
        let written = (1000..1020)
            .filter(|i| folder.offer(denied(*i, "a"), later).is_some())
            .count();
        assert_eq!(written, 10);
    }

    #[test]
    fn one_machine_and_reason_writes_new_notes_within_its_bucket_and_counts_the_rest() {
        let start = Instant::now();
        let budget = Budget::default();
        let mut folder = Folder::new(budget, start);
        let at = |second: u64| start + Duration::from_secs(second);
        assert!(folder.offer(denied(1, "a"), start).is_some(), "the first is written");
        for second in 1..=40 {
            assert!(
                folder.offer(denied(1, "a"), at(second)).is_none(),
                "the note last written, again: counted"
            );
        }
        let noted = |n: u64| {
            let mut report = denied(1, "a");
            report.note = format!("retry {n}");
            report
        };
        let written = (41..=60).filter(|n| folder.offer(noted(*n), at(*n)).is_some()).count();
        assert_eq!(written, 9, "new notes: the object's bucket of 10, the first included");
        let mut other_reason = denied(1, "a");
        other_reason.reason = "CSRFailed".into();
        assert!(
            folder.offer(other_reason, at(60)).is_some(),
            "another reason is its own series"
        );
        assert!(
            folder.flush(at(100)).is_empty(),
            "nothing due within a period of the last write"
        );
        let due = folder.flush(at(49) + budget.series_period);
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!(due[0].regarding.name.as_deref(), Some("m-1"), "on the Machine itself");
        assert_eq!(due[0].reason, "CSRDenied");
        assert!(
            due[0].note.starts_with("CSRDenied x 51 more within 5m"),
            "40 repeats and 11 new notes beyond the bucket: {}",
            due[0].note
        );
        assert!(due[0].note.ends_with("last: retry 60"), "{}", due[0].note);
        // That write's note is the last written: the same again is counted.
        let after = at(50) + budget.series_period;
        assert!(folder.offer(noted(60), after).is_none());
        // A new note once the bucket has refilled is written.
        assert!(folder.offer(noted(61), after + budget.series_period).is_some());
        // A series that saw no repeat in its period is forgotten.
        let quiet = after + budget.series_period * 3;
        assert_eq!(folder.flush(quiet).len(), 1, "the one repeat");
        assert!(folder.flush(quiet + budget.series_period).is_empty());
    }

    #[test]
    fn series_are_bounded_and_what_does_not_fit_is_folded_per_cluster() {
        let start = Instant::now();
        let budget = Budget {
            series_kept: 3,
            ..Budget::default()
        };
        let mut folder = Folder::new(budget, start);
        let written = (0..10)
            .filter(|i| folder.offer(denied(*i, "a"), start).is_some())
            .count();
        assert_eq!(written, 3);
        let folds = folder.flush(start);
        assert_eq!(folds.len(), 1);
        assert!(
            folds[0].note.starts_with("CSRDenied x 7 within 10s"),
            "{}",
            folds[0].note
        );
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
            sink.record(denied(i, "a"));
        }
        assert_eq!(sink.outcomes.count("dropped"), 3, "three dropped before");
    }

    #[test]
    fn a_paused_clusters_events_are_withheld_and_the_others_are_not() {
        let withheld = Withheld::default();
        assert!(!withheld.holds(&denied(0, "a")));
        *crate::locks::write(&withheld.0) = HashSet::from(["a".to_owned()]);
        assert!(withheld.holds(&denied(0, "a")), "queued before the pause: not written");
        assert!(!withheld.holds(&denied(1, "b")));
        let mut no_uid = denied(2, "a");
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
        assert!(folder.offer(denied(3, "a"), start).is_none());
        let folds = folder.flush(start);
        assert!(folds.iter().all(|fold| withheld.holds(fold)), "{folds:?}");
    }

    #[test]
    fn event_notes_fit_the_api_limit() {
        assert!(note(&"x".repeat(5000)).len() <= 1024);
    }
}
