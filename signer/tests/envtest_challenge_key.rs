//! The signer run with a kubeconfig from outside the cluster, its own namespace missing (so it
//! cannot create the `tpm/v1` challenge key Secret), on a real kube-apiserver
//! (`KUBEBUILDER_ASSETS`): it starts, serves `insecure/v1` CSRs, holds `tpm/v1` CSRs with a
//! Warning Event on the Cluster and a log line saying what to do, and judges them once the
//! namespace exists. A real Prometheus (Debian `prometheus`) with the shipped alerts watches it:
//! `NodeAttestationTpmChallengeKeyUnavailable` fires while the key cannot be created and clears
//! once the namespace exists, with no `tpm/v1` CSR left to make the signer try again.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use attestation::names::{SIGNER_INSECURE, SIGNER_TPM};
use serde_json::json;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, wait_final};
use tests::prometheus::{Prometheus, shipped_rules};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(40);
const HOME: &str = "signer-home";

fn pid(name: &str) -> String {
    format!("aws:///eu-west-1b/i-{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS and promtool: a real kube-apiserver, etcd and Prometheus"]
async fn a_signer_without_its_namespace_serves_insecure_clusters_and_holds_tpm_csrs_until_it_exists() {
    let env = Envtest::start("envtest_challenge_key");
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &management, "team-a", "prod", "insecure,tpm").await;
    for name in ["worker-0", "worker-1"] {
        w.add_machine(&management, name, &pid(name)).await;
    }
    let admin_kubeconfig = w.env.admin_kubeconfig.clone();
    let mut signer = Signer::run_as(
        Path::new(SIGNER_BIN),
        &w.env,
        &admin_kubeconfig,
        &["--leader-elect=false", "--leader-election-namespace", HOME],
    );

    // insecure/v1 is served although the challenge key cannot be created.
    file_csr(
        &w.bootstrap,
        "insecure-0",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("worker-0", &pid("worker-0")).build(),
        CLIENT_USAGES,
    )
    .await;
    let insecure = wait_final(&w.admin, "insecure-0", false, WAIT).await;
    assert!(matches!(insecure, Final::Issued(_)), "{insecure:?}\n{}", signer.log());

    // A tpm/v1 CSR is held, not judged: its DATA would be refused at once if it were.
    let mut tpm = RequestSpec::kubelet("worker-1", &pid("worker-1"));
    tpm.provider = Some("tpm/v1".into());
    tpm.data = Some(br#"{"phase":1}"#.to_vec());
    file_csr(&w.bootstrap, "tpm-1", SIGNER_TPM, &tpm.build(), CLIENT_USAGES).await;
    let held = wait_final(&w.admin, "tpm-1", false, Duration::from_secs(6)).await;
    assert_eq!(held, Final::Pending, "{}", signer.log());
    let warnings = w.cluster_events("TpmChallengeKeyUnavailable");
    assert!(
        warnings
            .iter()
            .any(|(kind, note)| kind == "Warning" && note.contains(&format!("Create namespace {HOME}"))),
        "a Warning Event on the Cluster says what to do: {warnings:?}\n{}",
        signer.log()
    );
    assert!(
        signer.log().contains(&format!("Create namespace {HOME}")),
        "{}",
        signer.log()
    );
    assert!(signer.alive(), "{}", signer.log());

    // The critical alert fires.
    let dir = tempfile::tempdir().unwrap();
    let prometheus = Prometheus::start(dir.path(), &signer.metrics_target(), &shipped_rules("5s"));
    const KEY_ALERT: &str = "NodeAttestationTpmChallengeKeyUnavailable";
    prometheus.wait_alert(KEY_ALERT, "firing", &[], WAIT);

    // The held CSR goes away (nothing left for the signer to judge), then the runbook's fix:
    // the namespace. The key is created on the signer's own next read and the alert clears.
    let deleted = w.env.kubectl(&["delete", "csr", "tpm-1"]);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    apply(
        &management,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HOME}}),
    )
    .await;
    prometheus.wait_alert(KEY_ALERT, "", &[], WAIT);

    // A tpm/v1 CSR filed now is judged.
    file_csr(&w.bootstrap, "tpm-2", SIGNER_TPM, &tpm.build(), CLIENT_USAGES).await;
    let judged = wait_final(&w.admin, "tpm-2", false, WAIT).await;
    assert_eq!(
        judged.reason(),
        Some("AttestationInvalid"),
        "{judged:?}\n{}",
        signer.log()
    );
    let secret = live::get(
        &management,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "node-attestation-signer-tpm-challenge", "namespace": HOME}}),
    )
    .await;
    assert!(secret["data"]["key"].is_string(), "{secret}");
}
