//! The first control-plane node, made by a real `kubeadm init` v1.32 (from
//! `KUBEBUILDER_ASSETS`) run phase by phase with the shipped `KubeadmControlPlane`
//! configuration (`images/kubeadm/kubeadm-control-plane.yaml`) on an image as the
//! `kubelet_authenticator` role leaves it, comes under attestation (SPEC rule 7 and
//! section 6): kubeadm issues kubelet's certificate from the cluster CA
//! (`ClusterConfiguration.certificateValidityPeriod: 4m`), the drop-in's `kubeconfig --adopt`
//! hands kubelet's identity to the plugin at once, the plugin's first request made with kubeadm's
//! certificate is an adoption the signer approves for the Machine whose registered Node carries
//! its provider ID, and the node renews through the signer past the expiry of kubeadm's
//! certificate, staying Ready. No `kubernetes.io/kube-apiserver-client-kubelet` CSR is ever
//! filed. The node runs as in `envtest_kubeadm` (a private mount and UTS namespace, hostname
//! `cp-0`, a stub `systemctl`, the suite playing systemd with kubeadm's `10-kubeadm.conf` and
//! the role's drop-in).
//!
//! The phases run, in `kubeadm init`'s order, with the suite's apiserver as the control plane
//! (its CA, the cluster's client CA, put where kubeadm looks for it):
//! `kubeconfig kubelet`, `kubelet-start`, `upload-config kubeadm`, `upload-config kubelet`,
//! `mark-control-plane`, `bootstrap-token`, `kubelet-finalize all` (which points kubelet.conf's
//! user at `kubelet-client-current.pem` and restarts kubelet: the drop-in renders it back).
//! The phases skipped, and why ([`SKIPPED_PHASES`]): what needs the control plane's static pods
//! (images this machine cannot pull; the suite runs kube-apiserver and kube-controller-manager
//! itself, on the suite's etcd, external to kubeadm) or its other certificates.
//!
//! Then a second control-plane node (`cp-1`) runs an unmodified `kubeadm join --control-plane`
//! with the shipped joinConfiguration, its control-plane phases skipped
//! ([`JOIN_SKIPPED_PHASES`]; etcd is external, so `check-etcd` and `etcd-join` have nothing to
//! do), and joins with the plugin's identity: one CSR with its Machine's join token, the Machine
//! claimed, the bootstrap kubeconfig deleted, the Node Ready and marked control-plane. Neither
//! node ever files a `kubernetes.io/kube-apiserver-client-kubelet` CSR.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::kubeadm_node::{
    ETC_KUBERNETES, NodeNamespace, SYSTEMD_PATH, ca_cert_hash, expand, render, require, role_unit, role_variables,
};
use tests::kubelet::{
    Containerd, ControllerManager, CsrRecorder, Host, Kubelet, NODE_IP, node, ready_past, secs, validity,
    wait_renewed_and_ready,
};
use tests::live::{self, Signer, Workload, apply};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NODE: &str = "cp-0";
const USER: &str = "system:node:cp-0";
/// The first control-plane Machine, as KubeadmControlPlane names it.
const MACHINE: &str = "prod-cp-x7k2p";
const AVAILABILITY_ZONE: &str = "us-east-1a";
const INSTANCE_ID: &str = "i-0kubeadminit";
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0kubeadminit";
const CLIENT_SIGNER: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure";
const LEGACY_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const CONTROL_PLANE_CONFIG: &str = "images/kubeadm/kubeadm-control-plane.yaml";
/// kubeadm's certificates live this long here.
const KUBEADM_VALIDITY: &str = "4m";
const WAIT: Duration = Duration::from_secs(150);

/// The phases of `kubeadm init` run, in order.
const PHASES: [&[&str]; 7] = [
    &["kubeconfig", "kubelet"],
    &["kubelet-start"],
    &["upload-config", "kubeadm"],
    &["upload-config", "kubelet"],
    &["mark-control-plane"],
    &["bootstrap-token"],
    &["kubelet-finalize", "all"],
];

/// The phases of `kubeadm init` skipped, and why.
const SKIPPED_PHASES: [(&str, &str); 10] = [
    (
        "preflight",
        "checks the host for a control plane (ports 6443, 10257, 10259, 2379; manifests; images): the suite runs the control plane itself",
    ),
    (
        "certs (all but the CA)",
        "the apiserver's serving, front-proxy, etcd and service-account certificates are the suite's apiserver's own; the CA is the cluster's client CA, put where kubeadm finds it",
    ),
    (
        "kubeconfig admin, super-admin, controller-manager, scheduler",
        "for control-plane processes the suite starts with its own credentials (admin.conf holds the suite's admin credential)",
    ),
    (
        "etcd local",
        "external etcd (ClusterConfiguration.etcd.external): the suite's",
    ),
    (
        "control-plane",
        "static pods of kube-apiserver, kube-controller-manager and kube-scheduler need images this machine cannot pull: the suite runs them",
    ),
    ("wait-control-plane", "waits for those static pods through kubelet"),
    (
        "upload-certs",
        "shares the control plane's certificates for joining control-plane nodes (--upload-certs)",
    ),
    ("addon coredns", "a Deployment whose image this machine cannot pull"),
    ("addon kube-proxy", "a DaemonSet whose image this machine cannot pull"),
    (
        "show-join-command",
        "prints the join command; nothing of the node's identity",
    ),
];

/// The second control-plane node and its Machine.
const SECOND_NODE: &str = "cp-1";
const SECOND_MACHINE: &str = "prod-cp-b9q4w";
const SECOND_INSTANCE_ID: &str = "i-0kubeadmjoincp";
const SECOND_PROVIDER_ID: &str = "aws:///us-east-1a/i-0kubeadmjoincp";
/// The join token (`bootstrap-token` phase, the second Machine's KubeadmConfig's).
const JOIN_TOKEN_ID: &str = "kadmin";
const JOIN_TOKEN: &str = "kadmin.0123456789abcdef";

/// The phases of `kubeadm join --control-plane` skipped, and why.
const JOIN_SKIPPED_PHASES: [(&str, &str); 5] = [
    (
        "preflight",
        "checks the host for a control plane (ports, manifests) and the shared certificates the skipped certs phase would use",
    ),
    (
        "control-plane-prepare/download-certs",
        "no --certificate-key: Cluster API hands the CA to the Machine itself",
    ),
    (
        "control-plane-prepare/certs",
        "the control plane's serving and client certificates, for static pods that do not run here",
    ),
    (
        "control-plane-prepare/control-plane",
        "static pod manifests whose images this machine cannot pull",
    ),
    ("wait-control-plane", "waits for those static pods through kubelet"),
];

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and kubeadm: root, kubelet, kube-controller-manager and kubeadm beside kube-apiserver in KUBEBUILDER_ASSETS, containerd, runc, unshare and nsenter"]
async fn kubeadm_inits_first_control_plane_node_is_adopted_and_renews_past_kubeadms_certificate() {
    let assets = require("envtest_kubeadm_init");
    let began = Instant::now();
    let mut host = Host::claim();
    let env = Envtest::start("envtest_kubeadm_init");
    let recorder = host.recorder();
    env.pids().into_iter().for_each(|pid| recorder.pid(pid));
    recorder.folder(env.dir());
    recorder.folder(env.client_ca.cert_path.parent().unwrap());
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;

    // The KubeadmControlPlane's first Machine: its provider ID, no nodeRef (no Machine
    // controller runs here: the registered Node carrying the provider ID names the node).
    let mut machine = w.own(capi::machine(MACHINE, Some(PROVIDER_ID)));
    machine["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    machine["spec"]["bootstrap"]["configRef"]["name"] = json!(MACHINE);
    machine["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": NODE_IP.to_string()},
        {"type": "Hostname", "address": NODE}
    ]);
    apply(&admin, &machine).await;
    // Its KubeadmConfig: the KubeadmControlPlane's kubeadmConfigSpec, as the control plane
    // controller copies it.
    let shipped: Value =
        serde_yaml::from_str(&std::fs::read_to_string(tests::repo_root().join(CONTROL_PLANE_CONFIG)).unwrap()).unwrap();
    let spec = &shipped["spec"]["kubeadmConfigSpec"];
    let mut init_config = w.own(capi::kubeadm_config(MACHINE, "abcdef", "v1beta2"));
    init_config["spec"] = spec.clone();
    apply(&admin, &init_config).await;
    let csrs = CsrRecorder::start(w.admin.clone()).await;
    // bootstrapsigner signs cluster-info for the join token (the second node's discovery).
    let kcm = ControllerManager::start_with_controllers(
        &assets,
        &w.env,
        &host,
        &["csrsigning", "csrapproving", "bootstrapsigner"],
    );
    let containerd = Containerd::start(&host);
    let mut kubelet = Kubelet::new(&assets, &host, &containerd, NODE, PROVIDER_ID);
    let signer = Signer::start(
        &signer_bin(),
        &w.env,
        &["--client-cert-duration", "3m", "--leader-elect", "false"],
    )
    .await;
    recorder.pid(signer.pid().unwrap());

    // The node's namespace, with the image as the role leaves it and the cluster CA where
    // kubeadm init finds it (it signs kubelet's certificate with it).
    let role = role_variables(&[("kubelet_authenticator_attestor", "insecure")]);
    let install_path = role["kubelet_authenticator_install_path"].clone();
    let ns = NodeNamespace::start(&mut host, &recorder, &install_path, Path::new(PLUGIN), NODE);
    ns.bake_image(&role);
    std::fs::write(
        ns.path(&format!("{ETC_KUBERNETES}/pki/ca.crt")),
        &w.env.client_ca.cert_pem,
    )
    .unwrap();
    std::fs::write(
        ns.path(&format!("{ETC_KUBERNETES}/pki/ca.key")),
        &w.env.client_ca.key_pem,
    )
    .unwrap();
    // What the skipped `kubeconfig admin` phase would write: the suite's admin credential.
    std::fs::copy(
        &w.env.admin_kubeconfig,
        ns.path(&format!("{ETC_KUBERNETES}/admin.conf")),
    )
    .unwrap();
    let unit = role_unit(&role);

    // The bootstrap provider's part: the shipped kubeadmConfigSpec's files and init
    // configuration, with cloud-init's instance metadata.
    let metadata = |name: &str| match name {
        "ds.meta_data.placement.availability_zone" => Some(AVAILABILITY_ZONE.to_owned()),
        "ds.meta_data.instance_id" => Some(INSTANCE_ID.to_owned()),
        _ => None,
    };
    ns.write_files(&spec["files"], metadata);
    let mut init: Value = serde_json::from_str(&render(&spec["initConfiguration"].to_string(), metadata)).unwrap();
    init["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
    init["kind"] = json!("InitConfiguration");
    let endpoint = w.env.server.trim_start_matches("https://").to_owned();
    let (_, port) = endpoint.rsplit_once(':').unwrap();
    // The control plane's own address (kubeadm refuses loopback; the node reaches the
    // apiserver through controlPlaneEndpoint).
    init["localAPIEndpoint"] = json!({"advertiseAddress": "192.0.2.10", "bindPort": port.parse::<u16>().unwrap()});
    init["bootstrapTokens"] = json!([{"token": JOIN_TOKEN, "ttl": "1h"}]);
    init["nodeRegistration"]["name"] = json!(NODE);
    init["nodeRegistration"]["criSocket"] = json!(containerd.endpoint());
    init["nodeRegistration"]["kubeletExtraArgs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "node-ip", "value": NODE_IP.to_string()}));
    let version = w.admin.apiserver_version().await.unwrap().git_version;
    let cluster = json!({"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
        "kubernetesVersion": version, "clusterName": capi::CLUSTER, "controlPlaneEndpoint": endpoint,
        "certificateValidityPeriod": KUBEADM_VALIDITY, "networking": {"serviceSubnet": "10.0.0.0/24"},
        "etcd": {"external": {"endpoints": [w.env.etcd_url()]}}});
    let sandbox = tests::kubelet::sandbox_config(
        &containerd.endpoint(),
        kubelet.port,
        kubelet.healthz_port,
        kubelet.dir(),
    )
    .replace("\nenforceNodeAllocatable: []\n", "\nenforceNodeAllocatable: [none]\n");
    let init_text = format!(
        "{}---\n{}---\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{sandbox}",
        serde_yaml::to_string(&init).unwrap(),
        serde_yaml::to_string(&cluster).unwrap()
    );
    let init_path = ns.dir.path().join("init.yaml");
    std::fs::write(&init_path, &init_text).unwrap();
    let kubeadm = assets.join("kubeadm");
    let kubeadm_env = vec![
        ("PATH".to_owned(), format!("{}:{SYSTEMD_PATH}", assets.display())),
        ("HOME".to_owned(), "/root".to_owned()),
    ];
    let phase = |name: &[&str]| {
        let mut args: Vec<String> = ["init", "phase"].iter().map(ToString::to_string).collect();
        args.extend(name.iter().map(ToString::to_string));
        args.extend(["--config".to_owned(), init_path.display().to_string()]);
        // The others read /etc/kubernetes/admin.conf: the suite's admin credential there.
        if matches!(name[0], "upload-config" | "bootstrap-token") {
            args.extend(["--kubeconfig".to_owned(), w.env.admin_kubeconfig.display().to_string()]);
        }
        let out = ns.command(&kubeadm_env, &kubeadm, &args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubeadm {}: {text}", args.join(" "));
        text
    };
    // systemd's part: the unit's ExecStartPre, then kubelet, as systemd would.
    let kubelet_conf = role["kubelet_authenticator_kubeconfig"].clone();
    let start_unit = |ns: &NodeNamespace, kubelet: &mut Kubelet| {
        let service_env: Vec<(String, String)> = std::iter::once(("PATH".to_owned(), SYSTEMD_PATH.to_owned()))
            .chain(unit.environment(|path| ns.read(path)))
            .collect();
        let pre = expand(&unit.exec_start_pre[0], &service_env);
        let out = ns
            .command(&service_env, Path::new(&pre[0]), &pre[1..])
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "ExecStartPre {pre:?}: {said}");
        let exec_start = expand(unit.exec_start.as_deref().unwrap(), &service_env);
        kubelet.start_command(
            &ns.nsenter,
            ns.args(&service_env, &assets.join("kubelet"), &exec_start[1..]),
        );
        said
    };
    let setup = began.elapsed();

    // 1. kubeconfig kubelet: kubeadm's own kubelet.conf, a certificate from the cluster CA.
    let mut said = phase(PHASES[0]);
    let kubeadm_conf: Value = serde_yaml::from_str(&ns.read(&kubelet_conf).unwrap()).unwrap();
    let embedded = kubeadm_conf["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .unwrap();
    let kubeadm_pem = {
        use base64::Engine as _;
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(embedded).unwrap()).unwrap()
    };
    let (kubeadm_not_before, kubeadm_not_after, subject) = validity(&kubeadm_pem);
    assert!(subject.contains(USER), "{subject}");
    assert!(
        kubeadm_not_after - kubeadm_not_before <= 4 * 60 + 60,
        "certificateValidityPeriod shortens kubeadm's certificate"
    );

    // 2. kubelet-start: kubeadm asks systemd to start kubelet; the unit adopts kubeadm's
    //    kubelet.conf and runs kubelet with the plugin.
    said.push_str(&phase(PHASES[1]));
    assert!(
        ns.systemctl_calls().iter().any(|c| c.contains("kubelet")),
        "kubeadm asked systemd for kubelet: {:?}",
        ns.systemctl_calls()
    );
    let adopted_said = start_unit(&ns, &mut kubelet);
    assert!(adopted_said.contains("adopted"), "{adopted_said}");
    assert!(
        ns.read(&format!("{kubelet_conf}.pre-adoption")).is_some(),
        "kubeadm's kubelet.conf is kept"
    );
    let kubelet_started = Instant::now();
    let diagnostics = |kubelet: &Kubelet, said: &str| {
        format!(
            "--- kubeadm:\n{said}\n--- kubelet:\n{}\n--- signer:\n{}\n--- kube-controller-manager:\n{}",
            kubelet.log(),
            signer.log(),
            kcm.log()
        )
    };
    let deadline = Instant::now() + WAIT;
    while node(&w.admin, NODE).await.is_none() {
        assert!(
            Instant::now() < deadline && kubelet.alive(),
            "cp-0 was not registered\n{}",
            diagnostics(&kubelet, &said)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let registered = node(&w.admin, NODE).await.unwrap();
    assert_eq!(
        registered.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(PROVIDER_ID)
    );

    // The adoption: the plugin's request, made with kubeadm's certificate as the node and
    // carrying its attestation, issued for the Machine, which is claimed for cp-0.
    let Some(adoption) = csrs
        .wait_issued(WAIT, |s| {
            s.signer == CLIENT_SIGNER && s.username == USER && s.issued.is_some()
        })
        .await
    else {
        panic!("no adoption: {:?}\n{}", csrs.all(), diagnostics(&kubelet, &said));
    };
    let adopted_after = kubelet_started.elapsed();
    let claimed = live::get(&admin, &w.own(capi::machine(MACHINE, None))).await;
    let claim: Value = serde_json::from_str(
        claimed["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
            .as_str()
            .unwrap_or_else(|| panic!("Machine {MACHINE} is not claimed\n{}", signer.log())),
    )
    .unwrap();
    assert_eq!(claim["nodeName"], NODE);
    assert_eq!(claim["providerID"], PROVIDER_ID);
    // One CSR: the plugin waited for kubelet to register the Node before asking (the signer
    // adopts only the node its Machine names), so nothing was refused on the way.
    let refused: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.refused.is_some())
        .collect();
    assert!(refused.is_empty(), "no refused adoption: {refused:?}");
    assert_eq!(csrs.of(CLIENT_SIGNER).len(), 1, "one CSR: {:?}", csrs.all());

    // 3. The cluster-side phases, then kubelet-finalize, which points kubelet.conf's user at
    //    the rotatable file and restarts kubelet: the unit renders the plugin's kubeconfig back.
    for name in &PHASES[2..6] {
        said.push_str(&phase(name));
    }
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, 0, WAIT).await,
        "cp-0 is not Ready\n{}",
        diagnostics(&kubelet, &said)
    );
    said.push_str(&phase(PHASES[6]));
    let finalized = ns.read(&kubelet_conf).unwrap();
    assert!(
        finalized.contains("kubelet-client-current.pem"),
        "kubelet-finalize ran: {finalized}"
    );
    kubelet.stop();
    let rendered_said = start_unit(&ns, &mut kubelet);
    let conf = ns.read(&kubelet_conf).unwrap();
    assert!(
        conf.contains("exec:") && !conf.contains("client-certificate"),
        "{rendered_said}\n{conf}"
    );

    // 4. Past kubeadm's certificate's expiry, and past the adoption's own certificate's, cp-0 is
    //    Ready on the signer's certificates: it has renewed through the signer as the node.
    let (_, adopted_pem) = adoption.issued.clone().unwrap();
    let (_, adopted_not_after, _) = validity(&adopted_pem);
    assert!(
        ready_past(&w.admin, NODE, kubeadm_not_after.max(adopted_not_after), WAIT).await,
        "cp-0 lost its identity at kubeadm's or the adoption's expiry\n{}",
        diagnostics(&kubelet, &said)
    );
    let renewals: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.username == USER && s.issued.is_some() && s.name != adoption.name)
        .collect();
    assert!(!renewals.is_empty(), "renewed through the signer after the adoption");
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "no legacy kubelet CSR: {:?}",
        csrs.of(LEGACY_SIGNER)
    );

    // 5. A second control-plane node: an unmodified `kubeadm join --control-plane` with the
    //    shipped joinConfiguration, its static-pod and etcd phases skipped (JOIN_SKIPPED_PHASES),
    //    gets its identity exactly as a worker: the plugin, the Machine's join token, one CSR.
    let join_started = Instant::now();
    let mut second = w.own(capi::machine(SECOND_MACHINE, Some(SECOND_PROVIDER_ID)));
    second["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    second["spec"]["bootstrap"]["configRef"]["name"] = json!(SECOND_MACHINE);
    second["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": NODE_IP.to_string()},
        {"type": "Hostname", "address": SECOND_NODE}
    ]);
    apply(&admin, &second).await;
    let mut second_config = w.own(capi::kubeadm_config(SECOND_MACHINE, JOIN_TOKEN_ID, "v1beta2"));
    let discovery = second_config["spec"]["joinConfiguration"]["discovery"].clone();
    second_config["spec"] = spec.clone();
    second_config["spec"]["joinConfiguration"]["discovery"] = discovery;
    apply(&admin, &second_config).await;
    // What kubeadm init creates for the admin.conf it writes (group kubeadm:cluster-admins):
    // the join's own admin.conf (control-plane-prepare/kubeconfig) needs it.
    apply(
        &w.admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:cluster-admins"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins"}]}),
    )
    .await;
    let configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(w.admin.clone(), "kube-public");
    let deadline = Instant::now() + WAIT;
    while !configmaps
        .get_opt("cluster-info")
        .await
        .unwrap()
        .and_then(|c| c.data)
        .is_some_and(|d| d.contains_key(&format!("jws-kubeconfig-{JOIN_TOKEN_ID}")))
    {
        assert!(Instant::now() < deadline, "cluster-info is not signed\n{}", kcm.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let containerd2 = Containerd::start(&host);
    let mut kubelet2 = Kubelet::new(&assets, &host, &containerd2, SECOND_NODE, SECOND_PROVIDER_ID);
    let ns2 = NodeNamespace::start(&mut host, &recorder, &install_path, Path::new(PLUGIN), SECOND_NODE);
    // The control plane's CA, as Cluster API hands it to a joining control-plane Machine.
    ns2.bake_image(&role);
    std::fs::write(
        ns2.path(&format!("{ETC_KUBERNETES}/pki/ca.crt")),
        &w.env.client_ca.cert_pem,
    )
    .unwrap();
    std::fs::write(
        ns2.path(&format!("{ETC_KUBERNETES}/pki/ca.key")),
        &w.env.client_ca.key_pem,
    )
    .unwrap();
    let metadata2 = |name: &str| match name {
        "ds.meta_data.placement.availability_zone" => Some(AVAILABILITY_ZONE.to_owned()),
        "ds.meta_data.instance_id" => Some(SECOND_INSTANCE_ID.to_owned()),
        _ => None,
    };
    ns2.write_files(&spec["files"], metadata2);
    let mut join: Value = serde_json::from_str(&render(&spec["joinConfiguration"].to_string(), metadata2)).unwrap();
    join["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
    join["kind"] = json!("JoinConfiguration");
    join["discovery"] = json!({"bootstrapToken": {
        "apiServerEndpoint": endpoint, "token": JOIN_TOKEN, "caCertHashes": [ca_cert_hash(&w.env.client_ca.cert_pem)]}});
    join["controlPlane"] =
        json!({"localAPIEndpoint": {"advertiseAddress": "192.0.2.11", "bindPort": port.parse::<u16>().unwrap()}});
    join["nodeRegistration"]["name"] = json!(SECOND_NODE);
    join["nodeRegistration"]["criSocket"] = json!(containerd2.endpoint());
    join["nodeRegistration"]["kubeletExtraArgs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "node-ip", "value": NODE_IP.to_string()}));
    // The cluster's kubelet config (upload-config kubelet) names cp-0's ports: cp-1's own.
    let join_path = ns2.dir.path().join("join.yaml");
    std::fs::write(&join_path, serde_yaml::to_string(&join).unwrap()).unwrap();
    let skipped: Vec<&str> = JOIN_SKIPPED_PHASES.iter().map(|(p, _)| *p).collect();
    let join_log = ns2.dir.path().join("kubeadm-join.log");
    let log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&join_log)
            .unwrap()
    };
    let mut kubeadm_join = ns2
        .command(
            &kubeadm_env,
            &kubeadm,
            &[
                "join".to_owned(),
                "--config".to_owned(),
                join_path.display().to_string(),
                format!("--skip-phases={}", skipped.join(",")),
            ],
        )
        .stdout(log())
        .stderr(log())
        .spawn()
        .unwrap();
    recorder.process(&kubeadm_join);
    let joined = || std::fs::read_to_string(&join_log).unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    while !(joined().contains("[kubelet-start] Starting the kubelet")
        && ns2.path(&format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf")).exists()
        && ns2
            .path(&format!("{}/config.yaml", tests::kubeadm_node::VAR_LIB_KUBELET))
            .exists())
    {
        let exited = kubeadm_join.try_wait().unwrap();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "kubeadm join --control-plane did not come to starting kubelet ({exited:?}):\n{}",
            joined()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // kubelet's ports: the cluster's kubelet config is cp-0's; this kubelet gets its own.
    let config2 = ns2.path(&format!("{}/config.yaml", tests::kubeadm_node::VAR_LIB_KUBELET));
    let text = std::fs::read_to_string(&config2).unwrap();
    let text = text
        .replace(&format!("port: {}", kubelet.port), &format!("port: {}", kubelet2.port))
        .replace(
            &format!("healthzPort: {}", kubelet.healthz_port),
            &format!("healthzPort: {}", kubelet2.healthz_port),
        )
        .replace(&containerd.endpoint(), &containerd2.endpoint())
        .replace(
            &kubelet.dir().display().to_string(),
            &kubelet2.dir().display().to_string(),
        );
    std::fs::write(&config2, text).unwrap();
    let pre_said = start_unit(&ns2, &mut kubelet2);
    let status = tests::kubeadm_node::wait_exit(&mut kubeadm_join, WAIT).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "kubeadm join --control-plane ({status:?}):\n{}\n{pre_said}\n--- kubelet:\n{}\n--- signer:\n{}",
        joined(),
        kubelet2.log(),
        signer.log()
    );
    assert!(joined().contains("This node has joined the cluster"), "{}", joined());
    let second_csrs: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.username == format!("system:bootstrap:{JOIN_TOKEN_ID}"))
        .collect();
    assert_eq!(
        second_csrs.len(),
        1,
        "one CSR, with the Machine's join token: {second_csrs:?}"
    );
    assert!(second_csrs[0].issued.is_some(), "{second_csrs:?}");
    let claimed2 = live::get(&admin, &w.own(capi::machine(SECOND_MACHINE, None))).await;
    let claim2: Value = serde_json::from_str(
        claimed2["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claim2["nodeName"], SECOND_NODE);
    assert!(
        !ns2.path(&format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf")).exists(),
        "kubeadm deleted the bootstrap kubeconfig"
    );
    let conf2 = ns2.read(&kubelet_conf).unwrap();
    assert!(conf2.contains("exec:") && !conf2.contains("token:"), "{conf2}");
    assert!(
        wait_renewed_and_ready(&w.admin, SECOND_NODE, 0, WAIT).await,
        "cp-1 is not Ready\n{}",
        kubelet2.log()
    );
    let cp1 = node(&w.admin, SECOND_NODE).await.unwrap();
    assert!(
        cp1.metadata
            .labels
            .unwrap_or_default()
            .contains_key("node-role.kubernetes.io/control-plane"),
        "kubeadm's mark-control-plane ran"
    );
    let joined_after = join_started.elapsed();
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "no legacy kubelet CSR from either node: {:?}",
        csrs.of(LEGACY_SIGNER)
    );

    // The record of the adoption is its CSR's approval (SPEC section 3, revision 5), naming the
    // Machine and the replica; no Event is written per certificate.
    let listed = w.env.kubectl(&["get", "csr", "-o", "json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let record = format!("Machine {}/{MACHINE}, approved by replica ", capi::NAMESPACE);
    assert!(
        listed["items"].as_array().unwrap().iter().any(|csr| {
            csr["status"]["conditions"].as_array().is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "Approved" && c["message"].as_str().is_some_and(|m| m.contains(&record)))
            })
        }),
        "the adoption's approval names the Machine and the replica: {listed:#}"
    );
    eprintln!(
        "kubeadm init phases run: {}",
        PHASES.iter().map(|p| p.join(" ")).collect::<Vec<_>>().join(", ")
    );
    for (phase, why) in SKIPPED_PHASES {
        eprintln!("skipped {phase}: {why}");
    }
    for (phase, why) in JOIN_SKIPPED_PHASES {
        eprintln!("kubeadm join --control-plane skipped {phase}: {why}");
    }
    eprintln!(
        "cp-1 joined the control plane with the plugin's identity in {}",
        secs(joined_after)
    );
    eprintln!(
        "setup {} · adopted {} after kubelet started · {} renewals · Ready past kubeadm's certificate at {} · total {}",
        secs(setup),
        secs(adopted_after),
        renewals.len(),
        kubeadm_not_after,
        secs(began.elapsed())
    );
}
