//! No per-cluster setup (SPEC section 7), proven on real apiservers (`KUBEBUILDER_ASSETS`;
//! skipped loudly without): a workload cluster left as Cluster API leaves it (an admin
//! kubeconfig in `<cluster>-kubeconfig`, its CA in `<cluster>-ca`, no RBAC for the signer),
//! audited by its kube-apiserver. The signer puts its RBAC in place with the admin identity,
//! then acts only as user `node-attestation-signer` with certificates it issues itself, past the
//! expiry of the first one; a Cluster with an operator's kubeconfig is served with that one, as
//! it is, and gets no RBAC write at all.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, CLUSTER_API_ADMIN, Final, Signer, Workload, apply, file_csr, metric, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const SIGNER_USER: &str = "node-attestation-signer";
/// The shortest lifetime the signer takes: renewed after 2 minutes, expired after 3.
const LIFETIME: Duration = Duration::from_secs(180);

/// Every write (create, update, patch, delete) in an audit log: (user, groups, verb, URI, time).
fn writes(audit_log: &std::path::Path) -> Vec<(String, Vec<String>, String, String, String)> {
    let text = std::fs::read_to_string(audit_log).unwrap();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .map(|e| {
            let groups = e["user"]["groups"]
                .as_array()
                .map(|g| g.iter().filter_map(|g| g.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            (
                e["user"]["username"].as_str().unwrap_or_default().to_owned(),
                groups,
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
                e["stageTimestamp"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn join(w: &Workload, node: &str) -> Final {
    let spec = RequestSpec::kubelet(node, &format!("aws:///us-east-1a/i-{node}"));
    file_csr(
        &w.bootstrap,
        &format!("csr-{node}"),
        SIGNER_INSECURE,
        &spec.build(),
        CLIENT_USAGES,
    )
    .await;
    wait_final(&w.admin, &format!("csr-{node}"), false, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn the_signer_acts_in_a_workload_cluster_as_itself_with_certificates_it_issues_and_renews() {
    let started = Instant::now();
    let management = Envtest::start("envtest_workload_identity management");
    management.install_capi_crds();
    let management_admin = live::client(&management.admin_kubeconfig).await;

    let audit = tempfile::tempdir().unwrap();
    let policy = audit.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .unwrap();
    let audit_log = audit.path().join("audit.log");
    let workload_env = Envtest::start_with(
        "envtest_workload_identity workload",
        &[
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ],
    );
    let w = Workload::register(
        workload_env,
        &management_admin,
        capi::NAMESPACE,
        capi::CLUSTER,
        "insecure",
    )
    .await;
    // kubeadm's bootstrap binding: the signer deletes it, a write of its own.
    apply(
        &w.admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:node-autoapprove-bootstrap"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}),
    )
    .await;
    for node in ["worker-0", "worker-1"] {
        w.add_machine(&management_admin, node, &format!("aws:///us-east-1a/i-{node}"))
            .await;
    }
    let written_before_signer = writes(&audit_log).len();

    let lifetime = format!("{}s", LIFETIME.as_secs());
    let signer = Signer::start(
        std::path::Path::new(SIGNER_BIN),
        &management,
        &["--workload-certificate-duration", &lifetime],
    )
    .await;

    let first = join(&w, "worker-0").await;
    assert!(
        matches!(first, Final::Issued(_)),
        "worker-0: {first:?}\n{}",
        signer.log()
    );
    let first_issued = Instant::now();
    // A second Cluster, on an apiserver of its own (two Clusters on one apiserver would both
    // judge its CSRs), given an operator's kubeconfig and no `<cluster>-kubeconfig` at all:
    // served with that kubeconfig, as it is. The operator applies config/workload there.
    let operated = Envtest::start("envtest_workload_identity operated");
    let operated_admin = live::client(&operated.admin_kubeconfig).await;
    live::apply_file(&operated_admin, "config/workload/workload-cluster.yaml").await;
    let (cert, key) = operated.client_certificate(SIGNER_USER, &[]);
    let kubeconfig =
        std::fs::read_to_string(operated.kubeconfig_for_certificate("operator-given", &cert, &key)).unwrap();
    let mut cluster = capi::cluster("insecure");
    cluster["metadata"]["name"] = json!("operated");
    cluster["metadata"]["namespace"] = json!(capi::NAMESPACE);
    apply(&management_admin, &cluster).await;
    apply(
        &management_admin,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "operated-node-attestation-kubeconfig", "namespace": capi::NAMESPACE},
                "stringData": {"value": kubeconfig}}),
    )
    .await;
    apply(
        &management_admin,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "operated-ca", "namespace": capi::NAMESPACE},
                "stringData": {"tls.crt": String::from_utf8_lossy(&operated.client_ca.cert_pem),
                               "tls.key": String::from_utf8_lossy(&operated.client_ca.key_pem)}}),
    )
    .await;
    let ready = |text: &str| metric(text, "node_attestation_clusters{state=\"Ready\"}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ready(&signer.metrics()) < 2.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        ready(&signer.metrics()),
        2.0,
        "both Clusters served (the operator's kubeconfig too)\n{}",
        signer.log()
    );

    // Past the first certificate's NotAfter: only a renewed one can still act.
    tokio::time::sleep_until((first_issued + LIFETIME + Duration::from_secs(20)).into()).await;
    let second = join(&w, "worker-1").await;
    assert!(
        matches!(second, Final::Issued(_)),
        "worker-1, after the first certificate expired: {second:?}\n{}",
        signer.log()
    );
    let text = signer.metrics();
    assert!(
        metric(
            &text,
            "node_attestation_workload_identity_certificates_total{result=\"issued\"}"
        ) >= 2.0,
        "renewed at least once\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "node_attestation_workload_identity_certificates_total{result=\"failed\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &text,
            "node_attestation_workload_rbac_applies_total{result=\"applied\"}"
        ),
        1.0,
        "one apply, for the one Cluster without an operator's kubeconfig\n{text}"
    );

    let all = writes(&audit_log);
    let signers: Vec<_> = all[written_before_signer..].iter().collect();
    let admin: Vec<_> = signers.iter().filter(|w| w.0 == CLUSTER_API_ADMIN).collect();
    let own: Vec<_> = signers.iter().filter(|w| w.0 == SIGNER_USER).collect();
    let others: BTreeSet<&str> = signers
        .iter()
        .map(|w| w.0.as_str())
        .filter(|u| ![CLUSTER_API_ADMIN, SIGNER_USER, "admin"].contains(u) && !u.starts_with("system:"))
        .collect();
    assert!(others.is_empty(), "writes by {others:?}");

    // The admin identity wrote the twelve RBAC objects, server-side applied under the signer's
    // field manager, and nothing else.
    let admin_objects: BTreeSet<String> = admin
        .iter()
        .map(|(_, _, verb, uri, _)| {
            assert_eq!(verb, "patch", "{uri}");
            assert!(uri.contains("fieldManager=node-attestation-signer"), "{uri}");
            uri.split('?').next().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        admin_objects,
        BTreeSet::from([
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/node-attestation-signer-workload".to_owned(),
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/node-attestation-signer-workload".to_owned(),
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles/node-attestation-signer-join-tokens".to_owned(),
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/node-attestation-signer-join-tokens".to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/node-attestation-signer-join-tokens".to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/node-attestation-signer-join-tokens"
                .to_owned(),
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles/node-attestation-signer-revocation".to_owned(),
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings/node-attestation-signer-revocation".to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/node-attestation-signer-configmaps".to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/node-attestation-signer-configmaps"
                .to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/node-attestation-revoked-certificates"
                .to_owned(),
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/node-attestation-revoked-certificates"
                .to_owned(),
        ]),
        "the admin identity's writes"
    );
    assert_eq!(admin.len(), 12, "each applied once: {admin:#?}");
    let rbac_done = admin.iter().map(|w| w.4.clone()).max().unwrap();
    let first_own = own
        .iter()
        .map(|w| w.4.clone())
        .min()
        .expect("the signer wrote as itself");
    assert!(
        rbac_done <= first_own,
        "every admin write comes before the signer's first own write ({rbac_done} > {first_own})"
    );

    // As itself: in no group but system:authenticated, approving, signing and deleting the
    // bootstrap binding; over three minutes, so with more than one certificate.
    for (_, groups, _, uri, _) in &own {
        assert_eq!(groups, &["system:authenticated"], "{uri}");
    }
    let own_uris: Vec<&str> = own.iter().map(|w| w.3.as_str()).collect();
    for wanted in [
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-worker-0/approval",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-worker-0/status",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-worker-1/approval",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-worker-1/status",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kubeadm:node-autoapprove-bootstrap",
        // Revocation: its record, then its list, as itself.
        "/api/v1/namespaces/kube-system/configmaps/node-attestation-issued-",
        "/api/v1/namespaces/kube-system/configmaps",
    ] {
        assert!(
            own_uris.iter().any(|u| u.starts_with(wanted)),
            "{wanted} written as {SIGNER_USER}: {own_uris:#?}"
        );
    }
    eprintln!(
        "audit: {} writes in the workload cluster after the signer started; by the signer: {} as {CLUSTER_API_ADMIN} (its RBAC), {} as {SIGNER_USER}; suite {:?}",
        signers.len(),
        admin.len(),
        own.len(),
        started.elapsed()
    );
}
