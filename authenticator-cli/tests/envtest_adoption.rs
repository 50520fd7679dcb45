//! Opting in a running cluster (SPEC rule 7's adoption, section 7's "Nodes outside
//! attestation" and "No silent expiry") with a real kubelet (v1.32, from `KUBEBUILDER_ASSETS`),
//! a real kube-apiserver, a real kube-controller-manager, the real signer, the real plugin and
//! a real Prometheus evaluating the shipped alerts (their `for` shortened); skipped by
//! `scripts/test` where a part is missing.
//!
//! 1. Before the opt-in, a node joins the legacy way: kubelet's own TLS bootstrap with the join
//!    token (`--bootstrap-kubeconfig`), its CSR for `kubernetes.io/kube-apiserver-client-kubelet`
//!    approved by kube-controller-manager through kubeadm's `kubeadm:node-autoapprove-bootstrap`
//!    and signed with the cluster CA (3-minute certificates), kubelet's rotation on, through
//!    `kubeadm:node-autoapprove-certificate-rotation`.
//! 2. The signer starts serving the opted-in Cluster. The bootstrap binding goes at once; the
//!    rotation binding is kept and reported naming the node (it is outside attestation: its
//!    Machine holds no claim); the node's Machine gets a Warning Event; the alert
//!    `NodeAttestationNodesOutsideAttestation` fires for the Cluster.
//! 3. The node stays Ready past its first certificate's expiry: kubelet rotated through
//!    kube-controller-manager, which the kept binding still allows.
//! 4. The plugin is installed on it, as the image role's drop-in does: kubelet stops,
//!    `kubelet-authenticator kubeconfig --adopt` takes its kubeconfig over (kubelet's certificate
//!    becomes the plugin's current credential), kubelet starts with the plugin and its own
//!    rotation off. The plugin's first request, made with that certificate as
//!    `system:node:worker-0`, is an adoption: approved, the Machine claimed for the node; no Node
//!    is left outside attestation, so the rotation binding goes and the alert clears. The node
//!    stays Ready on the signer's certificate, and kubelet files no legacy CSR after the adoption.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::kubelet::{
    Containerd, ControllerManager, CsrRecorder, Host, Kubelet, NODE_IP, node, ready_past, secs, validity,
    wait_renewed_and_ready,
};
use tests::live::{self, Signer, Workload, apply};
use tests::prometheus::{Prometheus, shipped_rules};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NODE: &str = "worker-0";
const USER: &str = "system:node:worker-0";
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0legacy";
const CLIENT_SIGNER: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure";
const LEGACY_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const BOOTSTRAP_BINDING: &str = "kubeadm:node-autoapprove-bootstrap";
const ROTATION_BINDING: &str = "kubeadm:node-autoapprove-certificate-rotation";
const ALERT: &str = "NodeAttestationNodesOutsideAttestation";
const WAIT: Duration = Duration::from_secs(120);

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

fn diagnostics(kubelet: &Kubelet, signer: Option<&Signer>, kcm: &ControllerManager) -> String {
    format!(
        "--- kubelet:\n{}\n--- signer:\n{}\n--- kube-controller-manager:\n{}",
        kubelet.log(),
        signer.map(Signer::log).unwrap_or_default(),
        kcm.log()
    )
}

/// kubeadm's two auto-approve bindings, as `kubeadm init` creates them (the join token's group
/// here is the token's own, `system:bootstrappers`).
async fn kubeadm_bindings(admin: &kube::Client) {
    for (name, role, group) in [
        (
            BOOTSTRAP_BINDING,
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        (
            ROTATION_BINDING,
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        apply(
            admin,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}),
        )
        .await;
    }
}

async fn binding_present(admin: &kube::Client, name: &str) -> bool {
    Api::<ClusterRoleBinding>::all(admin.clone())
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

/// The note of the newest Event with `reason` about `regarding`, if any.
fn event_note(env: &Envtest, regarding: &str, reason: &str) -> Option<String> {
    let out = env.kubectl(&["get", "events.events.k8s.io", "-n", capi::NAMESPACE, "-o", "json"]);
    let events: Value = serde_json::from_slice(&out.stdout).ok()?;
    events["items"]
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["regarding"]["name"] == regarding && e["reason"] == reason)
        .and_then(|e| e["note"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and KUBEBUILDER_ASSETS and promtool (Debian prometheus): root, kubelet and kube-controller-manager beside kube-apiserver, containerd and runc"]
async fn a_node_that_joined_before_the_opt_in_keeps_renewing_then_is_adopted_and_the_binding_goes() {
    let assets = tests::kubelet::require("envtest_adoption");
    let began = Instant::now();
    let host = Host::claim();
    let env = Envtest::start("envtest_adoption");
    let recorder = host.recorder();
    env.pids().into_iter().for_each(|pid| recorder.pid(pid));
    recorder.folder(env.dir());
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    kubeadm_bindings(&w.admin).await;
    apply(
        &admin,
        &w.own(capi::kubeadm_config(&format!("{NODE}-kc"), "abcdef", "v1beta2")),
    )
    .await;
    let csrs = CsrRecorder::start(w.admin.clone()).await;
    // kube-controller-manager approves and signs kubeadm's path, 3-minute certificates.
    let kcm = ControllerManager::start_with_args(
        &assets,
        &w.env,
        &host,
        &["csrsigning", "csrapproving"],
        &["--cluster-signing-duration=3m"],
    );
    let containerd = Containerd::start(&host);
    let mut kubelet = Kubelet::new(&assets, &host, &containerd, NODE, PROVIDER_ID);
    let pki = kubelet.pki_dir();
    let kubeconfig = kubelet.dir().join("kubelet.conf");

    // 1. The legacy join: kubelet's own TLS bootstrap with the join token, rotation on.
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let (config_path, root_dir) = (kubelet.config_path(), kubelet.dir().join("root"));
    let legacy_args = |bootstrap: Option<&std::path::Path>, rotate: bool| {
        let mut args = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", root_dir.display()),
            format!("--cert-dir={}", pki.display()),
            format!("--hostname-override={NODE}"),
            format!("--node-ip={NODE_IP}"),
            format!("--rotate-certificates={rotate}"),
            "--v=2".to_owned(),
        ];
        if let Some(bootstrap) = bootstrap {
            args.push(format!("--bootstrap-kubeconfig={}", bootstrap.display()));
        }
        args
    };
    kubelet.start_with(legacy_args(Some(&bootstrap), true));
    let Some(legacy) = csrs.wait_issued(WAIT, |s| s.signer == LEGACY_SIGNER).await else {
        panic!(
            "kubeadm's path issued nothing: {:?}\n{}",
            csrs.all(),
            diagnostics(&kubelet, None, &kcm)
        );
    };
    assert!(legacy.username.starts_with("system:bootstrap:"), "{legacy:?}");
    let (_, first_pem) = legacy.issued.clone().unwrap();
    let (_, first_not_after, subject) = validity(&first_pem);
    assert!(subject.contains(USER), "{subject}");
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, 0, WAIT).await,
        "the legacy node is not Ready\n{}",
        diagnostics(&kubelet, None, &kcm)
    );
    let mut machine = w.own(capi::machine(NODE, Some(PROVIDER_ID)));
    machine["status"]["nodeRef"] = json!({"name": NODE});
    machine["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": NODE_IP.to_string()},
        {"type": "Hostname", "address": NODE}
    ]);
    apply(&admin, &machine).await;
    let joined_legacy = began.elapsed();

    // 2. The opt-in: the signer serves the Cluster.
    let signer = Signer::start(&signer_bin(), &w.env, &["--leader-elect", "false"]).await;
    recorder.pid(signer.pid().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let prometheus = Prometheus::start(dir.path(), &signer.metrics_target(), &shipped_rules("5s"));
    let deadline = Instant::now() + WAIT;
    while binding_present(&w.admin, BOOTSTRAP_BINDING).await {
        assert!(
            Instant::now() < deadline,
            "the bootstrap binding stays\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + WAIT;
    let kept = loop {
        if let Some(note) = event_note(&w.env, capi::CLUSTER, "LegacyRotationKept") {
            break note;
        }
        assert!(
            Instant::now() < deadline,
            "no LegacyRotationKept Event\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(kept.contains(NODE), "the Event names the node: {kept}");
    assert!(binding_present(&w.admin, ROTATION_BINDING).await, "kept for the node");
    let outside = event_note(&w.env, NODE, "NodeOutsideAttestation").expect("a Warning Event on the Machine");
    eprintln!("Event on Machine {NODE}: {outside}");
    eprintln!("Event on Cluster {}: {kept}", capi::CLUSTER);
    prometheus.wait_alert(ALERT, "firing", &[("cluster", "team-a/prod")], WAIT);
    let alert_fired = began.elapsed();

    // 3. Past its first certificate's expiry the node is Ready: kubelet rotated through
    //    kube-controller-manager, which the kept binding allows.
    assert!(
        ready_past(&w.admin, NODE, first_not_after, WAIT).await,
        "the legacy node lost its identity at {first_not_after}\n{}",
        diagnostics(&kubelet, Some(&signer), &kcm)
    );
    let rotations: Vec<_> = csrs
        .of(LEGACY_SIGNER)
        .into_iter()
        .filter(|s| s.username == USER && s.issued.is_some())
        .collect();
    assert!(
        !rotations.is_empty(),
        "kubelet rotated as the node through kube-controller-manager"
    );
    let rotated = began.elapsed();

    // 4. The plugin is installed: the drop-in's ExecStartPre adopts kubelet's kubeconfig, and
    //    kubelet runs with the plugin, its own rotation off.
    kubelet.stop();
    let adoption_started = Instant::now();
    let adopt = Command::new(PLUGIN)
        .args([
            "--bootstrap-kubeconfig",
            "/nonexistent/bootstrap-kubelet.conf",
            "--cert-dir",
            pki.to_str().unwrap(),
            "--node-name",
            NODE,
            "--provider-id",
            PROVIDER_ID,
            "--attestor",
            "insecure",
            "kubeconfig",
            "--command",
            PLUGIN,
            "--output",
            kubeconfig.to_str().unwrap(),
            "--adopt",
        ])
        .env_remove("KUBERNETES_EXEC_INFO")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&adopt.stderr);
    assert!(adopt.status.success() && said.contains("adopted"), "{said}");
    let rendered = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        rendered.contains("exec:") && !rendered.contains("client-certificate"),
        "{rendered}"
    );
    kubelet.start_with(legacy_args(None, false));
    let Some(adoption) = csrs
        .wait_issued(WAIT, |s| s.signer == CLIENT_SIGNER && s.username == USER)
        .await
    else {
        panic!(
            "no adoption: {:?}\n{}",
            csrs.all(),
            diagnostics(&kubelet, Some(&signer), &kcm)
        );
    };
    let machine = live::get(&admin, &w.own(capi::machine(NODE, None))).await;
    let claim: Value = serde_json::from_str(
        machine["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claim["nodeName"], NODE);
    assert_eq!(claim["providerID"], PROVIDER_ID);
    let adopted = began.elapsed();
    let deadline = Instant::now() + WAIT;
    while binding_present(&w.admin, ROTATION_BINDING).await {
        assert!(
            Instant::now() < deadline,
            "the rotation binding stays after the adoption\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    prometheus.wait_alert(ALERT, "", &[("cluster", "team-a/prod")], WAIT);
    let (_, adopted_pem) = adoption.issued.clone().unwrap();
    let (_, _, adopted_subject) = validity(&adopted_pem);
    assert!(adopted_subject.contains(USER));
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, tests::kubelet::now_micros(), WAIT).await,
        "the adopted node is Ready on the signer's certificate\n{}",
        diagnostics(&kubelet, Some(&signer), &kcm)
    );
    let after: Vec<_> = csrs
        .all()
        .into_iter()
        .filter(|s| s.first_seen > adoption_started)
        .collect();
    assert!(
        after.iter().all(|s| s.signer != LEGACY_SIGNER),
        "no legacy CSR after the adoption: {after:?}"
    );
    assert!(node(&w.admin, NODE).await.is_some());
    eprintln!(
        "legacy join {} · alert firing {} · Ready past the first certificate {} · adopted {} · binding gone, alert resolved {}",
        secs(joined_legacy),
        secs(alert_fired),
        secs(rotated),
        secs(adopted),
        secs(began.elapsed())
    );
}
