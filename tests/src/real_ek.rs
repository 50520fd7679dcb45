//! Real EK certificates (`testdata/tpm-real-ek/`) and the vendors' EK CA bundle
//! (`config/components/tpm-ek-ca-bundle/bundle/`), and the TPM public area a TPM holding such
//! an EK would report: the TCG default EK template (RSA-2048 or ECC P-256) around the
//! certificate's key, so the signer's chain check can be run on keys whose TPMs we do not have.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use x509_parser::prelude::FromDer;

/// The repository root.
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A real EK certificate (or NV dump) as published.
pub fn real_ek(file: &str) -> Vec<u8> {
    let path = root().join("testdata/tpm-real-ek").join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shipped bundle's folder.
pub fn bundle_dir() -> std::path::PathBuf {
    root().join("config/components/tpm-ek-ca-bundle/bundle")
}

/// Every shipped bundle file, concatenated in name order (what the signer reads from the folder).
pub fn shipped_bundle() -> Vec<u8> {
    let mut files: Vec<_> = std::fs::read_dir(bundle_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pem"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| std::fs::read(f).unwrap()).collect()
}

/// The TCG default EK policy (PolicySecret(endorsement)), in every default EK template.
const EK_POLICY: [u8; 32] = [
    0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5, 0xd7, 0x24, 0xfd, 0x52, 0xd7,
    0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
];

/// fixedTPM, fixedParent, sensitiveDataOrigin, adminWithPolicy, restricted, decrypt.
const EK_ATTRIBUTES: u32 = 0x0003_00b2;

fn tpm2b(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u16::try_from(bytes.len()).unwrap().to_be_bytes());
    out.extend_from_slice(bytes);
}

/// A DER length and the bytes after it.
fn der_length(bytes: &[u8]) -> (usize, &[u8]) {
    match bytes[0] {
        n @ 0..=0x7f => (usize::from(n), &bytes[1..]),
        0x81 => (usize::from(bytes[1]), &bytes[2..]),
        0x82 => (usize::from(bytes[1]) << 8 | usize::from(bytes[2]), &bytes[3..]),
        other => panic!("length form {other:#x}"),
    }
}

/// The modulus of a PKCS#1 RSAPublicKey (read by hand: `id-RSAES-OAEP` keys are not
/// rsaEncryption, so X.509 libraries often refuse to interpret them).
fn rsa_modulus(rsa_public_key: &[u8]) -> Vec<u8> {
    assert_eq!(rsa_public_key[0], 0x30);
    let (_, body) = der_length(&rsa_public_key[1..]);
    assert_eq!(body[0], 0x02);
    let (len, rest) = der_length(&body[1..]);
    let modulus = &rest[..len];
    modulus.iter().copied().skip_while(|b| *b == 0).collect()
}

/// The `TPM2B_PUBLIC` of the default EK template holding `certificate`'s key.
pub fn ek_public_of(certificate: &[u8]) -> Vec<u8> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(certificate).unwrap();
    let spki = cert.public_key();
    let mut area = Vec::new();
    let algorithm = spki.algorithm.algorithm.to_id_string();
    match algorithm.as_str() {
        // rsaEncryption, id-RSAES-OAEP
        "1.2.840.113549.1.1.1" | "1.2.840.113549.1.1.7" => {
            let modulus = rsa_modulus(&spki.subject_public_key.data);
            area.extend_from_slice(&0x0001u16.to_be_bytes());
            area.extend_from_slice(&0x000bu16.to_be_bytes());
            area.extend_from_slice(&EK_ATTRIBUTES.to_be_bytes());
            tpm2b(&mut area, &EK_POLICY);
            area.extend_from_slice(&[0x00, 0x06, 0x00, 0x80, 0x00, 0x43]); // AES-128-CFB
            area.extend_from_slice(&0x0010u16.to_be_bytes()); // scheme NULL
            area.extend_from_slice(&u16::try_from(modulus.len() * 8).unwrap().to_be_bytes());
            area.extend_from_slice(&0u32.to_be_bytes());
            tpm2b(&mut area, &modulus);
        }
        // id-ecPublicKey (P-256)
        "1.2.840.10045.2.1" => {
            let point = &spki.subject_public_key.data;
            assert_eq!((point.len(), point[0]), (65, 0x04), "an uncompressed P-256 point");
            area.extend_from_slice(&0x0023u16.to_be_bytes());
            area.extend_from_slice(&0x000bu16.to_be_bytes());
            area.extend_from_slice(&EK_ATTRIBUTES.to_be_bytes());
            tpm2b(&mut area, &EK_POLICY);
            area.extend_from_slice(&[0x00, 0x06, 0x00, 0x80, 0x00, 0x43]);
            area.extend_from_slice(&0x0010u16.to_be_bytes()); // scheme NULL
            area.extend_from_slice(&0x0003u16.to_be_bytes()); // NIST P-256
            area.extend_from_slice(&0x0010u16.to_be_bytes()); // kdf NULL
            tpm2b(&mut area, &point[1..33]);
            tpm2b(&mut area, &point[33..]);
        }
        other => panic!("EK key algorithm {other}"),
    }
    let mut public = Vec::new();
    tpm2b(&mut public, &area);
    public
}
