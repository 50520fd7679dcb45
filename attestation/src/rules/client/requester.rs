//! SPEC rule 7: who filed the CSR, and whether that requester may ask for this Machine. A
//! bootstrap-token user (initial issuance, bound to the Machine's KubeadmConfig join token), the
//! node itself for the Machine it has claimed (renewal), or the node itself for a Machine with
//! no valid claim (adoption, narrowed to the names the Machine carries).

use super::super::{Book, Inputs, NodeLookup, shown};
use super::target::Target;
use crate::claim::ClaimState;
use crate::decision::{DenyReason, Rule};
use crate::identity::{NodeName, ProviderId};
use crate::machine::{MachinePoolView, MachineView};
use crate::names::{ANNOTATION_EK_PIN, BOOTSTRAP_USER_PREFIX, GROUP_BOOTSTRAPPERS, GROUP_NODES};

/// Who filed the CSR.
pub(super) enum Requester {
    /// A bootstrap-token user: initial issuance.
    Bootstrap { username: String },
    /// The node itself, for a Machine (or pool instance) it has claimed: renewal.
    Node,
    /// The node itself, for a Machine (or pool instance) with no valid claim: adoption of a
    /// node that holds an identity the signer did not issue (kubeadm's on the first
    /// control-plane node, or one issued before the Cluster opted in), SPEC rule 7.
    Adoption,
}

/// Rule 7's first half, before the Machine is known: which kind of requester this is.
pub(super) fn classify_requester(
    book: &mut Book,
    inputs: &Inputs<'_>,
    node_name: Option<&NodeName>,
) -> Option<Requester> {
    let csr = inputs.csr;
    let in_group = |g: &str| csr.groups.iter().any(|x| x == g);
    if let Some(id) = csr.username.strip_prefix(BOOTSTRAP_USER_PREFIX)
        && !id.is_empty()
        && in_group(GROUP_BOOTSTRAPPERS)
    {
        return Some(Requester::Bootstrap {
            username: csr.username.clone(),
        });
    }
    if let Some(name) = node_name
        && csr.username == name.username()
        && in_group(GROUP_NODES)
    {
        return Some(Requester::Node);
    }
    let why = if csr.username.starts_with(crate::names::NODE_USER_PREFIX) && in_group(GROUP_NODES) {
        "a node may only renew its own identity"
    } else {
        "only bootstrap-token users (initial) and the node itself (renewal, adoption) may ask"
    };
    // Who filed it, and the name it asks for: nothing a cluster holds changes this.
    book.fail_on_request(
        Rule::Requester,
        DenyReason::RequesterNotAllowed,
        format!(
            "requester {} in groups {}: {why}",
            shown(&csr.username),
            shown(&csr.groups.join(","))
        ),
    );
    None
}

/// Rule 7's second half: the requester bound to the Machine (its join token, its claim, or the
/// names it carries for an adoption).
#[allow(clippy::too_many_arguments)]
pub(super) fn bind_requester(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    requester: &Requester,
    node_name: Option<&NodeName>,
    pid: &ProviderId,
    provider: Option<&str>,
) {
    match requester {
        Requester::Bootstrap { username } => match target.bootstrap_config() {
            Some(config) if config.is_kubeadm() => {
                let inventory = inputs.inventory;
                let found = inventory
                    .index()
                    .configs_named(&config.name)
                    .iter()
                    .map(|&at| &inventory.kubeadm_configs[at])
                    // A config labeled for another Cluster is not this one's, whichever
                    // replica holds what (a shard keeps only its Clusters' configs).
                    .find(|k| {
                        k.name() == config.name
                            && *k.namespace == *target.namespace()
                            && k.serves_cluster(&inputs.cluster.name)
                    });
                match found.map(|k| k.join_username()) {
                    None => book.pending(
                        Rule::Requester,
                        format!(
                            "KubeadmConfig {} of {} not found (unlabeled or labeled for Cluster {})",
                            config.name,
                            target.describe(),
                            inputs.cluster.name
                        ),
                    ),
                    Some(Some(expected)) if expected == *username => book.pass(
                        Rule::Requester,
                        format!("{username} is the join token of KubeadmConfig {}", config.name),
                    ),
                    Some(Some(expected)) => book.fail(
                        Rule::Requester,
                        DenyReason::RequesterNotAllowed,
                        format!(
                            "requester {} is not {expected}, the join token of KubeadmConfig {}",
                            shown(username),
                            config.name
                        ),
                    ),
                    Some(None) => book.pass(
                        Rule::Requester,
                        format!("{username}: KubeadmConfig {} names no join token", config.name),
                    ),
                }
            }
            _ => book.pass(Rule::Requester, format!("bootstrap-token user {username}")),
        },
        Requester::Node => match (claim.valid(), node_name) {
            (Some(c), Some(name)) if c.node_name == name.as_str() => book.pass(
                Rule::Requester,
                format!("renewal by {} for its claimed {}", name.username(), target.describe()),
            ),
            (Some(c), _) => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "renewal by {} but {} is claimed by node {}",
                    shown(&inputs.csr.username),
                    target.describe(),
                    shown(&c.node_name)
                ),
            ),
            // Turned into an adoption above: a renewal always has a valid claim.
            (None, _) => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "renewal by {} but {} holds no valid claim",
                    shown(&inputs.csr.username),
                    target.describe()
                ),
            ),
        },
        Requester::Adoption => match node_name {
            Some(name) => match target {
                Target::Machine(machine) => adopt_machine(book, inputs, machine, target, name, pid),
                Target::Pool(pool) => adopt_pool_instance(book, inputs, pool, target, name, pid, provider),
            },
            None => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                "adoption without a node name",
            ),
        },
    }
}

/// SPEC rule 7 (revision 5), adoption of a Machine: the node itself, for a Machine with no
/// valid claim, is accepted only under a name the Machine itself carries (its name,
/// infrastructure name, Hostname or DNS address, as its infrastructure provider wrote them), and
/// only when the Machine's node is known by that name: its `status.nodeRef`, or, with no nodeRef
/// yet, the registered Node of that name carrying the Machine's provider ID. A Node object, and
/// so the nodeRef Cluster API derives from its provider ID, is written by the node itself, and
/// any node identity may register a Node carrying another Machine's provider ID: neither names a
/// node on its own. The Node is looked up by the requester's own name, never as "the first Node
/// carrying the provider ID", so the answer does not depend on the order Nodes are listed in.
fn adopt_machine(
    book: &mut Book,
    inputs: &Inputs<'_>,
    machine: &MachineView,
    target: Target<'_>,
    name: &NodeName,
    pid: &ProviderId,
) {
    let username = name.username();
    let carried = machine.name() == name.as_str()
        || machine.infrastructure_name() == Some(name.as_str())
        || machine
            .addresses()
            .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name.as_str()));
    if !carried {
        book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} is not one of the names {} carries ({}): a Node alone, which any node may register, does not name a Machine's node",
                shown(&username),
                name,
                target.describe(),
                machine_names(machine)
            ),
        );
        return;
    }
    if let Some(node_ref) = machine.node_ref() {
        if node_ref == name.as_str() {
            book.pass(
                Rule::Requester,
                format!(
                    "adoption: {username} is the node {} names (status.nodeRef) and holds no claim yet",
                    target.describe()
                ),
            );
        } else {
            book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                format!(
                    "adoption by {} refused: {} names node {} (status.nodeRef)",
                    shown(&username),
                    target.describe(),
                    shown(node_ref)
                ),
            );
        }
        return;
    }
    match inputs.nodes.node(name.as_str()) {
        NodeLookup::Found(node) if node.provider_id.as_deref() == Some(pid.as_str()) => book.pass(
            Rule::Requester,
            format!(
                "adoption: {username} is the registered Node carrying the provider ID of {} and holds no claim yet",
                target.describe()
            ),
        ),
        NodeLookup::Found(node) => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: Node {name} carries provider ID {}, not the provider ID of {}",
                shown(&username),
                shown(node.provider_id.as_deref().unwrap_or_default()),
                target.describe()
            ),
        ),
        NodeLookup::Absent => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} holds no valid claim and names no node (no status.nodeRef, no registered Node {name} carrying its provider ID); a new node joins with its bootstrap token",
                shown(&username),
                target.describe()
            ),
        ),
        NodeLookup::Unavailable(why) => book.pending(
            Rule::Requester,
            format!("adoption: cannot look up Node {name} for {}: {why}", target.describe()),
        ),
    }
}

/// A Machine's names as rule 7 reads them, for a refusal's message.
fn machine_names(machine: &MachineView) -> String {
    let mut names = vec![format!("name {}", shown(machine.name()))];
    if let Some(infrastructure) = machine.infrastructure_name() {
        names.push(format!("infrastructure name {}", shown(infrastructure)));
    }
    names.extend(
        machine
            .addresses()
            .filter(|a| a.is_dns())
            .take(4)
            .map(|a| format!("{} {}", a.kind, shown(a.address))),
    );
    names.join(", ")
}

/// SPEC rule 7 (revision 5), adoption of a MachinePool instance. An instance carries no names
/// of its own, so nothing but its attestation can say the requester is that instance: it is
/// adopted only with an attestor that proves the instance itself (a cloud identity, which names
/// the instance its provider ID names, or `tpm/v1` with an EK pinned on the pool), and only when
/// exactly one Node, the requester's, carries its provider ID. Under `insecure/v1`, or `tpm/v1`
/// whose EK is trusted by its chain or on first use, any node identity that registers a Node
/// carrying the instance's provider ID could take the instance over.
fn adopt_pool_instance(
    book: &mut Book,
    inputs: &Inputs<'_>,
    pool: &MachinePoolView,
    target: Target<'_>,
    name: &NodeName,
    pid: &ProviderId,
    provider: Option<&str>,
) {
    let username = name.username();
    let verifier = provider.and_then(|p| inputs.verifiers.for_provider(p));
    let pinned = pool
        .ek_pins
        .iter()
        .flat_map(|p| p.split(','))
        .any(|p| !p.trim().is_empty());
    let proves_instance = verifier.is_some_and(|v| v.proves_instance() || (v.proves_hardware_identity() && pinned));
    if !proves_instance {
        book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption of instance {} of {} by {} refused: {} does not prove the node is that instance (a pool instance carries no names; only a cloud identity, or tpm/v1 with an EK pinned on the MachinePool ({ANNOTATION_EK_PIN}), does); reprovision the instance so that it joins with the pool's bootstrap token, or pin its EK on the MachinePool",
                shown(pid.as_str()),
                target.describe(),
                shown(&username),
                provider.map_or_else(|| "a request without attestation".to_owned(), |p| format!("{p}/v1 here")),
            ),
        );
        return;
    }
    match inputs.nodes.nodes_with_provider_id(pid.as_str()) {
        Ok(names) if names.len() == 1 && names[0] == name.as_str() => book.pass(
            Rule::Requester,
            format!(
                "adoption: {username} is the one registered Node carrying the provider ID of {} and holds no claim yet",
                target.describe()
            ),
        ),
        Ok(names) if names.is_empty() => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: no registered Node carries provider ID {} of {}; a new instance joins with the pool's bootstrap token",
                shown(&username),
                shown(pid.as_str()),
                target.describe()
            ),
        ),
        Ok(names) => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} Node(s) carry provider ID {} of {} ({}), and exactly one, the requester's, must: delete the Node that is not the instance's (kubectl delete node), or reprovision the instance",
                shown(&username),
                names.len(),
                shown(pid.as_str()),
                target.describe(),
                shown(&names.iter().take(4).cloned().collect::<Vec<_>>().join(", "))
            ),
        ),
        Err(why) => book.pending(
            Rule::Requester,
            format!(
                "adoption: cannot tell which Nodes carry the provider ID of {}: {why}",
                target.describe()
            ),
        ),
    }
}
