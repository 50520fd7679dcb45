//! A replica cut off from the management apiserver (a proxy the test cuts, on a real
//! kube-apiserver from `KUBEBUILDER_ASSETS`) while its workload cluster stays reachable: a
//! Machine created meanwhile is absent from its cache, and the CSR that comes for it a second
//! later must wait, not be denied `MachineNotFound` (final) from the stale cache. Once the
//! connection is back, the CSR is issued.

#![allow(clippy::unwrap_used)]

use std::path::Path;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_replica_cut_off_from_the_management_cluster_never_denies_a_machine_it_has_not_seen() {
    let env = Envtest::start("envtest_partition");
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

    let join = |name: &str| RequestSpec::kubelet(name, &pid(name)).build();
    file_csr(
        &w.bootstrap,
        "join-0",
        SIGNER_INSECURE,
        &join("worker-0"),
        CLIENT_USAGES,
    )
    .await;
    let joined = wait_final(&w.admin, "join-0", false, Duration::from_secs(30)).await;
    assert!(matches!(joined, Final::Issued(_)), "{joined:?}\n{}", signer.log());

    // Cut off; a Machine is created and its node asks a second later.
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.add_machine(&admin, "worker-1", &pid("worker-1")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    file_csr(
        &w.bootstrap,
        "join-1",
        SIGNER_INSECURE,
        &join("worker-1"),
        CLIENT_USAGES,
    )
    .await;
    let held = wait_final(&w.admin, "join-1", false, Duration::from_secs(8)).await;
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
    file_csr(
        &w.bootstrap,
        "join-x",
        SIGNER_INSECURE,
        &join("worker-x"),
        CLIENT_USAGES,
    )
    .await;
    let denied = wait_final(&w.admin, "join-x", false, Duration::from_secs(30)).await;
    assert_eq!(denied.reason(), Some("MachineNotFound"), "{denied:?}\n{}", signer.log());
}
