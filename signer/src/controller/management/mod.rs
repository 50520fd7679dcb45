//! The management cluster: a watch cache of Clusters, the Machines, MachinePools and
//! KubeadmConfigs of the Clusters this replica serves (kept as the rule engine's views, not as
//! raw objects: [`store`]), fresh reads for the re-check before signing, the claim
//! write, and Secrets by name.
//!
//! One watch per kind ([`feed`], from the current resourceVersion, never listing
//! the fleet) carries the whole fleet's changes; what belongs to Clusters served elsewhere is
//! dropped as it arrives, so a replica's memory follows its shard. A Cluster gained is listed
//! from its namespace (a paged, consistent LIST per kind, one at a time per namespace for all
//! the Clusters gained there: [`fill`]) before the worker decides anything for it.
//!
//! - [`feed`]: the watches; [`fill`]: listing gained Clusters; [`store`]: the served Clusters'
//!   views (pure); [`view_page`] and [`lean`]: reading LIST pages and objects without their
//!   managed fields; [`fresh`]: reads that confirm the cache before a final denial;
//!   [`claim_write`]: the claim and a join's re-read of its Cluster; [`templates`]: the
//!   templates naming join tokens, read to confirm a token's retirement.
//!
//! This room owns every request to the management cluster but the Leases (the fleet's
//! membership) and Events. It answers what the cache holds and writes claims; it never decides a
//! CSR, never talks to a workload cluster, and does not choose which Clusters are served: the
//! fleet tells it ([`Management::serve`]).

pub mod claim_write;
pub mod feed;
pub mod fill;
pub mod fresh;
pub mod lean;
pub mod store;
pub mod templates;
pub mod view_page;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result};
use attestation::machine::{
    ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView, ObjectError, TargetKind, TargetRef,
};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};

use self::feed::FeedTarget;
use self::store::{Kind, Listed, ShardStore};
use self::view_page::for_each_selected_page;
use crate::controller::backoff::Backoff;
use crate::locks::{read, write};
use attestation::names::LABEL_CLUSTER_NAME;

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

pub(super) fn key_of(object: &DynamicObject) -> String {
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
            match watched_view(object, view) {
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

/// A watched object's view. The whole object (every field the API server sent: the watch is
/// not a metadata-only one) is what the view reads, so a field the view needs, such as a
/// Cluster's `spec.paused` or its pause annotation, is never left out on the way.
fn watched_view<V>(object: &DynamicObject, view: fn(&Value) -> Result<V, ObjectError>) -> Result<V, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    view(&value).map_err(|e| e.to_string())
}

/// Which served version of a group the signer reads.
async fn served(client: &Client, group: &str, kind: &str, plural: &str) -> Option<ApiResource> {
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

/// Which versions of the Cluster API resources the management cluster serves (MachinePools and
/// KubeadmConfigs may not be installed).
pub(crate) struct CapiResources {
    pub clusters: ApiResource,
    pub machines: ApiResource,
    pub pools: Option<ApiResource>,
    pub configs: Option<ApiResource>,
}

impl CapiResources {
    /// Probes each resource; Clusters and Machines must be there.
    pub async fn discover(client: &Client) -> Result<Self> {
        Ok(Self {
            clusters: served(client, "cluster.x-k8s.io", "Cluster", "clusters")
                .await
                .context("the Cluster API CRDs (clusters.cluster.x-k8s.io) are not installed")?,
            machines: served(client, "cluster.x-k8s.io", "Machine", "machines")
                .await
                .context("machines.cluster.x-k8s.io is not installed")?,
            pools: served(client, "cluster.x-k8s.io", "MachinePool", "machinepools").await,
            configs: served(client, "bootstrap.cluster.x-k8s.io", "KubeadmConfig", "kubeadmconfigs").await,
        })
    }
}

/// The management cluster.
pub struct Management {
    client: Client,
    /// Opted-in or not, every Cluster.
    pub clusters: Arc<ViewCache<ClusterView>>,
    /// The served Clusters' Machines, MachinePools and KubeadmConfigs.
    pub(super) shard: RwLock<ShardStore>,
    /// Whether each kind's feed has its starting version (by [`Kind::ALL`]).
    watched: [AtomicBool; 3],
    /// Bounds the namespace LISTs of Clusters gained at once.
    fills: Arc<Semaphore>,
    /// The namespaces being listed, and what waits for each one's next list ([`fill`]).
    namespace_fills: fill::NamespaceFills,
    /// A gained Cluster's objects were listed (or a regain emptied them): its state moved
    /// between `Listing` and the worker's own, which the fleet reports at once.
    pub listed_changed: Notify,
    cluster_resource: ApiResource,
    machine_resource: ApiResource,
    pool_resource: Option<ApiResource>,
    config_resource: Option<ApiResource>,
    /// The last fresh read of each Cluster with recent denials.
    fresh: fresh::FreshReads,
    /// Whether a join's Cluster re-read may come from the apiserver's watch cache
    /// ([`claim_write`]); cleared for good the first time that read is refused or slow.
    cluster_reads_from_cache: AtomicBool,
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
        let CapiResources {
            clusters: cluster_resource,
            machines: machine_resource,
            pools: pool_resource,
            configs: config_resource,
        } = CapiResources::discover(&client).await?;
        tracing::info!(
            machines = %machine_resource.api_version,
            machine_pools = pool_resource.as_ref().map(|r| r.api_version.as_str()).unwrap_or("not installed"),
            kubeadm_configs = config_resource.as_ref().map(|r| r.api_version.as_str()).unwrap_or("not installed"),
            "reading Cluster API objects"
        );
        let management = Arc::new(Self {
            clusters: spawn_cache(api(&cluster_resource), ClusterView::from_object, "Clusters"),
            cluster_resource,
            shard: RwLock::new(ShardStore::default()),
            watched: [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)],
            fills: Arc::new(Semaphore::new(fill::FILLS_AT_ONCE)),
            namespace_fills: fill::NamespaceFills::default(),
            listed_changed: Notify::new(),
            machine_resource,
            pool_resource,
            config_resource,
            fresh: fresh::FreshReads::default(),
            cluster_reads_from_cache: AtomicBool::new(true),
            client: client.clone(),
        });
        for kind in Kind::ALL {
            let resource = match kind {
                Kind::Machine => Some(&management.machine_resource),
                Kind::MachinePool => management.pool_resource.as_ref(),
                Kind::KubeadmConfig => management.config_resource.as_ref(),
            };
            match resource {
                Some(r) => feed::spawn(api(r), kind, Arc::clone(&management)),
                None => management.feed_started(kind),
            }
        }
        // Serving before the watches have their starting versions would miss the changes made
        // in between.
        let mut waited = 0u32;
        while !management.synced() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            waited += 1;
            if waited.is_multiple_of(100) {
                tracing::warn!(
                    "still waiting for the Cluster cache and the Cluster API watches of the management cluster to start"
                );
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

    /// True once the Cluster cache and every kind's watch have listed.
    pub fn synced(&self) -> bool {
        self.clusters.synced() && self.watched.iter().all(|w| w.load(Ordering::Relaxed))
    }

    /// Serves exactly `mine`: drops the objects of Clusters no longer among them, and lists
    /// those of the Clusters new among them (in the background: they are decided once listed).
    pub fn serve(self: &Arc<Self>, mine: &[ClusterView]) {
        let wanted: Vec<(String, String)> = mine.iter().map(|c| (c.namespace.clone(), c.name.clone())).collect();
        let served = write(&self.shard).serve(&wanted);
        for key in &served.released {
            tracing::debug!(cluster = %key, "dropped the Cluster API objects of a Cluster no longer served");
        }
        self.spawn_fills(served);
    }

    /// The Cluster's Machines, MachinePools and KubeadmConfigs, once listed (`None` before:
    /// decide nothing for it yet).
    pub fn inventory(&self, cluster: &ClusterView) -> Option<Arc<Inventory>> {
        read(&self.shard).inventory(&cluster.namespace, &cluster.name)
    }

    /// The Cluster's Machines, MachinePools and KubeadmConfigs read from the apiserver (not the
    /// cache) at or after `not_before`, to confirm a final denial ([`fresh`]).
    pub async fn fresh_inventory(
        &self,
        cluster: &ClusterView,
        not_before: time::OffsetDateTime,
    ) -> Result<fresh::FreshRead, ApplyError> {
        self.fresh
            .at_least_as_new(&cluster.key(), not_before, self.read_inventory(cluster))
            .await
            .map_err(ApplyError::from_kube)
    }

    /// Reads the Cluster's objects from its namespace, page by page, as the fills do, selecting
    /// them by the `cluster.x-k8s.io/cluster-name` label Cluster API's defaulting webhooks set
    /// on every Machine and MachinePool (`internal/webhooks/machine.go`,
    /// `exp/internal/webhooks/machinepool.go`, `Default`) and its controllers on the
    /// KubeadmConfigs they create: a read costs this Cluster's objects, not the namespace's
    /// (SPEC section 7, "A hostile workload cluster"). Objects without the label (created with
    /// no webhook in the way, and KubeadmConfigs any Cluster of the namespace may read) are read
    /// too, as the cache keeps them: in a namespace Cluster API manages, that list is empty.
    async fn read_inventory(&self, cluster: &ClusterView) -> Result<Inventory, kube::Error> {
        let ours = |name: &Arc<str>| **name == *cluster.name;
        let labeled = format!("{LABEL_CLUSTER_NAME}={}", cluster.name);
        let unlabeled = format!("!{LABEL_CLUSTER_NAME}");
        let selectors = [labeled.as_str(), unlabeled.as_str()];
        let mut inventory = Inventory::default();
        for selector in selectors {
            for_each_selected_page(
                &self.client,
                &self.machine_resource,
                &cluster.namespace,
                Some(selector),
                |page: Vec<Listed<MachineView>>| {
                    let page = page.into_iter().filter(|(_, m)| ours(&m.cluster_name));
                    inventory.machines.extend(page.map(|(_, m)| Arc::new(m)));
                    true
                },
            )
            .await?;
            if let Some(resource) = &self.pool_resource {
                for_each_selected_page(
                    &self.client,
                    resource,
                    &cluster.namespace,
                    Some(selector),
                    |page: Vec<Listed<MachinePoolView>>| {
                        let page = page.into_iter().filter(|(_, p)| ours(&p.cluster_name));
                        inventory.pools.extend(page.map(|(_, p)| Arc::new(p)));
                        true
                    },
                )
                .await?;
            }
            if let Some(resource) = &self.config_resource {
                for_each_selected_page(
                    &self.client,
                    resource,
                    &cluster.namespace,
                    Some(selector),
                    |page: Vec<Listed<KubeadmConfigView>>| {
                        // Labeled for this Cluster, or unlabeled (the namespace's), as the cache keeps them.
                        let page = page
                            .into_iter()
                            .filter(|(_, k)| k.cluster_name.as_ref().is_none_or(ours));
                        inventory.kubeadm_configs.extend(page.map(|(_, k)| Arc::new(k)));
                        true
                    },
                )
                .await?;
            }
        }
        Ok(inventory)
    }

    /// The templates of the Cluster's namespace that name join tokens, read now (a join token's
    /// retirement is confirmed on them: [`templates`]).
    pub async fn token_templates(
        &self,
        cluster: &ClusterView,
    ) -> Result<Vec<attestation::join_tokens::TemplateToken>, ApplyError> {
        templates::token_templates(&self.client, &cluster.namespace)
            .await
            .map_err(ApplyError::from_kube)
    }

    /// The templates of `namespace` whose nodes would run kubelet-authenticator, read now
    /// ([`templates::plugin_templates`]).
    pub async fn plugin_templates(&self, namespace: &str) -> Result<Vec<templates::PluginTemplate>, ApplyError> {
        templates::plugin_templates(&self.client, namespace)
            .await
            .map_err(ApplyError::from_kube)
    }

    /// Whether the Cluster's objects are listed.
    pub fn listed(&self, cluster: &ClusterView) -> bool {
        read(&self.shard).listed(&cluster.namespace, &cluster.name)
    }

    /// Objects kept, by [`Kind::ALL`].
    pub fn cached(&self) -> [usize; 3] {
        read(&self.shard).counts()
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

impl feed::FeedTarget for Management {
    fn store(&self) -> &RwLock<ShardStore> {
        &self.shard
    }

    /// `kind`'s feed watches from its starting version (or `kind` is not installed).
    fn feed_started(&self, kind: Kind) {
        self.watched[kind_index(kind)].store(true, Ordering::Relaxed);
    }

    /// After a feed lost its place: every served Cluster is emptied and listed again.
    fn regain(self: Arc<Self>) {
        let served = write(&self.shard).regain();
        self.listed_changed.notify_one();
        self.spawn_fills(served);
    }
}

/// `kind`'s place in [`Kind::ALL`].
fn kind_index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_cache_keeps_what_pauses_a_cluster_in_either_version() {
        let watched = |object: Value| -> ClusterView {
            let object: DynamicObject = serde_json::from_value(object).unwrap();
            watched_view(&object, ClusterView::from_object).unwrap()
        };
        let meta = |annotations: Value| {
            serde_json::json!({"name": "prod", "namespace": "team-a", "uid": "u", "annotations": annotations,
                "managedFields": [{"manager": "clusterctl", "fieldsV1": {"f:spec": {"f:paused": {}}}}]})
        };
        let opted_in = serde_json::json!({"cluster.x-k8s.io/kubelet-authentication": "true"});
        let v1beta1 = watched(
            serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": meta(opted_in.clone()), "spec": {"paused": true, "controlPlaneEndpoint": {"host": "h", "port": 6443}}}),
        );
        assert_eq!(v1beta1.paused, Some(attestation::machine::Paused::Spec));
        let v1beta2 = watched(
            serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": meta(serde_json::json!({"cluster.x-k8s.io/kubelet-authentication": "true", "cluster.x-k8s.io/paused": ""})),
            "spec": {}}),
        );
        assert_eq!(v1beta2.paused, Some(attestation::machine::Paused::Annotation));
        assert!(v1beta2.opted_in);
        let running = watched(
            serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": meta(opted_in), "spec": {"paused": false}}),
        );
        assert_eq!(running.paused, None);
    }
}
