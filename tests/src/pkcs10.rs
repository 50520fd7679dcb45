//! PKCS#10 requests assembled from DER parts, for encodings no library writes on purpose: any
//! version, subject string type, attribute layout, critical flag or trailing bytes, each still
//! self-signed by a real key, so the signer reads past rule 2 and a second parser (OpenSSL) has
//! something valid to compare with.
//!
//! The parts are raw DER so a test can bend any of them; the helpers below write the usual
//! shapes with the `der` crate.

use attestation::request::KeyAlgorithm;
use der::Encode;
use der::asn1::ObjectIdentifier;
use rcgen::{PublicKeyData, SigningKey};

/// DER tag bytes the builders write.
pub mod tag {
    /// BOOLEAN
    pub const BOOLEAN: u8 = 0x01;
    /// INTEGER
    pub const INTEGER: u8 = 0x02;
    /// BIT STRING
    pub const BIT_STRING: u8 = 0x03;
    /// OCTET STRING
    pub const OCTET_STRING: u8 = 0x04;
    /// NULL
    pub const NULL: u8 = 0x05;
    /// UTF8String
    pub const UTF8_STRING: u8 = 0x0c;
    /// PrintableString
    pub const PRINTABLE_STRING: u8 = 0x13;
    /// TeletexString (T61String)
    pub const TELETEX_STRING: u8 = 0x14;
    /// IA5String
    pub const IA5_STRING: u8 = 0x16;
    /// BMPString
    pub const BMP_STRING: u8 = 0x1e;
    /// SEQUENCE (constructed)
    pub const SEQUENCE: u8 = 0x30;
    /// SET (constructed)
    pub const SET: u8 = 0x31;
    /// `[0]` constructed: the CertificationRequestInfo's attributes.
    pub const CONTEXT_0: u8 = 0xa0;
}

/// Dotted OIDs the builders use.
pub mod oids {
    /// PKCS#9 extensionRequest.
    pub const EXTENSION_REQUEST: &str = "1.2.840.113549.1.9.14";
    /// PKCS#9 challengePassword.
    pub const CHALLENGE_PASSWORD: &str = "1.2.840.113549.1.9.7";
    /// Microsoft's extension request (OpenSSL reads it as extensionRequest too).
    pub const MS_EXTENSION_REQUEST: &str = "1.3.6.1.4.1.311.2.1.14";
    /// PKCS#9 unstructuredName.
    pub const UNSTRUCTURED_NAME: &str = "1.2.840.113549.1.9.2";
    /// The provider-ID extension.
    pub const PROVIDER_ID: &str = attestation::names::PROVIDER_ID_OID_DOTTED;
    /// basicConstraints.
    pub const BASIC_CONSTRAINTS: &str = "2.5.29.19";
    /// subjectAltName.
    pub const SUBJECT_ALT_NAME: &str = "2.5.29.17";
    /// keyUsage.
    pub const KEY_USAGE: &str = "2.5.29.15";
    /// organizationName.
    pub const ORGANIZATION: &str = "2.5.4.10";
    /// commonName.
    pub const COMMON_NAME: &str = "2.5.4.3";
    /// countryName.
    pub const COUNTRY: &str = "2.5.4.6";
    /// ecdsa-with-SHA256.
    pub const ECDSA_WITH_SHA256: &str = "1.2.840.10045.4.3.2";
}

/// One TLV: the tag byte, the DER length, the contents.
pub fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = der::Length::try_from(contents.len()).expect("length fits");
    out.extend(length.to_der().expect("length encodes"));
    out.extend_from_slice(contents);
    out
}

/// A SEQUENCE of already encoded parts.
pub fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(tag::SEQUENCE, &parts.concat())
}

/// A SET of already encoded parts, in the order given (not sorted).
pub fn set(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(tag::SET, &parts.concat())
}

/// An OBJECT IDENTIFIER.
pub fn oid(dotted: &str) -> Vec<u8> {
    ObjectIdentifier::new(dotted)
        .expect("dotted OID")
        .to_der()
        .expect("OID encodes")
}

/// A string of type `tag` holding `value`'s bytes (UTF-16BE for BMPString).
pub fn string(tag: u8, value: &str) -> Vec<u8> {
    if tag == tag::BMP_STRING {
        let utf16: Vec<u8> = value.encode_utf16().flat_map(u16::to_be_bytes).collect();
        return tlv(tag, &utf16);
    }
    tlv(tag, value.as_bytes())
}

/// A Name with one single-valued RDN per `(oid, value TLV)`, in order.
pub fn name(attributes: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let rdns: Vec<Vec<u8>> = attributes
        .iter()
        .map(|(type_oid, value)| set(&[seq(&[oid(type_oid), value.clone()])]))
        .collect();
    seq(&rdns)
}

/// `O=system:nodes, CN=system:node:<node>` as PrintableStrings (what Go writes).
pub fn kubelet_subject(node: &str) -> Vec<u8> {
    name(&[
        (
            oids::ORGANIZATION,
            string(tag::PRINTABLE_STRING, attestation::names::GROUP_NODES),
        ),
        (
            oids::COMMON_NAME,
            string(tag::PRINTABLE_STRING, &format!("system:node:{node}")),
        ),
    ])
}

/// How an Extension's `critical` field is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Critical {
    /// Left out (DER for FALSE).
    Absent,
    /// `BOOLEAN TRUE` (0xff).
    True,
    /// `BOOLEAN FALSE` written out: not DER, since FALSE is the DEFAULT.
    ExplicitFalse,
    /// `BOOLEAN` with content 0x01: BER TRUE, not DER.
    BerTrue,
}

/// An Extension: `SEQUENCE { extnID, critical, extnValue OCTET STRING }`.
pub fn extension(extn_id: &str, critical: Critical, value: &[u8]) -> Vec<u8> {
    let mut parts = vec![oid(extn_id)];
    match critical {
        Critical::Absent => {}
        Critical::True => parts.push(tlv(tag::BOOLEAN, &[0xff])),
        Critical::ExplicitFalse => parts.push(tlv(tag::BOOLEAN, &[0x00])),
        Critical::BerTrue => parts.push(tlv(tag::BOOLEAN, &[0x01])),
    }
    parts.push(tlv(tag::OCTET_STRING, value));
    seq(&parts)
}

/// The provider-ID extension for `provider_id`, non-critical.
pub fn provider_id_extension(provider_id: &str) -> Vec<u8> {
    extension(
        oids::PROVIDER_ID,
        Critical::Absent,
        &string(tag::UTF8_STRING, provider_id),
    )
}

/// A critical `BasicConstraints { cA TRUE }`.
pub fn ca_true_extension() -> Vec<u8> {
    extension(
        oids::BASIC_CONSTRAINTS,
        Critical::True,
        &seq(&[tlv(tag::BOOLEAN, &[0xff])]),
    )
}

/// A subjectAltName with DNS names (`[2]`) and IPv4 addresses (`[7]`).
pub fn san_extension(dns: &[&str], ips: &[[u8; 4]]) -> Vec<u8> {
    let mut names: Vec<Vec<u8>> = dns.iter().map(|d| tlv(0x82, d.as_bytes())).collect();
    names.extend(ips.iter().map(|ip| tlv(0x87, ip)));
    extension(oids::SUBJECT_ALT_NAME, Critical::Absent, &seq(&names))
}

/// An Attribute: `SEQUENCE { type, SET OF value }`, values in the order given.
pub fn attribute(type_oid: &str, values: &[Vec<u8>]) -> Vec<u8> {
    seq(&[oid(type_oid), set(values)])
}

/// An extensionRequest attribute holding one Extensions value.
pub fn extension_request(extensions: &[Vec<u8>]) -> Vec<u8> {
    attribute(oids::EXTENSION_REQUEST, &[seq(extensions)])
}

/// The CertificationRequestInfo's `[0] IMPLICIT SET OF Attribute`.
pub fn attributes(list: &[Vec<u8>]) -> Vec<u8> {
    tlv(tag::CONTEXT_0, &list.concat())
}

/// A PKCS#10 request from raw parts; [`Pkcs10::sign`] adds the key and the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkcs10 {
    /// The version TLV (`INTEGER 0` for v1).
    pub version: Vec<u8>,
    /// The subject Name TLV.
    pub subject: Vec<u8>,
    /// The whole `[0]` attributes TLV (or anything else in its place; empty leaves it out).
    pub attributes: Vec<u8>,
    /// Bytes inside the CertificationRequestInfo after the attributes.
    pub info_trailing: Vec<u8>,
    /// Bytes after the signed request.
    pub trailing: Vec<u8>,
}

impl Pkcs10 {
    /// What a kubelet sends: v1, PrintableString subject, one extensionRequest attribute with the
    /// provider-ID extension.
    pub fn kubelet(node: &str, provider_id: &str) -> Self {
        Self {
            version: tlv(tag::INTEGER, &[0]),
            subject: kubelet_subject(node),
            attributes: attributes(&[extension_request(&[provider_id_extension(provider_id)])]),
            info_trailing: Vec::new(),
            trailing: Vec::new(),
        }
    }

    /// The DER request, signed with ECDSA P-256/SHA-256 by the shared P-256 test key.
    pub fn sign(&self) -> Vec<u8> {
        let key = crate::csr::key(KeyAlgorithm::EcdsaP256).key_pair();
        let info = seq(&[
            self.version.clone(),
            self.subject.clone(),
            key.subject_public_key_info(),
            self.attributes.clone(),
            self.info_trailing.clone(),
        ]);
        let signature = key.sign(&info).expect("signing");
        let mut bits = vec![0u8];
        bits.extend(signature);
        let mut der = seq(&[info, seq(&[oid(oids::ECDSA_WITH_SHA256)]), tlv(tag::BIT_STRING, &bits)]);
        der.extend_from_slice(&self.trailing);
        der
    }
}
