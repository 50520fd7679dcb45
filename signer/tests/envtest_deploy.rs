//! The install, for real (`KUBEBUILDER_ASSETS`; skipped loudly without): `config/default`
//! applied to a management apiserver passes restricted Pod Security without a warning, and
//! `config/workload` to a workload one; then the signer runs with a token of exactly the
//! ServiceAccount the Deployment uses, and joins a node.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use attestation::names::SIGNER_INSECURE;
use serde_json::Value;
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");

/// The `kind` named node-attestation-signer in the signer's namespace, as applied.
fn signer_object(env: &Envtest, kind: &str) -> Value {
    let out = env.kubectl(&[
        "get",
        kind,
        "node-attestation-signer",
        "-n",
        "node-attestation-system",
        "-o",
        "json",
    ]);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn the_kustomizations_apply_cleanly_and_the_service_account_can_do_the_job() {
    let env = Envtest::start("envtest_deploy");
    env.install_capi_crds();
    for kustomization in ["config/default", "config/workload"] {
        let dir = tests::repo_root().join(kustomization);
        let out = env.kubectl(&["apply", "--server-side", "-k", dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "apply {kustomization}: {stderr}");
        assert!(!stderr.contains("Warning"), "{kustomization}: {stderr}");
    }
    let deployment = signer_object(&env, "deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array().unwrap().iter().any(|a| a == "--coordination=shard"),
        "config/default shards: {args}"
    );
    assert_eq!(signer_object(&env, "poddisruptionbudget")["spec"]["maxUnavailable"], 1);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "node-attestation-signer");
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let ns: Value = serde_json::from_slice(
        &env.kubectl(&["get", "namespace", "node-attestation-system", "-o", "json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    // A pod without the hardening is refused by that namespace: the check is live.
    let privileged = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "node-attestation-system"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let out = env.kubectl_as(
        &env.admin_kubeconfig,
        &["create", "--dry-run=server", "-f", "-"],
        Some(&privileged.to_string()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("PodSecurity"), "{stderr}");

    // The ServiceAccount's own token, as the Deployment's pods would mount it.
    let token = env.kubectl(&[
        "create",
        "token",
        "node-attestation-signer",
        "-n",
        "node-attestation-system",
        "--duration",
        "1h",
    ]);
    assert!(token.status.success(), "{}", String::from_utf8_lossy(&token.stderr));
    let token = String::from_utf8(token.stdout).unwrap();
    let kubeconfig = env.kubeconfig_for_token("service-account", token.trim());

    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    apply(&admin, &capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2")).await;
    apply(&admin, &capi::machine("worker-0", Some("aws:///us-east-1a/i-0abc"))).await;
    let signer = Signer::run_as(Path::new(SIGNER_BIN), &w.env, &kubeconfig, &[]);
    let request = RequestSpec::kubelet("worker-0", "aws:///us-east-1a/i-0abc").build();
    file_csr(
        &w.bootstrap,
        "worker-0",
        SIGNER_INSECURE,
        &request,
        &["digital signature", "client auth"],
    )
    .await;
    let state = wait_final(&w.admin, "worker-0", false, Duration::from_secs(60)).await;
    assert!(matches!(state, Final::Issued(_)), "{state:?}\n{}", signer.log());
}
