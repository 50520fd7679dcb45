//! PKCS#10 parsing: the facts the rules read, owned, out of the DER.
//!
//! The request is cut along its structure with the `der` crate, strictly: every SEQUENCE and
//! SET read to its exact end, DER lengths and booleans, nothing after the request. x509-parser
//! then reads the SubjectPublicKeyInfo, the signature algorithm and the signature from their
//! exact slices and verifies; it does not see the rest, because it reads past what other
//! parsers refuse (it skips bytes at the end of a SEQUENCE, a second value in the
//! extensionRequest SET, and reads extensions after an empty one).
//!
//! The attributes are where parsers disagree most, so SPEC rule 5 allows one shape only:
//! none, or exactly one `extensionRequest` attribute whose SET holds exactly one `Extensions`
//! value, itself strict DER (one or more extensions, `critical` absent or `TRUE`: an explicit
//! `FALSE` is the DEFAULT written out, which DER forbids and strict parsers refuse), no OID
//! twice. For that shape OpenSSL (first value of the first extensionRequest) and Go (first
//! value of every extensionRequest) read exactly the extensions read here. Any other shape is
//! recorded as an [`AttributeProblem`], which the rules refuse as `ForbiddenExtension`, and no
//! extension is read from it.

use std::fmt;
use std::net::IpAddr;

use der::asn1::{AnyRef, BitStringRef, ObjectIdentifier, OctetStringRef, PrintableStringRef, Utf8StringRef};
use der::{Decode, Header, Reader, SliceReader, Tag, TagNumber, Tagged};
use x509_parser::der_parser::asn1_rs::BitString;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION, OID_PKCS1_SHA1WITHRSA,
    OID_SHA1_WITH_RSA, OID_SIG_ED25519, OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

/// PKCS#9 extensionRequest.
const EXTENSION_REQUEST_OID: &str = "1.2.840.113549.1.9.14";
/// subjectAltName.
const SUBJECT_ALT_NAME_OID: &str = "2.5.29.17";

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
    /// The version is not v1 (`INTEGER 0`), the only one PKCS#10 defines.
    #[error("PKCS#10 version {version} is not v1 (INTEGER 0)")]
    Version {
        /// The INTEGER's value, as far as it is readable.
        version: String,
    },
}

/// Why a request's attributes break SPEC rule 5. The rules refuse the request with
/// `ForbiddenExtension`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttributeProblem {
    /// The attributes, or an attribute, do not decode as strict DER to their exact end.
    #[error("the CSR attributes are not strict DER: {why}")]
    Malformed {
        /// The decoder's complaint.
        why: String,
    },
    /// An attribute other than extensionRequest (challengePassword and the like).
    #[error("CSR attribute {oid} is not allowed (only extensionRequest)")]
    Other {
        /// Its OID.
        oid: String,
    },
    /// More than one extensionRequest attribute (OpenSSL reads the first, Go all of them).
    #[error("{count} extensionRequest attributes: at most one is allowed")]
    RepeatedExtensionRequest {
        /// How many.
        count: usize,
    },
    /// The extensionRequest SET holds no value or several (parsers read none, the first, or
    /// whatever follows).
    #[error("the extensionRequest attribute holds {count} values: exactly one is allowed")]
    ExtensionRequestValues {
        /// How many.
        count: usize,
    },
    /// The Extensions value does not decode as strict DER to its exact end.
    #[error("the requested extensions are not strict DER: {why}")]
    MalformedExtensions {
        /// What is wrong.
        why: String,
    },
    /// The same extension requested twice.
    #[error("extension {oid} is requested more than once")]
    DuplicateExtension {
        /// Its OID.
        oid: String,
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
    /// The requested extensions, in order: those of the one extensionRequest attribute's one
    /// value; empty when there is none, or when [`ParsedCsr::attribute_problem`] is set.
    pub extensions: Vec<RequestedExtension>,
    /// Subject alternative names, decoded from the SAN extension.
    pub subject_alt_names: Vec<SubjectAltName>,
    /// Why the attributes break SPEC rule 5, if they do: then no extension is read at all.
    pub attribute_problem: Option<AttributeProblem>,
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
            .field("attribute_problem", &self.attribute_problem)
            .finish_non_exhaustive()
    }
}

impl ParsedCsr {
    /// Decodes a DER PKCS#10 request; nothing may follow it. Structure that no rule could
    /// accept is an error; attributes outside SPEC rule 5's one shape are recorded in
    /// [`ParsedCsr::attribute_problem`] for the rules to refuse.
    pub fn from_der(der: &[u8]) -> Result<Self, CsrError> {
        let parts = Skeleton::cut(der)?;
        let subject = read_subject(parts.subject).map_err(|e| CsrError::Malformed {
            why: format!("subject: {e}"),
        })?;
        let spki = parts.subject_public_key_info()?;
        let (extensions, attribute_problem) = match read_attributes(parts.attributes) {
            Ok(extensions) => (extensions, None),
            Err(problem) => (Vec::new(), Some(problem)),
        };
        let mut subject_alt_names = Vec::new();
        for ext in extensions.iter().filter(|e| e.oid == SUBJECT_ALT_NAME_OID) {
            subject_alt_names.extend(decode_san(&ext.value)?);
        }
        Ok(Self {
            der: der.to_vec(),
            subject,
            spki_der: parts.spki.to_vec(),
            public_key: spki.subject_public_key.data.to_vec(),
            key_kind: classify_key(&spki),
            extensions,
            subject_alt_names,
            attribute_problem,
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
        // `from_der` succeeded on these bytes, so these parses cannot fail; map them anyway.
        let parts = Skeleton::cut(&self.der).map_err(|_| SignatureError::Mismatch)?;
        let spki = parts.subject_public_key_info().map_err(|_| SignatureError::Mismatch)?;
        let signature_algorithm = match AlgorithmIdentifier::from_der(parts.signature_algorithm) {
            Ok(([], algorithm)) => algorithm,
            _ => return Err(SignatureError::Mismatch),
        };
        let signature = match BitString::from_der(parts.signature) {
            Ok(([], signature)) => signature,
            _ => return Err(SignatureError::Mismatch),
        };
        let algorithm = &signature_algorithm.algorithm;
        if *algorithm == OID_PKCS1_SHA1WITHRSA || *algorithm == OID_SHA1_WITH_RSA {
            return Err(SignatureError::AlgorithmNotAllowed {
                oid: algorithm.to_id_string(),
            });
        }
        x509_parser::verify::verify_signature(&spki, &signature_algorithm, &signature, parts.info).map_err(
            |e| match e {
                x509_parser::error::X509Error::SignatureUnsupportedAlgorithm => SignatureError::AlgorithmNotAllowed {
                    oid: algorithm.to_id_string(),
                },
                _ => SignatureError::Mismatch,
            },
        )
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

/// A request cut along its DER structure: every piece read to its exact end.
struct Skeleton<'a> {
    /// The CertificationRequestInfo, tag and length included: what the signature covers.
    info: &'a [u8],
    /// The subject Name, tag and length included.
    subject: &'a [u8],
    /// The SubjectPublicKeyInfo, tag and length included.
    spki: &'a [u8],
    /// The contents of `[0] IMPLICIT SET OF Attribute`.
    attributes: &'a [u8],
    /// The signature AlgorithmIdentifier, tag and length included.
    signature_algorithm: &'a [u8],
    /// The signature BIT STRING, tag and length included.
    signature: &'a [u8],
}

impl<'a> Skeleton<'a> {
    /// ```text
    /// CertificationRequest ::= SEQUENCE {
    ///     certificationRequestInfo SEQUENCE {
    ///         version       INTEGER { v1(0) },
    ///         subject       Name,
    ///         subjectPKInfo SubjectPublicKeyInfo,
    ///         attributes    [0] IMPLICIT SET OF Attribute },
    ///     signatureAlgorithm AlgorithmIdentifier,
    ///     signature          BIT STRING }
    /// ```
    fn cut(der: &'a [u8]) -> Result<Self, CsrError> {
        let malformed = |e: der::Error| CsrError::Malformed { why: e.to_string() };
        let mut reader = SliceReader::new(der).map_err(malformed)?;
        let (info, signature_algorithm, signature) = reader
            .sequence(|r| {
                let info = tlv(r, Tag::Sequence)?;
                let algorithm = tlv(r, Tag::Sequence)?;
                let signature = tlv(r, Tag::BitString)?;
                check_algorithm_identifier(algorithm)?;
                BitStringRef::from_der(signature)?;
                Ok((info, algorithm, signature))
            })
            .map_err(malformed)?;
        if !reader.is_finished() {
            return Err(CsrError::TrailingBytes {
                count: der.len() - usize::try_from(reader.position()).unwrap_or(der.len()),
            });
        }
        let mut reader = SliceReader::new(info).map_err(malformed)?;
        let (version, subject, spki, attributes) = reader
            .sequence(|r| {
                let version = AnyRef::decode(r)?;
                version.tag().assert_eq(Tag::Integer)?;
                let subject = tlv(r, Tag::Sequence)?;
                let spki = tlv(r, Tag::Sequence)?;
                let header = Header::decode(r)?;
                header.tag().assert_eq(Tag::ContextSpecific {
                    constructed: true,
                    number: TagNumber(0),
                })?;
                let attributes = r.read_slice(header.length())?;
                Ok((version, subject, spki, attributes))
            })
            .map_err(malformed)?;
        match version.decode_as::<i64>() {
            Ok(0) => {}
            Ok(other) => {
                return Err(CsrError::Version {
                    version: other.to_string(),
                });
            }
            Err(_) => {
                return Err(CsrError::Version {
                    version: format!(
                        "{:02x?} (not a small DER INTEGER)",
                        &version.value()[..version.value().len().min(8)]
                    ),
                });
            }
        }
        check_spki(spki).map_err(|e| CsrError::Malformed {
            why: format!("subjectPKInfo: {e}"),
        })?;
        Ok(Self {
            info,
            subject,
            spki,
            attributes,
            signature_algorithm,
            signature,
        })
    }

    /// The SubjectPublicKeyInfo, as x509-parser reads it.
    fn subject_public_key_info(&self) -> Result<SubjectPublicKeyInfo<'a>, CsrError> {
        match SubjectPublicKeyInfo::from_der(self.spki) {
            Ok(([], spki)) => Ok(spki),
            Ok(_) => Err(CsrError::Malformed {
                why: "subjectPKInfo: bytes after it".into(),
            }),
            Err(e) => Err(CsrError::Malformed {
                why: format!("subjectPKInfo: {e}"),
            }),
        }
    }
}

/// One TLV of type `tag`, tag and length included.
fn tlv<'a>(reader: &mut SliceReader<'a>, tag: Tag) -> der::Result<&'a [u8]> {
    Header::peek(reader)?.tag().assert_eq(tag)?;
    reader.tlv_bytes()
}

/// An OBJECT IDENTIFIER, dotted.
fn read_oid(reader: &mut SliceReader<'_>) -> der::Result<String> {
    Ok(<ObjectIdentifier>::decode(reader)?.to_string())
}

/// `AlgorithmIdentifier ::= SEQUENCE { algorithm OBJECT IDENTIFIER, parameters ANY OPTIONAL }`
fn check_algorithm_identifier(der: &[u8]) -> der::Result<()> {
    SliceReader::new(der)?.sequence(|r| {
        read_oid(r)?;
        if !r.is_finished() {
            AnyRef::decode(r)?;
        }
        Ok(())
    })
}

/// `SubjectPublicKeyInfo ::= SEQUENCE { algorithm AlgorithmIdentifier, subjectPublicKey BIT STRING }`
fn check_spki(der: &[u8]) -> der::Result<()> {
    SliceReader::new(der)?.sequence(|r| {
        check_algorithm_identifier(tlv(r, Tag::Sequence)?)?;
        BitStringRef::decode(r)?;
        Ok(())
    })
}

/// `Name ::= SEQUENCE OF SET SIZE (1..MAX) OF SEQUENCE { type OBJECT IDENTIFIER, value ANY }`
fn read_subject(der: &[u8]) -> der::Result<Vec<SubjectAttribute>> {
    SliceReader::new(der)?.sequence(|rdns| {
        let mut subject = Vec::new();
        while !rdns.is_finished() {
            let header = Header::decode(rdns)?;
            header.tag().assert_eq(Tag::Set)?;
            let rdn = rdns.read_nested(header.length(), |rdn| {
                let mut rdn_attributes = Vec::new();
                while !rdn.is_finished() {
                    rdn_attributes.push(rdn.sequence(|atv| {
                        let oid = read_oid(atv)?;
                        let value = AnyRef::decode(atv)?;
                        Ok::<_, der::Error>((oid, value))
                    })?);
                }
                Ok::<_, der::Error>(rdn_attributes)
            })?;
            if rdn.is_empty() {
                return Err(rdns.error(Tag::Set.length_error()));
            }
            let multi_valued_rdn = rdn.len() > 1;
            for (oid, value) in rdn {
                let (kind, value) = match value.tag() {
                    Tag::PrintableString => (
                        StringKind::Printable,
                        value
                            .decode_as::<PrintableStringRef<'_>>()
                            .ok()
                            .map(|v| v.as_str().to_owned()),
                    ),
                    Tag::Utf8String => (
                        StringKind::Utf8,
                        value
                            .decode_as::<Utf8StringRef<'_>>()
                            .ok()
                            .map(|v| v.as_str().to_owned()),
                    ),
                    _ => (StringKind::Other, None),
                };
                subject.push(SubjectAttribute {
                    oid,
                    value,
                    kind,
                    multi_valued_rdn,
                });
            }
        }
        Ok(subject)
    })
}

/// The requested extensions, when the attributes are SPEC rule 5's one shape (module
/// documentation): `SET OF Attribute`, `Attribute ::= SEQUENCE { type OBJECT IDENTIFIER,
/// values SET OF ANY }`.
fn read_attributes(contents: &[u8]) -> Result<Vec<RequestedExtension>, AttributeProblem> {
    let malformed = |e: der::Error| AttributeProblem::Malformed { why: e.to_string() };
    let mut reader = SliceReader::new(contents).map_err(malformed)?;
    let mut attributes = Vec::new();
    while !reader.is_finished() {
        let attribute = reader
            .sequence(|attribute| {
                let oid = read_oid(attribute)?;
                let header = Header::decode(attribute)?;
                header.tag().assert_eq(Tag::Set)?;
                let values = attribute.read_nested(header.length(), |set| {
                    let mut values = Vec::new();
                    while !set.is_finished() {
                        values.push(set.tlv_bytes()?);
                    }
                    Ok::<_, der::Error>(values)
                })?;
                Ok((oid, values))
            })
            .map_err(malformed)?;
        attributes.push(attribute);
    }
    if let Some((oid, _)) = attributes.iter().find(|(oid, _)| oid != EXTENSION_REQUEST_OID) {
        return Err(AttributeProblem::Other { oid: oid.clone() });
    }
    let value = match attributes.as_slice() {
        [] => return Ok(Vec::new()),
        [(_, values)] => match values.as_slice() {
            [value] => *value,
            values => return Err(AttributeProblem::ExtensionRequestValues { count: values.len() }),
        },
        more => return Err(AttributeProblem::RepeatedExtensionRequest { count: more.len() }),
    };
    read_extensions(value)
}

/// `Extensions ::= SEQUENCE SIZE (1..MAX) OF Extension`, `Extension ::= SEQUENCE { extnID
/// OBJECT IDENTIFIER, critical BOOLEAN DEFAULT FALSE, extnValue OCTET STRING }`, strict DER.
fn read_extensions(value: &[u8]) -> Result<Vec<RequestedExtension>, AttributeProblem> {
    let malformed = |why: String| AttributeProblem::MalformedExtensions { why };
    let mut reader = SliceReader::new(value).map_err(|e| malformed(e.to_string()))?;
    let decoded = reader
        .sequence(|list| {
            let mut extensions = Vec::new();
            while !list.is_finished() {
                extensions.push(list.sequence(|extension| {
                    let oid = read_oid(extension)?;
                    let critical = match Tag::peek(extension)? {
                        Tag::Boolean => Some(bool::decode(extension)?),
                        _ => None,
                    };
                    let value = <&OctetStringRef>::decode(extension)?;
                    Ok::<_, der::Error>((oid, critical, value.as_bytes().to_vec()))
                })?);
            }
            Ok::<_, der::Error>(extensions)
        })
        .map_err(|e| malformed(e.to_string()))?;
    if decoded.is_empty() {
        return Err(malformed("no extension in it (SIZE (1..MAX))".into()));
    }
    let mut extensions: Vec<RequestedExtension> = Vec::with_capacity(decoded.len());
    for (oid, critical, value) in decoded {
        if critical == Some(false) {
            return Err(malformed(format!(
                "extension {oid} writes critical FALSE, the DEFAULT, which DER leaves out"
            )));
        }
        if extensions.iter().any(|e| e.oid == oid) {
            return Err(AttributeProblem::DuplicateExtension { oid });
        }
        extensions.push(RequestedExtension {
            oid,
            critical: critical == Some(true),
            value,
        });
    }
    Ok(extensions)
}

fn classify_key(spki: &SubjectPublicKeyInfo<'_>) -> PublicKeyKind {
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

/// `GeneralNames ::= SEQUENCE SIZE (1..MAX) OF GeneralName`, strict DER; the IA5String
/// names must be ASCII, IP addresses 4 or 16 bytes (what Go refuses otherwise).
fn decode_san(value: &[u8]) -> Result<Vec<SubjectAltName>, CsrError> {
    let malformed = |why: String| CsrError::MalformedExtension {
        oid: SUBJECT_ALT_NAME_OID.to_owned(),
        why,
    };
    let names = SliceReader::new(value)
        .and_then(|mut r| {
            let names = r.sequence(|names| {
                let mut all = Vec::new();
                while !names.is_finished() {
                    all.push(AnyRef::decode(names)?);
                }
                Ok::<_, der::Error>(all)
            })?;
            r.finish()?;
            Ok(names)
        })
        .map_err(|e| malformed(e.to_string()))?;
    if names.is_empty() {
        return Err(malformed("no name in it (SIZE (1..MAX))".into()));
    }
    let ia5 = |bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .ok()
            .filter(|s| s.is_ascii())
            .map(str::to_owned)
            .ok_or_else(|| malformed("a name is not an IA5String".into()))
    };
    names
        .into_iter()
        .map(|name| {
            let Tag::ContextSpecific { constructed, number } = name.tag() else {
                return Err(malformed(format!("{} is not a GeneralName", name.tag())));
            };
            Ok(match (constructed, number.value()) {
                (false, 1) => SubjectAltName::Email(ia5(name.value())?),
                (false, 2) => SubjectAltName::Dns(ia5(name.value())?),
                (false, 6) => SubjectAltName::Uri(ia5(name.value())?),
                (false, 7) => SubjectAltName::Ip(match name.value().len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(name.value()).map_err(|_| malformed("bad IP".into()))?),
                    16 => IpAddr::from(<[u8; 16]>::try_from(name.value()).map_err(|_| malformed("bad IP".into()))?),
                    n => return Err(malformed(format!("IP address of {n} bytes"))),
                }),
                (true, 0) => SubjectAltName::Other("otherName".into()),
                (true, 3) => SubjectAltName::Other("x400Address".into()),
                (true, 4) => SubjectAltName::Other("directoryName".into()),
                (true, 5) => SubjectAltName::Other("ediPartyName".into()),
                (false, 8) => SubjectAltName::Other("registeredID".into()),
                (_, n) => return Err(malformed(format!("GeneralName [{n}] is not defined"))),
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

    // DER by hand: these tests bend the structure, so they cannot use an encoder that only
    // writes valid requests. The signature is never checked by `from_der`.

    fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            n @ 0..=0x7f => out.push(n as u8),
            n @ 0x80..=0xff => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
        tlv(0x30, &parts.concat())
    }

    fn set(parts: &[Vec<u8>]) -> Vec<u8> {
        tlv(0x31, &parts.concat())
    }

    fn oid(dotted: &str) -> Vec<u8> {
        use der::Encode;
        <ObjectIdentifier>::new(dotted).unwrap().to_der().unwrap()
    }

    fn spki() -> Vec<u8> {
        use rcgen::PublicKeyData;
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap()
            .subject_public_key_info()
    }

    fn subject() -> Vec<u8> {
        seq(&[
            set(&[seq(&[oid("2.5.4.10"), tlv(0x13, b"system:nodes")])]),
            set(&[seq(&[oid("2.5.4.3"), tlv(0x0c, b"system:node:worker-0")])]),
        ])
    }

    const PID: &[u8] = b"aws:///us-east-1a/i-0abc";

    fn provider_id() -> Vec<u8> {
        seq(&[oid(crate::names::PROVIDER_ID_OID_DOTTED), tlv(0x04, &tlv(0x0c, PID))])
    }

    fn ca_true() -> Vec<u8> {
        seq(&[
            oid("2.5.29.19"),
            tlv(0x01, &[0xff]),
            tlv(0x04, &seq(&[tlv(0x01, &[0xff])])),
        ])
    }

    fn extension_request(values: &[Vec<u8>]) -> Vec<u8> {
        seq(&[oid(EXTENSION_REQUEST_OID), set(values)])
    }

    /// A request from CertificationRequestInfo parts; `info_end` is appended inside the CRI.
    fn request(version: &[u8], subject: &[u8], attributes: &[u8], info_end: &[u8]) -> Vec<u8> {
        let info = seq(&[
            version.to_vec(),
            subject.to_vec(),
            spki(),
            attributes.to_vec(),
            info_end.to_vec(),
        ]);
        seq(&[info, seq(&[oid("1.2.840.10045.4.3.2")]), tlv(0x03, &[0, 0x30, 0])])
    }

    fn with_attributes(attributes: &[Vec<u8>]) -> Result<ParsedCsr, CsrError> {
        ParsedCsr::from_der(&request(&[2, 1, 0], &subject(), &tlv(0xa0, &attributes.concat()), &[]))
    }

    #[test]
    fn one_extension_request_with_one_value_is_read() {
        let parsed = with_attributes(&[extension_request(&[seq(&[provider_id()])])]).unwrap();
        assert_eq!(parsed.attribute_problem, None);
        assert_eq!(
            parsed.extensions,
            [RequestedExtension {
                oid: crate::names::PROVIDER_ID_OID_DOTTED.into(),
                critical: false,
                value: tlv(0x0c, PID),
            }]
        );
        assert_eq!(parsed.subject.len(), 2);
        assert_eq!(parsed.subject[0].kind, StringKind::Printable);
        assert_eq!(parsed.subject[1].value.as_deref(), Some("system:node:worker-0"));
        let none = with_attributes(&[]).unwrap();
        assert_eq!((none.extensions.len(), none.attribute_problem), (0, None));
    }

    #[test]
    fn a_version_other_than_v1_is_refused() {
        for version in [
            &[2, 1, 1][..],
            &[2, 1, 2],
            &[2, 1, 0xff],
            &[2, 2, 0, 0],
            &[2, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            let der = request(version, &subject(), &tlv(0xa0, &[]), &[]);
            assert!(
                matches!(ParsedCsr::from_der(&der), Err(CsrError::Version { .. })),
                "{version:02x?}: {:?}",
                ParsedCsr::from_der(&der)
            );
        }
        // Not an INTEGER at all.
        let der = request(&[4, 1, 0], &subject(), &tlv(0xa0, &[]), &[]);
        assert!(matches!(ParsedCsr::from_der(&der), Err(CsrError::Malformed { .. })));
    }

    #[test]
    fn attribute_shapes_outside_rule_5_are_recorded_and_read_nothing() {
        let one = || seq(&[provider_id()]);
        let mut trailing_in_set = one();
        trailing_in_set.push(0x01);
        let mut trailing_in_extensions = provider_id();
        trailing_in_extensions.extend([0x05, 0x00]);
        let critical = |flag: &[u8]| {
            seq(&[seq(&[
                oid(crate::names::PROVIDER_ID_OID_DOTTED),
                tlv(0x01, flag),
                tlv(0x04, &tlv(0x0c, PID)),
            ])])
        };
        let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
            ("second value", vec![extension_request(&[one(), seq(&[ca_true()])])]),
            (
                "extensions after an empty SET",
                vec![seq(&[oid(EXTENSION_REQUEST_OID), set(&[]), one()])],
            ),
            ("empty SET", vec![extension_request(&[])]),
            (
                "challengePassword",
                vec![
                    extension_request(&[one()]),
                    seq(&[oid("1.2.840.113549.1.9.7"), set(&[tlv(0x13, b"secret")])]),
                ],
            ),
            (
                "msExtReq",
                vec![seq(&[oid("1.3.6.1.4.1.311.2.1.14"), set(&[seq(&[ca_true()])])])],
            ),
            (
                "two extensionRequests",
                vec![extension_request(&[one()]), extension_request(&[seq(&[ca_true()])])],
            ),
            (
                "bytes after the value in the SET",
                vec![seq(&[oid(EXTENSION_REQUEST_OID), tlv(0x31, &trailing_in_set)])],
            ),
            (
                "bytes after the last extension",
                vec![extension_request(&[tlv(0x30, &trailing_in_extensions)])],
            ),
            (
                "bytes after the attribute's SET",
                vec![seq(&[oid(EXTENSION_REQUEST_OID), set(&[one()]), seq(&[ca_true()])])],
            ),
            ("explicit critical FALSE", vec![extension_request(&[critical(&[0x00])])]),
            ("BER critical TRUE", vec![extension_request(&[critical(&[0x01])])]),
            (
                "duplicate",
                vec![extension_request(&[seq(&[provider_id(), provider_id()])])],
            ),
            ("empty Extensions", vec![extension_request(&[seq(&[])])]),
            (
                "value not a SEQUENCE",
                vec![extension_request(&[set(&[provider_id()])])],
            ),
            ("garbage attribute", vec![vec![0x30, 0x01, 0x00]]),
        ];
        for (what, attributes) in cases {
            let parsed = with_attributes(&attributes).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                parsed.attribute_problem.is_some(),
                "{what}: read {:?}",
                parsed.extensions
            );
            assert!(parsed.extensions.is_empty(), "{what}");
            assert!(parsed.subject_alt_names.is_empty(), "{what}");
        }
        // A critical TRUE is DER and read as such.
        let parsed = with_attributes(&[extension_request(&[critical(&[0xff])])]).unwrap();
        assert!(parsed.extensions[0].critical);
    }

    #[test]
    fn bytes_a_parser_would_skip_are_refused_at_every_level() {
        let ok = request(&[2, 1, 0], &subject(), &tlv(0xa0, &[]), &[]);
        assert!(ParsedCsr::from_der(&ok).is_ok());
        let mut after = ok.clone();
        after.push(0);
        assert_eq!(ParsedCsr::from_der(&after), Err(CsrError::TrailingBytes { count: 1 }));
        // Inside the CertificationRequestInfo, after the attributes.
        let der = request(&[2, 1, 0], &subject(), &tlv(0xa0, &[]), &[5, 0]);
        assert!(matches!(ParsedCsr::from_der(&der), Err(CsrError::Malformed { .. })));
        // No attributes field at all (OpenSSL tolerates it, Go and PKCS#10 do not).
        let der = request(&[2, 1, 0], &subject(), &[], &[]);
        assert!(matches!(ParsedCsr::from_der(&der), Err(CsrError::Malformed { .. })));
        // Inside the Name, an RDN, an AttributeTypeAndValue; an empty RDN.
        let mut name = subject();
        name.extend([5, 0]);
        name[1] += 2;
        let with_end = |subject: &[u8]| ParsedCsr::from_der(&request(&[2, 1, 0], subject, &tlv(0xa0, &[]), &[]));
        assert!(with_end(&name).is_err());
        let atv_end = seq(&[set(&[seq(&[
            oid("2.5.4.3"),
            tlv(0x0c, b"system:node:a"),
            tlv(0x0c, b"x"),
        ])])]);
        assert!(with_end(&atv_end).is_err());
        let rdn_end = seq(&[tlv(0x31, &[seq(&[oid("2.5.4.3"), tlv(0x0c, b"a")]), vec![5]].concat())]);
        assert!(with_end(&rdn_end).is_err());
        assert!(with_end(&seq(&[set(&[])])).is_err());
        // A primitive `[0]` in place of the attributes.
        let der = request(&[2, 1, 0], &subject(), &tlv(0x80, &[]), &[]);
        assert!(matches!(ParsedCsr::from_der(&der), Err(CsrError::Malformed { .. })));
    }

    #[test]
    fn subject_alt_names_are_strict_der() {
        let san = |value: Vec<u8>| {
            with_attributes(&[extension_request(&[seq(&[seq(&[
                oid("2.5.29.17"),
                tlv(0x04, &value),
            ])])])])
        };
        let parsed = san(seq(&[tlv(0x82, b"worker-0"), tlv(0x87, &[10, 0, 0, 7])])).unwrap();
        assert_eq!(
            parsed.subject_alt_names,
            [
                SubjectAltName::Dns("worker-0".into()),
                SubjectAltName::Ip("10.0.0.7".parse().unwrap())
            ]
        );
        let mut trailing = seq(&[tlv(0x82, b"worker-0")]);
        trailing.push(0);
        for bad in [
            trailing,
            seq(&[]),
            seq(&[tlv(0x82, "wörker".as_bytes())]),
            seq(&[tlv(0x87, &[10, 0, 0])]),
            seq(&[tlv(0x0c, b"worker-0")]),
        ] {
            assert!(
                matches!(san(bad.clone()), Err(CsrError::MalformedExtension { .. })),
                "{bad:02x?}"
            );
        }
    }
}
