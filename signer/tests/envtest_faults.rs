//! Faults a replica meets, on a real kube-apiserver from `KUBEBUILDER_ASSETS`.
//!
//! - Cut off from the management apiserver (a proxy the test cuts) while its workload cluster
//!   stays reachable: a Machine created meanwhile is absent from its cache, and the CSR that
//!   comes for it a second later must wait, not be denied `MachineNotFound` (final) from the
//!   stale cache. Once the connection is back, the CSR is issued.
//! - Stopped between writing a certificate and recording it: whoever comes next records it,
//!   once (one `CertificateIssued` Event, one count), however often that happens.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_replica_cut_off_from_the_management_cluster_never_denies_a_machine_it_has_not_seen() {
    let env = Envtest::start("envtest_faults_cut");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    w.add_machine(&admin, "worker-0", &pid("worker-0")).await;

    // The signer reaches the management cluster through the proxy only; its workload client
    // (from the Cluster's kubeconfig Secret) goes straight to the apiserver.
    let direct = Signer::management_identity(&w.env).await;
    let server: std::net::SocketAddr = w.env.server.trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(server);
    let proxied = w.env.dir().join("signer-through-proxy.kubeconfig");
    let text = std::fs::read_to_string(&direct).unwrap();
    std::fs::write(&proxied, text.replace(&w.env.server, &proxy.url())).unwrap();
    let signer = Signer::run_as(Path::new(SIGNER_BIN), &w.env, &proxied, &["--leader-elect=false"]);

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

/// The `CertificateIssued` Events of CSR `uid` in the Cluster's namespace.
async fn issued_events(admin: &kube::Client, uid: &str) -> usize {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), capi::NAMESPACE);
    let events = api.list(&Default::default()).await.unwrap();
    events
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("CertificateIssued")
                && e.metadata.name.as_deref().is_some_and(|n| n.contains(uid))
        })
        .count()
}

/// Restarts `signer` and waits until this incarnation has listed the workload cluster's CSRs
/// (its recovery pass is then queued), so what it counts next is what that pass did.
async fn restart_and_list(signer: &mut Signer) {
    const LISTED: &str = "watching CSRs of the workload cluster";
    let before = signer.log().matches(LISTED).count();
    signer.restart();
    for _ in 0..300 {
        if signer.log().matches(LISTED).count() > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the restarted signer never listed the CSRs\n{}", signer.log());
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
async fn a_certificate_written_by_a_stopped_replica_is_recorded_once_by_whoever_comes_next() {
    let env = Envtest::start("envtest_faults_record");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-0", "worker-1"] {
        w.add_machine(&admin, name, &pid(name)).await;
    }
    let mut signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &["--leader-elect=false"]).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());
    let uid_of = |csr: CertificateSigningRequest| csr.metadata.uid.unwrap();

    // A join as it should go: one Event, one count.
    let joined = join(&w, "join-0", "worker-0", Duration::from_secs(30)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());
    let uid0 = uid_of(csrs.get("join-0").await.unwrap());
    counted(&signer, 1.0).await;
    assert_eq!(issued_events(&admin, &uid0).await, 1);

    // The replica stops right after writing worker-1's certificate: what it leaves is the CSR
    // approved and its certificate, and nothing else.
    signer.kill();
    let request = RequestSpec::kubelet("worker-1", &pid("worker-1")).build();
    file_csr(&w.bootstrap, "join-1", SIGNER_INSECURE, &request, CLIENT_USAGES).await;
    let approve = serde_json::json!({"status": {"conditions": [{"type": "Approved", "status": "True",
        "reason": "AttestedInsecureV1", "message": "approved before the stop"}]}});
    csrs.patch_subresource("approval", "join-1", &PatchParams::default(), &Patch::Merge(&approve))
        .await
        .unwrap();
    let certificate = serde_json::json!({"status": {"certificate": base64_of(&w.env.client_ca.cert_pem)}});
    csrs.patch_status("join-1", &PatchParams::default(), &Patch::Merge(&certificate))
        .await
        .unwrap();
    let uid1 = uid_of(csrs.get("join-1").await.unwrap());
    assert_eq!(issued_events(&admin, &uid1).await, 0);

    // The next replica to start records it, and only it: worker-0's join, recorded before,
    // is not counted again.
    restart_and_list(&mut signer).await;
    counted(&signer, 1.0).await;
    assert_eq!(issued_events(&admin, &uid1).await, 1, "{}", signer.log());
    assert_eq!(issued_events(&admin, &uid0).await, 1);
    assert!(signer.log().contains("recorded a certificate a stopped replica wrote"));

    // Another start finds both recorded and records nothing twice (counted once it has looked).
    restart_and_list(&mut signer).await;
    counted(&signer, 0.0).await;
    assert_eq!(
        issued_events(&admin, &uid1).await,
        1,
        "one Event, whoever finishes the work"
    );
    assert_eq!(issued_events(&admin, &uid0).await, 1);
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
