//! The `tpm/v1` boot policy's ConfigMap path on a real kube-apiserver (`KUBEBUILDER_ASSETS`;
//! skipped loudly without), the signer running as its management ServiceAccount under
//! `config/rbac/` (which grants `get` on ConfigMaps): a Cluster whose
//! `cluster.x-k8s.io/kubelet-tpm-boot-policy` names a ConfigMap that does not exist gets a
//! `BootPolicyInvalid` Warning Event naming it, and its `tpm/v1` CSR is held (never judged,
//! though its DATA would be refused at once); without the annotation the same CSR is judged.
//! The judge itself, on real quotes and logs, is the swtpm suites'.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use attestation::names::{ANNOTATION_TPM_BOOT_POLICY, SIGNER_TPM};
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, file_csr, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(30);
const PID: &str = "aws:///eu-west-1b/i-worker-0";

fn annotate(w: &Workload, value: &str) {
    let annotation = format!("{ANNOTATION_TPM_BOOT_POLICY}{value}");
    let out = w.env.kubectl(&[
        "annotate",
        "--overwrite",
        "clusters.cluster.x-k8s.io",
        &w.cluster,
        "-n",
        &w.namespace,
        &annotation,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Files `tpm-1`, a `tpm/v1` CSR with garbage DATA (judged, it would be denied at once), asserts
/// it stays pending, and returns the Cluster's `BootPolicyInvalid` Events.
async fn file_held_tpm_csr(w: &Workload, signer: &Signer) -> Vec<(String, String)> {
    let mut tpm = RequestSpec::kubelet("worker-0", PID);
    tpm.provider = Some("tpm/v1".into());
    tpm.data = Some(br#"{"phase":1}"#.to_vec());
    file_csr(&w.bootstrap, "tpm-1", SIGNER_TPM, &tpm.build(), CLIENT_USAGES).await;
    let held = wait_final(&w.admin, "tpm-1", false, Duration::from_secs(8)).await;
    assert_eq!(held, Final::Pending, "{}", signer.log());
    w.cluster_events("BootPolicyInvalid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_missing_boot_policy_holds_tpm_csrs_with_a_warning_and_none_judges_them() {
    let env = Envtest::start("envtest_boot_policy");
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &management, "team-a", "prod", "tpm").await;
    w.add_machine(&management, "worker-0", PID).await;
    annotate(&w, "=prod-boot-policy");
    let signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &["--leader-elect=false"]).await;

    let warnings = file_held_tpm_csr(&w, &signer).await;
    assert!(
        warnings.iter().any(|(kind, note)| kind == "Warning"
            && note.contains("team-a/prod-boot-policy")
            && note.contains("does not exist")),
        "a Warning Event on the Cluster names the ConfigMap: {warnings:?}\n{}",
        signer.log()
    );
    assert!(signer.log().contains("tpm/v1 boot policy unusable"), "{}", signer.log());

    // The annotation goes: no policy, and the CSR is judged (revision 4).
    annotate(&w, "-");
    let judged = wait_final(&w.admin, "tpm-1", false, WAIT).await;
    assert_eq!(
        judged.reason(),
        Some("AttestationInvalid"),
        "{judged:?}\n{}",
        signer.log()
    );
}

/// The operator's floor (revision 6): with `--tpm-require-boot-policy`, a Cluster that names no
/// policy has its `tpm/v1` CSRs held with a Warning saying how to name one; once it names a
/// valid policy, they are judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_cluster_without_a_policy_is_held_when_the_signer_requires_one() {
    let env = Envtest::start("envtest_boot_policy_floor");
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &management, "team-a", "prod", "tpm").await;
    w.add_machine(&management, "worker-0", PID).await;
    let signer = Signer::start(
        Path::new(SIGNER_BIN),
        &w.env,
        &[
            "--leader-elect=false",
            "--tpm-require-boot-policy",
            "--tpm-require-secure-boot",
        ],
    )
    .await;

    let warnings = file_held_tpm_csr(&w, &signer).await;
    assert!(
        warnings.iter().any(|(kind, note)| kind == "Warning"
            && note.contains("--tpm-require-boot-policy")
            && note.contains("cluster.x-k8s.io/kubelet-tpm-boot-policy")),
        "a Warning Event on the Cluster says a policy is required: {warnings:?}\n{}",
        signer.log()
    );

    // A policy named (Secure Boot optional, which the floor raises): the CSR is judged.
    let policy = "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nsecureBoot: optional\nimages:\n  - name: x\n    kernel: \"aa00000000000000000000000000000000000000000000000000000000000000\"\n";
    let file = w.env.dir().join("policy.yaml");
    std::fs::write(&file, policy).unwrap();
    let out = w.env.kubectl(&[
        "create",
        "configmap",
        "prod-boot-policy",
        "-n",
        &w.namespace,
        &format!("--from-file=policy.yaml={}", file.display()),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    annotate(&w, "=prod-boot-policy");
    let judged = wait_final(&w.admin, "tpm-1", false, WAIT).await;
    assert_eq!(
        judged.reason(),
        Some("AttestationInvalid"),
        "{judged:?}\n{}",
        signer.log()
    );
}
