//! Fleet membership and sharding: which workload clusters this replica serves, and the
//! workers it starts for them.
//!
//! - [`membership`]: this replica's Lease and the live members; [`shard`]: the capped
//!   rendezvous assignment; [`scope`]: this replica's part of the opted-in Clusters;
//!   [`credentials`]: each served Cluster's Secrets, read when they may have changed.
//!
//! This room owns the Leases and the set of running workers. It reads the management cache and
//! Secrets through [`crate::controller::management::Management`] and starts a
//! [`Worker`] per served Cluster; it never watches or writes a workload cluster or a CSR itself.
//!
//! On every Cluster change, every membership change and every resync it decides which opted-in
//! Clusters this process serves, refuses Clusters whose CA certificate is another opted-in
//! Cluster's, and starts, restarts (Secrets rotated) or stops workers. A Cluster whose Secrets
//! are missing or broken, or whose apiserver is down, holds back only itself.
//!
//! Secrets are read when they may have changed, not on every pass: a Cluster seen for the first
//! time, a Cluster whose view changed (opt-in, attestors, UID), one whose worker is not running
//! (its Secrets were broken or its CA shared: every `--resync-period`), and every other one once
//! per `--secret-resync-period` (5 min by default, spread by the Cluster's UID over its last
//! quarter), one GET per Secret (`<cluster>-kubeconfig`, `<cluster>-ca`, and the operator's
//! `<cluster>-node-attestation-kubeconfig`, usually a 404), sixteen Clusters at once. A pass
//! triggered by a Cluster's status update then costs no request at all; at 10,000 Clusters the
//! periodic reads are about 100 GETs a second where reading everything on every pass was
//! thousands. The bytes are compared before
//! anything is parsed: an unchanged kubeconfig and CA keep their worker, client and parsed key.
//!
//! Sharded ([`Scope::Shard`]), it serves only the opted-in Clusters the shard assigns to this
//! replica ([`membership::View::owners`]), still compares CAs with every opted-in Cluster
//! (a shared CA is refused whichever replicas own the two), and logs, counts and records an
//! Event on the Cluster for each hand-over.
//!
//! A paused Cluster (`spec.paused`, or the `cluster.x-k8s.io/paused` annotation: SPEC section 7,
//! [`attestation::machine::Paused`]) keeps its place in the shard and its cached Machines, but
//! no worker runs for it: a running one is stopped (its in-flight CSR tasks are aborted with
//! it), so nothing decides its CSRs, which stay pending, and no claim, certificate, token,
//! binding or RBAC is written for it. The fleet writes nothing for it either: no Event (no
//! `SharedCa`, `SecretsInvalid` or hand-over Event names it), only its `<cluster>-ca` is read,
//! for the shared-CA comparison below. It is counted as `Paused` and logged once when it
//! becomes paused and once when it is unpaused; the Cluster watch's change then makes the next
//! pass start its worker again, which resumes what a stopped one left half done (a claim of
//! this CSR's passes without a second write, an approved CSR without a certificate is decided
//! again and signed: SPEC section 3).
//!
//! A paused Cluster still counts for the shared-CA refusal: pausing stops this signer, not the
//! workload cluster, whose apiserver still trusts every certificate its CA signs. Two Clusters
//! with one CA are one trust domain whether or not one of them is paused, so a certificate the
//! signer issued for the unpaused one would authenticate as that node in the paused one; and a
//! paused copy of a Cluster (a backup restored beside it, a `clusterctl move` target left
//! paused in the same management cluster) is exactly the duplicate the refusal is there for.
//! Not counting it would also make an unpause flip the other Cluster from served to refused.

pub mod credentials;
pub mod membership;
pub mod readiness;
pub mod scope;
pub mod shard;
pub mod templated;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::machine::ClusterView;
use kube::runtime::events::EventType;
use tokio::task::JoinHandle;

use self::credentials::{Known, SecretReads};
use self::membership::View;
use self::scope::{Assignment, Scope, assign};
use crate::controller::events::{cluster_reference, publish};
use crate::controller::metrics::{ClusterState, Direction};
use crate::controller::workload::{Shared, Worker};
use crate::controller::workload_access::WorkloadAccess;

struct Running {
    worker: Arc<Worker>,
    task: JoinHandle<()>,
    digest: [u8; 32],
}

impl Drop for Running {
    fn drop(&mut self) {
        self.worker.stop();
        self.task.abort();
    }
}

/// Workers by Cluster key, plus the problems of the Clusters without one.
pub struct Fleet {
    shared: Arc<Shared>,
    scope: Scope,
    running: HashMap<String, Running>,
    problems: HashMap<String, (ClusterState, String)>,
    /// Keys of the opted-in Clusters assigned to this replica at the last reconcile.
    owned: HashSet<String>,
    /// Keys of every opted-in Cluster at the last reconcile (`None` before the first): a
    /// Cluster newly opted in is not a hand-over.
    opted_in: Option<HashSet<String>>,
    /// What was last read of each opted-in Cluster's Secrets.
    secrets: SecretReads,
    /// Keys of the Clusters assigned to this replica that were paused at the last reconcile,
    /// and since when ([`ClusterView::paused_since`], else when this replica first saw it).
    paused: HashMap<String, time::OffsetDateTime>,
    /// `/readyz`'s flag, when readiness waits for the share ([`Fleet::ready_when_serving`]).
    ready: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Fleet {
    /// An empty fleet serving `scope`.
    pub fn new(shared: Arc<Shared>, scope: Scope) -> Self {
        Self {
            secrets: SecretReads::new(Arc::clone(&shared)),
            shared,
            scope,
            running: HashMap::new(),
            problems: HashMap::new(),
            owned: HashSet::new(),
            opted_in: None,
            paused: HashMap::new(),
            ready: None,
        }
    }

    /// Makes `ready` (`/readyz`) say whether this replica serves its share, after each pass
    /// ([`readiness`]). Not for a leader-elected replica: a standby serves nothing and must be
    /// ready for a rollout to proceed.
    pub fn ready_when_serving(mut self, ready: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// Runs forever: reconciles on every Cluster change, every membership change and every
    /// resync period.
    /// Between passes, a worker's state change or a Cluster's listing only re-reports the
    /// cluster gauges.
    pub async fn run(mut self) {
        let clusters = Arc::clone(&self.shared.management.clusters);
        loop {
            self.reconcile().await;
            let next_pass = tokio::time::Instant::now() + self.shared.settings.resync;
            loop {
                tokio::select! {
                    () = clusters.changed() => {
                        // Cluster API updates Clusters' status often: one pass for a burst of them.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        break;
                    }
                    () = self.scope.changed() => break,
                    () = tokio::time::sleep_until(next_pass) => break,
                    () = self.shared.states_changed.notified() => self.report_soon().await,
                    () = self.shared.management.listed_changed.notified() => self.report_soon().await,
                }
            }
        }
    }

    #[tracing::instrument(skip_all)]
    async fn reconcile(&mut self) {
        let before: Vec<String> = self
            .problems
            .keys()
            .chain(self.running.keys())
            .chain(self.paused.keys())
            .cloned()
            .collect();
        let view = self.scope.view();
        let opted_in = self.shared.management.clusters.select(|c| c.opted_in);
        let Assignment { mine, theirs, owners } = assign(view.as_ref(), opted_in);
        // Paused Clusters stay assigned (an unpause is no hand-over) and keep their cached
        // objects (their workers start without listing them again), but are not served.
        let (paused, served): (Vec<ClusterView>, Vec<ClusterView>) =
            mine.iter().cloned().partition(ClusterView::is_paused);
        // Released and paused Clusters stop before anything slow happens; released ones'
        // Machines are dropped, gained ones start listing theirs.
        let mine_keys: HashSet<String> = mine.iter().map(ClusterView::key).collect();
        let served_keys: HashSet<String> = served.iter().map(ClusterView::key).collect();
        self.running.retain(|k, _| served_keys.contains(k));
        // A fenced replica serves nothing (its workers stopped above) but keeps the cached
        // objects of the Clusters it held until it is counted among the members again: the
        // watches keep them current, and a replica fenced because a loaded apiserver answered
        // its renewals late regains the same share when it renews, without listing their
        // namespaces again (at a thousand Clusters, those lists were the load that kept it
        // fenced: docs/capacity.md, "Measured at 1,000 Clusters").
        if !view.as_ref().is_some_and(View::standing_aside) {
            self.shared.management.serve(&mine);
        }
        if let Some(view) = &view {
            self.hand_over(view, &owners, &mine, &theirs);
        }
        self.owned = mine_keys;
        self.opted_in = Some(mine.iter().chain(&theirs).map(ClusterView::key).collect());
        self.note_pauses(&paused, &served_keys);

        let opted_in_now = self.opted_in.clone().unwrap_or_default();
        self.secrets.known.retain(|k, _| opted_in_now.contains(k));
        let now = Instant::now();
        let running = &self.running;
        // A paused Cluster's CA is read as another replica's is: only to compare (see the
        // module's documentation).
        let compared_only: Vec<ClusterView> = theirs.iter().chain(&paused).cloned().collect();
        let loaded = self
            .secrets
            .read_due(&served, &compared_only, now, |k| running.get(k).map(|r| r.digest))
            .await;

        let mut problems: HashMap<String, (ClusterState, String)> = HashMap::new();
        for cluster in &served {
            if let Some(Known {
                own: Some(Err(why)), ..
            }) = self.secrets.known.get(&cluster.key())
            {
                problems.insert(cluster.key(), (ClusterState::SecretsInvalid, why.clone()));
                // Its credentials are gone or broken: stop using the old ones.
                self.running.remove(&cluster.key());
            }
        }
        // Two Clusters with one CA: a certificate for either works in both. Refuse both, even
        // when another replica serves the other one (that replica refuses its own side), and
        // even when the other one is paused (the module's documentation says why); a paused
        // one is not refused itself: it is not served, and gets no Event.
        let mut by_ca: HashMap<[u8; 32], Vec<String>> = HashMap::new();
        for (k, known) in &self.secrets.known {
            let compared = known.own.is_some() || !served_keys.is_empty();
            if let (Some(fingerprint), true) = (known.ca_fingerprint, compared) {
                by_ca.entry(fingerprint).or_default().push(k.clone());
            }
        }
        let mut loaded = loaded;
        for sharing in by_ca.values().filter(|keys| keys.len() > 1) {
            for k in sharing.iter().filter(|k| served_keys.contains(*k)) {
                let others: Vec<&String> = sharing.iter().filter(|o| *o != k).collect();
                problems.insert(
                    k.clone(),
                    (
                        ClusterState::SharedCa,
                        format!(
                            "refused: its CA certificate is also the CA of opted-in Cluster(s) {others:?}, so certificates for one would work in the other; give each Cluster its own CA"
                        ),
                    ),
                );
                loaded.remove(k);
                self.running.remove(k);
            }
        }

        for (k, (cluster, credentials)) in loaded {
            let previous = self.running.remove(&k);
            let restarting = previous.is_some();
            let access = match (credentials.access, previous) {
                (Some(access), _) => access,
                (None, Some(previous)) => WorkloadAccess::Given {
                    client: previous.worker.client(),
                },
                // Stopped meanwhile: read again at the next pass.
                (None, None) => continue,
            };
            tracing::info!(cluster = %k, restarting, "serving workload cluster");
            if let Err(why) = &credentials.ca {
                tracing::warn!(cluster = %k, "{why}: approvable CSRs wait, then are denied Expired after --csr-max-age");
            }
            let worker = Worker::new(&cluster, access, credentials.ca, Arc::clone(&self.shared));
            let task = tokio::spawn(Arc::clone(&worker).run());
            self.running.insert(
                k,
                Running {
                    worker,
                    task,
                    digest: credentials.digest,
                },
            );
        }

        for (k, (state, why)) in &problems {
            if self.problems.get(k).map(|(_, w)| w) != Some(why) {
                tracing::error!(cluster = %k, state = ?state, "{why}");
                if let Some(cluster) = self.shared.management.clusters.get(k) {
                    let reason = format!("{state:?}");
                    let reference = cluster_reference(&cluster);
                    publish(
                        &self.shared.recorder,
                        &reference,
                        EventType::Warning,
                        &reason,
                        "Reconcile",
                        why,
                    )
                    .await;
                }
            }
        }
        for k in before
            .iter()
            .filter(|k| !problems.contains_key(*k) && !self.running.contains_key(*k) && !self.paused.contains_key(*k))
        {
            if opted_in_now.contains(k) {
                tracing::info!(cluster = %k, "no longer served");
            } else {
                // Opted out (or deleted): say what stays behind (SPEC section 7, revision 5).
                tracing::info!(cluster = %k, keeps = crate::render::OPTED_OUT_KEEPS, "no longer opted in: no longer served");
            }
            self.shared.metrics.forget_cluster(k);
        }
        self.problems = problems;
        self.report();
    }

    /// Logs each assigned Cluster that became paused (once, and forgets its per-cluster series:
    /// nothing watches it now) and each that was paused and is served again (once), has the
    /// Event sink withhold the paused ones' Events (a stopped worker's queued ones too), and
    /// keeps the paused ones for the next pass and the `Paused` count.
    fn note_pauses(&mut self, paused: &[ClusterView], served: &HashSet<String>) {
        let mut now_paused = HashMap::new();
        let now = time::OffsetDateTime::now_utc();
        for cluster in paused {
            let k = cluster.key();
            let seen_since = self.paused.get(&k).copied();
            if seen_since.is_none() {
                let how = cluster.paused.map(|p| p.to_string()).unwrap_or_default();
                tracing::info!(cluster = %k, paused = %how, "Cluster paused: its worker is stopped, its CSRs stay pending and nothing is written for it until it is unpaused");
                self.shared.metrics.forget_cluster(&k);
            }
            // Cluster API's own record of the pause when it wrote one; otherwise the first time
            // this replica saw it (a replica started later, or taking the Cluster over, counts
            // from then: the pause may be older than it says, never newer).
            let since = cluster.paused_since.or(seen_since).unwrap_or(now);
            now_paused.insert(k, since);
        }
        for k in self.paused.keys().filter(|k| served.contains(*k)) {
            tracing::info!(cluster = %k, "Cluster unpaused: serving it again");
        }
        self.shared
            .events
            .withhold(paused.iter().map(|cluster| cluster.uid.clone()).collect());
        self.paused = now_paused;
    }

    /// Reports after half a second: a hand-over of thousands of Clusters changes thousands of
    /// states, which this folds into about two reports a second (each walks every worker).
    async fn report_soon(&self) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.report();
    }

    /// Reports cluster states to the metrics: this replica's Clusters only, so the sum over
    /// replicas is the fleet.
    pub fn report(&self) {
        let mut counts: Vec<(ClusterState, i64)> = self.problems.values().map(|(s, _)| (*s, 1)).collect();
        counts.extend(self.running.values().map(|r| (r.worker.state(), 1)));
        counts.push((
            ClusterState::Paused,
            i64::try_from(self.paused.len()).unwrap_or(i64::MAX),
        ));
        self.shared.metrics.cluster_states(&counts);
        let paused: Vec<(String, i64)> = self
            .paused
            .iter()
            .map(|(cluster, since)| (cluster.clone(), since.unix_timestamp()))
            .collect();
        self.shared.metrics.paused_since(&paused);
        if let Some(ready) = &self.ready {
            let standing_aside = self.scope.view().is_some_and(|view| view.standing_aside());
            let share = self.owned.iter().map(|k| match self.running.get(k) {
                Some(r) if r.worker.state() == ClusterState::Listing => readiness::Standing::Listing,
                Some(_) => readiness::Standing::Served,
                None if self.problems.contains_key(k) || self.paused.contains_key(k) => readiness::Standing::HeldBack,
                None => readiness::Standing::NotYet,
            });
            let serving = readiness::serves_its_share(standing_aside, share);
            if ready.swap(serving, std::sync::atomic::Ordering::Relaxed) != serving {
                tracing::info!(
                    serving,
                    owned = self.owned.len(),
                    "readiness: serves its share: {serving}"
                );
            }
        }
        let cas: Vec<(String, i64)> = self
            .running
            .iter()
            .filter_map(|(cluster, r)| r.worker.ca_not_after().map(|at| (cluster.clone(), at.unix_timestamp())))
            .collect();
        self.shared.metrics.ca_expiries(&cas);
        let now = time::OffsetDateTime::now_utc();
        let waiting: Vec<(String, i64)> = self
            .running
            .iter()
            .map(|(cluster, r)| {
                let age = r
                    .worker
                    .oldest_waiting()
                    .map_or(0, |at| (now - at).whole_seconds().max(0));
                (cluster.clone(), age)
            })
            .collect();
        self.shared.metrics.oldest_waiting(&waiting);
        self.shared
            .metrics
            .tpm_challenge_key(self.shared.challenge_key.key().is_loaded());
        let cached = self.shared.management.cached();
        let kinds = crate::controller::management::store::Kind::ALL;
        let counts: Vec<(&str, usize)> = kinds.iter().map(|k| k.as_str()).zip(cached).collect();
        self.shared.metrics.cached_objects(&counts);
    }

    /// Logs, counts and records (in the background) the Clusters this replica gained and
    /// released since the last reconcile. The first reconcile's Clusters are gained (taken from
    /// whoever served them before); a Cluster opted in or out meanwhile is not a hand-over. A
    /// paused Cluster's hand-over is logged and counted but gets no Event: nothing is written
    /// for a paused Cluster.
    fn hand_over(&self, view: &View, owners: &HashMap<String, String>, mine: &[ClusterView], theirs: &[ClusterView]) {
        let metrics = &self.shared.metrics;
        metrics.shard_clusters_owned(mine.len());
        let was_opted_in = |c: &ClusterView| self.opted_in.as_ref().is_none_or(|o| o.contains(&c.key()));
        let gained: Vec<ClusterView> = mine
            .iter()
            .filter(|c| !self.owned.contains(&c.key()) && was_opted_in(c))
            .cloned()
            .collect();
        let released: Vec<ClusterView> = theirs
            .iter()
            .filter(|c| self.owned.contains(&c.key()))
            .cloned()
            .collect();
        if gained.is_empty() && released.is_empty() {
            return;
        }
        metrics.shard_handovers(Direction::Gained, gained.len());
        metrics.shard_handovers(Direction::Released, released.len());
        let mut events = Vec::new();
        for cluster in &gained {
            tracing::info!(cluster = %cluster.key(), replica = %view.me, direction = "gained", members = %view.members_text(), "shard hand-over");
            if cluster.is_paused() {
                continue;
            }
            events.push((
                cluster_reference(cluster),
                "ShardAcquired",
                format!(
                    "signer replica {} serves this Cluster from now on (replicas: {})",
                    view.me,
                    view.members_text()
                ),
            ));
        }
        for cluster in &released {
            let to = owners.get(&cluster.uid).map_or("no live replica", String::as_str);
            tracing::info!(cluster = %cluster.key(), replica = %view.me, to, fenced = view.fenced, direction = "released", "shard hand-over");
            if cluster.is_paused() {
                continue;
            }
            events.push((
                cluster_reference(cluster),
                "ShardReleased",
                format!(
                    "signer replica {} no longer serves this Cluster; {to} does (replicas: {})",
                    view.me,
                    view.members_text()
                ),
            ));
        }
        if view.fenced {
            // Without a renewed Lease the API is likely out of reach: the log has it.
            return;
        }
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            use futures::StreamExt;
            futures::stream::iter(events)
                .for_each_concurrent(8, |(reference, reason, note)| {
                    let recorder = &shared.recorder;
                    async move { publish(recorder, &reference, EventType::Normal, reason, "Shard", &note).await }
                })
                .await;
        });
    }
}
