//! One workload cluster's Nodes, reduced to name and provider ID.
//!
//! Rule 11 asks whether any Node already carries a Machine's or pool instance's provider ID
//! (a pool instance has no name of its own to look up, and a node may register under any
//! name). No field selector answers that, and a list per CSR would cost a full Node list on
//! every decision, so each worker keeps this index from one Node watch. Only two strings per
//! Node are kept; the watch's objects are dropped as they arrive.
//!
//! Lookups by name come from the same index: the watch is already paid for, and a
//! GET per decision was one of the five round trips of every join. The index trails the
//! apiserver by the watch's delivery delay (milliseconds); a GET made before deciding was no
//! fresher at the moment of signing, which comes later still. What makes two identities for one
//! node impossible is the claim (precondition and re-check), not the Node lookup.
//!
//! Until the first list completes, and after the watch fails, lookups answer
//! [`NodeLookup::Unavailable`]: the rule engine then holds initial requests instead of
//! guessing that no Node exists.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use attestation::machine::NodeView;
use attestation::{NodeDirectory, NodeLookup};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::resumed::{Next, Resumption};
use crate::controller::backoff::Backoff;

/// Nodes by name and by provider ID, kept by [`NodeIndex::watch`].
#[derive(Debug, Default)]
pub struct NodeIndex {
    state: RwLock<IndexState>,
    /// Cuts a failed watch's backoff short (the CSR watch is back: so is the apiserver).
    retry: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct IndexState {
    /// The watch has listed every Node and is not failing now.
    live: bool,
    /// Why it is not live, for the rule's message.
    why_not: Option<String>,
    by_name: HashMap<String, Option<String>>,
    by_provider_id: HashMap<String, BTreeSet<String>>,
    /// Nodes of a relist in progress, swapped in when it completes.
    relist: Option<HashMap<String, Option<String>>>,
    /// A list has completed: what the index holds is the cluster's Nodes as of some version,
    /// which a watch started again from it brings up to date.
    listed_once: bool,
    /// Counts every change of the index, so a reader can tell it has not changed since its
    /// last look without copying it ([`NodeIndex::generation`]).
    changes: u64,
}

impl IndexState {
    /// Why lookups cannot be answered now, if they cannot.
    fn unavailable(&self) -> Option<NodeLookup> {
        (!self.live).then(|| {
            NodeLookup::Unavailable(
                self.why_not
                    .clone()
                    .unwrap_or_else(|| "the workload cluster's Nodes are not listed yet".to_owned()),
            )
        })
    }

    fn insert(&mut self, name: String, provider_id: Option<String>) {
        self.changes = self.changes.wrapping_add(1);
        self.remove(&name);
        if let Some(pid) = &provider_id {
            self.by_provider_id.entry(pid.clone()).or_default().insert(name.clone());
        }
        self.by_name.insert(name, provider_id);
    }

    fn remove(&mut self, name: &str) {
        self.changes = self.changes.wrapping_add(1);
        if let Some(Some(pid)) = self.by_name.remove(name)
            && let Some(names) = self.by_provider_id.get_mut(&pid)
        {
            names.remove(name);
            if names.is_empty() {
                self.by_provider_id.remove(&pid);
            }
        }
    }

    fn replace_all(&mut self, nodes: HashMap<String, Option<String>>) {
        self.changes = self.changes.wrapping_add(1);
        self.by_name.clear();
        self.by_provider_id.clear();
        for (name, pid) in nodes {
            self.insert(name, pid);
        }
    }
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .filter(|p| !p.is_empty())
}

impl NodeIndex {
    /// Every Node, when the index is live (SPEC section 7: the Nodes outside attestation);
    /// otherwise why not.
    pub fn all(&self) -> Result<Vec<NodeView>, String> {
        let state = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(NodeLookup::Unavailable(why)) = state.unavailable() {
            return Err(why);
        }
        Ok(state
            .by_name
            .iter()
            .map(|(name, provider_id)| NodeView {
                name: name.clone(),
                provider_id: provider_id.clone(),
            })
            .collect())
    }

    /// A number that changes whenever the index does; `None` while it is not live.
    pub fn generation(&self) -> Option<u64> {
        let state = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.live.then_some(state.changes)
    }

    /// The Node called `name`.
    pub fn with_name(&self, name: &str) -> NodeLookup {
        let state = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(unavailable) = state.unavailable() {
            return unavailable;
        }
        match state.by_name.get(name) {
            Some(provider_id) => NodeLookup::Found(NodeView {
                name: name.to_owned(),
                provider_id: provider_id.clone(),
            }),
            None => NodeLookup::Absent,
        }
    }

    /// Number of Nodes indexed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_name
            .len()
    }

    fn apply(&self, event: watcher::Event<Node>) {
        let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            watcher::Event::Init => state.relist = Some(HashMap::new()),
            watcher::Event::InitApply(node) => {
                let entry = (node.name_any(), provider_id(&node));
                match state.relist.as_mut() {
                    Some(relist) => {
                        relist.insert(entry.0, entry.1);
                    }
                    None => state.insert(entry.0, entry.1),
                }
            }
            watcher::Event::InitDone => {
                let nodes = state.relist.take().unwrap_or_default();
                state.replace_all(nodes);
                state.live = true;
                state.listed_once = true;
                state.why_not = None;
            }
            watcher::Event::Apply(node) => state.insert(node.name_any(), provider_id(&node)),
            watcher::Event::Delete(node) => state.remove(&node.name_any()),
        }
    }

    fn failed(&self, why: String) {
        let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.live = false;
        state.why_not = Some(why);
    }

    /// Retries a failed Node watch now instead of after its backoff: called when the
    /// cluster's CSR watch has listed again, so that CSRs seen then are not held until the
    /// Node watch's own next attempt (up to 30 s after a long outage).
    pub fn retry_now(&self) {
        self.retry.notify_waiters();
    }

    /// Keeps the index from a Node watch until the future is dropped.
    pub async fn watch(&self, client: Client) {
        let api: Api<Node> = Api::all(client);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        let mut backoff = Backoff::default();
        // A watch started again after a failure says nothing when it works (super::resumed):
        // the index, kept as it was and brought up to date by what the watch delivers from
        // its version on, is live again then.
        let mut resumption = Resumption::default();
        loop {
            match resumption.next(&mut events).await {
                Next::Event(Ok(event)) => {
                    if resumption.up_on(&event) {
                        backoff.reset();
                        self.live_again();
                    }
                    self.apply(event);
                }
                Next::Event(Err(e)) => {
                    self.failed(format!("the Node watch of the workload cluster failed: {e}"));
                    tokio::select! {
                        () = backoff.wait() => {}
                        () = self.retry.notified() => {}
                    }
                    resumption.retrying();
                }
                Next::UpAgain => {
                    backoff.reset();
                    self.live_again();
                }
                Next::Ended => break,
            }
        }
    }

    /// The watch is up again after a failure, from the version it had: the index is live.
    /// (Before its first list it is not: only that list's end makes it live.)
    fn live_again(&self) {
        let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.listed_once {
            state.live = true;
            state.why_not = None;
        }
    }
}

impl NodeDirectory for NodeIndex {
    fn node(&self, name: &str) -> NodeLookup {
        self.with_name(name)
    }

    fn nodes_with_provider_id(&self, provider_id: &str) -> Result<Vec<String>, String> {
        let state = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(NodeLookup::Unavailable(why)) = state.unavailable() {
            return Err(why);
        }
        Ok(state
            .by_provider_id
            .get(provider_id)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pid: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: pid.map(str::to_owned),
            ..Default::default()
        });
        node
    }

    #[test]
    fn lookups_wait_for_the_first_list_then_follow_the_watch() {
        let index = NodeIndex::default();
        assert!(index.nodes_with_provider_id("p-1").is_err());
        index.apply(watcher::Event::Init);
        index.apply(watcher::Event::InitApply(node("a", Some("p-1"))));
        assert!(index.nodes_with_provider_id("p-1").is_err(), "half a list is no answer");
        index.apply(watcher::Event::InitDone);
        assert_eq!(index.nodes_with_provider_id("p-1"), Ok(vec!["a".to_owned()]));
        assert_eq!(index.nodes_with_provider_id("p-2"), Ok(vec![]));
        assert_eq!(
            index.with_name("a"),
            NodeLookup::Found(NodeView {
                name: "a".into(),
                provider_id: Some("p-1".into())
            })
        );
        assert_eq!(index.with_name("z"), NodeLookup::Absent);

        // A Node whose provider ID changes, one deleted, one added.
        index.apply(watcher::Event::Apply(node("a", Some("p-2"))));
        assert_eq!(index.nodes_with_provider_id("p-1"), Ok(vec![]));
        assert_eq!(index.nodes_with_provider_id("p-2").map(|n| n.len()), Ok(1));
        index.apply(watcher::Event::Delete(node("a", Some("p-2"))));
        assert_eq!(index.nodes_with_provider_id("p-2"), Ok(vec![]));
        index.apply(watcher::Event::Apply(node("b", None)));
        assert_eq!(index.len(), 1);

        // A relist replaces everything; a failure makes lookups wait again.
        index.apply(watcher::Event::Init);
        index.apply(watcher::Event::InitApply(node("c", Some("p-3"))));
        index.apply(watcher::Event::InitDone);
        assert_eq!(index.len(), 1);
        assert_eq!(index.nodes_with_provider_id("p-3").map(|n| n.len()), Ok(1));
        // Two Nodes carrying one provider ID are both named, whichever registered first.
        index.apply(watcher::Event::Apply(node("b-intruder", Some("p-3"))));
        assert_eq!(
            index.nodes_with_provider_id("p-3"),
            Ok(vec!["b-intruder".to_owned(), "c".to_owned()])
        );
        index.failed("gone".into());
        assert_eq!(index.nodes_with_provider_id("p-3"), Err("gone".into()));
        assert_eq!(index.with_name("c"), NodeLookup::Unavailable("gone".into()));
    }

    #[test]
    fn a_failed_watch_started_again_makes_a_listed_index_live_and_an_unlisted_one_not() {
        let index = NodeIndex::default();
        index.live_again();
        assert!(
            index.nodes_with_provider_id("p-1").is_err(),
            "never listed: only a list's end makes it live"
        );
        index.apply(watcher::Event::Init);
        index.apply(watcher::Event::InitApply(node("a", Some("p-1"))));
        index.apply(watcher::Event::InitDone);
        assert_eq!(index.nodes_with_provider_id("p-1").unwrap(), ["a"]);
        index.failed("the Node watch of the workload cluster failed: cut".into());
        let down = index.nodes_with_provider_id("p-1").unwrap_err();
        assert!(down.contains("cut"), "{down}");
        index.live_again();
        assert_eq!(
            index.nodes_with_provider_id("p-1").unwrap(),
            ["a"],
            "what it held, live again"
        );
    }
}
