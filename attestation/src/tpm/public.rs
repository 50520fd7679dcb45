//! `TPM2B_PUBLIC`: the public area of an EK or AK, its TPM Name, its attributes, and the
//! canonical SubjectPublicKeyInfo the EK pin and the claim hash (SPEC section 5: built from the
//! public area, never taken from the EK certificate's encoding).

use der::Encode;
use der::asn1::{AnyRef, BitString, ObjectIdentifier, UintRef};

use super::alg;
use super::wire::{Reader, WireError, unwrap_tpm2b};

/// `TPMA_OBJECT` bits this verifier reads.
pub mod attr {
    /// The key cannot leave this TPM.
    pub const FIXED_TPM: u32 = 1 << 1;
    /// The key cannot be re-parented.
    pub const FIXED_PARENT: u32 = 1 << 4;
    /// The TPM generated the sensitive part.
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    /// Only signs TPM-generated structures (quotes), never arbitrary digests.
    pub const RESTRICTED: u32 = 1 << 16;
    /// A decryption key.
    pub const DECRYPT: u32 = 1 << 17;
    /// A signing key.
    pub const SIGN: u32 = 1 << 18;
}

/// The key in a public area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// RSA: modulus and public exponent (0 in the area means 65537).
    Rsa {
        /// Big-endian modulus.
        modulus: Vec<u8>,
        /// Public exponent.
        exponent: u32,
    },
    /// NIST P-256: the affine coordinates.
    EccP256 {
        /// X, 32 bytes.
        x: Vec<u8>,
        /// Y, 32 bytes.
        y: Vec<u8>,
    },
}

/// A parsed `TPMT_PUBLIC` and the bytes it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmPublic {
    /// `nameAlg` (SHA-256 only).
    pub name_alg: u16,
    /// `objectAttributes`.
    pub attributes: u32,
    /// `authPolicy`.
    pub auth_policy: Vec<u8>,
    /// The signing scheme in the parameters (`TPM_ALG_NULL` when none).
    pub scheme: u16,
    /// Its hash.
    pub scheme_hash: u16,
    /// The key.
    pub key: PublicKey,
    /// The `TPMT_PUBLIC` encoding (what the Name hashes).
    pub encoded: Vec<u8>,
}

fn unsupported(what: &'static str, value: impl Into<u32>) -> WireError {
    WireError::Unsupported {
        what,
        value: value.into(),
    }
}

impl TpmPublic {
    /// Parses a `TPM2B_PUBLIC` (size prefix included), RSA or ECC P-256, SHA-256 name.
    pub fn from_tpm2b(buf: &[u8]) -> Result<Self, WireError> {
        Self::from_tpmt(unwrap_tpm2b(buf, "TPM2B_PUBLIC")?)
    }

    /// Parses a `TPMT_PUBLIC`.
    pub fn from_tpmt(buf: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let kind = r.u16("TPMT_PUBLIC.type")?;
        let name_alg = r.u16("TPMT_PUBLIC.nameAlg")?;
        if name_alg != alg::SHA256 {
            return Err(unsupported("TPMT_PUBLIC.nameAlg", name_alg));
        }
        let attributes = r.u32("TPMT_PUBLIC.objectAttributes")?;
        let auth_policy = r.tpm2b("TPMT_PUBLIC.authPolicy")?.to_vec();
        // TPMT_SYM_DEF_OBJECT: algorithm, then keyBits and mode unless NULL.
        let symmetric = r.u16("symmetric.algorithm")?;
        if symmetric != alg::NULL {
            r.u16("symmetric.keyBits")?;
            r.u16("symmetric.mode")?;
        }
        let scheme = r.u16("scheme")?;
        let scheme_hash = match scheme {
            alg::NULL => alg::NULL,
            alg::ECDAA => {
                let hash = r.u16("scheme.hashAlg")?;
                r.u16("scheme.count")?;
                hash
            }
            _ => r.u16("scheme.hashAlg")?,
        };
        let key = match kind {
            alg::RSA => {
                let bits = r.u16("rsa.keyBits")?;
                let exponent = match r.u32("rsa.exponent")? {
                    0 => 65_537,
                    e => e,
                };
                let modulus = r.tpm2b("rsa.unique")?.to_vec();
                if !(2048..=4096).contains(&bits) || modulus.len() * 8 != usize::from(bits) {
                    return Err(WireError::Invalid(format!(
                        "RSA key of {bits} bits with a {}-byte modulus",
                        modulus.len()
                    )));
                }
                PublicKey::Rsa { modulus, exponent }
            }
            alg::ECC => {
                let curve = r.u16("ecc.curveID")?;
                if curve != alg::NIST_P256 {
                    return Err(unsupported("ecc.curveID", curve));
                }
                let kdf = r.u16("ecc.kdf")?;
                if kdf != alg::NULL {
                    r.u16("ecc.kdf.hashAlg")?;
                }
                let x = r.tpm2b("ecc.unique.x")?.to_vec();
                let y = r.tpm2b("ecc.unique.y")?.to_vec();
                if x.len() != 32 || y.len() != 32 {
                    return Err(WireError::Invalid("P-256 point coordinates must be 32 bytes".into()));
                }
                PublicKey::EccP256 { x, y }
            }
            other => return Err(unsupported("TPMT_PUBLIC.type", other)),
        };
        r.finish("TPMT_PUBLIC")?;
        Ok(Self {
            name_alg,
            attributes,
            auth_policy,
            scheme,
            scheme_hash,
            key,
            encoded: buf.to_vec(),
        })
    }

    /// The TPM Name: `nameAlg || SHA-256(TPMT_PUBLIC)`.
    pub fn name(&self) -> Vec<u8> {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &self.encoded);
        let mut name = self.name_alg.to_be_bytes().to_vec();
        name.extend_from_slice(digest.as_ref());
        name
    }

    /// Whether every bit of `mask` is set.
    pub fn has(&self, mask: u32) -> bool {
        self.attributes & mask == mask
    }

    /// SPEC section 5's AK requirements: restricted, sign, fixedTPM, fixedParent,
    /// sensitiveDataOrigin, not decrypt. `Err` names every one that fails.
    pub fn check_attestation_key(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        for (bit, name) in [
            (attr::RESTRICTED, "restricted"),
            (attr::SIGN, "sign"),
            (attr::FIXED_TPM, "fixedTPM"),
            (attr::FIXED_PARENT, "fixedParent"),
            (attr::SENSITIVE_DATA_ORIGIN, "sensitiveDataOrigin"),
        ] {
            if !self.has(bit) {
                wrong.push(format!("not {name}"));
            }
        }
        if self.has(attr::DECRYPT) {
            wrong.push("decrypt is set".to_owned());
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("the AK is {}", wrong.join(", ")))
        }
    }

    /// The canonical SubjectPublicKeyInfo (DER): rsaEncryption with NULL parameters, or
    /// id-ecPublicKey with prime256v1 and the uncompressed point.
    pub fn canonical_spki(&self) -> Result<Vec<u8>, WireError> {
        const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
        const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
        const PRIME256V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
        let der_error = |e: der::Error| WireError::Invalid(format!("cannot encode the EK key: {e}"));
        let spki = match &self.key {
            PublicKey::Rsa { modulus, exponent } => {
                let e = exponent.to_be_bytes();
                let first = e.iter().position(|b| *b != 0).unwrap_or(3);
                let rsa = RsaPublicKey {
                    modulus: UintRef::new(modulus).map_err(der_error)?,
                    exponent: UintRef::new(&e[first..]).map_err(der_error)?,
                };
                let key = rsa.to_der().map_err(der_error)?;
                Spki {
                    algorithm: AlgorithmIdentifier {
                        algorithm: RSA_ENCRYPTION,
                        parameters: Some(AnyRef::NULL),
                    },
                    subject_public_key: BitString::from_bytes(&key).map_err(der_error)?,
                }
                .to_der()
            }
            PublicKey::EccP256 { x, y } => {
                let mut point = vec![0x04];
                point.extend_from_slice(x);
                point.extend_from_slice(y);
                let curve = PRIME256V1.to_der().map_err(der_error)?;
                Spki {
                    algorithm: AlgorithmIdentifier {
                        algorithm: EC_PUBLIC_KEY,
                        parameters: Some(AnyRef::try_from(curve.as_slice()).map_err(der_error)?),
                    },
                    subject_public_key: BitString::from_bytes(&point).map_err(der_error)?,
                }
                .to_der()
            }
        };
        spki.map_err(der_error)
    }

    /// Lowercase hex SHA-256 of [`TpmPublic::canonical_spki`]: the EK pin and the claim's
    /// `ekSHA256`.
    pub fn spki_sha256_hex(&self) -> Result<String, WireError> {
        Ok(crate::digest::hex(&crate::digest::sha256(&self.canonical_spki()?)))
    }
}

#[derive(der::Sequence)]
struct RsaPublicKey<'a> {
    modulus: UintRef<'a>,
    exponent: UintRef<'a>,
}

#[derive(der::Sequence)]
struct AlgorithmIdentifier<'a> {
    algorithm: ObjectIdentifier,
    parameters: Option<AnyRef<'a>>,
}

#[derive(der::Sequence)]
struct Spki<'a> {
    algorithm: AlgorithmIdentifier<'a>,
    subject_public_key: BitString,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(name: &str) -> Vec<u8> {
        std::fs::read(format!("{}/testdata/tpm/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn a_swtpm_rsa_ak_parses_has_its_name_and_passes_the_ak_checks() {
        let ak = TpmPublic::from_tpm2b(&vector("ak.pub")).unwrap();
        assert!(matches!(ak.key, PublicKey::Rsa { ref modulus, exponent: 65_537 } if modulus.len() == 256));
        assert_eq!(ak.name(), vector("ak.name"), "the Name tpm2_createak printed");
        assert_eq!(ak.check_attestation_key(), Ok(()));
        assert_eq!((ak.scheme, ak.scheme_hash), (alg::RSASSA, alg::SHA256));
    }

    #[test]
    fn a_swtpm_ecc_ak_parses_with_its_name() {
        let ak = TpmPublic::from_tpm2b(&vector("akecc.pub")).unwrap();
        assert!(matches!(ak.key, PublicKey::EccP256 { .. }));
        assert_eq!(ak.name(), vector("akecc.name"));
        assert_eq!(ak.check_attestation_key(), Ok(()));
    }

    #[test]
    fn the_ek_is_a_decrypt_key_and_its_canonical_spki_is_the_certificates_key() {
        let ek = TpmPublic::from_tpm2b(&vector("ek.pub")).unwrap();
        let why = ek.check_attestation_key().unwrap_err();
        assert!(why.contains("not sign") && why.contains("decrypt is set"), "{why}");
        // swtpm_setup's EK certificate carries the same RSA key; the canonical encoding is
        // built from the public area and must parse as the same key.
        let ek_cert = vector("ekcert.der");
        let (_, cert) = x509_parser::parse_x509_certificate(&ek_cert).unwrap();
        let spki = ek.canonical_spki().unwrap();
        let (rest, parsed) =
            <x509_parser::x509::SubjectPublicKeyInfo as x509_parser::prelude::FromDer<_>>::from_der(&spki).unwrap();
        assert!(rest.is_empty());
        assert_eq!(
            parsed.subject_public_key.data,
            cert.public_key().subject_public_key.data
        );
        assert_eq!(parsed.algorithm.algorithm.to_id_string(), "1.2.840.113549.1.1.1");
        assert_eq!(ek.spki_sha256_hex().unwrap().len(), 64);
    }

    #[test]
    fn flipped_attributes_are_named() {
        let mut bytes = vector("ak.pub");
        // objectAttributes start after size (2), type (2), nameAlg (2): clear fixedTPM.
        bytes[9] &= !(attr::FIXED_TPM as u8);
        let ak = TpmPublic::from_tpm2b(&bytes).unwrap();
        assert_eq!(ak.check_attestation_key(), Err("the AK is not fixedTPM".into()));
    }

    #[test]
    fn truncated_or_padded_areas_are_refused() {
        let bytes = vector("ak.pub");
        for cut in [0, 1, 2, 10, bytes.len() - 1] {
            assert!(TpmPublic::from_tpm2b(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(TpmPublic::from_tpm2b(&padded).is_err());
    }
}
