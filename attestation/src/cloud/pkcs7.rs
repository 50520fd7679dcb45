//! A cloud's signed statement as PKCS#7 SignedData: the statement (JSON) as the encapsulated
//! content, one signer, RSA PKCS#1 v1.5 (AWS's identity document, `aws/v1`; Azure's attested
//! document, `azure/v1`).
//!
//! The clouds' forms differ, and [`Profile`] says how:
//! - AWS's may use BER (indefinite lengths, constructed OCTET STRINGs) and carry no
//!   certificate: the region's certificate the operator trusts is given to [`SignedStatement::verify`].
//! - Azure's embeds its signing (leaf) certificate and nothing else of its chain, carries no
//!   signed attributes (the signature is over the content itself), and writes
//!   `sha256WithRSAEncryption` where RFC 5652 has the digest algorithm `sha256`.
//!
//! The structure is decoded with `rasn`'s BER decoder (RFC 5652's types from `rasn-cms`). What is
//! verified does not depend on that leniency: with signed attributes, the content's digest must
//! equal the signed `messageDigest` attribute and the signature is checked over the DER
//! re-encoding of the attributes (RFC 5652 section 5.4); without, over the content's octets.
//! Embedded certificates are kept as their exact bytes ([`SignedStatement::certificates`]), for
//! the caller to chain to what it trusts; nothing here trusts them.

use rasn::Decoder as _;
use rasn::types::{Any, ObjectIdentifier, OctetString, SetOf};
use rasn_cms::pkcs7_compat::EncapsulatedContentInfo;
use rasn_cms::{
    CONTENT_DATA, CONTENT_SIGNED_DATA, CONTENT_TYPE, CmsVersion, ContentInfo, DigestAlgorithmIdentifiers,
    MESSAGE_DIGEST, SignerInfo, SignerInfos,
};
use x509_parser::prelude::FromDer;

/// Largest PKCS#7 read: AWS's is under 2 KiB, Azure's (with its leaf certificate) under 4 KiB.
pub const MAX_PKCS7_BYTES: usize = 16 * 1024;

/// Most certificates read from one message (Azure embeds one).
const MAX_CERTIFICATES: usize = 8;

/// How a cloud writes its PKCS#7 (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// `sha256WithRSAEncryption` in a digest-algorithm field counts as SHA-256 (Azure).
    pub signature_oid_as_digest: bool,
}

impl Profile {
    /// AWS's identity document (`rsa2048`).
    pub const AWS: Self = Self {
        signature_oid_as_digest: false,
    };
    /// Azure's attested document.
    pub const AZURE: Self = Self {
        signature_oid_as_digest: true,
    };
}

/// SignedData as RFC 5652 has it, with the certificates and CRLs kept as their encoded bytes
/// (`rasn-cms` would decode and re-encode them, and a certificate must be checked as signed).
#[derive(rasn::AsnType, rasn::Decode, Debug, Clone, PartialEq, Eq)]
struct RawSignedData {
    version: CmsVersion,
    digest_algorithms: DigestAlgorithmIdentifiers,
    encap_content_info: EncapsulatedContentInfo,
    #[rasn(tag(0))]
    certificates: Option<SetOf<Any>>,
    #[rasn(tag(1))]
    crls: Option<SetOf<Any>>,
    signer_infos: SignerInfos,
}

/// The digests a signer may use, with the matching verification algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DigestKind {
    Sha256,
    Sha384,
    Sha512,
}

impl DigestKind {
    fn from_oid(oid: &ObjectIdentifier, profile: Profile) -> Option<Self> {
        match oid.to_string().as_str() {
            "2.16.840.1.101.3.4.2.1" => Some(Self::Sha256),
            "2.16.840.1.101.3.4.2.2" => Some(Self::Sha384),
            "2.16.840.1.101.3.4.2.3" => Some(Self::Sha512),
            "1.2.840.113549.1.1.11" if profile.signature_oid_as_digest => Some(Self::Sha256),
            _ => None,
        }
    }

    fn digest(self, bytes: &[u8]) -> Vec<u8> {
        let algorithm = match self {
            Self::Sha256 => &aws_lc_rs::digest::SHA256,
            Self::Sha384 => &aws_lc_rs::digest::SHA384,
            Self::Sha512 => &aws_lc_rs::digest::SHA512,
        };
        aws_lc_rs::digest::digest(algorithm, bytes).as_ref().to_vec()
    }

    fn rsa(self) -> &'static aws_lc_rs::signature::RsaParameters {
        match self {
            Self::Sha256 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA256,
            Self::Sha384 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA384,
            Self::Sha512 => &aws_lc_rs::signature::RSA_PKCS1_2048_8192_SHA512,
        }
    }
}

/// Which certificate the signer names (`SignerInfo.sid`): the signature must be by that one.
#[derive(Clone, PartialEq, Eq)]
enum SignerId {
    /// DER of the issuer name, and the serial's content octets.
    IssuerAndSerial { issuer: Vec<u8>, serial: Vec<u8> },
    /// The subject key identifier.
    KeyId(Vec<u8>),
}

/// A decoded, not yet verified, signed statement.
#[derive(Clone)]
pub struct SignedStatement {
    signer: SignerId,
    content: Vec<u8>,
    digest: DigestKind,
    signed_attributes_der: Option<Vec<u8>>,
    signature: Vec<u8>,
    certificates: Vec<Vec<u8>>,
}

impl std::fmt::Debug for SignedStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedStatement")
            .field("content_bytes", &self.content.len())
            .field("digest", &self.digest)
            .field("certificates", &self.certificates.len())
            .finish_non_exhaustive()
    }
}

fn ber<T: rasn::Decode>(what: &str, bytes: &[u8]) -> Result<T, String> {
    match rasn::ber::decode_with_remainder::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(format!("{what}: {} bytes after its end", rest.len())),
        Err(e) => Err(format!("{what} does not decode: {e}")),
    }
}

/// The content octets of an INTEGER's DER (what a certificate's raw serial holds).
fn integer_octets(value: &rasn::types::Integer) -> Result<Vec<u8>, String> {
    let der = rasn::der::encode(value).map_err(|e| format!("the PKCS#7 signer's serial: {e}"))?;
    match der.as_slice() {
        [0x02, length, rest @ ..] if usize::from(*length) == rest.len() && *length < 0x80 => Ok(rest.to_vec()),
        [0x02, 0x81, length, rest @ ..] if usize::from(*length) == rest.len() => Ok(rest.to_vec()),
        _ => Err("the PKCS#7 signer's serial is too long".into()),
    }
}

fn any_bytes(any: &Any) -> &[u8] {
    any.as_bytes()
}

impl SignedStatement {
    /// Decodes the PKCS#7 (BER or DER) as `profile`'s cloud writes it.
    pub fn parse(bytes: &[u8], profile: Profile) -> Result<Self, String> {
        if bytes.len() > MAX_PKCS7_BYTES {
            return Err(format!(
                "the PKCS#7 is {} bytes, more than {MAX_PKCS7_BYTES}",
                bytes.len()
            ));
        }
        let info: ContentInfo = ber("the PKCS#7 ContentInfo", bytes)?;
        if info.content_type != *CONTENT_SIGNED_DATA {
            return Err(format!("the PKCS#7 is {}, not signedData", info.content_type));
        }
        let signed: RawSignedData = ber("the PKCS#7 SignedData", any_bytes(&info.content))?;
        if signed.encap_content_info.content_type != *CONTENT_DATA {
            return Err(format!(
                "the PKCS#7 encapsulates {}, not data",
                signed.encap_content_info.content_type
            ));
        }
        let content = signed
            .encap_content_info
            .content
            .as_ref()
            .ok_or("the PKCS#7 is detached: the signed document is not inside")?;
        let content: OctetString = ber("the PKCS#7 content", any_bytes(content))?;
        let signers: Vec<&SignerInfo> = signed.signer_infos.to_vec();
        let [signer] = signers.as_slice() else {
            return Err(format!("the PKCS#7 has {} signers, not one", signers.len()));
        };
        let digest = DigestKind::from_oid(&signer.digest_algorithm.algorithm, profile).ok_or_else(|| {
            format!(
                "the PKCS#7 digest {} is not SHA-256/384/512",
                signer.digest_algorithm.algorithm
            )
        })?;
        // The digests the SignedData declares are the ones OpenSSL prepares: every one must be
        // known, and the signer's among them.
        let declared: Vec<Option<DigestKind>> = signed
            .digest_algorithms
            .to_vec()
            .into_iter()
            .map(|a| DigestKind::from_oid(&a.algorithm, profile))
            .collect();
        if declared.iter().any(Option::is_none) || !declared.contains(&Some(digest)) {
            return Err("the PKCS#7's digestAlgorithms do not list the signer's digest (and only known ones)".into());
        }
        let signer_id = match &signer.sid {
            rasn_cms::SignerIdentifier::IssuerAndSerialNumber(id) => SignerId::IssuerAndSerial {
                issuer: rasn::der::encode(&id.issuer).map_err(|e| format!("the PKCS#7 signer's issuer: {e}"))?,
                serial: integer_octets(&id.serial_number)?,
            },
            rasn_cms::SignerIdentifier::SubjectKeyIdentifier(key) => SignerId::KeyId(key.to_vec()),
        };
        let signature_algorithm = signer.signature_algorithm.algorithm.to_string();
        let expected = match digest {
            DigestKind::Sha256 => "1.2.840.113549.1.1.11",
            DigestKind::Sha384 => "1.2.840.113549.1.1.12",
            DigestKind::Sha512 => "1.2.840.113549.1.1.13",
        };
        if signature_algorithm != "1.2.840.113549.1.1.1" && signature_algorithm != expected {
            return Err(format!(
                "the PKCS#7 signature algorithm {signature_algorithm} is not RSA PKCS#1 v1.5 with its digest"
            ));
        }
        let signed_attributes_der = match &signer.signed_attrs {
            None => None,
            Some(attributes) => {
                let mut content_type = None;
                let mut message_digest = None;
                for attribute in attributes.to_vec() {
                    let values: Vec<&Any> = attribute.values.to_vec();
                    let one = |name: &str| match values.as_slice() {
                        [value] => Ok(*value),
                        _ => Err(format!("the signed attribute {name} does not hold one value")),
                    };
                    if attribute.r#type == *CONTENT_TYPE {
                        if content_type.is_some() {
                            return Err("the signed attribute contentType appears twice".into());
                        }
                        content_type = Some(ber::<ObjectIdentifier>("contentType", any_bytes(one("contentType")?))?);
                    } else if attribute.r#type == *MESSAGE_DIGEST {
                        if message_digest.is_some() {
                            return Err("the signed attribute messageDigest appears twice".into());
                        }
                        message_digest = Some(ber::<OctetString>("messageDigest", any_bytes(one("messageDigest")?))?);
                    }
                }
                if content_type.as_ref() != Some(&CONTENT_DATA.to_owned()) {
                    return Err("the signed attributes do not name the content type data".into());
                }
                let message_digest = message_digest.ok_or("the signed attributes carry no messageDigest")?;
                if message_digest.as_ref() != digest.digest(&content).as_slice() {
                    return Err("the signed messageDigest is not the signed document's digest".into());
                }
                Some(
                    rasn::der::encode(attributes)
                        .map_err(|e| format!("the signed attributes do not re-encode: {e}"))?,
                )
            }
        };
        let certificates: Vec<Vec<u8>> = signed
            .certificates
            .map(|set| set.to_vec().into_iter().map(|c| c.as_bytes().to_vec()).collect())
            .unwrap_or_default();
        if certificates.len() > MAX_CERTIFICATES {
            return Err(format!(
                "the PKCS#7 carries {} certificates, more than {MAX_CERTIFICATES}",
                certificates.len()
            ));
        }
        Ok(Self {
            signer: signer_id,
            content: content.to_vec(),
            digest,
            signed_attributes_der,
            signature: signer.signature.to_vec(),
            certificates,
        })
    }

    /// The signed document (JSON), not yet verified.
    pub fn content(&self) -> &[u8] {
        &self.content
    }

    /// The certificates the message carries, as their DER bytes: untrusted, whatever they say.
    pub fn certificates(&self) -> &[Vec<u8>] {
        &self.certificates
    }

    /// The embedded certificate the signer info names, if one does (Azure's leaf).
    pub fn embedded_signer(&self) -> Option<&[u8]> {
        self.certificates
            .iter()
            .map(Vec::as_slice)
            .find(|der| x509_parser::certificate::X509Certificate::from_der(der).is_ok_and(|(_, c)| self.names(&c)))
    }

    /// Whether the signer info names `certificate`.
    fn names(&self, certificate: &x509_parser::certificate::X509Certificate<'_>) -> bool {
        match &self.signer {
            SignerId::IssuerAndSerial { issuer, serial } => {
                certificate.issuer().as_raw() == issuer.as_slice() && certificate.raw_serial() == serial.as_slice()
            }
            SignerId::KeyId(id) => certificate.extensions().iter().any(|e| {
                matches!(e.parsed_extension(), x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(ski) if ski.0 == id.as_slice())
            }),
        }
    }

    /// Checks the signature with the RSA key of `certificate_der`, which the caller trusts
    /// (`what` names it in messages: "the region's AWS certificate").
    pub fn verify(&self, certificate_der: &[u8], what: &str) -> Result<(), String> {
        let (_, certificate) = x509_parser::certificate::X509Certificate::from_der(certificate_der)
            .map_err(|e| format!("{what} does not parse: {e}"))?;
        if !self.names(&certificate) {
            return Err(format!("the PKCS#7 names another signer than {what}"));
        }
        let key = &certificate.public_key().subject_public_key.data;
        let signed = self.signed_attributes_der.as_deref().unwrap_or(&self.content);
        aws_lc_rs::signature::UnparsedPublicKey::new(self.digest.rsa(), key)
            .verify(signed, &self.signature)
            .map_err(|_| format!("the PKCS#7 signature does not verify with {what}"))
    }
}
