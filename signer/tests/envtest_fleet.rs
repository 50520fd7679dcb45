//! The signer as a fleet service, on real kube-apiservers (`KUBEBUILDER_ASSETS`; skipped loudly
//! without): two workload clusters at once, one of them stopped and restarted, re-keyed and
//! removed; two Clusters sharing a CA refused; the signer killed mid-run and restarted with
//! nothing lost and nothing signed twice, and approved-but-unsigned CSRs re-verified; a
//! scale-up larger than the queue signed without waiting for the resync.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use attestation::names::SIGNER_INSECURE;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use kube::api::PostParams;
use kube::{Api, Client};
use rcgen::SanType;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, metric, wait_final};
use tests::strict_der::assert_strict_der_pem;

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(40);

fn pid(name: &str) -> String {
    format!("aws:///eu-west-1b/i-{name}")
}

async fn machine(management: &Client, w: &Workload, name: &str) {
    w.add_machine(management, name, &pid(name)).await;
}

async fn join(w: &Workload, csr: &str, node: &str) -> Final {
    file_csr(
        &w.bootstrap,
        csr,
        SIGNER_INSECURE,
        &RequestSpec::kubelet(node, &pid(node)).build(),
        CLIENT_USAGES,
    )
    .await;
    wait_final(&w.admin, csr, false, WAIT).await
}

async fn eventually(what: &str, signer: &Signer, mut check: impl FnMut(&str) -> bool) {
    for _ in 0..150 {
        if check(&signer.metrics()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what} never held; metrics:\n{}\nlog:\n{}",
        signer.metrics(),
        signer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn two_workload_clusters_one_down_re_keyed_removed_and_a_shared_ca_refused() {
    let management_env = Envtest::start("envtest_fleet (management)");
    let edge_env = Envtest::start("envtest_fleet (edge)");
    management_env.install_capi_crds();
    let management = live::client(&management_env.admin_kubeconfig).await;
    let prod = Workload::register(management_env, &management, "team-a", "prod", "insecure").await;
    let mut edge = Workload::register(edge_env, &management, "team-b", "edge", "insecure").await;
    for i in 0..5 {
        machine(&management, &prod, &format!("prod-{i}")).await;
        machine(&management, &edge, &format!("edge-{i}")).await;
    }
    let signer = Signer::start(Path::new(SIGNER_BIN), &prod.env, &["--csr-max-age", "12s"]).await;

    // Both clusters served at once, each signing with its own CA.
    let (a, b) = tokio::join!(join(&prod, "prod-0", "prod-0"), join(&edge, "edge-0", "edge-0"));
    let Final::Issued(edge_cert) = b else {
        panic!("edge: {b:?}\n{}", signer.log())
    };
    assert!(matches!(a, Final::Issued(_)), "prod: {a:?}");
    let key = tests::csr::key(attestation::request::KeyAlgorithm::EcdsaP256).private_key_pem();
    let edge_node = edge.env.kubeconfig_for_certificate("edge-0", &edge_cert, &key);
    let whoami = edge.env.kubectl_as(
        &edge_node,
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&whoami.stdout),
        "system:node:edge-0",
        "edge's CA signed it"
    );
    eventually("two clusters Ready", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"Ready\"}") == 2.0
    })
    .await;

    // The edge apiserver goes down: prod is still served; edge is reported unreachable.
    edge.env.stop_apiserver();
    assert!(
        matches!(join(&prod, "prod-1", "prod-1").await, Final::Issued(_)),
        "prod while edge is down"
    );
    eventually("edge Unreachable", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"Unreachable\"}") == 1.0
    })
    .await;
    edge.env.start_apiserver();
    let back = join(&edge, "edge-1", "edge-1").await;
    assert!(
        matches!(back, Final::Issued(_)),
        "edge after its restart: {back:?}\n{}",
        signer.log()
    );

    // Re-keyed: the signer's kubeconfig for edge is replaced by a new certificate.
    let (cert, key_pem) = edge.env.client_certificate("node-attestation-signer", &[]);
    let rotated =
        std::fs::read_to_string(edge.env.kubeconfig_for_certificate("signer-rotated", &cert, &key_pem)).unwrap();
    apply(
        &management,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-kubeconfig", "namespace": "team-b"}, "stringData": {"value": rotated}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        matches!(join(&edge, "edge-2", "edge-2").await, Final::Issued(_)),
        "edge after re-keying"
    );

    // A second Cluster with prod's CA: both refused, prod's CSRs wait; removing it resumes prod.
    let mut copycat = capi::cluster("insecure");
    copycat["metadata"]["name"] = json!("copycat");
    copycat["metadata"]["namespace"] = json!("team-c");
    apply(
        &management,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-c"}}),
    )
    .await;
    for (name, suffix) in [("copycat-kubeconfig", "prod-kubeconfig"), ("copycat-ca", "prod-ca")] {
        let mut secret = live::get(
            &management,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": suffix, "namespace": "team-a"}}),
        )
        .await;
        secret["metadata"] = json!({"name": name, "namespace": "team-c"});
        apply(&management, &secret).await;
    }
    apply(&management, &copycat).await;
    eventually("both refused for the shared CA", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"SharedCa\"}") == 2.0
    })
    .await;
    file_csr(
        &prod.bootstrap,
        "prod-2",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("prod-2", &pid("prod-2")).build(),
        CLIENT_USAGES,
    )
    .await;
    assert_eq!(
        wait_final(&prod.admin, "prod-2", false, Duration::from_secs(4)).await,
        Final::Pending,
        "refused cluster: nothing decided"
    );
    live::delete(&management, &copycat).await;
    let resumed = wait_final(&prod.admin, "prod-2", false, WAIT).await;
    assert!(matches!(resumed, Final::Issued(_)), "prod resumed: {resumed:?}");

    // prod's CA Secret disappears: a transient gap. CSRs wait (nothing claimed), are signed
    // once it is back, and are denied Expired when it stays away past --csr-max-age.
    let ca_secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "prod-ca", "namespace": "team-a"}});
    let saved = live::get(&management, &ca_secret).await;
    live::delete(&management, &ca_secret).await;
    eventually("prod without a CA", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"SecretsInvalid\"}") == 1.0
    })
    .await;
    file_csr(
        &prod.bootstrap,
        "prod-3",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("prod-3", &pid("prod-3")).build(),
        CLIENT_USAGES,
    )
    .await;
    assert_eq!(
        wait_final(&prod.admin, "prod-3", false, Duration::from_secs(3)).await,
        Final::Pending,
        "no CA: waits"
    );
    let prod3 = live::get(&management, &prod.own(capi::machine("prod-3", None))).await;
    assert!(
        prod3["metadata"]["annotations"]
            .get("cluster.x-k8s.io/kubelet-claim")
            .is_none(),
        "nothing claimed without a CA"
    );
    let mut restored = saved.clone();
    restored["metadata"] = json!({"name": "prod-ca", "namespace": "team-a"});
    apply(&management, &restored).await;
    assert!(
        matches!(wait_final(&prod.admin, "prod-3", false, WAIT).await, Final::Issued(_)),
        "signed once the CA is back"
    );
    live::delete(&management, &ca_secret).await;
    eventually("prod without a CA again", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"SecretsInvalid\"}") == 1.0
    })
    .await;
    let expired = join(&prod, "prod-4", "prod-4").await;
    assert_eq!(expired.reason(), Some("Expired"), "{expired:?}");
    apply(&management, &restored).await;

    // Removed (opted out): edge's CSRs are left alone.
    let mut opted_out = capi::cluster("insecure");
    opted_out["metadata"]["name"] = json!("edge");
    opted_out["metadata"]["namespace"] = json!("team-b");
    opted_out["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-authentication"] = json!("false");
    apply(&management, &opted_out).await;
    eventually("one cluster left", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"Ready\"}") == 1.0
    })
    .await;
    file_csr(
        &edge.bootstrap,
        "edge-3",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("edge-3", &pid("edge-3")).build(),
        CLIENT_USAGES,
    )
    .await;
    assert_eq!(
        wait_final(&edge.admin, "edge-3", false, Duration::from_secs(4)).await,
        Final::Pending
    );
}

async fn approve_as_admin(admin: &Client, name: &str) {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut csr = api.get(name).await.unwrap();
    csr.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("ManualApproval".into()),
            message: Some("approved by hand while the signer was down".into()),
            ..Default::default()
        });
    api.replace_subresource("approval", name, &PostParams::default(), &csr)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_signer_killed_mid_run_loses_nothing_and_signs_nothing_twice() {
    let env = Envtest::start("envtest_fleet (restart)");
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &management, "team-a", "prod", "insecure").await;
    const N: usize = 30;
    for i in 0..N {
        machine(&management, &w, &format!("m-{i}")).await;
    }
    machine(&management, &w, "by-hand").await;
    // Leader election on (the default): the restarted process waits out the dead one's Lease.
    let mut signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());

    let requests: Vec<(String, Vec<u8>)> = (0..N)
        .map(|i| {
            (
                format!("m-{i}"),
                RequestSpec::kubelet(&format!("m-{i}"), &pid(&format!("m-{i}"))).build(),
            )
        })
        .collect();
    let filing = requests
        .iter()
        .map(|(name, request)| file_csr(&w.bootstrap, name, SIGNER_INSECURE, request, CLIENT_USAGES));
    futures::future::join_all(filing).await;

    // Kill it as soon as a few are signed: the rest are mid-flight or not yet seen.
    for _ in 0..300 {
        if issued(&csrs).await.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signer.kill();
    let before = issued(&csrs).await;
    assert!(
        before.len() < N,
        "the kill came after everything was signed; nothing was tested"
    );

    // While it is down, an operator approves two CSRs by hand: one that holds, one that does not.
    file_csr(
        &w.bootstrap,
        "by-hand",
        SIGNER_INSECURE,
        &RequestSpec::kubelet("by-hand", &pid("by-hand")).build(),
        CLIENT_USAGES,
    )
    .await;
    let bogus = RequestSpec {
        sans: vec![SanType::DnsName("kubernetes.default".try_into().unwrap())],
        ..RequestSpec::kubelet("m-0", &pid("m-0"))
    };
    file_csr(
        &w.bootstrap,
        "bogus-by-hand",
        SIGNER_INSECURE,
        &bogus.build(),
        CLIENT_USAGES,
    )
    .await;
    approve_as_admin(&w.admin, "by-hand").await;
    approve_as_admin(&w.admin, "bogus-by-hand").await;

    signer.restart();
    for (name, _) in &requests {
        let state = wait_final(&w.admin, name, false, Duration::from_secs(60)).await;
        assert!(matches!(state, Final::Issued(_)), "{name}: {state:?}\n{}", signer.log());
    }
    let after = issued(&csrs).await;
    for (name, cert) in &before {
        assert_eq!(after.get(name), Some(cert), "{name} was signed again after the restart");
    }
    for i in 0..N {
        let name = format!("m-{i}");
        let m = live::get(&management, &w.own(capi::machine(&name, None))).await;
        let claim: Value = serde_json::from_str(
            m["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let csr = csrs.get(&name).await.unwrap();
        assert_eq!(
            claim["csrUID"].as_str(),
            csr.metadata.uid.as_deref(),
            "{name} is claimed by its one CSR"
        );
    }
    assert!(
        matches!(wait_final(&w.admin, "by-hand", false, WAIT).await, Final::Issued(_)),
        "approved by hand and valid: re-verified and signed"
    );
    let failed = wait_final(&w.admin, "bogus-by-hand", false, WAIT).await;
    assert_eq!(
        failed.reason(),
        Some("ForbiddenSAN"),
        "approved by hand but invalid: Failed, never signed: {failed:?}"
    );
    assert!(matches!(failed, Final::Failed(..)));

    // A second replica stands by on the Lease; when the leader dies it takes over.
    let mut standby = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(metric(&signer.metrics(), "node_attestation_leader "), 1.0);
    assert_eq!(
        metric(&standby.metrics(), "node_attestation_leader "),
        0.0,
        "two leaders"
    );
    signer.kill();
    for i in 0..3 {
        machine(&management, &w, &format!("late-{i}")).await;
        let name = format!("late-{i}");
        file_csr(
            &w.bootstrap,
            &name,
            SIGNER_INSECURE,
            &RequestSpec::kubelet(&name, &pid(&name)).build(),
            CLIENT_USAGES,
        )
        .await;
    }
    for i in 0..3 {
        let state = wait_final(&w.admin, &format!("late-{i}"), false, Duration::from_secs(60)).await;
        assert!(
            matches!(state, Final::Issued(_)),
            "late-{i} after fail-over: {state:?}\n{}",
            standby.log()
        );
    }
    assert_eq!(metric(&standby.metrics(), "node_attestation_leader "), 1.0);
    let end = issued(&csrs).await;
    for (name, cert) in &after {
        assert_eq!(end.get(name), Some(cert), "{name} was signed again after the fail-over");
    }
    for (name, cert) in &end {
        assert_strict_der_pem(&format!("CSR {name}'s status.certificate"), cert.as_bytes());
    }
    assert!(standby.alive());

    // A graceful stop (SIGTERM) releases the Lease instead of leaving it held until it expires;
    // the standby takes it at its next look.
    signer.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        metric(&signer.metrics(), "node_attestation_leader "),
        0.0,
        "standing by"
    );
    let leader_pid = standby.pid().unwrap();
    standby.terminate();
    let lease = w.env.kubectl(&[
        "get",
        "lease",
        "node-attestation-signer",
        "-n",
        "node-attestation-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let holder = String::from_utf8_lossy(&lease.stdout).into_owned();
    assert!(
        !holder.ends_with(&format!("_{leader_pid}")),
        "the stopped leader still holds the Lease: {holder}"
    );
    let stopped = std::time::Instant::now();
    while metric(&signer.metrics(), "node_attestation_leader ") != 1.0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "no hand-over after SIGTERM\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn issued(csrs: &Api<CertificateSigningRequest>) -> BTreeMap<String, String> {
    csrs.list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| match live::state_of(&c) {
            Final::Issued(pem) => Some((c.metadata.name.unwrap_or_default(), pem)),
            _ => None,
        })
        .collect()
}

/// The cluster gauges follow a worker's state when it changes, not at the fleet's next pass:
/// with the default `--resync-period` (30 s), a Cluster gained at start used to show
/// `Unreachable` for up to 30 s after its CSRs were watched (what made a starting replica
/// seem to take 30 s to take its share), and an apiserver going down was reported as late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn cluster_states_are_reported_when_they_change_not_at_the_next_resync() {
    let management_env = Envtest::start("envtest_fleet (gauges)");
    let workload_env = Envtest::start("envtest_fleet (gauges workload)");
    management_env.install_capi_crds();
    let management = live::client(&management_env.admin_kubeconfig).await;
    let mut w = Workload::register(workload_env, &management, "team-g", "gauges", "insecure").await;
    // (Its return is left out: when the RBAC of a restarted apiserver answers is the watch's
    // backoff, not the gauges'.)
    machine(&management, &w, "g-0").await;
    let started = std::time::Instant::now();
    let signer = Signer::start_with_defaults(Path::new(SIGNER_BIN), &management_env, &["--leader-elect=false"]).await;
    let within = |what: &'static str, state: &'static str| {
        let signer = &signer;
        async move {
            let since = std::time::Instant::now();
            while since.elapsed() < Duration::from_secs(15) {
                if metric(
                    &signer.metrics(),
                    &format!("node_attestation_clusters{{state=\"{state}\"}}"),
                ) == 1.0
                {
                    return since.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{what}: not {state} within 15 s (the resync is 30 s)\n{}", signer.log());
        }
    };
    within("at start", "Ready").await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "Ready only after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(join(&w, "g-0", "g-0").await, Final::Issued(_)),
        "{}",
        signer.log()
    );
    w.env.stop_apiserver();
    within("apiserver stopped", "Unreachable").await;
}

/// A scale-up of more CSRs at once than the queue holds: the names a full queue drops are
/// queued again from the watch cache once it has drained to half, not at the next resync (30 s
/// here). One CSR of the cluster in flight at a time and a queue of 2 make most of the 12
/// filings drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_scale_up_larger_than_the_queue_is_signed_without_waiting_for_the_resync() {
    let management_env = Envtest::start("envtest_fleet (refill)");
    let workload_env = Envtest::start("envtest_fleet (refill workload)");
    management_env.install_capi_crds();
    let management = live::client(&management_env.admin_kubeconfig).await;
    let w = Workload::register(workload_env, &management, "team-q", "queue", "insecure").await;
    let nodes: Vec<String> = (0..12).map(|i| format!("q-{i}")).collect();
    for node in &nodes {
        machine(&management, &w, node).await;
    }
    let signer = Signer::start_with_defaults(
        Path::new(SIGNER_BIN),
        &management_env,
        &[
            "--leader-elect=false",
            "--queue-capacity=2",
            "--concurrency-per-cluster=1",
        ],
    )
    .await;
    eventually("the cluster served", &signer, |m| {
        metric(m, "node_attestation_clusters{state=\"Ready\"}") == 1.0
    })
    .await;
    let filed = std::time::Instant::now();
    let filings: Vec<_> = nodes
        .iter()
        .map(|node| {
            let bootstrap = w.bootstrap.clone();
            let node = node.clone();
            tokio::spawn(async move {
                file_csr(
                    &bootstrap,
                    &node,
                    SIGNER_INSECURE,
                    &RequestSpec::kubelet(&node, &pid(&node)).build(),
                    CLIENT_USAGES,
                )
                .await;
            })
        })
        .collect();
    for filing in filings {
        filing.await.unwrap();
    }
    for node in &nodes {
        let left = Duration::from_secs(15).saturating_sub(filed.elapsed());
        assert!(
            matches!(wait_final(&w.admin, node, false, left).await, Final::Issued(_)),
            "{node} not issued within 15 s of the filings (the resync is 30 s)\n{}",
            signer.log()
        );
    }
    assert!(
        metric(&signer.metrics(), "node_attestation_queue_dropped_total") > 0.0,
        "the queue dropped no name: the test proves nothing\n{}",
        signer.metrics()
    );
}
