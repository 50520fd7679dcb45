//! `aws/v1`: an EC2 instance proves who it is with two statements of AWS (SPEC section 5).
//!
//! - The instance identity document, signed by AWS with the region's RSA-2048 key
//!   (`dynamic/instance-identity/rsa2048`, PKCS#7 with the document inside). It names the
//!   account, instance and zone, but carries no nonce and no time of signing worth the name:
//!   on its own it is a bearer credential anyone on the node can copy, forever.
//! - The "secondary time-limited attestation" the Cluster API proposal asks for: an STS
//!   `GetCallerIdentity` request, signed (SigV4) with the instance role's credentials and
//!   carrying the key binding as a signed header. The signer replays it to its own STS
//!   endpoint; STS checks the signature and the time, and answers with the caller's ARN, which
//!   for instance-profile credentials ends in the instance ID.
//!
//! - [`pkcs7`]: the signed document, read as BER (AWS's encoding), verified with the region's
//!   certificate ([`certificates`]).
//! - [`document`]: the identity document's fields.
//! - [`sts`]: the signed request's checks, the call the signer makes, and STS's answer, reached
//!   through the [`CallerIdentity`] trait.
//! - [`verifier`]: the [`AwsVerifier`].
//! - `attestor` (feature `aws-attestor`): the node side, SigV4 through the official crate.

#[cfg(feature = "aws-attestor")]
pub mod attestor;
pub mod certificates;
pub mod document;
pub mod pkcs7;
pub mod sts;
pub mod verifier;

use base64::Engine as _;

pub use certificates::RegionCertificates;
pub use document::IdentityDocument;
pub use sts::{CallerIdentity, StsAnswer, StsCall, StsEndpoints};
pub use verifier::AwsVerifier;

/// Provider name.
pub const PROVIDER: &str = "aws";

/// The DATA block of `aws/v1`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsData {
    /// Base64 PKCS#7 of the identity document, as the metadata service serves it.
    pub rsa2048: String,
    /// The signed `GetCallerIdentity` request.
    pub sts: sts::SignedStsRequest,
}

impl std::fmt::Debug for AwsData {
    // The signed request carries a session token and a signature: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsData")
            .field("rsa2048_bytes", &self.rsa2048.len())
            .field("sts", &self.sts)
            .finish()
    }
}

impl AwsData {
    /// Reads the DATA block.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes)
            .map_err(|e| format!("DATA is not {{\"rsa2048\": ..., \"sts\": {{\"headers\", \"body\"}}}}: {e}"))
    }

    /// The DATA block's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The PKCS#7 bytes: standard base64, line breaks tolerated (the metadata service breaks
    /// its lines).
    pub fn pkcs7(&self) -> Result<Vec<u8>, String> {
        let compact: String = self.rsa2048.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| format!("rsa2048 is not base64: {e}"))
    }
}
