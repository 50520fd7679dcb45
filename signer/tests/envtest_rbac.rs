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

/// Reads Secret `name` in kube-system as the signer's workload user (`kubeconfig`), the way its
/// join-token duty does: a JSON Patch that only tests the Secret's type. The Secret as JSON, or
/// the apiserver's refusal.
fn read_as_signer(kubeconfig: &std::path::Path, name: &str) -> Result<String, String> {
    let patch: json_patch::Patch = serde_json::from_value(attestation::join_tokens::read_patch()).unwrap();
    patch_as_signer(kubeconfig, name, &kube::api::Patch::Json::<Value>(patch))
}

/// Patches Secret `name` in kube-system as the signer's workload user (`kubeconfig`): the Secret
/// as JSON, or the apiserver's refusal. (kubectl patch reads the object first, which the signer's
/// role does not allow: its own requests do not.)
fn patch_as_signer(
    kubeconfig: &std::path::Path,
    name: &str,
    patch: &kube::api::Patch<Value>,
) -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(client, "kube-system");
        api.patch(name, &kube::api::PatchParams::default(), patch)
            .await
            .map(|secret| serde_json::to_string(&secret).unwrap())
            .map_err(|e| format!("{e:?}"))
    })
}

fn merge(patch: &str) -> kube::api::Patch<Value> {
    kube::api::Patch::Merge(serde_json::from_str(patch).unwrap())
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

/// Refused by the named shipped admission policy.
fn refused_by_policy(env: &Envtest, user: &str, args: &[&str], policy: &str) {
    let (ok, text) = as_user(env, user, args);
    assert!(
        !ok && text.contains(&format!("ValidatingAdmissionPolicy '{policy}'")),
        "{user} must be refused {args:?} by {policy}: {text}"
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
    // 2030-01-05T00:00:00Z: the expiration moved, as the join-token duty moves it.
    let patch = r#"{"data":{"expiration":"MjAzMC0wMS0wNVQwMDowMDowMFo="}}"#;
    // SPEC section 7 (revision 5): no read of a Secret the signer does not manage. RBAC cannot
    // name a type or a prefix, so no Secret is readable at all, its own tokens included; it
    // reads a token with the type-testing JSON Patch the duty sends.
    forbidden(
        &env,
        WORKLOAD_USER,
        &["get", "secret", "-n", "kube-system", "bootstrap-token-rbac01"],
    );
    forbidden(
        &env,
        WORKLOAD_USER,
        &["get", "secret", "-n", "kube-system", "cloud-credentials"],
    );
    // kubectl patch reads before it patches: the signer's own client (its duty's request) does not.
    let (cert, key) = env.client_certificate(WORKLOAD_USER, &[]);
    let signer_kubeconfig = env.kubeconfig_for_certificate("signer", &cert, &key);
    let read = |name: &str| read_as_signer(&signer_kubeconfig, name);
    let text = read("bootstrap-token-rbac01").expect("the type-testing read returns the token");
    assert!(text.contains(r#""token-id":"cmJhYzAx""#), "{text}");
    for other in ["bootstrap-token-fake01", "cloud-credentials"] {
        let refusal = read(other).expect_err("not a token");
        assert!(!refusal.contains("dmFsdWU="), "{other} must not be read: {refusal}");
    }
    // What the policy bounds: a token's other data, type, labels are not the signer's to change.
    for bad in [
        r#"{"data":{"token-secret":"YWFhYWFhYWFhYWFhYWFhYQ=="}}"#,
        r#"{"metadata":{"labels":{"x":"y"}}}"#,
        r#"{"data":{"auth-extra-groups":"c3lzdGVtOm1hc3RlcnM="}}"#,
        // A token that never expires: its expiration removed.
        r#"{"data":{"expiration":null}}"#,
    ] {
        let refusal = patch_as_signer(&signer_kubeconfig, "bootstrap-token-rbac01", &merge(bad)).expect_err(bad);
        assert!(refusal.contains("ValidatingAdmissionPolicy"), "{bad}: {refusal}");
    }
    forbidden(&env, WORKLOAD_USER, &["get", "secrets", "-n", "kube-system"]);
    forbidden(&env, WORKLOAD_USER, &["get", "secret", "-n", "default", "anything"]);
    patch_as_signer(&signer_kubeconfig, "bootstrap-token-rbac01", &merge(patch)).expect("an expiration change");
    for other in ["bootstrap-token-fake01", "cloud-credentials"] {
        let refusal = patch_as_signer(&signer_kubeconfig, other, &merge(patch)).expect_err(other);
        assert!(
            refusal.contains("ValidatingAdmissionPolicy") && !refusal.contains("dmFsdWU="),
            "{other}: {refusal}"
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
    // Without the admission policy (as on Kubernetes before 1.30), the signer's own read still
    // gets nothing of a Secret that is not a bootstrap token: the apiserver refuses the type
    // test (422) before anything is written or returned.
    env.kubectl(&[
        "delete",
        "validatingadmissionpolicybinding",
        "node-attestation-signer-join-tokens",
    ]);
    for other in ["bootstrap-token-fake01", "cloud-credentials"] {
        let refusal = read(other).expect_err("not a token");
        assert!(
            refusal.contains("422") && !refusal.contains("dmFsdWU=") && !refusal.contains("ZmFrZTAx"),
            "{other} must be refused by the type test: {refusal}"
        );
    }
    allowed(
        &env,
        WORKLOAD_USER,
        &["delete", "secret", "-n", "kube-system", "bootstrap-token-rbac01"],
    );
    allowed(&env, WORKLOAD_USER, &["get", "nodes"]);
    // Revocation (SPEC section 7): its record and its list, no other ConfigMap, nothing deleted.
    for name in ["node-attestation-issued-3", "node-attestation-revoked"] {
        allowed(
            &env,
            WORKLOAD_USER,
            &["create", "configmap", "-n", "kube-system", name, "--from-literal=k=v"],
        );
        allowed(&env, WORKLOAD_USER, &["get", "configmap", "-n", "kube-system", name]);
        forbidden(&env, WORKLOAD_USER, &["delete", "configmap", "-n", "kube-system", name]);
    }
    refused_by_policy(
        &env,
        WORKLOAD_USER,
        &[
            "create",
            "configmap",
            "-n",
            "kube-system",
            "kube-proxy-config",
            "--from-literal=k=v",
        ],
        "node-attestation-signer-configmaps",
    );
    refused_by_policy(
        &env,
        WORKLOAD_USER,
        &[
            "create",
            "configmap",
            "-n",
            "kube-system",
            "node-attestation-issued-g",
            "--from-literal=k=v",
        ],
        "node-attestation-signer-configmaps",
    );
    forbidden(
        &env,
        WORKLOAD_USER,
        &["get", "configmap", "-n", "kube-system", "kubeadm-config"],
    );
    forbidden(&env, WORKLOAD_USER, &["get", "configmaps", "-n", "kube-system"]);
    forbidden(
        &env,
        WORKLOAD_USER,
        &["create", "configmap", "-n", "default", "x", "--from-literal=k=v"],
    );
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
    // tpm/v1 boot policies: a ConfigMap by name, never a list.
    let (ok, text) = as_user(
        &env,
        MANAGEMENT_SA,
        &["get", "configmap", "boot-policy", "-n", capi::NAMESPACE],
    );
    assert!(
        !ok && text.contains("NotFound"),
        "a ConfigMap by name is readable (here: absent): {text}"
    );
    forbidden(&env, MANAGEMENT_SA, &["get", "configmaps", "-n", capi::NAMESPACE]);
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
