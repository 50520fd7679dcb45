//! The Cluster API objects of the Clusters this replica serves, and only those (the pure part
//! of [`super`]'s caches: no I/O, unit-tested).
//!
//! Every replica watches every Machine, MachinePool and KubeadmConfig of the management cluster
//! (one watch per kind, whatever the fleet's size), but keeps only the views of the Clusters it
//! serves: memory follows the shard, the management apiserver's watch count does not grow with
//! the fleet. A watch cannot give back what it dropped, so a Cluster gained later is listed
//! (its namespace, one LIST per kind) and decided only once that list is merged:
//!
//! 1. [`ShardStore::serve`] marks a gained Cluster *filling*: from then on the watch's changes
//!    to its objects are kept; a deletion leaves a tombstone with its resourceVersion.
//! 2. The caller lists its namespace (a fresh, consistent read, so never older than what the
//!    watch delivered before it) and hands the result to [`ShardStore::fill_part`] (Machines,
//!    MachinePools, and the KubeadmConfigs labeled `cluster.x-k8s.io/cluster-name` for the
//!    Cluster) and [`ShardStore::fill_namespace_part`] (unlabeled KubeadmConfigs, kept per
//!    namespace: any Cluster there may read them). An object the watch already delivered in a
//!    newer version, or deleted (or moved away) after the list's version, is not overwritten or
//!    brought back.
//! 3. Once both are merged the Cluster is *listed*: [`ShardStore::inventory`] answers for it.
//!    Before that it answers `None`, and the worker decides nothing (an unlisted Machine would
//!    be denied `MachineNotFound`, which is final).
//!
//! A released Cluster's objects are dropped at once, and a namespace's unlabeled KubeadmConfigs
//! with its last served Cluster. A KubeadmConfig labeled for a Cluster this replica does not
//! serve is not kept: in a namespace shared by many Clusters, a replica holds a third of the
//! configs, not all of them. When a watch loses its place, [`ShardStore::regain`] empties every
//! served Cluster and gains it again, so that what the watch missed is listed.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use attestation::machine::{Inventory, KubeadmConfigView, MachinePoolView, MachineView};

/// The kinds kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `cluster.x-k8s.io` Machines.
    Machine,
    /// `cluster.x-k8s.io` MachinePools.
    MachinePool,
    /// `bootstrap.cluster.x-k8s.io` KubeadmConfigs.
    KubeadmConfig,
}

impl Kind {
    /// Every kind, in the order of [`ShardStore::counts`].
    pub const ALL: [Self; 3] = [Self::Machine, Self::MachinePool, Self::KubeadmConfig];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Machine => "Machine",
            Self::MachinePool => "MachinePool",
            Self::KubeadmConfig => "KubeadmConfig",
        }
    }
}

/// One object's view (`None` when deleted, or when it does not read as a view: the signer
/// ignores an unreadable object, as if it were not there).
#[derive(Debug, Clone)]
pub enum Object {
    /// A Machine.
    Machine(MachineView),
    /// A MachinePool.
    MachinePool(Box<MachinePoolView>),
    /// A KubeadmConfig.
    KubeadmConfig(KubeadmConfigView),
}

/// A change the watch delivered.
#[derive(Debug, Clone)]
pub struct Change {
    /// Which kind.
    pub kind: Kind,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.clusterName` (Machines and MachinePools; read even from an unreadable object).
    pub cluster_name: Option<String>,
    /// `metadata.resourceVersion`, as a number (etcd's revision); `None` when it is not one.
    pub resource_version: Option<u64>,
    /// The view now, `None` when deleted or unreadable.
    pub view: Option<Object>,
}

/// A listed object: its resourceVersion and view.
pub type Listed<V> = (Option<u64>, V);

/// A view the store keeps: found by its own name (no second copy of it as a key) and sharing
/// its namespace and Cluster name with its slot, so a cached object costs its own fields only.
pub trait Cached {
    /// `metadata.name`.
    fn name(&self) -> &str;
    /// Points the view's namespace (and Cluster name) at the slot's copies when they are equal.
    fn share(&mut self, namespace: &Arc<str>, cluster: Option<&Arc<str>>);
}

/// Points `field` at `shared` when they hold the same name.
fn share_name(field: &mut Arc<str>, shared: &Arc<str>) {
    if **field == **shared {
        *field = Arc::clone(shared);
    }
}

/// Machines and MachinePools: named, in a namespace, of a Cluster.
macro_rules! cached_of_a_cluster {
    ($($view:ty: |$this:ident| $name:expr),*) => {$(
        impl Cached for $view {
            fn name(&self) -> &str {
                let $this = self;
                $name
            }
            fn share(&mut self, namespace: &Arc<str>, cluster: Option<&Arc<str>>) {
                share_name(&mut self.namespace, namespace);
                if let Some(cluster) = cluster {
                    share_name(&mut self.cluster_name, cluster);
                }
            }
        }
    )*};
}

cached_of_a_cluster!(MachineView: |m| m.name(), MachinePoolView: |p| &p.name);

impl Cached for KubeadmConfigView {
    fn name(&self) -> &str {
        KubeadmConfigView::name(self)
    }
    fn share(&mut self, namespace: &Arc<str>, cluster: Option<&Arc<str>>) {
        share_name(&mut self.namespace, namespace);
        if let (Some(label), Some(cluster)) = (&mut self.cluster_name, cluster) {
            share_name(label, cluster);
        }
    }
}

/// One cached object, hashed and compared by its view's name (see [`Shelf`]).
#[derive(Debug)]
struct Entry<V> {
    resource_version: Option<u64>,
    view: Arc<V>,
}

impl<V: Cached> Borrow<str> for Entry<V> {
    fn borrow(&self) -> &str {
        self.view.name()
    }
}

impl<V: Cached> Hash for Entry<V> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes, which `Borrow<str>` requires.
        self.view.name().hash(state);
    }
}

impl<V: Cached> PartialEq for Entry<V> {
    fn eq(&self, other: &Self) -> bool {
        self.view.name() == other.view.name()
    }
}

impl<V: Cached> Eq for Entry<V> {}

/// One kind's objects of a slot, by name: a set keyed by the views' own names, each view's
/// namespace and Cluster name pointing at the slot's.
#[derive(Debug)]
struct Shelf<V> {
    entries: HashSet<Entry<V>>,
    namespace: Arc<str>,
    cluster: Option<Arc<str>>,
    /// Counts the changes made to `entries`: an inventory built at one count is the shelf's
    /// until the next.
    changes: u64,
}

impl<V: Cached> Shelf<V> {
    fn new(namespace: &Arc<str>, cluster: Option<&Arc<str>>) -> Self {
        Self {
            entries: HashSet::new(),
            namespace: Arc::clone(namespace),
            cluster: cluster.cloned(),
            changes: 0,
        }
    }

    /// The kept version of `name`: `None` when absent.
    fn version(&self, name: &str) -> Option<Option<u64>> {
        self.entries.get(name).map(|e| e.resource_version)
    }

    fn put(&mut self, resource_version: Option<u64>, mut view: V) {
        view.share(&self.namespace, self.cluster.as_ref());
        self.changes += 1;
        self.entries.replace(Entry {
            resource_version,
            view: Arc::new(view),
        });
    }

    fn remove(&mut self, name: &str) {
        if self.entries.remove(name) {
            self.changes += 1;
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn views(&self) -> impl Iterator<Item = Arc<V>> + '_ {
        self.entries.iter().map(|e| Arc::clone(&e.view))
    }
}

/// Deletions seen while a list is on its way: `(kind, name)` to the deletion's version.
type Tombstones = HashMap<(Kind, String), Option<u64>>;

#[derive(Debug)]
enum Fill {
    /// Gained; its list is not merged yet.
    Filling(Tombstones),
    /// Listed: its objects are complete.
    Listed,
}

#[derive(Debug)]
struct ClusterSlot {
    /// Tells a slot from the one a release and a gain later put under the same key.
    generation: u64,
    namespace: String,
    machines: Shelf<MachineView>,
    pools: Shelf<MachinePoolView>,
    /// KubeadmConfigs labeled for this Cluster.
    configs: Shelf<KubeadmConfigView>,
    fill: Fill,
}

#[derive(Debug)]
struct NamespaceSlot {
    generation: u64,
    /// KubeadmConfigs without a `cluster.x-k8s.io/cluster-name` label (any served Cluster of
    /// the namespace may read them).
    configs: Shelf<KubeadmConfigView>,
    /// Names of the served Clusters in this namespace.
    clusters: HashSet<String>,
    fill: Fill,
}

/// The served Clusters' objects.
#[derive(Debug, Default)]
pub struct ShardStore {
    /// By `namespace/name` of the Cluster.
    clusters: HashMap<String, ClusterSlot>,
    /// By namespace: the unlabeled KubeadmConfigs the served Clusters there read.
    namespaces: HashMap<String, NamespaceSlot>,
    /// The last slot generation handed out.
    generation: u64,
    /// The last inventory built for each Cluster, with the slots' state it was built at:
    /// decisions share it (and its index) until the Cluster's objects change.
    inventories: std::sync::Mutex<HashMap<String, (InventoryStamp, Arc<Inventory>)>>,
}

/// What an inventory was built from: the slots' generations and their shelves' change counts.
type InventoryStamp = [u64; 6];

/// A slot to fill: a Cluster (`name`) or a namespace's KubeadmConfigs (`name` empty), as it
/// was when it started filling. A list started for it fills only that slot: if the Cluster is
/// released and gained again meanwhile, the new slot waits for its own list, since the old one
/// may have been read before changes the watch dropped while it was not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The namespace.
    pub namespace: String,
    /// The Cluster; empty for a namespace's KubeadmConfigs.
    pub name: String,
    generation: u64,
}

/// One page of a filling Cluster's list: its Machines, MachinePools and the KubeadmConfigs
/// labeled for it.
#[derive(Debug, Default)]
pub struct Part {
    /// Machines whose `spec.clusterName` is the Cluster's.
    pub machines: Vec<Listed<MachineView>>,
    /// MachinePools whose `spec.clusterName` is the Cluster's.
    pub pools: Vec<Listed<MachinePoolView>>,
    /// KubeadmConfigs labeled `cluster.x-k8s.io/cluster-name` for the Cluster.
    pub configs: Vec<Listed<KubeadmConfigView>>,
}

/// What [`ShardStore::serve`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Clusters now filling: list them.
    pub gained: Vec<Ticket>,
    /// Namespaces whose KubeadmConfigs are now filling: list them.
    pub namespaces: Vec<Ticket>,
    /// Clusters whose objects were dropped.
    pub released: Vec<String>,
}

/// True when a listed object of `listed` version may replace what the watch left: nothing
/// newer is there, and it was not deleted since.
fn list_wins(listed: Option<u64>, present: Option<Option<u64>>, deleted: Option<&Option<u64>>) -> bool {
    let newer_than = |other: Option<u64>| match (listed, other) {
        (Some(listed), Some(other)) => listed > other,
        // Not comparable: what the watch delivered is at least as recent as the list, which
        // was read after the Cluster started filling.
        _ => false,
    };
    match (present, deleted) {
        (Some(present), _) => newer_than(present),
        (None, Some(deleted)) => newer_than(*deleted),
        (None, None) => true,
    }
}

fn merge<V: Cached>(shelf: &mut Shelf<V>, tombstones: &Tombstones, kind: Kind, listed: Vec<Listed<V>>) {
    for (resource_version, view) in listed {
        let name = view.name();
        let deleted = tombstones.get(&(kind, name.to_owned()));
        if list_wins(resource_version, shelf.version(name), deleted) {
            shelf.put(resource_version, view);
        }
    }
}

impl ShardStore {
    /// Serves exactly `clusters` (`namespace`, `name`): new ones start filling, others are
    /// dropped.
    pub fn serve(&mut self, clusters: &[(String, String)]) -> Served {
        let wanted: HashSet<String> = clusters.iter().map(|(ns, name)| format!("{ns}/{name}")).collect();
        let mut served = Served::default();
        let released: Vec<String> = self.clusters.keys().filter(|k| !wanted.contains(*k)).cloned().collect();
        for key in released {
            if let Some(slot) = self.clusters.remove(&key) {
                let name = key.rsplit_once('/').map_or("", |(_, name)| name);
                let emptied = match self.namespaces.get_mut(&slot.namespace) {
                    Some(ns) => {
                        ns.clusters.remove(name);
                        ns.clusters.is_empty()
                    }
                    None => false,
                };
                if emptied {
                    self.namespaces.remove(&slot.namespace);
                }
            }
            served.released.push(key);
        }
        for (namespace, name) in clusters {
            let key = format!("{namespace}/{name}");
            if self.clusters.contains_key(&key) {
                continue;
            }
            self.generation += 1;
            let generation = self.generation;
            let ns = self.namespaces.entry(namespace.clone()).or_insert_with(|| {
                served.namespaces.push(Ticket {
                    namespace: namespace.clone(),
                    name: String::new(),
                    generation,
                });
                NamespaceSlot {
                    generation,
                    configs: Shelf::new(&namespace.as_str().into(), None),
                    clusters: HashSet::new(),
                    fill: Fill::Filling(Tombstones::new()),
                }
            });
            // One copy of the namespace for all its slots' views.
            let shared_namespace = Arc::clone(&ns.configs.namespace);
            let shared_name: Arc<str> = name.as_str().into();
            self.clusters.insert(
                key,
                ClusterSlot {
                    generation,
                    namespace: namespace.clone(),
                    machines: Shelf::new(&shared_namespace, Some(&shared_name)),
                    pools: Shelf::new(&shared_namespace, Some(&shared_name)),
                    configs: Shelf::new(&shared_namespace, Some(&shared_name)),
                    fill: Fill::Filling(Tombstones::new()),
                },
            );
            served.gained.push(Ticket {
                namespace: namespace.clone(),
                name: name.clone(),
                generation,
            });
            ns.clusters.insert(name.clone());
        }
        served.released.sort();
        served
    }

    /// Applies a change from the watch: kept when its Cluster (for a KubeadmConfig: the one its
    /// label names, or its namespace when unlabeled) is served, dropped otherwise. Returns
    /// whether it was kept.
    pub fn apply(&mut self, change: Change) -> bool {
        let Change {
            kind,
            namespace,
            name,
            cluster_name,
            resource_version,
            view,
        } = change;
        // Cluster API keeps spec.clusterName immutable; without its webhook an object could
        // still move (and a KubeadmConfig's label can change): it leaves every other place of
        // its namespace.
        self.forget(kind, &namespace, &name, cluster_name.as_deref(), resource_version);
        let Some(cluster_name) = cluster_name else {
            if kind != Kind::KubeadmConfig {
                return false;
            }
            let Some(ns) = self.namespaces.get_mut(&namespace) else {
                return false;
            };
            match view {
                Some(Object::KubeadmConfig(v)) => ns.configs.put(resource_version, v),
                _ => {
                    ns.configs.remove(&name);
                    if let Fill::Filling(tombstones) = &mut ns.fill {
                        tombstones.insert((kind, name), resource_version);
                    }
                }
            }
            return true;
        };
        let Some(slot) = self.clusters.get_mut(&format!("{namespace}/{cluster_name}")) else {
            return false;
        };
        match view {
            Some(Object::Machine(v)) => slot.machines.put(resource_version, v),
            Some(Object::MachinePool(v)) => slot.pools.put(resource_version, *v),
            Some(Object::KubeadmConfig(v)) => slot.configs.put(resource_version, v),
            None => {
                match kind {
                    Kind::Machine => slot.machines.remove(&name),
                    Kind::MachinePool => slot.pools.remove(&name),
                    Kind::KubeadmConfig => slot.configs.remove(&name),
                }
                if let Fill::Filling(tombstones) = &mut slot.fill {
                    tombstones.insert((kind, name), resource_version);
                }
            }
        }
        true
    }

    /// Drops object `name` of `kind` from every served Cluster of `namespace` but `except`
    /// (and, for a KubeadmConfig labeled `except`, from the namespace's unlabeled ones). A
    /// filling place it left keeps a tombstone at `resource_version`, so that a list read
    /// before the move does not bring it back there.
    fn forget(&mut self, kind: Kind, namespace: &str, name: &str, except: Option<&str>, resource_version: Option<u64>) {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return;
        };
        // Only a KubeadmConfig's place can change under Cluster API (its label; a Machine's
        // spec.clusterName is immutable), so only its moves leave tombstones: a Machine write
        // does not leave one in every other filling Cluster of its namespace.
        let tombstone = |fill: &mut Fill| {
            if let (Kind::KubeadmConfig, Fill::Filling(tombstones)) = (kind, fill) {
                tombstones.insert((kind, name.to_owned()), resource_version);
            }
        };
        if kind == Kind::KubeadmConfig && except.is_some() {
            ns.configs.remove(name);
            tombstone(&mut ns.fill);
        }
        for cluster in ns.clusters.iter().filter(|c| Some(c.as_str()) != except) {
            let Some(slot) = self.clusters.get_mut(&format!("{namespace}/{cluster}")) else {
                continue;
            };
            match kind {
                Kind::Machine => slot.machines.remove(name),
                Kind::MachinePool => slot.pools.remove(name),
                Kind::KubeadmConfig => slot.configs.remove(name),
            }
            tombstone(&mut slot.fill);
        }
    }

    /// The ticket of the Cluster's slot now (tests fill whatever slot is there).
    #[cfg(test)]
    fn ticket(&self, namespace: &str, name: &str) -> Ticket {
        let generation = if name.is_empty() {
            self.namespaces.get(namespace).map_or(0, |s| s.generation)
        } else {
            self.clusters
                .get(&format!("{namespace}/{name}"))
                .map_or(0, |s| s.generation)
        };
        Ticket {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            generation,
        }
    }

    /// Merges the whole list of a filling Cluster's Machines and MachinePools (those of its
    /// namespace whose `spec.clusterName` is the Cluster's) and marks it listed: [`Self::fill_part`]
    /// and [`Self::filled`] at once, on the slot there now.
    #[cfg(test)]
    pub fn fill(
        &mut self,
        namespace: &str,
        name: &str,
        machines: Vec<Listed<MachineView>>,
        pools: Vec<Listed<MachinePoolView>>,
    ) -> bool {
        let ticket = self.ticket(namespace, name);
        self.fill_part(
            &ticket,
            Part {
                machines,
                pools,
                configs: Vec::new(),
            },
        ) && self.filled(&ticket)
    }

    fn filling_cluster(&mut self, ticket: &Ticket) -> Option<&mut ClusterSlot> {
        self.clusters
            .get_mut(&format!("{}/{}", ticket.namespace, ticket.name))
            .filter(|slot| slot.generation == ticket.generation && matches!(slot.fill, Fill::Filling(_)))
    }

    fn filling_namespace(&mut self, ticket: &Ticket) -> Option<&mut NamespaceSlot> {
        self.namespaces
            .get_mut(&ticket.namespace)
            .filter(|slot| slot.generation == ticket.generation && matches!(slot.fill, Fill::Filling(_)))
    }

    /// Whether the ticket's slot (a Cluster's, or a namespace's) is there and still waits for
    /// its list: a list goes on only while some slot it fills does.
    pub fn is_filling(&self, ticket: &Ticket) -> bool {
        let filling =
            |generation: u64, fill: &Fill| generation == ticket.generation && matches!(fill, Fill::Filling(_));
        if ticket.name.is_empty() {
            self.namespaces
                .get(&ticket.namespace)
                .is_some_and(|slot| filling(slot.generation, &slot.fill))
        } else {
            self.clusters
                .get(&format!("{}/{}", ticket.namespace, ticket.name))
                .is_some_and(|slot| filling(slot.generation, &slot.fill))
        }
    }

    /// Merges one page of a filling Cluster's list; it stays filling. Returns false when the
    /// ticket's slot is gone (released, perhaps gained again since) or no longer filling: the
    /// page is dropped, so a Cluster released while its list streams costs no more than the
    /// pages already merged.
    pub fn fill_part(&mut self, ticket: &Ticket, part: Part) -> bool {
        let Some(slot) = self.filling_cluster(ticket) else {
            return false;
        };
        let Fill::Filling(tombstones) = &slot.fill else {
            return false;
        };
        merge(&mut slot.machines, tombstones, Kind::Machine, part.machines);
        merge(&mut slot.pools, tombstones, Kind::MachinePool, part.pools);
        merge(&mut slot.configs, tombstones, Kind::KubeadmConfig, part.configs);
        true
    }

    /// The ticket's list is all merged: the Cluster is listed (answered for once its namespace
    /// is too). Returns false when the slot is gone or not filling.
    pub fn filled(&mut self, ticket: &Ticket) -> bool {
        match self.filling_cluster(ticket) {
            Some(slot) => {
                slot.fill = Fill::Listed;
                true
            }
            None => false,
        }
    }

    /// Merges the whole list of a filling namespace's unlabeled KubeadmConfigs and marks it
    /// listed.
    #[cfg(test)]
    pub fn fill_namespace(&mut self, namespace: &str, configs: Vec<Listed<KubeadmConfigView>>) -> bool {
        let ticket = self.ticket(namespace, "");
        self.fill_namespace_part(&ticket, configs) && self.namespace_filled(&ticket)
    }

    /// Merges one page of a filling namespace's unlabeled KubeadmConfigs; it stays filling.
    pub fn fill_namespace_part(&mut self, ticket: &Ticket, configs: Vec<Listed<KubeadmConfigView>>) -> bool {
        let Some(slot) = self.filling_namespace(ticket) else {
            return false;
        };
        let Fill::Filling(tombstones) = &slot.fill else {
            return false;
        };
        merge(&mut slot.configs, tombstones, Kind::KubeadmConfig, configs);
        true
    }

    /// The filling namespace's KubeadmConfigs are all merged.
    pub fn namespace_filled(&mut self, ticket: &Ticket) -> bool {
        match self.filling_namespace(ticket) {
            Some(slot) => {
                slot.fill = Fill::Listed;
                true
            }
            None => false,
        }
    }

    /// Whether a change would be kept: its Cluster is served (an unlabeled KubeadmConfig: a
    /// Cluster of its namespace).
    pub fn wants(&self, change: &Change) -> bool {
        match (change.kind, &change.cluster_name) {
            (_, Some(cluster)) => self.is_served(&change.namespace, cluster),
            (Kind::KubeadmConfig, None) => self.namespaces.contains_key(&change.namespace),
            (_, None) => false,
        }
    }

    /// Whether the Cluster is served (listed or filling).
    pub fn is_served(&self, namespace: &str, name: &str) -> bool {
        self.clusters.contains_key(&format!("{namespace}/{name}"))
    }

    /// Every served Cluster is dropped and gained again: empty, filling, with new tickets (a
    /// feed lost its place, so what it missed is found by listing again). Nothing is released.
    pub fn regain(&mut self) -> Served {
        let served: Vec<(String, String)> = self
            .clusters
            .keys()
            .filter_map(|key| key.split_once('/'))
            .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
            .collect();
        self.serve(&[]);
        self.serve(&served)
    }

    /// The Cluster's Machines, MachinePools and KubeadmConfigs (its own and its namespace's
    /// unlabeled ones), once listed; `None` while it is filling or not served.
    pub fn inventory(&self, namespace: &str, name: &str) -> Option<Arc<Inventory>> {
        let key = format!("{namespace}/{name}");
        let slot = self.clusters.get(&key)?;
        let ns = self.namespaces.get(namespace)?;
        if !matches!((&slot.fill, &ns.fill), (Fill::Listed, Fill::Listed)) {
            return None;
        }
        let stamp = [
            slot.generation,
            slot.machines.changes,
            slot.pools.changes,
            slot.configs.changes,
            ns.generation,
            ns.configs.changes,
        ];
        let mut built = crate::locks::lock(&self.inventories);
        if let Some((at, inventory)) = built.get(&key)
            && *at == stamp
        {
            return Some(Arc::clone(inventory));
        }
        let inventory = Arc::new(Inventory::new(
            slot.machines.views().collect(),
            slot.pools.views().collect(),
            slot.configs.views().chain(ns.configs.views()).collect(),
        ));
        built.retain(|cluster, _| self.clusters.contains_key(cluster));
        built.insert(key, (stamp, Arc::clone(&inventory)));
        Some(inventory)
    }

    /// Whether the Cluster is served and listed.
    pub fn listed(&self, namespace: &str, name: &str) -> bool {
        let listed = |fill: &Fill| matches!(fill, Fill::Listed);
        self.clusters
            .get(&format!("{namespace}/{name}"))
            .is_some_and(|s| listed(&s.fill))
            && self.namespaces.get(namespace).is_some_and(|n| listed(&n.fill))
    }

    /// Objects kept, by [`Kind::ALL`].
    pub fn counts(&self) -> [usize; 3] {
        [
            self.clusters.values().map(|s| s.machines.len()).sum(),
            self.clusters.values().map(|s| s.pools.len()).sum(),
            self.clusters.values().map(|s| s.configs.len()).sum::<usize>()
                + self.namespaces.values().map(|n| n.configs.len()).sum::<usize>(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(name: &str, cluster: &str, provider_id: &str) -> MachineView {
        MachineView::from_object(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"clusterName": cluster, "providerID": provider_id},
        }))
        .unwrap()
    }

    fn config(name: &str) -> KubeadmConfigView {
        labeled_config(name, None)
    }

    fn labeled_config(name: &str, cluster: Option<&str>) -> KubeadmConfigView {
        KubeadmConfigView::from_object(&json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "labels": cluster.map(|c| json!({"cluster.x-k8s.io/cluster-name": c}))},
        }))
        .unwrap()
    }

    fn change(name: &str, cluster: &str, rv: u64, provider_id: Option<&str>) -> Change {
        Change {
            kind: Kind::Machine,
            namespace: "ns".into(),
            name: name.into(),
            cluster_name: Some(cluster.into()),
            resource_version: Some(rv),
            view: provider_id.map(|p| Object::Machine(machine(name, cluster, p))),
        }
    }

    fn config_change(name: &str, rv: u64, present: bool) -> Change {
        labeled_config_change(name, None, rv, present)
    }

    fn labeled_config_change(name: &str, cluster: Option<&str>, rv: u64, present: bool) -> Change {
        Change {
            kind: Kind::KubeadmConfig,
            namespace: "ns".into(),
            name: name.into(),
            cluster_name: cluster.map(str::to_owned),
            resource_version: Some(rv),
            view: present.then(|| Object::KubeadmConfig(labeled_config(name, cluster))),
        }
    }

    fn config_names(inventory: &Inventory) -> Vec<&str> {
        let mut names: Vec<&str> = inventory.kubeadm_configs.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn labeled_configs_are_kept_only_by_their_served_cluster_and_follow_their_label() {
        let mut store = ShardStore::default();
        let served = serve(&mut store, &["a", "b"]);
        // A page of the namespace's configs: each Cluster takes its own, the namespace the
        // unlabeled one, and one labeled for a Cluster not served is dropped.
        for ticket in &served.gained {
            let configs = vec![(
                Some(1),
                labeled_config(&format!("{}-kc", ticket.name), Some(&ticket.name)),
            )];
            assert!(store.fill_part(
                ticket,
                Part {
                    configs,
                    ..Part::default()
                }
            ));
            assert!(store.filled(ticket));
        }
        assert!(store.fill_namespace("ns", vec![(Some(1), config("shared-kc"))]));
        assert!(!store.apply(labeled_config_change("c-kc", Some("c"), 2, true)));
        let a = store.inventory("ns", "a").unwrap();
        assert_eq!(config_names(&a), ["a-kc", "shared-kc"]);
        assert_eq!(
            config_names(&store.inventory("ns", "b").unwrap()),
            ["b-kc", "shared-kc"]
        );
        assert_eq!(store.counts()[2], 3);
        // The label moves a config: from a to b, then to a Cluster not served, then off.
        assert!(store.apply(labeled_config_change("a-kc", Some("b"), 3, true)));
        assert_eq!(config_names(&store.inventory("ns", "a").unwrap()), ["shared-kc"]);
        assert_eq!(
            config_names(&store.inventory("ns", "b").unwrap()),
            ["a-kc", "b-kc", "shared-kc"]
        );
        assert!(!store.apply(labeled_config_change("a-kc", Some("c"), 4, true)));
        assert_eq!(
            config_names(&store.inventory("ns", "b").unwrap()),
            ["b-kc", "shared-kc"]
        );
        assert!(store.apply(labeled_config_change("b-kc", None, 5, true)));
        assert_eq!(
            config_names(&store.inventory("ns", "a").unwrap()),
            ["b-kc", "shared-kc"]
        );
        assert_eq!(
            config_names(&store.inventory("ns", "b").unwrap()),
            ["b-kc", "shared-kc"]
        );
        // Releasing b drops nothing a still reads.
        serve(&mut store, &["a"]);
        assert_eq!(
            config_names(&store.inventory("ns", "a").unwrap()),
            ["b-kc", "shared-kc"]
        );
        assert_eq!(store.counts()[2], 2);
    }

    #[test]
    fn a_config_relabeled_away_from_a_filling_cluster_is_not_brought_back_by_its_older_list() {
        let mut store = ShardStore::default();
        let first = serve(&mut store, &["a"]);
        assert!(store.fill_part(&first.gained[0], Part::default()) && store.filled(&first.gained[0]));
        assert!(store.fill_namespace("ns", Vec::new()));
        let gained = serve(&mut store, &["a", "b"]).gained;
        assert_eq!(gained.len(), 1);
        // While b's list is on its way, the watch moves the config from b to a.
        assert!(store.apply(labeled_config_change("kc", Some("a"), 5, true)));
        // b's list was read before the move: it still has the config labeled b.
        let configs = vec![(Some(3), labeled_config("kc", Some("b")))];
        assert!(
            store.fill_part(
                &gained[0],
                Part {
                    configs,
                    ..Part::default()
                }
            ) && store.filled(&gained[0])
        );
        assert_eq!(config_names(&store.inventory("ns", "a").unwrap()), ["kc"]);
        assert_eq!(config_names(&store.inventory("ns", "b").unwrap()), Vec::<&str>::new());
    }

    fn serve(store: &mut ShardStore, clusters: &[&str]) -> Served {
        let list: Vec<(String, String)> = clusters.iter().map(|c| ("ns".to_owned(), (*c).to_owned())).collect();
        store.serve(&list)
    }

    fn provider_ids(inventory: &Inventory) -> Vec<String> {
        let mut ids: Vec<String> = inventory
            .machines
            .iter()
            .filter_map(|m| m.provider_id().map(str::to_owned))
            .collect();
        ids.sort();
        ids
    }

    /// Serves `cluster` and fills it (and its namespace) with nothing listed.
    fn listed_empty(store: &mut ShardStore, clusters: &[&str]) {
        serve(store, clusters);
        for c in clusters {
            store.fill("ns", c, Vec::new(), Vec::new());
        }
        store.fill_namespace("ns", Vec::new());
    }

    #[test]
    fn objects_of_clusters_not_served_are_dropped_on_arrival() {
        let mut store = ShardStore::default();
        listed_empty(&mut store, &["mine"]);
        assert!(store.apply(change("a", "mine", 5, Some("p-a"))));
        assert!(!store.apply(change("b", "theirs", 6, Some("p-b"))));
        assert!(!store.apply(change("c", "", 7, None)));
        assert_eq!(store.counts(), [1, 0, 0]);
        assert_eq!(provider_ids(&store.inventory("ns", "mine").unwrap()), ["p-a"]);
        assert!(store.inventory("ns", "theirs").is_none());
    }

    #[test]
    fn cached_views_share_their_slots_namespace_and_cluster_name() {
        let mut store = ShardStore::default();
        store.serve(&[("ns".into(), "mine".into())]);
        assert!(store.fill(
            "ns",
            "mine",
            vec![
                (Some(1), machine("a", "mine", "p-a")),
                (Some(2), machine("b", "mine", "p-b"))
            ],
            Vec::new(),
        ));
        assert!(store.apply(change("c", "mine", 3, Some("p-c"))));
        assert!(store.fill_namespace("ns", vec![(Some(4), config("kc"))]));
        let inventory = store.inventory("ns", "mine").unwrap();
        let [first, rest @ ..] = inventory.machines.as_slice() else {
            panic!("no Machines")
        };
        assert_eq!(rest.len(), 2);
        for other in rest {
            assert!(Arc::ptr_eq(&first.namespace, &other.namespace));
            assert!(Arc::ptr_eq(&first.cluster_name, &other.cluster_name));
        }
        assert!(Arc::ptr_eq(&first.namespace, &inventory.kubeadm_configs[0].namespace));
        // Found by the view's own name, replaced in place.
        assert!(store.apply(change("a", "mine", 5, Some("p-a2"))));
        let inventory = store.inventory("ns", "mine").unwrap();
        assert_eq!(inventory.machines.len(), 3);
        assert!(inventory.machines.iter().any(|m| m.provider_id() == Some("p-a2")));
    }

    #[test]
    fn a_gained_cluster_answers_nothing_until_its_objects_and_its_namespace_are_listed() {
        let mut store = ShardStore::default();
        let served = serve(&mut store, &["mine"]);
        assert_eq!(
            served
                .gained
                .iter()
                .map(|t| (t.namespace.as_str(), t.name.as_str()))
                .collect::<Vec<_>>(),
            [("ns", "mine")]
        );
        assert_eq!(served.namespaces.len(), 1);
        assert!(store.apply(change("a", "mine", 5, Some("p-a"))));
        assert!(store.inventory("ns", "mine").is_none(), "filling");
        assert!(store.fill("ns", "mine", vec![(Some(3), machine("b", "mine", "p-b"))], Vec::new()));
        assert!(
            store.inventory("ns", "mine").is_none(),
            "its namespace's KubeadmConfigs are not listed yet"
        );
        assert!(!store.listed("ns", "mine"));
        assert!(store.fill_namespace("ns", vec![(Some(2), config("kc"))]));
        let inventory = store.inventory("ns", "mine").unwrap();
        assert_eq!(provider_ids(&inventory), ["p-a", "p-b"]);
        assert_eq!(inventory.kubeadm_configs.len(), 1);
        assert!(store.listed("ns", "mine"));
        // Pages: merged as they come, listed only at the end; a release drops the rest.
        let served = serve(&mut store, &["mine", "paged"]);
        let ticket = served.gained[0].clone();
        assert!(store.fill_part(
            &ticket,
            Part {
                machines: vec![(Some(4), machine("p1", "paged", "p-1"))],
                ..Part::default()
            }
        ));
        assert!(store.inventory("ns", "paged").is_none(), "one page is not the list");
        assert!(store.filled(&ticket));
        assert_eq!(provider_ids(&store.inventory("ns", "paged").unwrap()), ["p-1"]);
        serve(&mut store, &["mine"]);
        assert!(
            !store.fill_part(
                &ticket,
                Part {
                    machines: Vec::new(),
                    ..Part::default()
                }
            ),
            "released: pages dropped"
        );
        assert!(!store.filled(&ticket));
        // Released and gained again while its first list streams: the old list fills nothing.
        let served = serve(&mut store, &["mine", "paged"]);
        assert!(!store.fill_part(
            &ticket,
            Part {
                machines: vec![(Some(1), machine("stale", "paged", "p-s"))],
                ..Part::default()
            }
        ));
        assert!(!store.filled(&ticket), "the new slot waits for its own list");
        assert!(store.inventory("ns", "paged").is_none());
        assert!(store.filled(&served.gained[0]));
        // A second Cluster in a listed namespace needs only its own list.
        let served = serve(&mut store, &["mine", "second", "paged"]);
        assert!(served.namespaces.is_empty());
        assert!(store.fill("ns", "second", Vec::new(), Vec::new()));
        assert!(store.listed("ns", "second"));
    }

    #[test]
    fn a_list_never_replaces_a_newer_watched_version_nor_brings_back_a_deleted_object() {
        let mut store = ShardStore::default();
        serve(&mut store, &["mine"]);
        // While the list is on its way: a newer version of a, and c deleted.
        store.apply(change("a", "mine", 20, Some("p-a-new")));
        store.apply(change("c", "mine", 21, None));
        store.fill(
            "ns",
            "mine",
            vec![
                (Some(10), machine("a", "mine", "p-a-old")),
                (Some(11), machine("b", "mine", "p-b")),
                (Some(12), machine("c", "mine", "p-c")),
            ],
            Vec::new(),
        );
        store.fill_namespace("ns", Vec::new());
        assert_eq!(
            provider_ids(&store.inventory("ns", "mine").unwrap()),
            ["p-a-new", "p-b"]
        );
        // A list newer than what the watch left wins; one recreated after its deletion too.
        let mut store = ShardStore::default();
        serve(&mut store, &["mine"]);
        store.apply(change("a", "mine", 5, Some("p-a-old")));
        store.apply(change("c", "mine", 6, None));
        store.fill(
            "ns",
            "mine",
            vec![
                (Some(9), machine("a", "mine", "p-a-new")),
                (Some(8), machine("c", "mine", "p-c-again")),
            ],
            Vec::new(),
        );
        store.fill_namespace("ns", Vec::new());
        assert_eq!(
            provider_ids(&store.inventory("ns", "mine").unwrap()),
            ["p-a-new", "p-c-again"]
        );
        // Versions that are not numbers: what the watch delivered stays.
        let mut store = ShardStore::default();
        serve(&mut store, &["mine"]);
        let mut unversioned = change("a", "mine", 0, Some("p-a-watched"));
        unversioned.resource_version = None;
        store.apply(unversioned);
        store.fill(
            "ns",
            "mine",
            vec![(Some(9), machine("a", "mine", "p-a-listed"))],
            Vec::new(),
        );
        store.fill_namespace("ns", Vec::new());
        assert_eq!(provider_ids(&store.inventory("ns", "mine").unwrap()), ["p-a-watched"]);
    }

    #[test]
    fn a_release_drops_the_clusters_objects_and_the_namespaces_configs_with_its_last_cluster() {
        let mut store = ShardStore::default();
        listed_empty(&mut store, &["one", "two"]);
        store.apply(change("a", "one", 5, Some("p-a")));
        store.apply(change("b", "two", 6, Some("p-b")));
        store.apply(config_change("kc", 7, true));
        assert_eq!(store.counts(), [2, 0, 1]);
        let served = serve(&mut store, &["two"]);
        assert_eq!(served.released, ["ns/one"]);
        assert_eq!(store.counts(), [1, 0, 1], "the namespace still has a served Cluster");
        assert!(store.inventory("ns", "one").is_none());
        serve(&mut store, &[]);
        assert_eq!(store.counts(), [0, 0, 0]);
        // Gained again: filling again, listed again from scratch.
        let served = serve(&mut store, &["one"]);
        assert_eq!(served.namespaces.len(), 1);
        assert!(store.inventory("ns", "one").is_none());
        assert!(!store.fill("ns", "gone", Vec::new(), Vec::new()), "not served: dropped");
    }

    #[test]
    fn regaining_empties_every_served_cluster_and_lists_it_again_under_new_tickets() {
        let mut store = ShardStore::default();
        let first = store.serve(&[("ns".into(), "mine".into())]);
        assert!(store.fill(
            "ns",
            "mine",
            vec![(Some(3), machine("gone", "mine", "p-g"))],
            Vec::new()
        ));
        assert!(store.fill_namespace("ns", vec![(Some(2), config("kc"))]));
        assert!(store.inventory("ns", "mine").is_some());
        let again = store.regain();
        assert!(again.released.is_empty());
        assert_eq!(again.gained.len(), 1);
        assert_eq!(again.namespaces.len(), 1);
        assert!(again.gained[0].generation > first.gained[0].generation);
        // Nothing is answered until it is listed again, and the old tickets fill nothing.
        assert!(store.inventory("ns", "mine").is_none());
        assert!(!store.fill_part(
            &first.gained[0],
            Part {
                machines: vec![(Some(9), machine("old", "mine", "p-o"))],
                ..Part::default()
            }
        ));
        // What the new watch delivers meanwhile is kept; the list (without the Machine
        // deleted while the watch was lost) completes it.
        assert!(store.apply(change("new", "mine", 10, Some("p-n"))));
        assert!(store.fill_part(
            &again.gained[0],
            Part {
                machines: vec![(Some(4), machine("kept", "mine", "p-k"))],
                ..Part::default()
            }
        ));
        assert!(store.filled(&again.gained[0]));
        assert!(store.fill_namespace_part(&again.namespaces[0], vec![(Some(2), config("kc"))]));
        assert!(store.namespace_filled(&again.namespaces[0]));
        let inventory = store.inventory("ns", "mine").unwrap();
        let mut names: Vec<&str> = inventory.machines.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        assert_eq!(names, ["kept", "new"]);
    }

    #[test]
    fn a_machine_moved_to_another_cluster_leaves_the_first() {
        let mut store = ShardStore::default();
        listed_empty(&mut store, &["one", "two"]);
        store.apply(change("a", "one", 5, Some("p-a")));
        store.apply(change("a", "two", 6, Some("p-a")));
        assert!(store.inventory("ns", "one").unwrap().machines.is_empty());
        assert_eq!(provider_ids(&store.inventory("ns", "two").unwrap()), ["p-a"]);
        // Moved to a Cluster not served here: gone from here.
        store.apply(change("a", "elsewhere", 7, Some("p-a")));
        assert_eq!(store.counts(), [0, 0, 0]);
    }
}
