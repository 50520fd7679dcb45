//! Taking an identity back (SPEC section 7), on a real kube-apiserver and etcd with the signer
//! binary: certificates the signer really issued, used as their nodes use them (Lease renewals,
//! Node status, Node re-creation, Events). A Machine deleted as Cluster API deletes it
//! (`internal/controllers/machine/machine_controller.go`, `reconcileDelete`: the finalizer holds
//! it while its `Deleting` condition goes from `DrainingNode` to
//! `WaitingForInfrastructureDeletion`, then the Node is deleted and the finalizer removed) keeps
//! its identity while it drains and loses every write within 10 s once the drain is over; a new
//! Machine of the same node name joins and works; another node, a renewed one included, is never
//! touched; a signer restarted during a deletion catches up within 30 s; an operator's `revoke`
//! refuses one node. Before 1.32 (no credential ID) the node name is refused instead, only while
//! no live Machine uses it: the run says which minor it saw.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use attestation::request::KeyAlgorithm;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::{Envtest, kubernetes_minor};
use tests::live::{self, Final, Signer, Workload, file_csr, wait_final};
use tests::revocation::now;
use tests::revocation::{kubelet_writes, refused_within};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(30);

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

/// A join (or renewal, through `client`) of node `node`: its certificate PEM.
async fn join(w: &Workload, client: &Client, csr: &str, node: &str, provider_id: &str) -> String {
    let request = RequestSpec::kubelet(node, provider_id).build();
    file_csr(client, csr, SIGNER_INSECURE, &request, CLIENT_USAGES).await;
    match wait_final(&w.admin, csr, false, WAIT).await {
        Final::Issued(cert) => cert,
        other => panic!("{csr}: {other:?}"),
    }
}

fn machines(management: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    );
    Api::namespaced_with(management.clone(), capi::NAMESPACE, &resource)
}

/// Cluster API's Machine controller deleting Machine `name`: its finalizer is on it, the
/// deletion starts, and its `Deleting` condition says `reason`.
async fn deleting(management: &Client, name: &str, reason: &str) {
    let api = machines(management);
    let finalizer = json!({"metadata": {"finalizers": ["machine.cluster.x-k8s.io"]}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .unwrap();
    api.delete(name, &Default::default()).await.unwrap();
    set_deleting(management, name, reason).await;
}

async fn set_deleting(management: &Client, name: &str, reason: &str) {
    let status = json!({"status": {"conditions": [{"type": "Deleting", "status": "True", "reason": reason, "message": "",
                                                   "lastTransitionTime": now()}]}});
    machines(management)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("status of Machine {name}: {e}"));
}

/// The end of Cluster API's deletion: the Node deleted, then the finalizer removed.
async fn deleted(management: &Client, workload: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(workload.clone());
    let _ = nodes.delete(name, &Default::default()).await;
    let finalizers = json!({"metadata": {"finalizers": null}});
    machines(management)
        .patch(name, &PatchParams::default(), &Patch::Merge(&finalizers))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_deleted_machines_certificates_stop_working_once_cluster_api_is_done_with_its_node() {
    let minor = kubernetes_minor();
    let by_id = minor >= 32;
    let env = Envtest::start("envtest_revocation");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-1", "worker-2", "worker-3"] {
        w.add_machine(&admin, name, &pid(name)).await;
    }
    let mut signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();

    let cert1 = join(&w, &w.bootstrap, "join-worker-1", "worker-1", &pid("worker-1")).await;
    let cert2 = join(&w, &w.bootstrap, "join-worker-2", "worker-2", &pid("worker-2")).await;
    let cert3 = join(&w, &w.bootstrap, "join-worker-3", "worker-3", &pid("worker-3")).await;
    let node1 = w.node_client("worker-1", &cert1, &key).await;
    let node2 = w.node_client("worker-2", &cert2, &key).await;
    let node3 = w.node_client("worker-3", &cert3, &key).await;
    // worker-2 renews: both its certificates are live ones.
    let renewed2 = join(&w, &node2, "renew-worker-2", "worker-2", &pid("worker-2")).await;
    let node2_renewed = w.node_client("worker-2-renewed", &renewed2, &key).await;
    for (client, node) in [
        (&node1, "worker-1"),
        (&node2, "worker-2"),
        (&node3, "worker-3"),
        (&node2_renewed, "worker-2"),
    ] {
        kubelet_writes(client, node).await.unwrap();
    }
    // The record: one entry per certificate, in the workload cluster.
    let recorded: usize = {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(w.admin.clone(), "kube-system");
        let mut n = 0;
        for shard in attestation::revocation::record::shard_names() {
            n += cms
                .get_opt(&shard)
                .await
                .unwrap()
                .and_then(|c| c.data)
                .map_or(0, |d| d.len());
        }
        n
    };
    assert_eq!(recorded, 4, "every certificate issued is recorded");

    // A MachineDeployment scale-down of worker-1: while it drains its kubelet keeps working.
    deleting(&admin, "worker-1", "DrainingNode").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    kubelet_writes(&node1, "worker-1")
        .await
        .expect("a draining node keeps its identity");
    set_deleting(&admin, "worker-1", "WaitingForVolumeDetach").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubelet_writes(&node1, "worker-1")
        .await
        .expect("a node whose volumes detach keeps its identity");
    // Drain and volume detach over.
    set_deleting(&admin, "worker-1", "WaitingForInfrastructureDeletion").await;
    let took = refused_within(&node1, "worker-1", Duration::from_secs(10), &signer).await;
    eprintln!("minor 1.{minor}: worker-1 refused {took:?} after its drain was over");
    // Others untouched, a renewed certificate included.
    kubelet_writes(&node2, "worker-2").await.unwrap();
    kubelet_writes(&node2_renewed, "worker-2").await.unwrap();
    kubelet_writes(&node3, "worker-3").await.unwrap();
    // explain names it.
    let explained = std::process::Command::new(SIGNER_BIN)
        .args([
            "explain",
            "--cluster",
            &format!("{}/{}", capi::NAMESPACE, capi::CLUSTER),
            "--pending",
            "-o",
            "json",
            "--offline",
        ])
        .env("KUBECONFIG", &w.env.admin_kubeconfig)
        .output()
        .unwrap();
    let explained: Value = serde_json::from_slice(&explained.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&explained.stderr)));
    let revoked = explained["revoked"]["entries"].as_array().unwrap();
    assert!(
        revoked
            .iter()
            .any(|e| e["node"] == "worker-1" && e["reason"] == "MachineReleased" && e["target"] == "Machine worker-1"),
        "{explained:#}"
    );
    // The end of the deletion: the revoked certificate cannot re-create its Node.
    deleted(&admin, &w.admin, "worker-1").await;
    let err = kubelet_writes(&node1, "worker-1").await.unwrap_err();
    assert!(err.contains("revoked by node-attestation-signer"), "{err}");

    // A certificate the signer did not issue for that name is refused only by name (before 1.32).
    let (foreign_cert, foreign_key) = w.env.client_certificate("system:node:worker-1", &["system:nodes"]);
    let foreign = w.node_client("worker-1-foreign", &foreign_cert, &foreign_key).await;
    let foreign_writes = kubelet_writes(&foreign, "worker-1").await;
    assert_eq!(foreign_writes.is_ok(), by_id, "minor 1.{minor}: {foreign_writes:?}");
    let _ = Api::<Node>::all(w.admin.clone())
        .delete("worker-1", &Default::default())
        .await;

    // A new Machine of the same node name (AWS names nodes by IP): it joins and works.
    w.add_machine(&admin, "worker-1", &pid("worker-1-again")).await;
    let again = join(
        &w,
        &w.bootstrap,
        "join-worker-1-again",
        "worker-1",
        &pid("worker-1-again"),
    )
    .await;
    let node1_again = w.node_client("worker-1-again", &again, &key).await;
    let start = Instant::now();
    loop {
        match kubelet_writes(&node1_again, "worker-1").await {
            Ok(()) => break,
            Err(why) => assert!(
                start.elapsed() < Duration::from_secs(10),
                "the new worker-1 is refused: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old certificate: refused by its credential ID from 1.32; before, its name is back in use.
    let old = kubelet_writes(&node1, "worker-1").await;
    assert_eq!(
        old.is_err(),
        by_id,
        "minor 1.{minor}: the old worker-1 certificate: {old:?}"
    );

    // A signer restarted during a deletion catches up.
    drop(signer);
    deleting(&admin, "worker-3", "DeletingNode").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubelet_writes(&node3, "worker-3")
        .await
        .expect("nothing is revoked while the signer is down");
    signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    let took = refused_within(&node3, "worker-3", Duration::from_secs(30), &signer).await;
    eprintln!("minor 1.{minor}: worker-3 refused {took:?} after the signer's start");
    kubelet_writes(&node2, "worker-2").await.unwrap();

    // An operator's revoke of worker-2: both its certificates go, nobody else's.
    let kubeconfig = w.env.admin_kubeconfig.clone();
    let out = std::process::Command::new(SIGNER_BIN)
        .args([
            "revoke",
            "--cluster",
            &format!("{}/{}", capi::NAMESPACE, capi::CLUSTER),
            "--node",
            "worker-2",
        ])
        .args(["--reason", "suspected compromise"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("2 certificate(s) of node worker-2 revoked by hand"),
        "{said}"
    );
    if by_id {
        refused_within(&node2, "worker-2", Duration::from_secs(10), &signer).await;
        refused_within(&node2_renewed, "worker-2", Duration::from_secs(10), &signer).await;
    }
    kubelet_writes(&node1_again, "worker-1").await.unwrap();
    let events = w
        .env
        .kubectl(&["get", "events.events.k8s.io", "-n", capi::NAMESPACE, "-o", "json"]);
    let events: Value = serde_json::from_slice(&events.stdout).unwrap();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "CertificatesRevokedByOperator"
                && e["note"].as_str().unwrap_or_default().contains("suspected compromise")),
        "{events:#}"
    );
    let metrics = signer.metrics();
    assert!(
        metrics.contains(
            "node_attestation_certificates_revoked_total{cluster=\"team-a/prod\",reason=\"MachineReleased\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_pool_scale_down_and_a_replaced_claim_take_back_only_the_identity_that_left() {
    let env = Envtest::start("envtest_revocation_pool");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    live::apply(&admin, &w.own(capi::kubeadm_config("pool-kc", "abcdef", "v1beta2"))).await;
    live::apply(
        &admin,
        &w.own(capi::machine_pool("pool", &[&pid("pool-1"), &pid("pool-2")])),
    )
    .await;
    w.add_machine(&admin, "worker-5", &pid("worker-5")).await;
    let signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;
    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
    let mut nodes = Vec::new();
    for (csr, node, provider_id) in [
        ("join-pool-1", "pool-node-1", pid("pool-1")),
        ("join-pool-2", "pool-node-2", pid("pool-2")),
        ("join-worker-5", "worker-5", pid("worker-5")),
    ] {
        let cert = join(&w, &w.bootstrap, csr, node, &provider_id).await;
        let client = w.node_client(node, &cert, &key).await;
        kubelet_writes(&client, node).await.unwrap();
        nodes.push((node, client));
    }

    // The pool scales down: the infrastructure provider drops pool-2 from providerIDList.
    let scaled = json!({"spec": {"providerIDList": [pid("pool-1")], "replicas": 1}});
    let pools = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        capi::NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachinePool"),
            "machinepools",
        ),
    );
    pools
        .patch("pool", &PatchParams::default(), &Patch::Merge(&scaled))
        .await
        .unwrap();
    let took = refused_within(&nodes[1].1, "pool-node-2", Duration::from_secs(10), &signer).await;
    eprintln!(
        "minor 1.{}: pool-node-2 refused {took:?} after leaving providerIDList",
        kubernetes_minor()
    );
    kubelet_writes(&nodes[0].1, "pool-node-1").await.unwrap();
    kubelet_writes(&nodes[2].1, "worker-5").await.unwrap();

    // worker-5's Machine now names another instance: its old identity is replaced.
    let moved = json!({"spec": {"providerID": pid("worker-5-replacement")}});
    machines(&admin)
        .patch("worker-5", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    let took = refused_within(&nodes[2].1, "worker-5", Duration::from_secs(10), &signer).await;
    eprintln!(
        "minor 1.{}: worker-5 refused {took:?} after its Machine changed instance",
        kubernetes_minor()
    );
    kubelet_writes(&nodes[0].1, "pool-node-1").await.unwrap();
    let metrics = signer.metrics();
    for reason in ["PoolInstanceGone", "ClaimReplaced"] {
        assert!(
            metrics.contains(&format!(
                "node_attestation_certificates_revoked_total{{cluster=\"team-a/prod\",reason=\"{reason}\"}}"
            )),
            "{reason}: {metrics}"
        );
    }
}
