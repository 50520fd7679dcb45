//! Faults a replica meets, on a real kube-apiserver from `KUBEBUILDER_ASSETS`.
//!
//! - Cut off from the management apiserver (a proxy the test cuts) while its workload cluster
//!   stays reachable: a Machine created meanwhile is absent from its cache, and the CSR that
//!   comes for it a second later must wait, not be denied `MachineNotFound` (final) from the
//!   stale cache. Once the connection is back, the CSR is issued.
//! - Stopped between approving a CSR and writing its certificate: the approval condition, which
//!   names the Machine and the replica, is the record of the issuance (SPEC section 3, revision
//!   5) and is there already; whoever comes next re-verifies and signs, and no Event is written
//!   in the management cluster for any certificate.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::time::Duration;

use attestation::names::SIGNER_INSECURE;
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, file_csr, wait_final};
use tests::proxy::Proxy;

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];

fn pid(name: &str) -> String {
    format!("aws:///eu-west-1b/i-{name}")
}

/// Files `csr`, the join of Machine `machine` by the bootstrap token, and waits `within` for it
/// to end.
async fn join(w: &Workload, csr: &str, machine: &str, within: Duration) -> Final {
    let request = RequestSpec::kubelet(machine, &pid(machine)).build();
    file_csr(&w.bootstrap, csr, SIGNER_INSECURE, &request, CLIENT_USAGES).await;
    wait_final(&w.admin, csr, false, within).await
}

/// The signer started with `extra`, reaching the management cluster through a proxy the test
/// can cut; its workload client (from the Cluster's kubeconfig Secret) goes straight to the
/// apiserver.
async fn behind_a_proxy(w: &Workload, extra: &[&str]) -> (Proxy, Signer) {
    let direct = Signer::management_identity(&w.env).await;
    let server: std::net::SocketAddr = w.env.server.trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(server);
    let proxied = w.env.dir().join("signer-through-proxy.kubeconfig");
    let text = std::fs::read_to_string(&direct).unwrap();
    std::fs::write(&proxied, text.replace(&w.env.server, &proxy.url())).unwrap();
    let signer = Signer::run_as(Path::new(SIGNER_BIN), &w.env, &proxied, extra);
    (proxy, signer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_replica_cut_off_from_the_management_cluster_never_denies_a_machine_it_has_not_seen() {
    let env = Envtest::start("envtest_faults_cut");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    w.add_machine(&admin, "worker-0", &pid("worker-0")).await;

    let (proxy, signer) = behind_a_proxy(&w, &["--leader-elect=false"]).await;

    let joined = join(&w, "join-0", "worker-0", Duration::from_secs(30)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());

    // Cut off; a Machine is created and its node asks a second later.
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.add_machine(&admin, "worker-1", &pid("worker-1")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = join(&w, "join-1", "worker-1", Duration::from_secs(8)).await;
    assert_eq!(held, Final::Pending, "denied from a stale cache\n{}", signer.log());
    assert!(
        signer.log().contains("cannot confirm the MachineNotFound denial"),
        "the cache's MachineNotFound was not written: {}",
        signer.log()
    );

    // Back: the watch catches up and the CSR is issued.
    proxy.restore();
    let issued = wait_final(&w.admin, "join-1", false, Duration::from_secs(60)).await;
    assert!(matches!(issued, Final::Issued(_)), "{issued:?}\n{}", signer.log());

    // A provider ID no Machine has is still denied, once the fresh read confirms it.
    let denied = join(&w, "join-x", "worker-x", Duration::from_secs(30)).await;
    assert_eq!(denied.reason(), Some("MachineNotFound"), "{denied:?}\n{}", signer.log());
}

/// How many times `signer` listed the Cluster API objects of gained Clusters.
fn fills(signer: &Signer) -> usize {
    signer
        .log()
        .matches("listed the Cluster API objects of gained Clusters")
        .count()
}

/// Waits up to `within` for `signer`'s log to say `what`.
async fn logged(signer: &Signer, what: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while !signer.log().contains(what) {
        assert!(
            std::time::Instant::now() < deadline,
            "never logged {what:?}\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A shard replica that cannot renew its member Lease fences itself (serves nothing) but keeps
/// the Machines it listed, which its watches keep current: once it renews it serves again
/// without listing its namespace again. At a thousand Clusters in one namespace, those lists
/// after each fence were the load that kept loaded replicas fenced (docs/capacity.md, "Measured
/// at 1,000 Clusters").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_fenced_replica_keeps_what_it_listed_and_serves_again_without_listing_it_again() {
    let env = Envtest::start("envtest_faults_fence");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    w.add_machine(&admin, "worker-0", &pid("worker-0")).await;
    let (proxy, signer) = behind_a_proxy(&w, &["--coordination", "shard", "--replica-name", "solo"]).await;
    let joined = join(&w, "join-0", "worker-0", Duration::from_secs(30)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());
    assert_eq!(fills(&signer), 1, "{}", signer.log());

    // Its Lease renewals go nowhere: fenced within the fence period (10 s).
    proxy.cut();
    logged(&signer, "membership Lease not renewed in time", Duration::from_secs(30)).await;
    proxy.restore();
    logged(&signer, "membership Lease renewed", Duration::from_secs(30)).await;

    // Serving again, on what it kept: a Machine created since comes through the watch.
    w.add_machine(&admin, "worker-1", &pid("worker-1")).await;
    let issued = join(&w, "join-1", "worker-1", Duration::from_secs(30)).await;
    assert!(matches!(issued, Final::Issued(_)), "{issued:?}\n{}", signer.log());
    assert_eq!(fills(&signer), 1, "listed again after the fence\n{}", signer.log());
}

/// Waits up to `within` for `signer` to count `n` Clusters in `state`.
async fn clusters_in(signer: &Signer, state: &str, n: f64, within: Duration) {
    let gauge = format!("node_attestation_clusters{{state=\"{state}\"}}");
    let deadline = std::time::Instant::now() + within;
    while live::metric(&signer.metrics(), &gauge) != n {
        assert!(
            std::time::Instant::now() < deadline,
            "never {n} {state}\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Cluster whose CSR watch failed (its connection cut, as a refused or dropped watch is) and
/// was started again from where it was, without a list, is `Ready` again within seconds: the
/// watcher says nothing when a watch starts again. The first fleet run (docs/capacity.md) left
/// 313 of 1,000 served Clusters `Unreachable` so, after a 429 on their first watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_workload_watch_started_again_after_a_failure_is_ready_again() {
    let env = Envtest::start("envtest_faults_watch");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    w.add_machine(&admin, "worker-0", &pid("worker-0")).await;
    // The signer reaches the workload apiserver through a proxy: `<cluster>-kubeconfig` names it.
    let server: std::net::SocketAddr = w.env.server.trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(server);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), capi::NAMESPACE);
    let name = format!("{}-kubeconfig", capi::CLUSTER);
    let secret = secrets.get(&name).await.unwrap();
    let text = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    let proxied = serde_json::json!({"stringData": {"value": text.replace(&w.env.server, &proxy.url())}});
    secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&proxied))
        .await
        .unwrap();
    let signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    clusters_in(&signer, "Ready", 1.0, Duration::from_secs(30)).await;

    proxy.cut();
    clusters_in(&signer, "Unreachable", 1.0, Duration::from_secs(30)).await;
    proxy.restore();
    clusters_in(&signer, "Ready", 1.0, Duration::from_secs(30)).await;
    // The Node index, down since the cut, is live again too: the join is decided at once.
    let joined = join(&w, "join-0", "worker-0", Duration::from_secs(10)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());
}

/// The Events in the Cluster's namespace of the management cluster, as (object, reason).
async fn management_events(admin: &kube::Client) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), capi::NAMESPACE);
    let events = api.list(&Default::default()).await.unwrap();
    events
        .items
        .iter()
        .map(|e| {
            let regarding = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
            (regarding, e.reason.clone().unwrap_or_default())
        })
        .collect()
}

/// The message of CSR `name`'s `Approved` condition.
async fn approval(csrs: &Api<CertificateSigningRequest>, name: &str) -> String {
    let csr = csrs.get(name).await.unwrap();
    csr.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Approved")
        .map(|c| c.message.unwrap_or_default())
        .unwrap_or_default()
}

/// Waits until `signer`'s `certificates_issued_total` is `expected`, then a moment more to see
/// that it stays.
async fn counted(signer: &Signer, expected: f64) {
    let total = || live::metric(&signer.metrics(), "node_attestation_certificates_issued_total{");
    for _ in 0..100 {
        if total() == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(total(), expected, "{}", signer.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn the_approval_is_the_record_of_an_issuance_and_a_stop_before_the_certificate_loses_nothing() {
    let env = Envtest::start("envtest_faults_record");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-0", "worker-1"] {
        w.add_machine(&admin, name, &pid(name)).await;
    }
    let mut signer = Signer::start(
        Path::new(SIGNER_BIN),
        &w.env,
        &["--leader-elect=false", "--replica-name=replica-a"],
    )
    .await;
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());

    // A join as it should go: its approval names the Machine and the replica, it is counted
    // once, and the management cluster holds no Event for it.
    let joined = join(&w, "join-0", "worker-0", Duration::from_secs(30)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());
    let record = approval(&csrs, "join-0").await;
    assert!(
        record.contains(&format!(
            "Machine {}/worker-0, approved by replica replica-a_",
            capi::NAMESPACE
        )),
        "{record}"
    );
    counted(&signer, 1.0).await;
    let events = management_events(&admin).await;
    assert!(
        events.iter().all(|(object, _)| object != "worker-0"),
        "no Event for a certificate: {events:?}"
    );

    // The replica stops right after approving worker-1's CSR, before the certificate: what it
    // leaves is the CSR approved, its condition naming the replica, and nothing else.
    signer.kill();
    let request = RequestSpec::kubelet("worker-1", &pid("worker-1")).build();
    file_csr(&w.bootstrap, "join-1", SIGNER_INSECURE, &request, CLIENT_USAGES).await;
    let approve = serde_json::json!({"status": {"conditions": [{"type": "Approved", "status": "True",
        "reason": "AttestedInsecureV1",
        "message": format!("system:node:worker-1 attested by insecure/v1 for Machine {}/worker-1; approved by replica replica-a_1", capi::NAMESPACE)}]}});
    csrs.patch_subresource("approval", "join-1", &PatchParams::default(), &Patch::Merge(&approve))
        .await
        .unwrap();

    // The next replica re-verifies and signs it; the record stays the approval as written, and
    // this replica counts the certificate it wrote, once.
    signer.restart();
    let issued = wait_final(&w.admin, "join-1", false, Duration::from_secs(30)).await;
    assert!(matches!(issued, Final::Issued(_)), "{issued:?}\n{}", signer.log());
    assert!(
        approval(&csrs, "join-1")
            .await
            .ends_with("approved by replica replica-a_1")
    );
    counted(&signer, 1.0).await;
    let events = management_events(&admin).await;
    assert!(
        events
            .iter()
            .all(|(object, _)| object != "worker-0" && object != "worker-1"),
        "no Event for a certificate: {events:?}"
    );

    // Another start finds nothing to do: nothing counted, nothing written.
    let versions = |list: Vec<CertificateSigningRequest>| {
        list.into_iter()
            .map(|c| c.metadata.resource_version.unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let before = versions(csrs.list(&Default::default()).await.unwrap().items);
    signer.restart();
    counted(&signer, 0.0).await;
    assert_eq!(versions(csrs.list(&Default::default()).await.unwrap().items), before);
}
