//! The RBAC manifests in `config/rbac` and `config/workload`, applied to a real kube-apiserver and exercised by
//! impersonating the signer (`KUBEBUILDER_ASSETS`; skipped without it): everything the signer
//! does is allowed, and the nearest things it must not do are refused.

#![allow(clippy::unwrap_used)]

use attestation::ca::{ClusterCa, Validity};
use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::strict_der::assert_strict_der_pem;

const WORKLOAD_USER: &str = "node-attestation-signer";
const MANAGEMENT_SA: &str = "system:serviceaccount:node-attestation-system:node-attestation-signer";

fn file_csr(env: &Envtest, name: &str, signer: &str, usages: &[&str], request: &[u8]) {
    use base64::Engine;
    let csr = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
        "spec": {"signerName": signer, "usages": usages, "request": base64::engine::general_purpose::STANDARD.encode(request)}});
    env.apply(&[csr]);
}

fn as_user(env: &Envtest, user: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--as", user];
    all.extend_from_slice(args);
    let out = env.kubectl(&all);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn allowed(env: &Envtest, user: &str, args: &[&str]) {
    let (ok, text) = as_user(env, user, args);
    assert!(ok, "{user} must be allowed {args:?}: {text}");
}

fn forbidden(env: &Envtest, user: &str, args: &[&str]) {
    let (ok, text) = as_user(env, user, args);
    assert!(
        !ok && text.contains("forbidden"),
        "{user} must be forbidden {args:?}: {text}"
    );
}

/// Refused by RBAC or by the shipped admission policy (a 422 for an update it denies).
fn refused(env: &Envtest, user: &str, args: &[&str]) {
    let (ok, text) = as_user(env, user, args);
    assert!(
        !ok && (text.contains("forbidden")
            || text.contains("ValidatingAdmissionPolicy 'node-attestation-signer-join-tokens'")),
        "{user} must be refused {args:?}: {text}"
    );
}

#[test]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
fn the_signer_can_do_its_job_and_nothing_near_it() {
    let env = Envtest::start("envtest_rbac");
    env.install_capi_crds();
    env.apply(&[
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-attestation-system"}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": capi::NAMESPACE}}),
    ]);
    for kustomization in ["config/rbac", "config/workload"] {
        let dir = tests::repo_root().join(kustomization);
        let out = env.kubectl(&["apply", "--server-side", "-k", dir.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "apply {kustomization}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Workload cluster: approve and sign our signers' CSRs, approve serving ones.
    let spec = RequestSpec::kubelet("worker-0", "aws:///us-east-1a/i-0abc");
    let request = spec.build();
    file_csr(
        &env,
        "ours",
        "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure",
        &["digital signature", "client auth"],
        &request,
    );
    file_csr(
        &env,
        "legacy",
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "client auth"],
        &RequestSpec::serving("worker-0", vec![]).build(),
    );
    file_csr(
        &env,
        "serving",
        "kubernetes.io/kubelet-serving",
        &["digital signature", "server auth"],
        &RequestSpec::serving(
            "worker-0",
            vec![rcgen::SanType::DnsName("worker-0".try_into().unwrap())],
        )
        .build(),
    );
    allowed(&env, WORKLOAD_USER, &["certificate", "approve", "ours"]);
    // Every client signer of the SPEC, the cloud ones included.
    for signer in [
        attestation::names::SIGNER_TPM,
        attestation::names::SIGNER_GCP,
        attestation::names::SIGNER_AWS,
        attestation::names::SIGNER_AZURE,
    ] {
        let name = format!("ours-{}", signer.rsplit('-').next().unwrap_or_default());
        file_csr(&env, &name, signer, &["digital signature", "client auth"], &request);
        allowed(&env, WORKLOAD_USER, &["certificate", "approve", &name]);
    }
    allowed(&env, WORKLOAD_USER, &["certificate", "approve", "serving"]);
    forbidden(&env, WORKLOAD_USER, &["certificate", "approve", "legacy"]);
    allowed(
        &env,
        WORKLOAD_USER,
        &[
            "annotate",
            "csr",
            "ours",
            "cluster.x-k8s.io/attestation-supported-versions=insecure/v1",
        ],
    );

    let ca = ClusterCa::from_pem(&env.client_ca.cert_pem, &env.client_ca.key_pem).unwrap();
    let csr = ParsedCsr::from_der(&RequestEnvelope::parse(&request).unwrap().csr_der).unwrap();
    let validity = Validity {
        now: time::OffsetDateTime::now_utc(),
        requested_seconds: None,
        max: time::Duration::hours(1),
    };
    let certificate = ca
        .issue(&csr, &ProviderId::new("aws:///us-east-1a/i-0abc").unwrap(), validity)
        .unwrap()
        .pem();
    assert_strict_der_pem(
        "the certificate written by the signer's workload user",
        certificate.as_bytes(),
    );
    let write_status = |name: &str| {
        let mut object: Value =
            serde_json::from_slice(&env.kubectl(&["get", "csr", name, "-o", "json"]).stdout).unwrap();
        use base64::Engine;
        object["status"]["certificate"] = json!(base64::engine::general_purpose::STANDARD.encode(&certificate));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csr.json");
        std::fs::write(&path, object.to_string()).unwrap();
        as_user(
            &env,
            WORKLOAD_USER,
            &[
                "replace",
                "--raw",
                &format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/status"),
                "-f",
                path.to_str().unwrap(),
            ],
        )
    };
    let (signed, text) = write_status("ours");
    assert!(signed, "the signer signs its own signer's CSRs: {text}");
    let (signed, text) = write_status("serving");
    assert!(
        !signed && text.contains("forbidden"),
        "serving CSRs are the controller-manager's to sign: {text}"
    );

    forbidden(&env, WORKLOAD_USER, &["get", "secrets", "-A"]);
    // Join tokens (SPEC section 7): bootstrap token Secrets in kube-system, by name; the
    // admission policy refuses the signer's writes to any other Secret there.
    env.apply(&[
        json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
               "metadata": {"name": "bootstrap-token-rbac01", "namespace": "kube-system"},
               "stringData": {"token-id": "rbac01", "token-secret": "0123456789abcdef", "expiration": "2030-01-01T00:00:00Z"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": "bootstrap-token-fake01", "namespace": "kube-system"}, "stringData": {"token-id": "fake01"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": "cloud-credentials", "namespace": "kube-system"}, "stringData": {"key": "value"}}),
    ]);
    let patch = r#"{"data":{"expiration":"MjAzMS0wMS0wMVQwMDowMDowMFo="}}"#;
    allowed(
        &env,
        WORKLOAD_USER,
        &["get", "secret", "-n", "kube-system", "bootstrap-token-rbac01"],
    );
    forbidden(&env, WORKLOAD_USER, &["get", "secrets", "-n", "kube-system"]);
    forbidden(&env, WORKLOAD_USER, &["get", "secret", "-n", "default", "anything"]);
    allowed(
        &env,
        WORKLOAD_USER,
        &[
            "patch",
            "secret",
            "-n",
            "kube-system",
            "bootstrap-token-rbac01",
            "--type",
            "merge",
            "-p",
            patch,
        ],
    );
    for other in ["bootstrap-token-fake01", "cloud-credentials"] {
        refused(
            &env,
            WORKLOAD_USER,
            &[
                "patch",
                "secret",
                "-n",
                "kube-system",
                other,
                "--type",
                "merge",
                "-p",
                patch,
            ],
        );
        refused(&env, WORKLOAD_USER, &["delete", "secret", "-n", "kube-system", other]);
    }
    refused(
        &env,
        WORKLOAD_USER,
        &[
            "create",
            "secret",
            "generic",
            "-n",
            "kube-system",
            "bootstrap-token-new001",
            "--type",
            "bootstrap.kubernetes.io/token",
        ],
    );
    allowed(
        &env,
        WORKLOAD_USER,
        &["delete", "secret", "-n", "kube-system", "bootstrap-token-rbac01"],
    );
    allowed(&env, WORKLOAD_USER, &["get", "nodes"]);
    env.apply(&[
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:node-autoapprove-bootstrap"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers:kubeadm:default-node-token"}]}),
    ]);
    forbidden(
        &env,
        WORKLOAD_USER,
        &["delete", "clusterrolebinding", "node-attestation-signer-workload"],
    );
    allowed(
        &env,
        WORKLOAD_USER,
        &["delete", "clusterrolebinding", "kubeadm:node-autoapprove-bootstrap"],
    );
    env.apply(&[
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:node-autoapprove-certificate-rotation"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]}),
    ]);
    allowed(
        &env,
        WORKLOAD_USER,
        &[
            "delete",
            "clusterrolebinding",
            "kubeadm:node-autoapprove-certificate-rotation",
        ],
    );

    // Management cluster: Cluster API objects, Secrets by name only, its own Lease.
    let mut machine = capi::machine("worker-0", Some("aws:///us-east-1a/i-0abc"));
    machine.as_object_mut().unwrap().remove("status");
    env.apply(&[capi::cluster("tpm"), machine]);
    allowed(&env, MANAGEMENT_SA, &["get", "clusters.cluster.x-k8s.io", "-A"]);
    allowed(
        &env,
        MANAGEMENT_SA,
        &["get", "kubeadmconfigs.bootstrap.cluster.x-k8s.io", "-A"],
    );
    allowed(
        &env,
        MANAGEMENT_SA,
        &[
            "annotate",
            "machines.cluster.x-k8s.io",
            "worker-0",
            "-n",
            capi::NAMESPACE,
            "cluster.x-k8s.io/kubelet-claim={}",
        ],
    );
    forbidden(
        &env,
        MANAGEMENT_SA,
        &["delete", "machines.cluster.x-k8s.io", "worker-0", "-n", capi::NAMESPACE],
    );
    let (ok, text) = as_user(
        &env,
        MANAGEMENT_SA,
        &["get", "secret", "prod-kubeconfig", "-n", capi::NAMESPACE],
    );
    assert!(
        !ok && text.contains("NotFound"),
        "a Secret by name is readable (here: absent): {text}"
    );
    forbidden(&env, MANAGEMENT_SA, &["get", "secrets", "-n", capi::NAMESPACE]);
    allowed(
        &env,
        MANAGEMENT_SA,
        &[
            "auth",
            "can-i",
            "create",
            "leases.coordination.k8s.io",
            "-n",
            "node-attestation-system",
        ],
    );
    // --coordination=shard: each replica lists and watches its peers' membership Leases and
    // deletes its own on SIGTERM (and dead members').
    for verb in ["list", "watch", "delete"] {
        allowed(
            &env,
            MANAGEMENT_SA,
            &[
                "auth",
                "can-i",
                verb,
                "leases.coordination.k8s.io",
                "-n",
                "node-attestation-system",
            ],
        );
    }
    forbidden(
        &env,
        MANAGEMENT_SA,
        &["get", "leases.coordination.k8s.io", "-n", "kube-system"],
    );
    // The tpm/v1 challenge key: created and read in the signer's namespace, nowhere else.
    allowed(
        &env,
        MANAGEMENT_SA,
        &["auth", "can-i", "create", "secrets", "-n", "node-attestation-system"],
    );
    let (ok, text) = as_user(
        &env,
        MANAGEMENT_SA,
        &["auth", "can-i", "create", "secrets", "-n", capi::NAMESPACE],
    );
    assert!(
        !ok && text.contains("no"),
        "Secrets of Clusters must not be creatable: {text}"
    );
}
