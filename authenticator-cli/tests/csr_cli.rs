//! `kubelet-authenticator csr`: a complete envelope on stdout, the key beside it, 0600.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;

fn csr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"))
        .arg("csr")
        .args(args)
        .output()
        .expect("run kubelet-authenticator")
}

#[test]
fn prints_a_signed_envelope_for_the_node_and_keeps_the_key_private() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    for key_type in ["ecdsa-p256", "ecdsa-p384", "rsa2048", "ed25519"] {
        let output = csr(&[
            "--node-name",
            "worker-0",
            "--provider-id",
            "aws:///us-east-1a/i-0abc",
            "--attestor",
            "insecure",
            "--key-out",
            key.to_str().unwrap(),
            "--key-type",
            key_type,
        ]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let envelope = RequestEnvelope::parse(&output.stdout).unwrap();
        assert_eq!(
            envelope.provider.as_ref().map(ToString::to_string).as_deref(),
            Some("insecure/v1")
        );
        assert!(envelope.data.is_none());
        let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
        parsed.verify_signature().unwrap();
        let extension = parsed.provider_id_extensions().next().unwrap();
        assert_eq!(
            ProviderId::from_extension_value(&extension.value).unwrap().as_str(),
            "aws:///us-east-1a/i-0abc"
        );
        let cn: Vec<_> = parsed.common_names().filter_map(|a| a.value.clone()).collect();
        assert_eq!(cn, ["system:node:worker-0"]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let key_pem = std::fs::read_to_string(&key).unwrap();
        let pair = rcgen::KeyPair::from_pem(&key_pem).unwrap();
        assert_eq!(
            rcgen::PublicKeyData::der_bytes(&pair),
            parsed.public_key.as_slice(),
            "{key_type}: the key on disk is the CSR's"
        );
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("PRIVATE KEY"),
            "the key never goes to stdout"
        );
    }
}

#[test]
fn invalid_names_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let output = csr(&[
        "--node-name",
        "Worker_0",
        "--provider-id",
        "aws:///x",
        "--attestor",
        "insecure",
        "--key-out",
        key.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("DNS-1123"));
    assert!(output.stdout.is_empty());
    assert!(!key.exists());
}
