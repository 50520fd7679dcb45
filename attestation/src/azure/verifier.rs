//! The `azure/v1` verifier (SPEC section 5).
//!
//! CSR #1: the provider ID must name an Azure VM the Cluster allows; the signer answers with a
//! challenge ([`super::challenge`]). CSR #2, in order: the challenge (the signer's, CSR #1's,
//! unexpired, for the same key and requester, CSR #1 still open so it answers once); the
//! PKCS#7 (one signer, RSA with SHA-256, its embedded leaf chaining to the shipped Microsoft
//! roots, under a metadata domain, the signature over the statement); the statement (the
//! challenge's nonce, `expiresOn` ahead, the provider ID's subscription); then ARM's `vmId` for
//! the VM the provider ID names, which must be the statement's. The claim records
//! `azure:<subscriptionId>/<vmId>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

use super::challenge::AzureChallenge;
use super::document::AttestedDocument;
use super::provider_id::AzureVm;
use super::trust::MicrosoftTrust;
use super::vms::{VirtualMachines, VmAnswer};
use super::{AzureData, PROVIDER};
use crate::attestor::{Evidence, Verification, Verifier};
use crate::challenge::{
    CLOCK_SKEW, Refusal, UNCHECKED_MAC, Unverified, challenge_failed, check_age, first_csr, held_keys, same_request,
};
use crate::cloud::pkcs7::{Profile, SignedStatement};
use crate::cloud::{CloudCall, allow_list};
use crate::csr::ParsedCsr;
use crate::csr_object::CsrRef;
use crate::decision::DenyReason;
use crate::digest::sha256;
use crate::envelope::RequestEnvelope;
use crate::names::{ANNOTATION_AZURE_CHALLENGE, ANNOTATION_AZURE_SUBSCRIPTIONS, SIGNER_AZURE};
use crate::tpm::challenge_key::{ChallengeKey, Keys};

/// Default lifetime of a challenge (as `tpm/v1`'s).
pub const DEFAULT_CHALLENGE_TTL: Duration = Duration::minutes(10);

/// Signer side of `azure/v1`.
pub struct AzureVerifier {
    trust: MicrosoftTrust,
    vms: Arc<dyn VirtualMachines>,
    challenge_key: ChallengeKey,
    challenge_ttl: Duration,
}

impl std::fmt::Debug for AzureVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureVerifier")
            .field("trust", &self.trust)
            .field("challenge_key", &self.challenge_key)
            .field("challenge_ttl", &self.challenge_ttl)
            .finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> Refusal {
    (DenyReason::AttestationInvalid, format!("azure/v1 {}", message.into()))
}

fn not_allowed(message: impl Into<String>) -> Refusal {
    (
        DenyReason::AttestationNotAllowed,
        format!("azure/v1 {}", message.into()),
    )
}

fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

impl AzureVerifier {
    /// A verifier with the shipped Microsoft bundle, writing its challenges under
    /// `challenge_key` (the one `tpm/v1` uses), reaching ARM's answers through `vms`.
    pub fn new(challenge_key: ChallengeKey, vms: Arc<dyn VirtualMachines>) -> Self {
        Self {
            trust: MicrosoftTrust::shipped(),
            vms,
            challenge_key,
            challenge_ttl: DEFAULT_CHALLENGE_TTL,
        }
    }

    /// `--azure-ca-bundle`.
    pub fn with_trust(mut self, trust: MicrosoftTrust) -> Self {
        self.trust = trust;
        self
    }

    /// How long a challenge may go unanswered (`--tpm-challenge-ttl` serves both).
    pub fn with_challenge_ttl(mut self, ttl: Duration) -> Self {
        self.challenge_ttl = ttl;
        self
    }

    /// The verified statement of a PKCS#7 at `now`: the leaf the document embeds chains to the
    /// bundle under a metadata domain and signed the statement. (`check` and the tests judge
    /// real documents with this at their own time.)
    pub fn verified_document(&self, pkcs7: &[u8], now: OffsetDateTime) -> Result<(AttestedDocument, String), String> {
        let signed = SignedStatement::parse(pkcs7, Profile::AZURE).map_err(|e| format!("document: {e}"))?;
        let leaf = signed
            .embedded_signer()
            .ok_or("document: the PKCS#7 carries no certificate of its signer")?;
        let trusted = self.trust.verify(leaf, now).map_err(|e| format!("document: {e}"))?;
        signed
            .verify(leaf, "the document's certificate")
            .map_err(|e| format!("document: {e}"))?;
        let document = AttestedDocument::parse(signed.content()).map_err(|e| format!("document: {e}"))?;
        Ok((document, format!("{} ({})", trusted.dns_name, trusted.cloud)))
    }

    /// Reads the challenge on CSR `csr_uid`, checks its mac is this signer's for that CSR and
    /// key (unless the keys are withheld), and its age.
    fn live_challenge(
        &self,
        keys: Option<&Keys>,
        csr_uid: &str,
        annotation: &str,
        spki_sha256: &[u8; 32],
        now: OffsetDateTime,
    ) -> Result<(OffsetDateTime, AzureChallenge), Unverified> {
        let challenge = AzureChallenge::parse(annotation)
            .map_err(|e| Unverified::Refused(challenge_failed(format!("the challenge is not this signer's: {e}"))))?;
        let issued_at = OffsetDateTime::parse(&challenge.issued_at, &Rfc3339).map_err(|e| {
            Unverified::Refused(challenge_failed(format!(
                "the challenge's issuedAt does not parse: {e}"
            )))
        })?;
        if let Some(keys) = keys {
            keys.find(issued_at, |key| challenge.is_authentic(key, csr_uid, spki_sha256))
                .ok_or(Unverified::UnknownKey)?;
        }
        check_age(&challenge.issued_at, issued_at, now, self.challenge_ttl)?;
        Ok((issued_at, challenge))
    }

    fn phase_one(&self, keys: Option<&Keys>, evidence: &Evidence<'_>, vm: &AzureVm) -> Result<Verification, Refusal> {
        let spki_sha256 = sha256(&evidence.csr.spki_der);
        let note = |what: &str| format!("azure/v1 phase 1: provider ID names {vm}; {what}");
        if let Some(existing) = evidence.object.annotations.get(ANNOTATION_AZURE_CHALLENGE) {
            let (issued_at, _) =
                match self.live_challenge(keys, &evidence.object.uid, existing, &spki_sha256, evidence.now) {
                    Ok(live) => live,
                    Err(unverified) => return unverified.judge("azure/v1", keys, evidence),
                };
            let unchecked = if keys.is_none() { UNCHECKED_MAC } else { "" };
            return Ok(Verification::Challenge {
                annotations: BTreeMap::new(),
                note: note(&format!(
                    "challenge issued {}, waiting for CSR #2 with an attested document until {}{unchecked}",
                    fmt_time(issued_at),
                    fmt_time(issued_at + self.challenge_ttl)
                )),
                ek_sha256: None,
            });
        }
        let Some(keys) = keys else {
            return Ok(Verification::Challenge {
                annotations: BTreeMap::new(),
                note: note("no challenge on it yet: the signer issues one when it decides this CSR"),
                ek_sha256: None,
            });
        };
        let issued_at = evidence.now.replace_nanosecond(0).unwrap_or(evidence.now);
        let challenge = AzureChallenge::issue(keys.current(), &evidence.object.uid, fmt_time(issued_at), &spki_sha256);
        let value = serde_json::to_string(&challenge).map_err(|e| invalid(format!("challenge annotation: {e}")))?;
        Ok(Verification::Challenge {
            annotations: BTreeMap::from([(ANNOTATION_AZURE_CHALLENGE.to_owned(), value)]),
            note: note(&format!(
                "challenge issued, valid until {}",
                fmt_time(issued_at + self.challenge_ttl)
            )),
            ek_sha256: None,
        })
    }

    fn phase_two(
        &self,
        keys: Option<&Keys>,
        evidence: &Evidence<'_>,
        vm: &AzureVm,
        data: &AzureData,
    ) -> Result<Verification, Refusal> {
        let reference = data
            .challenge
            .as_ref()
            .ok_or_else(|| invalid("phase 2 names no CSR #1"))?;
        let first = first_csr(evidence, &reference.csr_name, &reference.csr_uid)?;
        let envelope = RequestEnvelope::parse(&first.request)
            .map_err(|e| challenge_failed(format!("CSR #1 does not parse: {e}")))?;
        let first_csr = ParsedCsr::from_der(&envelope.csr_der)
            .map_err(|e| challenge_failed(format!("CSR #1 does not parse: {e}")))?;
        let first_phase = envelope
            .data
            .as_deref()
            .and_then(|d| AzureData::parse(d).ok())
            .map(|d| d.phase);
        if first_phase != Some(1) {
            return Err(challenge_failed("CSR #1 carries no azure/v1 phase-1 DATA"));
        }
        same_request(evidence.csr, &first_csr)?;
        let annotation = first
            .annotations
            .get(ANNOTATION_AZURE_CHALLENGE)
            .ok_or_else(|| challenge_failed(format!("CSR #1 {:?} carries no challenge", first.name)))?;
        let spki_sha256 = sha256(&evidence.csr.spki_der);
        let (issued_at, challenge) = match self.live_challenge(keys, &first.uid, annotation, &spki_sha256, evidence.now)
        {
            Ok(live) => live,
            Err(unverified) => return unverified.judge("azure/v1", keys, evidence),
        };

        let pkcs7 = data.pkcs7().map_err(invalid)?;
        let (document, leaf) = self.verified_document(&pkcs7, evidence.now).map_err(invalid)?;
        if document.nonce != challenge.nonce {
            return Err(challenge_failed(format!(
                "the attested document was fetched with nonce {:?}, not the challenge's: it answers another challenge, or none",
                crate::identity::truncate(&document.nonce, 40)
            )));
        }
        if document.expires_on <= evidence.now {
            return Err(invalid(format!(
                "the attested document expired at {}",
                fmt_time(document.expires_on)
            )));
        }
        if document.created_on > evidence.now + CLOCK_SKEW {
            return Err(invalid(format!(
                "the attested document was created at {}, in the future",
                fmt_time(document.created_on)
            )));
        }
        if !document.subscription_id.eq_ignore_ascii_case(&vm.subscription) {
            return Err(invalid(format!(
                "the attested document is of subscription {}, the provider ID names {}",
                crate::identity::truncate(&document.subscription_id, 48),
                vm.subscription
            )));
        }
        // A refusal rests on ARM's answer: one given before this CSR was first seen may be of a
        // VM since replaced under the same name, so ARM is asked again before refusing.
        let ask_again = |why: String| {
            let stale = self.vms.asked_at(vm).is_some_and(|at| at < evidence.first_seen);
            if stale {
                Ok(Verification::NeedsCloud {
                    call: CloudCall::AzureVm(vm.clone()),
                    message: format!(
                        "azure/v1: {why}; asking Azure Resource Manager again (its answer predates this CSR)"
                    ),
                })
            } else {
                Err(invalid(why))
            }
        };
        let vm_id = match self.vms.answer(vm) {
            VmAnswer::Found { vm_id } => vm_id,
            VmAnswer::Missing => {
                return ask_again(format!("Azure Resource Manager says {vm} does not exist"));
            }
            VmAnswer::Unavailable(why) => {
                return Ok(Verification::Pending {
                    message: format!("azure/v1: Azure Resource Manager could not be asked about {vm}: {why}"),
                });
            }
            VmAnswer::NotAsked => {
                return Ok(Verification::NeedsCloud {
                    call: CloudCall::AzureVm(vm.clone()),
                    message: format!("azure/v1: asking Azure Resource Manager for the vmId of {vm}"),
                });
            }
        };
        if !vm_id.eq_ignore_ascii_case(&document.vm_id) {
            return ask_again(format!(
                "the attested document is of vmId {}, but {vm} has vmId {vm_id} (Azure Resource Manager): the document is another VM's",
                crate::identity::truncate(&document.vm_id, 48)
            ));
        }
        if keys.is_none() {
            return Ok(Verification::Pending {
                message: format!(
                    "azure/v1 phase 2: the attested document of {vm} (vmId {vm_id}, signed for {leaf}) answers the challenge CSR #1 {} was issued {}; whether the challenge is the signer's is for the signer to check (explain holds no challenge key)",
                    first.name,
                    fmt_time(issued_at)
                ),
            });
        }
        Ok(Verification::Verified {
            ek_sha256: None,
            instance: Some(format!("{PROVIDER}:{}/{}", vm.subscription, vm_id.to_ascii_lowercase())),
            note: format!(
                "azure/v1: attested document of vmId {vm_id} in subscription {}, signed for {leaf}, answers the challenge of CSR #1 {}; Azure Resource Manager says {vm} is that VM",
                vm.subscription, first.name
            ),
            supersedes: Some(CsrRef {
                name: first.name,
                uid: first.uid,
            }),
        })
    }

    fn judge(&self, keys: Option<&Keys>, evidence: &Evidence<'_>) -> Result<Verification, Refusal> {
        let vm = AzureVm::parse(evidence.provider_id.as_str()).map_err(invalid)?;
        if let Some(subscriptions) =
            allow_list(evidence.cluster, ANNOTATION_AZURE_SUBSCRIPTIONS).map_err(not_allowed)?
            && !subscriptions.iter().any(|s| s.eq_ignore_ascii_case(&vm.subscription))
        {
            return Err(not_allowed(format!(
                "subscription {} is not in the Cluster's {ANNOTATION_AZURE_SUBSCRIPTIONS} ({})",
                vm.subscription,
                subscriptions.join(",")
            )));
        }
        let data = evidence
            .data
            .ok_or_else(|| invalid("needs an ATTESTATION DATA block"))?;
        let data = AzureData::parse(data).map_err(invalid)?;
        match data.phase {
            1 => self.phase_one(keys, evidence, &vm),
            _ => self.phase_two(keys, evidence, &vm, &data),
        }
    }
}

impl Verifier for AzureVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_AZURE
    }

    /// The verified document names the instance, and the verifier holds it to the provider ID.
    fn proves_instance(&self) -> bool {
        true
    }

    fn verify(&self, evidence: &Evidence<'_>) -> Verification {
        let keys = match held_keys(&self.challenge_key, "azure/v1") {
            Ok(keys) => keys,
            Err(message) => return Verification::Pending { message },
        };
        self.judge(keys.as_ref(), evidence)
            .unwrap_or_else(|(reason, message)| Verification::Failed { reason, message })
    }
}
