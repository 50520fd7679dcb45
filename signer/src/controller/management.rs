//! The management cluster: watch caches of Clusters, Machines, MachinePools and KubeadmConfigs
//! (kept as the rule engine's views, not as raw objects), fresh reads for the re-check before
//! signing, the claim write, and Secrets by name.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};
use attestation::claim::{ClaimState, ClaimWrite};
use attestation::machine::{
    ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView, ObjectError, TargetKind, TargetRef,
};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Notify;

/// A watch cache holding one view per object, keyed by `namespace/name`.
pub struct ViewCache<V> {
    views: RwLock<HashMap<String, Arc<V>>>,
    synced: RwLock<bool>,
    changed: Notify,
}

impl<V: Clone> ViewCache<V> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            views: RwLock::new(HashMap::new()),
            synced: RwLock::new(false),
            changed: Notify::new(),
        })
    }

    /// Every view matching `keep`.
    pub fn select(&self, keep: impl Fn(&V) -> bool) -> Vec<V> {
        read(&self.views)
            .values()
            .filter(|v| keep(v))
            .map(|v| V::clone(v))
            .collect()
    }

    /// Every view matching `keep`, shared with the cache (no copy).
    pub fn select_shared(&self, keep: impl Fn(&V) -> bool) -> Vec<Arc<V>> {
        read(&self.views).values().filter(|v| keep(v)).cloned().collect()
    }

    /// The view of `namespace/name`.
    pub fn get(&self, key: &str) -> Option<V> {
        read(&self.views).get(key).map(|v| V::clone(v))
    }

    /// True once the first list completed.
    pub fn synced(&self) -> bool {
        *read(&self.synced)
    }

    /// Resolves at the next change.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn key_of(object: &DynamicObject) -> String {
    format!(
        "{}/{}",
        object.metadata.namespace.as_deref().unwrap_or_default(),
        object.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Feeds `cache` from a watch of `api` until the process ends. Objects that do not read as a
/// view are logged and left out: a malformed Machine must not stop the signer.
fn spawn_cache<V>(
    api: Api<DynamicObject>,
    view: fn(&Value) -> Result<V, ObjectError>,
    what: &'static str,
) -> Arc<ViewCache<V>>
where
    V: Clone + Send + Sync + 'static,
{
    let cache = ViewCache::new();
    let feed = Arc::clone(&cache);
    tokio::spawn(async move {
        let to_view = |object: &DynamicObject| -> Option<V> {
            let value = serde_json::to_value(object).ok()?;
            match view(&value) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(object = %key_of(object), error = %e, "ignoring unreadable {what}");
                    None
                }
            }
        };
        let mut buffer: Option<HashMap<String, Arc<V>>> = None;
        let mut events = watcher(api, watcher::Config::default()).boxed();
        let mut backoff = Backoff::default();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(object)) => {
                    if let (Some(buffer), Some(v)) = (buffer.as_mut(), to_view(&object)) {
                        buffer.insert(key_of(&object), Arc::new(v));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(buffer) = buffer.take() {
                        *write(&feed.views) = buffer;
                    }
                    *write(&feed.synced) = true;
                    backoff.reset();
                    feed.changed.notify_waiters();
                }
                Ok(watcher::Event::Apply(object)) => {
                    let key = key_of(&object);
                    match to_view(&object) {
                        Some(v) => write(&feed.views).insert(key, Arc::new(v)),
                        None => write(&feed.views).remove(&key),
                    };
                    feed.changed.notify_waiters();
                }
                Ok(watcher::Event::Delete(object)) => {
                    write(&feed.views).remove(&key_of(&object));
                    feed.changed.notify_waiters();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watch of {what} in the management cluster failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    });
    cache
}

/// Exponential backoff, 250 ms doubling to 30 s.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The delay after the `failures`-th consecutive failure.
    pub fn delay(failures: u32) -> std::time::Duration {
        let ms = 250u64.saturating_mul(1u64 << failures.min(7));
        std::time::Duration::from_millis(ms.min(30_000))
    }

    /// Sleeps for the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(Self::delay(self.failures)).await;
        self.failures = self.failures.saturating_add(1);
    }

    /// Back to the shortest delay.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Which served version of a group the signer reads.
pub(crate) async fn served(client: &Client, group: &str, kind: &str, plural: &str) -> Option<ApiResource> {
    for version in ["v1beta2", "v1beta1"] {
        let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list_metadata(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => return Some(resource),
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => {
                // Forbidden or unreachable: use v1beta2 and let the watch report it.
                tracing::warn!(error = %e, "cannot probe {plural}.{group}/{version}; assuming it is served");
                return Some(resource);
            }
        }
    }
    None
}

/// The management cluster.
pub struct Management {
    client: Client,
    /// Opted-in or not, every Cluster.
    pub clusters: Arc<ViewCache<ClusterView>>,
    machines: Arc<ViewCache<MachineView>>,
    pools: Arc<ViewCache<MachinePoolView>>,
    configs: Arc<ViewCache<KubeadmConfigView>>,
    machine_resource: ApiResource,
    pool_resource: Option<ApiResource>,
}

impl Management {
    /// Starts the watches, in `namespace` or in all namespaces.
    pub async fn start(client: Client, namespace: Option<String>) -> Result<Arc<Self>> {
        let api = |resource: &ApiResource| -> Api<DynamicObject> {
            match &namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            }
        };
        let cluster_resource = served(&client, "cluster.x-k8s.io", "Cluster", "clusters")
            .await
            .context("the Cluster API CRDs (clusters.cluster.x-k8s.io) are not installed")?;
        let machine_resource = served(&client, "cluster.x-k8s.io", "Machine", "machines")
            .await
            .context("machines.cluster.x-k8s.io is not installed")?;
        let pool_resource = served(&client, "cluster.x-k8s.io", "MachinePool", "machinepools").await;
        let config_resource = served(&client, "bootstrap.cluster.x-k8s.io", "KubeadmConfig", "kubeadmconfigs").await;
        tracing::info!(
            machines = %machine_resource.api_version,
            machine_pools = pool_resource.as_ref().map(|r| r.api_version.as_str()).unwrap_or("not installed"),
            kubeadm_configs = config_resource.as_ref().map(|r| r.api_version.as_str()).unwrap_or("not installed"),
            "reading Cluster API objects"
        );
        let pools = match &pool_resource {
            Some(r) => spawn_cache(api(r), MachinePoolView::from_object, "MachinePools"),
            None => ready_empty(),
        };
        let configs = match &config_resource {
            Some(r) => spawn_cache(api(r), KubeadmConfigView::from_object, "KubeadmConfigs"),
            None => ready_empty(),
        };
        let management = Arc::new(Self {
            clusters: spawn_cache(api(&cluster_resource), ClusterView::from_object, "Clusters"),
            machines: spawn_cache(api(&machine_resource), MachineView::from_object, "Machines"),
            pools,
            configs,
            machine_resource,
            pool_resource,
            client,
        });
        // Deciding on half-listed caches would deny CSRs whose Machine was simply not listed yet.
        let mut waited = 0u32;
        while !management.synced() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            waited += 1;
            if waited.is_multiple_of(100) {
                tracing::warn!("still listing Cluster API objects in the management cluster");
            }
        }
        Ok(management)
    }

    /// `apiVersion` of the Machines read.
    pub fn machine_api_version(&self) -> String {
        self.machine_resource.api_version.clone()
    }

    /// `apiVersion` of the MachinePools read.
    pub fn pool_api_version(&self) -> String {
        self.pool_resource
            .as_ref()
            .map_or_else(|| "cluster.x-k8s.io/v1beta2".to_owned(), |r| r.api_version.clone())
    }

    /// True once every watch has listed.
    pub fn synced(&self) -> bool {
        self.clusters.synced() && self.machines.synced() && self.pools.synced() && self.configs.synced()
    }

    /// The Cluster's Machines, MachinePools and KubeadmConfigs, from the caches.
    pub fn inventory(&self, cluster: &ClusterView) -> Inventory {
        let ours = |ns: &str, name: &str| ns == cluster.namespace && name == cluster.name;
        Inventory {
            machines: self.machines.select_shared(|m| ours(&m.namespace, &m.cluster_name)),
            pools: self.pools.select_shared(|p| ours(&p.namespace, &p.cluster_name)),
            kubeadm_configs: self.configs.select_shared(|c| c.namespace == cluster.namespace),
        }
    }

    fn api_for(&self, target: &TargetRef) -> Result<Api<DynamicObject>, ApplyError> {
        let resource = match target.kind {
            TargetKind::Machine => &self.machine_resource,
            TargetKind::MachinePool => self.pool_resource.as_ref().ok_or(ApplyError::Transient(
                "machinepools.cluster.x-k8s.io is not installed".into(),
            ))?,
        };
        Ok(Api::namespaced_with(self.client.clone(), &target.namespace, resource))
    }

    /// Writes a claim: a merge patch of one annotation carrying the decision's resourceVersion,
    /// so the API server refuses it (409) if the object changed since the decision.
    pub async fn write_claim(&self, claim: &ClaimWrite) -> Result<(), ApplyError> {
        let Some(resource_version) = &claim.resource_version else {
            return Err(ApplyError::Transient(
                "the decision carries no resourceVersion to write the claim under".into(),
            ));
        };
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { claim.annotation: claim.value },
            }
        });
        self.api_for(&claim.target)?
            .patch(&claim.target.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(ApplyError::from_kube)
    }

    /// The claim on `target` for `provider_id`, read from the API server, not the cache: the
    /// re-check just before a certificate is written.
    pub async fn fresh_claim(&self, target: &TargetRef, provider_id: &str) -> Result<ClaimState, ApplyError> {
        let object = self
            .api_for(target)?
            .get(&target.name)
            .await
            .map_err(ApplyError::from_kube)?;
        if object.metadata.uid.as_deref() != Some(target.uid.as_str()) {
            return Ok(ClaimState::Unreadable(format!(
                "{} was replaced by another object of the same name",
                target.name
            )));
        }
        let value = serde_json::to_value(&object).map_err(|e| ApplyError::Transient(e.to_string()))?;
        Ok(match target.kind {
            TargetKind::Machine => MachineView::from_object(&value)
                .map(|m| m.claim)
                .unwrap_or_else(|e| ClaimState::Unreadable(e.to_string())),
            TargetKind::MachinePool => MachinePoolView::from_object(&value)
                .map(|p| p.claims.instance(provider_id))
                .unwrap_or_else(|e| ClaimState::Unreadable(e.to_string())),
        })
    }

    /// A Secret's data (one GET for every key), `None` when the Secret is absent.
    pub async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<std::collections::BTreeMap<String, k8s_openapi::ByteString>>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?.map(|s| s.data.unwrap_or_default()))
    }
}

fn ready_empty<V: Clone>() -> Arc<ViewCache<V>> {
    let cache = ViewCache::new();
    *write(&cache.synced) = true;
    cache
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The object changed since the decision (409): decide again on fresh state.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The object is gone (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The apiserver is overloaded or did not answer (429, 5xx, timeout, connection):
    /// retried with backoff, and the fleet keeps fewer CSRs in flight.
    #[error("{0}")]
    Overloaded(String),
    /// Anything else: retried with backoff.
    #[error("{0}")]
    Transient(String),
}

impl ApplyError {
    /// Sorts a client error.
    pub fn from_kube(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if status.code == 409 => Self::Conflict(status.message),
            kube::Error::Api(status) if status.code == 404 => Self::NotFound(status.message),
            kube::Error::Api(ref status) if status.code == 429 || status.code >= 500 => {
                Self::Overloaded(error.to_string())
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) => Self::Overloaded(error.to_string()),
            other => Self::Transient(other.to_string()),
        }
    }

    /// True for answers that say "fewer at once".
    pub fn is_overload(&self) -> bool {
        matches!(self, Self::Overloaded(_))
    }
}
