//! Against a real kube-apiserver (`KUBEBUILDER_ASSETS`; skipped without it): a bootstrap-token
//! user files a kubelet CSR carrying our envelope; `node-attestation-signer check` decides on
//! the objects as the apiservers serve them; the certificate it signs with the cluster CA then
//! authenticates as `system:node:worker-0`, which the Node authorizer lets read its Node but not
//! list Secrets.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use attestation::request::KeyAlgorithm;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::strict_der::assert_strict_der_pem;

const PID: &str = "aws:///us-east-1a/i-0abc";

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
fn a_csr_filed_with_a_bootstrap_token_is_approved_offline_and_its_certificate_is_the_node() {
    let env = Envtest::start("envtest_check_flow");
    env.install_capi_crds();

    // Management side (one apiserver plays both clusters here).
    env.apply(&[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": capi::NAMESPACE}})]);
    let mut machine = capi::machine("worker-0", Some(PID));
    let status = machine.as_object_mut().unwrap().remove("status").unwrap();
    env.apply(&[
        capi::cluster("insecure"),
        machine,
        capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2"),
    ]);
    ok(
        env.kubectl(&[
            "patch",
            "machines.v1beta2.cluster.x-k8s.io",
            "worker-0",
            "-n",
            capi::NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({"status": status}).to_string(),
        ]),
        "patch Machine status",
    );

    // Workload side: kubeadm's bootstrap token and its right to file CSRs.
    env.apply(&[
        json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
               "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
               "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:kubelet-bootstrap"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-bootstrapper"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}),
    ]);
    let bootstrap = env.admin_kubeconfig.with_file_name("bootstrap.kubeconfig");
    let admin = std::fs::read_to_string(&env.admin_kubeconfig).unwrap();
    let token_line = admin.lines().find(|l| l.trim_start().starts_with("token:")).unwrap();
    std::fs::write(
        &bootstrap,
        admin.replace(token_line, "    token: abcdef.0123456789abcdef"),
    )
    .unwrap();

    // The node files its CSR: the apiserver keeps the attestation blocks after the PKCS#10.
    let spec = RequestSpec::kubelet("worker-0", PID);
    let request = spec.build();
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "node-csr-worker-0"},
        "spec": {"signerName": "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure",
                 "request": base64(&request), "usages": ["digital signature", "client auth"]}
    });
    let mut filed = None;
    for _ in 0..40 {
        // The bootstrap-token authenticator sees the new Secret through a cache: retry briefly.
        let out = env.kubectl_as(&bootstrap, &["create", "-f", "-"], Some(&csr.to_string()));
        if out.status.success() {
            filed = Some(out);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert!(filed.is_some(), "the bootstrap token could not file the CSR");
    let stored: Value = serde_json::from_str(&ok(
        env.kubectl(&["get", "csr", "node-csr-worker-0", "-o", "json"]),
        "get csr",
    ))
    .unwrap();
    assert_eq!(stored["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(
        base64_decode(stored["spec"]["request"].as_str().unwrap()),
        request,
        "the envelope is stored byte for byte"
    );

    // The operator's view, exported as kubectl writes it, decided by the signer's CLI.
    let dir = tempfile::tempdir().unwrap();
    let save = |name: &str, args: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, ok(env.kubectl(args), name)).unwrap();
        path
    };
    let csr_file = save("csr.yaml", &["get", "csr", "node-csr-worker-0", "-o", "yaml"]);
    let machines = save(
        "machines.yaml",
        &[
            "get",
            "machines.v1beta2.cluster.x-k8s.io",
            "-n",
            capi::NAMESPACE,
            "-o",
            "yaml",
        ],
    );
    let configs = save(
        "kubeadmconfigs.yaml",
        &["get", "kubeadmconfigs", "-n", capi::NAMESPACE, "-o", "yaml"],
    );
    let cluster = save(
        "cluster.yaml",
        &[
            "get",
            "clusters.v1beta2.cluster.x-k8s.io",
            "prod",
            "-n",
            capi::NAMESPACE,
            "-o",
            "yaml",
        ],
    );
    // (v1beta1 reads need Cluster API's conversion webhook, which envtest lacks: the views of
    // both versions are covered by the unit and CRD suites.)
    let check = |machines: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
            .arg("check")
            .args([
                "--csr",
                csr_file.to_str().unwrap(),
                "--machine",
                machines.to_str().unwrap(),
            ])
            .args([
                "--bootstrap-config",
                configs.to_str().unwrap(),
                "--cluster",
                cluster.to_str().unwrap(),
                "--output",
                "json",
            ])
            .args([
                "--ca-cert",
                env.client_ca.cert_path.to_str().unwrap(),
                "--ca-key",
                env.client_ca.key_path.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    };
    let report: Value = serde_json::from_str(&ok(check(&machines), "signer check")).unwrap();
    assert_eq!(report["decision"], "Approved", "{report:#}");
    assert_strict_der_pem(
        "the certificate signer check issued",
        report["certificate"].as_str().unwrap().as_bytes(),
    );

    // The certificate is the node's identity.
    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
    let node = env.kubeconfig_for_certificate("worker-0", report["certificate"].as_str().unwrap(), &key);
    let whoami: Value = serde_json::from_str(&ok(
        env.kubectl_as(&node, &["auth", "whoami", "-o", "json"], None),
        "whoami",
    ))
    .unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "system:node:worker-0");
    assert!(
        whoami["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g == "system:nodes")
    );
    let get_node = env.kubectl_as(&node, &["get", "node", "worker-0"], None);
    let stderr = String::from_utf8_lossy(&get_node.stderr);
    assert!(
        stderr.contains("NotFound") || stderr.contains("not found"),
        "the Node authorizer answers (no such Node yet): {stderr}"
    );
    let secrets = env.kubectl_as(&node, &["get", "secrets", "-A"], None);
    assert!(
        String::from_utf8_lossy(&secrets.stderr).contains("Forbidden"),
        "a node may not list secrets"
    );
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}
