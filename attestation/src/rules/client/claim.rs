//! SPEC rule 11: one identity per Machine. An initial request for a Machine that is claimed or
//! whose node is registered is refused, except a claimed EK re-bootstrapping its own Machine
//! under `tpm/v1`; and the claim the approval writes (before the certificate, with an
//! optimistic-concurrency precondition, so of two racing CSRs at most one is signed).

use time::format_description::well_known::Rfc3339;

use super::super::{Book, Inputs, NodeLookup, shown};
use super::requester::Requester;
use super::target::Target;
use crate::claim::{ClaimState, ClaimWrite, KubeletClaim};
use crate::decision::{DenyReason, Rule};
use crate::identity::{NodeName, ProviderId};

/// Rule 11's verdict before attestation ran: a claimed Machine can still be re-bootstrapped by
/// the EK on its claim (a node that lost its disk).
pub(super) enum OneIdentity {
    Settled,
    NeedsClaimedEk {
        ek_sha256: String,
        reason: DenyReason,
        message: String,
    },
}

impl OneIdentity {
    /// Rule 11 after attestation ran: a claimed Machine re-bootstrapped by the EK on its claim
    /// passes; any other EK (or none) is refused with the reason rule 11 found.
    pub(super) fn settle(self, book: &mut Book, verified_ek: Option<&str>) {
        if let Self::NeedsClaimedEk {
            ek_sha256,
            reason,
            message,
        } = self
        {
            if verified_ek == Some(ek_sha256.as_str()) {
                book.pass(
                    Rule::OneIdentity,
                    format!("{message}; re-bootstrap allowed: the attested EK is the claim's"),
                );
            } else {
                book.fail(Rule::OneIdentity, reason, message);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn check_one_identity(
    book: &mut Book,
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    requester: &Requester,
    name: &NodeName,
    pid: &ProviderId,
    lookup: &NodeLookup,
    provider: Option<&str>,
) -> OneIdentity {
    match (requester, claim) {
        (Requester::Node, _) => {
            book.pass(Rule::OneIdentity, "renewal of the claimed identity");
            return OneIdentity::Settled;
        }
        (Requester::Adoption, ClaimState::Unclaimed | ClaimState::Stale(_)) => {
            book.pass(
                Rule::OneIdentity,
                format!(
                    "adoption of the node {} names: its first attested identity, claimed as for an initial request",
                    target.describe()
                ),
            );
            return OneIdentity::Settled;
        }
        _ => {}
    }
    let hardware = provider
        .and_then(|p| inputs.verifiers.for_provider(p))
        .is_some_and(|v| v.proves_hardware_identity());
    match claim {
        ClaimState::Valid(c) if c.csr_uid == inputs.csr.uid => {
            book.pass(
                Rule::OneIdentity,
                "claimed by this CSR already (resumed after a restart)",
            );
            OneIdentity::Settled
        }
        ClaimState::Valid(c) => {
            let message = format!(
                "{} is claimed by node {} (CSR {}, at {})",
                target.describe(),
                shown(&c.node_name),
                shown(&c.csr_uid),
                shown(&c.claimed_at)
            );
            match (&c.ek_sha256, hardware) {
                (Some(ek), true) => {
                    book.pending(
                        Rule::OneIdentity,
                        format!("{message}: only its claimed EK may re-bootstrap it"),
                    );
                    OneIdentity::NeedsClaimedEk {
                        ek_sha256: ek.clone(),
                        reason: DenyReason::MachineAlreadyClaimed,
                        message,
                    }
                }
                _ => {
                    book.fail(Rule::OneIdentity, DenyReason::MachineAlreadyClaimed, message);
                    OneIdentity::Settled
                }
            }
        }
        ClaimState::Unreadable(why) => {
            book.fail(
                Rule::OneIdentity,
                DenyReason::MachineAlreadyClaimed,
                format!(
                    "{} carries a claim that does not decode ({why}); remove it to release the Machine",
                    target.describe()
                ),
            );
            OneIdentity::Settled
        }
        ClaimState::Unclaimed | ClaimState::Stale(_) => {
            let by_provider_id = inputs.nodes.nodes_with_provider_id(pid.as_str());
            let registered = target
                .node_registered(name)
                .or_else(|| match lookup {
                    NodeLookup::Found(_) => Some(format!("Node {name} exists in the workload cluster")),
                    _ => None,
                })
                .or_else(|| match by_provider_id.as_deref() {
                    Ok([first, ..]) => Some(format!(
                        "Node {} carries its provider ID {}",
                        shown(first),
                        shown(pid.as_str())
                    )),
                    _ => None,
                });
            match (registered, &by_provider_id) {
                (Some(why), _) => book.fail(
                    Rule::OneIdentity,
                    DenyReason::NodeAlreadyRegistered,
                    format!(
                        "initial request for {} whose node is registered: {why}",
                        target.describe()
                    ),
                ),
                (None, Err(why)) => book.pending(
                    Rule::OneIdentity,
                    format!(
                        "cannot tell whether a Node already carries provider ID {}: {why}",
                        shown(pid.as_str())
                    ),
                ),
                (None, _) => book.pass(
                    Rule::OneIdentity,
                    format!("{} is unclaimed and its node unregistered", target.describe()),
                ),
            }
            OneIdentity::Settled
        }
    }
}

/// The claim an approval writes, unless this CSR holds it already (resumed after a restart).
pub(super) fn claim_write(
    inputs: &Inputs<'_>,
    target: Target<'_>,
    current: &ClaimState,
    pid: &ProviderId,
    name: &NodeName,
    ek_sha256: Option<String>,
    instance: Option<String>,
) -> Option<ClaimWrite> {
    if current.valid().is_some_and(|c| c.csr_uid == inputs.csr.uid) {
        return None;
    }
    let record = KubeletClaim {
        node_name: name.as_str().to_owned(),
        provider_id: pid.as_str().to_owned(),
        csr_uid: inputs.csr.uid.clone(),
        ek_sha256,
        instance,
        claimed_at: inputs.clock.now.format(&Rfc3339).unwrap_or_default(),
    };
    Some(match target {
        Target::Machine(m) => ClaimWrite::machine(m.target(), m.resource_version().map(str::to_owned), record),
        Target::Pool(p) => ClaimWrite::pool(
            p.target(),
            p.resource_version.clone(),
            &p.claims,
            &p.provider_ids,
            record,
        ),
    })
}
