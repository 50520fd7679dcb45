//! The signer's reading of Azure's attested documents against OpenSSL's: for real documents
//! (`testdata/azure`) and this project's synthetic Azure, the statement the signer verifies is
//! the one `openssl cms -verify` prints with the shipped bundle at the document's own time, and
//! for every single-byte change of a real document the signer never accepts what OpenSSL
//! refuses, nor a different statement. (The signer is the stricter of the two by design: it also
//! requires the leaf to name a metadata domain and the statement to read.) Fails, not skips,
//! without openssl: `scripts/deps` installs it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use attestation::azure::{AzureVerifier, MicrosoftTrust, VirtualMachines, VmAnswer};
use attestation::tpm::challenge_key::ChallengeKey;
use base64::Engine as _;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

struct NoArm;

impl VirtualMachines for NoArm {
    fn answer(&self, _vm: &attestation::azure::AzureVm) -> VmAnswer {
        VmAnswer::NotAsked
    }
}

fn testdata() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/azure")
}

fn real(file: &str) -> Vec<u8> {
    let text: String = std::fs::read_to_string(testdata().join(file))
        .unwrap()
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

/// (file, verify_at) of the real documents expected to verify, with a subscription.
fn documents() -> Vec<(String, OffsetDateTime)> {
    std::fs::read_to_string(testdata().join("documents.tsv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|f| f.len() >= 8 && f[7] == "ok" && f[3] != "-")
        .map(|f| (f[0].to_owned(), OffsetDateTime::parse(f[2], &Rfc3339).unwrap()))
        .collect()
}

/// The shipped bundle as one PEM file for OpenSSL.
fn bundle_file(dir: &Path, pem: &str) -> std::path::PathBuf {
    let path = dir.join("bundle.pem");
    std::fs::write(&path, pem).unwrap();
    path
}

fn shipped_pem() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/components/azure-ca-bundle/bundle");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect()
}

/// What OpenSSL makes of `pkcs7` with `bundle` at `at`: the statement when it verifies.
fn openssl(dir: &Path, pkcs7: &[u8], bundle: &Path, at: OffsetDateTime) -> Option<Vec<u8>> {
    let input = dir.join("document.der");
    std::fs::write(&input, pkcs7).unwrap();
    let out = Command::new("openssl")
        .args([
            "cms",
            "-verify",
            "-inform",
            "DER",
            "-binary",
            "-purpose",
            "any",
            "-no-CApath",
            "-no-CAstore",
        ])
        .arg("-attime")
        .arg(at.unix_timestamp().to_string())
        .arg("-CAfile")
        .arg(bundle)
        .arg("-in")
        .arg(&input)
        .output()
        .expect("openssl (scripts/deps installs it)");
    out.status.success().then_some(out.stdout)
}

fn ours(verifier: &AzureVerifier, pkcs7: &[u8], at: OffsetDateTime) -> Option<Vec<u8>> {
    verifier.verified_document(pkcs7, at).ok()?;
    // The statement's bytes, as OpenSSL prints them.
    attestation::cloud::pkcs7::SignedStatement::parse(pkcs7, attestation::cloud::pkcs7::Profile::AZURE)
        .ok()
        .map(|s| s.content().to_vec())
}

fn verifier(trust: MicrosoftTrust) -> AzureVerifier {
    AzureVerifier::new(ChallengeKey::withheld(), Arc::new(NoArm)).with_trust(trust)
}

#[test]
fn the_verified_statement_is_openssls_for_real_and_synthetic_documents() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_file(dir.path(), &shipped_pem());
    let shipped = verifier(MicrosoftTrust::shipped());
    let documents = documents();
    assert!(documents.len() >= 14);
    for (file, at) in &documents {
        let document = real(file);
        let theirs = openssl(dir.path(), &document, &bundle, *at).unwrap_or_else(|| panic!("openssl refuses {file}"));
        assert_eq!(ours(&shipped, &document, *at), Some(theirs), "{file}");
    }
    let pki = tests::azure::AzurePki::new(&["eastus.metadata.azure.com"]);
    let now = OffsetDateTime::now_utc();
    let statement = tests::azure::statement("n", tests::azure::VM_ID, tests::azure::SUBSCRIPTION, now);
    let document = pki.sign(&statement);
    let synthetic = bundle_file(dir.path(), &pki.bundle_pem());
    let theirs = openssl(dir.path(), &document, &synthetic, now).unwrap();
    assert_eq!(theirs, statement);
    assert_eq!(ours(&verifier(pki.trust()), &document, now), Some(theirs));
}

#[test]
fn every_single_byte_change_of_a_real_document_is_never_accepted_where_openssl_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_file(dir.path(), &shipped_pem());
    let shipped = verifier(MicrosoftTrust::shipped());
    let (file, at) = documents()
        .into_iter()
        .find(|(f, _)| f.starts_with("taskcluster-public-2026"))
        .unwrap();
    let original = real(&file);
    let mut disagreements = Vec::new();
    let (mut accepted, mut openssl_only) = (0, 0);
    for index in 0..original.len() {
        let mut changed = original.clone();
        changed[index] ^= 0x40;
        let a = ours(&shipped, &changed, at);
        let b = openssl(dir.path(), &changed, &bundle, at);
        if a.is_some() {
            accepted += 1;
        }
        if a.is_none() && b.is_some() {
            openssl_only += 1;
        }
        if a.is_some() && a != b {
            disagreements.push(format!(
                "byte {index}: signer {:?}, openssl {:?}",
                a.map(|c| c.len()),
                b.map(|c| c.len())
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    eprintln!(
        "{file}: {accepted} of {} single-byte changes verify under both; {openssl_only} only under OpenSSL (the signer is stricter)",
        original.len()
    );
}
