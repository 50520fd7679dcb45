//! The documented opt-out (SPEC revision 5, section 7; README "Opt out", docs/operate.md), in
//! its order, with a real `kubeadm join` v1.32 of a node with the stock kubeadm configuration (no
//! plugin: kubelet's own TLS bootstrap, approved and signed by a real kube-controller-manager's
//! `csrapproving` and `csrsigning`), a real kubelet on its own containerd, a node with the plugin
//! (the real plugin in exec mode, as in `envtest_lifecycle`: one kubelet per host), the real
//! signer and a real kube-apiserver; skipped by `scripts/test` where a part is missing.
//!
//! The cluster is as `kubeadm init` leaves it, by kubeadm's own phases (`upload-config kubeadm`,
//! `upload-config kubelet`, `bootstrap-token`: the join token in kubeadm's group, kubeadm's two
//! auto-approve bindings), as in `envtest_kubeadm`; the Cluster is opted in, and the signer has
//! removed both bindings (its one other Node, `cp-0`, belongs to no Machine and keeps nothing).
//! A node with the plugin has joined through the signer.
//!
//! 1. The Cluster is annotated `cluster.x-k8s.io/kubelet-legacy-autoapprove: keep` and
//!    `cluster.x-k8s.io/kubelet-join-tokens: leave`.
//! 2. `node-attestation-signer opt-out-bindings` is applied in the workload cluster: kubeadm's
//!    two bindings are back, and the signer leaves them over several resyncs (and says so: an
//!    opt-out in progress).
//! 3. A node with the stock kubeadm node configuration joins with an unmodified `kubeadm join`
//!    (its kubelet unit kubeadm's `10-kubeadm.conf` alone): its CSR for
//!    `kubernetes.io/kube-apiserver-client-kubelet`, filed with the join token, is approved and
//!    signed by kube-controller-manager while the Cluster is still opted in; the node with the
//!    plugin still renews through the signer meanwhile; the bindings stay.
//! 4. The opt-in annotation is removed: the signer stops serving the Cluster (its log says what
//!    stays behind). The stock node keeps renewing through kube-controller-manager (the rotation
//!    binding, 100-second certificates so that kubelet rotates within the suite) and stays Ready;
//!    everything the signer left is still there (its workload RBAC from
//!    `config/workload/workload-cluster.yaml`, the claim on the plugin node's Machine, kubeadm's
//!    bindings as restored, the join token as it was) and breaks nothing; the node with the
//!    plugin gets no new certificate (its CSR stays pending), which is why it rolls first.
//!
//! Preflight checks skipped: the environment ones of `envtest_kubeadm`, for the same reasons.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE as CLIENT_SIGNER;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::kubeadm_node::{
    AUTO_APPROVE_BINDINGS, ControlPlane, ETC_KUBERNETES, KUBEADM_DROPIN, Kubeadm, KubeadmJoin, LEGACY_SIGNER,
    NodeNamespace, Unit, VAR_LIB_KUBELET, apply_worker_machine, bootstrap_token, join_diagnostics,
    kubeadm_controller_manager, kubelet_config_of, opted_in_cluster, require, role_variables, wait_cluster_info_signed,
};
use tests::kubelet::{
    Containerd, ControllerManager, CsrRecorder, Host, Kubelet, node, now_micros, secs, validity, wait_renewed_and_ready,
};
use tests::lifecycle::{PluginNode, machine_claim, set_node_ref};
use tests::live::{self, Final, Signer, apply, metric, state_of};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
/// The node with the stock kubeadm configuration.
const NODE: &str = "stock-0";
const USER: &str = "system:node:stock-0";
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0stock";
/// The node with the plugin.
const PLUGIN_NODE: &str = "plugin-0";
const PLUGIN_PROVIDER_ID: &str = "aws:///us-east-1a/i-0plugin";
/// The plugin node's join token (its KubeadmConfig's).
const PLUGIN_TOKEN_ID: &str = "plgtok";
/// The join token (`init.yaml`'s `bootstrapTokens`: kubeadm's group).
const JOIN_TOKEN_ID: &str = "kadmjn";
const JOIN_TOKEN: &str = "kadmjn.0123456789abcdef";
const KEEP: &str = "cluster.x-k8s.io/kubelet-legacy-autoapprove";
const JOIN_TOKENS: &str = "cluster.x-k8s.io/kubelet-join-tokens";
const OPT_IN: &str = "cluster.x-k8s.io/kubelet-authentication";
/// The signer's `--resync-period`: its duties run this often.
const RESYNC: Duration = Duration::from_secs(1);
/// kube-controller-manager's `--cluster-signing-duration`: short certificates (backdated 5
/// minutes, so kubelet's rotation point, 70-90% of 6m40s, falls 20 s before to 60 s after each
/// issuance) make the stock kubelet rotate several times within the suite.
const SIGNING_DURATION: &str = "100s";
const WAIT: Duration = Duration::from_secs(120);
/// What `config/workload/workload-cluster.yaml` puts in every workload cluster: (API version,
/// kind, namespace, name).
const SIGNER_WORKLOAD_OBJECTS: [(&str, &str, Option<&str>, &str); 6] = [
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        None,
        "node-attestation-signer-workload",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        None,
        "node-attestation-signer-workload",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
        Some("kube-system"),
        "node-attestation-signer-join-tokens",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        Some("kube-system"),
        "node-attestation-signer-join-tokens",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        None,
        "node-attestation-signer-join-tokens",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        None,
        "node-attestation-signer-join-tokens",
    ),
];

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

async fn present(bindings: &Api<ClusterRoleBinding>) -> Vec<&'static str> {
    let mut there = Vec::new();
    for name in AUTO_APPROVE_BINDINGS {
        if bindings.get_opt(name).await.unwrap().is_some() {
            there.push(name);
        }
    }
    there
}

/// The note of an Event with `reason` about `regarding` that says `says`.
fn event_note(env: &Envtest, regarding: &str, reason: &str, says: &str) -> Option<String> {
    let out = env.kubectl(&["get", "events.events.k8s.io", "-n", capi::NAMESPACE, "-o", "json"]);
    let events: Value = serde_json::from_slice(&out.stdout).ok()?;
    events["items"]
        .as_array()?
        .iter()
        .filter(|e| e["regarding"]["name"] == regarding && e["reason"] == reason)
        .filter_map(|e| e["note"].as_str())
        .find(|note| note.contains(says))
        .map(str::to_owned)
}

/// `kubectl annotate` of the Cluster (`key=value`, or `key-` to remove), as its admin.
fn annotate_cluster(env: &Envtest, annotations: &[&str]) {
    let mut args = vec![
        "annotate",
        "--overwrite",
        "clusters.cluster.x-k8s.io",
        capi::CLUSTER,
        "-n",
        capi::NAMESPACE,
    ];
    args.extend(annotations);
    let out = env.kubectl(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and kubeadm: root, kubelet, kube-controller-manager and kubeadm beside kube-apiserver in KUBEBUILDER_ASSETS, containerd, runc, unshare and nsenter"]
async fn the_documented_opt_out_hands_every_node_back_to_kubeadm_and_leaves_nothing_broken() {
    let assets = require("envtest_opt_out");
    let claimed = Instant::now();
    let mut host = Host::claim();
    // From here on: waiting for another kubelet suite to free the host is not this suite's time.
    let began = Instant::now();
    let host_wait = claimed.elapsed();

    // The workload cluster (its own management cluster): an opted-in Cluster allowing insecure,
    // the stock node's Machine (its address the node address, its KubeadmConfig naming the
    // join token) and the plugin node's Machine (the fixture token).
    let (w, admin) = opted_in_cluster("envtest_opt_out", &host, "insecure").await;
    let recorder = host.recorder();
    apply_worker_machine(&admin, &w, NODE, JOIN_TOKEN_ID, PROVIDER_ID).await;
    apply(
        &admin,
        &w.own(capi::kubeadm_config(
            &format!("{PLUGIN_NODE}-kc"),
            PLUGIN_TOKEN_ID,
            "v1beta2",
        )),
    )
    .await;
    apply(&admin, &w.own(capi::machine(PLUGIN_NODE, Some(PLUGIN_PROVIDER_ID)))).await;
    // Its join token, as Cluster API's bootstrap provider creates one (kubeadm's group, whose
    // `kubeadm:kubelet-bootstrap` binding lets it file CSRs).
    apply(
        &w.admin,
        &json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
                "metadata": {"name": format!("bootstrap-token-{PLUGIN_TOKEN_ID}"), "namespace": "kube-system"},
                "stringData": {"token-id": PLUGIN_TOKEN_ID, "token-secret": "0123456789abcdef",
                    "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                    "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}}),
    )
    .await;
    let csrs = CsrRecorder::start(w.admin.clone()).await;
    let kcm = kubeadm_controller_manager(
        &assets,
        &w.env,
        &host,
        &[&format!("--cluster-signing-duration={SIGNING_DURATION}")],
    );
    let containerd = Containerd::start(&host);
    let mut kubelet = Kubelet::new(&assets, &host, &containerd, NODE, PROVIDER_ID);

    // The stock node's namespace: an image without the plugin (an empty file stands where the
    // namespace binds one) and without the role's drop-in.
    let role = role_variables(&[]);
    let no_plugin = tempfile::NamedTempFile::new().unwrap();
    let ns = NodeNamespace::start(
        &mut host,
        &recorder,
        &role["kubelet_authenticator_install_path"],
        no_plugin.path(),
        NODE,
    );
    std::fs::create_dir_all(ns.path(&format!("{ETC_KUBERNETES}/pki"))).unwrap();
    let unit = Unit::read(&[KUBEADM_DROPIN]);
    assert!(unit.exec_start_pre.is_empty(), "kubeadm's unit alone: {unit:?}");

    // What `kubeadm init` leaves behind, by kubeadm's own phases.
    let kubeadm = Kubeadm::new(&assets);
    let control_plane = ControlPlane::of(&w).await;
    let tokens = vec![bootstrap_token(JOIN_TOKEN, Some("the stock node's join token"))];
    kubeadm
        .init_cluster(
            &ns,
            &w,
            &control_plane.init_documents(&containerd.endpoint(), tokens, None),
            &kubelet_config_of(&containerd, &kubelet),
        )
        .await;
    let bindings: Api<ClusterRoleBinding> = Api::all(w.admin.clone());
    assert_eq!(
        present(&bindings).await,
        AUTO_APPROVE_BINDINGS,
        "kubeadm init's bindings"
    );
    wait_cluster_info_signed(&w.admin, &[JOIN_TOKEN_ID], Duration::from_secs(60), &kcm).await;

    // Opted in: the signer removes both bindings (cp-0 belongs to no Machine: it keeps nothing).
    let resync = format!("{}s", RESYNC.as_secs());
    let identity = Signer::management_identity(&w.env).await;
    let signer = Signer::spawn_with(
        &signer_bin(),
        &w.env,
        &identity,
        &["--resync-period", &resync, "--secret-resync-period", &resync],
        &["--leader-elect", "false"],
    );
    recorder.pid(signer.pid().unwrap());
    let deadline = Instant::now() + WAIT;
    while !present(&bindings).await.is_empty() {
        assert!(Instant::now() < deadline, "the bindings stay\n{}", signer.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node with the plugin joins through the signer, registers, and its Machine gets its
    // nodeRef (the Machine controller's reconcileNode).
    let plugin_node = PluginNode::joining(
        Path::new(PLUGIN),
        &w.env,
        PLUGIN_NODE,
        PLUGIN_PROVIDER_ID,
        &format!("{PLUGIN_TOKEN_ID}.0123456789abcdef"),
    );
    let (user, said) = plugin_node.call();
    assert_eq!(user, format!("system:node:{PLUGIN_NODE}"), "{said}");
    plugin_node.register();
    set_node_ref(&admin, &w.admin, capi::NAMESPACE, PLUGIN_NODE).await;
    let claim = machine_claim(&admin, capi::NAMESPACE, PLUGIN_NODE)
        .await
        .expect("the plugin node's Machine is claimed");
    assert_eq!(claim["nodeName"], PLUGIN_NODE);
    let plugin_renews = |when: &'static str| {
        let plugin_node = &plugin_node;
        let csrs = &csrs;
        let w = &w;
        let signer = &signer;
        async move {
            let before = csrs.of(CLIENT_SIGNER).len();
            plugin_node.due_for_rotation(&w.env);
            let (user, said) = plugin_node.call();
            assert_eq!(user, format!("system:node:{PLUGIN_NODE}"), "{said}");
            let renewal = csrs
                .wait_issued(Duration::from_secs(10), |s| {
                    s.signer == CLIENT_SIGNER && s.username == format!("system:node:{PLUGIN_NODE}")
                })
                .await;
            let all = csrs.of(CLIENT_SIGNER);
            assert!(
                renewal.is_some() && all.len() == before + 1 && all.last().is_some_and(|s| s.issued.is_some()),
                "{PLUGIN_NODE} renews through the signer {when}: {all:?}\n{said}\n{}",
                signer.log()
            );
        }
    };
    plugin_renews("before the opt-out").await;
    let tokens: Api<Secret> = Api::namespaced(w.admin.clone(), "kube-system");
    let token_version = tokens
        .get(&format!("bootstrap-token-{JOIN_TOKEN_ID}"))
        .await
        .unwrap()
        .metadata
        .resource_version;
    let setup = began.elapsed();

    // 1. The opt-out begins: kubeadm's bindings are to be kept, join tokens left alone.
    annotate_cluster(&w.env, &[&format!("{KEEP}=keep"), &format!("{JOIN_TOKENS}=leave")]);

    // 2. kubeadm's bindings restored, as `node-attestation-signer opt-out-bindings` prints them.
    let printed = Command::new(signer_bin()).arg("opt-out-bindings").output().unwrap();
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    let printed = String::from_utf8(printed.stdout).unwrap();
    let applied = w
        .env
        .kubectl_as(&w.env.admin_kubeconfig, &["apply", "-f", "-"], Some(&printed));
    assert!(
        applied.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(present(&bindings).await, AUTO_APPROVE_BINDINGS, "restored");
    let bootstrap_binding = bindings.get(AUTO_APPROVE_BINDINGS[0]).await.unwrap();
    assert_eq!(
        bootstrap_binding.subjects.unwrap()[0].name,
        "system:bootstrappers:kubeadm:default-node-token",
        "kubeadm's group, the join token's"
    );
    // The signer says it keeps them (an Event on the Cluster), and leaves them there over
    // several resyncs.
    let deadline = Instant::now() + WAIT;
    let kept = loop {
        if let Some(note) = event_note(
            &w.env,
            capi::CLUSTER,
            "LegacyAutoapproveBinding",
            "an opt-out in progress",
        ) {
            break note;
        }
        assert!(
            Instant::now() < deadline,
            "no Event says the bindings are kept\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("Event on Cluster {}: {kept}", capi::CLUSTER);
    let watched = Instant::now();
    while watched.elapsed() < RESYNC * 5 {
        assert_eq!(
            present(&bindings).await,
            AUTO_APPROVE_BINDINGS,
            "the signer removed a restored binding\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restored = began.elapsed();

    // 3. The stock node joins: an unmodified `kubeadm join`, kubelet from kubeadm's unit alone
    //    (--bootstrap-kubeconfig, --kubeconfig), still opted in.
    let stock = json!({"nodeRegistration": {"kubeletExtraArgs": [{"name": "provider-id", "value": PROVIDER_ID}]}});
    let join = control_plane.join_configuration(&stock, JOIN_TOKEN, Some(NODE), &containerd.endpoint(), false);
    let mut kubeadm_join = kubeadm.join(&ns, &recorder, &join, &[kubeadm.ignore_preflight_errors()]);
    let bootstrap_file = format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf");
    kubeadm_join.wait_for_kubelet_start(&ns, WAIT, "kubeadm join").await;
    // Where kubeadm asks systemd to (re)start kubelet: kubeadm's unit's ExecStart.
    let service = ns.kubelet_service(&unit);
    let kubelet_args = service.kubelet_args();
    for wanted in [
        format!("--bootstrap-kubeconfig={bootstrap_file}"),
        format!("--kubeconfig={ETC_KUBERNETES}/kubelet.conf"),
        format!("--provider-id={PROVIDER_ID}"),
    ] {
        assert!(kubelet_args.contains(&wanted), "{wanted} not in {kubelet_args:?}");
    }
    let config = ns.read(&format!("{VAR_LIB_KUBELET}/config.yaml")).unwrap();
    assert!(
        config.contains("rotateCertificates: true"),
        "kubeadm's kubelet rotates its certificate:\n{config}"
    );
    let kubelet_started = Instant::now();
    ns.start_kubelet(&service, &mut kubelet, &assets);
    let diagnostics = |join: &KubeadmJoin, kubelet: &Kubelet, signer: &Signer, kcm: &ControllerManager| {
        join_diagnostics(join, kubelet, signer, 30, kcm)
    };
    let Some(first) = csrs
        .wait_issued(WAIT, |s| {
            s.signer == LEGACY_SIGNER && s.username == format!("system:bootstrap:{JOIN_TOKEN_ID}")
        })
        .await
    else {
        panic!(
            "kube-controller-manager issued nothing: {:?}\n{}",
            csrs.all(),
            diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
        );
    };
    assert_eq!(
        first.approved_reason.as_deref(),
        Some("AutoApproved"),
        "approved by kube-controller-manager's csrapproving: {first:?}"
    );
    let (_, first_pem) = first.issued.clone().unwrap();
    let (_, _, subject) = validity(&first_pem);
    assert!(subject.contains(USER), "{subject}");
    kubeadm_join
        .wait_joined("kubeadm join", Duration::from_secs(180), |join| {
            diagnostics(join, &kubelet, &signer, &kcm)
        })
        .await;
    let join_took = kubeadm_join.started.elapsed();
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, 0, WAIT).await,
        "the stock node is not Ready\n{}",
        diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
    );
    let registered = node(&w.admin, NODE).await.unwrap();
    assert_eq!(
        registered.spec.and_then(|s| s.provider_id).as_deref(),
        Some(PROVIDER_ID)
    );
    let stock_ready = kubelet_started.elapsed();
    set_node_ref(&admin, &w.admin, capi::NAMESPACE, NODE).await;
    // The node with the plugin still renews through the signer; the bindings are still there.
    plugin_renews("while the stock node joins").await;
    assert_eq!(present(&bindings).await, AUTO_APPROVE_BINDINGS, "\n{}", signer.log());
    assert!(
        csrs.all()
            .iter()
            .filter(|s| s.username == USER || s.username.starts_with("system:bootstrap:kadmjn"))
            .all(|s| s.signer == LEGACY_SIGNER),
        "the stock node asks kube-controller-manager only: {:?}",
        csrs.all()
    );

    // 4. The opt-in annotation goes: the signer stops serving the Cluster and says what stays.
    annotate_cluster(&w.env, &[&format!("{OPT_IN}-")]);
    let deadline = Instant::now() + WAIT;
    while !signer.log().contains("no longer opted in") {
        assert!(
            Instant::now() < deadline,
            "the signer still serves the Cluster\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let opted_out_at = Instant::now();
    let line = signer
        .log()
        .lines()
        .find(|l| l.contains("no longer opted in"))
        .unwrap()
        .to_owned();
    assert!(line.contains("opt-out-bindings") && line.contains("claims"), "{line}");
    assert_eq!(
        metric(&signer.metrics(), "node_attestation_clusters{state=\"Ready\"}"),
        0.0,
        "no Cluster served"
    );
    // The stock node keeps renewing: kubelet rotates through kube-controller-manager, as the
    // node itself, under the rotation binding.
    let Some(renewal) = csrs
        .wait_issued(WAIT, |s| {
            s.signer == LEGACY_SIGNER && s.username == USER && s.first_seen > opted_out_at
        })
        .await
    else {
        panic!(
            "the stock node did not renew after the opt-out: {:?}\n{}",
            csrs.of(LEGACY_SIGNER),
            diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
        );
    };
    assert_eq!(renewal.approved_reason.as_deref(), Some("AutoApproved"), "{renewal:?}");
    let renewed_after = opted_out_at.elapsed();
    let (renewed_at, _) = renewal.issued.clone().unwrap();
    let since = now_micros() - i64::try_from(renewed_at.elapsed().as_micros()).unwrap();
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, since, WAIT).await,
        "the stock node is Ready on its renewed certificate\n{}",
        diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
    );
    // Nothing the signer left is gone, and none of it broke the stock node: its workload RBAC,
    // the plugin node's claim, kubeadm's bindings as restored, the join token as it was.
    for (api_version, kind, namespace, name) in SIGNER_WORKLOAD_OBJECTS {
        let (group, version) = api_version.split_once('/').unwrap();
        let resource = kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(w.admin.clone(), ns, &resource),
            None => Api::all_with(w.admin.clone(), &resource),
        };
        assert!(api.get_opt(name).await.unwrap().is_some(), "{kind} {name} stays");
    }
    assert_eq!(
        machine_claim(&admin, capi::NAMESPACE, PLUGIN_NODE).await.unwrap()["nodeName"],
        PLUGIN_NODE,
        "the claim stays on the Machine"
    );
    assert_eq!(
        present(&bindings).await,
        AUTO_APPROVE_BINDINGS,
        "kubeadm's bindings stay as restored"
    );
    assert_eq!(
        tokens
            .get(&format!("bootstrap-token-{JOIN_TOKEN_ID}"))
            .await
            .unwrap()
            .metadata
            .resource_version,
        token_version,
        "the join token as it was"
    );
    // The node with the plugin gets no new certificate: its renewal stays pending (roll it
    // before the opt-in annotation goes).
    let filed_before = csrs.of(CLIENT_SIGNER).len();
    plugin_node.due_for_rotation(&w.env);
    let waited = plugin_node.exec_waiting(&format!("{}s", (RESYNC * 5).as_secs()));
    let said = String::from_utf8_lossy(&waited.stderr);
    let pending = csrs.of(CLIENT_SIGNER);
    assert_eq!(pending.len(), filed_before + 1, "{said}");
    let last = pending.last().unwrap();
    assert!(
        last.approved.is_none() && last.refused.is_none() && last.issued.is_none(),
        "nobody serves the plugin's CSR any more: {last:?}"
    );
    let api: Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> = Api::all(w.admin.clone());
    assert_eq!(state_of(&api.get(&last.name).await.unwrap()), Final::Pending);
    assert!(kubelet.alive(), "{}", kubelet.log());

    let legacy = csrs.of(LEGACY_SIGNER);
    eprintln!(
        "envtest_opt_out timings: waited {} for the host; setup (apiserver, kubeadm init phases, signer, plugin node) {}; bindings restored and kept {}; \
         kubeadm join {} (kubelet start to Ready {}); renewal through kube-controller-manager {} after the signer stopped serving the Cluster; \
         {} legacy CSRs ({} rotations); total {}",
        secs(host_wait),
        secs(setup),
        secs(restored),
        secs(join_took),
        secs(stock_ready),
        secs(renewed_after),
        legacy.len(),
        legacy.iter().filter(|s| s.username == USER).count(),
        secs(began.elapsed()),
    );
    kubelet.stop();
    drop(ns);
}
