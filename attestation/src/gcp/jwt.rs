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
    /// Not before, seconds since the epoch, when the token names it.
    #[serde(default)]
    pub nbf: Option<i64>,
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

impl ComputeEngine {
    /// Checks each field against the shape Google gives it: they are joined with `/` into the
    /// provider ID compared with the CSR's, so a field holding a `/` (zone `us-east1-b/x` with
    /// name `y`) would name another instance.
    pub fn check_shape(&self) -> Result<(), String> {
        let bad = |field: &str, value: &str| {
            Err(format!(
                "the token's google.compute_engine.{field} {:?} is malformed",
                crate::identity::truncate(value, 40)
            ))
        };
        if !project_id(&self.project_id) {
            return bad("project_id", &self.project_id);
        }
        let zone = &self.zone;
        if zone.is_empty()
            || zone.len() > 63
            || !zone
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return bad("zone", zone);
        }
        if !rfc1035_label(&self.instance_name) {
            return bad("instance_name", &self.instance_name);
        }
        let id = &self.instance_id;
        if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
            return bad("instance_id", id);
        }
        Ok(())
    }
}

/// A project ID: 6 to 30 of lowercase letters, digits and hyphens, starting with a letter and
/// not ending with a hyphen; a legacy domain-scoped one is `<domain>:<id>`.
fn project_id(value: &str) -> bool {
    let (domain, id) = value.rsplit_once(':').map_or((None, value), |(d, i)| (Some(d), i));
    let id_ok = (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let domain_ok = domain.is_none_or(|d| !d.is_empty() && d.len() <= 253 && d.split('.').all(rfc1035_label_or_digits));
    id_ok && domain_ok
}

/// A DNS label of the RFC 1035 form: a lowercase letter, then letters, digits and hyphens, at
/// most 63, not ending with a hyphen.
fn rfc1035_label(value: &str) -> bool {
    value.starts_with(|c: char| c.is_ascii_lowercase()) && rfc1035_label_or_digits(value)
}

fn rfc1035_label_or_digits(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && !value.ends_with('-')
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_engine_fields_are_shape_checked() {
        let honest = ComputeEngine {
            project_id: "team-a-prod".into(),
            zone: "us-east1-b".into(),
            instance_id: "1234567890123456789".into(),
            instance_name: "worker-0".into(),
        };
        assert_eq!(honest.check_shape(), Ok(()));
        let scoped = ComputeEngine {
            project_id: "example.com:team-a".into(),
            ..honest.clone()
        };
        assert_eq!(scoped.check_shape(), Ok(()));
        type Bend = fn(&mut ComputeEngine);
        let bent: [(&str, Bend); 9] = [
            ("zone", |c| c.zone = "us-east1-b/x".into()),
            ("zone", |c| c.zone = String::new()),
            ("instance_name", |c| c.instance_name = "x/y".into()),
            ("instance_name", |c| c.instance_name = "Worker".into()),
            ("instance_name", |c| c.instance_name = "0worker".into()),
            ("project_id", |c| c.project_id = "proj/zone".into()),
            ("project_id", |c| c.project_id = "short".into()),
            ("project_id", |c| c.project_id = "ends-with-".into()),
            ("instance_id", |c| c.instance_id = "12a".into()),
        ];
        for (field, bend) in bent {
            let mut instance = honest.clone();
            bend(&mut instance);
            let why = instance.check_shape().unwrap_err();
            assert!(why.contains(field), "{instance:?}: {why}");
        }
    }

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
