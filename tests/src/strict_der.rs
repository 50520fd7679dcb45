//! Issued certificates are strict DER (SPEC section 3): a DEFAULT value is omitted, never
//! written out, and every other DER rule holds. Two independent checks:
//!
//! - Python `cryptography` (48 and later refuse, among others, BasicConstraints with `cA FALSE`
//!   written out) loads the certificate and reads every field and extension;
//! - the `der` crate decodes the certificate and each extension value it knows (SPEC section 3
//!   lists them) and encodes them again to the same bytes. `der` decodes an explicit DEFAULT
//!   and omits it on encoding, so such a value, like any other non-canonical encoding it
//!   accepts, shows as a difference.
//!
//! Neither skips: without Python `cryptography` the check fails, saying what to install
//! (`scripts/deps` does).

use std::io::Write;
use std::process::{Command, Stdio};

use der::asn1::{Any, BitString, Int, ObjectIdentifier, OctetString, SetOfVec, Utf8StringRef};
use der::{Choice, Decode, Encode, Sequence, ValueOrd};

/// BasicConstraints (2.5.29.19).
pub const BASIC_CONSTRAINTS: &str = "2.5.29.19";

/// Panics unless the DER certificate passes both strict checks (module documentation);
/// `what` names it in the message.
pub fn assert_strict_der(what: &str, certificate: &[u8]) {
    if let Err(why) = cryptography_loads(certificate) {
        panic!("{what}: Python cryptography refuses the certificate: {why}");
    }
    if let Err(why) = der_round_trips(certificate) {
        panic!("{what}: not strict DER: {why}");
    }
}

/// [`assert_strict_der`] on the first `CERTIFICATE` block of a PEM bundle (`status.certificate`,
/// the plugin's cached certificate): the issued certificate.
pub fn assert_strict_der_pem(what: &str, pem: &[u8]) {
    let blocks = pem::parse_many(pem).unwrap_or_else(|e| panic!("{what}: not PEM: {e}"));
    let Some(first) = blocks.iter().find(|b| b.tag() == "CERTIFICATE") else {
        panic!("{what}: no CERTIFICATE block");
    };
    assert_strict_der(what, first.contents());
}

/// The extension `oid` (dotted) of a DER certificate: whether it is critical, and its
/// extnValue's contents. `None` when the certificate has no such extension.
pub fn extension(certificate: &[u8], oid: &str) -> Option<(bool, Vec<u8>)> {
    let certificate = Certificate::from_der(certificate).expect("a DER certificate");
    let oid: ObjectIdentifier = oid.parse().expect("a dotted OID");
    certificate
        .tbs_certificate
        .extensions?
        .into_iter()
        .find(|e| e.extn_id == oid)
        .map(|e| (e.critical, e.extn_value.as_bytes().to_vec()))
}

/// Python `cryptography` loads the certificate and reads all it holds; `Err` with its complaint.
/// Panics when Python or `cryptography` is missing.
pub fn cryptography_loads(certificate: &[u8]) -> Result<(), String> {
    const SCRIPT: &str = "
import sys
try:
    from cryptography import x509
except ImportError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
cert = x509.load_der_x509_certificate(sys.stdin.buffer.read())
cert.serial_number, cert.issuer, cert.subject, cert.public_key()
cert.not_valid_before_utc, cert.not_valid_after_utc, cert.signature_algorithm_oid
for extension in cert.extensions:
    extension.value
";
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3 does not run ({e}): the strict DER check needs Python with cryptography"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(certificate)
        .expect("write to python3");
    let out = child.wait_with_output().expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok(()),
        Some(3) => panic!(
            "Python cryptography is not installed ({}): the strict DER check needs it; run scripts/deps or `pip install cryptography`",
            stderr.trim()
        ),
        _ => Err(stderr.lines().last().unwrap_or("python3 failed").to_owned()),
    }
}

/// The `der` crate decodes the certificate, and each extension value it knows, and encodes
/// them to the same bytes; `Err` names what differs.
pub fn der_round_trips(certificate: &[u8]) -> Result<(), String> {
    let decoded = round_trip::<Certificate>("the certificate", certificate)?;
    for extension in decoded.tbs_certificate.extensions.unwrap_or_default() {
        let value = extension.extn_value.as_bytes();
        let oid = extension.extn_id.to_string();
        let what = format!("extension {oid}");
        match oid.as_str() {
            BASIC_CONSTRAINTS => {
                round_trip::<BasicConstraints>(&what, value)?;
            }
            "2.5.29.14" => {
                round_trip::<OctetString>(&what, value)?;
            }
            "2.5.29.15" => named_bits(&what, &round_trip::<BitString>(&what, value)?)?,
            "2.5.29.35" => {
                round_trip::<AuthorityKeyIdentifier>(&what, value)?;
            }
            "2.5.29.37" => {
                round_trip::<Vec<ObjectIdentifier>>(&what, value)?;
            }
            attestation::names::PROVIDER_ID_OID_DOTTED => {
                round_trip::<Utf8StringRef<'_>>(&what, value)?;
            }
            _ => {
                round_trip::<Any>(&what, value)?;
            }
        }
    }
    Ok(())
}

fn round_trip<'a, T: Decode<'a, Error = der::Error> + Encode>(what: &str, bytes: &'a [u8]) -> Result<T, String> {
    let decoded = T::from_der(bytes).map_err(|e| format!("{what} does not decode: {e}"))?;
    let encoded = decoded
        .to_der()
        .map_err(|e| format!("{what} does not encode again: {e}"))?;
    if encoded != bytes {
        return Err(format!(
            "{what} is {} but its DER encoding is {}",
            hex(bytes),
            hex(&encoded)
        ));
    }
    Ok(decoded)
}

/// A named bit list (KeyUsage) in DER has no trailing zero bit (X.690 11.2.2).
fn named_bits(what: &str, bits: &BitString) -> Result<(), String> {
    if bits.bit_len() > 0 && bits.get(bits.bit_len() - 1) == Some(false) {
        return Err(format!("{what}: a named bit list ends in a zero bit"));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

#[derive(Sequence)]
struct Certificate {
    tbs_certificate: TbsCertificate,
    signature_algorithm: AlgorithmIdentifier,
    signature: BitString,
}

#[derive(Sequence)]
struct TbsCertificate {
    #[asn1(context_specific = "0", tag_mode = "EXPLICIT", optional = "true")]
    version: Option<u8>,
    serial_number: Int,
    signature: AlgorithmIdentifier,
    issuer: Vec<SetOfVec<AttributeTypeAndValue>>,
    validity: Validity,
    subject: Vec<SetOfVec<AttributeTypeAndValue>>,
    subject_public_key_info: SubjectPublicKeyInfo,
    #[asn1(context_specific = "1", tag_mode = "IMPLICIT", optional = "true")]
    issuer_unique_id: Option<BitString>,
    #[asn1(context_specific = "2", tag_mode = "IMPLICIT", optional = "true")]
    subject_unique_id: Option<BitString>,
    #[asn1(context_specific = "3", tag_mode = "EXPLICIT", optional = "true")]
    extensions: Option<Vec<Extension>>,
}

#[derive(Sequence)]
struct AlgorithmIdentifier {
    algorithm: ObjectIdentifier,
    parameters: Option<Any>,
}

#[derive(Clone, Sequence, ValueOrd)]
struct AttributeTypeAndValue {
    oid: ObjectIdentifier,
    value: Any,
}

#[derive(Sequence)]
struct Validity {
    not_before: Time,
    not_after: Time,
}

#[derive(Choice)]
enum Time {
    #[asn1(type = "UTCTime")]
    Utc(der::asn1::UtcTime),
    #[asn1(type = "GeneralizedTime")]
    General(der::asn1::GeneralizedTime),
}

#[derive(Sequence)]
struct SubjectPublicKeyInfo {
    algorithm: AlgorithmIdentifier,
    subject_public_key: BitString,
}

#[derive(Sequence)]
struct Extension {
    extn_id: ObjectIdentifier,
    #[asn1(default = "Default::default")]
    critical: bool,
    extn_value: OctetString,
}

#[derive(Sequence)]
struct BasicConstraints {
    #[asn1(default = "Default::default")]
    ca: bool,
    path_len_constraint: Option<u32>,
}

#[derive(Sequence)]
struct AuthorityKeyIdentifier {
    #[asn1(context_specific = "0", tag_mode = "IMPLICIT", optional = "true")]
    key_identifier: Option<OctetString>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(is_ca: rcgen::IsCa, custom_extensions: Vec<rcgen::CustomExtension>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "leaf");
        params.is_ca = is_ca;
        params.custom_extensions = custom_extensions;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn ca_false_written_out_fails_both_checks() {
        let certificate = self_signed(rcgen::IsCa::ExplicitNoCa, Vec::new());
        let refused = cryptography_loads(&certificate).unwrap_err();
        assert!(refused.contains("EncodedDefault"), "{refused}");
        let refused = der_round_trips(&certificate).unwrap_err();
        assert!(refused.contains("extension 2.5.29.19 is 30 03 01 01 00"), "{refused}");
    }

    #[test]
    fn ca_false_as_an_empty_sequence_passes_both_checks() {
        let mut basic_constraints = rcgen::CustomExtension::from_oid_content(&[2, 5, 29, 19], vec![0x30, 0x00]);
        basic_constraints.set_criticality(true);
        let certificate = self_signed(rcgen::IsCa::NoCa, vec![basic_constraints]);
        assert_strict_der("an empty BasicConstraints", &certificate);
        assert_eq!(
            extension(&certificate, BASIC_CONSTRAINTS),
            Some((true, vec![0x30, 0x00]))
        );
    }
}
