//! Filling gained Clusters: their namespace listed, a page at a time, into the shard store.
//!
//! A Cluster this replica gains is decided nothing for until its Machines, MachinePools and
//! KubeadmConfigs are listed ([`super::store`]). Lists are by namespace, one per kind, shared by
//! every Cluster of the namespace gained at once. What a fleet of a thousand Clusters in one
//! namespace showed (docs/capacity.md, "Measured at 1,000 Clusters") shapes how:
//!
//! - **One list of a namespace at a time.** Clusters gained while their namespace is being
//!   listed (a share that grows over several passes as replicas join, a regain) wait for the
//!   next list, which serves all of them; lists of one namespace never run side by side, where
//!   each would read the whole namespace again ([`NamespaceFills`]).
//! - **A list stops when nothing it fills is wanted any more** (its Clusters released
//!   meanwhile): its remaining pages would be read only to be dropped.
//! - **A list longer than etcd's compaction window is continued, not restarted**
//!   ([`super::view_page::for_each_page`]).
//!
//! At most [`FILLS_AT_ONCE`] namespaces are listed at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use attestation::machine::{KubeadmConfigView, MachinePoolView, MachineView};

use super::Management;
use super::store::{Listed, Part, Served, ShardStore, Ticket};
use super::view_page::for_each_page;
use crate::controller::backoff::Backoff;
use crate::locks::{lock, read, write};

/// Namespace LISTs of gained Clusters at once.
pub const FILLS_AT_ONCE: usize = 16;

/// What one list of a namespace fills: gained Clusters, and the namespace's unlabeled
/// KubeadmConfigs when the namespace is new to this replica.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The gained Clusters of the namespace.
    pub clusters: Vec<Ticket>,
    /// The namespace's own slot (unlabeled KubeadmConfigs), when it is filling.
    pub configs: Option<Ticket>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.clusters.is_empty() && self.configs.is_none()
    }

    fn absorb(&mut self, other: Batch) {
        self.clusters.extend(other.clusters);
        if other.configs.is_some() {
            self.configs = other.configs;
        }
    }
}

/// Which namespaces are being listed, and what waits for each one's next list.
#[derive(Debug, Default)]
pub struct NamespaceFills {
    /// A namespace is here while a task lists it; its value waits for that task's next list.
    running: Mutex<HashMap<String, Batch>>,
}

impl NamespaceFills {
    /// Hands over `batch` for `namespace`: `Some` when no list of it runs (the caller starts
    /// one, with what is returned), `None` when one runs (it takes the batch next).
    pub fn add(&self, namespace: &str, batch: Batch) -> Option<Batch> {
        let mut running = lock(&self.running);
        match running.get_mut(namespace) {
            Some(waiting) => {
                waiting.absorb(batch);
                None
            }
            None => {
                running.insert(namespace.to_owned(), Batch::default());
                Some(batch)
            }
        }
    }

    /// The running list of `namespace` is done: what waited for the next one, or `None`, and
    /// then no list of it runs any more.
    pub fn next(&self, namespace: &str) -> Option<Batch> {
        let mut running = lock(&self.running);
        let waiting = running.remove(namespace).unwrap_or_default();
        if waiting.is_empty() {
            return None;
        }
        running.insert(namespace.to_owned(), Batch::default());
        Some(waiting)
    }
}

impl Management {
    /// Lists what `served` gained, by namespace; a namespace being listed takes it next.
    pub(super) fn spawn_fills(self: &Arc<Self>, served: Served) {
        let mut by_namespace: BTreeMap<String, Batch> = BTreeMap::new();
        for ticket in served.gained {
            let namespace = ticket.namespace.clone();
            by_namespace.entry(namespace).or_default().clusters.push(ticket);
        }
        for ticket in served.namespaces {
            let namespace = ticket.namespace.clone();
            by_namespace.entry(namespace).or_default().configs = Some(ticket);
        }
        for (namespace, batch) in by_namespace {
            let Some(batch) = self.namespace_fills.add(&namespace, batch) else {
                tracing::debug!(namespace = %namespace, "gained Clusters wait for the list of their namespace under way");
                continue;
            };
            let management = Arc::clone(self);
            tokio::spawn(async move {
                let mut batch = Some(batch);
                while let Some(next) = batch {
                    management.fill(&namespace, next).await;
                    batch = management.namespace_fills.next(&namespace);
                }
            });
        }
    }

    /// Lists `namespace` for `batch`, retrying until it is merged or nothing of it is wanted.
    async fn fill(&self, namespace: &str, batch: Batch) {
        let mut backoff = Backoff::default();
        let names: Vec<&str> = batch.clusters.iter().map(|t| t.name.as_str()).collect();
        loop {
            if !self.wanted(&batch) {
                tracing::debug!(namespace = %namespace, clusters = ?names, "no longer served: not listed");
                return;
            }
            let attempt = {
                let Ok(_turn) = self.fills.acquire().await else {
                    return;
                };
                let started = std::time::Instant::now();
                self.fill_namespace(namespace, &batch)
                    .await
                    .map(|objects| (objects, started.elapsed()))
            };
            match attempt {
                Ok((objects, took)) => {
                    self.listed_changed.notify_one();
                    tracing::info!(
                        namespace = %namespace,
                        clusters = ?names,
                        objects,
                        ms = took.as_millis() as u64,
                        "listed the Cluster API objects of gained Clusters"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(namespace = %namespace, error = %e, "cannot list the Cluster API objects of gained Clusters; retrying");
                }
            }
            backoff.wait().await;
        }
    }

    /// Whether any slot of `batch` still waits for its list.
    fn wanted(&self, batch: &Batch) -> bool {
        any_filling(&read(&self.shard), batch)
    }

    /// Lists the Machines and MachinePools of `batch`'s Clusters in `namespace` (and its
    /// KubeadmConfigs), merging each page as it comes: consistent reads, so never older than
    /// what the watches delivered before. A Cluster released meanwhile drops its pages, and
    /// the list stops once none is wanted. Returns the objects merged.
    async fn fill_namespace(&self, namespace: &str, batch: &Batch) -> Result<usize, kube::Error> {
        let Batch { clusters, configs } = batch;
        let mut merged = 0;
        for_each_page(
            &self.client,
            &self.machine_resource,
            namespace,
            |page: Vec<Listed<MachineView>>| {
                let part = |machines| Part {
                    machines,
                    ..Part::default()
                };
                self.take_page(batch, by_cluster(page, |m| Some(&m.cluster_name)), part, &mut merged)
            },
        )
        .await?;
        if let Some(resource) = &self.pool_resource {
            for_each_page(
                &self.client,
                resource,
                namespace,
                |page: Vec<Listed<MachinePoolView>>| {
                    let part = |pools| Part {
                        pools,
                        ..Part::default()
                    };
                    self.take_page(batch, by_cluster(page, |p| Some(&p.cluster_name)), part, &mut merged)
                },
            )
            .await?;
        }
        if let Some(resource) = &self.config_resource {
            for_each_page(
                &self.client,
                resource,
                namespace,
                |page: Vec<Listed<KubeadmConfigView>>| {
                    let (unlabeled, labeled): (Vec<_>, Vec<_>) =
                        page.into_iter().partition(|(_, k)| k.cluster_name.is_none());
                    let labeled = by_cluster(labeled, |k| k.cluster_name.as_ref());
                    let mut shard = write(&self.shard);
                    merged += share_out(&mut shard, clusters, labeled, |configs| Part {
                        configs,
                        ..Part::default()
                    });
                    if let Some(ticket) = configs {
                        merged += unlabeled.len();
                        shard.fill_namespace_part(ticket, unlabeled);
                    }
                    any_filling(&shard, batch)
                },
            )
            .await?;
        }
        let mut shard = write(&self.shard);
        if let Some(ticket) = configs {
            shard.namespace_filled(ticket);
        }
        for ticket in clusters {
            shard.filled(ticket);
        }
        Ok(merged)
    }
}

impl Management {
    /// Hands one page, by Cluster, to `batch`'s filling Clusters (`part` makes each one's share
    /// a [`Part`]), adding what was handed to `merged`; whether the list goes on.
    fn take_page<V>(
        &self,
        batch: &Batch,
        page: HashMap<Arc<str>, Vec<Listed<V>>>,
        part: impl Fn(Vec<Listed<V>>) -> Part,
        merged: &mut usize,
    ) -> bool {
        let mut shard = write(&self.shard);
        *merged += share_out(&mut shard, &batch.clusters, page, part);
        any_filling(&shard, batch)
    }
}

/// Whether the list of `batch` should go on: some slot of it is still filling.
fn any_filling(shard: &ShardStore, batch: &Batch) -> bool {
    batch
        .clusters
        .iter()
        .chain(&batch.configs)
        .any(|ticket| shard.is_filling(ticket))
}

/// Hands each filling Cluster of `clusters` its share of a page (`part` makes a [`Part`] of
/// it); the rest of the page is dropped. Returns how many objects were handed out.
fn share_out<V>(
    shard: &mut ShardStore,
    clusters: &[Ticket],
    mut page: HashMap<Arc<str>, Vec<Listed<V>>>,
    part: impl Fn(Vec<Listed<V>>) -> Part,
) -> usize {
    let mut handed = 0;
    for ticket in clusters {
        let mine = page.remove(ticket.name.as_str()).unwrap_or_default();
        handed += mine.len();
        shard.fill_part(ticket, part(mine));
    }
    handed
}

/// A page's views by their Cluster (`spec.clusterName`, a KubeadmConfig's label): each gained
/// Cluster's share is moved to it, not copied (one object belongs to one Cluster; the others of
/// the namespace are dropped).
fn by_cluster<V>(page: Vec<Listed<V>>, cluster: impl Fn(&V) -> Option<&Arc<str>>) -> HashMap<Arc<str>, Vec<Listed<V>>> {
    let mut by: HashMap<Arc<str>, Vec<Listed<V>>> = HashMap::new();
    for listed in page {
        if let Some(name) = cluster(&listed.1) {
            by.entry(Arc::clone(name)).or_default().push(listed);
        }
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gained(store: &mut ShardStore, clusters: &[(&str, &str)]) -> Served {
        let list: Vec<(String, String)> = clusters
            .iter()
            .map(|(ns, name)| ((*ns).to_owned(), (*name).to_owned()))
            .collect();
        store.serve(&list)
    }

    fn batch(served: Served) -> Batch {
        Batch {
            clusters: served.gained,
            configs: served.namespaces.into_iter().next(),
        }
    }

    #[test]
    fn one_list_of_a_namespace_at_a_time_and_what_waits_is_listed_once_next() {
        let fills = NamespaceFills::default();
        let mut store = ShardStore::default();
        let first = batch(gained(&mut store, &[("ns", "a")]));
        let started = fills.add("ns", first).expect("nothing runs: start a list");
        assert_eq!(started.clusters.len(), 1);
        assert!(started.configs.is_some(), "the namespace is new: its configs too");

        // Two more passes gain b, then c, while the first list runs: neither starts a list.
        let b = batch(gained(&mut store, &[("ns", "a"), ("ns", "b")]));
        assert_eq!(fills.add("ns", b), None);
        let c = batch(gained(&mut store, &[("ns", "a"), ("ns", "b"), ("ns", "c")]));
        assert_eq!(fills.add("ns", c), None);
        // Another namespace is listed beside it.
        let other = batch(gained(
            &mut store,
            &[("ns", "a"), ("ns", "b"), ("ns", "c"), ("other", "x")],
        ));
        assert!(fills.add("other", other).is_some());

        // The first list ends: b and c are listed together, once.
        let next = fills.next("ns").expect("b and c waited");
        let names: Vec<&str> = next.clusters.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(next.configs, None, "the namespace's configs were in the first list");
        // Nothing gained meanwhile: no list of ns runs any more, and the next gain starts one.
        assert_eq!(fills.next("ns"), None);
        let d = batch(gained(
            &mut store,
            &[("ns", "a"), ("ns", "b"), ("ns", "c"), ("other", "x"), ("ns", "d")],
        ));
        assert!(fills.add("ns", d).is_some());
    }

    #[test]
    fn a_list_goes_on_while_any_of_its_slots_fills_and_stops_once_none_does() {
        let mut store = ShardStore::default();
        let both = batch(gained(&mut store, &[("ns", "a"), ("ns", "b")]));
        assert!(any_filling(&store, &both));
        // a released: b (and the namespace's configs) still want the list.
        gained(&mut store, &[("ns", "b")]);
        assert!(any_filling(&store, &both));
        // Both released (the namespace with them): nothing wants it.
        gained(&mut store, &[]);
        assert!(!any_filling(&store, &both));
        // Gained again: new slots, which wait for a list of their own, not this one.
        gained(&mut store, &[("ns", "a"), ("ns", "b")]);
        assert!(!any_filling(&store, &both));
    }
}
