//! The shard store's feed: one watch per kind (Machines, MachinePools, KubeadmConfigs) over the
//! whole management cluster, started at the current resourceVersion, without a first list.
//!
//! A kube-runtime watcher would first list every object of the fleet, and list it all again
//! whenever it lost its place: at a million Machines that is gigabytes of JSON per replica,
//! streamed and dropped (the objects of Clusters served elsewhere are not kept), and a replica
//! could not take its share before that list ended. The watch only has to carry the changes of
//! the Clusters this replica serves; what they held before is listed from their namespaces
//! when they are gained ([`super::store`], steps 1 to 3). So:
//!
//! 1. The feed reads the collection's current resourceVersion (a `LIST` of one item) and
//!    watches from there, with bookmarks, re-watching from the last version it saw whenever the
//!    watch ends.
//! 2. When the API server no longer has that version (410 Gone: the watch was down longer than
//!    its history), the changes in between are lost: the feed takes a new starting version and
//!    every served Cluster is gained again, empty, and listed
//!    ([`FeedTarget::regain`]); until then it decides nothing, as any Cluster
//!    being listed.

use std::sync::{Arc, RwLock};

use futures::TryStreamExt;
use kube::Api;
use kube::api::{DynamicObject, ListParams, WatchEvent, WatchParams};

use attestation::machine::{KubeadmConfigView, MachinePoolView, MachineView};
use attestation::names::LABEL_CLUSTER_NAME;

use super::lean::LeanObject;
use super::store::{Change, Kind, Object, ShardStore};
use crate::controller::backoff::Backoff;
use crate::locks::{read, write};

/// How long one watch request lasts before it is renewed from the last version seen.
const WATCH_SECONDS: u32 = 290;

/// Why a watch ended.
enum Ended {
    /// Renew it from the last version seen.
    Renew,
    /// That version is gone (410): start again from the current one and list what was missed.
    Expired,
}

/// Whom a feed serves: the store its changes go to, and who hears when it starts and when it
/// loses its place. The feed knows nothing else of the cache it fills.
pub trait FeedTarget: Send + Sync + 'static {
    /// The served Clusters' objects, which the watched changes update.
    fn store(&self) -> &RwLock<ShardStore>;
    /// `kind`'s feed watches from its starting version.
    fn feed_started(&self, kind: Kind);
    /// `kind`'s feed lost its place (410 Gone): every served Cluster must be listed again.
    fn regain(self: Arc<Self>);
}

/// Feeds `target`'s shard store from a watch of `api` until the process ends; marks `kind`
/// started once its first watch has its starting version.
pub fn spawn<T: FeedTarget>(api: Api<DynamicObject>, kind: Kind, target: Arc<T>) {
    tokio::spawn(async move {
        let mut backoff = Backoff::default();
        let mut first = true;
        loop {
            let mut version = match current_version(&api).await {
                Ok(version) => version,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the resourceVersion of {}s in the management cluster; retrying", kind.as_str());
                    backoff.wait().await;
                    continue;
                }
            };
            if first {
                target.feed_started(kind);
                first = false;
            } else {
                tracing::warn!(
                    "the watch of {}s lost its place (410 Gone): listing every served Cluster again",
                    kind.as_str()
                );
                Arc::clone(&target).regain();
            }
            loop {
                match watch_once(&api, kind, target.store(), &mut version).await {
                    Ok(Ended::Renew) => backoff.reset(),
                    Ok(Ended::Expired) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "watch of {}s in the management cluster failed; retrying", kind.as_str());
                        backoff.wait().await;
                    }
                }
            }
        }
    });
}

/// The collection's resourceVersion now: a consistent `LIST` of at most one object's metadata.
/// (An empty version would make the watch start with every object, the list this avoids.)
async fn current_version(api: &Api<DynamicObject>) -> Result<String, String> {
    let list = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|e| e.to_string())?;
    list.metadata
        .resource_version
        .filter(|v| !v.is_empty())
        .ok_or_else(|| "the LIST answered without a resourceVersion".to_owned())
}

/// One watch request from `version`, applying what it delivers and moving `version` along.
/// Its objects are read as [`LeanObject`]s: every claim the signer writes comes back here.
async fn watch_once(
    api: &Api<DynamicObject>,
    kind: Kind,
    shard: &RwLock<ShardStore>,
    version: &mut String,
) -> Result<Ended, kube::Error> {
    let params = WatchParams::default().timeout(WATCH_SECONDS);
    let mut request = kube::core::Request::new(api.resource_url())
        .watch(&params, version)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("watch");
    let stream = match api.clone().into_client().request_events::<LeanObject>(request).await {
        Ok(stream) => stream,
        Err(kube::Error::Api(e)) if e.code == 410 => return Ok(Ended::Expired),
        Err(e) => return Err(e),
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.try_next().await? {
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                advance(version, &object);
                apply_watched(shard, kind, &object);
            }
            WatchEvent::Deleted(object) => {
                advance(version, &object);
                write(shard).apply(change_of(kind, &object));
            }
            WatchEvent::Bookmark(bookmark) => *version = bookmark.metadata.resource_version,
            WatchEvent::Error(e) if e.code == 410 => return Ok(Ended::Expired),
            WatchEvent::Error(e) => return Err(kube::Error::Api(e)),
        }
    }
    Ok(Ended::Renew)
}

fn advance(version: &mut String, object: &LeanObject) {
    if let Some(seen) = object.resource_version() {
        seen.clone_into(version);
    }
}

/// An object of `kind` as the shard store takes it, without its view (`None`: deleted, or not
/// read yet): enough to tell whether it is wanted.
pub fn change_of(kind: Kind, object: &LeanObject) -> Change {
    let label = |name: &str| {
        object
            .0
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(|labels| labels.get(name))
            .and_then(serde_json::Value::as_str)
    };
    Change {
        kind,
        namespace: object.str_at("/metadata/namespace").unwrap_or_default().to_owned(),
        name: object.str_at("/metadata/name").unwrap_or_default().to_owned(),
        // A KubeadmConfig's spec has no Cluster: Cluster API labels it.
        cluster_name: match kind {
            Kind::KubeadmConfig => label(LABEL_CLUSTER_NAME),
            Kind::Machine | Kind::MachinePool => object.str_at("/spec/clusterName"),
        }
        .map(str::to_owned),
        resource_version: object.resource_version().and_then(|rv| rv.parse().ok()),
        view: None,
    }
}

/// The object's view; `None` (and a warning) when it does not read as one: the signer ignores
/// it, as if it were not there.
fn view_of(kind: Kind, object: &LeanObject) -> Option<Object> {
    let value = &object.0;
    let read = match kind {
        Kind::Machine => MachineView::from_object(value).map(Object::Machine),
        Kind::MachinePool => MachinePoolView::from_object(value).map(|p| Object::MachinePool(Box::new(p))),
        Kind::KubeadmConfig => KubeadmConfigView::from_object(value).map(Object::KubeadmConfig),
    };
    match read {
        Ok(view) => Some(view),
        Err(e) => {
            tracing::warn!(object = %object.key(), error = %e, "ignoring unreadable {}", kind.as_str());
            None
        }
    }
}

/// Applies a watched object: its view is read only when its Cluster is served (the rest of the
/// fleet costs a glance at its metadata and `spec.clusterName`), and outside the lock unless
/// the Cluster was gained in between.
fn apply_watched(shard: &RwLock<ShardStore>, kind: Kind, object: &LeanObject) {
    let mut change = change_of(kind, object);
    let wanted = read(shard).wants(&change);
    if wanted {
        change.view = view_of(kind, object);
    }
    let mut store = write(shard);
    if !wanted && store.wants(&change) {
        change.view = view_of(kind, object);
    }
    store.apply(change);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_object_carries_its_cluster_and_numeric_version() {
        let object: LeanObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "42"},
            "spec": {"clusterName": "c"},
        }))
        .unwrap();
        let change = change_of(Kind::Machine, &object);
        assert_eq!(
            (
                change.namespace.as_str(),
                change.name.as_str(),
                change.cluster_name.as_deref()
            ),
            ("ns", "m", Some("c"))
        );
        assert_eq!(change.resource_version, Some(42));
        let mut version = "1".to_owned();
        advance(&mut version, &object);
        assert_eq!(version, "42");
    }
}
