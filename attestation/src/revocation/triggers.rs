//! Which recorded certificates are revoked, from the Cluster's Machines and MachinePools and
//! its workload cluster's Nodes: pure, so that the signer, its restart and `explain` agree.
//!
//! A Machine's certificates are revoked once Cluster API is done with its node, not when its
//! deletion starts: a draining kubelet must still finish its evicted pods and report its
//! volumes unmounted, or the drain stalls. Done means the Machine's v1beta2 `Deleting`
//! condition has moved past `WaitingForVolumeDetach` (Cluster API's
//! `internal/controllers/machine/machine_controller.go`, `reconcileDelete`: pre-drain hooks,
//! drain, volume detach, then pre-terminate hooks, infrastructure, bootstrap, the Node), or
//! the Node is gone, or the Machine is. A pool instance's are revoked once it leaves the
//! pool's `providerIDList` (the pool's scale-down), a Machine's or an instance's once it holds
//! another node's identity (its claim replaced).
//!
//! A Machine is found by its UID, or by its name where the UID differs but the provider ID is
//! the one the certificate was issued for: `clusterctl move` re-creates every object in the
//! target management cluster under a new UID, and a move must not read as every Machine gone.

use std::collections::{HashMap, HashSet};

use crate::machine::{Inventory, MachinePoolView, MachineView, TargetKind};

use super::RevokeReason;
use super::record::IssuedCertificate;

/// What the Nodes of the workload cluster are known to be.
#[derive(Debug, Clone, Copy)]
pub enum Nodes<'a> {
    /// Listed: these names exist.
    Listed(&'a HashSet<String>),
    /// Not listed (yet): no certificate is revoked because its Node is gone.
    Unknown,
}

impl Nodes<'_> {
    fn gone(&self, node: &str) -> bool {
        match self {
            Self::Listed(names) => !names.contains(node),
            Self::Unknown => false,
        }
    }
}

/// One revoked certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked<'a> {
    /// Its record entry.
    pub certificate: &'a IssuedCertificate,
    /// Why.
    pub why: RevokeReason,
}

/// The unexpired certificates of `issued` that are revoked now, given the Cluster's listed
/// `inventory` (never call it before its objects are listed: a Machine not yet listed would
/// read as gone) and its workload `nodes`.
pub fn revoked<'a>(
    issued: impl IntoIterator<Item = &'a IssuedCertificate>,
    inventory: &Inventory,
    nodes: Nodes<'_>,
    now: i64,
) -> Vec<Revoked<'a>> {
    let machines: HashMap<&str, &MachineView> = inventory.machines.iter().map(|m| (m.uid(), m.as_ref())).collect();
    let machines_named: HashMap<&str, &MachineView> =
        inventory.machines.iter().map(|m| (m.name(), m.as_ref())).collect();
    let pools: HashMap<&str, &MachinePoolView> = inventory.pools.iter().map(|p| (p.uid.as_str(), p.as_ref())).collect();
    let pools_named: HashMap<&str, &MachinePoolView> =
        inventory.pools.iter().map(|p| (p.name.as_str(), p.as_ref())).collect();
    issued
        .into_iter()
        .filter(|c| !c.expired(now))
        .filter_map(|certificate| {
            let why = match certificate.kind {
                TargetKind::Machine => {
                    let machine = machines.get(certificate.target_uid.as_str()).copied().or_else(|| {
                        machines_named
                            .get(certificate.target_name.as_str())
                            .copied()
                            .filter(|m| m.provider_id() == Some(certificate.provider_id.as_str()))
                    });
                    machine_reason(certificate, machine, nodes)
                }
                TargetKind::MachinePool => {
                    let pool = pools
                        .get(certificate.target_uid.as_str())
                        .or_else(|| pools_named.get(certificate.target_name.as_str()))
                        .copied();
                    pool_reason(certificate, pool)
                }
            }?;
            Some(Revoked { certificate, why })
        })
        .collect()
}

fn machine_reason(
    certificate: &IssuedCertificate,
    machine: Option<&MachineView>,
    nodes: Nodes<'_>,
) -> Option<RevokeReason> {
    let Some(machine) = machine else {
        return Some(RevokeReason::MachineGone);
    };
    if machine.deleting && (machine.node_released() || nodes.gone(&certificate.node)) {
        return Some(RevokeReason::MachineReleased);
    }
    let provider_changed = machine.provider_id().is_some_and(|p| p != certificate.provider_id);
    let node_changed = machine.claimed_node().is_some_and(|n| n != certificate.node);
    (provider_changed || node_changed).then_some(RevokeReason::ClaimReplaced)
}

fn pool_reason(certificate: &IssuedCertificate, pool: Option<&MachinePoolView>) -> Option<RevokeReason> {
    let Some(pool) = pool else {
        return Some(RevokeReason::PoolGone);
    };
    if !pool.provider_ids.contains(&certificate.provider_id) {
        return Some(RevokeReason::PoolInstanceGone);
    }
    let claimed = pool.claims.instance(&certificate.provider_id);
    claimed
        .valid()
        .is_some_and(|c| c.node_name != certificate.node)
        .then_some(RevokeReason::ClaimReplaced)
}

/// The node names live Machines and pool instances use: their claims' and their nodeRefs'.
/// Before 1.32 a revoked certificate is refused by its node name, only while no name here is
/// it (a new Machine of the same name must keep working).
pub fn live_node_names(inventory: &Inventory) -> HashSet<&str> {
    let mut names = HashSet::new();
    for machine in inventory.machines.iter().filter(|m| !(m.deleting && m.node_released())) {
        names.extend(machine.claimed_node());
        names.extend(machine.node_ref());
    }
    for pool in &inventory.pools {
        names.extend(pool.node_refs.iter().map(String::as_str));
        for record in pool
            .claims
            .records()
            .filter(|r| pool.provider_ids.contains(&r.provider_id))
        {
            names.insert(record.node_name.as_str());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::revocation::CredentialId;

    const NOW: i64 = 1_800_000_000;

    fn machine(name: &str, uid: &str, provider_id: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut m = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "team-a", "uid": uid,
                         "labels": {"cluster.x-k8s.io/cluster-name": "prod"}},
            "spec": {"clusterName": "prod", "providerID": provider_id,
                     "bootstrap": {"dataSecretName": "x"}, "infrastructureRef": {"apiGroup": "x", "kind": "X", "name": name}},
            "status": {"nodeRef": {"name": name}}
        });
        json_merge(&mut m, extra);
        m
    }

    fn json_merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, value) => *slot = value,
        }
    }

    fn deleting(reason: &str) -> serde_json::Value {
        json!({"metadata": {"deletionTimestamp": "2027-01-01T00:00:00Z", "finalizers": ["machine.cluster.x-k8s.io"]},
               "status": {"conditions": [{"type": "Deleting", "status": "True", "reason": reason,
                                          "lastTransitionTime": "2027-01-01T00:00:00Z"}]}})
    }

    fn inventory(machines: &[serde_json::Value], pools: &[serde_json::Value]) -> Inventory {
        Inventory::new(
            machines
                .iter()
                .map(|m| std::sync::Arc::new(MachineView::from_object(m).unwrap()))
                .collect(),
            pools
                .iter()
                .map(|p| std::sync::Arc::new(MachinePoolView::from_object(p).unwrap()))
                .collect(),
            Vec::new(),
        )
    }

    fn issued(kind: TargetKind, uid: &str, node: &str, provider_id: &str, not_after: i64) -> IssuedCertificate {
        IssuedCertificate {
            id: CredentialId::of_certificate(format!("{uid}{node}{provider_id}{not_after}").as_bytes()),
            not_after,
            kind,
            target_uid: uid.into(),
            target_name: node.into(),
            node: node.into(),
            provider_id: provider_id.into(),
        }
    }

    fn reasons(issued: &[IssuedCertificate], inventory: &Inventory, nodes: Nodes<'_>) -> Vec<(String, RevokeReason)> {
        revoked(issued, inventory, nodes, NOW)
            .into_iter()
            .map(|r| (r.certificate.node.clone(), r.why))
            .collect()
    }

    #[test]
    fn a_deleted_machines_certificates_go_once_cluster_api_is_done_with_its_node() {
        let pid = "aws:///a/i-1";
        let cert = [issued(TargetKind::Machine, "u1", "worker-1", pid, NOW + 3600)];
        let names: HashSet<String> = ["worker-1".to_owned()].into();
        let listed = Nodes::Listed(&names);
        // Live, and every stage of a deletion before the drain and volume detach are over.
        for extra in [
            json!({}),
            deleting("WaitingForPreDrainHook"),
            deleting("DrainingNode"),
            deleting("WaitingForVolumeDetach"),
            deleting("Deleting"),
            json!({"metadata": {"deletionTimestamp": "2027-01-01T00:00:00Z", "finalizers": ["x"]}}),
        ] {
            let inv = inventory(&[machine("worker-1", "u1", pid, extra.clone())], &[]);
            assert_eq!(reasons(&cert, &inv, listed), vec![], "{extra}");
        }
        for reason in [
            "WaitingForPreTerminateHook",
            "WaitingForInfrastructureDeletion",
            "WaitingForBootstrapDeletion",
            "DeletingNode",
            "DeletionCompleted",
        ] {
            let inv = inventory(&[machine("worker-1", "u1", pid, deleting(reason))], &[]);
            assert_eq!(
                reasons(&cert, &inv, Nodes::Unknown),
                vec![("worker-1".to_owned(), RevokeReason::MachineReleased)],
                "{reason}"
            );
        }
        // Draining, but its Node is gone: nothing left to drain.
        let none = HashSet::new();
        let inv = inventory(&[machine("worker-1", "u1", pid, deleting("DrainingNode"))], &[]);
        assert_eq!(
            reasons(&cert, &inv, Nodes::Listed(&none)),
            vec![("worker-1".to_owned(), RevokeReason::MachineReleased)]
        );
        // A live Machine whose Node was deleted by hand keeps its identity (it re-registers).
        let inv = inventory(&[machine("worker-1", "u1", pid, json!({}))], &[]);
        assert_eq!(reasons(&cert, &inv, Nodes::Listed(&none)), vec![]);
        // Gone: revoked, whatever the Nodes.
        assert_eq!(
            reasons(&cert, &inventory(&[], &[]), Nodes::Unknown),
            vec![("worker-1".to_owned(), RevokeReason::MachineGone)]
        );
        // Expired: nothing left to refuse.
        let old = [issued(TargetKind::Machine, "u1", "worker-1", pid, NOW)];
        assert_eq!(reasons(&old, &inventory(&[], &[]), Nodes::Unknown), vec![]);
    }

    #[test]
    fn a_v1beta1_machine_is_read_from_its_v1beta2_conditions() {
        let pid = "aws:///a/i-1";
        let cert = [issued(TargetKind::Machine, "u1", "worker-1", pid, NOW + 3600)];
        let mut m = machine(
            "worker-1",
            "u1",
            pid,
            json!({"metadata": {"deletionTimestamp": "2027-01-01T00:00:00Z", "finalizers": ["x"]}}),
        );
        m["apiVersion"] = json!("cluster.x-k8s.io/v1beta1");
        m["status"]["v1beta2"] = json!({"conditions": [{"type": "Deleting", "status": "True", "reason": "WaitingForInfrastructureDeletion"}]});
        let inv = inventory(&[m], &[]);
        assert_eq!(
            reasons(&cert, &inv, Nodes::Unknown),
            vec![("worker-1".to_owned(), RevokeReason::MachineReleased)]
        );
    }

    #[test]
    fn a_moved_machine_keeps_its_identity() {
        let pid = "aws:///a/i-1";
        let mut cert = issued(TargetKind::Machine, "old-uid", "worker-1", pid, NOW + 3600);
        cert.target_name = "worker-1".into();
        let inv = inventory(&[machine("worker-1", "new-uid", pid, json!({}))], &[]);
        assert_eq!(reasons(std::slice::from_ref(&cert), &inv, Nodes::Unknown), vec![]);
        // Another Machine of that name on another instance is not it.
        let inv = inventory(&[machine("worker-1", "new-uid", "aws:///a/i-2", json!({}))], &[]);
        assert_eq!(
            reasons(&[cert], &inv, Nodes::Unknown),
            vec![("worker-1".to_owned(), RevokeReason::MachineGone)]
        );
    }

    #[test]
    fn a_replaced_claim_revokes_the_old_identity_not_the_new() {
        let old = issued(TargetKind::Machine, "u1", "worker-1", "aws:///a/i-old", NOW + 3600);
        let new = issued(TargetKind::Machine, "u1", "worker-1", "aws:///a/i-new", NOW + 3600);
        let inv = inventory(&[machine("worker-1", "u1", "aws:///a/i-new", json!({}))], &[]);
        assert_eq!(
            reasons(&[old, new], &inv, Nodes::Unknown),
            vec![("worker-1".to_owned(), RevokeReason::ClaimReplaced)]
        );
    }

    #[test]
    fn a_pool_instance_is_revoked_when_it_leaves_the_providerid_list() {
        let pool = |ids: &[&str]| {
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
                   "metadata": {"name": "pool", "namespace": "team-a", "uid": "p1"},
                   "spec": {"clusterName": "prod", "providerIDList": ids,
                            "template": {"spec": {"clusterName": "prod", "bootstrap": {"dataSecretName": "x"}}}}})
        };
        let a = issued(TargetKind::MachinePool, "p1", "node-a", "aws:///a/i-a", NOW + 3600);
        let b = issued(TargetKind::MachinePool, "p1", "node-b", "aws:///a/i-b", NOW + 3600);
        let certs = [a, b];
        let inv = inventory(&[], &[pool(&["aws:///a/i-a", "aws:///a/i-b"])]);
        assert_eq!(reasons(&certs, &inv, Nodes::Unknown), vec![]);
        let inv = inventory(&[], &[pool(&["aws:///a/i-a"])]);
        assert_eq!(
            reasons(&certs, &inv, Nodes::Unknown),
            vec![("node-b".to_owned(), RevokeReason::PoolInstanceGone)]
        );
        let inv = inventory(&[], &[]);
        assert_eq!(reasons(&certs, &inv, Nodes::Unknown).len(), 2);
    }

    #[test]
    fn live_names_are_those_of_machines_cluster_api_still_runs() {
        let inv = inventory(
            &[
                machine("worker-1", "u1", "aws:///a/i-1", json!({})),
                machine("worker-2", "u2", "aws:///a/i-2", deleting("DrainingNode")),
                machine(
                    "worker-3",
                    "u3",
                    "aws:///a/i-3",
                    deleting("WaitingForInfrastructureDeletion"),
                ),
            ],
            &[],
        );
        let names = live_node_names(&inv);
        assert!(names.contains("worker-1") && names.contains("worker-2"));
        assert!(!names.contains("worker-3"));
    }
}
