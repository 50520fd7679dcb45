//! Hostile bytes against the cloud providers' parsers: a mutated real AWS PKCS#7, a mutated
//! identity token or JWKS, and arbitrary DATA blocks through the whole rule engine are answered
//! with a value or an error, never a panic, and a mutated block is never approved.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::attestor::Verifiers;
use attestation::aws::pkcs7::SignedDocument;
use attestation::aws::sts::NoSts;
use attestation::aws::{AwsData, AwsVerifier, RegionCertificates};
use attestation::decision::Outcome;
use attestation::gcp::jwt::SignedToken;
use attestation::gcp::{GcpVerifier, Jwks};
use base64::Engine as _;
use proptest::prelude::*;
use tests::csr::{RequestSpec, client_csr_object};
use tests::worker0::Worker0;
use time::macros::datetime;

fn real_pkcs7() -> Vec<u8> {
    let text: String = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/aws/teleport-instance1-us-west-2.p7b.b64"
    ))
    .unwrap()
    .chars()
    .filter(|c| !c.is_ascii_whitespace())
    .collect();
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

/// One Google key for every case: generating RSA keys per case would be most of the run.
static GOOGLE: std::sync::LazyLock<tests::cloud::GoogleSigner> =
    std::sync::LazyLock::new(tests::cloud::GoogleSigner::new);

fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, mask, kind) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at % bytes.len();
        match kind % 3 {
            0 => bytes[i] ^= mask.max(1),
            1 => bytes.insert(i, mask),
            _ => drop(bytes.remove(i)),
        }
    }
    bytes
}

/// A `gcp` or `aws` CSR for worker-0 carrying `data`, decided with real verifiers.
fn decide(provider: &str, data: Vec<u8>) -> Outcome {
    let pid = "aws:///us-east-1a/i-0123456789abcdef0";
    let mut spec = RequestSpec::kubelet("worker-0", pid);
    spec.provider = Some(format!("{provider}/v1"));
    spec.data = Some(data);
    let mut csr = client_csr_object(spec.build(), "abcdef");
    csr.signer_name = match provider {
        "gcp" => attestation::names::SIGNER_GCP,
        _ => attestation::names::SIGNER_AWS,
    }
    .into();
    let keys = Jwks::parse(GOOGLE.jwks().as_bytes()).unwrap();
    let verifiers = Verifiers::new()
        .with(GcpVerifier::new(Arc::new(keys)))
        .with(AwsVerifier::new(Arc::new(NoSts)).with_certificates(RegionCertificates::shipped()));
    Worker0::with_provider_id("gcp,aws", pid)
        .decide_with(&csr, datetime!(2026-11-22 08:00 UTC), &verifiers)
        .outcome
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_mutated_real_pkcs7_never_panics(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        let bytes = mutate(real_pkcs7(), &edits);
        if let Ok(signed) = SignedDocument::parse(&bytes) {
            let _ = signed.verify(RegionCertificates::shipped().for_region("us-west-2").unwrap());
            let _ = attestation::aws::IdentityDocument::parse(signed.content());
        }
    }

    #[test]
    fn arbitrary_tokens_and_key_sets_never_panic(token in "[A-Za-z0-9_.=+/-]{0,600}", json in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = SignedToken::parse(&token);
        let _ = Jwks::parse(&json);
        let _ = AwsData::parse(&json);
        let _ = attestation::aws::sts::caller_arn(&token);
        let roles = ["node-role".to_owned()];
        let _ = attestation::aws::sts::check_instance_arn(&token, &attestation::aws::sts::ExpectedCaller {
            region: "us-east-1",
            account_id: "123456789012",
            instance_id: "i-0123456789abcdef0",
            roles: &roles,
        });
    }

    #[test]
    fn arbitrary_cloud_data_blocks_are_decided_and_never_approved(
        provider in prop_oneof![Just("gcp"), Just("aws")],
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8),
    ) {
        // A well-shaped block around a real AWS signature or a token of Google-shaped claims,
        // then bent: whatever it becomes, the rule engine decides and does not approve.
        let seed = if provider == "aws" {
            serde_json::json!({"rsa2048": base64::engine::general_purpose::STANDARD.encode(real_pkcs7()),
                               "sts": {"headers": {"host": "sts.us-west-2.amazonaws.com"}, "body": ""}})
        } else {
            serde_json::json!({"identityToken": GOOGLE.current_token(serde_json::json!({"aud": "x", "iat": 1, "exp": 2, "iss": "accounts.google.com"}))})
        };
        let data = mutate(serde_json::to_vec(&seed).unwrap(), &edits);
        let outcome = decide(provider, data);
        prop_assert!(!matches!(outcome, Outcome::Approved { .. }), "{outcome:?}");
    }
}
