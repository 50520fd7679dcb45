//! Clusters that run kubelet-authenticator without being opted in (SPEC section 7, "Told before
//! it breaks"): their control plane's or a MachineDeployment's bootstrap template carries the
//! plugin, so their new nodes file CSRs for the signer's names and wait (the plugin's
//! `--timeout`, 15 minutes) for an answer no signer gives, and a MachineHealthCheck replaces
//! them after its own timeout (10 minutes by default), again and again. Usually the opt-in
//! annotation was forgotten, or removed before the templates were.
//!
//! Every `--secret-resync-period` this replica reads the templates of the namespaces holding
//! Clusters that are not opted in and that the shard gives it (the same rendezvous over their
//! UIDs that shares the opted-in ones, so each is looked at by one replica), and for each
//! Cluster found sets `node_attestation_cluster_templated_not_opted_in{cluster}` and records a
//! Warning Event `TemplatedButNotOptedIn` on it once (again if what carries the plugin changes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use attestation::machine::ClusterView;
use kube::runtime::events::EventType;

use super::scope::{Scope, assign};
use crate::controller::events::{cluster_reference, publish};
use crate::controller::workload::Shared;

/// The room: the shared state, its own view of the shard, what was warned of.
pub struct TemplatedScan {
    shared: Arc<Shared>,
    scope: Scope,
    /// Cluster key to what carried the plugin when it was last warned of.
    warned: HashMap<String, String>,
}

impl TemplatedScan {
    /// A scan over `scope`'s share of the Clusters that are not opted in.
    pub fn new(shared: Arc<Shared>, scope: Scope) -> Self {
        Self {
            shared,
            scope,
            warned: HashMap::new(),
        }
    }

    /// Scans every `--secret-resync-period`, forever.
    pub async fn run(mut self) {
        loop {
            tokio::time::sleep(self.shared.settings.secret_resync).await;
            if self.shared.management.synced() {
                self.scan().await;
            }
        }
    }

    async fn scan(&mut self) {
        let view = self.scope.view();
        if view.as_ref().is_some_and(super::membership::View::standing_aside) {
            // Fenced or not yet counted: another replica looks at these Clusters meanwhile.
            self.shared.metrics.templated_not_opted_in(&[]);
            return;
        }
        let not_opted_in = self.shared.management.clusters.select(|c| !c.opted_in);
        let mine = assign(view.as_ref(), not_opted_in).mine;
        let mut by_namespace: BTreeMap<&str, Vec<&ClusterView>> = BTreeMap::new();
        for cluster in &mine {
            by_namespace
                .entry(cluster.namespace.as_str())
                .or_default()
                .push(cluster);
        }
        let mut found: BTreeMap<String, (ClusterView, Vec<String>)> = BTreeMap::new();
        for (namespace, clusters) in by_namespace {
            let templates = match self.shared.management.plugin_templates(namespace).await {
                Ok(templates) => templates,
                Err(e) => {
                    tracing::debug!(%namespace, error = %e, "cannot read the templates; looked at again next period");
                    continue;
                }
            };
            for template in templates {
                if let Some(cluster) = clusters.iter().find(|c| c.name == template.cluster) {
                    found
                        .entry(cluster.key())
                        .or_insert_with(|| ((*cluster).clone(), Vec::new()))
                        .1
                        .push(template.what);
                }
            }
        }
        self.shared
            .metrics
            .templated_not_opted_in(&found.keys().cloned().collect::<Vec<_>>());
        for (key, (cluster, what)) in &found {
            let what = what.join(", ");
            if self.warned.get(key) == Some(&what) {
                continue;
            }
            tracing::warn!(cluster = %key, templates = %what, "runs kubelet-authenticator without being opted in: its new nodes wait for an answer no signer gives");
            publish(
                &self.shared.recorder,
                &cluster_reference(cluster),
                EventType::Warning,
                "TemplatedButNotOptedIn",
                "Check",
                &format!(
                    "{what} run kubelet-authenticator, but the Cluster is not opted in (annotation {}=\"true\"): its new nodes wait for a certificate no signer issues, and a MachineHealthCheck replaces them; opt it in, or roll the templates back to kubeadm's node configuration",
                    attestation::names::ANNOTATION_OPT_IN
                ),
            )
            .await;
            self.warned.insert(key.clone(), what);
        }
        self.warned.retain(|key, _| found.contains_key(key));
    }
}
