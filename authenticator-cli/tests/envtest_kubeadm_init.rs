//! The first control-plane node, made by a real `kubeadm init` v1.32 (from
//! `KUBEBUILDER_ASSETS`) run phase by phase with the shipped `KubeadmControlPlane`
//! configuration (`images/kubeadm/kubeadm-control-plane.yaml`) on an image as the
//! `kubelet_authenticator` role leaves it, comes under attestation (SPEC revision 4, rule 7 and
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
//! itself, on the suite's etcd) or its other certificates.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::kubeadm_node::{
    ETC_KUBERNETES, KUBEADM_DROPIN, NodeNamespace, ROLE, SYSTEMD_PATH, Unit, expand, render, require, role_variables,
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
    ("etcd local", "external etcd: the suite's"),
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
    let kcm = ControllerManager::start(&assets, &w.env, &host);
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
    std::fs::create_dir_all(ns.path(&format!("{ETC_KUBERNETES}/pki"))).unwrap();
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
    let cert_dir = ns.path(&role["kubelet_authenticator_cert_dir"]);
    std::fs::create_dir_all(&cert_dir).unwrap();
    std::fs::set_permissions(&cert_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let role_dropin = render(
        &std::fs::read_to_string(
            tests::repo_root()
                .join(ROLE)
                .join("templates/20-kubelet-authenticator.conf.j2"),
        )
        .unwrap(),
        |name| role.get(name).cloned(),
    );
    let unit = Unit::read(&[KUBEADM_DROPIN, &role_dropin]);

    // The bootstrap provider's part: the shipped kubeadmConfigSpec's files and init
    // configuration, with cloud-init's instance metadata.
    let metadata = |name: &str| match name {
        "ds.meta_data.placement.availability_zone" => Some(AVAILABILITY_ZONE.to_owned()),
        "ds.meta_data.instance_id" => Some(INSTANCE_ID.to_owned()),
        _ => None,
    };
    for file in spec["files"].as_array().unwrap() {
        let path = file["path"].as_str().unwrap();
        let on_host = ns.path(path);
        std::fs::create_dir_all(on_host.parent().unwrap()).unwrap();
        std::fs::write(&on_host, render(file["content"].as_str().unwrap(), metadata)).unwrap();
        let mode = u32::from_str_radix(file["permissions"].as_str().unwrap(), 8).unwrap();
        std::fs::set_permissions(&on_host, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let mut init: Value = serde_json::from_str(&render(&spec["initConfiguration"].to_string(), metadata)).unwrap();
    init["apiVersion"] = json!("kubeadm.k8s.io/v1beta4");
    init["kind"] = json!("InitConfiguration");
    let endpoint = w.env.server.trim_start_matches("https://").to_owned();
    let (_, port) = endpoint.rsplit_once(':').unwrap();
    // The control plane's own address (kubeadm refuses loopback; the node reaches the
    // apiserver through controlPlaneEndpoint).
    init["localAPIEndpoint"] = json!({"advertiseAddress": "192.0.2.10", "bindPort": port.parse::<u16>().unwrap()});
    init["bootstrapTokens"] = json!([{"token": "kadmin.0123456789abcdef", "ttl": "1h"}]);
    init["nodeRegistration"]["name"] = json!(NODE);
    init["nodeRegistration"]["criSocket"] = json!(containerd.endpoint());
    init["nodeRegistration"]["kubeletExtraArgs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "node-ip", "value": NODE_IP.to_string()}));
    let version = w.admin.apiserver_version().await.unwrap().git_version;
    let cluster = json!({"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
        "kubernetesVersion": version, "clusterName": capi::CLUSTER, "controlPlaneEndpoint": endpoint,
        "certificateValidityPeriod": KUBEADM_VALIDITY, "networking": {"serviceSubnet": "10.0.0.0/24"}});
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
    let start_unit = |kubelet: &mut Kubelet| {
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
    let adopted_said = start_unit(&mut kubelet);
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
    let refused_first: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.refused.is_some())
        .map(|s| s.refused.unwrap().1)
        .collect();

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
    let rendered_said = start_unit(&mut kubelet);
    let conf = ns.read(&kubelet_conf).unwrap();
    assert!(
        conf.contains("exec:") && !conf.contains("client-certificate"),
        "{rendered_said}\n{conf}"
    );

    // 4. Past kubeadm's certificate's expiry, cp-0 is Ready on the signer's certificates and
    //    has renewed through it as the node.
    assert!(
        ready_past(&w.admin, NODE, kubeadm_not_after, WAIT).await,
        "cp-0 lost its identity at kubeadm's expiry\n{}",
        diagnostics(&kubelet, &said)
    );
    let renewals: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.username == USER && s.issued.is_some() && s.name != adoption.name)
        .collect();
    let (_, adopted_pem) = adoption.issued.clone().unwrap();
    let (_, adopted_not_after, _) = validity(&adopted_pem);
    if tests::kubelet::now() > adopted_not_after {
        assert!(!renewals.is_empty(), "renewed through the signer after the adoption");
    }
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "no legacy kubelet CSR: {:?}",
        csrs.of(LEGACY_SIGNER)
    );
    let machine_events = w
        .env
        .kubectl(&["get", "events.events.k8s.io", "-n", capi::NAMESPACE, "-o", "json"]);
    let events: Value = serde_json::from_slice(&machine_events.stdout).unwrap();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["regarding"]["name"] == MACHINE && e["reason"] == "CertificateIssued"),
        "the adoption is an Event on the Machine"
    );
    eprintln!(
        "kubeadm init phases run: {}",
        PHASES.iter().map(|p| p.join(" ")).collect::<Vec<_>>().join(", ")
    );
    for (phase, why) in SKIPPED_PHASES {
        eprintln!("skipped {phase}: {why}");
    }
    eprintln!(
        "setup {} · adopted {} after kubelet started (first refusals: {refused_first:?}) · {} renewals · Ready past kubeadm's certificate at {} · total {}",
        secs(setup),
        secs(adopted_after),
        renewals.len(),
        kubeadm_not_after,
        secs(began.elapsed())
    );
}
