//! SPEC section 3: kubelet client CSRs for this project's signers.
//!
//! [`decide`] runs the twelve rules in the contract's order, cheap ones first and cryptography
//! last; each group of rules has a room of its own, named after what it decides:
//!
//! | room | rules |
//! |---|---|
//! | `request` | 1 (the request parses), 4 (no SAN), 5 (extensions), 8 (provider ID) |
//! | the rule engine's `mod.rs` | 2 (the self-signature), 3 (subject), 6 (usages): shared with serving CSRs |
//! | `requester` | 7 (who asks: join token, renewal, adoption) |
//! | `machine` | 9 (the Machine or pool instance), 10 (its node name) |
//! | `claim` | 11 (one identity per Machine) and the claim an approval writes |
//! | `attestation` | 12 (the verifier, the EK and cloud bindings, the verification) |
//!
//! `target` is the Machine or MachinePool instance they all ask about.

mod attestation;
mod claim;
mod machine;
mod request;
mod requester;
mod target;

use super::{Book, Inputs, check_subject, check_usages};
use crate::claim::ClaimState;
use crate::decision::{CsrKind, Decision, DenyReason, Issuance, Outcome, Rule, Verdict};
use crate::envelope::ProviderVersion;
use crate::identity::NodeName;
use crate::names::{ANNOTATION_SUPPORTED_VERSIONS, usage};
use claim::OneIdentity;
use requester::Requester;

const ORDER: &[Rule] = &[
    Rule::Request,
    Rule::Signature,
    Rule::Subject,
    Rule::SubjectAltNames,
    Rule::Extensions,
    Rule::Usages,
    Rule::Requester,
    Rule::ProviderId,
    Rule::Machine,
    Rule::NodeName,
    Rule::OneIdentity,
    Rule::Attestation,
];

pub(super) fn decide(inputs: &Inputs<'_>) -> Decision {
    let csr = inputs.csr;
    let mut book = Book::new(CsrKind::KubeletClient, ORDER);

    // Rule 1.
    let Some((envelope, parsed)) = request::parse_request(&mut book, csr) else {
        book.skip_rest("the request does not parse");
        return book.finish(&inputs.clock, "", String::new());
    };

    // Rules 3 to 8: cheap, independent of each other.
    let node_name = match check_subject(&parsed) {
        Ok(name) => {
            book.pass(Rule::Subject, format!("CN=system:node:{name}, O=system:nodes"));
            Some(name)
        }
        Err(message) => {
            book.fail(Rule::Subject, DenyReason::SubjectMismatch, message);
            None
        }
    };
    request::check_no_san(&mut book, &parsed);
    request::check_extensions(&mut book, &parsed);
    let optional: &[&str] = if parsed.key_kind.is_rsa() {
        &[usage::KEY_ENCIPHERMENT]
    } else {
        &[]
    };
    match check_usages(&csr.usages, &[usage::DIGITAL_SIGNATURE, usage::CLIENT_AUTH], optional) {
        Ok(()) => book.pass(Rule::Usages, format!("{:?}, key {}", csr.usages, parsed.key_kind)),
        Err(message) => book.fail(Rule::Usages, DenyReason::ForbiddenUsage, message),
    }
    let requester = requester::classify_requester(&mut book, inputs, node_name.as_ref());
    let provider_id = request::read_provider_id(&mut book, &parsed);

    // Rule 9, then what needs the Machine: 7 (binding), 10, 11.
    let target = provider_id
        .as_ref()
        .and_then(|pid| machine::find_target(&mut book, inputs, pid, matches!(requester, Some(Requester::Node))));
    // The claim as it stands, read once for rules 7, 10, 11, 12 and the claim write.
    let claim = target.zip(provider_id.as_ref()).map(|(target, pid)| target.claim(pid));
    // The node itself asking for a Machine it has not claimed: an adoption, not a renewal.
    let requester = requester.map(|r| match (r, &claim) {
        (Requester::Node, Some(claim)) if claim.valid().is_none() => Requester::Adoption,
        (r, _) => r,
    });
    let mut one_identity = OneIdentity::Settled;
    if let (Some(target), Some(pid), Some(claim)) = (target, provider_id.as_ref(), &claim) {
        if let Some(requester) = &requester {
            requester::bind_requester(
                &mut book,
                inputs,
                target,
                claim,
                requester,
                node_name.as_ref(),
                pid,
                envelope.provider.as_ref().map(|p| p.provider()),
            );
        }
        if let Some(name) = &node_name {
            let lookup = inputs.nodes.node(name.as_str());
            machine::check_node_name(&mut book, inputs, target, claim, name, pid, &lookup);
            if let Some(requester) = &requester {
                one_identity = claim::check_one_identity(
                    &mut book,
                    inputs,
                    target,
                    claim,
                    requester,
                    name,
                    pid,
                    &lookup,
                    envelope.provider.as_ref().map(|p| p.provider()),
                );
            }
        }
    }

    // Rule 12, the cheap part: which verifier, and whether the Machine is bound to an EK or a
    // cloud instance.
    let mut verifier = attestation::select_verifier(&mut book, inputs, &envelope);
    if let (Some((chosen, version)), Some(target), Some(claim)) = (verifier, target, &claim)
        && let Some(message) = attestation::binding_refusal(target, claim, chosen, version)
    {
        book.fail(Rule::Attestation, DenyReason::AttestationNotAllowed, message);
        verifier = None;
    }

    // Cryptography only once every cheap rule held: rule 2, then rule 12's verification.
    let mut attested = attestation::Attested::default();
    book.check_signature(&parsed);
    if let (false, Some(chosen), Some(target), Some(claim), Some(pid)) =
        (book.any_failed(), verifier, target, &claim, provider_id.as_ref())
    {
        attested = attestation::verify(&mut book, inputs, &envelope, &parsed, chosen, target, claim, pid);
    } else if verifier.is_some() {
        let why = if book.any_failed() {
            "a cheaper rule failed: no cryptography"
        } else {
            "no Machine to verify against yet"
        };
        book.record(Rule::Attestation, Verdict::NotEvaluated { why: why.into() });
    }
    // Rule 11 again: a claimed Machine's re-bootstrap by the EK on its claim.
    one_identity.settle(&mut book, attested.ek.as_deref());

    let approved_reason = envelope.provider.as_ref().map(approval_reason).unwrap_or_default();
    let approved_message = format!(
        "{} attested by {} for {}",
        node_name.as_ref().map(NodeName::username).unwrap_or_default(),
        envelope.provider.as_ref().map(ToString::to_string).unwrap_or_default(),
        target.map(|t| t.describe()).unwrap_or_default(),
    );
    let unsupported = matches!(
        book.verdicts.get(&Rule::Attestation),
        Some(Verdict::Failed {
            reason: DenyReason::UnsupportedAttestationVersion,
            ..
        })
    );
    let mut decision = book.finish(&inputs.clock, &approved_reason, approved_message);
    if unsupported {
        decision.annotations.insert(
            ANNOTATION_SUPPORTED_VERSIONS.to_owned(),
            inputs.verifiers.supported_versions(),
        );
    }
    decision.target = target.map(|t| t.reference());
    if let Outcome::Retry { .. } = decision.outcome {
        decision.annotations.extend(attested.challenge);
        decision.cloud_calls = attested.cloud_calls;
    }
    if let (Outcome::Approved { .. }, Some(target), Some(pid), Some(name)) =
        (&decision.outcome, target, provider_id.as_ref(), node_name.as_ref())
    {
        if let Some(Requester::Bootstrap { .. } | Requester::Adoption) = &requester {
            let current = claim.as_ref().unwrap_or(&ClaimState::Unclaimed);
            decision.claim = claim::claim_write(inputs, target, current, pid, name, attested.ek, attested.instance);
        }
        decision.supersedes = attested.supersedes;
        decision.issuance = Some(Issuance {
            csr: parsed,
            provider_id: pid.clone(),
        });
    }
    decision
}

/// `insecure/v1` -> `AttestedInsecureV1`.
fn approval_reason(version: &ProviderVersion) -> String {
    let camel = |s: &str| {
        s.split('-')
            .map(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                    .unwrap_or_default()
            })
            .collect::<String>()
    };
    format!("Attested{}{}", camel(version.provider()), camel(version.version()))
}
