//! PKCS#10 parsing: the facts the rules read, owned, out of the DER.

use std::fmt;
use std::net::IpAddr;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION, OID_PKCS1_SHA1WITHRSA,
    OID_PKCS9_EXTENSION_REQUEST, OID_SHA1_WITH_RSA, OID_SIG_ED25519, OID_X509_COMMON_NAME,
    OID_X509_EXT_SUBJECT_ALT_NAME, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

/// Why bytes are not a usable PKCS#10 request. Maps to `InvalidRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CsrError {
    /// The DER does not decode as a CertificationRequest.
    #[error("not a PKCS#10 certificate request: {why}")]
    Malformed {
        /// The decoder's complaint.
        why: String,
    },
    /// Bytes after the request.
    #[error("{count} trailing bytes after the certificate request")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// An extension the signer has to read does not decode.
    #[error("requested extension {oid} does not decode: {why}")]
    MalformedExtension {
        /// Its OID.
        oid: String,
        /// The decoder's complaint.
        why: String,
    },
}

/// Why a CSR's self-signature does not hold. Maps to `InvalidSignature`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// A key type or size outside SPEC rule 2.
    #[error("key {key} is not accepted: use ECDSA P-256/P-384, RSA 2048-4096 with e=65537, or Ed25519")]
    KeyNotAllowed {
        /// The key's description.
        key: PublicKeyKind,
    },
    /// SHA-1 or an algorithm the verifier does not know.
    #[error("signature algorithm {oid} is not accepted")]
    AlgorithmNotAllowed {
        /// Its OID.
        oid: String,
    },
    /// The signature does not verify under the request's key.
    #[error("the request's self-signature does not verify")]
    Mismatch,
}

/// The request's public key, as far as the rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublicKeyKind {
    /// RSA with its modulus size and whether the exponent is 65537.
    Rsa {
        /// Modulus size in bits.
        bits: usize,
        /// Public exponent is 65537.
        exponent_65537: bool,
    },
    /// ECDSA on P-256.
    EcdsaP256,
    /// ECDSA on P-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
    /// Anything else, described by its algorithm OID (and curve, for EC).
    Other(String),
}

impl PublicKeyKind {
    /// Whether SPEC rule 2 accepts this key.
    pub fn is_allowed(&self) -> bool {
        match self {
            Self::Rsa { bits, exponent_65537 } => *exponent_65537 && (2048..=4096).contains(bits),
            Self::EcdsaP256 | Self::EcdsaP384 | Self::Ed25519 => true,
            Self::Other(_) => false,
        }
    }

    /// RSA keys may ask for key encipherment; others may not.
    pub fn is_rsa(&self) -> bool {
        matches!(self, Self::Rsa { .. })
    }
}

impl fmt::Display for PublicKeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa {
                bits,
                exponent_65537: true,
            } => write!(f, "RSA-{bits}"),
            Self::Rsa {
                bits,
                exponent_65537: false,
            } => write!(f, "RSA-{bits} (exponent not 65537)"),
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::Ed25519 => f.write_str("Ed25519"),
            Self::Other(what) => f.write_str(what),
        }
    }
}

/// ASN.1 string type of a subject attribute, kept so the certificate copies it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringKind {
    /// PrintableString (what Go writes when it can).
    Printable,
    /// UTF8String.
    Utf8,
    /// Any other type; the rules refuse it.
    Other,
}

/// One attribute of the subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectAttribute {
    /// Dotted OID.
    pub oid: String,
    /// The value, when it is a string.
    pub value: Option<String>,
    /// Its ASN.1 string type.
    pub kind: StringKind,
    /// Whether it shares its RDN with other attributes (multi-valued RDN).
    pub multi_valued_rdn: bool,
}

impl SubjectAttribute {
    /// Whether this is a commonName.
    pub fn is_common_name(&self) -> bool {
        self.oid == OID_X509_COMMON_NAME.to_id_string()
    }

    /// Whether this is an organizationName.
    pub fn is_organization(&self) -> bool {
        self.oid == OID_X509_ORGANIZATION_NAME.to_id_string()
    }
}

/// One extension from the extensionRequest attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedExtension {
    /// Dotted OID.
    pub oid: String,
    /// Critical flag.
    pub critical: bool,
    /// extnValue contents.
    pub value: Vec<u8>,
}

/// One subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubjectAltName {
    /// dNSName
    Dns(String),
    /// iPAddress
    Ip(IpAddr),
    /// rfc822Name
    Email(String),
    /// uniformResourceIdentifier
    Uri(String),
    /// Any other kind, described.
    Other(String),
}

impl fmt::Display for SubjectAltName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(v) => write!(f, "DNS:{v}"),
            Self::Ip(v) => write!(f, "IP:{v}"),
            Self::Email(v) => write!(f, "email:{v}"),
            Self::Uri(v) => write!(f, "URI:{v}"),
            Self::Other(v) => write!(f, "{v}"),
        }
    }
}

/// A decoded PKCS#10 request. Decoding checks structure only; call
/// [`ParsedCsr::verify_signature`] before trusting anything it says.
#[derive(Clone, PartialEq, Eq)]
pub struct ParsedCsr {
    der: Vec<u8>,
    /// Subject attributes in order, multi-valued RDNs flattened.
    pub subject: Vec<SubjectAttribute>,
    /// DER of the SubjectPublicKeyInfo, byte for byte.
    pub spki_der: Vec<u8>,
    /// The subjectPublicKey BIT STRING contents.
    pub public_key: Vec<u8>,
    /// What kind of key it is.
    pub key_kind: PublicKeyKind,
    /// Extensions from every extensionRequest attribute, in order.
    pub extensions: Vec<RequestedExtension>,
    /// Subject alternative names, decoded from the SAN extension(s).
    pub subject_alt_names: Vec<SubjectAltName>,
    /// OIDs of attributes other than extensionRequest (challengePassword and the like).
    pub other_attributes: Vec<String>,
    /// How many extensionRequest attributes there were.
    pub extension_requests: usize,
}

impl fmt::Debug for ParsedCsr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedCsr")
            .field("subject", &self.subject)
            .field("key_kind", &self.key_kind)
            .field(
                "extensions",
                &self.extensions.iter().map(|e| &e.oid).collect::<Vec<_>>(),
            )
            .field("subject_alt_names", &self.subject_alt_names)
            .finish_non_exhaustive()
    }
}

impl ParsedCsr {
    /// Decodes a DER PKCS#10 request; nothing may follow it.
    pub fn from_der(der: &[u8]) -> Result<Self, CsrError> {
        let (rest, req) =
            X509CertificationRequest::from_der(der).map_err(|e| CsrError::Malformed { why: e.to_string() })?;
        if !rest.is_empty() {
            return Err(CsrError::TrailingBytes { count: rest.len() });
        }
        let info = &req.certification_request_info;

        let mut subject = Vec::new();
        for rdn in info.subject.iter() {
            let multi_valued_rdn = rdn.iter().count() > 1;
            for attr in rdn.iter() {
                let kind = match attr.attr_value().header.tag() {
                    Tag::PrintableString => StringKind::Printable,
                    Tag::Utf8String => StringKind::Utf8,
                    _ => StringKind::Other,
                };
                subject.push(SubjectAttribute {
                    oid: attr.attr_type().to_id_string(),
                    value: attr.as_str().ok().map(str::to_owned),
                    kind,
                    multi_valued_rdn,
                });
            }
        }

        let mut extensions = Vec::new();
        let mut subject_alt_names = Vec::new();
        let mut other_attributes = Vec::new();
        let mut extension_requests = 0;
        for attribute in info.attributes() {
            if attribute.oid != OID_PKCS9_EXTENSION_REQUEST {
                other_attributes.push(attribute.oid.to_id_string());
                continue;
            }
            extension_requests += 1;
            let ParsedCriAttribute::ExtensionRequest(request) = attribute.parsed_attribute() else {
                return Err(CsrError::MalformedExtension {
                    oid: attribute.oid.to_id_string(),
                    why: "extensionRequest does not decode".into(),
                });
            };
            for ext in &request.extensions {
                if ext.oid == OID_X509_EXT_SUBJECT_ALT_NAME {
                    subject_alt_names.extend(decode_san(ext)?);
                }
                extensions.push(RequestedExtension {
                    oid: ext.oid.to_id_string(),
                    critical: ext.critical,
                    value: ext.value.to_vec(),
                });
            }
        }

        Ok(Self {
            der: der.to_vec(),
            subject,
            spki_der: info.subject_pki.raw.to_vec(),
            public_key: info.subject_pki.subject_public_key.data.to_vec(),
            key_kind: classify_key(&info.subject_pki),
            extensions,
            subject_alt_names,
            other_attributes,
            extension_requests,
        })
    }

    /// The request's DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// Checks the key against SPEC rule 2, then the self-signature.
    pub fn verify_signature(&self) -> Result<(), SignatureError> {
        if !self.key_kind.is_allowed() {
            return Err(SignatureError::KeyNotAllowed {
                key: self.key_kind.clone(),
            });
        }
        // `from_der` succeeded on these bytes, so this parse cannot fail; map it anyway.
        let (_, req) = X509CertificationRequest::from_der(&self.der).map_err(|_| SignatureError::Mismatch)?;
        let algorithm = &req.signature_algorithm.algorithm;
        if *algorithm == OID_PKCS1_SHA1WITHRSA || *algorithm == OID_SHA1_WITH_RSA {
            return Err(SignatureError::AlgorithmNotAllowed {
                oid: algorithm.to_id_string(),
            });
        }
        req.verify_signature().map_err(|e| match e {
            x509_parser::error::X509Error::SignatureUnsupportedAlgorithm => SignatureError::AlgorithmNotAllowed {
                oid: algorithm.to_id_string(),
            },
            _ => SignatureError::Mismatch,
        })
    }

    /// The requested provider-ID extensions (rule 5 allows one).
    pub fn provider_id_extensions(&self) -> impl Iterator<Item = &RequestedExtension> {
        self.extensions
            .iter()
            .filter(|e| e.oid == crate::names::PROVIDER_ID_OID_DOTTED)
    }

    /// Values of the subject attributes that are commonNames.
    pub fn common_names(&self) -> impl Iterator<Item = &SubjectAttribute> {
        self.subject.iter().filter(|a| a.is_common_name())
    }

    /// Values of the subject attributes that are organizationNames.
    pub fn organizations(&self) -> impl Iterator<Item = &SubjectAttribute> {
        self.subject.iter().filter(|a| a.is_organization())
    }
}

fn classify_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> PublicKeyKind {
    let algorithm = &spki.algorithm.algorithm;
    if *algorithm == OID_PKCS1_RSAENCRYPTION {
        return match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => PublicKeyKind::Rsa {
                bits: bit_length(rsa.modulus),
                exponent_65537: rsa.try_exponent().ok() == Some(65537),
            },
            _ => PublicKeyKind::Other("malformed RSA key".into()),
        };
    }
    if *algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
        return match curve {
            Some(c) if c == OID_EC_P256 => PublicKeyKind::EcdsaP256,
            Some(c) if c == OID_NIST_EC_P384 => PublicKeyKind::EcdsaP384,
            Some(c) => PublicKeyKind::Other(format!("EC key on curve {}", c.to_id_string())),
            None => PublicKeyKind::Other("EC key without a named curve".into()),
        };
    }
    if *algorithm == OID_SIG_ED25519 {
        return PublicKeyKind::Ed25519;
    }
    PublicKeyKind::Other(format!("key algorithm {}", algorithm.to_id_string()))
}

fn bit_length(big_endian: &[u8]) -> usize {
    let trimmed: &[u8] = match big_endian.iter().position(|b| *b != 0) {
        Some(i) => &big_endian[i..],
        None => return 0,
    };
    trimmed.len() * 8 - trimmed[0].leading_zeros() as usize
}

fn decode_san(ext: &x509_parser::extensions::X509Extension<'_>) -> Result<Vec<SubjectAltName>, CsrError> {
    let malformed = |why: &str| CsrError::MalformedExtension {
        oid: ext.oid.to_id_string(),
        why: why.to_owned(),
    };
    let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() else {
        return Err(malformed("subjectAltName does not decode"));
    };
    san.general_names
        .iter()
        .map(|name| {
            Ok(match name {
                GeneralName::DNSName(v) => SubjectAltName::Dns((*v).to_owned()),
                GeneralName::RFC822Name(v) => SubjectAltName::Email((*v).to_owned()),
                GeneralName::URI(v) => SubjectAltName::Uri((*v).to_owned()),
                GeneralName::IPAddress(bytes) => SubjectAltName::Ip(match bytes.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).map_err(|_| malformed("bad IP"))?),
                    16 => IpAddr::from(<[u8; 16]>::try_from(*bytes).map_err(|_| malformed("bad IP"))?),
                    n => return Err(malformed(&format!("IP address of {n} bytes"))),
                }),
                other => SubjectAltName::Other(format!("{other:?}").chars().take(64).collect()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_length_ignores_leading_zero_bytes() {
        assert_eq!(bit_length(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(bit_length(&[0x01]), 1);
        assert_eq!(bit_length(&[0x00]), 0);
        assert_eq!(bit_length(&[]), 0);
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert!(matches!(
            ParsedCsr::from_der(b"\x30\x03\x02\x01\x01"),
            Err(CsrError::Malformed { .. })
        ));
        assert!(matches!(ParsedCsr::from_der(b""), Err(CsrError::Malformed { .. })));
    }
}
