//! SPEC rule 12: the attestation. Which verifier (the PROVIDER block, allowed for the Cluster
//! and matching the signer name), the bindings a Machine carries (an EK pin or claimed EK
//! accepts only `tpm/v1` proving that EK; a claimed cloud instance only that instance), and the
//! verification itself, run only once every cheaper rule held.

use std::collections::BTreeMap;

use super::super::{Book, Inputs, shown};
use super::target::Target;
use crate::attestor::{Evidence, Verification, Verifier};
use crate::claim::ClaimState;
use crate::cloud::CloudCall;
use crate::csr::ParsedCsr;
use crate::csr_object::CsrRef;
use crate::decision::{DenyReason, Rule};
use crate::envelope::{ProviderVersion, RequestEnvelope};
use crate::identity::ProviderId;

/// What a verification leaves for the rest of the decision.
#[derive(Default)]
pub(super) struct Attested {
    /// The EK proven (a challenge's EK counts: enough for rule 11's re-bootstrap to reach phase 2).
    pub(super) ek: Option<String>,
    /// The cloud instance proven.
    pub(super) instance: Option<String>,
    /// An earlier CSR this one replaces.
    pub(super) supersedes: Option<CsrRef>,
    /// A challenge's annotations, written when the decision is to retry.
    pub(super) challenge: BTreeMap<String, String>,
    /// Cloud calls the controller makes before the decision can be final.
    pub(super) cloud_calls: Vec<CloudCall>,
}

pub(super) fn select_verifier<'v, 'e>(
    book: &mut Book,
    inputs: &Inputs<'v>,
    envelope: &'e RequestEnvelope,
) -> Option<(&'v dyn Verifier, &'e ProviderVersion)> {
    let Some(version) = &envelope.provider else {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationMissing,
            "no ATTESTATION PROVIDER block",
        );
        return None;
    };
    let verifier = inputs
        .verifiers
        .for_provider(version.provider())
        .filter(|v| v.versions().contains(&version.version()));
    let Some(verifier) = verifier else {
        book.fail(
            Rule::Attestation,
            DenyReason::UnsupportedAttestationVersion,
            format!(
                "{version} is not supported (supported: {})",
                inputs.verifiers.supported_versions()
            ),
        );
        return None;
    };
    if !inputs.cluster.allows(version.provider()) {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationNotAllowed,
            format!(
                "Cluster {} allows attestors {:?}, not {}",
                inputs.cluster.name,
                inputs.cluster.allowed_attestors,
                version.provider()
            ),
        );
        return None;
    }
    if verifier.signer_name() != inputs.csr.signer_name {
        book.fail(
            Rule::Attestation,
            DenyReason::AttestationNotAllowed,
            format!(
                "{version} CSRs go to signer {}, not {}",
                verifier.signer_name(),
                shown(&inputs.csr.signer_name)
            ),
        );
        return None;
    }
    Some((verifier, version))
}

/// Rule 12's bindings, before any cryptography: why `chosen` may not attest this target, if it
/// may not (an EK-bound Machine accepts only `tpm/v1`; a cloud-bound one only its provider).
pub(super) fn binding_refusal(
    target: Target<'_>,
    claim: &ClaimState,
    chosen: &dyn Verifier,
    version: &ProviderVersion,
) -> Option<String> {
    match (
        ek_binding(target, claim),
        claim.valid().and_then(|c| c.instance.as_deref()),
    ) {
        (Some(binding), _) if !chosen.proves_hardware_identity() => Some(format!(
            "{} is bound to an EK ({binding}): it accepts only tpm/v1 proving that EK, not {version}",
            target.describe()
        )),
        (_, Some(instance)) if instance_provider(instance) != Some(version.provider()) => Some(format!(
            "{} is bound to cloud instance {} by its claim: it accepts only {}/v1 proving that instance, not {version}",
            target.describe(),
            shown(instance),
            instance_provider(instance).unwrap_or("its provider")
        )),
        _ => None,
    }
}

/// Rule 12's verification: the verifier's answer, checked against the EK and instance bindings.
#[allow(clippy::too_many_arguments)]
pub(super) fn verify(
    book: &mut Book,
    inputs: &Inputs<'_>,
    envelope: &RequestEnvelope,
    parsed: &ParsedCsr,
    (verifier, version): (&dyn Verifier, &ProviderVersion),
    target: Target<'_>,
    claim: &ClaimState,
    pid: &ProviderId,
) -> Attested {
    let csr = inputs.csr;
    let mut attested = Attested::default();
    let ek_pins = target.ek_pins();
    let evidence = Evidence {
        version,
        data: envelope.data.as_deref(),
        csr: parsed,
        provider_id: pid,
        object: csr,
        csrs: inputs.csrs,
        cluster: inputs.cluster,
        ek_pins: &ek_pins,
        claim: claim.valid(),
        now: inputs.clock.now,
        first_seen: inputs.clock.first_seen,
    };
    let verification = verifier.verify(&evidence);
    let ek = match &verification {
        Verification::Verified { ek_sha256, .. } | Verification::Challenge { ek_sha256, .. } => ek_sha256.clone(),
        _ => None,
    };
    let conflict = ek_conflict(inputs, target, claim, Some(pid), ek.as_deref()).or_else(|| match &verification {
        Verification::Verified { instance, .. } => instance_conflict(target, claim, instance.as_deref()),
        _ => None,
    });
    match (verification, conflict) {
        (Verification::Failed { reason, message }, _) | (_, Some((reason, message))) => {
            book.fail(Rule::Attestation, reason, message)
        }
        (
            Verification::Verified {
                note,
                supersedes: earlier,
                instance,
                ..
            },
            None,
        ) => {
            book.pass(Rule::Attestation, note);
            attested.supersedes = earlier;
            attested.instance = instance;
        }
        (Verification::NeedsCloud { call, message }, None) => {
            book.pending(Rule::Attestation, message);
            attested.cloud_calls.push(call);
        }
        (Verification::Challenge { annotations, note, .. }, None) => {
            book.pending_or(Rule::Attestation, DenyReason::ChallengeFailed, note);
            attested.challenge = annotations;
        }
        (Verification::Pending { message }, None) => book.pending(Rule::Attestation, message),
    }
    // A challenge's EK is proven so far: enough to let the claimed EK's re-bootstrap reach
    // phase 2 (rule 11).
    attested.ek = ek;
    attested
}

/// Why a Machine or pool instance is bound to an EK, if it is: an EK pin on it, or an EK on its
/// valid claim (SPEC rule 12). Such a Machine accepts only `tpm/v1` proving that EK.
fn ek_binding(target: Target<'_>, claim: &ClaimState) -> Option<String> {
    let pinned = target
        .ek_pins()
        .into_iter()
        .flat_map(|p| p.split(','))
        .any(|p| !p.trim().is_empty());
    if pinned {
        return Some("it carries an EK pin".to_owned());
    }
    claim
        .valid()
        .and_then(|c| c.ek_sha256.as_deref())
        .map(|ek| format!("its claim records EK {}", shown(ek)))
}

/// The provider a claim's `instance` was proven with: `aws` of `aws:<account>/<id>`.
fn instance_provider(instance: &str) -> Option<&str> {
    instance.split_once(':').map(|(provider, _)| provider)
}

/// A cloud-bound Machine (its valid claim records an instance) accepts only that instance
/// (SPEC rule 12): another one is `AttestationInvalid`, naming both.
fn instance_conflict(target: Target<'_>, claim: &ClaimState, proven: Option<&str>) -> Option<(DenyReason, String)> {
    let claimed = claim.valid()?.instance.as_deref()?;
    match proven {
        Some(proven) if proven == claimed => None,
        proven => Some((
            DenyReason::AttestationInvalid,
            format!(
                "{} is bound to cloud instance {} by its claim, but the attestation proves {}",
                target.describe(),
                shown(claimed),
                proven.map_or_else(|| "no instance".to_owned(), shown)
            ),
        )),
    }
}

/// One EK per Machine: the verified EK must be the claim's (when the claim names one), and no
/// other Machine, MachinePool or pool instance of the Cluster may pin or claim it.
fn ek_conflict(
    inputs: &Inputs<'_>,
    target: Target<'_>,
    claim: &ClaimState,
    provider_id: Option<&ProviderId>,
    ek: Option<&str>,
) -> Option<(DenyReason, String)> {
    let ek = ek?;
    if let Some(claimed) = claim.valid().and_then(|c| c.ek_sha256.as_deref())
        && claimed != ek
    {
        return Some((
            DenyReason::EndorsementKeyMismatch,
            format!(
                "EK {ek} differs from the EK {claimed} on the claim of {}",
                target.describe()
            ),
        ));
    }
    fn held<'c>(ek: &str, mut pins: impl Iterator<Item = &'c str>, mut claimed: impl Iterator<Item = &'c str>) -> bool {
        pins.any(|p| p.split(',').any(|p| p.trim().eq_ignore_ascii_case(ek))) || claimed.any(|c| c == ek)
    }
    let ours = |namespace: &str, cluster: &str| namespace == inputs.cluster.namespace && cluster == inputs.cluster.name;
    // Looked up by EK, not by walking the Cluster (inventory::index).
    let inventory = inputs.inventory;
    let index = inventory.index();
    let elsewhere = index
        .machines_with_ek(ek)
        .iter()
        .map(|&at| &inventory.machines[at])
        .find(|m| {
            ours(&m.namespace, &m.cluster_name)
                && !target.is_machine(m)
                && held(ek, m.ek_pins(), m.valid_claim().and_then(|c| c.ek_sha256).into_iter())
        });
    let holder = elsewhere.map(|m| format!("Machine {}", m.name())).or_else(|| {
        index
            .pools_with_ek(ek)
            .iter()
            .map(|&at| &inventory.pools[at])
            .find(|p| {
                let same = target.is_pool(p);
                // Within the target pool, only the other instances' claims count, and only
                // those of instances still listed: a removed instance's record (kept until the
                // pool's next claim write prunes it) holds no EK.
                let others = p
                    .claims
                    .records()
                    .filter(|c| p.provider_ids.contains(&c.provider_id))
                    .filter(|c| !same || Some(c.provider_id.as_str()) != provider_id.map(ProviderId::as_str))
                    .filter_map(|c| c.ek_sha256.as_deref());
                let pins = p.ek_pins.iter().filter(|_| !same).map(String::as_str);
                ours(&p.namespace, &p.cluster_name) && held(ek, pins, others)
            })
            .map(|p| format!("MachinePool {}", p.name))
    });
    holder.map(|holder| {
        (
            DenyReason::EndorsementKeyMismatch,
            format!("EK {ek} is pinned to or claimed by {holder}: one EK serves one Machine"),
        )
    })
}
