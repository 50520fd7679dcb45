//! Real AWS instance identity signatures (`rsa2048`, PKCS#7 as AWS serves it) from public
//! test data, verified with the certificates the project ships. They prove the BER reading
//! and the signed-attribute verification against what AWS actually produces, not only
//! against what this project's test CA makes.

#![allow(clippy::unwrap_used)]

use attestation::aws::RegionCertificates;
use attestation::aws::document::IdentityDocument;
use attestation::aws::pkcs7::SignedDocument;
use base64::Engine as _;

fn sample(name: &str) -> Vec<u8> {
    let path = format!("{}/../testdata/aws/{name}.p7b.b64", env!("CARGO_MANIFEST_DIR"));
    let text: String = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

const SAMPLES: [(&str, &str); 3] = [
    ("teleport-instance1-us-west-2", "us-west-2"),
    ("teleport-instance2-us-west-1", "us-west-1"),
    ("vssm-us-east-1", "us-east-1"),
];

#[test]
fn real_documents_verify_with_their_regions_shipped_certificate() {
    let shipped = RegionCertificates::shipped();
    for (name, region) in SAMPLES {
        let signed = SignedDocument::parse(&sample(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let document = IdentityDocument::parse(signed.content()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(document.region, region, "{name}");
        let certificate = shipped.for_region(region).unwrap();
        signed.verify(certificate).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_real_document_fails_under_another_regions_certificate() {
    let shipped = RegionCertificates::shipped();
    let signed = SignedDocument::parse(&sample("vssm-us-east-1")).unwrap();
    let other = shipped.for_region("eu-west-1").unwrap();
    assert!(signed.verify(other).is_err());
}

#[test]
fn a_changed_byte_anywhere_in_a_real_document_never_verifies() {
    let shipped = RegionCertificates::shipped();
    let original = sample("teleport-instance1-us-west-2");
    let certificate = shipped.for_region("us-west-2").unwrap();
    for at in 0..original.len() {
        let mut changed = original.clone();
        changed[at] ^= 0x01;
        if let Ok(signed) = SignedDocument::parse(&changed) {
            // Some bytes (a tag's constructed bit, an unused length form) may still decode to
            // the same values; what decodes to other content must not verify.
            if signed.content() != SignedDocument::parse(&original).unwrap().content() {
                assert!(signed.verify(certificate).is_err(), "byte {at}");
            }
        }
    }
}
