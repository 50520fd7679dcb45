//! SPEC rule 7: who filed the CSR, and whether that requester may ask for this Machine. A
//! bootstrap-token user (initial issuance, bound to the Machine's KubeadmConfig join token), the
//! node itself for the Machine it has claimed (renewal), or the node itself for a Machine with
//! no valid claim (adoption, narrowed to the names the Machine carries).

use super::super::{Book, Inputs, NodeLookup, shown};
use super::target::Target;
use crate::claim::ClaimState;
use crate::decision::{DenyReason, Rule};
use crate::identity::{NodeName, ProviderId};
use crate::names::{BOOTSTRAP_USER_PREFIX, GROUP_BOOTSTRAPPERS, GROUP_NODES};

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
    book.fail(
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
pub(super) fn bind_requester(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    requester: &Requester,
    node_name: Option<&NodeName>,
    pid: &ProviderId,
) {
    match requester {
        Requester::Bootstrap { username } => match target.bootstrap_config() {
            Some(config) if config.is_kubeadm() => {
                let found = inputs
                    .inventory
                    .kubeadm_configs
                    .iter()
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
            Some(name) => adoption(book, inputs, target, name, pid),
            None => book.fail(
                Rule::Requester,
                DenyReason::RequesterNotAllowed,
                "adoption without a node name",
            ),
        },
    }
}

/// SPEC rule 7, adoption: the node itself, for a Machine or pool instance with no valid claim,
/// is accepted only when it is the node the Machine already names: its `status.nodeRef`, or a
/// registered Node carrying its provider ID under that name. Anyone else (another node's
/// certificate, a node for a Machine that names another) is refused; a Node list that cannot be
/// read waits.
fn adoption(book: &mut Book, inputs: &Inputs<'_>, target: Target<'_>, name: &NodeName, pid: &ProviderId) {
    let username = name.username();
    // The safer rule (documented in docs/decisions.md): a Node object, and so the nodeRef Cluster
    // API derives from its provider ID, is written by the node itself, and any node identity may
    // register a Node carrying another Machine's provider ID. For a Machine the name must also be
    // one of its own, as the infrastructure provider wrote them (its name, infrastructure name,
    // Hostname or DNS address); a pool instance has no names: its attestation binds it.
    if let Target::Machine(m) = target
        && !(m.name() == name.as_str()
            || m.infrastructure_name() == Some(name.as_str())
            || m.addresses()
                .any(|a| a.is_dns() && a.address.eq_ignore_ascii_case(name.as_str())))
    {
        book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} is not one of the names {} carries (its name, infrastructure name, Hostname or DNS address): a Node alone, which any node may register, does not name a Machine's node",
                shown(&username),
                name,
                target.describe()
            ),
        );
        return;
    }
    if let Target::Machine(m) = target
        && let Some(node_ref) = m.node_ref()
    {
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
    match inputs.nodes.node_with_provider_id(pid.as_str()) {
        NodeLookup::Found(node) if node.name == name.as_str() => book.pass(
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
                "adoption by {} refused: the Node carrying the provider ID of {} is {}",
                shown(&username),
                target.describe(),
                shown(&node.name)
            ),
        ),
        NodeLookup::Absent => book.fail(
            Rule::Requester,
            DenyReason::RequesterNotAllowed,
            format!(
                "adoption by {} refused: {} holds no valid claim and names no node (no status.nodeRef, no registered Node carrying its provider ID); a new node joins with its bootstrap token",
                shown(&username),
                target.describe()
            ),
        ),
        NodeLookup::Unavailable(why) => book.pending(
            Rule::Requester,
            format!("adoption: cannot tell which Node carries the provider ID of {}: {why}", target.describe()),
        ),
    }
}
