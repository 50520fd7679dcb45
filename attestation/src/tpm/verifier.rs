//! The `tpm/v1` verifier: the signer side of SPEC section 5's two phases.
//!
//! Phase 1 (CSR #1) proves a genuine or pinned TPM holds an AK that quoted the CSR key; the
//! answer is a credential only that TPM can open, carried in the challenge annotation, and
//! the CSR stays pending. Phase 2 (CSR #2) proves the TPM opened it: its quote binds the CSR
//! key and the challenge secret, which the signer derives again from its key rather than
//! storing. Verification is pure apart from MakeCredential's randomness.

use std::collections::BTreeMap;

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};
use zeroize::Zeroizing;

use super::challenge_key::{ChallengeKey, Keys, WeakChallengeKey};
use super::credential::make_credential;
use super::data::{ChallengeAnnotation, ChallengeBinding, TpmData, challenge_secret, phase_two_extra_data};
use super::ek::EkTrust;
use super::measured_boot;
use super::public::TpmPublic;
use super::quote::{Quote, Signature};
use crate::attestor::{Evidence, Verification, Verifier};
use crate::challenge::{
    Refusal, UNCHECKED_MAC, Unverified, challenge_failed, check_age, first_csr, held_keys, same_request,
};
use crate::csr::ParsedCsr;
use crate::csr_object::CsrRef;
use crate::decision::DenyReason;
use crate::digest::{hex, sha256};
use crate::envelope::RequestEnvelope;
use crate::names::{ANNOTATION_TPM_CHALLENGE, SIGNER_TPM};

/// Provider name.
pub const PROVIDER: &str = "tpm";

/// Default lifetime of a challenge.
pub const DEFAULT_CHALLENGE_TTL: Duration = Duration::minutes(10);

/// Challenges pending at once for one provider ID: enough for a node that retried, few enough
/// that a flood of first-phase CSRs costs the signer nothing.
pub const MAX_PENDING_CHALLENGES: usize = 3;

/// How a `tpm/v1` signer trusts EKs and derives challenges.
pub struct TpmVerifier {
    ek_trust: Option<EkTrust>,
    trust_on_first_use: bool,
    challenge_key: ChallengeKey,
    challenge_ttl: Duration,
}

impl std::fmt::Debug for TpmVerifier {
    // The challenge key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmVerifier")
            .field("ek_ca_bundle", &self.ek_trust.is_some())
            .field("trust_on_first_use", &self.trust_on_first_use)
            .field("challenge_ttl", &self.challenge_ttl)
            .finish_non_exhaustive()
    }
}

impl TpmVerifier {
    /// A verifier deriving challenge secrets under `challenge_key` (the management-cluster
    /// Secret's bytes), trusting EKs by pin and claim only until configured further.
    pub fn new(challenge_key: Vec<u8>) -> Result<Self, WeakChallengeKey> {
        Ok(Self::with_challenge_key(ChallengeKey::loaded(challenge_key)?))
    }

    /// A verifier whose challenge key is loaded later, into `challenge_key`.
    pub fn with_challenge_key(challenge_key: ChallengeKey) -> Self {
        Self {
            ek_trust: None,
            trust_on_first_use: false,
            challenge_key,
            challenge_ttl: DEFAULT_CHALLENGE_TTL,
        }
    }

    /// Also trusts EKs whose certificate chains to these anchors (`--tpm-ek-ca-bundle`).
    pub fn with_ek_trust(mut self, trust: EkTrust) -> Self {
        self.ek_trust = Some(trust);
        self
    }

    /// Accepts an EK with neither chain nor pin for an unclaimed Machine
    /// (`--tpm-trust-on-first-use`).
    pub fn with_trust_on_first_use(mut self, on: bool) -> Self {
        self.trust_on_first_use = on;
        self
    }

    /// How long a challenge may go unanswered.
    pub fn with_challenge_ttl(mut self, ttl: Duration) -> Self {
        self.challenge_ttl = ttl;
        self
    }
}

fn invalid(message: impl Into<String>) -> Refusal {
    (DenyReason::AttestationInvalid, message.into())
}

/// What both phases establish: a trusted EK, an AK fit to attest, and a quote by it.
struct Attested {
    ek_sha256: String,
    ek: TpmPublic,
    ak: TpmPublic,
    quote: Quote,
    trust: String,
}

impl TpmVerifier {
    /// EK trust, in order: the Machine's pin (authoritative when set), the claim's EK, the
    /// certificate chain, then trust on first use for an unclaimed Machine.
    fn trust_ek(
        &self,
        evidence: &Evidence<'_>,
        data: &TpmData,
        ek: &TpmPublic,
        ek_sha256: &str,
    ) -> Result<String, Refusal> {
        let pins: Vec<&str> = evidence
            .ek_pins
            .iter()
            .flat_map(|p| p.split(','))
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if !pins.is_empty() {
            return if pins.iter().any(|p| p.eq_ignore_ascii_case(ek_sha256)) {
                Ok("EK pinned on the Machine".into())
            } else {
                Err((
                    DenyReason::EndorsementKeyMismatch,
                    format!("EK {ek_sha256} is not the Machine's pin ({})", pins.join(",")),
                ))
            };
        }
        if let Some(claimed) = evidence.claim.and_then(|c| c.ek_sha256.as_deref()) {
            // The rule engine names the mismatch (and, for a re-bootstrap, the claim).
            return Ok(if claimed == ek_sha256 {
                "EK recorded in the Machine's claim".into()
            } else {
                "EK differs from the claim".into()
            });
        }
        let chain = match (&self.ek_trust, &data.ek_certificate) {
            (Some(trust), Some(cert)) => Some(trust.verify(ek, cert, &data.ek_intermediates)),
            _ => None,
        };
        match chain {
            Some(Ok(())) => Ok("EK certificate chains to --tpm-ek-ca-bundle".into()),
            _ if self.trust_on_first_use && evidence.claim.is_none() => {
                Ok("EK trusted on first use (no pin, no chain, unclaimed Machine)".into())
            }
            Some(Err(why)) => Err((DenyReason::EndorsementKeyUntrusted, format!("EK {ek_sha256}: {why}"))),
            None => Err((
                DenyReason::EndorsementKeyUntrusted,
                format!(
                    "EK {ek_sha256} has no pin on the Machine and {}",
                    match (&self.ek_trust, &data.ek_certificate) {
                        (None, _) => "no --tpm-ek-ca-bundle is configured",
                        (Some(_), None) => "the node sent no EK certificate",
                        (Some(_), Some(_)) => "its certificate does not chain",
                    }
                ),
            )),
        }
    }

    /// The checks both phases share, then the quote's `extraData` against `extra_data`.
    fn attest(&self, evidence: &Evidence<'_>, data: &TpmData) -> Result<Attested, Refusal> {
        let ek = TpmPublic::from_tpm2b(&data.ek_public).map_err(|e| invalid(format!("ekPublic: {e}")))?;
        let ek_sha256 = ek.spki_sha256_hex().map_err(|e| invalid(format!("ekPublic: {e}")))?;
        let trust = self.trust_ek(evidence, data, &ek, &ek_sha256)?;
        let ak = TpmPublic::from_tpm2b(&data.ak_public).map_err(|e| invalid(format!("akPublic: {e}")))?;
        ak.check_attestation_key()
            .map_err(|e| invalid(format!("akPublic: {e}")))?;
        let quote = Quote::from_tpm2b(&data.quote).map_err(|e| invalid(format!("quote: {e}")))?;
        let signature = Signature::parse(&data.signature).map_err(|e| invalid(format!("signature: {e}")))?;
        signature
            .verify(&ak, &quote.signed)
            .map_err(|e| invalid(format!("the quote's signature does not verify under the AK: {e}")))?;
        check_pcrs(data, &quote)?;
        Ok(Attested {
            ek_sha256,
            ek,
            ak,
            quote,
            trust,
        })
    }

    /// Phase 1 under the challenge key, or without it (`None`, explain): then nothing is issued
    /// and a challenge on the CSR is read without checking its mac.
    fn phase_one(&self, keys: Option<&Keys>, evidence: &Evidence<'_>, data: &TpmData) -> Result<Verification, Refusal> {
        let attested = self.attest(evidence, data)?;
        if attested.quote.extra_data != sha256(&evidence.csr.spki_der) {
            return Err(invalid(
                "the quote's extraData is not SHA-256 of this CSR's key: the quote is bound to another key",
            ));
        }
        let boot = measured_boot::phase_one(&evidence.cluster.boot_policy, data, &attested.quote)?;
        let note = |what: &str| {
            format!(
                "tpm/v1 phase 1: {}, AK quote binds the CSR key, EK {}, {boot}; {what}",
                attested.trust, attested.ek_sha256
            )
        };
        // A challenge already on the CSR is answered as it stands: writing a second one would
        // race the node. A requester-made one only fails the requester (its secret is derived
        // under a key the requester does not have).
        if let Some(existing) = evidence.object.annotations.get(ANNOTATION_TPM_CHALLENGE) {
            let (issued_at, _) = match self.live_challenge(keys, &evidence.object.uid, existing, evidence.now) {
                Ok(live) => live,
                Err(unverified) => return unverified.judge("tpm/v1", keys, evidence),
            };
            let unchecked = if keys.is_none() { UNCHECKED_MAC } else { "" };
            return Ok(Verification::Challenge {
                annotations: BTreeMap::new(),
                note: note(&format!(
                    "challenge issued {}, waiting for CSR #2 until {}{unchecked}",
                    fmt_time(issued_at),
                    fmt_time(issued_at + self.challenge_ttl)
                )),
                ek_sha256: Some(attested.ek_sha256),
            });
        }
        let Some(keys) = keys else {
            return Ok(Verification::Challenge {
                annotations: BTreeMap::new(),
                note: note("no challenge on it yet: the signer issues one when it decides this CSR"),
                ek_sha256: Some(attested.ek_sha256),
            });
        };
        let pending = self.pending_for(keys, evidence);
        if pending >= MAX_PENDING_CHALLENGES {
            return Ok(Verification::Challenge {
                annotations: BTreeMap::new(),
                note: note(&format!(
                    "{pending} challenges are already pending for this provider ID (at most {MAX_PENDING_CHALLENGES}): waiting for one to be answered or to expire"
                )),
                ek_sha256: Some(attested.ek_sha256),
            });
        }
        let issued_at = evidence.now.replace_nanosecond(0).unwrap_or(evidence.now);
        // New challenges are written under the newest key only.
        let key = keys.current();
        let secret = secret(key, evidence, evidence.object.uid.as_str(), &attested, issued_at);
        let credential = make_credential(&attested.ek, &attested.ak.name(), secret.as_slice())
            .map_err(|e| invalid(format!("MakeCredential for this EK: {e}")))?;
        let annotation = ChallengeAnnotation::sealed(
            key,
            &evidence.object.uid,
            fmt_time(issued_at),
            credential.credential_blob,
            credential.encrypted_secret,
        );
        let value = serde_json::to_string(&annotation).map_err(|e| invalid(format!("challenge annotation: {e}")))?;
        Ok(Verification::Challenge {
            annotations: BTreeMap::from([(ANNOTATION_TPM_CHALLENGE.to_owned(), value)]),
            note: note(&format!(
                "challenge issued, valid until {}",
                fmt_time(issued_at + self.challenge_ttl)
            )),
            ek_sha256: Some(attested.ek_sha256),
        })
    }

    /// Phase 2 under the challenge key, or without it (`None`, explain): then everything but
    /// the answer itself is checked, and the answer is left to the signer.
    fn phase_two(&self, keys: Option<&Keys>, evidence: &Evidence<'_>, data: &TpmData) -> Result<Verification, Refusal> {
        let Some(reference) = &data.challenge else {
            return Err(invalid("phase 2 names no CSR #1"));
        };
        let first = first_csr(evidence, &reference.csr_name, &reference.csr_uid)?;
        let envelope = RequestEnvelope::parse(&first.request)
            .map_err(|e| challenge_failed(format!("CSR #1 does not parse: {e}")))?;
        let first_csr = ParsedCsr::from_der(&envelope.csr_der)
            .map_err(|e| challenge_failed(format!("CSR #1 does not parse: {e}")))?;
        let first_data = envelope
            .data
            .as_deref()
            .and_then(|d| TpmData::parse(d).ok())
            .filter(|d| d.phase == 1)
            .ok_or_else(|| challenge_failed("CSR #1 carries no tpm/v1 phase-1 DATA"))?;
        same_as_first(evidence.csr, &first_csr, data, &first_data)?;
        let annotation = first
            .annotations
            .get(ANNOTATION_TPM_CHALLENGE)
            .ok_or_else(|| challenge_failed(format!("CSR #1 {:?} carries no challenge", first.name)))?;
        let (issued_at, key) = match self.live_challenge(keys, &first.uid, annotation, evidence.now) {
            Ok(live) => live,
            Err(unverified) => return unverified.judge("tpm/v1", keys, evidence),
        };

        let attested = self.attest(evidence, data)?;
        let boot = match &evidence.cluster.boot_policy {
            super::boot_policy::PolicyState::Loaded { .. } => {
                let first_quote = Quote::from_tpm2b(&first_data.quote)
                    .map_err(|e| challenge_failed(format!("CSR #1's quote: {e}")))?;
                Signature::parse(&first_data.signature)
                    .map_err(|e| e.to_string())
                    .and_then(|s| s.verify(&attested.ak, &first_quote.signed))
                    .map_err(|e| challenge_failed(format!("CSR #1's quote does not verify under the AK: {e}")))?;
                let note = measured_boot::phase_two(
                    &evidence.cluster.boot_policy,
                    &first_data,
                    &first_quote,
                    &attested.quote,
                )?;
                format!(", {note}")
            }
            _ => String::new(),
        };
        let Some(key) = key else {
            return Ok(Verification::Pending {
                message: format!(
                    "tpm/v1 phase 2: {}, EK {}, answering the challenge CSR #1 {} was issued {}: only the signer, holding the challenge key, can check the answer (explain never reads it)",
                    attested.trust,
                    attested.ek_sha256,
                    first.name,
                    fmt_time(issued_at)
                ),
            });
        };
        let secret = secret(key, evidence, &first.uid, &attested, issued_at);
        let expected = phase_two_extra_data(&evidence.csr.spki_der, secret.as_slice());
        if attested.quote.extra_data != expected {
            return Err(challenge_failed(
                "the phase-2 quote does not bind SHA-256(CSR key || challenge secret): the credential was not activated by this TPM for this AK",
            ));
        }
        Ok(Verification::Verified {
            instance: None,
            note: format!(
                "tpm/v1: {}, challenge of CSR #1 {} answered by the TPM, EK {}{boot}",
                attested.trust, first.name, attested.ek_sha256
            ),
            ek_sha256: Some(attested.ek_sha256),
            supersedes: Some(CsrRef {
                name: first.name,
                uid: first.uid,
            }),
        })
    }

    /// Live challenges this signer issued on other `tpm/v1` CSRs for this CSR's provider ID.
    /// Only authenticated ones count: anyone who can create a CSR can write the annotation, and
    /// counting those would let them use up another node's challenges.
    fn pending_for(&self, keys: &Keys, evidence: &Evidence<'_>) -> usize {
        let provider_id = |csr: &ParsedCsr| csr.provider_id_extensions().next().map(|e| e.value.clone());
        let ours = provider_id(evidence.csr);
        evidence
            .csrs
            .pending_with(ANNOTATION_TPM_CHALLENGE)
            .iter()
            .filter(|other| other.uid != evidence.object.uid && other.signer_name == SIGNER_TPM)
            .filter(|other| {
                other
                    .annotations
                    .get(ANNOTATION_TPM_CHALLENGE)
                    .is_some_and(|a| self.live_challenge(Some(keys), &other.uid, a, evidence.now).is_ok())
            })
            .filter(|other| {
                RequestEnvelope::parse(&other.request)
                    .ok()
                    .and_then(|e| ParsedCsr::from_der(&e.csr_der).ok())
                    .is_some_and(|c| provider_id(&c) == ours)
            })
            .count()
    }

    /// Reads the challenge annotation of CSR `csr_uid`, checks its mac is this signer's under one
    /// of its keys (unless the keys are withheld), and returns its `issuedAt`, and the key it
    /// was written under, when it is neither expired nor ahead.
    fn live_challenge<'k>(
        &self,
        keys: Option<&'k Keys>,
        csr_uid: &str,
        annotation: &str,
        now: OffsetDateTime,
    ) -> Result<(OffsetDateTime, Option<&'k [u8]>), Unverified> {
        let parsed: ChallengeAnnotation = serde_json::from_str(annotation).map_err(|e| {
            Unverified::Refused(challenge_failed(format!(
                "the challenge annotation is not this signer's: {e}"
            )))
        })?;
        let issued_at = OffsetDateTime::parse(&parsed.issued_at, &Rfc3339).map_err(|e| {
            Unverified::Refused(challenge_failed(format!(
                "the challenge's issuedAt does not parse: {e}"
            )))
        })?;
        let key = match keys {
            Some(keys) => Some(
                keys.find(issued_at, |key| parsed.is_authentic(key, csr_uid))
                    .ok_or(Unverified::UnknownKey)?,
            ),
            None => None,
        };
        check_age(&parsed.issued_at, issued_at, now, self.challenge_ttl)?;
        Ok((issued_at, key))
    }
}

fn secret(
    key: &[u8],
    evidence: &Evidence<'_>,
    first_uid: &str,
    attested: &Attested,
    issued_at: OffsetDateTime,
) -> Zeroizing<[u8; 32]> {
    let spki_sha256 = sha256(&evidence.csr.spki_der);
    Zeroizing::new(challenge_secret(
        key,
        &ChallengeBinding {
            cluster_uid: &evidence.cluster.uid,
            csr_uid: first_uid,
            spki_sha256: &spki_sha256,
            ak_name: &attested.ak.name(),
            ek_sha256: &attested.ek_sha256,
            issued_at,
        },
    ))
}

fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// CSR #2 must be CSR #1 again: byte-equal key, same subject and provider ID, same EK and AK.
fn same_as_first(second: &ParsedCsr, first: &ParsedCsr, data: &TpmData, first_data: &TpmData) -> Result<(), Refusal> {
    same_request(second, first)?;
    if data.ak_public != first_data.ak_public {
        return Err(challenge_failed("CSR #2's AK differs from CSR #1's"));
    }
    if data.ek_public != first_data.ek_public {
        return Err(challenge_failed("CSR #2's EK differs from CSR #1's"));
    }
    Ok(())
}

/// PCR values are informational in v1, but when sent they must be the quoted ones.
fn check_pcrs(data: &TpmData, quote: &Quote) -> Result<(), Refusal> {
    // `pcrs` names the sha256 bank only (TpmData::parse refuses any other).
    let Some(values) = data.sha256_pcr_values().map_err(invalid)? else {
        return Ok(());
    };
    // In the quote's selection order (ascending within a bank, as TPMs emit).
    let selected: Vec<u32> = quote.selection.iter().flat_map(|s| s.pcrs.iter().copied()).collect();
    let ordered: Vec<(u32, Vec<u8>)> = selected
        .iter()
        .filter_map(|i| values.get(i).map(|v| (*i, v.clone())))
        .collect();
    if ordered.len() != values.len() || !quote.pcr_digest_matches(&ordered) {
        return Err(invalid(format!(
            "pcrs: the values sent for PCRs {:?} do not hash to the quote's pcrDigest {}",
            values.keys().collect::<Vec<_>>(),
            hex(&quote.pcr_digest)
        )));
    }
    Ok(())
}

impl Verifier for TpmVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_TPM
    }

    fn proves_hardware_identity(&self) -> bool {
        true
    }

    fn verify(&self, evidence: &Evidence<'_>) -> Verification {
        let keys = match held_keys(&self.challenge_key, "tpm/v1") {
            Ok(keys) => keys,
            Err(message) => return Verification::Pending { message },
        };
        if let Some(message) = measured_boot::held(&evidence.cluster.boot_policy) {
            return Verification::Pending { message };
        }
        let outcome = match evidence.data {
            None => Err(invalid("tpm/v1 needs an ATTESTATION DATA block")),
            Some(bytes) => TpmData::parse(bytes)
                .map_err(|e| invalid(e.to_string()))
                .and_then(|data| match data.phase {
                    1 => self.phase_one(keys.as_ref(), evidence, &data),
                    _ => self.phase_two(keys.as_ref(), evidence, &data),
                }),
        };
        outcome.unwrap_or_else(|(reason, message)| Verification::Failed { reason, message })
    }
}
