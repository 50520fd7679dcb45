//! The fleet: which workload clusters are served, and by which worker.
//!
//! On every Cluster change and every resync it reads each opted-in Cluster's
//! `<cluster>-kubeconfig` and `<cluster>-ca`, refuses Clusters whose CA certificate is another
//! opted-in Cluster's, and starts, restarts (Secrets rotated) or stops workers. A Cluster whose
//! Secrets are missing or broken, or whose apiserver is down, holds back only itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use attestation::ca::ClusterCa;
use attestation::machine::ClusterView;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::EventType;
use tokio::task::JoinHandle;
use zeroize::Zeroizing;

use super::metrics::ClusterState;
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
    running: HashMap<String, Running>,
    problems: HashMap<String, (ClusterState, String)>,
}

fn key(cluster: &ClusterView) -> String {
    format!("{}/{}", cluster.namespace, cluster.name)
}

impl Fleet {
    /// An empty fleet.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            running: HashMap::new(),
            problems: HashMap::new(),
        }
    }

    /// Runs forever: reconciles on every Cluster change and every resync period.
    pub async fn run(mut self) {
        let clusters = Arc::clone(&self.shared.management.clusters);
        loop {
            self.reconcile().await;
            tokio::select! {
                () = clusters.changed() => {}
                () = tokio::time::sleep(self.shared.settings.resync) => {}
            }
        }
    }

    async fn reconcile(&mut self) {
        let before: Vec<String> = self.problems.keys().chain(self.running.keys()).cloned().collect();
        let opted_in = self.shared.management.clusters.select(|c| c.opted_in);
        let mut loaded: BTreeMap<String, (ClusterView, Credentials)> = BTreeMap::new();
        let mut problems: HashMap<String, (ClusterState, String)> = HashMap::new();
        for cluster in opted_in {
            match self.credentials(&cluster).await {
                Ok(credentials) => {
                    loaded.insert(key(&cluster), (cluster, credentials));
                }
                Err(why) => {
                    problems.insert(key(&cluster), (ClusterState::SecretsInvalid, why));
                }
            }
        }
        // Two Clusters with one CA: a certificate for either works in both. Refuse both.
        let mut by_ca: HashMap<[u8; 32], Vec<String>> = HashMap::new();
        for (k, (_, credentials)) in &loaded {
            if let Ok(ca) = &credentials.ca {
                by_ca.entry(ca.fingerprint()).or_default().push(k.clone());
            }
        }
        for sharing in by_ca.values().filter(|keys| keys.len() > 1) {
            for k in sharing {
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

    /// Reports cluster states to the metrics.
    pub fn report(&self) {
        let mut counts: Vec<(ClusterState, i64)> = self.problems.values().map(|(s, _)| (*s, 1)).collect();
        counts.extend(self.running.values().map(|r| (r.worker.state(), 1)));
        self.shared.metrics.cluster_states(&counts);
    }

    async fn credentials(&self, cluster: &ClusterView) -> Result<Credentials, String> {
        let management = &self.shared.management;
        let kubeconfig_name = format!("{}-kubeconfig", cluster.name);
        let ca_name = format!("{}-ca", cluster.name);
        let read = |name: String, field: &'static str| async move {
            management
                .secret_data(&cluster.namespace, &name, field)
                .await
                .map_err(|e| format!("cannot read Secret {name}: {e}"))?
                .ok_or_else(|| format!("Secret {name} (key {field}) is missing"))
        };
        let kubeconfig = Zeroizing::new(read(kubeconfig_name.clone(), "value").await?);
        let ca_cert = read(ca_name.clone(), "tls.crt").await.unwrap_or_default();
        let ca_key = Zeroizing::new(read(ca_name.clone(), "tls.key").await.unwrap_or_default());
        let ca = match (ca_cert.is_empty(), ca_key.is_empty()) {
            (true, _) | (_, true) => Err(format!(
                "Secret {ca_name} (keys tls.crt, tls.key) is missing or incomplete"
            )),
            _ => ClusterCa::from_pem(&ca_cert, &ca_key)
                .map(Arc::new)
                .map_err(|e| format!("Secret {ca_name}: {e}")),
        };
        let text = std::str::from_utf8(&kubeconfig).map_err(|_| format!("Secret {kubeconfig_name}: not UTF-8"))?;
        let parsed = Kubeconfig::from_yaml(text).map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
        let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
        config.connect_timeout = Some(self.shared.settings.request_timeout);
        let client = Client::try_from(config).map_err(|e| format!("Secret {kubeconfig_name}: {e}"))?;
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
