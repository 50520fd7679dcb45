//! The first control-plane node, made by a real `kubeadm init` v1.32 (from
//! `KUBEBUILDER_ASSETS`) run phase by phase with the shipped `KubeadmControlPlane`
//! configuration (`images/kubeadm/kubeadm-control-plane.yaml`) on an image as the
//! `kubelet_authenticator` role leaves it, comes under attestation (SPEC rule 7 and
//! section 6): kubeadm issues kubelet's certificate from the cluster CA
//! (`ClusterConfiguration.certificateValidityPeriod: 4m`; kubeadm before v1.31 reads only
//! `kubeadm.k8s.io/v1beta3`, which has no such field: there kubeadm's `kubeconfig user
//! --validity-period 4m` writes the same kubelet.conf in place of the `kubeconfig kubelet`
//! phase), the drop-in's `kubeconfig --adopt`
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
//! ([`CONTROL_PLANE_JOIN_SKIPPED_PHASES`]; etcd is external, so `check-etcd` and `etcd-join`
//! have nothing to do), and joins with the plugin's identity: one CSR with its Machine's join token, the Machine
//! claimed, the bootstrap kubeconfig deleted, the Node Ready and marked control-plane. Neither
//! node ever files a `kubernetes.io/kube-apiserver-client-kubelet` CSR.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE as CLIENT_SIGNER;
use serde_json::{Value, json};
use tests::capi;
use tests::kubeadm_node::{
    CONTROL_PLANE_JOIN_SKIPPED_PHASES, ControlPlane, ETC_KUBERNETES, Kubeadm, LEGACY_SIGNER, NodeNamespace, Unit,
    add_node_ip, bind_kubeadm_cluster_admins, bootstrap_token, control_plane_machine, ec2_metadata,
    kubeadm_controller_manager, kubelet_config_of, opted_in_cluster, render, require, role_unit, role_variables,
    skip_control_plane_join_phases, wait_cluster_info_signed, wait_registered,
};
use tests::kubelet::{
    Containerd, CsrRecorder, Host, Kubelet, node, now, ready_past, secs, validity, wait_renewed_and_ready,
};
use tests::live::{self, Signer, apply};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NODE: &str = "cp-0";
const USER: &str = "system:node:cp-0";
/// The first control-plane Machine, as KubeadmControlPlane names it.
const MACHINE: &str = "prod-cp-x7k2p";
const AVAILABILITY_ZONE: &str = "us-east-1a";
const INSTANCE_ID: &str = "i-0kubeadminit";
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0kubeadminit";
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

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and kubeadm: root, kubelet, kube-controller-manager and kubeadm beside kube-apiserver in KUBEBUILDER_ASSETS, containerd, runc, unshare and nsenter"]
async fn kubeadm_inits_first_control_plane_node_is_adopted_and_renews_past_kubeadms_certificate() {
    let assets = require("envtest_kubeadm_init");
    let began = Instant::now();
    let mut host = Host::claim();
    let (w, admin) = opted_in_cluster("envtest_kubeadm_init", &host, "insecure").await;
    let recorder = host.recorder();

    // The KubeadmControlPlane's first Machine: its provider ID, no nodeRef (no Machine
    // controller runs here: the registered Node carrying the provider ID names the node).
    apply(&admin, &control_plane_machine(&w, MACHINE, NODE, PROVIDER_ID)).await;
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
    let kcm = kubeadm_controller_manager(&assets, &w.env, &host, &[]);
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
    let ns = NodeNamespace::start_baked(&mut host, &recorder, &role, Path::new(PLUGIN), NODE);
    ns.install_cluster_ca(&w.env.client_ca);
    // What the skipped `kubeconfig admin` phase would write: the suite's admin credential.
    std::fs::copy(
        &w.env.admin_kubeconfig,
        ns.path(&format!("{ETC_KUBERNETES}/admin.conf")),
    )
    .unwrap();
    let unit = role_unit(&role);

    // The bootstrap provider's part: the shipped kubeadmConfigSpec's files and init
    // configuration, with cloud-init's instance metadata.
    let metadata = ec2_metadata(AVAILABILITY_ZONE, INSTANCE_ID);
    ns.write_files(&spec["files"], metadata);
    let bootstrap: Value = serde_json::from_str(&render(&spec["initConfiguration"].to_string(), metadata)).unwrap();
    let kubeadm = Kubeadm::new(&assets);
    let control_plane = ControlPlane::of(&w).await;
    let mut init = control_plane.init_configuration(
        &bootstrap,
        NODE,
        &containerd.endpoint(),
        vec![bootstrap_token(JOIN_TOKEN, None)],
    );
    add_node_ip(&mut init);
    let mut cluster = control_plane.cluster_configuration(Some(w.env.etcd_url()));
    // kubeadm's certificates are short (v1beta4; before kubeadm v1.31, see step 1).
    let validity_period = kubeadm.config_version.has_certificate_validity_period();
    if validity_period {
        cluster["certificateValidityPeriod"] = json!(KUBEADM_VALIDITY);
    }
    let init_path = ns.dir.path().join("init.yaml");
    kubeadm.write_config(
        &init_path,
        &[init, cluster],
        Some(&kubelet_config_of(&containerd, &kubelet)),
    );
    // The others read /etc/kubernetes/admin.conf: the suite's admin credential there.
    let phase = |name: &[&str]| {
        let kubeconfig =
            matches!(name[0], "upload-config" | "bootstrap-token").then_some(w.env.admin_kubeconfig.as_path());
        kubeadm.init_phase(&ns, &init_path, name, kubeconfig)
    };
    // systemd's part: the unit's ExecStartPre, then kubelet, as systemd would.
    let kubelet_conf = role["kubelet_authenticator_kubeconfig"].clone();
    let start_unit = |ns: &NodeNamespace, unit: &Unit, kubelet: &mut Kubelet| {
        let service = ns.kubelet_service(unit);
        let said = ns.run_exec_start_pre(&service);
        ns.start_kubelet(&service, kubelet, &assets);
        said
    };
    let setup = began.elapsed();

    // 1. kubeconfig kubelet: kubeadm's own kubelet.conf, a certificate from the cluster CA.
    //    Before kubeadm v1.31 (v1beta3) ClusterConfiguration cannot shorten it (kubeadm signs
    //    for a year): kubeadm's `kubeconfig user` signs the same kubelet.conf (the node's user
    //    and group, the cluster CA, controlPlaneEndpoint) for KUBEADM_VALIDITY instead.
    let mut said = if validity_period {
        phase(PHASES[0])
    } else {
        let out = kubeadm.output(
            &ns,
            &[
                "kubeconfig",
                "user",
                "--config",
                &init_path.display().to_string(),
                "--client-name",
                USER,
                "--org",
                "system:nodes",
                "--validity-period",
                KUBEADM_VALIDITY,
            ]
            .map(ToOwned::to_owned),
        );
        let conf = ns.path(&kubelet_conf);
        std::fs::write(&conf, &out.stdout).unwrap();
        std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        eprintln!(
            "kubeadm {}: no certificateValidityPeriod in {}: kubelet.conf from kubeadm kubeconfig user --validity-period {KUBEADM_VALIDITY}",
            tests::kubeadm_config::kubeadm_version(&assets),
            kubeadm.config_version.api_version()
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
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
    if validity_period {
        assert!(
            kubeadm_not_after - kubeadm_not_before <= 4 * 60 + 60,
            "certificateValidityPeriod shortens kubeadm's certificate"
        );
    } else {
        // kubeadm before v1.31 backdates to the CA's NotBefore: the validity runs from now.
        assert!(
            kubeadm_not_after - now() <= 4 * 60 + 60,
            "kubeconfig user --validity-period shortens kubeadm's certificate"
        );
    }

    // 2. kubelet-start: kubeadm asks systemd to start kubelet; the unit adopts kubeadm's
    //    kubelet.conf and runs kubelet with the plugin.
    said.push_str(&phase(PHASES[1]));
    assert!(
        ns.systemctl_calls().iter().any(|c| c.contains("kubelet")),
        "kubeadm asked systemd for kubelet: {:?}",
        ns.systemctl_calls()
    );
    let adopted_said = start_unit(&ns, &unit, &mut kubelet);
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
    let registered = wait_registered(&w.admin, NODE, &mut kubelet, WAIT, |kubelet| {
        diagnostics(kubelet, &said)
    })
    .await;
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
    let rendered_said = start_unit(&ns, &unit, &mut kubelet);
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
    //    shipped joinConfiguration, its static-pod and etcd phases skipped
    //    (CONTROL_PLANE_JOIN_SKIPPED_PHASES),
    //    gets its identity exactly as a worker: the plugin, the Machine's join token, one CSR.
    let join_started = Instant::now();
    apply(
        &admin,
        &control_plane_machine(&w, SECOND_MACHINE, SECOND_NODE, SECOND_PROVIDER_ID),
    )
    .await;
    let mut second_config = w.own(capi::kubeadm_config(SECOND_MACHINE, JOIN_TOKEN_ID, "v1beta2"));
    let discovery = second_config["spec"]["joinConfiguration"]["discovery"].clone();
    second_config["spec"] = spec.clone();
    second_config["spec"]["joinConfiguration"]["discovery"] = discovery;
    apply(&admin, &second_config).await;
    // What kubeadm init creates for the admin.conf it writes (group kubeadm:cluster-admins):
    // the join's own admin.conf (control-plane-prepare/kubeconfig) needs it.
    bind_kubeadm_cluster_admins(&w.admin).await;
    wait_cluster_info_signed(&w.admin, &[JOIN_TOKEN_ID], WAIT, &kcm).await;
    let containerd2 = Containerd::start(&host);
    let mut kubelet2 = Kubelet::new(&assets, &host, &containerd2, SECOND_NODE, SECOND_PROVIDER_ID);
    let ns2 = NodeNamespace::start_baked(&mut host, &recorder, &role, Path::new(PLUGIN), SECOND_NODE);
    // The control plane's CA, as Cluster API hands it to a joining control-plane Machine.
    ns2.install_cluster_ca(&w.env.client_ca);
    let metadata2 = ec2_metadata(AVAILABILITY_ZONE, SECOND_INSTANCE_ID);
    ns2.write_files(&spec["files"], metadata2);
    let bootstrap: Value = serde_json::from_str(&render(&spec["joinConfiguration"].to_string(), metadata2)).unwrap();
    let join =
        control_plane.join_configuration(&bootstrap, JOIN_TOKEN, Some(SECOND_NODE), &containerd2.endpoint(), true);
    let mut kubeadm_join = kubeadm.join(&ns2, &recorder, &join, &[skip_control_plane_join_phases()]);
    kubeadm_join
        .wait_for_kubelet_start(&ns2, WAIT, "kubeadm join --control-plane")
        .await;
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
    let pre_said = start_unit(&ns2, &unit, &mut kubelet2);
    kubeadm_join
        .wait_joined("kubeadm join --control-plane", WAIT, |join| {
            format!(
                "{}\n{pre_said}\n--- kubelet:\n{}\n--- signer:\n{}",
                join.output(),
                kubelet2.log(),
                signer.log()
            )
        })
        .await;
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
    for (phase, why) in CONTROL_PLANE_JOIN_SKIPPED_PHASES {
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
