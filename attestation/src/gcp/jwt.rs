//! The compact JWS of a Compute Engine identity token, read strictly.
//!
//! Only RS256 is accepted: `alg: none` and HS256 (the classic confusion where the RSA public
//! key is used as an HMAC secret) are refused before any key is looked up, and a header with
//! `crit` is refused since nothing here understands an extension. The signature is checked
//! over the exact bytes sent before the claims are decoded at all ([`SignedToken::verify`]
//! is the only way to reach them).

use base64::Engine as _;
use serde::Deserialize;

use super::keys::GoogleKey;

/// Longest token read: Google's are about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a token is refused, naming the part that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtError {
    /// Not three base64url parts, or a part does not decode.
    #[error("the identity token is not a compact JWS: {0}")]
    Malformed(String),
    /// The header names another algorithm than RS256.
    #[error("the identity token's alg is {0:?}; only RS256 is accepted")]
    Algorithm(String),
    /// The header has no `kid`.
    #[error("the identity token's header names no kid")]
    NoKeyId,
    /// The signature does not verify under the named key.
    #[error("the identity token's signature does not verify under Google's key {kid:?}")]
    Signature {
        /// The key tried.
        kid: String,
    },
    /// The payload is not the claims object.
    #[error("the identity token's claims do not decode: {0}")]
    Claims(String),
}

/// The JOSE header fields read.
#[derive(Debug, Clone, Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// A token whose structure and header were read, signature not yet checked.
#[derive(Clone)]
pub struct SignedToken {
    kid: String,
    signing_input: Vec<u8>,
    payload: Vec<u8>,
    signature: Vec<u8>,
}

impl std::fmt::Debug for SignedToken {
    // A token is a credential for as long as it lives: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedToken")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

fn part(name: &str, text: &str) -> Result<Vec<u8>, JwtError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|e| JwtError::Malformed(format!("{name}: {e}")))
}

impl SignedToken {
    /// Reads `header.payload.signature`; checks the header (RS256, a kid, no crit).
    pub fn parse(token: &str) -> Result<Self, JwtError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Malformed(format!(
                "{} bytes, more than {MAX_TOKEN_BYTES}",
                token.len()
            )));
        }
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("not three dot-separated parts".into()));
        };
        let header: Header = serde_json::from_slice(&part("header", header_b64)?)
            .map_err(|e| JwtError::Malformed(format!("header: {e}")))?;
        if header.alg != "RS256" {
            return Err(JwtError::Algorithm(crate::identity::truncate(&header.alg, 32)));
        }
        if header.crit.is_some() {
            return Err(JwtError::Malformed(
                "the header lists critical extensions (crit)".into(),
            ));
        }
        let kid = header.kid.filter(|k| !k.is_empty()).ok_or(JwtError::NoKeyId)?;
        Ok(Self {
            kid,
            signing_input: format!("{header_b64}.{payload_b64}").into_bytes(),
            payload: part("payload", payload_b64)?,
            signature: part("signature", signature_b64)?,
        })
    }

    /// The key the header names.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// Checks the RS256 signature under `key`, then decodes the claims.
    pub fn verify(&self, key: &GoogleKey) -> Result<IdentityClaims, JwtError> {
        let public = aws_lc_rs::signature::RsaPublicKeyComponents {
            n: key.modulus(),
            e: key.exponent(),
        };
        public
            .verify(
                &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
                &self.signing_input,
                &self.signature,
            )
            .map_err(|_| JwtError::Signature { kid: self.kid.clone() })?;
        serde_json::from_slice(&self.payload).map_err(|e| JwtError::Claims(e.to_string()))
    }
}

/// The claims of a Compute Engine identity token (`format=full`) that the rules read; others
/// are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdentityClaims {
    /// Issuer.
    pub iss: String,
    /// Audience: one string (Google issues one; an array is refused as malformed).
    pub aud: String,
    /// Expiry, seconds since the epoch.
    pub exp: i64,
    /// Issued at, seconds since the epoch.
    pub iat: i64,
    /// Google's part (absent unless `format=full`).
    #[serde(default)]
    pub google: Option<GoogleClaims>,
}

/// The `google` claim.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GoogleClaims {
    /// The instance (absent for tokens of other Google workloads).
    #[serde(default)]
    pub compute_engine: Option<ComputeEngine>,
}

/// `google.compute_engine`: the instance the token was minted for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ComputeEngine {
    /// Project ID (a name, as in the provider ID).
    pub project_id: String,
    /// Zone, e.g. `europe-west1-b`.
    pub zone: String,
    /// Numeric instance ID (stable for the instance's life; recorded in the claim).
    pub instance_id: String,
    /// Instance name (the provider ID's last part).
    pub instance_name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    #[test]
    fn alg_none_and_hs256_are_refused_before_any_key_is_used() {
        for alg in ["none", "HS256", "RS512", "ES256", "rs256"] {
            let token = format!(
                "{}.{}.",
                b64(format!(r#"{{"alg":"{alg}","kid":"k"}}"#).as_bytes()),
                b64(b"{}")
            );
            assert_eq!(SignedToken::parse(&token).unwrap_err(), JwtError::Algorithm(alg.into()));
        }
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        let header = b64(br#"{"alg":"RS256","kid":"k"}"#);
        for (token, what) in [
            ("a.b".to_owned(), "three"),
            (format!("{header}.e30.c2ln.extra"), "three"),
            (format!("{header}=.e30.c2ln"), "header"),
            (format!("{header}.e30=.c2ln"), "payload"),
            (format!("{header}.e30.c2ln+"), "signature"),
            (format!("{}.e30.c2ln", b64(b"{")), "header"),
            (
                format!("{}.e30.c2ln", b64(br#"{"alg":"RS256","kid":"k","crit":["x"]}"#)),
                "crit",
            ),
        ] {
            let why = SignedToken::parse(&token).unwrap_err().to_string();
            assert!(why.contains(what), "{token}: {why}");
        }
        assert_eq!(
            SignedToken::parse(&format!("{}.e30.c2ln", b64(br#"{"alg":"RS256"}"#))).unwrap_err(),
            JwtError::NoKeyId
        );
        assert!(SignedToken::parse(&"a".repeat(MAX_TOKEN_BYTES + 1)).is_err());
    }
}
