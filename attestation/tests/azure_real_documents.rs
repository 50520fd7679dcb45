//! Real Azure attested documents (IMDS `/metadata/attested/document`, PKCS#7 as Azure serves
//! it) from public test data (`testdata/azure`, sources and licences in its README): each
//! verifies at its own time with the signer's shipped Microsoft bundle and yields the
//! statement Azure signed; each fails under another cloud's metadata domain, a day after its
//! leaf expired, and with any of a sample of single bytes changed. Azure's quirks are all
//! here for real: only the leaf embedded, `sha256WithRSAEncryption` as the digest algorithm, no
//! signed attributes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
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

struct Row {
    file: String,
    cloud: String,
    verify_at: OffsetDateTime,
    subscription_id: String,
    vm_id: String,
    nonce: String,
    leaf_dns: String,
    expected: String,
}

fn rows() -> Vec<Row> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/azure");
    std::fs::read_to_string(dir.join("documents.tsv"))
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            Row {
                file: f[0].to_owned(),
                cloud: f[1].to_owned(),
                verify_at: OffsetDateTime::parse(f[2], &Rfc3339).unwrap(),
                subscription_id: f[3].to_owned(),
                vm_id: f[4].to_owned(),
                nonce: f[5].to_owned(),
                leaf_dns: f[6].to_owned(),
                expected: f[7].to_owned(),
            }
        })
        .collect()
}

fn pkcs7(file: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/azure")
        .join(file);
    let text: String = std::fs::read_to_string(path)
        .unwrap()
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

fn verifier(trust: MicrosoftTrust) -> AzureVerifier {
    AzureVerifier::new(ChallengeKey::withheld(), Arc::new(NoArm)).with_trust(trust)
}

#[test]
fn the_shipped_bundle_loads_whole() {
    let (roots, intermediates) = MicrosoftTrust::shipped().len();
    assert_eq!(
        (roots, intermediates),
        (5, 22),
        "every certificate of config/components/azure-ca-bundle"
    );
}

#[test]
fn every_real_document_verifies_at_its_own_time_with_the_shipped_bundle() {
    let shipped = verifier(MicrosoftTrust::shipped());
    let rows = rows();
    assert!(rows.len() >= 15, "{} documents", rows.len());
    let mut verified = 0;
    for row in &rows {
        let result = shipped.verified_document(&pkcs7(&row.file), row.verify_at);
        match row.expected.as_str() {
            "ok" if row.subscription_id == "-" => {
                // IMDS before api-version 2018-10-01: signed and chained, but no subscription
                // to bind a provider ID to.
                let error = result.unwrap_err();
                assert!(error.contains("subscriptionId"), "{}: {error}", row.file);
            }
            "ok" => {
                let (document, leaf) = result.unwrap_or_else(|e| panic!("{}: {e}", row.file));
                assert_eq!(document.vm_id, row.vm_id, "{}", row.file);
                assert_eq!(document.subscription_id, row.subscription_id, "{}", row.file);
                assert_eq!(document.nonce, row.nonce, "{}", row.file);
                assert!(document.expires_on > row.verify_at, "{}", row.file);
                assert!(
                    leaf.ends_with(&format!("{} ({})", row.leaf_dns, cloud_name(&row.cloud)))
                        || leaf.contains(&format!(".{}", row.leaf_dns)),
                    "{}: {leaf}",
                    row.file
                );
                verified += 1;
            }
            "tampered" => {
                assert!(result.is_err(), "{}: a tampered document verified", row.file);
            }
            other => panic!("{}: unknown expectation {other}", row.file),
        }
    }
    assert!(verified >= 14, "{verified} documents verified");
}

fn cloud_name(cloud: &str) -> &'static str {
    match cloud {
        "public" => "Azure public cloud",
        "usgov" => "Azure US Government",
        _ => "Azure China (21Vianet)",
    }
}

#[test]
fn a_real_document_fails_under_another_clouds_domain_and_after_its_leaf_expired() {
    for row in rows().iter().filter(|r| r.expected == "ok" && r.subscription_id != "-") {
        let document = pkcs7(&row.file);
        let other = if row.cloud == "usgov" {
            "metadata.azure.com"
        } else {
            "metadata.azure.us"
        };
        let elsewhere = verifier(MicrosoftTrust::shipped().with_metadata_domains(&[other]).unwrap());
        let error = elsewhere.verified_document(&document, row.verify_at).unwrap_err();
        assert!(
            error.contains("none under the accepted metadata domains"),
            "{}: {error}",
            row.file
        );
        let own = row.leaf_dns.as_str();
        let here = verifier(MicrosoftTrust::shipped().with_metadata_domains(&[own]).unwrap());
        here.verified_document(&document, row.verify_at).unwrap();
        let long_after = row.verify_at + time::Duration::days(800);
        assert!(
            verifier(MicrosoftTrust::shipped())
                .verified_document(&document, long_after)
                .is_err(),
            "{}: verified after its leaf expired",
            row.file
        );
    }
}

#[test]
fn a_real_document_fails_without_its_chain_and_with_any_sampled_byte_changed() {
    let row = rows()
        .into_iter()
        .find(|r| r.file.starts_with("taskcluster-public-2026"))
        .unwrap();
    let document = pkcs7(&row.file);
    let shipped = verifier(MicrosoftTrust::shipped());
    shipped.verified_document(&document, row.verify_at).unwrap();
    // A bundle holding only an unrelated root: the leaf chains to nothing.
    let lonely = MicrosoftTrust::from_pem(
        include_str!("../../config/components/azure-ca-bundle/bundle/digicert-global-root-ca.pem").as_bytes(),
    )
    .unwrap();
    assert!(verifier(lonely).verified_document(&document, row.verify_at).is_err());
    // Every 7th byte, each flipped: whatever still parses must not verify, unless the change
    // falls where neither the signature, the chain nor the statement reads (then the statement
    // is still Azure's, byte for byte).
    let original = shipped.verified_document(&document, row.verify_at).unwrap().0;
    for index in (0..document.len()).step_by(7) {
        let mut bent = document.clone();
        bent[index] ^= 0x01;
        if let Ok((statement, _)) = shipped.verified_document(&bent, row.verify_at) {
            assert_eq!(
                statement, original,
                "byte {index} changed the statement and still verified"
            );
        }
    }
}
