//! `node-attestation-signer run` against a real kube-apiserver and etcd (`KUBEBUILDER_ASSETS`;
//! skipped loudly without), with the real Cluster API CRDs, running under exactly the RBAC of
//! `config/rbac/` and `config/workload/`. One apiserver plays management and workload cluster here; the
//! multi-cluster and restart suites are in `envtest_fleet.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use attestation::names::{SIGNER_INSECURE, SIGNER_KUBELET_SERVING, SIGNER_TPM};
use attestation::request::KeyAlgorithm;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use rcgen::{DnType, SanType};
use serde_json::{Value, json};
use tests::capi;
use tests::csr::{RequestSpec, subject};
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, metric, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(30);

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

/// A bootstrapped Machine `name` with its KubeadmConfig naming the fixture token.
async fn machine(w: &Workload, name: &str, provider_id: Option<&str>) {
    apply(
        &w.admin,
        &w.own(capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2")),
    )
    .await;
    apply(&w.admin, &w.own(capi::machine(name, provider_id))).await;
}

async fn join(w: &Workload, csr_name: &str, spec: &RequestSpec, signer: &str, usages: &[&str]) -> Final {
    file_csr(&w.bootstrap, csr_name, signer, &spec.build(), usages).await;
    wait_final(&w.admin, csr_name, false, WAIT).await
}

fn issued(state: &Final, what: &str) -> String {
    match state {
        Final::Issued(pem) => pem.clone(),
        other => panic!("{what}: expected a certificate, got {other:?}"),
    }
}

fn denied(state: &Final, reason: &str, what: &str) {
    assert_eq!(state.reason(), Some(reason), "{what}: {state:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn the_signer_joins_nodes_denies_hijacks_and_serves_every_rule_on_a_real_apiserver() {
    let env = Envtest::start("envtest_controller");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    // kubeadm's two holes, present before the signer starts.
    apply(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:node-autoapprove-bootstrap"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}),
    )
    .await;
    apply(
        &admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:node-autoapprove-certificate-rotation"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]}),
    )
    .await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-0", "worker-1", "cp-0", "dup-a", "dup-b", "worker-2", "worker-3"] {
        let provider_id = if name.starts_with("dup") { pid("dup") } else { pid(name) };
        machine(&w, name, Some(&provider_id)).await;
    }
    apply(&w.admin, &capi::node("cp-0", Some(&pid("cp-0")))).await;
    let mut signer = Signer::start(std::path::Path::new(SIGNER_BIN), &w.env, &["--csr-max-age", "6s"]).await;

    // The bootstrap binding is removed at once. Node cp-0 joined before the opt-in (its Machine
    // holds no claim): the rotation binding is its only way to renew, so it is kept, and both the
    // Node and the binding are reported (SPEC section 7, "No silent expiry").
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(w.admin.clone());
    let removed = |binding: &'static str| {
        let bindings = bindings.clone();
        async move {
            for _ in 0..100 {
                if bindings.get_opt(binding).await.unwrap().is_none() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            false
        }
    };
    assert!(
        removed("kubeadm:node-autoapprove-bootstrap").await,
        "the bootstrap binding is still present; signer log:\n{}",
        signer.log()
    );
    let event_note = |regarding: &'static str, reason: &'static str| {
        let out = w
            .env
            .kubectl(&["get", "events.events.k8s.io", "-n", capi::NAMESPACE, "-o", "json"]);
        let events: Value = serde_json::from_slice(&out.stdout).unwrap();
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["regarding"]["name"] == regarding && e["reason"] == reason)
            .and_then(|e| e["note"].as_str().map(str::to_owned))
    };
    let mut kept = None;
    for _ in 0..100 {
        kept = event_note("prod", "LegacyRotationKept");
        if kept.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kept = kept.unwrap_or_else(|| panic!("no LegacyRotationKept Event; signer log:\n{}", signer.log()));
    assert!(kept.contains("cp-0"), "the Event names the Node that needs it: {kept}");
    assert!(
        bindings
            .get_opt("kubeadm:node-autoapprove-certificate-rotation")
            .await
            .unwrap()
            .is_some(),
        "kept while cp-0 is outside attestation"
    );
    let outside = event_note("cp-0", "NodeOutsideAttestation").expect("a Warning Event on Machine cp-0");
    assert!(outside.contains("did not issue"), "{outside}");
    let metrics = signer.metrics();
    assert_eq!(
        metric(
            &metrics,
            "node_attestation_nodes_outside_attestation{cluster=\"team-a/prod\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "node_attestation_legacy_binding_kept{cluster=\"team-a/prod\",binding=\"kubeadm:node-autoapprove-certificate-rotation\"}"
        ),
        1.0,
        "{metrics}"
    );

    // A node joins: approved, claimed, signed; the certificate is system:node:worker-0.
    let worker0 = RequestSpec::kubelet("worker-0", &pid("worker-0"));
    let cert = issued(
        &join(&w, "join-worker-0", &worker0, SIGNER_INSECURE, CLIENT_USAGES).await,
        "join",
    );
    let machine0 = live::get(&w.admin, &w.own(capi::machine("worker-0", None))).await;
    let claim: Value = serde_json::from_str(
        machine0["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claim["nodeName"], "worker-0");
    assert_eq!(claim["providerID"], pid("worker-0"));
    let key_pem = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
    let node_kubeconfig = w.env.kubeconfig_for_certificate("worker-0", &cert, &key_pem);
    let whoami: Value = serde_json::from_slice(
        &w.env
            .kubectl_as(&node_kubeconfig, &["auth", "whoami", "-o", "json"], None)
            .stdout,
    )
    .unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "system:node:worker-0");
    let get_node = w.env.kubectl_as(&node_kubeconfig, &["get", "node", "worker-0"], None);
    assert!(
        String::from_utf8_lossy(&get_node.stderr).contains("NotFound"),
        "the Node authorizer answers for its own Node: {}",
        String::from_utf8_lossy(&get_node.stderr)
    );
    let secrets = w.env.kubectl_as(&node_kubeconfig, &["get", "secrets", "-A"], None);
    assert!(String::from_utf8_lossy(&secrets.stderr).contains("Forbidden"));

    // Renewal by the node itself: approved.
    let node = w.node_client("worker-0", &cert, &key_pem).await;
    file_csr(
        &node,
        "renew-worker-0",
        SIGNER_INSECURE,
        &worker0.build(),
        CLIENT_USAGES,
    )
    .await;
    issued(&wait_final(&w.admin, "renew-worker-0", false, WAIT).await, "renewal");
    // Renewal by another node: worker-0 asking for worker-1's identity.
    file_csr(
        &node,
        "renew-as-worker-1",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("worker-1", &pid("worker-1")).build(),
        CLIENT_USAGES,
    )
    .await;
    denied(
        &wait_final(&w.admin, "renew-as-worker-1", false, WAIT).await,
        "RequesterNotAllowed",
        "renewal by another node",
    );

    // Serving CSRs of worker-0: its addresses pass; another name waits, then ForbiddenSAN.
    let serving = RequestSpec::serving(
        "worker-0",
        vec![
            SanType::DnsName("worker-0.internal".try_into().unwrap()),
            SanType::IpAddress("10.0.0.7".parse().unwrap()),
        ],
    );
    file_csr(
        &node,
        "serving-worker-0",
        SIGNER_KUBELET_SERVING,
        &serving.build(),
        &["digital signature", "server auth"],
    )
    .await;
    assert_eq!(
        wait_final(&w.admin, "serving-worker-0", true, WAIT).await,
        Final::Approved
    );
    let evil = RequestSpec::serving(
        "worker-0",
        vec![SanType::DnsName("api.example.com".try_into().unwrap())],
    );
    file_csr(
        &node,
        "serving-evil",
        SIGNER_KUBELET_SERVING,
        &evil.build(),
        &["digital signature", "server auth"],
    )
    .await;
    denied(
        &wait_final(&w.admin, "serving-evil", true, WAIT).await,
        "ForbiddenSAN",
        "serving SAN not the Machine's",
    );

    // Denials, each with its reason.
    let second = join(
        &w,
        "again-worker-0",
        &RequestSpec {
            key: KeyAlgorithm::EcdsaP384,
            ..worker0.clone()
        },
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(
        &second,
        "MachineAlreadyClaimed",
        "a second bootstrap for a claimed Machine",
    );
    let hijack = join(
        &w,
        "hijack-cp-0",
        &RequestSpec::kubelet("cp-0", &pid("cp-0")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(&hijack, "NodeAlreadyRegistered", "the control-plane hijack");
    let nothing = join(
        &w,
        "no-machine",
        &RequestSpec::kubelet("ghost", &pid("ghost")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(&nothing, "MachineNotFound", "no Machine");
    let dup = join(
        &w,
        "dup",
        &RequestSpec::kubelet("dup-a", &pid("dup")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(&dup, "MachineNotFound", "providerID on two Machines");
    let cn = RequestSpec {
        subject: subject(&[
            (DnType::OrganizationName, "system:masters"),
            (DnType::CommonName, "system:node:worker-2"),
        ]),
        ..RequestSpec::kubelet("worker-2", &pid("worker-2"))
    };
    denied(
        &join(&w, "bad-o", &cn, SIGNER_INSECURE, CLIENT_USAGES).await,
        "SubjectMismatch",
        "O wrong",
    );
    let san = RequestSpec {
        sans: vec![SanType::DnsName("worker-2".try_into().unwrap())],
        ..RequestSpec::kubelet("worker-2", &pid("worker-2"))
    };
    denied(
        &join(&w, "with-san", &san, SIGNER_INSECURE, CLIENT_USAGES).await,
        "ForbiddenSAN",
        "SAN present",
    );
    let usage = join(
        &w,
        "extra-usage",
        &RequestSpec::kubelet("worker-2", &pid("worker-2")),
        SIGNER_INSECURE,
        &["digital signature", "client auth", "server auth"],
    )
    .await;
    denied(&usage, "ForbiddenUsage", "extra usage");
    let stranger = w.bootstrap_client("zzzzzz.0123456789abcdef").await;
    file_csr(
        &stranger,
        "other-token",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("worker-2", &pid("worker-2")).build(),
        CLIENT_USAGES,
    )
    .await;
    denied(
        &wait_final(&w.admin, "other-token", false, WAIT).await,
        "RequesterNotAllowed",
        "not the Machine's join token",
    );
    let tpm = join(
        &w,
        "wrong-signer",
        &RequestSpec::kubelet("worker-2", &pid("worker-2")),
        SIGNER_TPM,
        CLIENT_USAGES,
    )
    .await;
    denied(
        &tpm,
        "AttestationNotAllowed",
        "insecure attestation under the tpm signer",
    );
    // The Cluster stops allowing insecure: the same request is refused for the attestor.
    let mut cluster = capi::cluster("tpm");
    cluster["metadata"]["namespace"] = json!(w.namespace);
    apply(&admin, &cluster).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let not_allowed = join(
        &w,
        "not-allowed",
        &RequestSpec::kubelet("worker-2", &pid("worker-2")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(
        &not_allowed,
        "AttestationNotAllowed",
        "attestor not allowed by the Cluster",
    );
    apply(&admin, &capi::cluster("insecure")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A MachinePool instance, found by providerIDList, claimed in the pool's annotation.
    apply(&w.admin, &w.own(capi::kubeadm_config("pool-kc", "abcdef", "v1beta2"))).await;
    apply(
        &w.admin,
        &w.own(capi::machine_pool("pool", &[&pid("pool-1"), &pid("pool-2")])),
    )
    .await;
    let pool = join(
        &w,
        "pool-1",
        &RequestSpec::kubelet("pool-node-1", &pid("pool-1")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    issued(&pool, "MachinePool instance");
    let pool_object = live::get(&w.admin, &w.own(capi::machine_pool("pool", &[]))).await;
    let claims: Value = serde_json::from_str(
        pool_object["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claims"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims[pid("pool-1")]["nodeName"], "pool-node-1");

    // Rules 10 and 11, through the controller's Node index: instance pool-2 registered its Node as
    // pool-node-2 (before any claim); a bootstrap token asking for a new name for it is
    // refused, and so is an instance taking the name the pool's first instance claimed.
    apply(&w.admin, &capi::node("pool-node-2", Some(&pid("pool-2")))).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second_identity = join(
        &w,
        "pool-2-again",
        &RequestSpec::kubelet("pool-node-2b", &pid("pool-2")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(
        &second_identity,
        "NodeAlreadyRegistered",
        "a registered pool instance under a new name",
    );
    apply(
        &w.admin,
        &w.own(capi::machine_pool(
            "pool",
            &[&pid("pool-1"), &pid("pool-2"), &pid("pool-3")],
        )),
    )
    .await;
    let taken = join(
        &w,
        "pool-3",
        &RequestSpec::kubelet("pool-node-1", &pid("pool-3")),
        SIGNER_INSECURE,
        CLIENT_USAGES,
    )
    .await;
    denied(
        &taken,
        "NodeNameMismatch",
        "a pool instance taking another instance's name",
    );

    // Racing CSRs for one Machine: exactly one is signed, every time.
    const RACES: usize = 15;
    for i in 0..RACES {
        let name = format!("race-{i}");
        machine(&w, &name, Some(&pid(&name))).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..RACES {
        let name = format!("race-{i}");
        let a = RequestSpec::kubelet(&name, &pid(&name)).build();
        let b = RequestSpec {
            key: KeyAlgorithm::EcdsaP384,
            ..RequestSpec::kubelet(&name, &pid(&name))
        }
        .build();
        let (bootstrap, a_name, b_name) = (w.bootstrap.clone(), format!("{name}-a"), format!("{name}-b"));
        tokio::join!(
            file_csr(&bootstrap, &a_name, SIGNER_INSECURE, &a, CLIENT_USAGES),
            file_csr(&bootstrap, &b_name, SIGNER_INSECURE, &b, CLIENT_USAGES),
        );
    }
    for i in 0..RACES {
        let a = wait_final(&w.admin, &format!("race-{i}-a"), false, WAIT).await;
        let b = wait_final(&w.admin, &format!("race-{i}-b"), false, WAIT).await;
        let signed = [&a, &b].iter().filter(|s| matches!(s, Final::Issued(_))).count();
        assert_eq!(signed, 1, "race {i}: {a:?} / {b:?}");
        let loser = if matches!(a, Final::Issued(_)) { &b } else { &a };
        assert!(
            matches!(loser.reason(), Some("MachineAlreadyClaimed")),
            "race {i}: the loser is refused for the claim: {loser:?}"
        );
    }

    // cp-0 is adopted (rule 7): it asks with the identity it already holds (a certificate from
    // the cluster CA, as kubeadm issued it before the opt-in) for the Machine whose Node it is.
    // The Machine is claimed for it, and with no Node left outside attestation the rotation
    // binding goes.
    let (cp_cert, cp_key) = w.env.client_certificate("system:node:cp-0", &["system:nodes"]);
    let cp0 = w.node_client("cp-0", &cp_cert, &cp_key).await;
    file_csr(
        &cp0,
        "adopt-cp-0",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("cp-0", &pid("cp-0")).build(),
        CLIENT_USAGES,
    )
    .await;
    issued(
        &wait_final(&w.admin, "adopt-cp-0", false, WAIT).await,
        "adoption of cp-0",
    );
    let machine = live::get(&w.admin, &w.own(capi::machine("cp-0", None))).await;
    let claim: Value = serde_json::from_str(
        machine["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claim["nodeName"], "cp-0");
    // pool-node-2, registered above for a pool instance nobody claimed, is not: a pool instance
    // carries no names, and insecure/v1 does not prove the node is that instance (SPEC rule 7,
    // revision 5). The refusal says how out.
    let (pool_cert, pool_key) = w.env.client_certificate("system:node:pool-node-2", &["system:nodes"]);
    let pool_node = w.node_client("pool-node-2", &pool_cert, &pool_key).await;
    file_csr(
        &pool_node,
        "adopt-pool-node-2",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("pool-node-2", &pid("pool-2")).build(),
        CLIENT_USAGES,
    )
    .await;
    match wait_final(&w.admin, "adopt-pool-node-2", false, WAIT).await {
        Final::Denied(reason, message) => {
            assert_eq!(reason, "RequesterNotAllowed", "{message}");
            assert!(message.contains("reprovision the instance"), "{message}");
        }
        other => panic!("a pool instance's adoption under insecure/v1: {other:?}"),
    }
    // The way out: the instance is reprovisioned. Cluster API's MachinePool controller drops it
    // from spec.providerIDList and deletes its Node (internal/controllers/machinepool,
    // reconcileDeleteNodes).
    apply(
        &w.admin,
        &w.own(capi::machine_pool("pool", &[&pid("pool-1"), &pid("pool-3")])),
    )
    .await;
    live::delete(&w.admin, &capi::node("pool-node-2", Some(&pid("pool-2")))).await;
    // A Node that no Machine names (what a kept legacy identity can register) is reported, but
    // keeps nothing: the rotation binding goes all the same (SPEC section 7, revision 5).
    apply(
        &w.admin,
        &capi::node("stray-legacy", Some("aws:///us-east-1a/i-0stray")),
    )
    .await;
    assert!(
        removed("kubeadm:node-autoapprove-certificate-rotation").await,
        "the rotation binding goes once no Node of a Machine is outside attestation; signer log:\n{}",
        signer.log()
    );
    let mut reported = 0.0;
    for _ in 0..50 {
        reported = metric(
            &signer.metrics(),
            "node_attestation_nodes_outside_attestation{cluster=\"team-a/prod\"}",
        );
        if reported == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(reported, 1.0, "stray-legacy is reported outside attestation");
    let gone = event_note("prod", "LegacyAutoapproveRemoved");
    assert!(gone.is_some(), "the removal is an Event");

    // Every CSR this suite filed has ended; none pending, none approved twice.
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());
    for csr in csrs.list(&Default::default()).await.unwrap() {
        let state = live::state_of(&csr);
        assert_ne!(
            state,
            Final::Pending,
            "{} left pending",
            csr.metadata.name.unwrap_or_default()
        );
    }

    // Metrics and Events tell the same story.
    let metrics = signer.metrics();
    assert!(
        metric(
            &metrics,
            "node_attestation_decisions_total{cluster=\"team-a/prod\",signer=\"cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure\",decision=\"Approved\""
        ) >= (3 + RACES) as f64,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "node_attestation_decisions_total{cluster=\"team-a/prod\",signer=\"cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure\",decision=\"Denied\",reason=\"NodeAlreadyRegistered\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "node_attestation_clusters{state=\"Ready\"}"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "node_attestation_legacy_autoapprove_binding{cluster=\"team-a/prod\",binding=\"kubeadm:node-autoapprove-certificate-rotation\"}"
        ),
        0.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "node_attestation_issue_latency_seconds_count") >= (3 + RACES) as f64,
        "{metrics}"
    );
    // The served CA's NotAfter, as the CA certificate says it.
    let ca_not_after = {
        let pem = pem::parse(&w.env.client_ca.cert_pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(pem.contents()).unwrap();
        cert.validity().not_after.timestamp() as f64
    };
    assert_eq!(
        metric(
            &metrics,
            "node_attestation_cluster_ca_not_after_timestamp_seconds{cluster=\"team-a/prod\"}"
        ),
        ca_not_after,
        "{metrics}"
    );
    // No tpm/v1 CSR needed it, but the signer loads its challenge key at start.
    assert_eq!(
        metric(&metrics, "node_attestation_tpm_challenge_key_loaded"),
        1.0,
        "{metrics}"
    );
    let reasons: Vec<(String, String)> = live::events(&w.env, capi::NAMESPACE)
        .into_iter()
        .map(|(regarding, reason, _)| (regarding, reason))
        .collect();
    assert!(
        !reasons.iter().any(|(_, r)| r == "CertificateIssued"),
        "a certificate's record is its approval condition, not an Event: {reasons:?}"
    );
    for expected in [
        ("cp-0", "CSRDenied"),
        ("prod", "LegacyAutoapproveBinding"),
        ("prod", "CSRDenied"),
    ] {
        assert!(
            reasons.iter().any(|(n, r)| n == expected.0 && r == expected.1),
            "no Event {expected:?} in {reasons:?}"
        );
    }
    assert!(signer.alive(), "the signer is still running; log:\n{}", signer.log());
}
