//! The `azure/v1` challenge the signer writes on CSR #1 (SPEC section 5): the annotation
//! `cluster.x-k8s.io/azure-attestation-challenge`, JSON `{"issuedAt", "nonce", "mac"}`.
//!
//! The nonce is the one the node fetches its attested document with: 32 characters of
//! `[A-Za-z0-9]` (IMDS takes at most 32), derived under the signer's challenge key from CSR #1's
//! UID, the time and its key, so the verifier stays pure and nobody without the key can
//! predict one. The mac, under a key derived apart from the nonce's, covers the CSR's UID,
//! `issuedAt`, the nonce and the SHA-256 of the CSR's SubjectPublicKeyInfo: requesters can write
//! the annotation too, and only a mac that verifies makes it the signer's, for that CSR and
//! that key.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Characters of a nonce.
pub const NONCE_LENGTH: usize = 32;

const NONCE_ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const NONCE_LABEL: &[u8] = b"node-attestation-signer azure/v1 challenge nonce";
const MAC_LABEL: &[u8] = b"node-attestation-signer azure/v1 challenge annotation mac";

/// The annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureChallenge {
    /// RFC 3339, second precision.
    #[serde(rename = "issuedAt")]
    pub issued_at: String,
    /// What the node sends IMDS, and the document must carry.
    pub nonce: String,
    /// Base64 HMAC-SHA256 (see the module's documentation).
    pub mac: String,
}

fn derived(key: &[u8], label: &[u8]) -> zeroize::Zeroizing<Vec<u8>> {
    let derive = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    zeroize::Zeroizing::new(aws_lc_rs::hmac::sign(&derive, label).as_ref().to_vec())
}

/// Each field u32 big-endian length-prefixed.
fn framed(fields: &[&[u8]]) -> Vec<u8> {
    let mut input = Vec::new();
    for field in fields {
        input.extend_from_slice(&(field.len() as u32).to_be_bytes());
        input.extend_from_slice(field);
    }
    input
}

impl AzureChallenge {
    /// The challenge the signer holding `key` writes on CSR `csr_uid` with key `spki_sha256`.
    pub fn issue(key: &[u8], csr_uid: &str, issued_at: String, spki_sha256: &[u8; 32]) -> Self {
        let nonce_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &derived(key, NONCE_LABEL));
        let tag = aws_lc_rs::hmac::sign(
            &nonce_key,
            &framed(&[csr_uid.as_bytes(), issued_at.as_bytes(), spki_sha256]),
        );
        // 32 bytes to 32 characters of 62: a slight bias, about 190 bits all the same.
        let nonce: String = tag
            .as_ref()
            .iter()
            .take(NONCE_LENGTH)
            .map(|b| char::from(NONCE_ALPHABET[usize::from(*b) % NONCE_ALPHABET.len()]))
            .collect();
        let mac = Self::tag(key, csr_uid, &issued_at, &nonce, spki_sha256);
        Self {
            issued_at,
            nonce,
            mac: base64::engine::general_purpose::STANDARD.encode(mac),
        }
    }

    fn tag(key: &[u8], csr_uid: &str, issued_at: &str, nonce: &str, spki_sha256: &[u8; 32]) -> Vec<u8> {
        let mac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &derived(key, MAC_LABEL));
        aws_lc_rs::hmac::sign(
            &mac_key,
            &framed(&[csr_uid.as_bytes(), issued_at.as_bytes(), nonce.as_bytes(), spki_sha256]),
        )
        .as_ref()
        .to_vec()
    }

    /// Whether the signer holding `key` wrote this for CSR `csr_uid` with key `spki_sha256`
    /// (constant-time).
    pub fn is_authentic(&self, key: &[u8], csr_uid: &str, spki_sha256: &[u8; 32]) -> bool {
        let Ok(mac) = base64::engine::general_purpose::STANDARD.decode(&self.mac) else {
            return false;
        };
        let mac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &derived(key, MAC_LABEL));
        let input = framed(&[
            csr_uid.as_bytes(),
            self.issued_at.as_bytes(),
            self.nonce.as_bytes(),
            spki_sha256,
        ]);
        aws_lc_rs::hmac::verify(&mac_key, &input, &mac).is_ok()
    }

    /// Reads an annotation's value (anyone may have written it).
    pub fn parse(value: &str) -> Result<Self, String> {
        let parsed: Self =
            serde_json::from_str(value).map_err(|e| format!("the challenge annotation does not read: {e}"))?;
        if parsed.nonce.len() != NONCE_LENGTH || !parsed.nonce.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!(
                "the challenge's nonce is not {NONCE_LENGTH} letters and digits"
            ));
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = &[7; 32];

    #[test]
    fn a_challenge_is_the_signers_for_one_csr_and_one_key_only() {
        let spki = [1u8; 32];
        let challenge = AzureChallenge::issue(KEY, "uid-1", "2026-11-26T15:00:00Z".into(), &spki);
        assert_eq!(challenge.nonce.len(), NONCE_LENGTH);
        assert!(challenge.nonce.bytes().all(|b| b.is_ascii_alphanumeric()));
        let parsed = AzureChallenge::parse(&serde_json::to_string(&challenge).unwrap()).unwrap();
        assert!(parsed.is_authentic(KEY, "uid-1", &spki));
        assert!(!parsed.is_authentic(KEY, "uid-2", &spki), "another CSR");
        assert!(!parsed.is_authentic(KEY, "uid-1", &[2u8; 32]), "another key");
        assert!(!parsed.is_authentic(&[8; 32], "uid-1", &spki), "another signer");
        let mut forged = parsed.clone();
        forged.nonce = "A".repeat(NONCE_LENGTH);
        assert!(
            !forged.is_authentic(KEY, "uid-1", &spki),
            "a nonce of the requester's choosing"
        );
        let again = AzureChallenge::issue(KEY, "uid-1", "2026-11-26T15:00:00Z".into(), &spki);
        assert_eq!(again, challenge, "derived, not drawn: the verifier stays pure");
        let other = AzureChallenge::issue(KEY, "uid-1", "2026-11-26T15:00:01Z".into(), &spki);
        assert_ne!(other.nonce, challenge.nonce);
    }

    #[test]
    fn a_malformed_annotation_is_refused() {
        for bad in [
            "",
            "{}",
            r#"{"issuedAt":"x","nonce":"short","mac":"AA=="}"#,
            r#"{"issuedAt":"x","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/=","mac":"AA=="}"#,
            r#"{"issuedAt":"x","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","mac":"AA==","extra":1}"#,
        ] {
            assert!(AzureChallenge::parse(bad).is_err(), "{bad}");
        }
    }
}
