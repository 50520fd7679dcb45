//! Exec mode without a cluster: the errors a person acts on, the old certificate answered when
//! renewal fails, and a foreign cache file refused. Every failure leaves stdout empty.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tests::ca::{CaKeyFormat, node_certificate, openssl_ca};
use time::{Duration, OffsetDateTime};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const PID: &str = "aws:///us-east-1a/i-0abc";

fn plugin(bootstrap: &Path, cert_dir: &Path, extra: &[&str], exec_info: Option<&str>) -> Output {
    let mut command = Command::new(PLUGIN);
    command.args([
        "--bootstrap-kubeconfig",
        bootstrap.to_str().unwrap(),
        "--cert-dir",
        cert_dir.to_str().unwrap(),
    ]);
    command.args(["--node-name", "worker-0", "--timeout", "5s"]);
    for (flag, default) in [("--provider-id", PID), ("--attestor", "insecure")] {
        if !extra.contains(&flag) {
            command.args([flag, default]);
        }
    }
    command.args(extra);
    match exec_info {
        Some(info) => command.env("KUBERNETES_EXEC_INFO", info),
        None => command.env_remove("KUBERNETES_EXEC_INFO"),
    };
    command.output().unwrap()
}

/// A bootstrap kubeconfig whose apiserver refuses connections.
fn unreachable_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("bootstrap.conf");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
    )
    .unwrap();
    path
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_bootstrap_kubeconfig_or_unreachable_apiserver_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = plugin(&dir.path().join("nope.conf"), &dir.path().join("pki"), &[], None);
    assert!(!missing.status.success());
    assert!(missing.stdout.is_empty());
    assert!(
        stderr(&missing).contains("--bootstrap-kubeconfig"),
        "{}",
        stderr(&missing)
    );

    let bootstrap = unreachable_kubeconfig(dir.path());
    let down = plugin(&bootstrap, &dir.path().join("pki"), &[], None);
    assert!(!down.status.success());
    assert!(down.stdout.is_empty());
    assert!(stderr(&down).contains("unreachable"), "{}", stderr(&down));
    let status = plugin(&bootstrap, &dir.path().join("pki"), &["status"], None);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("unreachable"),
        "status shows the last error"
    );
}

#[test]
fn a_failed_renewal_answers_the_still_valid_certificate_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let now = OffsetDateTime::now_utc();
    // 95% through its life: due for renewal, still valid.
    let due = node_certificate(
        &ca,
        &key,
        "worker-0",
        PID,
        now - Duration::hours(19),
        now + Duration::hours(1),
    );
    std::fs::write(cert_dir.join("kubelet-client-current.pem"), format!("{due}{key}")).unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let out = plugin(&bootstrap, &cert_dir, &[], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(credential["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        due.trim()
    );
    assert!(stderr(&out).contains("renewal failed"), "{}", stderr(&out));

    // The same file for another Machine's provider ID is not this node's: refused, not answered.
    let other = plugin(
        &bootstrap,
        &cert_dir,
        &["--provider-id", "aws:///us-east-1a/i-other"],
        None,
    );
    assert!(!other.status.success());
    assert!(other.stdout.is_empty());
    assert!(
        stderr(&other).contains("ignoring the cached certificate"),
        "{}",
        stderr(&other)
    );
}

#[test]
fn unusable_exec_info_and_an_absent_tpm_are_errors_not_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let alpha = plugin(
        &bootstrap,
        &dir.path().join("pki"),
        &[],
        Some(r#"{"apiVersion":"client.authentication.k8s.io/v1alpha1","kind":"ExecCredential"}"#),
    );
    assert!(!alpha.status.success());
    assert!(alpha.stdout.is_empty());
    assert!(stderr(&alpha).contains("v1alpha1"), "{}", stderr(&alpha));
    let tpm = plugin(&bootstrap, &dir.path().join("pki"), &["--attestor", "tpm"], None);
    assert!(!tpm.status.success());
    assert!(tpm.stdout.is_empty());
    assert!(stderr(&tpm).contains("tpm"), "{}", stderr(&tpm));
}
