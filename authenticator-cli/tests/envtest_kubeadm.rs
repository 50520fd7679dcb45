//! An unmodified `kubeadm join` (v1.32, from `KUBEBUILDER_ASSETS`) finishes with the plugin's
//! identity on exactly the shipped node configuration: the `kubelet_authenticator` role's
//! drop-in (`images/image-builder/ansible/roles/kubelet_authenticator`) and the
//! `KubeadmConfigTemplate` (`images/kubeadm/kubeadm-config-template.yaml`), against a real
//! kube-apiserver, the real signer and a real kube-controller-manager, with a real kubelet on
//! its own containerd ([`tests::kubelet`]; skipped by `scripts/test` where a part is missing).
//!
//! The cluster, as `kubeadm init` leaves it: the real kubeadm phases run against the suite's
//! apiserver with its admin kubeconfig: `init phase upload-config kubeadm` (`kubeadm-config`),
//! `upload-config kubelet` (`kubelet-config`: every joining node gets the cluster's kubelet
//! config, so it carries the sandbox settings of [`tests::kubelet::sandbox_config`], with
//! `enforceNodeAllocatable: [none]` for its `[]`, which kubeadm drops; the phase annotates the
//! control-plane Node, so `cp-0` is registered first, with the hostname label kubeadm waits for,
//! as kubeadm init's kubelet would have), `bootstrap-token` (the join token of `init.yaml`'s `bootstrapTokens`, its RBAC,
//! `cluster-info` in kube-public readable by `system:anonymous`, which the apiserver allows, and
//! kubeadm's two auto-approve bindings: the signer removes the bootstrap one). kube-controller-manager also
//! runs `bootstrapsigner`, which signs `cluster-info` for the token (join's discovery needs the
//! JWS); the join pins the CA by its hash.
//!
//! The node: `kubeadm join`, the kubelet it starts and the plugin kubelet runs live in a private
//! mount and UTS namespace (`unshare --mount --uts --propagation private`, hostname `worker-0`:
//! the shipped configuration sets no node name, so kubeadm's and the plugin's both are the
//! hostname) in which temporary folders are bind-mounted onto `/etc/kubernetes` and
//! `/var/lib/kubelet` (where kubeadm writes on a worker: `pki/ca.crt`, `bootstrap-kubelet.conf`,
//! `config.yaml`, `kubeadm-flags.env`; kubelet's root and cert dir), the plugin binary onto the role's install path
//! (`/usr/local/bin/kubelet-authenticator`: the drop-in is rendered with the role's defaults,
//! only the attestor set to `insecure`), and a stub onto `systemctl` (it records the calls:
//! kubeadm never reaches the host's systemd). Empty mount points missing on the host are created
//! and removed again ([`Host::mount_point`]). The image, as the role leaves it: those folders,
//! `/etc/kubernetes/pki`, the cert dir (0700), the plugin and the drop-in. The bootstrap
//! provider's part: the template's `files` (provider ID, the `kubeletconfiguration` patch),
//! written with their permissions and cloud-init's `ds.meta_data` filled in, and a
//! `JoinConfiguration` (v1beta4; v1beta3 for a kubeadm before v1.31, as Cluster API renders it:
//! [`tests::kubeadm_config`]) built from its `joinConfiguration` (`patches.directory`,
//! `kubeletExtraArgs` `provider-id`), plus the discovery (token, endpoint, CA hash),
//! `nodeRegistration.name`, `criSocket` (the suite's containerd) and the sandbox's own
//! `kubeletExtraArgs` `node-ip` (the node address, [`tests::kubelet::NODE_IP`]).
//!
//! The suite is systemd: when kubeadm says "Starting the kubelet" (right before `systemctl
//! restart kubelet`) with `bootstrap-kubelet.conf` and `config.yaml` written, it runs the
//! drop-in's `ExecStartPre` and then `ExecStart` as systemd would from kubeadm's
//! `10-kubeadm.conf` and the role's `20-kubelet-authenticator.conf` (later `Environment=`
//! wins, `EnvironmentFile=` overrides, `$VAR` split into words), in the namespace, with
//! systemd's environment (`PATH` and the unit's variables only).
//!
//! Preflight checks skipped (`--ignore-preflight-errors`), environment checks only:
//! - `FileExisting-iptables`: no iptables on a sandbox host; kubelet here makes no iptables
//!   chains (`makeIPTablesUtilChains: false`) and no kube-proxy runs.
//! - `FileContent--proc-sys-net-ipv4-ip_forward`: pod networking; no pod runs, and the suite
//!   does not change the host's routing.
//! - `FileContent--proc-sys-net-bridge-bridge-nf-call-iptables`: the same, where br_netfilter
//!   is not loaded.
//! - `Swap`: whatever the host's swap (`failSwapOn: false`).
//! - `SystemVerification`: the host's kernel and cgroups (cgroup v1 here), not the node's
//!   configuration.
//! - `Port-10250`: kubelet listens on a free port of its own; another kubelet may hold 10250.
//!
//! Never `FileAvailable--etc-kubernetes-kubelet.conf` nor
//! `FileAvailable--etc-kubernetes-bootstrap-kubelet.conf`: the shipped configuration needs
//! neither (kubelet.conf is rendered only once kubeadm has written the bootstrap file), and the
//! suite asserts so.
//!
//! Then: `kubeadm join` exits 0 ("This node has joined the cluster"); the Node has the Machine's
//! provider ID; kubelet's identity is `system:node:worker-0`, from one CSR filed with the join
//! token under the insecure signer and approved `AttestedInsecureV1`; kubeadm deleted
//! `bootstrap-kubelet.conf`, and `kubelet.conf` is the plugin's (exec, `provideClusterInfo`,
//! no token); kubeadm's bootstrap binding is gone (its rotation binding is kept, reported, for
//! `cp-0`, which is outside attestation here); kubeadm's CRI-socket annotation is on
//! the Node, written through `kubelet.conf` (the join token may not patch Nodes); the serving
//! CSR is approved by the signer and signed by kube-controller-manager, and kubelet serves it;
//! with 3-minute certificates the plugin renews as the node with the bootstrap file gone (it
//! finds the apiserver in `KUBERNETES_EXEC_INFO`) and the Node stays Ready past the first
//! certificate's expiry; no `kubernetes.io/kube-apiserver-client-kubelet` CSR ever appears.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use attestation::names::{SIGNER_INSECURE as CLIENT_SIGNER, SIGNER_KUBELET_SERVING as SERVING_SIGNER};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use serde_json::{Value, json};
use tests::kubeadm_node::{
    AUTO_APPROVE_BINDINGS, CONTROL_PLANE, ControlPlane, ETC_KUBERNETES, Kubeadm, KubeadmJoin, LEGACY_SIGNER,
    NodeNamespace, apply_worker_machine, bootstrap_token, ec2_metadata, join_diagnostics, kubeadm_controller_manager,
    kubelet_config_of, opted_in_cluster, render, require, role_unit, role_variables, wait_cluster_info_signed,
    wait_registered,
};
use tests::kubelet::{
    Containerd, ControllerManager, CsrRecorder, Host, Kubelet, NODE_IP, der, node, now, ready_past, secs, validity,
    wait_current, wait_renewed_and_ready,
};
use tests::live::{self, Signer};
use tests::strict_der::assert_strict_der_pem;

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NODE: &str = "worker-0";
const USER: &str = "system:node:worker-0";
/// The instance metadata cloud-init fills into the template (`ds.meta_data`).
const AVAILABILITY_ZONE: &str = "us-east-1a";
const INSTANCE_ID: &str = "i-0kubeadm";
/// The template's provider ID with [`AVAILABILITY_ZONE`] and [`INSTANCE_ID`].
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0kubeadm";
/// The join token (`init.yaml`'s `bootstrapTokens`, the Machine's KubeadmConfig's).
const JOIN_TOKEN_ID: &str = "kadmjn";
const JOIN_TOKEN: &str = "kadmjn.0123456789abcdef";
const CRI_SOCKET_ANNOTATION: &str = "kubeadm.alpha.kubernetes.io/cri-socket";
/// The signer's `--client-cert-duration` for the first certificate (see envtest_kubelet).
const SHORT: &str = "3m";
/// The signer's `--client-cert-duration` once the first certificate is issued.
const LONG: &str = "1h";
const TEMPLATE: &str = "images/kubeadm/kubeadm-config-template.yaml";
/// The checks the shipped configuration must pass as they are.
const NEVER_IGNORED: [&str; 2] = [
    "FileAvailable--etc-kubernetes-kubelet.conf",
    "FileAvailable--etc-kubernetes-bootstrap-kubelet.conf",
];
fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and kubeadm: root, kubelet, kube-controller-manager and kubeadm beside kube-apiserver in KUBEBUILDER_ASSETS, containerd, runc, unshare and nsenter"]
async fn an_unmodified_kubeadm_join_finishes_with_the_plugins_identity() {
    let assets = require("envtest_kubeadm");
    let began = Instant::now();
    let mut host = Host::claim();
    let kubeadm = Kubeadm::new(&assets);
    for name in NEVER_IGNORED {
        assert!(
            kubeadm
                .ignored_preflight_errors()
                .iter()
                .all(|(ignored, _)| *ignored != name),
            "{name} is never skipped"
        );
    }

    // The workload cluster (also its own management cluster): an opted-in Cluster allowing
    // insecure, worker-0's Machine with the provider ID the template gives it, its addresses
    // (the serving CSR's SANs) and its KubeadmConfig naming the join token.
    let (w, admin) = opted_in_cluster("envtest_kubeadm", &host, "insecure").await;
    let recorder = host.recorder();
    apply_worker_machine(&admin, &w, NODE, JOIN_TOKEN_ID, PROVIDER_ID).await;
    let csrs = CsrRecorder::start(w.admin.clone()).await;
    let mut kcm = kubeadm_controller_manager(&assets, &w.env, &host, &[]);
    let containerd = Containerd::start(&host);
    // Its ports and folders (pod logs, volume plugins, log) go into the cluster's kubelet config.
    let mut kubelet = Kubelet::new(&assets, &host, &containerd, NODE, PROVIDER_ID);

    // The node's namespace, with the image as the role leaves it.
    let role = role_variables(&[("kubelet_authenticator_attestor", "insecure")]);
    let install_path = role["kubelet_authenticator_install_path"].clone();
    let ns = NodeNamespace::start_baked(&mut host, &recorder, &role, Path::new(PLUGIN), NODE);
    let cert_dir = ns.path(&role["kubelet_authenticator_cert_dir"]);
    let unit = role_unit(&role);
    assert_eq!(unit.exec_start_pre.len(), 1, "{unit:?}");

    // What `kubeadm init` leaves behind, by kubeadm's own phases.
    let control_plane = ControlPlane::of(&w).await;
    let tokens = vec![bootstrap_token(JOIN_TOKEN, Some("worker-0's join token"))];
    let init_output = kubeadm
        .init_cluster(
            &ns,
            &w,
            &control_plane.init_documents(&containerd.endpoint(), tokens, None),
            &kubelet_config_of(&containerd, &kubelet),
        )
        .await;
    // kube-controller-manager's bootstrapsigner signs cluster-info for the join token.
    let data = wait_cluster_info_signed(&w.admin, &[JOIN_TOKEN_ID], Duration::from_secs(60), &kcm).await;
    assert!(data["kubeconfig"].contains(&w.env.server), "{data:?}");

    // The signer removes kubeadm's bootstrap binding: from now on only it hands out identities.
    // cp-0, kubeadm init's node here, belongs to no Machine of the Cluster: it is reported outside
    // attestation, but since revision 5 a Node that no Machine names does not keep the rotation
    // binding (SPEC section 7; envtest_adoption and envtest_controller show the binding kept for
    // an unclaimed Machine's Node, and going once none is left).
    let signer_flags = |duration: &'static str| ["--client-cert-duration", duration, "--leader-elect", "false"];
    let mut signer = Signer::start(&signer_bin(), &w.env, &signer_flags(SHORT)).await;
    recorder.pid(signer.pid().unwrap());
    let bindings: Api<ClusterRoleBinding> = Api::all(w.admin.clone());
    let [bootstrap_binding, rotation_binding] = AUTO_APPROVE_BINDINGS;
    for binding in [bootstrap_binding, rotation_binding] {
        let deadline = Instant::now() + Duration::from_secs(60);
        while bindings.get_opt(binding).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "{binding} is still there\n{}", signer.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        signer
            .log()
            .contains("1 Node(s) that no unclaimed Machine names are reported"),
        "{CONTROL_PLANE} is reported, and keeps nothing\n{}",
        signer.log()
    );

    // The bootstrap provider's part: the template's files and join configuration, with
    // cloud-init's instance metadata.
    let template: Value =
        serde_yaml::from_str(&std::fs::read_to_string(tests::repo_root().join(TEMPLATE)).unwrap()).unwrap();
    let metadata = ec2_metadata(AVAILABILITY_ZONE, INSTANCE_ID);
    let spec = &template["spec"]["template"]["spec"];
    ns.write_files(&spec["files"], metadata);
    assert_eq!(
        ns.read(&role["kubelet_authenticator_provider_id_file"]).as_deref(),
        Some(PROVIDER_ID),
        "the template's provider ID file, where the drop-in reads it"
    );
    let bootstrap: Value = serde_json::from_str(&render(&spec["joinConfiguration"].to_string(), metadata)).unwrap();
    assert!(
        bootstrap["nodeRegistration"].get("ignorePreflightErrors").is_none(),
        "the template skips no preflight check"
    );
    let join = control_plane.join_configuration(&bootstrap, JOIN_TOKEN, Some(NODE), &containerd.endpoint(), false);
    let setup = began.elapsed();

    // kubeadm join, unmodified, in the node's namespace.
    let mut kubeadm_join = kubeadm.join(&ns, &recorder, &join, &[kubeadm.ignore_preflight_errors()]);

    // Where kubeadm asks systemd to (re)start kubelet: the unit's ExecStartPre, then kubelet.
    let bootstrap_file = format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf");
    let kubelet_conf = role["kubelet_authenticator_kubeconfig"].clone();
    assert_eq!(
        kubelet_conf,
        format!("{ETC_KUBERNETES}/kubelet.conf"),
        "the file kubeadm waits for"
    );
    kubeadm_join
        .wait_for_kubelet_start(&ns, Duration::from_secs(120), "kubeadm join")
        .await;
    let asked_at = kubeadm_join.started.elapsed();
    assert!(
        !ns.path(&kubelet_conf).exists(),
        "kubelet.conf exists before the unit starts"
    );
    let service = ns.kubelet_service(&unit);
    let pre_started = Instant::now();
    ns.run_exec_start_pre(&service);
    let pre_took = pre_started.elapsed();
    let kubelet_args = service.kubelet_args().to_vec();
    for (wanted, why) in [
        (format!("--kubeconfig={kubelet_conf}"), "the drop-in's kubeconfig"),
        ("--rotate-certificates=false".to_owned(), "rotation off"),
        ("--config=/var/lib/kubelet/config.yaml".to_owned(), "kubeadm's config"),
        (
            format!("--provider-id={PROVIDER_ID}"),
            "the template's kubeletExtraArgs",
        ),
    ] {
        assert!(
            kubelet_args.contains(&wanted),
            "{why}: {wanted} not in {kubelet_args:?}"
        );
    }
    assert!(
        !kubelet_args.iter().any(|a| a.starts_with("--bootstrap-kubeconfig")),
        "kubelet gets no bootstrap kubeconfig: {kubelet_args:?}"
    );
    let kubelet_started = Instant::now();
    ns.start_kubelet(&service, &mut kubelet, &assets);

    let diagnostics = |join: &KubeadmJoin, kubelet: &Kubelet, signer: &Signer, kcm: &ControllerManager| {
        format!(
            "{}\n--- containerd:\n{}",
            join_diagnostics(join, kubelet, signer, 30, kcm),
            containerd.log()
        )
    };

    // The one client CSR: filed with the join token, issued by the signer.
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        if let Some(first) = csrs.wait_issued(Duration::ZERO, |s| s.signer == CLIENT_SIGNER).await {
            break first;
        }
        assert!(
            Instant::now() < deadline && kubelet.alive(),
            "no client certificate issued: {:?}\n{}",
            csrs.all(),
            diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // From now on the signer issues long certificates (the first one stays short).
    signer.kill();
    signer = Signer::start(&signer_bin(), &w.env, &signer_flags(LONG)).await;
    recorder.pid(signer.pid().unwrap());
    let (first_at, first_pem) = first.issued.clone().unwrap();
    assert_eq!(
        first.username,
        format!("system:bootstrap:{JOIN_TOKEN_ID}"),
        "filed with the join token: {first:?}"
    );
    assert_eq!(
        first.approved_reason.as_deref(),
        Some("AttestedInsecureV1"),
        "{first:?}"
    );
    assert_strict_der_pem("the first client certificate", first_pem.as_bytes());
    let (first_not_before, first_not_after, subject) = validity(&first_pem);
    assert!(subject.contains(USER), "{subject}");
    assert_eq!(
        first_not_after - first_not_before,
        8 * 60,
        "a {SHORT} certificate, backdated 5 minutes"
    );

    // The Node, registered by kubelet as system:node:worker-0 (kubeadm waits for it too).
    wait_registered(&w.admin, NODE, &mut kubelet, Duration::from_secs(120), |kubelet| {
        diagnostics(&kubeadm_join, kubelet, &signer, &kcm)
    })
    .await;
    let registered_after = kubelet_started.elapsed();

    // kubeadm join finishes.
    kubeadm_join
        .wait_joined("kubeadm join", Duration::from_secs(300), |join| {
            diagnostics(join, &kubelet, &signer, &kcm)
        })
        .await;
    let join_took = kubeadm_join.started.elapsed();
    let join_output = kubeadm_join.output();
    for name in NEVER_IGNORED {
        assert!(!join_output.contains(name), "{name} fired:\n{join_output}");
    }

    // The Node has the Machine's provider ID and kubeadm's CRI-socket annotation.
    let registered = node(&w.admin, NODE).await.expect("the Node");
    assert_eq!(
        registered.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(PROVIDER_ID)
    );
    let annotations = registered.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(CRI_SOCKET_ANNOTATION),
        Some(&containerd.endpoint()),
        "kubeadm's annotation: {annotations:?}"
    );
    let managers: Vec<String> = registered
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.to_string().contains(CRI_SOCKET_ANNOTATION))
        })
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["kubeadm"], "written by kubeadm");
    // kubeadm had two credentials: the join token, which may not patch Nodes, and kubelet.conf.
    let bootstrap_kubeconfig = w.env.bootstrap_kubeconfig(JOIN_TOKEN);
    let can = w.env.kubectl_as(
        &bootstrap_kubeconfig,
        &["auth", "can-i", "patch", &format!("nodes/{NODE}")],
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&can.stdout).trim(),
        "no",
        "the join token may not patch the Node"
    );
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, 0, Duration::from_secs(120)).await,
        "the Node is not Ready\n{}",
        diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
    );
    let ready_after = kubelet_started.elapsed();

    // kubeadm deleted the bootstrap kubeconfig; kubelet.conf is the plugin's.
    assert!(!ns.path(&bootstrap_file).exists(), "{bootstrap_file} is still there");
    let conf_path = ns.path(&kubelet_conf);
    let conf_text = std::fs::read_to_string(&conf_path).unwrap();
    let conf: Value = serde_yaml::from_str(&conf_text).unwrap();
    let user = &conf["users"][0]["user"];
    assert_eq!(user["exec"]["command"], json!(install_path), "{conf_text}");
    assert_eq!(user["exec"]["provideClusterInfo"], json!(true), "{conf_text}");
    assert_eq!(conf["users"].as_array().map(Vec::len), Some(1), "{conf_text}");
    assert!(
        user.get("token").is_none() && !conf_text.contains(JOIN_TOKEN.split_once('.').unwrap().1),
        "no token in kubelet.conf:\n{conf_text}"
    );
    assert_eq!(
        conf["clusters"][0]["cluster"]["server"],
        json!(w.env.server),
        "{conf_text}"
    );
    assert_eq!(
        std::fs::metadata(&conf_path).unwrap().permissions().mode() & 0o777,
        0o600,
        "kubelet.conf's mode"
    );
    assert!(
        bindings.get_opt(bootstrap_binding).await.unwrap().is_none(),
        "{bootstrap_binding} is back"
    );

    // The serving CSR: filed by the node, approved by the signer, signed by
    // kube-controller-manager; kubelet serves it.
    let Some(serving) = csrs
        .wait_issued(Duration::from_secs(120), |s| s.signer == SERVING_SIGNER)
        .await
    else {
        panic!(
            "no serving certificate: {:?}\n{}",
            csrs.of(SERVING_SIGNER),
            diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
        );
    };
    assert_eq!(serving.username, USER, "kubelet files as the node");
    assert!(
        serving.approved_reason.as_deref() == Some("KubeletServingAddressesVerified") && serving.refused.is_none(),
        "approved by the signer: {serving:?}"
    );
    let (serving_at, serving_pem) = serving.issued.clone().unwrap();
    assert_strict_der_pem("kube-controller-manager's serving certificate", serving_pem.as_bytes());
    let ca = w.env.client_ca.cert_path.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let served = loop {
        match kubelet.served_certificate(&ca) {
            Ok(pem) => break pem,
            Err(why) => assert!(
                Instant::now() < deadline,
                "kubelet does not serve a certificate of the cluster CA for {NODE} and {NODE_IP}: {why}\n{}",
                diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(der(&served), der(&serving_pem), "kubelet serves the issued certificate");

    // Renewal through the plugin, as the node, with the bootstrap kubeconfig gone: the plugin
    // finds the apiserver in KUBERNETES_EXEC_INFO.
    let until_expiry = Duration::from_secs(u64::try_from(first_not_after - now()).unwrap_or(0));
    let Some(renewal) = csrs
        .wait_issued(until_expiry, |s| s.signer == CLIENT_SIGNER && s.username == USER)
        .await
    else {
        panic!(
            "no renewal before the first certificate expired: {:?}\n{}",
            csrs.of(CLIENT_SIGNER),
            diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
        );
    };
    assert!(
        !ns.path(&bootstrap_file).exists(),
        "renewed without the bootstrap kubeconfig"
    );
    assert_eq!(
        renewal.approved_reason.as_deref(),
        Some("AttestedInsecureV1"),
        "{renewal:?}"
    );
    let (renewed_at, renewed_pem) = renewal.issued.clone().unwrap();
    let (_, renewed_not_after, subject) = validity(&renewed_pem);
    assert!(subject.contains(USER), "{subject}");
    assert!(
        renewed_not_after - now() > 30 * 60,
        "the renewal was issued by the signer started with --client-cert-duration {LONG}"
    );
    assert!(
        wait_current(&cert_dir, &renewed_pem, Duration::from_secs(10)).await,
        "the plugin's cert dir holds the renewed certificate"
    );

    // Past the first certificate's expiry the node still renews its Lease and is Ready.
    assert!(
        ready_past(&w.admin, NODE, first_not_after, Duration::from_secs(60)).await,
        "no Lease renewal after the first certificate expired\n{}",
        diagnostics(&kubeadm_join, &kubelet, &signer, &kcm)
    );
    assert!(kubelet.alive(), "{}", kubelet.log());
    let past_expiry = first_at.elapsed();

    // Over the whole run: one join-token CSR, one renewal, one serving CSR; nothing for the
    // legacy kubelet signer, nothing refused.
    let all = csrs.all();
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "a CSR for {LEGACY_SIGNER}: {:?}",
        csrs.of(LEGACY_SIGNER)
    );
    let client = csrs.of(CLIENT_SIGNER);
    assert_eq!(client.len(), 2, "{client:?}");
    assert_eq!(csrs.of(SERVING_SIGNER).len(), 1, "{all:?}");
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all.iter().all(|s| s.refused.is_none()), "{all:?}");
    assert!(kcm.alive(), "{}", kcm.log());
    let systemctl = ns.systemctl_calls();
    assert!(
        systemctl.is_empty() || systemctl.iter().any(|c| c == "restart kubelet"),
        "{systemctl:?}"
    );

    eprintln!(
        "--- kubeadm init phases:\n{init_output}--- kubeadm join:\n{join_output}--- systemctl calls: {systemctl:?}\n\
         --- kubelet: {} {}",
        assets.join("kubelet").display(),
        kubelet_args.join(" ")
    );
    eprintln!(
        "envtest_kubeadm timings: setup (apiserver, CRDs, kubeadm init phases, signer, kube-controller-manager, containerd, namespace) {}; \
         kubeadm join started to asking for kubelet {}, ExecStartPre {}, join wall time {}; \
         kubelet start to client CSR filed {}, filed to issued {}; kubelet start to Node registered {}, to Ready {}; \
         serving CSR filed to issued {}; renewal filed {} after the first issuance, filed to issued {}; \
         first issuance to Ready past its expiry {}; total {}",
        secs(setup),
        secs(asked_at),
        secs(pre_took),
        secs(join_took),
        secs(first.first_seen - kubelet_started),
        secs(first_at - first.first_seen),
        secs(registered_after),
        secs(ready_after),
        secs(serving_at - serving.first_seen),
        secs(renewal.first_seen - first_at),
        secs(renewed_at - renewal.first_seen),
        secs(past_expiry),
        secs(began.elapsed()),
    );
    kubelet.stop();
    drop(ns);
}
