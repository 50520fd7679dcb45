//! The provider trait pair: an [`Attestor`] runs on the node and fills the DATA block; a
//! [`Verifier`] runs in the signer and judges it. A new provider is one of each, registered in
//! [`Verifiers`]; the rule engine and the binaries do not change.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use crate::claim::KubeletClaim;
use crate::csr::ParsedCsr;
use crate::csr_object::{CsrDirectory, CsrObject, CsrRef};
use crate::decision::DenyReason;
use crate::envelope::ProviderVersion;
use crate::machine::ClusterView;

/// Why a node-side attestor could not produce evidence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// The attestation device is missing or refused.
    #[error("attestation device unavailable: {0}")]
    DeviceUnavailable(String),
    /// Any other failure, described.
    #[error("attestation failed: {0}")]
    Failed(String),
}

/// What the node attests about.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AttestationRequest<'a> {
    /// DER SubjectPublicKeyInfo of the CSR key the evidence must bind.
    pub spki_der: &'a [u8],
    /// The signer's challenge on an earlier CSR, for a provider's second phase.
    pub challenge: Option<ChallengeAnswer<'a>>,
}

impl<'a> AttestationRequest<'a> {
    /// Evidence for a CSR with this key.
    pub fn new(spki_der: &'a [u8]) -> Self {
        Self {
            spki_der,
            challenge: None,
        }
    }

    /// Evidence answering the challenge the signer wrote on an earlier CSR.
    pub fn answering(spki_der: &'a [u8], challenge: ChallengeAnswer<'a>) -> Self {
        Self {
            spki_der,
            challenge: Some(challenge),
        }
    }
}

/// The CSR that carried a challenge, and the challenge (the annotation's value).
#[derive(Debug, Clone, Copy)]
pub struct ChallengeAnswer<'a> {
    /// The challenged CSR's name.
    pub csr_name: &'a str,
    /// Its UID.
    pub csr_uid: &'a str,
    /// The value of the provider's challenge annotation on it.
    pub annotation: &'a str,
}

/// Node side of a provider.
pub trait Attestor {
    /// What goes in the PROVIDER block.
    fn provider_version(&self) -> ProviderVersion;
    /// The client signer name CSRs from this attestor are filed under.
    fn signer_name(&self) -> &'static str;
    /// The DATA block for this request, or `None` for a provider that sends none.
    fn attest(&mut self, request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError>;
    /// The CSR annotation through which the signer challenges this provider's first CSR, for
    /// two-phase providers: when it appears, the node answers with a second CSR.
    fn challenge_annotation(&self) -> Option<&'static str> {
        None
    }
}

/// What the verifier is given: the evidence and the facts it may be checked against.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Evidence<'a> {
    /// The PROVIDER block (its version is one the verifier listed).
    pub version: &'a ProviderVersion,
    /// The DATA block.
    pub data: Option<&'a [u8]>,
    /// The CSR, already signature-checked.
    pub csr: &'a ParsedCsr,
    /// The CSR's provider ID (rule 8 held): what a cloud statement must name.
    pub provider_id: &'a crate::identity::ProviderId,
    /// The CSR object (name, UID, requester, annotations).
    pub object: &'a CsrObject,
    /// Other CSRs of the workload cluster.
    pub csrs: &'a dyn CsrDirectory,
    /// The Cluster.
    pub cluster: &'a ClusterView,
    /// EK pins of the Machine or MachinePool.
    pub ek_pins: &'a [&'a str],
    /// The valid claim of the Machine or instance, if any.
    pub claim: Option<&'a KubeletClaim>,
    /// The signer's clock.
    pub now: OffsetDateTime,
    /// When the signer first saw the CSR, on its own clock: a fetch made after it surely
    /// postdates the CSR (its creationTimestamp is the apiserver's clock).
    pub first_seen: OffsetDateTime,
}

/// A verifier's judgement.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verification {
    /// The evidence holds.
    Verified {
        /// SHA-256 (lowercase hex) of the canonical EK SPKI, for hardware-backed providers.
        ek_sha256: Option<String>,
        /// The cloud instance proven (`gcp:<project>/<id>`, `aws:<account>/<id>`), for cloud
        /// identity providers: recorded in the claim, and required of every later CSR for
        /// the Machine (SPEC rule 12).
        instance: Option<String>,
        /// What was verified, for the rule's note.
        note: String,
        /// An earlier CSR this one replaces (TPM phase 1): the signer denies it `Superseded`
        /// once this one is signed.
        supersedes: Option<CsrRef>,
    },
    /// The evidence holds so far, and the node must now answer a challenge: the CSR stays
    /// pending, carrying `annotations` (those not already on it), until the answer arrives as
    /// another CSR or the challenge expires.
    Challenge {
        /// Annotations to write on the CSR (empty once written).
        annotations: BTreeMap<String, String>,
        /// What was verified and what is awaited.
        note: String,
        /// EK hash, as for `Verified`.
        ek_sha256: Option<String>,
    },
    /// The evidence cannot be judged yet, for a reason on the signer's side (a key not loaded):
    /// the CSR waits, like any transient gap, until `--csr-max-age`.
    Pending {
        /// What is awaited.
        message: String,
    },
    /// The evidence cannot be judged until the signer asks the cloud something (Google's
    /// current keys, STS's answer): the controller makes `call` and decides again; the CSR
    /// waits meanwhile, like any transient gap.
    NeedsCloud {
        /// What to ask.
        call: crate::cloud::CloudCall,
        /// Why, for the rule's note.
        message: String,
    },
    /// The evidence does not hold.
    Failed {
        /// One of the attestation reasons of SPEC rule 12.
        reason: DenyReason,
        /// Names the failing value.
        message: String,
    },
}

/// Signer side of a provider. Verification is pure: everything it needs is in [`Evidence`]
/// or in the verifier's own configuration.
pub trait Verifier: Send + Sync {
    /// The provider name, e.g. `tpm`.
    fn provider(&self) -> &'static str;
    /// Supported versions, e.g. `["v1"]`.
    fn versions(&self) -> &'static [&'static str];
    /// The client signer name that carries this provider's CSRs.
    fn signer_name(&self) -> &'static str;
    /// Whether a verified result names a hardware key (an EK) that can re-prove a claim.
    fn proves_hardware_identity(&self) -> bool {
        false
    }
    /// Whether a verified result proves the node is the very instance the CSR's provider ID
    /// names (a cloud identity document naming that instance). SPEC rule 7 adopts a MachinePool
    /// instance, which carries no names, only on such proof (or an EK pinned on the pool).
    fn proves_instance(&self) -> bool {
        false
    }
    /// Judges the evidence.
    fn verify(&self, evidence: &Evidence<'_>) -> Verification;
}

/// The verifiers a signer runs with.
#[derive(Default)]
pub struct Verifiers {
    list: Vec<Box<dyn Verifier>>,
}

impl std::fmt::Debug for Verifiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list.iter().map(|v| v.provider())).finish()
    }
}

impl Verifiers {
    /// No verifiers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one; a later one for the same provider replaces the earlier.
    pub fn with(mut self, verifier: impl Verifier + 'static) -> Self {
        self.list.retain(|v| v.provider() != verifier.provider());
        self.list.push(Box::new(verifier));
        self
    }

    /// The verifier for a provider.
    pub fn for_provider(&self, provider: &str) -> Option<&dyn Verifier> {
        self.list.iter().find(|v| v.provider() == provider).map(|v| &**v)
    }

    /// Every supported `<provider>/<version>`, comma-separated (the value of
    /// `cluster.x-k8s.io/attestation-supported-versions`).
    pub fn supported_versions(&self) -> String {
        let mut all: Vec<String> = self
            .list
            .iter()
            .flat_map(|v| v.versions().iter().map(move |ver| format!("{}/{ver}", v.provider())))
            .collect();
        all.sort();
        all.join(",")
    }
}
