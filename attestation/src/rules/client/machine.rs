//! SPEC rules 9 and 10: the Machine (or MachinePool instance) the provider ID names, and the
//! node name it may have. Rule 9 finds exactly one target and checks it is not being deleted and
//! its bootstrap is done (a node asking for a provider ID no Machine or pool has is refused at
//! once, naming the deletion: its Machine was deleted or its instance removed); rule 10 checks the node name against the claim, `status.nodeRef` or
//! the Machine's own names, and that no other Machine or instance holds it.

use super::super::{Book, Inputs, NodeLookup, shown};
use super::target::Target;
use crate::claim::ClaimState;
use crate::decision::{DenyReason, Rule};
use crate::identity::{NodeName, ProviderId};
use crate::machine::{MachinePoolView, MachineView};

/// Rule 9: the one Machine or MachinePool of the Cluster that owns the provider ID. `by_node`:
/// the node itself asks (a renewal, or an adoption), holding an identity of the cluster already.
pub(super) fn find_target<'a>(
    book: &mut Book,
    inputs: &Inputs<'a>,
    pid: &ProviderId,
    by_node: bool,
) -> Option<Target<'a>> {
    let cluster = inputs.cluster;
    let ours = |name: &str, ns: &str, cluster_name: &str| {
        ns == cluster.namespace && cluster_name == cluster.name && !name.is_empty()
    };
    // Looked up by provider ID (every join asks; a walk of the Cluster's Machines made a
    // decision's cost grow with the Cluster).
    let inventory = inputs.inventory;
    let index = inventory.index();
    let pools: Vec<&MachinePoolView> = inventory
        .pools
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| ours(&p.name, &p.namespace, &p.cluster_name))
        .collect();

    let matching: Vec<&MachineView> = index
        .machines_with_provider_id(pid.as_str())
        .iter()
        .map(|&at| inventory.machines[at].as_ref())
        .filter(|m| m.provider_id() == Some(pid.as_str()) && ours(m.name(), &m.namespace, &m.cluster_name))
        .collect();
    let target = match matching.as_slice() {
        [one] => Target::Machine(one),
        [] => {
            let listing: Vec<&MachinePoolView> = index
                .pools_with_provider_id(pid.as_str())
                .iter()
                .map(|&at| inventory.pools[at].as_ref())
                .filter(|p| ours(&p.name, &p.namespace, &p.cluster_name))
                .filter(|p| p.provider_ids.iter().any(|x| x == pid.as_str()))
                .collect();
            match listing.as_slice() {
                [one] => Target::Pool(one),
                [] => {
                    let unset = index
                        .machines_without_provider_id()
                        .iter()
                        .map(|&at| inventory.machines[at].as_ref())
                        .filter(|m| ours(m.name(), &m.namespace, &m.cluster_name))
                        .count();
                    let message = format!(
                        "no Machine or MachinePool of Cluster {} has provider ID {}",
                        cluster.name,
                        shown(pid.as_str())
                    );
                    if by_node {
                        // The node renews (or is adopted) for a provider ID that no Machine has
                        // and no pool lists: no gap that closes by itself. Its Machine had that
                        // provider ID when it was claimed, and Cluster API never gives a
                        // Machine's provider ID to another Machine, nor lists a removed
                        // instance again (a pool's infrastructure provider removes an instance
                        // from spec.providerIDList when it deletes it). The Machine is gone,
                        // and its claim with it: said at once, not after --csr-max-age.
                        book.fail(Rule::Machine, DenyReason::MachineNotFound, gone(&pools, pid, message));
                    } else if unset == 0 && pools.is_empty() {
                        book.fail(Rule::Machine, DenyReason::MachineNotFound, message);
                    } else {
                        // A Machine still without providerID, or a pool's list lagging, may be it.
                        book.pending(
                            Rule::Machine,
                            format!(
                                "{message} yet ({unset} Machines without providerID, {} MachinePools)",
                                pools.len()
                            ),
                        );
                    }
                    return None;
                }
                many => {
                    book.fail(
                        Rule::Machine,
                        DenyReason::MachineNotFound,
                        format!(
                            "provider ID {} is listed by {} MachinePools",
                            shown(pid.as_str()),
                            many.len()
                        ),
                    );
                    return None;
                }
            }
        }
        many => {
            let names: Vec<&str> = many.iter().take(4).map(|m| m.name()).collect();
            book.fail(
                Rule::Machine,
                DenyReason::MachineNotFound,
                format!(
                    "provider ID {} is on {} Machines ({})",
                    shown(pid.as_str()),
                    many.len(),
                    names.join(", ")
                ),
            );
            return None;
        }
    };
    let (deleting, ready) = match target {
        Target::Machine(m) => (m.deleting, m.bootstrap_ready),
        Target::Pool(p) => (p.deleting, p.bootstrap_ready),
    };
    if deleting {
        book.fail(
            Rule::Machine,
            DenyReason::MachineNotReady,
            format!(
                "{} is being deleted (deletionTimestamp set): a Machine on its way out gets no new certificate, and its claim goes with it",
                target.describe()
            ),
        );
    } else if !ready {
        book.pending(
            Rule::Machine,
            format!("{} has no bootstrap data yet", target.describe()),
        );
    } else {
        book.pass(Rule::Machine, format!("{} owns the provider ID", target.describe()));
    }
    Some(target)
}

/// Rule 9's refusal of a node asking for a provider ID no Machine has and no pool lists: its
/// Machine was deleted, or its instance removed from a MachinePool (whose record of the claim,
/// until the pool's next claim write prunes it, is named when it is still there).
fn gone(pools: &[&MachinePoolView], pid: &ProviderId, message: String) -> String {
    let removed = pools.iter().find_map(|p| {
        p.claims
            .records()
            .find(|c| c.provider_id == pid.as_str())
            .map(|c| (p.name.as_str(), c.node_name.as_str()))
    });
    match removed {
        Some((pool, node)) => format!(
            "{message}: the instance was removed from MachinePool {pool}'s spec.providerIDList (scaled down or replaced), and its claim for node {} ended with it; a node renews only for the Machine or instance it claimed",
            shown(node)
        ),
        None => format!(
            "{message}: the node's Machine was deleted (or its MachinePool instance removed), and its claim with it; a node renews only for the Machine or instance it claimed"
        ),
    }
}

/// Rule 10: the node name fits the Machine, and no other Machine or instance holds it.
pub(super) fn check_node_name(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    name: &NodeName,
    pid: &ProviderId,
    lookup: &NodeLookup,
) {
    let fits = match (claim, target) {
        (ClaimState::Valid(c), _) => {
            if c.node_name == name.as_str() {
                Ok("the claim's node name".to_owned())
            } else {
                Err(format!("the claim is for node {}", shown(&c.node_name)))
            }
        }
        (_, Target::Machine(m)) => match m.node_ref() {
            Some(node_ref) if node_ref == name.as_str() => Ok("status.nodeRef.name".to_owned()),
            Some(node_ref) => Err(format!("status.nodeRef.name is {}", shown(node_ref))),
            None => {
                if m.name() == name.as_str() {
                    Ok("the Machine name".to_owned())
                } else if matches!(lookup, NodeLookup::Found(node) if node.provider_id.as_deref() == Some(pid.as_str()))
                {
                    Ok("the registered Node carrying its provider ID".to_owned())
                } else if m.infrastructure_name() == Some(name.as_str()) {
                    Ok("spec.infrastructureRef.name".to_owned())
                } else if let Some(a) = m
                    .addresses()
                    .find(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name.as_str()))
                {
                    Ok(format!("the {} address", a.kind))
                } else {
                    Err(format!(
                        "neither the Machine name {}, its infrastructure name, nor a Hostname/DNS address",
                        shown(m.name())
                    ))
                }
            }
        },
        (_, Target::Pool(_)) => Ok("a MachinePool instance: bound by its claim from now on".to_owned()),
    };
    // A name that fits none of the Machine's own names may still be its registered Node's
    // (adoption): when the Nodes cannot be read, that waits instead of failing.
    if fits.is_err()
        && let (NodeLookup::Unavailable(why), Target::Machine(m)) = (lookup, target)
        && m.node_ref().is_none()
    {
        book.pending(Rule::NodeName, format!("cannot look up Node {name}: {why}"));
        return;
    }
    let fits = fits.and_then(|how| match name_held_elsewhere(inputs, target, name, pid) {
        Some(holder) => Err(format!("the name belongs to {holder}: one node name, one Machine")),
        None => Ok(how),
    });
    match fits {
        Err(why) => book.fail(
            Rule::NodeName,
            DenyReason::NodeNameMismatch,
            format!("node name {} does not fit {}: {why}", name, target.describe()),
        ),
        Ok(how) => match lookup {
            NodeLookup::Found(node) if node.provider_id.as_deref().is_some_and(|p| p != pid.as_str()) => book.fail(
                Rule::NodeName,
                DenyReason::NodeNameMismatch,
                format!(
                    "Node {name} exists with providerID {}",
                    shown(node.provider_id.as_deref().unwrap_or_default())
                ),
            ),
            NodeLookup::Unavailable(why) => book.pending(Rule::NodeName, format!("cannot look up Node {name}: {why}")),
            _ => book.pass(Rule::NodeName, format!("{name} is {how}")),
        },
    }
}

/// Another Machine or pool instance of the Cluster that holds `name` (SPEC rule 10): through
/// its valid claim or `status.nodeRef`, and, when `target` is a pool instance (which has no
/// names of its own), through its name, infrastructure name or DNS addresses.
fn name_held_elsewhere(inputs: &Inputs<'_>, target: Target<'_>, name: &NodeName, pid: &ProviderId) -> Option<String> {
    let cluster = inputs.cluster;
    let ours = |namespace: &str, cluster_name: &str| namespace == cluster.namespace && cluster_name == cluster.name;
    let name = name.as_str();
    let for_pool = matches!(target, Target::Pool(_));
    // Every Machine of the Cluster is asked on every join: the one field that can match is read
    // first, and whether it is the target only of a Machine that holds the name.
    let inventory = inputs.inventory;
    let candidates = inventory.index().machines_named(name, for_pool);
    let machine = candidates.iter().map(|&at| &inventory.machines[at]).find_map(|m| {
        let how = if m.claimed_node() == Some(name) {
            "its claim"
        } else if m.node_ref() == Some(name) {
            "its status.nodeRef"
        } else if for_pool && m.name() == name {
            "its name"
        } else if for_pool && m.infrastructure_name() == Some(name) {
            "its infrastructure name"
        } else if for_pool
            && m.addresses()
                .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name))
        {
            "a Hostname/DNS address"
        } else {
            return None;
        };
        if !ours(&m.namespace, &m.cluster_name) || target.is_machine(m) {
            return None;
        }
        Some(format!("Machine {} ({how})", m.name()))
    });
    machine.or_else(|| {
        inventory
            .index()
            .pools_with_claimed_node(name)
            .iter()
            .map(|&at| &inventory.pools[at])
            .filter(|p| ours(&p.namespace, &p.cluster_name))
            .find_map(|p| {
                let same_pool = target.is_pool(p);
                p.claims
                    .records()
                    .filter(|c| p.provider_ids.contains(&c.provider_id))
                    .filter(|c| !(same_pool && c.provider_id == pid.as_str()))
                    .find(|c| c.node_name == name)
                    .map(|c| {
                        format!(
                            "instance {} of MachinePool {} (its claim)",
                            shown(&c.provider_id),
                            p.name
                        )
                    })
            })
    })
}
