//! The fleet: which workload clusters are served, and by which worker.
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
//! quarter), one GET per Secret, sixteen at once. A pass triggered by a Cluster's status update
//! then costs no request at all; at 10,000 Clusters the periodic reads are about 70 GETs a
//! second where reading everything on every pass was thousands. The bytes are compared before
//! anything is parsed: an unchanged kubeconfig and CA keep their worker, client and parsed key.
//!
//! Sharded ([`Scope::Shard`]), it serves only the opted-in Clusters the shard assigns to this
//! replica ([`super::membership::View::owners`]), still compares CAs with every opted-in Cluster
//! (a shared CA is refused whichever replicas own the two), and logs, counts and records an
//! Event on the Cluster for each hand-over.

pub mod membership;
pub mod shard;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::ca::ClusterCa;
use attestation::machine::ClusterView;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zeroize::Zeroizing;

use self::membership::View;
use crate::controller::metrics::{ClusterState, Direction};
use crate::controller::workload::{Shared, Worker, cluster_reference, publish};

/// What a Cluster's Secrets gave.
struct Credentials {
    client: Client,
    /// The CA, or why it is unusable. A missing CA is a transient gap (SPEC section 3): the
    /// worker runs, leaves approvable CSRs pending, and denies them `Expired` after
    /// `--csr-max-age`.
    ca: Result<Arc<ClusterCa>, String>,
    /// SHA-256 over the kubeconfig and the CA pair: a change restarts the worker.
    digest: [u8; 32],
}

/// Secrets read at once during one pass.
const SECRET_READS_AT_ONCE: usize = 16;

/// What was last read of an opted-in Cluster's Secrets.
struct Known {
    /// The Cluster as it was then: a change reads again at once.
    view: ClusterView,
    /// When to read again.
    due: Instant,
    /// SHA-256 of its CA certificate, for the shared-CA refusal.
    ca_fingerprint: Option<[u8; 32]>,
    /// Read as this replica's own: the digest of the Secrets its worker runs on, or why they are
    /// unusable. `None` when read only for the CA comparison.
    own: Option<Result<[u8; 32], String>>,
}

/// One read of a served Cluster's Secrets.
enum OwnRead {
    /// The same bytes as the running worker's.
    Unchanged { digest: [u8; 32] },
    /// New or changed: a worker to start on them.
    Fresh {
        credentials: Credentials,
        ca_fingerprint: Option<[u8; 32]>,
    },
    /// Unusable (`SecretsInvalid`).
    Invalid {
        why: String,
        ca_fingerprint: Option<[u8; 32]>,
    },
}

/// When a Cluster read now is read again: `period` after now, less up to a quarter chosen by its
/// UID, so that Clusters read together at start drift apart.
fn next_read(now: Instant, period: Duration, uid: &str) -> Instant {
    let spread = shard::weight("secret-resync", uid) as f64 / u64::MAX as f64;
    now + period.mul_f64(0.75 + 0.25 * spread)
}

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

/// Which opted-in Clusters this replica serves.
pub enum Scope {
    /// All of them: one replica (`--leader-elect=false`) or the leader.
    Everything,
    /// Those the shard assigns to this replica, by the membership's live view.
    Shard(watch::Receiver<View>),
}

impl Scope {
    /// The view to filter by, `None` for everything. A view whose membership has stopped is
    /// fenced: nothing is served without renewals.
    fn view(&self) -> Option<View> {
        match self {
            Self::Everything => None,
            Self::Shard(view) => {
                let mut current = view.borrow().clone();
                if view.has_changed().is_err() {
                    current.fenced = true;
                }
                Some(current)
            }
        }
    }

    /// Resolves at the next membership change (never for [`Scope::Everything`] or a stopped
    /// membership).
    async fn changed(&mut self) {
        match self {
            Self::Shard(view) if view.has_changed().is_ok() => {
                let _ = view.changed().await;
            }
            _ => std::future::pending().await,
        }
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
    known: HashMap<String, Known>,
}

fn key(cluster: &ClusterView) -> String {
    format!("{}/{}", cluster.namespace, cluster.name)
}

impl Fleet {
    /// An empty fleet serving `scope`.
    pub fn new(shared: Arc<Shared>, scope: Scope) -> Self {
        Self {
            shared,
            scope,
            running: HashMap::new(),
            problems: HashMap::new(),
            owned: HashSet::new(),
            opted_in: None,
            known: HashMap::new(),
        }
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
        let before: Vec<String> = self.problems.keys().chain(self.running.keys()).cloned().collect();
        let view = self.scope.view();
        let opted_in = self.shared.management.clusters.select(|c| c.opted_in);
        // Owners are assigned over every opted-in Cluster at once (the shares are capped).
        let owners: HashMap<String, String> = match &view {
            Some(view) => {
                let uids: Vec<&str> = opted_in.iter().map(|c| c.uid.as_str()).collect();
                uids.iter()
                    .zip(view.owners(&uids))
                    .filter_map(|(uid, owner)| Some(((*uid).to_owned(), owner?.to_owned())))
                    .collect()
            }
            None => HashMap::new(),
        };
        let (mine, theirs): (Vec<ClusterView>, Vec<ClusterView>) = opted_in.into_iter().partition(|c| {
            view.as_ref()
                .is_none_or(|v| v.is_me(owners.get(&c.uid).map(String::as_str)))
        });
        // Released Clusters stop before anything slow happens, and their Machines are dropped;
        // gained ones start listing theirs.
        let mine_keys: HashSet<String> = mine.iter().map(key).collect();
        self.running.retain(|k, _| mine_keys.contains(k));
        self.shared.management.serve(&mine);
        if let Some(view) = &view {
            self.hand_over(view, &owners, &mine, &theirs);
        }
        self.owned = mine_keys.clone();
        self.opted_in = Some(mine.iter().chain(&theirs).map(key).collect());

        let opted_in_now = self.opted_in.clone().unwrap_or_default();
        self.known.retain(|k, _| opted_in_now.contains(k));
        let now = Instant::now();
        let loaded = self.read_due(&mine, &theirs, now).await;

        let mut problems: HashMap<String, (ClusterState, String)> = HashMap::new();
        for cluster in &mine {
            if let Some(Known {
                own: Some(Err(why)), ..
            }) = self.known.get(&key(cluster))
            {
                problems.insert(key(cluster), (ClusterState::SecretsInvalid, why.clone()));
                // Its credentials are gone or broken: stop using the old ones.
                self.running.remove(&key(cluster));
            }
        }
        // Two Clusters with one CA: a certificate for either works in both. Refuse both, even
        // when another replica serves the other one (that replica refuses its own side).
        let mut by_ca: HashMap<[u8; 32], Vec<String>> = HashMap::new();
        for (k, known) in &self.known {
            let compared = known.own.is_some() || !mine_keys.is_empty();
            if let (Some(fingerprint), true) = (known.ca_fingerprint, compared) {
                by_ca.entry(fingerprint).or_default().push(k.clone());
            }
        }
        let mut loaded = loaded;
        for sharing in by_ca.values().filter(|keys| keys.len() > 1) {
            for k in sharing.iter().filter(|k| mine_keys.contains(*k)) {
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
            let restarting = self.running.remove(&k).is_some();
            tracing::info!(cluster = %k, restarting, "serving workload cluster");
            if let Err(why) = &credentials.ca {
                tracing::warn!(cluster = %k, "{why}: approvable CSRs wait, then are denied Expired after --csr-max-age");
            }
            let worker = Worker::new(&cluster, credentials.client, credentials.ca, Arc::clone(&self.shared));
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
            .filter(|k| !problems.contains_key(*k) && !self.running.contains_key(*k))
        {
            tracing::info!(cluster = %k, "no longer served");
            self.shared.metrics.forget_cluster(k);
        }
        self.problems = problems;
        self.report();
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
        self.shared.metrics.cluster_states(&counts);
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
    /// whoever served them before); a Cluster opted in or out meanwhile is not a hand-over.
    fn hand_over(&self, view: &View, owners: &HashMap<String, String>, mine: &[ClusterView], theirs: &[ClusterView]) {
        let metrics = &self.shared.metrics;
        metrics.shard_clusters_owned(mine.len());
        let was_opted_in = |c: &ClusterView| self.opted_in.as_ref().is_none_or(|o| o.contains(&key(c)));
        let gained: Vec<ClusterView> = mine
            .iter()
            .filter(|c| !self.owned.contains(&key(c)) && was_opted_in(c))
            .cloned()
            .collect();
        let released: Vec<ClusterView> = theirs
            .iter()
            .filter(|c| self.owned.contains(&key(c)))
            .cloned()
            .collect();
        if gained.is_empty() && released.is_empty() {
            return;
        }
        metrics.shard_handovers(Direction::Gained, gained.len());
        metrics.shard_handovers(Direction::Released, released.len());
        let mut events = Vec::new();
        for cluster in &gained {
            tracing::info!(cluster = %key(cluster), replica = %view.me, direction = "gained", members = %view.members_text(), "shard hand-over");
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
            tracing::info!(cluster = %key(cluster), replica = %view.me, to, fenced = view.fenced, direction = "released", "shard hand-over");
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

    /// Reads the Secrets that are due (see the module's documentation) and records what they
    /// gave; returns the served Clusters to start a worker for (new, or Secrets changed).
    async fn read_due(
        &mut self,
        mine: &[ClusterView],
        theirs: &[ClusterView],
        now: Instant,
    ) -> BTreeMap<String, (ClusterView, Credentials)> {
        use futures::StreamExt;
        let due = |cluster: &ClusterView, own: bool| {
            let k = key(cluster);
            match self.known.get(&k) {
                None => true,
                Some(known) => {
                    known.view != *cluster
                        || known.own.is_some() != own
                        || now >= known.due
                        || (own && !self.running.contains_key(&k))
                }
            }
        };
        let own_due: Vec<ClusterView> = mine.iter().filter(|c| due(c, true)).cloned().collect();
        // CAs of Clusters another replica serves matter only while this one serves some.
        let others_due: Vec<ClusterView> = if mine.is_empty() {
            Vec::new()
        } else {
            theirs.iter().filter(|c| due(c, false)).cloned().collect()
        };
        let this = &*self;
        let own_reads: Vec<(ClusterView, OwnRead)> = futures::stream::iter(own_due)
            .map(|cluster| async move {
                let running = this.running.get(&key(&cluster)).map(|r| r.digest);
                let read = this.read_own(&cluster, running).await;
                (cluster, read)
            })
            .buffer_unordered(SECRET_READS_AT_ONCE)
            .collect()
            .await;
        let other_reads: Vec<(ClusterView, Option<[u8; 32]>)> = futures::stream::iter(others_due)
            .map(|cluster| async move {
                let fingerprint = this.read_ca_fingerprint(&cluster).await;
                (cluster, fingerprint)
            })
            .buffer_unordered(SECRET_READS_AT_ONCE)
            .collect()
            .await;

        let settings = &self.shared.settings;
        let mut fresh = BTreeMap::new();
        for (cluster, read) in own_reads {
            let k = key(&cluster);
            let previous = self.known.get(&k).and_then(|known| known.ca_fingerprint);
            let (ca_fingerprint, own, due) = match read {
                OwnRead::Unchanged { digest } => (
                    previous,
                    Ok(digest),
                    next_read(now, settings.secret_resync, &cluster.uid),
                ),
                OwnRead::Fresh {
                    credentials,
                    ca_fingerprint,
                } => {
                    let digest = credentials.digest;
                    fresh.insert(k.clone(), (cluster.clone(), credentials));
                    (
                        ca_fingerprint,
                        Ok(digest),
                        next_read(now, settings.secret_resync, &cluster.uid),
                    )
                }
                OwnRead::Invalid { why, ca_fingerprint } => (ca_fingerprint, Err(why), now + settings.resync),
            };
            self.known.insert(
                k,
                Known {
                    view: cluster,
                    due,
                    ca_fingerprint,
                    own: Some(own),
                },
            );
        }
        for (cluster, ca_fingerprint) in other_reads {
            let due = next_read(now, settings.secret_resync, &cluster.uid);
            self.known.insert(
                key(&cluster),
                Known {
                    view: cluster,
                    due,
                    ca_fingerprint,
                    own: None,
                },
            );
        }
        fresh
    }

    /// A Secret's data, or why it cannot be had.
    async fn secret(
        &self,
        cluster: &ClusterView,
        name: &str,
    ) -> Result<std::collections::BTreeMap<String, k8s_openapi::ByteString>, String> {
        self.shared
            .management
            .secret(&cluster.namespace, name)
            .await
            .map_err(|e| format!("cannot read Secret {name}: {e}"))?
            .ok_or_else(|| format!("Secret {name} is missing"))
    }

    /// The fingerprint of the CA certificate in `<cluster>-ca`, `None` when there is none.
    async fn read_ca_fingerprint(&self, cluster: &ClusterView) -> Option<[u8; 32]> {
        let data = self.secret(cluster, &format!("{}-ca", cluster.name)).await.ok()?;
        ClusterCa::certificate_fingerprint(&data.get("tls.crt")?.0).ok()
    }

    /// Reads a served Cluster's `<cluster>-kubeconfig` and `<cluster>-ca`; parses them and
    /// builds a client only when they differ from what the running worker (`running`, its
    /// digest) was started on.
    async fn read_own(&self, cluster: &ClusterView, running: Option<[u8; 32]>) -> OwnRead {
        let kubeconfig_name = format!("{}-kubeconfig", cluster.name);
        let ca_name = format!("{}-ca", cluster.name);
        let (kubeconfig, ca_data) =
            tokio::join!(self.secret(cluster, &kubeconfig_name), self.secret(cluster, &ca_name));
        let field = |data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>, name: &str| {
            Zeroizing::new(data.get(name).map(|b| b.0.clone()).unwrap_or_default())
        };
        let ca_data = ca_data.unwrap_or_default();
        let (ca_cert, ca_key) = (field(&ca_data, "tls.crt"), field(&ca_data, "tls.key"));
        let ca_fingerprint = ClusterCa::certificate_fingerprint(&ca_cert).ok();
        let kubeconfig = match kubeconfig {
            Ok(data) => match data.get("value") {
                Some(value) => Zeroizing::new(value.0.clone()),
                None => {
                    return OwnRead::Invalid {
                        why: format!("Secret {kubeconfig_name} (key value) is missing"),
                        ca_fingerprint,
                    };
                }
            },
            Err(why) => return OwnRead::Invalid { why, ca_fingerprint },
        };
        let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        for part in [kubeconfig.as_slice(), &ca_cert, &ca_key] {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let mut digest = [0u8; 32];
        digest.copy_from_slice(hasher.finish().as_ref());
        if running == Some(digest) {
            return OwnRead::Unchanged { digest };
        }
        let ca = match (ca_cert.is_empty(), ca_key.is_empty()) {
            (true, _) | (_, true) => Err(format!(
                "Secret {ca_name} (keys tls.crt, tls.key) is missing or incomplete"
            )),
            _ => ClusterCa::from_pem(&ca_cert, &ca_key)
                .map(Arc::new)
                .map_err(|e| format!("Secret {ca_name}: {e}")),
        };
        match self.client(&kubeconfig_name, &kubeconfig).await {
            Ok(client) => OwnRead::Fresh {
                credentials: Credentials { client, ca, digest },
                ca_fingerprint,
            },
            Err(why) => OwnRead::Invalid { why, ca_fingerprint },
        }
    }

    /// A client for the workload cluster from its kubeconfig.
    async fn client(&self, secret_name: &str, kubeconfig: &[u8]) -> Result<Client, String> {
        let text = std::str::from_utf8(kubeconfig).map_err(|_| format!("Secret {secret_name}: not UTF-8"))?;
        let parsed = Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {secret_name}: {e}"))?;
        let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("Secret {secret_name}: {e}"))?;
        config.connect_timeout = Some(self.shared.settings.request_timeout);
        crate::controller::client::build(config).map_err(|e| format!("Secret {secret_name}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_reads_spread_over_the_last_quarter_of_the_period() {
        let now = Instant::now();
        let period = Duration::from_secs(300);
        let delays: Vec<Duration> = (0..1000)
            .map(|i| next_read(now, period, &format!("uid-{i}")) - now)
            .collect();
        assert!(delays.iter().all(|d| *d >= period.mul_f64(0.75) && *d <= period));
        let early = delays.iter().filter(|d| **d < period.mul_f64(0.875)).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 in the first half of the spread"
        );
        assert_eq!(
            next_read(now, period, "a"),
            next_read(now, period, "a"),
            "the same on every pass"
        );
    }
}
