//! The exec plugin end to end, on a real kube-apiserver (`KUBEBUILDER_ASSETS`; skipped loudly
//! without) with the real signer: kubectl whose kubeconfig user is this plugin (written by the
//! plugin's own `kubeconfig` command) becomes `system:node:worker-0` through a bootstrap token;
//! the next call is served from the cache; a certificate due for rotation is renewed through the
//! node identity; ten concurrent first calls file one CSR; a denied CSR ends with its reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::Value;
use tests::capi;
use tests::envtest::Envtest;
use tests::live::{self, Signer, Workload, apply};
use tests::strict_der::assert_strict_der_pem;

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

fn plugin(args: &[&str], exec_info: Option<&str>) -> Output {
    let mut command = Command::new(PLUGIN);
    command.args(args);
    match exec_info {
        Some(info) => command.env("KUBERNETES_EXEC_INFO", info),
        None => command.env_remove("KUBERNETES_EXEC_INFO"),
    };
    command.output().unwrap()
}

async fn csrs_for(admin: &kube::Client, node: &str) -> Vec<CertificateSigningRequest> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| {
            attestation::requested_node_name(&c.spec.request.0).map(|n| n.as_str().to_owned()) == Some(node.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn the_plugin_joins_caches_renews_serialises_and_reports_denials() {
    let env = Envtest::start("envtest_exec");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-0", "worker-1", "cp-0"] {
        apply(
            &admin,
            &capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"),
        )
        .await;
        apply(&admin, &capi::machine(name, Some(&pid(name)))).await;
    }
    apply(&w.admin, &capi::node("cp-0", Some(&pid("cp-0")))).await;
    let signer = Signer::start(&signer_bin(), &w.env, &[]).await;
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    let node_flags = |node: &str, cert_dir: &Path| -> Vec<String> {
        [
            "--bootstrap-kubeconfig",
            bootstrap.to_str().unwrap(),
            "--cert-dir",
            cert_dir.to_str().unwrap(),
            "--node-name",
            node,
            "--provider-id",
            &pid(node),
            "--attestor",
            "insecure",
            "--timeout",
            "60s",
        ]
        .iter()
        .map(ToString::to_string)
        .collect()
    };

    // The kubelet kubeconfig, as an image would bake it.
    let kubelet_kubeconfig = live::kubelet_kubeconfig(PLUGIN, &w.env, &node_flags("worker-0", &cert_dir), dir.path());

    // kubectl runs the plugin: a bootstrap-token CSR, signed, and kubectl is the node.
    assert_eq!(
        live::whoami(&w.env, &kubelet_kubeconfig, &signer),
        "system:node:worker-0"
    );
    let filed = csrs_for(&w.admin, "worker-0").await;
    assert_eq!(filed.len(), 1);
    assert!(
        filed[0]
            .spec
            .username
            .as_deref()
            .unwrap_or_default()
            .starts_with("system:bootstrap:")
    );
    let current = cert_dir.join("kubelet-client-current.pem");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&current).unwrap().permissions().mode() & 0o777, 0o600);
    assert_strict_der_pem("the plugin's cached certificate", &std::fs::read(&current).unwrap());

    // The second call is the cache's: no new CSR.
    assert_eq!(
        live::whoami(&w.env, &kubelet_kubeconfig, &signer),
        "system:node:worker-0"
    );
    assert_eq!(csrs_for(&w.admin, "worker-0").await.len(), 1, "served from the cache");
    let flags = node_flags("worker-0", &cert_dir);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cached = plugin(
        &flags,
        Some(
            r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#,
        ),
    );
    let credential: Value = serde_json::from_slice(&cached.stdout).unwrap();
    assert_eq!(credential["apiVersion"], "client.authentication.k8s.io/v1beta1");
    assert_strict_der_pem(
        "the cached ExecCredential's clientCertificateData",
        credential["status"]["clientCertificateData"]
            .as_str()
            .unwrap()
            .as_bytes(),
    );
    assert!(
        credential["status"]["clientKeyData"]
            .as_str()
            .unwrap()
            .contains("PRIVATE KEY")
    );

    // Due for rotation (the same key, a certificate past half of its life): renewed with the
    // node's own identity.
    let aging = tests::ca::make_due_for_rotation(&w.env.client_ca, &cert_dir, "worker-0", &pid("worker-0"));
    let renewed = plugin(&flags, None);
    assert!(
        renewed.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&renewed.stderr),
        signer.log()
    );
    let after = csrs_for(&w.admin, "worker-0").await;
    assert_eq!(after.len(), 2, "one renewal CSR");
    let renewal = after.iter().find(|c| c.metadata.uid != filed[0].metadata.uid).unwrap();
    assert_eq!(
        renewal.spec.username.as_deref(),
        Some("system:node:worker-0"),
        "renewed as the node itself"
    );
    let answered: Value = serde_json::from_slice(&renewed.stdout).unwrap();
    assert_ne!(
        answered["status"]["clientCertificateData"].as_str().unwrap(),
        aging,
        "the new certificate is answered"
    );
    assert_strict_der_pem(
        "the renewed certificate",
        answered["status"]["clientCertificateData"].as_str().unwrap().as_bytes(),
    );
    assert!(std::fs::read_link(&current).unwrap() != Path::new("kubelet-client-aged.pem"));

    // Ten first calls at once for worker-1: one CSR, one certificate for all.
    let cert_dir_1 = dir.path().join("pki-1");
    let flags_1 = node_flags("worker-1", &cert_dir_1);
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let flags = flags_1.clone();
            std::thread::spawn(move || plugin(&flags.iter().map(String::as_str).collect::<Vec<_>>(), None))
        })
        .collect();
    let outputs: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut certificates = std::collections::BTreeSet::new();
    for out in &outputs {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        certificates.insert(v["status"]["clientCertificateData"].as_str().unwrap().to_owned());
    }
    assert_eq!(certificates.len(), 1, "every invocation answers the same certificate");
    for certificate in &certificates {
        assert_strict_der_pem("the certificate of ten concurrent first calls", certificate.as_bytes());
    }
    assert_eq!(csrs_for(&w.admin, "worker-1").await.len(), 1, "exactly one CSR filed");

    // The control-plane hijack: denied, the reason on stderr, nothing on stdout.
    let hijack = node_flags("cp-0", &dir.path().join("pki-cp"));
    let denied = plugin(&hijack.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert!(!denied.status.success());
    assert!(denied.stdout.is_empty(), "no partial credential");
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("denied") && stderr.contains("NodeAlreadyRegistered"),
        "{stderr}"
    );

    // `status` tells a person what is there, and the last error.
    let mut status_flags = node_flags("cp-0", &dir.path().join("pki-cp"));
    status_flags.push("status".into());
    let status = plugin(&status_flags.iter().map(String::as_str).collect::<Vec<_>>(), None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("none yet") && text.contains("NodeAlreadyRegistered"),
        "{text}"
    );
    let mut status_flags = node_flags("worker-0", &cert_dir);
    status_flags.push("status".into());
    let status = plugin(&status_flags.iter().map(String::as_str).collect::<Vec<_>>(), None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("system:node:worker-0") && text.contains(&pid("worker-0")) && text.contains("cached"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}
