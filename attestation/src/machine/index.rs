//! The Cluster's Machines and pool instances by what a decision looks them up by: provider ID,
//! node name (claimed or `status.nodeRef`), the names a Machine carries, EK, and a
//! KubeadmConfig's name. Every join asks each of these, and walking the Cluster's Machines for
//! each made a decision's cost grow with the Cluster: 11% of the signer's CPU went to those
//! walks at 2,000 Machines, and a flood of junk CSRs paid them on every one (SPEC section 7, "A
//! hostile workload cluster"). Built once per [`super::Inventory`] (the controller shares one
//! inventory between decisions until the Cluster's objects change), a lookup is then a hash.
//!
//! A lookup returns candidates in inventory order, so a rule that takes "the first that
//! matches" takes the one a walk would have; the rule still applies its own test to each.

use std::collections::HashMap;

use super::Inventory;

/// Positions in [`Inventory::machines`], [`Inventory::pools`] and
/// [`Inventory::kubeadm_configs`], by key.
#[derive(Debug, Default, Clone)]
pub struct InventoryIndex {
    machines_by_provider_id: HashMap<String, Vec<usize>>,
    machines_without_provider_id: Vec<usize>,
    machines_by_node: HashMap<String, Vec<usize>>,
    machines_by_own_name: HashMap<String, Vec<usize>>,
    machines_by_ek: HashMap<String, Vec<usize>>,
    pools_by_provider_id: HashMap<String, Vec<usize>>,
    pools_by_claimed_node: HashMap<String, Vec<usize>>,
    pools_by_ek: HashMap<String, Vec<usize>>,
    configs_by_name: HashMap<String, Vec<usize>>,
}

fn add(map: &mut HashMap<String, Vec<usize>>, key: &str, at: usize) {
    let list = map.entry(key.to_owned()).or_default();
    if list.last() != Some(&at) {
        list.push(at);
    }
}

fn get<'m>(map: &'m HashMap<String, Vec<usize>>, key: &str) -> &'m [usize] {
    map.get(key).map_or(&[], Vec::as_slice)
}

/// The union of sorted position lists, sorted (inventory order).
fn union(lists: &[&[usize]]) -> Vec<usize> {
    let mut all: Vec<usize> = lists.iter().flat_map(|l| l.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    all
}

impl InventoryIndex {
    /// Indexes `inventory` (one pass over its objects).
    pub fn build(inventory: &Inventory) -> Self {
        let mut index = Self::default();
        for (at, machine) in inventory.machines.iter().enumerate() {
            match machine.provider_id() {
                Some(pid) => add(&mut index.machines_by_provider_id, pid, at),
                None => index.machines_without_provider_id.push(at),
            }
            for node in [machine.claimed_node(), machine.node_ref()].into_iter().flatten() {
                add(&mut index.machines_by_node, node, at);
            }
            add(&mut index.machines_by_own_name, machine.name(), at);
            if let Some(infrastructure) = machine.infrastructure_name() {
                add(&mut index.machines_by_own_name, infrastructure, at);
            }
            for address in machine.addresses().filter(|a| a.is_dns()) {
                add(
                    &mut index.machines_by_own_name,
                    &address.address.to_ascii_lowercase(),
                    at,
                );
            }
            for pin in machine.ek_pins().flat_map(|p| p.split(',')) {
                add(&mut index.machines_by_ek, &pin.trim().to_ascii_lowercase(), at);
            }
            if let Some(ek) = machine.valid_claim().and_then(|c| c.ek_sha256) {
                add(&mut index.machines_by_ek, &ek.to_ascii_lowercase(), at);
            }
        }
        for (at, pool) in inventory.pools.iter().enumerate() {
            for pid in &pool.provider_ids {
                add(&mut index.pools_by_provider_id, pid, at);
            }
            for claim in pool.claims.records() {
                add(&mut index.pools_by_claimed_node, &claim.node_name, at);
                if let Some(ek) = &claim.ek_sha256 {
                    add(&mut index.pools_by_ek, &ek.to_ascii_lowercase(), at);
                }
            }
            for pin in pool.ek_pins.iter().flat_map(|p| p.split(',')) {
                add(&mut index.pools_by_ek, &pin.trim().to_ascii_lowercase(), at);
            }
        }
        for (at, config) in inventory.kubeadm_configs.iter().enumerate() {
            add(&mut index.configs_by_name, config.name(), at);
        }
        index
    }

    /// Machines whose `spec.providerID` is `provider_id`.
    pub fn machines_with_provider_id(&self, provider_id: &str) -> &[usize] {
        get(&self.machines_by_provider_id, provider_id)
    }

    /// Machines without a provider ID yet (still being provisioned).
    pub fn machines_without_provider_id(&self) -> &[usize] {
        &self.machines_without_provider_id
    }

    /// Machines whose claim or `status.nodeRef` names `node`.
    pub fn machines_holding_node(&self, node: &str) -> &[usize] {
        get(&self.machines_by_node, node)
    }

    /// Machines holding `node` through their claim or nodeRef, or (`own_names`) through their
    /// name, infrastructure name or a DNS address (compared without case).
    pub fn machines_named(&self, node: &str, own_names: bool) -> Vec<usize> {
        let lower = node.to_ascii_lowercase();
        let mut lists = vec![get(&self.machines_by_node, node)];
        if own_names {
            lists.push(get(&self.machines_by_own_name, node));
            lists.push(get(&self.machines_by_own_name, &lower));
        }
        union(&lists)
    }

    /// Machines pinning `ek` (SHA-256 hex, any case) or whose valid claim records it.
    pub fn machines_with_ek(&self, ek: &str) -> &[usize] {
        get(&self.machines_by_ek, &ek.to_ascii_lowercase())
    }

    /// Pools listing `provider_id` in `spec.providerIDList`.
    pub fn pools_with_provider_id(&self, provider_id: &str) -> &[usize] {
        get(&self.pools_by_provider_id, provider_id)
    }

    /// Pools one of whose instance claims names `node`.
    pub fn pools_with_claimed_node(&self, node: &str) -> &[usize] {
        get(&self.pools_by_claimed_node, node)
    }

    /// Pools pinning `ek` or one of whose claims records it.
    pub fn pools_with_ek(&self, ek: &str) -> &[usize] {
        get(&self.pools_by_ek, &ek.to_ascii_lowercase())
    }

    /// KubeadmConfigs named `name` (one per namespace; the inventory may hold several).
    pub fn configs_named(&self, name: &str) -> &[usize] {
        get(&self.configs_by_name, name)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::machine::{KubeadmConfigView, MachinePoolView, MachineView};

    fn machine(name: &str, pid: Option<&str>, claim_node: Option<&str>, ek_pin: Option<&str>) -> Arc<MachineView> {
        let mut annotations = serde_json::Map::new();
        if let (Some(node), Some(pid)) = (claim_node, pid) {
            let claim = json!({"nodeName": node, "providerID": pid, "csrUID": "u", "claimedAt": "2026-11-26T00:00:00Z",
                               "ekSHA256": "AB".repeat(32)});
            annotations.insert(crate::names::ANNOTATION_CLAIM.into(), json!(claim.to_string()));
        }
        if let Some(pin) = ek_pin {
            annotations.insert(crate::names::ANNOTATION_EK_PIN.into(), json!(pin));
        }
        let mut spec = json!({"clusterName": "prod", "bootstrap": {}, "infrastructureRef": {"apiGroup": "x", "kind": "X", "name": format!("{name}-infra")}});
        if let Some(pid) = pid {
            spec["providerID"] = json!(pid);
        }
        Arc::new(
            MachineView::from_object(&json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
                "spec": spec,
                "status": {"nodeRef": {"name": format!("{name}-node")},
                           "addresses": [{"type": "InternalDNS", "address": format!("{name}.Example.Internal")}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn every_lookup_finds_what_a_walk_would_in_inventory_order() {
        let machines = vec![
            machine("m-0", Some("aws:///a/i-0"), Some("n-0"), None),
            machine("m-1", Some("aws:///a/i-1"), None, Some(&"cd".repeat(32))),
            machine("m-2", None, None, None),
            machine("m-3", Some("aws:///a/i-0"), None, None),
        ];
        let pool = MachinePoolView::from_object(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "pool", "namespace": "ns", "annotations": {
                crate::names::ANNOTATION_POOL_CLAIMS: json!({"aws:///a/i-9": {"nodeName": "n-9", "providerID": "aws:///a/i-9", "csrUID": "u", "claimedAt": "2026-11-26T00:00:00Z"}}).to_string()
            }},
            "spec": {"clusterName": "prod", "providerIDList": ["aws:///a/i-9"], "template": {"spec": {"bootstrap": {}}}}
        }));
        let pools = vec![Arc::new(pool.unwrap())];
        let configs = vec![Arc::new(
            KubeadmConfigView::from_object(&json!({
                "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
                "metadata": {"name": "m-0-kc", "namespace": "ns"}, "spec": {}
            }))
            .unwrap(),
        )];
        let inventory = Inventory::new(machines, pools, configs);
        let index = inventory.index();
        assert_eq!(index.machines_with_provider_id("aws:///a/i-0"), [0, 3]);
        assert_eq!(index.machines_with_provider_id("aws:///a/i-7"), [] as [usize; 0]);
        assert_eq!(index.machines_without_provider_id(), [2]);
        assert_eq!(index.machines_holding_node("n-0"), [0]);
        assert_eq!(index.machines_holding_node("m-1-node"), [1], "status.nodeRef");
        assert_eq!(index.machines_named("m-1", false), [] as [usize; 0]);
        assert_eq!(index.machines_named("m-1", true), [1], "its own name");
        assert_eq!(index.machines_named("m-2.example.internal", true), [2], "DNS, any case");
        assert_eq!(index.machines_with_ek(&"CD".repeat(32)), [1], "pinned");
        assert_eq!(index.machines_with_ek(&"ab".repeat(32)), [0], "claimed");
        assert_eq!(index.pools_with_provider_id("aws:///a/i-9"), [0]);
        assert_eq!(index.pools_with_claimed_node("n-9"), [0]);
        assert_eq!(index.configs_named("m-0-kc"), [0]);
    }
}
