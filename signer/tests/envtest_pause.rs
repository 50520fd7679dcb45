//! SPEC section 7, "Paused Clusters", against a real kube-apiserver and etcd
//! (`KUBEBUILDER_ASSETS`; skipped loudly without), with the real Cluster API CRDs and the signer
//! under `config/rbac/`, one apiserver playing management and workload cluster: a Cluster paused
//! by `spec.paused` stops its worker, and a bootstrap-token CSR filed meanwhile stays pending
//! past several resyncs with nothing written (no claim, no condition, no Event), while
//! `explain` and the `Paused` gauge say why; unpaused, the CSR is approved and signed once. The
//! `cluster.x-k8s.io/paused` annotation pauses alike, and a worker stopped mid-issuance (its
//! claim and `/approval` written, the certificate not: set up here by hand, as it would have
//! left it) is finished once after the unpause, without a second claim write. A paused copy of
//! the Cluster sharing its CA still gets the Cluster refused, and gets no Event itself.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use attestation::names::SIGNER_INSECURE;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, metric, state_of, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(30);
/// The signer's `--resync-period` here: every pending CSR is queued again this often.
const RESYNC: Duration = Duration::from_secs(1);
/// How long a paused Cluster's CSR is watched staying pending: several resyncs.
const PAUSED_FOR: Duration = Duration::from_secs(6);

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

/// Waits (10 s at most) until `check` holds of the signer's metrics.
async fn eventually(what: &str, signer: &Signer, check: impl Fn(&str) -> bool) {
    for _ in 0..100 {
        if check(&signer.metrics()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{what} never held; metrics:\n{}\nlog:\n{}",
        signer.metrics(),
        signer.log()
    );
}

fn clusters(metrics: &str, state: &str) -> f64 {
    metric(metrics, &format!("node_attestation_clusters{{state=\"{state}\"}}"))
}

/// `kubectl` as the apiserver's admin; panics with its stderr when it fails.
fn kubectl(w: &Workload, args: &[&str]) -> String {
    let out = w.env.kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Merge-patches the Cluster `team-a/<name>`.
fn patch_cluster(w: &Workload, name: &str, patch: &Value) {
    kubectl(
        w,
        &[
            "patch",
            "clusters.cluster.x-k8s.io",
            name,
            "-n",
            capi::NAMESPACE,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
    );
}

/// The Machine as the apiserver holds it.
async fn machine(w: &Workload, name: &str) -> Value {
    live::get(&w.admin, &w.own(capi::machine(name, None))).await
}

/// The claim annotation of Machine `name`, parsed.
async fn claim(w: &Workload, name: &str) -> Option<Value> {
    machine(w, name).await["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
        .as_str()
        .map(|text| serde_json::from_str(text).unwrap())
}

async fn csr(w: &Workload, name: &str) -> CertificateSigningRequest {
    Api::<CertificateSigningRequest>::all(w.admin.clone())
        .get(name)
        .await
        .unwrap()
}

/// Files worker `node`'s join as the bootstrap token user.
async fn file_join(w: &Workload, name: &str, node: &str) {
    file_csr(
        &w.bootstrap,
        name,
        SIGNER_INSECURE,
        &RequestSpec::kubelet(node, &pid(node)).build(),
        CLIENT_USAGES,
    )
    .await;
}

/// Every Event of the Cluster's namespace as `regarding name/reason`.
fn events(w: &Workload, namespace: &str) -> Vec<String> {
    let out = kubectl(w, &["get", "events.events.k8s.io", "-n", namespace, "-o", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["regarding"]["name"].as_str().unwrap_or_default(),
                e["reason"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// `explain <csr> -o json` as the apiserver's admin.
fn explain(w: &Workload, csr: &str) -> Value {
    let out = Command::new(SIGNER_BIN)
        .args([
            "explain",
            csr,
            "--cluster",
            &format!("{}/{}", capi::NAMESPACE, capi::CLUSTER),
        ])
        .args(["--kubeconfig", w.env.admin_kubeconfig.to_str().unwrap(), "-o", "json"])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "explain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Lines of the log saying CSR `name` was approved and signed.
fn signed_lines(signer: &Signer, name: &str) -> usize {
    signer
        .log()
        .lines()
        .filter(|l| l.contains("approved and signed") && l.contains(&format!("csr={name}")))
        .count()
}

/// What the signer is doing while the Cluster is paused: `csrs` stay pending and unchanged past
/// several resyncs, `machines` keep their resourceVersions (no claim), no Event is written in
/// the namespace, and no decision is counted for the Cluster.
async fn nothing_happens(w: &Workload, signer: &Signer, csrs: &[&str], machines: &[&str]) {
    let versions = |csrs: Vec<CertificateSigningRequest>, machines: Vec<Value>| {
        let mut all: Vec<String> = csrs
            .iter()
            .map(|c| format!("{} {:?}", c.metadata.name.clone().unwrap(), c.metadata.resource_version))
            .collect();
        all.extend(
            machines
                .iter()
                .map(|m| format!("{} {}", m["metadata"]["name"], m["metadata"]["resourceVersion"])),
        );
        all
    };
    let read = || async {
        let mut c = Vec::new();
        for name in csrs {
            c.push(csr(w, name).await);
        }
        let mut m = Vec::new();
        for name in machines {
            m.push(machine(w, name).await);
        }
        (c, m)
    };
    let (c, m) = read().await;
    let before = versions(c, m);
    let events_before = events(w, capi::NAMESPACE);
    let decisions_before = metric(
        &signer.metrics(),
        "node_attestation_decisions_total{cluster=\"team-a/prod\"",
    );
    tokio::time::sleep(PAUSED_FOR).await;
    let (c, m) = read().await;
    for one in &c {
        assert_eq!(
            state_of(one),
            Final::Pending,
            "{:?} while paused\n{}",
            one.metadata.name,
            signer.log()
        );
    }
    for (name, one) in machines.iter().zip(&m) {
        assert!(
            one["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"].is_null(),
            "Machine {name} claimed while paused"
        );
    }
    assert_eq!(
        versions(c, m),
        before,
        "nothing written to the CSRs or Machines while paused"
    );
    assert_eq!(events(w, capi::NAMESPACE), events_before, "no Event while paused");
    assert_eq!(
        metric(
            &signer.metrics(),
            "node_attestation_decisions_total{cluster=\"team-a/prod\""
        ),
        decisions_before,
        "no decision while paused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_paused_cluster_gets_no_decision_and_no_write_and_resumes_once_unpaused() {
    let env = Envtest::start("envtest_pause");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    for name in ["worker-0", "worker-1", "worker-2"] {
        w.add_machine(&admin, name, &pid(name)).await;
    }
    let identity = Signer::management_identity(&w.env).await;
    let resync = format!("{}s", RESYNC.as_secs());
    let signer = Signer::spawn_with(
        Path::new(SIGNER_BIN),
        &w.env,
        &identity,
        &["--resync-period", &resync, "--secret-resync-period", &resync],
        &[],
    );
    eventually("the Cluster served", &signer, |m| clusters(m, "Ready") == 1.0).await;

    // spec.paused: the running worker stops; the gauge and the log say so, once.
    patch_cluster(&w, capi::CLUSTER, &json!({"spec": {"paused": true}}));
    eventually("the Cluster counted Paused", &signer, |m| {
        clusters(m, "Paused") == 1.0 && clusters(m, "Ready") == 0.0
    })
    .await;
    file_join(&w, "join-worker-0", "worker-0").await;
    // Pending past several resyncs, nothing written.
    nothing_happens(&w, &signer, &["join-worker-0"], &["worker-0"]).await;
    assert_eq!(
        signer.log().matches("Cluster paused").count(),
        1,
        "logged once when it became paused:\n{}",
        signer.log()
    );
    assert!(signer.log().contains("spec.paused is true"));
    let explained = explain(&w, "join-worker-0");
    let notes = explained["notes"].to_string();
    assert!(
        notes.contains("Cluster team-a/prod is paused (spec.paused is true)") && notes.contains("stay pending"),
        "explain says the Cluster is paused: {explained:#}"
    );

    // Unpaused (spec.paused removed): the worker starts again on the Cluster's change and the
    // CSR is approved, claimed and signed, once.
    patch_cluster(&w, capi::CLUSTER, &json!({"spec": {"paused": null}}));
    let state = wait_final(&w.admin, "join-worker-0", false, WAIT).await;
    assert!(
        matches!(state, Final::Issued(_)),
        "after the unpause: {state:?}\n{}",
        signer.log()
    );
    let claimed = claim(&w, "worker-0").await.expect("a claim on worker-0");
    assert_eq!(claimed["nodeName"], "worker-0");
    assert_eq!(
        claimed["csrUID"].as_str(),
        csr(&w, "join-worker-0").await.metadata.uid.as_deref()
    );
    assert_eq!(signer.log().matches("Cluster unpaused").count(), 1, "{}", signer.log());
    eventually("the Cluster served again", &signer, |m| {
        clusters(m, "Ready") == 1.0 && clusters(m, "Paused") == 0.0
    })
    .await;

    // The annotation pauses too, whatever its value. Filed meanwhile: worker-1's join, and
    // worker-2's as a worker stopped mid-issuance leaves it: claimed for its CSR and approved,
    // not signed.
    kubectl(
        &w,
        &[
            "annotate",
            "clusters.cluster.x-k8s.io",
            capi::CLUSTER,
            "-n",
            capi::NAMESPACE,
            "cluster.x-k8s.io/paused=",
        ],
    );
    eventually("the annotated Cluster counted Paused", &signer, |m| {
        clusters(m, "Paused") == 1.0
    })
    .await;
    file_join(&w, "join-worker-1", "worker-1").await;
    file_join(&w, "join-worker-2", "worker-2").await;
    let uid = csr(&w, "join-worker-2").await.metadata.uid.unwrap();
    let record = json!({"nodeName": "worker-2", "providerID": pid("worker-2"), "csrUID": uid,
                        "claimedAt": "2026-01-01T00:00:00Z"});
    kubectl(
        &w,
        &[
            "patch",
            "machines.cluster.x-k8s.io",
            "worker-2",
            "-n",
            capi::NAMESPACE,
            "--type",
            "merge",
            "-p",
            &json!({"metadata": {"annotations": {"cluster.x-k8s.io/kubelet-claim": record.to_string()}}}).to_string(),
        ],
    );
    kubectl(&w, &["certificate", "approve", "join-worker-2"]);
    let claimed_version = machine(&w, "worker-2").await["metadata"]["resourceVersion"].clone();
    nothing_happens(&w, &signer, &["join-worker-1"], &["worker-1"]).await;
    let half_done = csr(&w, "join-worker-2").await;
    assert_eq!(state_of(&half_done), Final::Approved, "not signed while paused");
    assert_eq!(
        machine(&w, "worker-2").await["metadata"]["resourceVersion"],
        claimed_version
    );

    kubectl(
        &w,
        &[
            "annotate",
            "clusters.cluster.x-k8s.io",
            capi::CLUSTER,
            "-n",
            capi::NAMESPACE,
            "cluster.x-k8s.io/paused-",
        ],
    );
    for (name, node) in [("join-worker-1", "worker-1"), ("join-worker-2", "worker-2")] {
        let state = wait_final(&w.admin, name, false, WAIT).await;
        assert!(
            matches!(state, Final::Issued(_)),
            "{name} after the unpause: {state:?}\n{}",
            signer.log()
        );
        let claimed = claim(&w, node).await.expect("a claim");
        assert_eq!(
            claimed["csrUID"].as_str(),
            csr(&w, name).await.metadata.uid.as_deref(),
            "{name}"
        );
    }
    assert_eq!(
        machine(&w, "worker-2").await["metadata"]["resourceVersion"],
        claimed_version,
        "the claim written before the stop is the one: not written again"
    );
    // Each certificate once: recorded once, counted once, over several more resyncs.
    tokio::time::sleep(RESYNC * 3).await;
    for name in ["join-worker-0", "join-worker-1", "join-worker-2"] {
        assert_eq!(signed_lines(&signer, name), 1, "{name} signed once\n{}", signer.log());
    }
    assert_eq!(
        metric(
            &signer.metrics(),
            "node_attestation_certificates_issued_total{cluster=\"team-a/prod\",kind=\"join\"}"
        ),
        3.0,
        "{}",
        signer.metrics()
    );
    assert_eq!(signer.log().matches("Cluster paused").count(), 2, "{}", signer.log());
    assert_eq!(signer.log().matches("Cluster unpaused").count(), 2, "{}", signer.log());

    // A paused copy of the Cluster with its CA (a restored backup, a move target left paused):
    // the Cluster is refused for the shared CA all the same; the copy gets no Event.
    apply(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-c"}}),
    )
    .await;
    let mut ca = live::get(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "prod-ca", "namespace": capi::NAMESPACE}}),
    )
    .await;
    ca["metadata"] = json!({"name": "copy-ca", "namespace": "team-c"});
    apply(&admin, &ca).await;
    let mut copy = capi::cluster("insecure");
    copy["metadata"]["name"] = json!("copy");
    copy["metadata"]["namespace"] = json!("team-c");
    copy["spec"]["paused"] = json!(true);
    apply(&admin, &copy).await;
    eventually("the Cluster refused for the paused copy's CA", &signer, |m| {
        clusters(m, "SharedCa") == 1.0 && clusters(m, "Paused") == 1.0
    })
    .await;
    assert!(
        events(&w, capi::NAMESPACE).iter().any(|e| e == "prod/SharedCa"),
        "the served Cluster's Warning"
    );
    assert!(events(&w, "team-c").is_empty(), "no Event for the paused copy");
    live::delete(&admin, &copy).await;
    eventually("the Cluster served once the copy is gone", &signer, |m| {
        clusters(m, "Ready") == 1.0 && clusters(m, "SharedCa") == 0.0 && clusters(m, "Paused") == 0.0
    })
    .await;
}
