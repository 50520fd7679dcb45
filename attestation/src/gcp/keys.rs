//! Google's signing keys for identity tokens, and how a verifier reaches them.
//!
//! The signer fetches Google's JWKS and keeps it current (a cache refreshed on its
//! `Cache-Control` lifetime and when a token names a key it lacks); an air-gapped management
//! cluster gives a file the operator keeps current. Either way the verifier only looks a key up
//! through [`GoogleKeys`]: no I/O happens in verification.

use base64::Engine as _;
use serde::Deserialize;
use time::OffsetDateTime;

/// Smallest RSA modulus accepted, in bits.
const MIN_MODULUS_BITS: usize = 2048;

/// One RSA signing key of Google's.
#[derive(Clone, PartialEq, Eq)]
pub struct GoogleKey {
    kid: String,
    n: Vec<u8>,
    e: Vec<u8>,
}

impl std::fmt::Debug for GoogleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleKey")
            .field("kid", &self.kid)
            .field("bits", &(self.n.len() * 8))
            .finish()
    }
}

impl GoogleKey {
    /// A key from its modulus and exponent (big-endian, no leading zeros needed).
    pub fn new(kid: &str, n: &[u8], e: &[u8]) -> Result<Self, String> {
        let n: Vec<u8> = n.iter().copied().skip_while(|b| *b == 0).collect();
        let e: Vec<u8> = e.iter().copied().skip_while(|b| *b == 0).collect();
        if n.len() * 8 < MIN_MODULUS_BITS {
            return Err(format!("key {kid:?}: a {}-bit modulus is too short", n.len() * 8));
        }
        if e != [1, 0, 1] {
            return Err(format!("key {kid:?}: the exponent is not 65537"));
        }
        Ok(Self {
            kid: kid.to_owned(),
            n,
            e,
        })
    }

    /// Its key ID.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub(super) fn modulus(&self) -> &[u8] {
        &self.n
    }

    pub(super) fn exponent(&self) -> &[u8] {
        &self.e
    }
}

/// A JSON Web Key Set as Google publishes it. Keys other than RSA signing keys are skipped
/// (Google may add other kinds); an RSA key that is malformed fails the whole set, so a broken
/// download is noticed instead of silently dropping keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Jwks {
    keys: Vec<GoogleKey>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
}

/// Largest JWKS read (Google's is about 2 KiB).
pub const MAX_JWKS_BYTES: usize = 256 * 1024;

impl Jwks {
    /// Reads a JWKS document.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        if json.len() > MAX_JWKS_BYTES {
            return Err(format!("the JWKS is {} bytes, more than {MAX_JWKS_BYTES}", json.len()));
        }
        let raw: RawJwks = serde_json::from_slice(json).map_err(|e| format!("not a JWKS: {e}"))?;
        let decode = |kid: &str, what: &str, v: Option<String>| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(v.unwrap_or_default())
                .map_err(|e| format!("key {kid:?}: {what} is not base64url: {e}"))
        };
        let mut keys = Vec::new();
        for jwk in raw.keys {
            let signing = jwk.usage.as_deref().is_none_or(|u| u == "sig");
            let rs256 = jwk.alg.as_deref().is_none_or(|a| a == "RS256");
            if jwk.kty != "RSA" || !signing || !rs256 {
                continue;
            }
            let kid = jwk.kid.filter(|k| !k.is_empty()).ok_or("an RSA key has no kid")?;
            if keys.iter().any(|k: &GoogleKey| k.kid == kid) {
                return Err(format!("key {kid:?} appears twice"));
            }
            let n = decode(&kid, "n", jwk.n)?;
            let e = decode(&kid, "e", jwk.e)?;
            keys.push(GoogleKey::new(&kid, &n, &e)?);
        }
        if keys.is_empty() {
            return Err("the JWKS holds no RS256 signing key".into());
        }
        Ok(Self { keys })
    }

    /// A set of these keys.
    pub fn from_keys(keys: Vec<GoogleKey>) -> Self {
        Self { keys }
    }

    /// The key called `kid`.
    pub fn get(&self, kid: &str) -> Option<&GoogleKey> {
        self.keys.iter().find(|k| k.kid == kid)
    }

    /// The key IDs, for logs.
    pub fn kids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.kid.as_str()).collect()
    }
}

/// The answer to a key lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyLookup {
    /// The key.
    Found(GoogleKey),
    /// The loaded set lacks it.
    Unknown {
        /// When the set was fetched; `None` when it cannot be refreshed (a file), so the
        /// answer is final.
        fetched_at: Option<OffsetDateTime>,
    },
    /// No set is loaded yet (never fetched, or every fetch failed).
    NotLoaded {
        /// The last fetch's failure, if any.
        why: Option<String>,
    },
}

/// Where a verifier finds Google's keys.
pub trait GoogleKeys: Send + Sync {
    /// The key called `kid`.
    fn key(&self, kid: &str) -> KeyLookup;
}

/// A fixed set (`--gcp-jwks-file`, and `check`): what it lacks, it lacks for good.
impl GoogleKeys for Jwks {
    fn key(&self, kid: &str) -> KeyLookup {
        self.get(kid)
            .cloned()
            .map_or(KeyLookup::Unknown { fetched_at: None }, KeyLookup::Found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n_2048() -> String {
        let mut n = vec![0xc5u8; 256];
        n[255] = 0x01;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(n)
    }

    #[test]
    fn google_shaped_sets_parse_and_other_key_kinds_are_skipped() {
        let json = format!(
            r#"{{"keys":[{{"kty":"RSA","alg":"RS256","use":"sig","kid":"a","n":"{}","e":"AQAB"}},
               {{"kty":"EC","crv":"P-256","kid":"ec","x":"","y":""}},
               {{"kty":"RSA","alg":"RSA-OAEP","use":"enc","kid":"enc","n":"","e":""}}]}}"#,
            n_2048()
        );
        let set = Jwks::parse(json.as_bytes()).unwrap();
        assert_eq!(set.kids(), ["a"]);
        assert!(matches!(set.key("a"), KeyLookup::Found(_)));
        assert_eq!(set.key("b"), KeyLookup::Unknown { fetched_at: None });
    }

    #[test]
    fn weak_duplicate_or_broken_keys_fail_the_set() {
        let short = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xc5u8; 128]);
        for (json, what) in [
            (
                format!(r#"{{"keys":[{{"kty":"RSA","kid":"a","n":"{short}","e":"AQAB"}}]}}"#),
                "too short",
            ),
            (
                format!(r#"{{"keys":[{{"kty":"RSA","kid":"a","n":"{}","e":"Aw"}}]}}"#, n_2048()),
                "65537",
            ),
            (
                format!(
                    r#"{{"keys":[{{"kty":"RSA","kid":"a","n":"{0}","e":"AQAB"}},{{"kty":"RSA","kid":"a","n":"{0}","e":"AQAB"}}]}}"#,
                    n_2048()
                ),
                "twice",
            ),
            (
                r#"{"keys":[{"kty":"RSA","kid":"a","n":"!!","e":"AQAB"}]}"#.to_owned(),
                "base64url",
            ),
            (r#"{"keys":[]}"#.to_owned(), "no RS256"),
            ("[]".to_owned(), "not a JWKS"),
        ] {
            let why = Jwks::parse(json.as_bytes()).unwrap_err();
            assert!(why.contains(what), "{json}: {why}");
        }
    }
}
