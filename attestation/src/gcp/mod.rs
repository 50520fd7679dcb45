//! `gcp/v1`: a Compute Engine instance proves who it is with the metadata server's identity
//! token (SPEC section 5).
//!
//! The token is a JWT signed by Google (RS256). The node asks for it with the audience
//! `node-attestation.cluster.x-k8s.io/<B>`, where `B` is [`crate::cloud::binding`] of the CSR's
//! key, so Google itself states "this instance asked for a token for this key". The signer
//! verifies the signature with Google's published keys before it reads any claim, then the
//! issuer, the audience, the token's age, and the provider ID against the instance the token
//! names (`google.compute_engine`).
//!
//! - [`jwt`]: the compact JWS, read strictly (RS256 only).
//! - [`keys`]: Google's keys (JWKS) and the [`GoogleKeys`] trait the signer implements over a
//!   cache, and `check` over a file.
//! - [`verifier`]: the [`GcpVerifier`].
//! - [`attestor`]: [`GcpAttestor`], the node side, over the [`attestor::GceMetadata`] trait the
//!   plugin implements with HTTP.

pub mod attestor;
pub mod jwt;
pub mod keys;
pub mod verifier;

pub use attestor::GcpAttestor;
pub use keys::{GoogleKey, GoogleKeys, Jwks, KeyLookup};
pub use verifier::GcpVerifier;

/// Provider name.
pub const PROVIDER: &str = "gcp";

/// What the audience of a `gcp/v1` token starts with; the key binding follows.
pub const AUDIENCE_PREFIX: &str = "node-attestation.cluster.x-k8s.io/";

/// Google's published signing keys of identity tokens, as a JWKS (the default of
/// `--gcp-jwks-url`).
pub const GOOGLE_JWKS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";

/// The issuers Google's identity tokens carry.
pub const ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];

/// The audience a token for a CSR with this SubjectPublicKeyInfo must carry.
pub fn audience(spki_der: &[u8]) -> String {
    format!("{AUDIENCE_PREFIX}{}", crate::cloud::binding(spki_der))
}

/// The DATA block of `gcp/v1`: `{"identityToken": "<JWT>"}`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpData {
    /// The metadata server's identity token (`format=full`).
    #[serde(rename = "identityToken")]
    pub identity_token: String,
}

impl std::fmt::Debug for GcpData {
    // The token is a credential for as long as it lives: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpData").finish_non_exhaustive()
    }
}

impl GcpData {
    /// Reads the DATA block: one JSON object, that one field.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("DATA is not {{\"identityToken\": \"<JWT>\"}}: {e}"))
    }

    /// The DATA block's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}
