//! The signer's reading of AWS's identity-document PKCS#7 against OpenSSL's: for real AWS
//! signatures (BER, indefinite lengths) and this project's test CA, the document the signer
//! verifies is the one `openssl cms -verify` prints, and for every single-byte change of a real
//! signature the two agree on whether it still verifies (and, when it does, on the content).
//! Fails, not skips, without openssl: `scripts/deps` installs it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use attestation::aws::RegionCertificates;
use attestation::aws::pkcs7::SignedDocument;
use base64::Engine as _;

fn real(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../testdata/aws/{name}.p7b.b64"));
    let text: String = std::fs::read_to_string(path)
        .unwrap()
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

/// What OpenSSL makes of `pkcs7` with `certificate` as the signer's certificate: the content
/// when it verifies.
fn openssl(dir: &Path, pkcs7: &[u8], certificate_der: &[u8]) -> Option<Vec<u8>> {
    let input = dir.join("p7.der");
    let cert = dir.join("cert.pem");
    std::fs::write(&input, pkcs7).unwrap();
    std::fs::write(
        &cert,
        pem::encode(&pem::Pem::new("CERTIFICATE", certificate_der.to_vec())),
    )
    .unwrap();
    let out = Command::new("openssl")
        .args([
            "cms",
            "-verify",
            "-inform",
            "DER",
            "-binary",
            "-noverify",
            "-nointern",
            "-in",
        ])
        .arg(&input)
        .arg("-certfile")
        .arg(&cert)
        .output()
        .expect("openssl (scripts/deps installs it)");
    out.status.success().then_some(out.stdout)
}

fn ours(pkcs7: &[u8], certificate_der: &[u8]) -> Option<Vec<u8>> {
    let signed = SignedDocument::parse(pkcs7).ok()?;
    signed.verify(certificate_der).ok()?;
    Some(signed.content().to_vec())
}

#[test]
fn the_verified_document_is_openssls_for_real_and_test_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = RegionCertificates::shipped();
    for (name, region) in [
        ("teleport-instance1-us-west-2", "us-west-2"),
        ("teleport-instance2-us-west-1", "us-west-1"),
        ("vssm-us-east-1", "us-east-1"),
    ] {
        let cert = shipped.for_region(region).unwrap();
        let theirs = openssl(dir.path(), &real(name), cert).unwrap_or_else(|| panic!("openssl refuses {name}"));
        assert_eq!(ours(&real(name), cert), Some(theirs), "{name}");
    }
    let ca = tests::cloud::AwsIdentityCa::new();
    let doc = tests::cloud::document("123456789012", "i-0123456789abcdef0", "us-east-1", "us-east-1a");
    let der = ca.sign_document(&doc);
    for form in [der.clone(), tests::cloud::to_ber_indefinite(&der)] {
        let theirs = openssl(dir.path(), &form, ca.certificate_der()).unwrap();
        assert_eq!(theirs, doc);
        assert_eq!(ours(&form, ca.certificate_der()), Some(theirs));
    }
}

#[test]
fn every_single_byte_change_of_a_real_signature_is_judged_as_openssl_judges_it() {
    let dir = tempfile::tempdir().unwrap();
    let original = real("vssm-us-east-1");
    let shipped = RegionCertificates::shipped();
    let cert = shipped.for_region("us-east-1").unwrap();
    let mut disagreements = Vec::new();
    let mut accepted = 0;
    for at in 0..original.len() {
        let mut changed = original.clone();
        changed[at] ^= 0x40;
        let (a, b) = (ours(&changed, cert), openssl(dir.path(), &changed, cert));
        if a.is_some() {
            accepted += 1;
        }
        // Where the signer accepts, OpenSSL must accept with the same content. (OpenSSL reads
        // some encodings the strict reader refuses; the reverse must never happen.)
        if a.is_some() && a != b {
            disagreements.push(format!(
                "byte {at}: signer {:?}, openssl {:?}",
                a.map(|c| c.len()),
                b.map(|c| c.len())
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    eprintln!(
        "{} of {} single-byte changes still verify under both",
        accepted,
        original.len()
    );
}
