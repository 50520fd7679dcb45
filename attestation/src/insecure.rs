//! `insecure/v1`: the "always allow" attestor of the Cluster API proposal, for infrastructure
//! with no secure mechanism. It sends no DATA block; every non-attestation rule still applies,
//! the claim included, so the first CSR to claim an unregistered Machine wins.

use crate::attestor::{AttestError, AttestationRequest, Attestor, Evidence, Verification, Verifier};
use crate::decision::DenyReason;
use crate::envelope::ProviderVersion;
use crate::names::SIGNER_INSECURE;

/// Provider name.
pub const PROVIDER: &str = "insecure";

/// Node side of `insecure/v1`.
#[derive(Debug, Default, Clone, Copy)]
pub struct InsecureAttestor;

impl Attestor for InsecureAttestor {
    fn provider_version(&self) -> ProviderVersion {
        ProviderVersion::new(PROVIDER, "v1")
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_INSECURE
    }

    fn attest(&mut self, _request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError> {
        Ok(None)
    }
}

/// Signer side of `insecure/v1`.
#[derive(Debug, Default, Clone, Copy)]
pub struct InsecureVerifier;

impl Verifier for InsecureVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_INSECURE
    }

    fn verify(&self, evidence: &Evidence<'_>) -> Verification {
        match evidence.data {
            None => Verification::Verified {
                ek_sha256: None,
                instance: None,
                note: "insecure/v1: nothing to verify".into(),
                supersedes: None,
            },
            Some(data) => Verification::Failed {
                reason: DenyReason::AttestationInvalid,
                message: format!("insecure/v1 sends no ATTESTATION DATA block, got {} bytes", data.len()),
            },
        }
    }
}
