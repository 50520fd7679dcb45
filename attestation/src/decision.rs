//! What the rule engine returns: one [`Decision`] holding every rule's outcome.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::claim::ClaimWrite;

/// Why a CSR is denied: the SPEC's reason names, used verbatim as the `Denied` condition's
/// reason, in Events and as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[non_exhaustive]
pub enum DenyReason {
    /// Rule 1: the envelope or PKCS#10 does not parse.
    InvalidRequest,
    /// Rule 2: key not allowed or self-signature wrong.
    InvalidSignature,
    /// Rule 3: subject is not CN=system:node:<name>, O=system:nodes.
    SubjectMismatch,
    /// Rule 4 (client) / SPEC section 4 (serving): a forbidden or unverifiable SAN.
    #[serde(rename = "ForbiddenSAN")]
    ForbiddenSan,
    /// Rule 5: an extension other than the provider ID.
    ForbiddenExtension,
    /// Rule 6: usages other than the allowed set.
    ForbiddenUsage,
    /// Rule 7: the requester may not ask for this identity.
    RequesterNotAllowed,
    /// Rule 8: provider-ID extension absent or malformed.
    #[serde(rename = "MissingProviderID")]
    MissingProviderId,
    /// Rule 9: no single Machine/MachinePool owns the provider ID.
    MachineNotFound,
    /// Rule 9: the Machine is being deleted.
    MachineNotReady,
    /// Rule 10: the node name does not belong to the Machine.
    NodeNameMismatch,
    /// Rule 11: initial request for a Machine whose node is registered.
    NodeAlreadyRegistered,
    /// Rule 11: initial request for a Machine already claimed.
    MachineAlreadyClaimed,
    /// Rule 12: no PROVIDER block.
    AttestationMissing,
    /// Rule 12: provider not allowed for the Cluster, or not the signer's.
    AttestationNotAllowed,
    /// Rule 12: provider or version unknown to this signer.
    UnsupportedAttestationVersion,
    /// Rule 12: the attestation data does not verify.
    AttestationInvalid,
    /// Rule 12: the EK is neither chained to a trusted CA nor pinned.
    EndorsementKeyUntrusted,
    /// Rule 12: the EK differs from the pin or the claim.
    EndorsementKeyMismatch,
    /// Rule 12: the TPM credential challenge was not answered correctly.
    ChallengeFailed,
    /// A transient gap lasted longer than `--csr-max-age`.
    Expired,
    /// TPM CSR #1 after its CSR #2 was signed.
    Superseded,
}

impl DenyReason {
    /// The SPEC spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "InvalidRequest",
            Self::InvalidSignature => "InvalidSignature",
            Self::SubjectMismatch => "SubjectMismatch",
            Self::ForbiddenSan => "ForbiddenSAN",
            Self::ForbiddenExtension => "ForbiddenExtension",
            Self::ForbiddenUsage => "ForbiddenUsage",
            Self::RequesterNotAllowed => "RequesterNotAllowed",
            Self::MissingProviderId => "MissingProviderID",
            Self::MachineNotFound => "MachineNotFound",
            Self::MachineNotReady => "MachineNotReady",
            Self::NodeNameMismatch => "NodeNameMismatch",
            Self::NodeAlreadyRegistered => "NodeAlreadyRegistered",
            Self::MachineAlreadyClaimed => "MachineAlreadyClaimed",
            Self::AttestationMissing => "AttestationMissing",
            Self::AttestationNotAllowed => "AttestationNotAllowed",
            Self::UnsupportedAttestationVersion => "UnsupportedAttestationVersion",
            Self::AttestationInvalid => "AttestationInvalid",
            Self::EndorsementKeyUntrusted => "EndorsementKeyUntrusted",
            Self::EndorsementKeyMismatch => "EndorsementKeyMismatch",
            Self::ChallengeFailed => "ChallengeFailed",
            Self::Expired => "Expired",
            Self::Superseded => "Superseded",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The checks, named after what they look at; SPEC rule numbers in the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Rule {
    /// Rule 1.
    Request,
    /// Rule 2.
    Signature,
    /// Rule 3 (serving: CN and O).
    Subject,
    /// Rule 4 (serving: SANs against the Machine's addresses).
    SubjectAltNames,
    /// Rule 5.
    Extensions,
    /// Rule 6.
    Usages,
    /// Rule 7.
    Requester,
    /// Rule 8.
    ProviderId,
    /// Rule 9.
    Machine,
    /// Rule 10.
    NodeName,
    /// Rule 11.
    OneIdentity,
    /// Rule 12.
    Attestation,
}

impl Rule {
    /// Kebab-case name, as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Signature => "signature",
            Self::Subject => "subject",
            Self::SubjectAltNames => "subject-alt-names",
            Self::Extensions => "extensions",
            Self::Usages => "usages",
            Self::Requester => "requester",
            Self::ProviderId => "provider-id",
            Self::Machine => "machine",
            Self::NodeName => "node-name",
            Self::OneIdentity => "one-identity",
            Self::Attestation => "attestation",
        }
    }
}

/// One rule's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Verdict {
    /// The rule holds; the note says what was matched.
    Passed {
        /// What was checked.
        note: String,
    },
    /// The rule fails for good.
    Failed {
        /// The SPEC reason.
        reason: DenyReason,
        /// A message naming the offending value.
        message: String,
    },
    /// Not decidable yet (a transient gap); retried until `--csr-max-age`.
    Pending {
        /// What is missing.
        message: String,
        /// The reason used once the CSR is older than `--csr-max-age`.
        on_expiry: DenyReason,
    },
    /// Not run, because an earlier result made it moot or unsafe (no crypto after a cheap failure).
    NotEvaluated {
        /// Why.
        why: String,
    },
}

/// A rule and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleOutcome {
    /// Which rule.
    pub rule: Rule,
    /// What it found.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What to do with the CSR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision")]
#[non_exhaustive]
pub enum Outcome {
    /// Approve (and, for client CSRs, sign).
    Approved {
        /// The condition reason: names the attestor, e.g. `AttestedInsecureV1`.
        reason: String,
        /// Human message.
        message: String,
    },
    /// Deny.
    Denied {
        /// The SPEC reason.
        reason: DenyReason,
        /// Human message naming the failing value.
        message: String,
    },
    /// Leave pending and look again later.
    Retry {
        /// What is missing.
        message: String,
    },
}

impl Outcome {
    /// `Approved`, `Denied` or `Retry`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Approved { .. } => "Approved",
            Self::Denied { .. } => "Denied",
            Self::Retry { .. } => "Retry",
        }
    }
}

/// Which kind of CSR the decision is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CsrKind {
    /// Kubelet client certificate, signed by this signer.
    KubeletClient,
    /// Kubelet serving certificate, approved here, signed by the workload cluster.
    KubeletServing,
}

/// The rule engine's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Client or serving.
    pub kind: CsrKind,
    /// What to do.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Every rule, in SPEC order.
    pub rules: Vec<RuleOutcome>,
    /// The claim to write (with a resourceVersion precondition) before approving.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimWrite>,
    /// Annotations the signer writes on the CSR along with the decision.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The Machine or MachinePool the CSR maps to, for Events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::machine::TargetRef>,
    /// An earlier CSR this approved one replaces (TPM phase 1): denied `Superseded` once this
    /// one is signed, never signed itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<crate::csr_object::CsrRef>,
    /// For an approved client CSR: the verified request, ready for [`crate::ca::ClusterCa::issue`]
    /// without parsing it again.
    #[serde(skip)]
    pub issuance: Option<Issuance>,
    /// Calls to a cloud a verifier needs made before it can judge (the outcome is then
    /// `Retry`): the controller makes them and decides again.
    #[serde(skip)]
    pub cloud_calls: Vec<crate::cloud::CloudCall>,
    /// A denial whose rule read the CSR alone (who filed it, what it asks), nothing either
    /// cluster holds: no fresh read of the management cluster can change it (SPEC section 7, "A
    /// hostile workload cluster": a node filing CSRs for other nodes' names costs no read).
    #[serde(skip)]
    pub settled_by_request: bool,
}

/// What an approved client CSR hands to the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issuance {
    /// The parsed, signature-checked request.
    pub csr: crate::csr::ParsedCsr,
    /// Its provider ID.
    pub provider_id: crate::identity::ProviderId,
}

impl Decision {
    /// The verdict of one rule.
    pub fn verdict(&self, rule: Rule) -> Option<&Verdict> {
        self.rules.iter().find(|r| r.rule == rule).map(|r| &r.verdict)
    }
}
