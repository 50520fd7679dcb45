//! Fixtures for the cloud identity suites (`gcp/v1`, `aws/v1`, SPEC section 5): a Google that
//! signs Compute Engine identity tokens, an AWS that signs instance identity documents, and
//! loopback stand-ins for the endpoints the node and the signer reach.
//!
//! - [`GoogleSigner`]: RSA-2048 keys with Google's kids, their JWKS, RS256 tokens of the
//!   `format=full` shape, key rotation, and the classic forgeries (`alg: none`, HS256 keyed
//!   with the public key).
//! - [`AwsIdentityCa`]: a region certificate of our own and the `rsa2048` PKCS#7 exactly as AWS
//!   lays it out (DER, and [`to_ber_indefinite`] for AWS's indefinite-length BER form), plus
//!   [`document`], an identity document of AWS's shape.
//! - [`GceMetadataStandIn`], [`ImdsV2StandIn`]: the metadata servers, plain HTTP/1.1 on
//!   127.0.0.1 (the values for `GCE_METADATA_HOST` and `AWS_EC2_METADATA_SERVICE_ENDPOINT`).
//! - [`JwksServer`]: Google's certs URL over HTTPS with a CA of its own.
//!
//! The servers answer one connection at a time on a thread of their own (`Connection: close`,
//! `Content-Length` answers, bounded reads with timeouts) and stop when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aws_lc_rs::encoding::AsDer as _;
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine as _;
use rasn::types::{Any, OctetString, SetOf};
use rasn_cms::pkcs7_compat::{EncapsulatedContentInfo, SignedData};
use rasn_cms::{
    AlgorithmIdentifier, Attribute, CONTENT_DATA, CONTENT_SIGNED_DATA, CONTENT_TYPE, ContentInfo,
    IssuerAndSerialNumber, MESSAGE_DIGEST, SIGNING_TIME, SignerIdentifier, SignerInfo,
};
use serde_json::{Value, json};
use time::OffsetDateTime;

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A decimal number of `digits` digits (no leading zero) derived from `seed`: stable
/// project numbers and service-account IDs.
fn stable_number(seed: &str, digits: u32) -> String {
    let hash = sha256(seed.as_bytes());
    let mut out = String::new();
    for (i, byte) in hash.iter().cycle().take(digits as usize).enumerate() {
        let digit = if i == 0 { 1 + byte % 9 } else { byte % 10 };
        out.push(char::from(b'0' + digit));
    }
    out
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn rfc3339(at: OffsetDateTime) -> String {
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339)
        .expect("an RFC 3339 time")
}

// ------------------------------------------------------------------------------------------
// Google: identity tokens
// ------------------------------------------------------------------------------------------

/// One signing key of [`GoogleSigner`].
struct GoogleSigningKey {
    kid: String,
    pair: aws_lc_rs::rsa::KeyPair,
}

impl GoogleSigningKey {
    fn generate() -> Self {
        let pair = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("an RSA-2048 key");
        // Google's kids are 40 hex digits; derive them from the key so they are stable for it.
        let components = aws_lc_rs::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public_key());
        let kid = hex(&sha256(&components.n)[..20]);
        Self { kid, pair }
    }
}

/// A stand-in for Google's identity-token signing: one or more RSA-2048 keys (the newest is
/// the current one), their JWKS, and RS256 tokens.
pub struct GoogleSigner {
    keys: Vec<GoogleSigningKey>,
}

impl std::fmt::Debug for GoogleSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleSigner").field("kids", &self.kids()).finish()
    }
}

impl Default for GoogleSigner {
    fn default() -> Self {
        Self::new()
    }
}

impl GoogleSigner {
    /// A signer with one fresh key.
    pub fn new() -> Self {
        Self::with_keys(1)
    }

    /// A signer with `count` fresh keys (Google usually publishes two); at least one.
    pub fn with_keys(count: usize) -> Self {
        Self {
            keys: (0..count.max(1)).map(|_| GoogleSigningKey::generate()).collect(),
        }
    }

    /// Adds a new key, which becomes the current one; returns its kid. Older keys stay
    /// published until [`GoogleSigner::retire`]d, as Google does.
    pub fn rotate(&mut self) -> String {
        let key = GoogleSigningKey::generate();
        let kid = key.kid.clone();
        self.keys.push(key);
        kid
    }

    /// Stops publishing (and signing with) the key `kid`; whether it was there. The last key
    /// is never removed.
    pub fn retire(&mut self, kid: &str) -> bool {
        let before = self.keys.len();
        if before > 1 {
            self.keys.retain(|k| k.kid != kid);
        }
        self.keys.len() != before
    }

    /// Every published kid, oldest first.
    pub fn kids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.kid.clone()).collect()
    }

    /// The kid of the current (newest) key.
    pub fn current_kid(&self) -> String {
        self.keys.last().map(|k| k.kid.clone()).unwrap_or_default()
    }

    fn key(&self, kid: &str) -> &GoogleSigningKey {
        self.keys
            .iter()
            .find(|k| k.kid == kid)
            .unwrap_or_else(|| panic!("GoogleSigner has no key {kid:?} (kids {:?})", self.kids()))
    }

    /// The SubjectPublicKeyInfo DER of the key `kid` (panics on an unknown kid).
    pub fn public_key_der(&self, kid: &str) -> Vec<u8> {
        self.key(kid)
            .pair
            .public_key()
            .as_der()
            .expect("SubjectPublicKeyInfo DER")
            .as_ref()
            .to_vec()
    }

    /// The published key set, in Google's shape:
    /// `{"keys":[{"kty":"RSA","alg":"RS256","use":"sig","kid":..,"n":..,"e":..}]}` with `n`
    /// and `e` base64url without padding.
    pub fn jwks(&self) -> String {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                let components = aws_lc_rs::rsa::PublicKeyComponents::<Vec<u8>>::from(k.pair.public_key());
                json!({
                    "kty": "RSA",
                    "alg": "RS256",
                    "use": "sig",
                    "kid": k.kid,
                    "n": b64url(&components.n),
                    "e": b64url(&components.e),
                })
            })
            .collect();
        json!({ "keys": keys }).to_string()
    }

    /// An RS256 token signed with the key `kid` (panics on an unknown kid), header
    /// `{"alg":"RS256","kid":..,"typ":"JWT"}`.
    pub fn token(&self, kid: &str, claims: Value) -> String {
        let key = self.key(kid);
        let header = json!({"alg": "RS256", "kid": kid, "typ": "JWT"});
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let mut signature = vec![0; key.pair.public_modulus_len()];
        key.pair
            .sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                input.as_bytes(),
                &mut signature,
            )
            .expect("an RS256 signature");
        format!("{input}.{}", b64url(&signature))
    }

    /// A token made with [`GoogleSigner::token`] by the current key.
    pub fn current_token(&self, claims: Value) -> String {
        self.token(&self.current_kid(), claims)
    }

    /// The claims of a Compute Engine identity token requested with `format=full`: `iss`
    /// `https://accounts.google.com`, `aud`, `azp`/`sub` (the service account's numeric ID),
    /// `email`, `exp = iat + 3600`, `iat`, and `google.compute_engine` with `project_id`,
    /// `project_number`, `zone`, `instance_id`, `instance_name` and
    /// `instance_creation_timestamp` (numbers derived from the names, so stable).
    pub fn claims(
        audience: &str,
        project_id: &str,
        zone: &str,
        instance_id: &str,
        instance_name: &str,
        iat: i64,
    ) -> Value {
        let project_number = stable_number(project_id, 12);
        let service_account = stable_number(&format!("sa/{project_id}"), 21);
        json!({
            "aud": audience,
            "azp": service_account,
            "email": format!("{project_number}-compute@developer.gserviceaccount.com"),
            "email_verified": true,
            "exp": iat + 3600,
            "google": {
                "compute_engine": {
                    "instance_creation_timestamp": iat - 86_400,
                    "instance_id": instance_id,
                    "instance_name": instance_name,
                    "project_id": project_id,
                    "project_number": project_number.parse::<u64>().expect("a 12-digit number"),
                    "zone": zone,
                }
            },
            "iat": iat,
            "iss": "https://accounts.google.com",
            "sub": service_account,
        })
    }

    /// A compact JWS with an arbitrary header and signature (`alg: none`, a forged `kid`, a
    /// `crit` list, ...). An empty `signature` gives the `header.payload.` form of `alg: none`.
    pub fn token_with_header(header: Value, claims: Value, signature: &[u8]) -> String {
        format!(
            "{}.{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes()),
            b64url(signature)
        )
    }

    /// The algorithm-confusion forgery: header `{"alg":"HS256","kid":kid,"typ":"JWT"}`, signed
    /// with HMAC-SHA256 keyed with the key's public SubjectPublicKeyInfo DER
    /// ([`GoogleSigner::public_key_der`]): what a verifier that lets the header pick the
    /// algorithm would accept as "verified with Google's key".
    pub fn hs256_with_rsa_public_key(&self, kid: &str, claims: Value) -> String {
        let secret = self.public_key_der(kid);
        let header = json!({"alg": "HS256", "kid": kid, "typ": "JWT"});
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &secret);
        let tag = aws_lc_rs::hmac::sign(&key, input.as_bytes());
        format!("{input}.{}", b64url(tag.as_ref()))
    }
}

/// A Compute Engine instance, as its identity tokens name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceInstance {
    /// Project ID (a name).
    pub project_id: String,
    /// Zone, e.g. `europe-west1-b`.
    pub zone: String,
    /// Numeric instance ID.
    pub instance_id: String,
    /// Instance name.
    pub instance_name: String,
}

impl GceInstance {
    /// An instance.
    pub fn new(project_id: &str, zone: &str, instance_id: &str, instance_name: &str) -> Self {
        Self {
            project_id: project_id.to_owned(),
            zone: zone.to_owned(),
            instance_id: instance_id.to_owned(),
            instance_name: instance_name.to_owned(),
        }
    }

    /// `gce://<project_id>/<zone>/<instance_name>`, Cluster API's provider ID for it.
    pub fn provider_id(&self) -> String {
        format!("gce://{}/{}/{}", self.project_id, self.zone, self.instance_name)
    }

    /// The hostname the metadata server gives it (`instance/hostname`): its zonal internal DNS
    /// name, `<instance_name>.<zone>.c.<project_id>.internal`.
    pub fn hostname(&self) -> String {
        format!("{}.{}.c.{}.internal", self.instance_name, self.zone, self.project_id)
    }

    /// [`GoogleSigner::claims`] for this instance.
    pub fn claims(&self, audience: &str, iat: i64) -> Value {
        GoogleSigner::claims(
            audience,
            &self.project_id,
            &self.zone,
            &self.instance_id,
            &self.instance_name,
            iat,
        )
    }
}

// ------------------------------------------------------------------------------------------
// AWS: instance identity documents
// ------------------------------------------------------------------------------------------

/// `sha256` with NULL parameters, as AWS writes it.
fn sha256_algorithm() -> AlgorithmIdentifier {
    AlgorithmIdentifier {
        algorithm: rasn::types::Oid::JOINT_ISO_ITU_T_COUNTRY_US_ORGANIZATION_GOV_CSOR_NIST_ALGORITHMS_HASH_SHA256
            .to_owned(),
        parameters: Some(Any::new(vec![0x05, 0x00])),
    }
}

/// `rsaEncryption` with NULL parameters.
fn rsa_encryption() -> AlgorithmIdentifier {
    AlgorithmIdentifier {
        algorithm: rasn::types::Oid::ISO_MEMBER_BODY_US_RSADSI_PKCS1_RSA.to_owned(),
        parameters: Some(Any::new(vec![0x05, 0x00])),
    }
}

fn der<T: rasn::Encode>(what: &str, value: &T) -> Vec<u8> {
    rasn::der::encode(value).unwrap_or_else(|e| panic!("{what} does not encode: {e}"))
}

/// A UTCTime (`YYMMDDHHMMSSZ`), DER.
fn utc_time(at: OffsetDateTime) -> Vec<u8> {
    let text = format!(
        "{:02}{:02}{:02}{:02}{:02}{:02}Z",
        at.year().rem_euclid(100),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    );
    let mut out = vec![0x17, 13];
    out.extend_from_slice(text.as_bytes());
    out
}

/// A test stand-in for AWS's regional identity-document signing: an RSA-2048 key and a
/// self-signed certificate carrying it (subject like AWS's: `C=US, ST=Washington State,
/// L=Seattle, O=Amazon Web Services LLC`).
pub struct AwsIdentityCa {
    key: aws_lc_rs::rsa::KeyPair,
    certificate_der: Vec<u8>,
    certificate_pem: String,
    issuer_and_serial: IssuerAndSerialNumber,
}

impl std::fmt::Debug for AwsIdentityCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsIdentityCa")
            .field("serial", &self.issuer_and_serial.serial_number)
            .finish_non_exhaustive()
    }
}

impl Default for AwsIdentityCa {
    fn default() -> Self {
        Self::new()
    }
}

impl AwsIdentityCa {
    /// A fresh key and certificate (valid 2020 to 2120, a random serial).
    pub fn new() -> Self {
        let key = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("an RSA-2048 key");
        let pkcs8 = key.as_der().expect("PKCS#8 of the RSA key");
        let rcgen_key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &rustls::pki_types::PrivatePkcs8KeyDer::from(pkcs8.as_ref()),
            &rcgen::PKCS_RSA_SHA256,
        )
        .expect("rcgen takes the RSA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("certificate parameters");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CountryName, "US");
        params
            .distinguished_name
            .push(rcgen::DnType::StateOrProvinceName, "Washington State");
        params.distinguished_name.push(rcgen::DnType::LocalityName, "Seattle");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Amazon Web Services LLC");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2120, 1, 1);
        let mut serial = [0u8; 9];
        aws_lc_rs::rand::fill(&mut serial).expect("random bytes");
        serial[0] = (serial[0] & 0x7f) | 0x01;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let certificate = params.self_signed(&rcgen_key).expect("a self-signed certificate");
        let certificate_der = certificate.der().to_vec();
        let decoded: rasn_cms::Certificate =
            rasn::der::decode(&certificate_der).expect("rasn reads the certificate it signs for");
        Self {
            key,
            certificate_pem: certificate.pem(),
            issuer_and_serial: IssuerAndSerialNumber {
                issuer: decoded.tbs_certificate.issuer.clone(),
                serial_number: decoded.tbs_certificate.serial_number.clone(),
            },
            certificate_der,
        }
    }

    /// The certificate, DER.
    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate_der
    }

    /// The certificate, PEM.
    pub fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// The certificate in the `--aws-iid-certificates` format that
    /// `attestation::aws::RegionCertificates::from_pem` reads: `# regions: r1, r2` then the PEM.
    pub fn regions_pem(&self, regions: &[&str]) -> String {
        format!("# regions: {}\n{}", regions.join(", "), self.certificate_pem)
    }

    /// [`AwsIdentityCa::sign_document_at`] now.
    pub fn sign_document(&self, document_json: &[u8]) -> Vec<u8> {
        self.sign_document_at(document_json, OffsetDateTime::now_utc())
    }

    /// The `rsa2048` PKCS#7 (DER) of `document_json`, laid out as AWS's: ContentInfo
    /// (signedData) { version 1, digestAlgorithms {sha256}, encapContentInfo {id-data, [0]
    /// OCTET STRING document}, no certificates, one SignerInfo { version 1,
    /// issuerAndSerialNumber of this certificate, sha256, signedAttrs [0] {contentType id-data,
    /// signingTime `signing_time` (UTCTime), messageDigest}, rsaEncryption, RSA-PKCS1-SHA256 over
    /// the DER of the signed attributes as a SET } }.
    pub fn sign_document_at(&self, document_json: &[u8], signing_time: OffsetDateTime) -> Vec<u8> {
        let attribute = |oid: &rasn::types::Oid, value_der: Vec<u8>| Attribute {
            r#type: oid.to_owned(),
            values: SetOf::from_vec(vec![Any::new(value_der)]),
        };
        let mut attributes = vec![
            attribute(CONTENT_TYPE, der("the content type", &CONTENT_DATA.to_owned())),
            attribute(SIGNING_TIME, utc_time(signing_time.to_offset(time::UtcOffset::UTC))),
            attribute(
                MESSAGE_DIGEST,
                der("the digest", &OctetString::from(sha256(document_json))),
            ),
        ];
        // DER sorts a SET OF by its elements' encodings; do it here whatever the encoder does.
        attributes.sort_by_cached_key(|a| der("an attribute", a));
        let signed_attrs = SetOf::from_vec(attributes);
        let to_sign = der("the signed attributes", &signed_attrs);
        let mut signature = vec![0; self.key.public_modulus_len()];
        self.key
            .sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                &to_sign,
                &mut signature,
            )
            .expect("an RSA signature");
        let signer = SignerInfo {
            version: 1.into(),
            sid: SignerIdentifier::IssuerAndSerialNumber(self.issuer_and_serial.clone()),
            digest_algorithm: sha256_algorithm(),
            signed_attrs: Some(signed_attrs),
            signature_algorithm: rsa_encryption(),
            signature: OctetString::from(signature),
            unsigned_attrs: None,
        };
        let signed_data = SignedData {
            version: 1.into(),
            digest_algorithms: SetOf::from_vec(vec![sha256_algorithm()]),
            encap_content_info: EncapsulatedContentInfo {
                content_type: CONTENT_DATA.to_owned(),
                content: Some(Any::new(der(
                    "the document",
                    &OctetString::from(document_json.to_vec()),
                ))),
            },
            certificates: None,
            crls: None,
            signer_infos: SetOf::from_vec(vec![signer]),
        };
        let info = ContentInfo {
            content_type: CONTENT_SIGNED_DATA.to_owned(),
            content: Any::new(der("the SignedData", &signed_data)),
        };
        der("the ContentInfo", &info)
    }
}

/// An instance identity document in AWS's shape (pretty-printed as the metadata service
/// serves it): accountId, architecture, availabilityZone, billingProducts null,
/// devpayProductCodes null, marketplaceProductCodes null, imageId, instanceId, instanceType,
/// kernelId null, pendingTime, privateIp, ramdiskId null, region, version `2017-09-30`.
pub fn document(account: &str, instance: &str, region: &str, az: &str) -> Vec<u8> {
    let s = |v: &str| Value::from(v).to_string();
    let fields = [
        ("accountId", s(account)),
        ("architecture", s("x86_64")),
        ("availabilityZone", s(az)),
        ("billingProducts", "null".to_owned()),
        ("devpayProductCodes", "null".to_owned()),
        ("marketplaceProductCodes", "null".to_owned()),
        ("imageId", s("ami-0abcdef1234567890")),
        ("instanceId", s(instance)),
        ("instanceType", s("m5.large")),
        ("kernelId", "null".to_owned()),
        ("pendingTime", s("2026-01-01T00:00:00Z")),
        ("privateIp", s("10.0.1.23")),
        ("ramdiskId", "null".to_owned()),
        ("region", s(region)),
        ("version", s("2017-09-30")),
    ];
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("  \"{k}\" : {v}")).collect();
    format!("{{\n{}\n}}", body.join(",\n")).into_bytes()
}

/// The base64 body `dynamic/instance-identity/rsa2048` serves for `pkcs7`: standard base64
/// broken into 64-character lines.
pub fn rsa2048_body(pkcs7: &[u8]) -> String {
    let text = base64::engine::general_purpose::STANDARD.encode(pkcs7);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    lines.join("\n")
}

/// One DER TLV: (tag, whole element, contents, rest). Low tag numbers only, which is all a
/// PKCS#7 holds.
fn tlv(bytes: &[u8]) -> (u8, &[u8], &[u8], &[u8]) {
    let (&tag, after_tag) = bytes.split_first().expect("a TLV, not the end of input");
    let (&first, after_first) = after_tag.split_first().expect("a length");
    let (length, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        assert!((1..=4).contains(&count), "a definite DER length, not 0x{first:02x}");
        let length = after_first[..count]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (length, 2 + count)
    };
    let end = header + length;
    assert!(bytes.len() >= end, "a TLV of {end} bytes in {}", bytes.len());
    (tag, &bytes[..end], &bytes[header..end], &bytes[end..])
}

/// `tag 0x80 parts... 0x00 0x00`.
fn indefinite(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![tag, 0x80];
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// Rewrites a DER `rsa2048` PKCS#7 ([`AwsIdentityCa::sign_document`]) into AWS's BER form:
/// the ContentInfo SEQUENCE, its `[0]`, the SignedData SEQUENCE, the encapContentInfo
/// SEQUENCE and its `[0]` get indefinite lengths (`0x80 ... 0x00 0x00`), and the document
/// becomes a constructed OCTET STRING (`0x24 0x80`) holding one primitive chunk, as AWS's
/// starts `30 80 06 09 .. a0 80 30 80 02 01 01 31 .. 30 80 06 09 .. a0 80 24 80 04 82 ..`.
/// The signer infos stay DER. Panics on input that is not such a PKCS#7.
pub fn to_ber_indefinite(der: &[u8]) -> Vec<u8> {
    let (tag, _, content_info, rest) = tlv(der);
    assert!(tag == 0x30 && rest.is_empty(), "a ContentInfo SEQUENCE");
    let (_, oid, _, after_oid) = tlv(content_info);
    let (tag, _, explicit, _) = tlv(after_oid);
    assert_eq!(tag, 0xa0, "ContentInfo [0]");
    let (tag, _, mut signed_data, _) = tlv(explicit);
    assert_eq!(tag, 0x30, "a SignedData SEQUENCE");
    let mut fields: Vec<Vec<u8>> = Vec::new();
    while !signed_data.is_empty() {
        let (tag, whole, contents, rest) = tlv(signed_data);
        signed_data = rest;
        if fields.len() == 2 {
            // encapContentInfo { eContentType, [0] OCTET STRING }
            assert_eq!(tag, 0x30, "an EncapsulatedContentInfo SEQUENCE");
            let (_, e_type, _, after_type) = tlv(contents);
            let (tag, _, e_explicit, _) = tlv(after_type);
            assert_eq!(tag, 0xa0, "eContent [0]");
            let (tag, octets, _, _) = tlv(e_explicit);
            assert_eq!(tag, 0x04, "an OCTET STRING");
            let chunked = indefinite(0x24, &[octets]);
            let e_content = indefinite(0xa0, &[&chunked]);
            fields.push(indefinite(0x30, &[e_type, &e_content]));
        } else {
            fields.push(whole.to_vec());
        }
    }
    let parts: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
    let signed_data = indefinite(0x30, &parts);
    let explicit = indefinite(0xa0, &[&signed_data]);
    indefinite(0x30, &[oid, &explicit])
}

// ------------------------------------------------------------------------------------------
// A small HTTP/1.1 server
// ------------------------------------------------------------------------------------------

/// Largest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest request body read.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long a connection may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(2);

/// A parsed request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    pub(crate) fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
        }
    }

    pub(crate) fn text(status: u16, body: &str) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body)
    }

    fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a query value, a form
/// field), as the suites' small HTTP clients send them.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `%XX` decoding; `+` is a space, as in a form-encoded query.
pub(crate) fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let pair = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding at byte {i} of {text:?}"))?;
                out.push(pair);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} does not decode to UTF-8"))
}

/// Reads one request (head and any `Content-Length` body, which is discarded).
fn read_request(stream: &mut impl Read) -> Result<Request, (u16, String)> {
    let bad = |why: String| (400u16, why);
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            if at > MAX_HEAD_BYTES {
                return Err((413, format!("a request head over {MAX_HEAD_BYTES} bytes")));
            }
            break at;
        }
        if buffer.len() > MAX_HEAD_BYTES {
            return Err((413, format!("a request head over {MAX_HEAD_BYTES} bytes")));
        }
        let read = stream
            .read(&mut chunk)
            .map_err(|e| bad(format!("reading the request: {e}")))?;
        if read == 0 {
            return Err(bad("the connection closed before the request head ended".into()));
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = std::str::from_utf8(&buffer[..head_end]).map_err(|_| bad("the request head is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(format!("a malformed request line {request_line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("not HTTP/1.x: {version:?}")));
    }
    let (path, query_text) = target.split_once('?').unwrap_or((target, ""));
    let mut query = Vec::new();
    for pair in query_text.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        query.push((percent_decode(name).map_err(bad)?, percent_decode(value).map_err(bad)?));
    }
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("a malformed header line {line:?}")))?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let mut request = Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        headers,
        body: Vec::new(),
    };
    let length = match request.header("Content-Length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| bad(format!("a malformed Content-Length {v:?}")))?,
    };
    if length > MAX_BODY_BYTES {
        return Err((413, format!("a body of {length} bytes, over {MAX_BODY_BYTES}")));
    }
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let read = stream
            .read(&mut chunk)
            .map_err(|e| bad(format!("reading the request body: {e}")))?;
        if read == 0 {
            return Err(bad("the connection closed inside the request body".into()));
        }
        body.extend_from_slice(&chunk[..read]);
    }
    body.truncate(length);
    request.body = body;
    Ok(request)
}

fn write_response(stream: &mut impl Write, response: &Response) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", response.status, reason(response.status));
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        response.body.len()
    ));
    stream.write_all(head.as_bytes())?;
    stream.write_all(&response.body)?;
    stream.flush()
}

/// Reads a request from `stream`, answers it with `handler` (or 400/413), and writes the
/// answer.
pub(crate) fn serve_one(stream: &mut (impl Read + Write), handler: &mut dyn FnMut(&Request) -> Response) {
    let response = match read_request(stream) {
        Ok(request) => handler(&request),
        Err((status, why)) => Response::text(status, &why),
    };
    // A client that went away is no error of ours.
    let _ = write_response(stream, &response);
}

/// An accept loop on 127.0.0.1:0 in a thread of its own, one connection at a time, stopped
/// (and joined) on drop.
pub(crate) struct Loop {
    pub(crate) address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Loop {
    pub(crate) fn start(name: &str, mut connection: impl FnMut(TcpStream) + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let address = listener.local_addr().expect("the listener's address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                while !stopped.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let usable = stream.set_nonblocking(false).is_ok()
                                && stream.set_read_timeout(Some(IO_TIMEOUT)).is_ok()
                                && stream.set_write_timeout(Some(IO_TIMEOUT)).is_ok();
                            if usable {
                                connection(stream);
                            }
                        }
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })
            .expect("a server thread");
        Self {
            address,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An HTTP loop: `handler` answers every request.
pub(crate) fn http_loop(name: &str, mut handler: impl FnMut(&Request) -> Response + Send + 'static) -> Loop {
    Loop::start(name, move |mut stream| serve_one(&mut stream, &mut handler))
}

// ------------------------------------------------------------------------------------------
// The Compute Engine metadata server
// ------------------------------------------------------------------------------------------

/// The project number the stand-in's instances live in (`instance/zone` names it).
pub const GCE_PROJECT_NUMBER: &str = "469871241317";

/// The identity endpoint of the metadata server.
pub const GCE_IDENTITY_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/identity";

/// A loopback Compute Engine metadata server answering
/// `GET /computeMetadata/v1/instance/service-accounts/default/identity?audience=..&format=full`
/// with a token minted at the time of the request by the signer's current key, and what
/// cloud-init's GCE datasource reads ([`GceMetadataStandIn::instance_metadata`]). Like the real
/// one, it requires `Metadata-Flavor: Google` and refuses `X-Forwarded-For` (403), and answers
/// with `Metadata-Flavor: Google`; without `format=full` the token has no `google` claim.
pub struct GceMetadataStandIn {
    server: Loop,
    requests: Arc<AtomicUsize>,
    tokens: Arc<AtomicUsize>,
    iat_offset: Arc<AtomicI64>,
    audiences: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for GceMetadataStandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceMetadataStandIn")
            .field("host", &self.host())
            .finish_non_exhaustive()
    }
}

impl GceMetadataStandIn {
    /// Starts it for `instance`, minting with `signer`'s current key.
    pub fn start(signer: Arc<Mutex<GoogleSigner>>, instance: GceInstance) -> Self {
        let requests = Arc::new(AtomicUsize::new(0));
        let tokens = Arc::new(AtomicUsize::new(0));
        let iat_offset = Arc::new(AtomicI64::new(0));
        let audiences = Arc::new(Mutex::new(Vec::new()));
        let (r, t, o, a) = (requests.clone(), tokens.clone(), iat_offset.clone(), audiences.clone());
        let server = http_loop("gce-metadata", move |request| {
            r.fetch_add(1, Ordering::SeqCst);
            let flavored = |response: Response| response.with_header("Metadata-Flavor", "Google");
            if request.header("X-Forwarded-For").is_some() || request.header("Metadata-Flavor") != Some("Google") {
                return flavored(Response::text(
                    403,
                    "Missing Metadata-Flavor:Google header or X-Forwarded-For present",
                ));
            }
            if request.method != "GET" {
                return flavored(Response::text(405, "Method Not Allowed"));
            }
            if request.path != GCE_IDENTITY_PATH {
                return flavored(match Self::instance_metadata(&instance, request) {
                    Some((content_type, body)) => Response::new(200, content_type, body),
                    None => Response::text(404, "Not Found"),
                });
            }
            let Some(audience) = request.query("audience").filter(|a| !a.is_empty()) else {
                return flavored(Response::text(400, "non-empty audience parameter required"));
            };
            let iat = OffsetDateTime::now_utc().unix_timestamp() + o.load(Ordering::SeqCst);
            let mut claims = instance.claims(audience, iat);
            if request.query("format") != Some("full")
                && let Some(object) = claims.as_object_mut()
            {
                object.remove("google");
            }
            let token = lock(&signer).current_token(claims);
            t.fetch_add(1, Ordering::SeqCst);
            lock(&a).push(audience.to_owned());
            flavored(Response::text(200, &token))
        });
        Self {
            server,
            requests,
            tokens,
            iat_offset,
            audiences,
        }
    }

    /// The instance's own metadata as the server serves it (content type and body), for
    /// `instance/id`, `instance/name`, `instance/zone` (`projects/<number>/zones/<zone>`),
    /// `instance/hostname` ([`GceInstance::hostname`]), `project/project-id`,
    /// `project/numeric-project-id`, and `instance/attributes/` and `project/attributes/` with
    /// `recursive=true` (none set: `{}`); `None` for any other path.
    fn instance_metadata(instance: &GceInstance, request: &Request) -> Option<(&'static str, String)> {
        let text = |value: &str| Some(("application/text", value.to_owned()));
        let recursive = request
            .query("recursive")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        match request.path.strip_prefix("/computeMetadata/v1/")? {
            "instance/id" => text(&instance.instance_id),
            "instance/name" => text(&instance.instance_name),
            "instance/zone" => text(&format!("projects/{GCE_PROJECT_NUMBER}/zones/{}", instance.zone)),
            "instance/hostname" => text(&instance.hostname()),
            "project/project-id" => text(&instance.project_id),
            "project/numeric-project-id" => text(GCE_PROJECT_NUMBER),
            "instance/attributes/" | "project/attributes/" if recursive => Some(("application/json", "{}".to_owned())),
            _ => None,
        }
    }

    /// `127.0.0.1:<port>`: the value for `GCE_METADATA_HOST`.
    pub fn host(&self) -> String {
        self.server.address.to_string()
    }

    /// Requests received (answered or refused).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Tokens minted.
    pub fn tokens(&self) -> usize {
        self.tokens.load(Ordering::SeqCst)
    }

    /// The audiences tokens were minted for, percent-decoded, in order.
    pub fn audiences(&self) -> Vec<String> {
        lock(&self.audiences).clone()
    }

    /// Shifts the `iat` of tokens minted from now on by `seconds` (negative: stale tokens).
    pub fn set_iat_offset(&self, seconds: i64) {
        self.iat_offset.store(seconds, Ordering::SeqCst);
    }
}

// ------------------------------------------------------------------------------------------
// The EC2 instance metadata service (IMDSv2)
// ------------------------------------------------------------------------------------------

/// The instance role's credentials as the metadata service hands them out.
#[derive(Clone, PartialEq, Eq)]
pub struct RoleCredentials {
    /// `AccessKeyId` (`ASIA...`).
    pub access_key_id: String,
    /// `SecretAccessKey`.
    pub secret_access_key: String,
    /// `Token` (the session token).
    pub token: String,
}

impl std::fmt::Debug for RoleCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl From<(&str, &str, &str)> for RoleCredentials {
    fn from((access_key_id, secret_access_key, token): (&str, &str, &str)) -> Self {
        Self {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
            token: token.to_owned(),
        }
    }
}

/// Most session tokens remembered at once (older ones are forgotten).
const MAX_IMDS_TOKENS: usize = 64;

struct ImdsState {
    rsa2048: String,
    role: String,
    credentials: RoleCredentials,
    tokens: Vec<(String, Instant)>,
    meta_data: std::collections::BTreeMap<String, String>,
}

/// A loopback EC2 instance metadata service with IMDSv2 required: `PUT /latest/api/token`
/// (with `X-aws-ec2-metadata-token-ttl-seconds`, 1 to 21600) hands out a random session token;
/// every GET needs `X-aws-ec2-metadata-token` naming a live one (401 otherwise) and serves
/// `/latest/dynamic/instance-identity/rsa2048` and the `meta-data` tree under `/latest/` or a
/// dated version (`/2021-03-23/`, as cloud-init asks): `iam/security-credentials/` (the role's
/// name), `iam/security-credentials/<role>` (the credentials JSON), the entries given to
/// [`ImdsV2StandIn::set_meta_data`] (`local-hostname`, `placement/availability-zone`, ...), and
/// each folder's listing (one name a line, a folder's ending in `/`). `X-Forwarded-For` is
/// refused (403), as the real service does.
pub struct ImdsV2StandIn {
    server: Loop,
    state: Arc<Mutex<ImdsState>>,
    requests: Arc<AtomicUsize>,
}

impl std::fmt::Debug for ImdsV2StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsV2StandIn")
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

fn credentials_json(credentials: &RoleCredentials) -> String {
    let now = OffsetDateTime::now_utc();
    let s = |v: &str| Value::from(v).to_string();
    format!(
        "{{\n  \"Code\" : \"Success\",\n  \"LastUpdated\" : {},\n  \"Type\" : \"AWS-HMAC\",\n  \"AccessKeyId\" : {},\n  \"SecretAccessKey\" : {},\n  \"Token\" : {},\n  \"Expiration\" : {}\n}}",
        s(&rfc3339(now - time::Duration::minutes(5))),
        s(&credentials.access_key_id),
        s(&credentials.secret_access_key),
        s(&credentials.token),
        s(&rfc3339(now + time::Duration::hours(6))),
    )
}

fn imds_answer(state: &Mutex<ImdsState>, request: &Request) -> Response {
    const TTL: &str = "X-aws-ec2-metadata-token-ttl-seconds";
    if request.header("X-Forwarded-For").is_some() {
        return Response::text(403, "Forbidden");
    }
    if request.path == "/latest/api/token" {
        if request.method != "PUT" {
            return Response::text(405, "Method Not Allowed");
        }
        let Some(ttl) = request
            .header(TTL)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|t| (1..=21_600).contains(t))
        else {
            return Response::text(400, "Bad Request");
        };
        let mut random = [0u8; 32];
        if aws_lc_rs::rand::fill(&mut random).is_err() {
            return Response::text(503, "no randomness");
        }
        let token = base64::engine::general_purpose::STANDARD.encode(random);
        let mut state = lock(state);
        state.tokens.retain(|(_, until)| *until > Instant::now());
        if state.tokens.len() >= MAX_IMDS_TOKENS {
            state.tokens.remove(0);
        }
        state
            .tokens
            .push((token.clone(), Instant::now() + Duration::from_secs(ttl)));
        return Response::text(200, &token).with_header(TTL, &ttl.to_string());
    }
    if request.method != "GET" {
        return Response::text(405, "Method Not Allowed");
    }
    let state = lock(state);
    let now = Instant::now();
    let authorized = request
        .header("X-aws-ec2-metadata-token")
        .is_some_and(|t| state.tokens.iter().any(|(token, until)| token == t && *until > now));
    if !authorized {
        return Response::text(401, "Unauthorized");
    }
    if request.path == "/latest/dynamic/instance-identity/rsa2048" {
        return Response::text(200, &state.rsa2048);
    }
    // /<version>/meta-data/<entry>: "latest" or a dated version such as 2021-03-23.
    let Some((version, entry)) = request
        .path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .and_then(|(version, rest)| Some((version, rest.strip_prefix("meta-data/")?)))
    else {
        return Response::text(404, "Not Found");
    };
    let dated = version.len() == 10 && version.chars().all(|c| c.is_ascii_digit() || c == '-');
    if version != "latest" && !dated {
        return Response::text(404, "Not Found");
    }
    let mut tree = state.meta_data.clone();
    tree.insert(
        format!("iam/security-credentials/{}", state.role),
        credentials_json(&state.credentials),
    );
    if let Some(value) = tree.get(entry) {
        return Response::text(200, value);
    }
    // A folder: its children's names, a folder's with its `/`.
    if entry.is_empty() || entry.ends_with('/') {
        let mut children: Vec<&str> = tree
            .keys()
            .filter_map(|key| key.strip_prefix(entry))
            .map(|rest| rest.find('/').map_or(rest, |slash| &rest[..=slash]))
            .collect();
        children.dedup();
        if !children.is_empty() {
            return Response::text(200, &children.join("\n"));
        }
    }
    Response::text(404, "Not Found")
}

impl ImdsV2StandIn {
    /// Starts it serving `rsa2048_b64` (see [`rsa2048_body`]) and `credentials` of the
    /// instance role `role`.
    pub fn start(rsa2048_b64: String, role: &str, credentials: impl Into<RoleCredentials>) -> Self {
        let state = Arc::new(Mutex::new(ImdsState {
            rsa2048: rsa2048_b64,
            role: role.to_owned(),
            credentials: credentials.into(),
            tokens: Vec::new(),
            meta_data: std::collections::BTreeMap::new(),
        }));
        let requests = Arc::new(AtomicUsize::new(0));
        let (s, r) = (state.clone(), requests.clone());
        let server = http_loop("imds-v2", move |request| {
            r.fetch_add(1, Ordering::SeqCst);
            imds_answer(&s, request)
        });
        Self {
            server,
            state,
            requests,
        }
    }

    /// `http://127.0.0.1:<port>/`: the value for `AWS_EC2_METADATA_SERVICE_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}/", self.server.address)
    }

    /// Replaces the role's credentials (what the metadata service does before they expire).
    pub fn set_credentials(&self, credentials: impl Into<RoleCredentials>) {
        lock(&self.state).credentials = credentials.into();
    }

    /// Replaces the `rsa2048` body.
    pub fn set_rsa2048(&self, rsa2048_b64: String) {
        lock(&self.state).rsa2048 = rsa2048_b64;
    }

    /// Serves these `meta-data` entries (path under `meta-data/`, value), as EC2 does for the
    /// instance: `local-hostname`, `instance-id`, `placement/availability-zone`, ...
    pub fn set_meta_data(&self, entries: &[(&str, &str)]) {
        lock(&self.state).meta_data = entries
            .iter()
            .map(|(path, value)| ((*path).to_owned(), (*value).to_owned()))
            .collect();
    }

    /// Forgets every session token handed out (as a reboot of the service would).
    pub fn revoke_tokens(&self) {
        lock(&self.state).tokens.clear();
    }

    /// Requests received (answered or refused).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

// ------------------------------------------------------------------------------------------
// Google's certs URL over HTTPS
// ------------------------------------------------------------------------------------------

/// The path of Google's JWKS.
pub const JWKS_PATH: &str = "/oauth2/v3/certs";

/// A loopback HTTPS server of Google's keys: `GET /oauth2/v3/certs` answers the signer's
/// current JWKS with `Cache-Control: public, max-age=60` (adjustable). Its certificate, for
/// IP 127.0.0.1 and `localhost`, is issued by a CA of its own ([`JwksServer::ca_pem`]).
pub struct JwksServer {
    server: Loop,
    ca_pem: String,
    fetches: Arc<AtomicUsize>,
    max_age: Arc<AtomicU64>,
    failing: Arc<AtomicU16>,
}

impl std::fmt::Debug for JwksServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksServer")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

pub(crate) fn tls_config() -> (Arc<rustls::ServerConfig>, String) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tests::cloud JWKS CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("a self-signed CA");
    let key = rcgen::KeyPair::generate().expect("a server key");
    let mut params = rcgen::CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "www.googleapis.com".to_owned(),
        // Azure's, for the ARM stand-in reached through an egress proxy by name.
        "management.azure.com".to_owned(),
        "login.microsoftonline.com".to_owned(),
    ])
    .expect("server parameters");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "www.googleapis.com stand-in");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let certificate = params.signed_by(&key, &ca).expect("a server certificate");
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![certificate.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("a TLS server configuration");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (Arc::new(config), ca.pem())
}

impl JwksServer {
    /// Starts it serving `signer`'s keys.
    pub fn start(signer: Arc<Mutex<GoogleSigner>>) -> Self {
        let (config, ca_pem) = tls_config();
        let fetches = Arc::new(AtomicUsize::new(0));
        let max_age = Arc::new(AtomicU64::new(60));
        let failing = Arc::new(AtomicU16::new(0));
        let (f, m, x) = (fetches.clone(), max_age.clone(), failing.clone());
        let mut handler = move |request: &Request| {
            if request.path != JWKS_PATH {
                return Response::text(404, "Not Found");
            }
            if request.method != "GET" {
                return Response::text(405, "Method Not Allowed");
            }
            f.fetch_add(1, Ordering::SeqCst);
            match x.load(Ordering::SeqCst) {
                0 => Response::new(200, "application/json; charset=UTF-8", lock(&signer).jwks()).with_header(
                    "Cache-Control",
                    &format!(
                        "public, max-age={}, must-revalidate, no-transform",
                        m.load(Ordering::SeqCst)
                    ),
                ),
                status => Response::text(status, "unavailable"),
            }
        };
        let server = Loop::start("jwks-https", move |tcp| {
            let Ok(connection) = rustls::ServerConnection::new(config.clone()) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(connection, tcp);
            serve_one(&mut tls, &mut handler);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        Self {
            server,
            ca_pem,
            fetches,
            max_age,
            failing,
        }
    }

    /// `https://127.0.0.1:<port>/oauth2/v3/certs`: the value for `--gcp-jwks-url`.
    pub fn url(&self) -> String {
        format!("https://{}{JWKS_PATH}", self.server.address)
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.server.address
    }

    /// The CA that issued its certificate, PEM (for `--cloud-ca-bundle`).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// How many times the JWKS was asked for (answered or failed with
    /// [`JwksServer::set_failing`]).
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// The `max-age` of the answers from now on, in seconds.
    pub fn set_max_age(&self, seconds: u64) {
        self.max_age.store(seconds, Ordering::SeqCst);
    }

    /// Answers the JWKS with this status (e.g. 503) instead of the keys; `None` restores it.
    pub fn set_failing(&self, status: Option<u16>) {
        self.failing.store(status.unwrap_or(0), Ordering::SeqCst);
    }
}

/// The plugin (`program`) in exec mode for `node`, with `env` (the metadata endpoints) set for
/// it alone and every ambient metadata variable removed.
#[allow(clippy::too_many_arguments)]
pub fn plugin_exec(
    program: &std::path::Path,
    bootstrap: &std::path::Path,
    cert_dir: &std::path::Path,
    node: &str,
    provider_id: &str,
    attestor: &str,
    env: &[(&str, String)],
) -> std::process::Output {
    let mut command = std::process::Command::new(program);
    command
        .args(["--bootstrap-kubeconfig", bootstrap.to_str().expect("UTF-8 path")])
        .args(["--cert-dir", cert_dir.to_str().expect("UTF-8 path")])
        .args([
            "--node-name",
            node,
            "--provider-id",
            provider_id,
            "--attestor",
            attestor,
            // The GCE renewal across a key rotation waits for the signer's next fetch of
            // Google's keys (at most one a minute): well within this, for a renewal too (whose
            // own default, 20 s, would answer the current certificate and retry later).
            "--timeout",
            "150s",
            "--renewal-timeout",
            "150s",
        ])
        .env_remove("KUBERNETES_EXEC_INFO")
        .env_remove("GCE_METADATA_HOST")
        .env_remove("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .env_remove("AWS_ENDPOINT_URL_STS");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the plugin runs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use attestation::aws::RegionCertificates;
    use attestation::aws::pkcs7::SignedDocument;
    use attestation::gcp::Jwks;
    use attestation::gcp::jwt::{JwtError, SignedToken};

    /// A raw HTTP/1.1 exchange; returns (status, head, body).
    fn exchange(stream: &mut (impl Read + Write), request: &str) -> (u16, String, Vec<u8>) {
        stream.write_all(request.as_bytes()).expect("request written");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("answer read");
        let at = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an answer head");
        let head = String::from_utf8(answer[..at].to_vec()).expect("a UTF-8 head");
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status");
        (status, head, answer[at + 4..].to_vec())
    }

    fn http(address: &str, request: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(address).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let (status, head, body) = exchange(&mut stream, request);
        (status, head, String::from_utf8(body).expect("a UTF-8 body"))
    }

    fn claims_of(token: &str) -> Value {
        let payload = token.split('.').nth(1).expect("a payload");
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .expect("base64url"),
        )
        .expect("JSON claims")
    }

    #[test]
    fn google_tokens_verify_with_the_published_keys_across_a_rotation() {
        let mut signer = GoogleSigner::new();
        let first = signer.current_kid();
        assert_eq!(first.len(), 40);
        let jwks: Value = serde_json::from_str(&signer.jwks()).unwrap();
        let key = &jwks["keys"][0];
        assert_eq!(
            (&key["kty"], &key["alg"], &key["use"], &key["e"]),
            (&json!("RSA"), &json!("RS256"), &json!("sig"), &json!("AQAB"))
        );
        assert_eq!(key["n"].as_str().unwrap().len(), 342, "2048 bits, no padding");

        let instance = GceInstance::new("proj-1", "europe-west1-b", "4567890123456789012", "worker-0");
        assert_eq!(instance.provider_id(), "gce://proj-1/europe-west1-b/worker-0");
        let claims = instance.claims("node-attestation.cluster.x-k8s.io/B", 1_800_000_000);
        assert_eq!(claims["exp"], 1_800_003_600);
        assert!(claims["google"]["compute_engine"]["project_number"].is_u64());
        let token = signer.token(&first, claims.clone());
        let header: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header, json!({"alg": "RS256", "kid": first, "typ": "JWT"}));

        let second = signer.rotate();
        assert_eq!(signer.kids(), [first.clone(), second.clone()]);
        let set = Jwks::parse(signer.jwks().as_bytes()).unwrap();
        for (kid, token) in [(&first, token), (&second, signer.current_token(claims))] {
            let parsed = SignedToken::parse(&token).unwrap();
            assert_eq!(parsed.kid(), kid);
            let verified = parsed.verify(set.get(kid).unwrap()).unwrap();
            assert_eq!(verified.iss, "https://accounts.google.com");
            assert_eq!(verified.aud, "node-attestation.cluster.x-k8s.io/B");
            let engine = verified.google.unwrap().compute_engine.unwrap();
            assert_eq!(
                (
                    engine.project_id.as_str(),
                    engine.zone.as_str(),
                    engine.instance_name.as_str()
                ),
                ("proj-1", "europe-west1-b", "worker-0")
            );
            assert_eq!(engine.instance_id, "4567890123456789012");
        }
        // A token signed by one key does not verify under the other.
        let wrong = SignedToken::parse(&signer.token(&first, json!({})))
            .unwrap()
            .verify(set.get(&second).unwrap());
        assert!(matches!(wrong, Err(JwtError::Signature { .. })), "{wrong:?}");

        assert!(signer.retire(&first));
        assert_eq!(signer.kids(), std::slice::from_ref(&second));
        assert!(!signer.retire(&second), "the last key stays");
        assert!(Jwks::parse(signer.jwks().as_bytes()).unwrap().get(&first).is_none());
    }

    #[test]
    fn forged_headers_are_made_as_asked_and_refused_by_the_parser() {
        let signer = GoogleSigner::new();
        let kid = signer.current_kid();
        let claims = GoogleSigner::claims("aud", "p", "z", "1", "n", 1_800_000_000);

        let none = GoogleSigner::token_with_header(json!({"alg": "none", "kid": kid}), claims.clone(), b"");
        assert!(none.ends_with('.'));
        assert_eq!(
            SignedToken::parse(&none).unwrap_err(),
            JwtError::Algorithm("none".into())
        );

        let hs = signer.hs256_with_rsa_public_key(&kid, claims.clone());
        let (input, signature) = hs.rsplit_once('.').unwrap();
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &signer.public_key_der(&kid));
        aws_lc_rs::hmac::verify(
            &key,
            input.as_bytes(),
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(signature)
                .unwrap(),
        )
        .expect("HMAC keyed with the public key");
        assert_eq!(claims_of(&hs), claims);
        assert_eq!(
            SignedToken::parse(&hs).unwrap_err(),
            JwtError::Algorithm("HS256".into())
        );
    }

    #[test]
    fn aws_documents_verify_in_der_and_in_aws_ber_form() {
        let ca = AwsIdentityCa::new();
        let doc = document("123456789012", "i-0123456789abcdef0", "eu-west-1", "eu-west-1a");
        let parsed = attestation::aws::IdentityDocument::parse(&doc).unwrap();
        assert_eq!(parsed.provider_id(), "aws:///eu-west-1a/i-0123456789abcdef0");
        let shape: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(shape["billingProducts"], Value::Null);
        assert_eq!(shape["version"], "2017-09-30");

        let set = RegionCertificates::from_pem(&ca.regions_pem(&["eu-west-1", "eu-central-1"])).unwrap();
        assert_eq!(set.regions().collect::<Vec<_>>(), ["eu-west-1", "eu-central-1"]);
        let certificate = set.for_region("eu-west-1").unwrap();
        assert_eq!(certificate, ca.certificate_der());

        let der = ca.sign_document(&doc);
        assert_eq!(&der[..2], [0x30, 0x82]);
        let ber = to_ber_indefinite(&der);
        assert_eq!(&ber[..4], [0x30, 0x80, 0x06, 0x09]);
        assert!(ber.ends_with(&[0; 6]));
        let encap_start = [
            0x30, 0x80, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01, 0xa0, 0x80, 0x24, 0x80, 0x04,
        ];
        assert!(
            ber.windows(encap_start.len()).any(|w| w == encap_start),
            "AWS's eContent layout"
        );
        for (form, bytes) in [("DER", &der), ("BER", &ber)] {
            let signed = SignedDocument::parse(bytes).unwrap_or_else(|e| panic!("{form}: {e}"));
            assert_eq!(signed.content(), doc.as_slice(), "{form}");
            signed.verify(certificate).unwrap_or_else(|e| panic!("{form}: {e}"));
        }

        // Another CA's certificate, or a changed document, does not verify.
        let other = AwsIdentityCa::new();
        assert!(
            SignedDocument::parse(&der)
                .unwrap()
                .verify(other.certificate_der())
                .is_err()
        );
        let mut changed = der.clone();
        let at = changed.windows(12).position(|w| w == b"123456789012").unwrap();
        changed[at] = b'9';
        assert!(SignedDocument::parse(&changed).is_err(), "the digest no longer matches");
    }

    #[test]
    fn openssl_verifies_both_forms() {
        if std::process::Command::new("openssl").arg("version").output().is_err() {
            println!("NOTE: openssl is not on PATH; the OpenSSL cross-check is skipped");
            return;
        }
        let ca = AwsIdentityCa::new();
        let doc = document("123456789012", "i-0abc1234def567890", "us-east-1", "us-east-1c");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.certificate_pem()).unwrap();
        let der = ca.sign_document(&doc);
        for (name, bytes) in [("der", der.clone()), ("ber", to_ber_indefinite(&der))] {
            let file = dir.path().join(format!("p7.{name}"));
            std::fs::write(&file, bytes).unwrap();
            for command in ["smime", "cms"] {
                let output = std::process::Command::new("openssl")
                    .args([
                        command,
                        "-verify",
                        "-inform",
                        "DER",
                        "-binary",
                        "-noverify",
                        "-nointern",
                        "-certfile",
                    ])
                    .arg(dir.path().join("ca.pem"))
                    .arg("-in")
                    .arg(&file)
                    .output()
                    .unwrap();
                assert!(
                    output.status.success(),
                    "openssl {command} {name}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                assert_eq!(output.stdout, doc, "openssl {command} {name}");
            }
        }
    }

    #[test]
    fn the_gce_metadata_stand_in_mints_tokens_for_the_asked_audience() {
        let signer = Arc::new(Mutex::new(GoogleSigner::new()));
        let instance = GceInstance::new("proj-1", "us-central1-a", "123", "worker-1");
        let metadata = GceMetadataStandIn::start(signer.clone(), instance);
        let host = metadata.host();
        let path = format!("{GCE_IDENTITY_PATH}?audience=node-attestation.cluster.x-k8s.io%2FAb-_c&format=full");

        let (status, _, _) = http(&host, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n"));
        assert_eq!(status, 403);
        let (status, _, _) = http(
            &host,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nMetadata-Flavor: Google\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n"
            ),
        );
        assert_eq!(status, 403);
        let (status, _, _) = http(
            &host,
            &format!("GET {GCE_IDENTITY_PATH}?format=full HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n"),
        );
        assert_eq!(status, 400);
        let (status, _, _) = http(
            &host,
            "GET /computeMetadata/v1/other HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n",
        );
        assert_eq!(status, 404);

        let (status, head, token) = http(
            &host,
            &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nmetadata-flavor: Google\r\n\r\n"),
        );
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("Metadata-Flavor: Google"), "{head}");
        assert!(head.contains(&format!("Content-Length: {}", token.len())), "{head}");
        let set = Jwks::parse(lock(&signer).jwks().as_bytes()).unwrap();
        let parsed = SignedToken::parse(&token).unwrap();
        let claims = parsed.verify(set.get(parsed.kid()).unwrap()).unwrap();
        assert_eq!(claims.aud, "node-attestation.cluster.x-k8s.io/Ab-_c");
        assert!((claims.iat - OffsetDateTime::now_utc().unix_timestamp()).abs() < 60);
        assert_eq!(claims.google.unwrap().compute_engine.unwrap().instance_name, "worker-1");

        // After a rotation the current key signs; a stale offset moves iat; no format=full,
        // no google claim.
        let kid = lock(&signer).rotate();
        metadata.set_iat_offset(-3600);
        let (_, _, token) = http(
            &host,
            &format!("GET {GCE_IDENTITY_PATH}?audience=a+b HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n"),
        );
        assert_eq!(SignedToken::parse(&token).unwrap().kid(), kid);
        let claims = claims_of(&token);
        assert!(claims.get("google").is_none());
        assert!(claims["iat"].as_i64().unwrap() < OffsetDateTime::now_utc().unix_timestamp() - 3000);
        assert_eq!(metadata.audiences(), ["node-attestation.cluster.x-k8s.io/Ab-_c", "a b"]);
        assert_eq!((metadata.requests(), metadata.tokens()), (6, 2));

        // Garbage gets a 400, not a dead server.
        let (status, _, _) = http(&host, "NONSENSE\r\n\r\n");
        assert_eq!(status, 400);
        let started = Instant::now();
        drop(metadata);
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(TcpStream::connect(&host).is_err() || http_refused(&host));
    }

    /// After drop nothing answers: a connect may still succeed only if the port was reused.
    fn http_refused(host: &str) -> bool {
        let mut stream = TcpStream::connect(host).expect("connect");
        stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let _ = stream.write_all(b"GET / HTTP/1.1\r\n\r\n");
        let mut buffer = [0u8; 16];
        !matches!(stream.read(&mut buffer), Ok(n) if n > 0)
    }

    #[test]
    fn the_imds_stand_in_requires_v2_sessions() {
        let ca = AwsIdentityCa::new();
        let doc = document("123456789012", "i-0123456789abcdef0", "us-east-1", "us-east-1a");
        let body = rsa2048_body(&ca.sign_document(&doc));
        assert!(body.lines().all(|l| l.len() <= 64) && body.contains('\n'));
        let imds = ImdsV2StandIn::start(body.clone(), "node-role", ("ASIAEXAMPLE", "secret", "session"));
        let endpoint = imds.endpoint();
        let host = endpoint
            .strip_prefix("http://")
            .and_then(|h| h.strip_suffix('/'))
            .unwrap()
            .to_owned();
        let get = |path: &str, token: &str| {
            http(
                &host,
                &format!("GET {path} HTTP/1.1\r\nHost: 169.254.169.254\r\nX-aws-ec2-metadata-token: {token}\r\n\r\n"),
            )
        };

        let (status, _, _) = http(&host, "GET /latest/dynamic/instance-identity/rsa2048 HTTP/1.1\r\n\r\n");
        assert_eq!(status, 401);
        let (status, _, _) = http(&host, "PUT /latest/api/token HTTP/1.1\r\n\r\n");
        assert_eq!(status, 400);
        let (status, head, token) = http(
            &host,
            "PUT /latest/api/token HTTP/1.1\r\nX-aws-ec2-metadata-token-ttl-seconds: 21600\r\nContent-Length: 0\r\n\r\n",
        );
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("X-aws-ec2-metadata-token-ttl-seconds: 21600"));
        assert_eq!(get("/latest/dynamic/instance-identity/rsa2048", "wrong").0, 401);

        let (status, _, served) = get("/latest/dynamic/instance-identity/rsa2048", &token);
        assert_eq!((status, served.as_str()), (200, body.as_str()));
        let data = attestation::aws::AwsData {
            rsa2048: served,
            sts: serde_json::from_value(json!({"headers": {}, "body": ""})).unwrap(),
        };
        let signed = SignedDocument::parse(&data.pkcs7().unwrap()).unwrap();
        signed.verify(ca.certificate_der()).unwrap();
        assert_eq!(signed.content(), doc.as_slice());

        assert_eq!(
            get("/latest/meta-data/iam/security-credentials/", &token).2,
            "node-role"
        );
        assert_eq!(get("/latest/meta-data/iam/security-credentials/other", &token).0, 404);
        let (status, _, credentials) = get("/latest/meta-data/iam/security-credentials/node-role", &token);
        assert_eq!(status, 200);
        let credentials: Value = serde_json::from_str(&credentials).unwrap();
        assert_eq!(
            (&credentials["Code"], &credentials["Type"], &credentials["AccessKeyId"]),
            (&json!("Success"), &json!("AWS-HMAC"), &json!("ASIAEXAMPLE"))
        );
        assert_eq!(
            (&credentials["SecretAccessKey"], &credentials["Token"]),
            (&json!("secret"), &json!("session"))
        );
        assert!(credentials["Expiration"].as_str().unwrap().ends_with('Z'));

        imds.set_credentials(("ASIANEW", "secret2", "session2"));
        let (_, _, credentials) = get("/latest/meta-data/iam/security-credentials/node-role", &token);
        assert!(credentials.contains("ASIANEW") && credentials.contains("session2"));
        imds.revoke_tokens();
        assert_eq!(get("/latest/meta-data/iam/security-credentials/", &token).0, 401);
        assert_eq!(imds.requests(), 10);
    }

    fn tls_get(server: &JwksServer, ca_pem: &str) -> Result<(u16, String, Vec<u8>), String> {
        let mut roots = rustls::RootCertStore::empty();
        for block in pem::parse_many(ca_pem).unwrap() {
            roots.add(block.contents().to_vec().into()).unwrap();
        }
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let tcp = TcpStream::connect(server.address()).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, tcp);
        let request = format!("GET {JWKS_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        tls.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).map_err(|e| e.to_string())?;
        let at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8(answer[..at].to_vec()).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        Ok((status, head, answer[at + 4..].to_vec()))
    }

    #[test]
    fn the_jwks_server_serves_the_current_keys_over_tls() {
        let signer = Arc::new(Mutex::new(GoogleSigner::new()));
        let server = JwksServer::start(signer.clone());
        assert!(server.url().starts_with("https://127.0.0.1:") && server.url().ends_with("/oauth2/v3/certs"));

        let (status, head, body) = tls_get(&server, &server.ca_pem()).unwrap();
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("Cache-Control: public, max-age=60"), "{head}");
        let kid = lock(&signer).current_kid();
        assert_eq!(Jwks::parse(&body).unwrap().kids(), [kid.as_str()]);

        let rotated = lock(&signer).rotate();
        server.set_max_age(5);
        let (_, head, body) = tls_get(&server, &server.ca_pem()).unwrap();
        assert!(head.contains("max-age=5,"), "{head}");
        assert_eq!(Jwks::parse(&body).unwrap().kids(), [kid.as_str(), rotated.as_str()]);

        server.set_failing(Some(503));
        assert_eq!(tls_get(&server, &server.ca_pem()).unwrap().0, 503);
        server.set_failing(None);
        assert_eq!(server.fetches(), 3);

        // Another CA is not trusted.
        let (_, stranger) = tls_config();
        assert!(tls_get(&server, &stranger).is_err());
        assert_eq!(server.fetches(), 3);

        // curl agrees, when it is there.
        let ca_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca_file.path(), server.ca_pem()).unwrap();
        match std::process::Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "10", "--cacert"])
            .arg(ca_file.path())
            .arg(server.url())
            .output()
        {
            Ok(output) => {
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
                assert_eq!(Jwks::parse(&output.stdout).unwrap().kids().len(), 2);
                assert_eq!(server.fetches(), 4);
            }
            Err(_) => println!("NOTE: curl is not on PATH; the curl cross-check is skipped"),
        }
    }

    #[test]
    fn percent_decoding_and_request_limits() {
        assert_eq!(percent_decode("a%2Fb+c%3d").unwrap(), "a/b c=");
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%2").is_err());
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(read_request(&mut huge.as_bytes()).unwrap_err().0, 413);
        let body = "POST / HTTP/1.1\r\nContent-Length: 999999\r\n\r\n";
        assert_eq!(read_request(&mut body.as_bytes()).unwrap_err().0, 413);
        let short = "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert_eq!(read_request(&mut short.as_bytes()).unwrap_err().0, 400);
    }
}
