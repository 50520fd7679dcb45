//! The fleet: which workload clusters are served, and by which worker.
//!
//! On every Cluster change, every membership change and every resync it reads each opted-in
//! Cluster's `<cluster>-kubeconfig` and `<cluster>-ca`, refuses Clusters whose CA certificate is
//! another opted-in Cluster's, and starts, restarts (Secrets rotated) or stops workers. A Cluster
//! whose Secrets are missing or broken, or whose apiserver is down, holds back only itself.
//!
//! Sharded ([`Scope::Shard`]), it serves only the opted-in Clusters the shard assigns to this
//! replica ([`super::membership::View::owns`]), still compares CAs with every opted-in Cluster
//! (a shared CA is refused whichever replicas own the two), and logs, counts and records an
//! Event on the Cluster for each hand-over.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use attestation::ca::ClusterCa;
use attestation::machine::ClusterView;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zeroize::Zeroizing;

use super::membership::View;
use super::metrics::{ClusterState, Direction};
use super::workload::{Shared, Worker, cluster_reference, publish};

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

/// `<cluster>-ca` as read.
struct CaSecret {
    cert: Vec<u8>,
    key: Zeroizing<Vec<u8>>,
    ca: Result<Arc<ClusterCa>, String>,
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
        }
    }

    /// Runs forever: reconciles on every Cluster change, every membership change and every
    /// resync period.
    pub async fn run(mut self) {
        let clusters = Arc::clone(&self.shared.management.clusters);
        loop {
            self.reconcile().await;
            tokio::select! {
                () = clusters.changed() => {}
                () = self.scope.changed() => {}
                () = tokio::time::sleep(self.shared.settings.resync) => {}
            }
        }
    }

    #[tracing::instrument(skip_all)]
    async fn reconcile(&mut self) {
        let before: Vec<String> = self.problems.keys().chain(self.running.keys()).cloned().collect();
        let view = self.scope.view();
        let (mine, theirs): (Vec<ClusterView>, Vec<ClusterView>) = self
            .shared
            .management
            .clusters
            .select(|c| c.opted_in)
            .into_iter()
            .partition(|c| view.as_ref().is_none_or(|v| v.owns(&c.uid)));
        // Released Clusters stop before anything slow happens.
        let mine_keys: HashSet<String> = mine.iter().map(key).collect();
        self.running.retain(|k, _| mine_keys.contains(k));
        if let Some(view) = &view {
            self.hand_over(view, &mine, &theirs);
        }
        self.owned = mine_keys;
        self.opted_in = Some(mine.iter().chain(&theirs).map(key).collect());

        let mut loaded: BTreeMap<String, (ClusterView, Credentials)> = BTreeMap::new();
        let mut problems: HashMap<String, (ClusterState, String)> = HashMap::new();
        for cluster in mine {
            match self.credentials(&cluster).await {
                Ok(credentials) => {
                    loaded.insert(key(&cluster), (cluster, credentials));
                }
                Err(why) => {
                    problems.insert(key(&cluster), (ClusterState::SecretsInvalid, why));
                }
            }
        }
        // Two Clusters with one CA: a certificate for either works in both. Refuse both, even
        // when another replica serves the other one.
        let mut by_ca: HashMap<[u8; 32], Vec<String>> = HashMap::new();
        for (k, (_, credentials)) in &loaded {
            if let Ok(ca) = &credentials.ca {
                by_ca.entry(ca.fingerprint()).or_default().push(k.clone());
            }
        }
        if !loaded.is_empty() {
            for cluster in &theirs {
                if let Ok(ca) = self.ca(cluster).await.ca {
                    by_ca.entry(ca.fingerprint()).or_default().push(key(cluster));
                }
            }
        }
        for sharing in by_ca.values().filter(|keys| keys.len() > 1) {
            for k in sharing {
                if !loaded.contains_key(k) {
                    // Another replica's Cluster: that replica refuses it.
                    continue;
                }
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
            }
        }

        self.running.retain(|k, _| loaded.contains_key(k));
        for (k, (cluster, credentials)) in loaded {
            if self.running.get(&k).is_some_and(|r| r.digest == credentials.digest) {
                continue;
            }
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

    /// Reports cluster states to the metrics: this replica's Clusters only, so the sum over
    /// replicas is the fleet.
    pub fn report(&self) {
        let mut counts: Vec<(ClusterState, i64)> = self.problems.values().map(|(s, _)| (*s, 1)).collect();
        counts.extend(self.running.values().map(|r| (r.worker.state(), 1)));
        self.shared.metrics.cluster_states(&counts);
    }

    /// Logs, counts and records (in the background) the Clusters this replica gained and
    /// released since the last reconcile. The first reconcile's Clusters are gained (taken from
    /// whoever served them before); a Cluster opted in or out meanwhile is not a hand-over.
    fn hand_over(&self, view: &View, mine: &[ClusterView], theirs: &[ClusterView]) {
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
            let to = view.owner(&cluster.uid).unwrap_or("no live replica");
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

    /// A Cluster's `<cluster>-ca`: the certificate, the key, and the CA or why it is unusable.
    async fn ca(&self, cluster: &ClusterView) -> CaSecret {
        let ca_name = format!("{}-ca", cluster.name);
        let cert = self.secret(cluster, &ca_name, "tls.crt").await.unwrap_or_default();
        let key = Zeroizing::new(self.secret(cluster, &ca_name, "tls.key").await.unwrap_or_default());
        let ca = match (cert.is_empty(), key.is_empty()) {
            (true, _) | (_, true) => Err(format!(
                "Secret {ca_name} (keys tls.crt, tls.key) is missing or incomplete"
            )),
            _ => ClusterCa::from_pem(&cert, &key)
                .map(Arc::new)
                .map_err(|e| format!("Secret {ca_name}: {e}")),
        };
        CaSecret { cert, key, ca }
    }

    /// A key of one of the Cluster's Secrets.
    async fn secret(&self, cluster: &ClusterView, name: &str, field: &str) -> Result<Vec<u8>, String> {
        self.shared
            .management
            .secret_data(&cluster.namespace, name, field)
            .await
            .map_err(|e| format!("cannot read Secret {name}: {e}"))?
            .ok_or_else(|| format!("Secret {name} (key {field}) is missing"))
    }

    async fn credentials(&self, cluster: &ClusterView) -> Result<Credentials, String> {
        let kubeconfig_name = format!("{}-kubeconfig", cluster.name);
        let kubeconfig = Zeroizing::new(self.secret(cluster, &kubeconfig_name, "value").await?);
        let CaSecret {
            cert: ca_cert,
            key: ca_key,
            ca,
        } = self.ca(cluster).await;
        let text = std::str::from_utf8(&kubeconfig).map_err(|_| format!("Secret {kubeconfig_name}: not UTF-8"))?;
        let parsed = Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
        let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
        config.connect_timeout = Some(self.shared.settings.request_timeout);
        let client = super::client::build(config).map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
        let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        for part in [kubeconfig.as_slice(), &ca_cert, &ca_key] {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let mut digest = [0u8; 32];
        digest.copy_from_slice(hasher.finish().as_ref());
        Ok(Credentials { client, ca, digest })
    }
}
