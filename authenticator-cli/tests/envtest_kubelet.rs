//! A real kubelet (v1.32, from `KUBEBUILDER_ASSETS`) joins through the plugin, against a real
//! kube-apiserver, the real signer and a real kube-controller-manager, on this host with its own
//! containerd ([`tests::kubelet`]; skipped by `scripts/test` where a part is missing).
//!
//! kubelet's `--kubeconfig` is the one `kubelet-authenticator kubeconfig` renders (the plugin
//! is its user), `--rotate-certificates=false`, no `--bootstrap-kubeconfig`,
//! `serverTLSBootstrap: true`. It registers its Node as `system:node:worker-0` with the
//! Machine's provider ID through exactly one bootstrap-token CSR the signer issued; its serving
//! CSR is approved by the signer and signed by kube-controller-manager, and it serves that
//! certificate; with 3-minute client certificates it renews through the plugin as the node
//! and stays Ready past the first certificate's expiry; a restart files no CSR; and no CSR of
//! the legacy `kubernetes.io/kube-apiserver-client-kubelet` signer appears at any point.
//!
//! The signer is down from the first issuance until 72% of that certificate's life has passed
//! (SPEC section 6, outage tolerance): through the rotation point the plugin's renewals go
//! unanswered, it answers the certificate it has, and kubelet keeps its Lease and the Node
//! Ready; when the signer returns the node renews.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::capi;
use tests::envtest::Envtest;
use tests::kubelet::{
    Containerd, ControllerManager, CsrRecorder, Host, Kubelet, NODE_IP, der, lease_renewed, node, now, now_micros,
    ready, ready_past, secs, validity, wait_current, wait_renewed_and_ready,
};
use tests::live::{self, Signer, Workload, apply};
use tests::strict_der::assert_strict_der_pem;

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NODE: &str = "worker-0";
const USER: &str = "system:node:worker-0";
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0kubelet";
const CLIENT_SIGNER: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure";
const LEGACY_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The signer's `--client-cert-duration` for the first certificate: with the signer's 5-minute
/// backdating the plugin renews 90 s to 99 s after issuance (50-55 % of the 3 minutes after the
/// backdating, `cert_dir::rotation_point`), while the signer is down (until 130 s).
const SHORT: &str = "3m";
/// The signer's `--client-cert-duration` once it returns: the renewed certificate is not due
/// again while the suite runs, so the restart check is exact.
const LONG: &str = "1h";

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// What each process said last, for a failure message.
fn diagnostics(kubelet: &Kubelet, signer: &Signer, kcm: &ControllerManager, containerd: &Containerd) -> String {
    let signer_log = signer.log();
    let signer_tail: Vec<&str> = signer_log.lines().rev().take(30).collect();
    format!(
        "--- kubelet:\n{}\n--- signer:\n{}\n--- kube-controller-manager:\n{}\n--- containerd:\n{}",
        kubelet.log(),
        signer_tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        kcm.log(),
        containerd.log()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet and KUBEBUILDER_ASSETS: root, kubelet and kube-controller-manager beside kube-apiserver, containerd and runc"]
async fn a_real_kubelet_joins_serves_renews_and_restarts_through_the_plugin() {
    let assets = tests::kubelet::require("envtest_kubelet");
    let began = Instant::now();
    let host = Host::claim();

    // The workload cluster (also its own management cluster): an opted-in Cluster allowing
    // insecure, worker-0's bootstrapped Machine with its provider ID and the addresses kubelet
    // will report (the serving CSR's SANs are checked against them).
    let env = Envtest::start("envtest_kubelet");
    // Ended by the next run if this one is killed.
    let recorder = host.recorder();
    env.pids().into_iter().for_each(|pid| recorder.pid(pid));
    recorder.folder(env.dir());
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    apply(
        &admin,
        &w.own(capi::kubeadm_config(&format!("{NODE}-kc"), "abcdef", "v1beta2")),
    )
    .await;
    let mut machine = w.own(capi::machine(NODE, Some(PROVIDER_ID)));
    machine["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": NODE_IP.to_string()},
        {"type": "Hostname", "address": NODE}
    ]);
    apply(&admin, &machine).await;
    let csrs = CsrRecorder::start(w.admin.clone()).await;
    let signer_flags = |duration: &'static str| ["--client-cert-duration", duration, "--leader-elect", "false"];
    let mut signer = Signer::start(&signer_bin(), &w.env, &signer_flags(SHORT)).await;
    recorder.pid(signer.pid().unwrap());
    let mut kcm = ControllerManager::start(&assets, &w.env, &host);
    let containerd = Containerd::start(&host);
    let mut kubelet = Kubelet::new(&assets, &host, &containerd, NODE, PROVIDER_ID);

    // The kubelet kubeconfig as an image bakes it: the plugin's own `kubeconfig` command, its
    // cert dir kubelet's (`<root-dir>/pki`).
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let pki = kubelet.pki_dir();
    let node_flags: Vec<String> = [
        "--bootstrap-kubeconfig",
        bootstrap.to_str().unwrap(),
        "--cert-dir",
        pki.to_str().unwrap(),
        "--node-name",
        NODE,
        "--provider-id",
        PROVIDER_ID,
        "--attestor",
        "insecure",
        "--timeout",
        "60s",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let kubeconfig = live::kubelet_kubeconfig(PLUGIN, &w.env, &node_flags, kubelet.dir());
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        text.contains("exec:") && !text.contains("client-certificate") && !text.contains("token"),
        "the plugin is kubelet's only credential:\n{text}"
    );
    let setup = began.elapsed();

    let started = Instant::now();
    kubelet.start(&kubeconfig);

    // 2. The one client CSR: filed with the bootstrap token, issued by the signer.
    let Some(first) = csrs
        .wait_issued(Duration::from_secs(120), |s| s.signer == CLIENT_SIGNER)
        .await
    else {
        panic!(
            "no client certificate issued: {:?}\n{}",
            csrs.all(),
            diagnostics(&kubelet, &signer, &kcm, &containerd)
        );
    };
    // The outage begins: the signer is down until 72% of the first certificate's life.
    signer.kill();
    let outage_began = Instant::now();
    let (first_at, first_pem) = first.issued.clone().unwrap();
    assert!(
        first.username.starts_with("system:bootstrap:"),
        "filed with the bootstrap token: {first:?}"
    );
    assert_strict_der_pem("the first client certificate", first_pem.as_bytes());
    let (first_not_before, first_not_after, subject) = validity(&first_pem);
    assert!(subject.contains(USER), "{subject}");
    assert_eq!(
        first_not_after - first_not_before,
        8 * 60,
        "a {SHORT} certificate, backdated 5 minutes"
    );

    // 1. The Node, registered by kubelet as system:node:worker-0, with the Machine's provider ID.
    let deadline = Instant::now() + Duration::from_secs(120);
    let registered = loop {
        if let Some(n) = node(&w.admin, NODE).await {
            break n;
        }
        assert!(
            Instant::now() < deadline && kubelet.alive(),
            "the Node was not registered\n{}",
            diagnostics(&kubelet, &signer, &kcm, &containerd)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let registered_after = started.elapsed();
    assert_eq!(
        registered.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(PROVIDER_ID)
    );
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, 0, Duration::from_secs(120)).await,
        "the Node is not Ready\n{:?}\n{}",
        node(&w.admin, NODE)
            .await
            .and_then(|n| n.status)
            .and_then(|s| s.conditions),
        diagnostics(&kubelet, &signer, &kcm, &containerd)
    );
    let ready_after = started.elapsed();

    // 3. Through the outage, past the rotation point: the plugin's renewals are filed and go
    // unanswered (each gives up after --renewal-timeout, 20 s, and answers the certificate it
    // has), and kubelet keeps renewing its Lease within 40 s and the Node Ready.
    let life = first_not_after - (first_not_before + 5 * 60);
    let outage_end = first_not_after - life * 28 / 100;
    let mut lapses = Vec::new();
    let mut longest_lease_gap = 0;
    while now() < outage_end {
        let renewed = lease_renewed(&w.admin, NODE).await.unwrap_or(0);
        let gap = now_micros() - renewed;
        longest_lease_gap = longest_lease_gap.max(gap);
        let is_ready = node(&w.admin, NODE).await.is_some_and(|n| ready(&n));
        if gap > 40_000_000 || !is_ready {
            lapses.push(format!(
                "at {}s: Lease {} s old, Ready {is_ready}",
                now() - first_not_before - 300,
                gap / 1_000_000
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let outage = outage_began.elapsed();
    assert!(
        lapses.is_empty(),
        "the node lapsed during the signer's outage: {lapses:?}\n{}",
        diagnostics(&kubelet, &signer, &kcm, &containerd)
    );
    assert!(
        outage.as_secs_f64() > 0.7 * life as f64,
        "an outage of {outage:?} is not 70% of a {life} s life"
    );
    let unanswered: Vec<_> = csrs
        .of(CLIENT_SIGNER)
        .into_iter()
        .filter(|s| s.username == USER)
        .collect();
    assert!(
        !unanswered.is_empty() && unanswered.iter().all(|s| s.issued.is_none() && s.refused.is_none()),
        "the plugin tried to renew during the outage, and nothing answered: {unanswered:?}\n{}",
        kubelet.log()
    );
    assert!(
        wait_current(&pki, &first_pem, Duration::from_secs(1)).await,
        "the plugin kept the first certificate"
    );
    // The signer returns, issuing long certificates from now on.
    signer = Signer::start(&signer_bin(), &w.env, &signer_flags(LONG)).await;
    recorder.pid(signer.pid().unwrap());

    // 2. The serving CSR: filed by the node (so kubelet's identity is the plugin's), approved
    // by the signer, signed by kube-controller-manager with the cluster CA; kubelet serves it.
    let Some(serving) = csrs
        .wait_issued(Duration::from_secs(120), |s| s.signer == SERVING_SIGNER)
        .await
    else {
        panic!(
            "no serving certificate: {:?}\n{}",
            csrs.of(SERVING_SIGNER),
            diagnostics(&kubelet, &signer, &kcm, &containerd)
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
                diagnostics(&kubelet, &signer, &kcm, &containerd)
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let served_after = serving_at.elapsed();
    assert_eq!(der(&served), der(&serving_pem), "kubelet serves the issued certificate");
    let on_disk = std::fs::read_to_string(pki.join("kubelet-server-current.pem")).unwrap();
    assert_eq!(der(&on_disk), der(&serving_pem), "kubelet-server-current.pem");

    // 4. Renewal through the plugin, as the node, before the first certificate expires: the
    // certificate of one of its renewal CSRs (the returning signer issues those still pending
    // from the outage too; the plugin takes the one it waits for) is its current one.
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(first_not_after - now()).unwrap_or(0));
    let renewal = loop {
        let current = std::fs::read_to_string(pki.join("kubelet-client-current.pem")).unwrap_or_default();
        let taken = csrs.of(CLIENT_SIGNER).into_iter().find(|s| {
            s.username == USER
                && current.contains("CERTIFICATE")
                && s.issued.as_ref().is_some_and(|(_, pem)| der(pem) == der(&current))
        });
        if let Some(renewal) = taken {
            break renewal;
        }
        assert!(
            Instant::now() < deadline,
            "kubelet did not renew before the first certificate expired: {:?}\n{}",
            csrs.of(CLIENT_SIGNER),
            diagnostics(&kubelet, &signer, &kcm, &containerd)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (renewed_at, renewed_pem) = renewal.issued.clone().unwrap();
    let (_, renewed_not_after, subject) = validity(&renewed_pem);
    assert!(subject.contains(USER), "{subject}");
    assert!(
        renewed_not_after - now() > 30 * 60,
        "the renewal was issued by the signer started with --client-cert-duration {LONG} (it was filed too soon after the first certificate?)"
    );
    assert!(
        wait_current(&pki, &renewed_pem, Duration::from_secs(10)).await,
        "the plugin's cert dir holds the renewed certificate"
    );

    // Past the first certificate's expiry, kubelet still renews its Lease: it talks with the
    // renewed certificate (the apiserver checks a client certificate's validity on every
    // request), and the Node is Ready.
    assert!(
        ready_past(&w.admin, NODE, first_not_after, Duration::from_secs(60)).await,
        "no Lease renewal after the first certificate expired\n{}",
        diagnostics(&kubelet, &signer, &kcm, &containerd)
    );
    assert!(kubelet.alive(), "{}", kubelet.log());
    let past_expiry = first_at.elapsed();

    // 5. A restart answers from the plugin's cache and serves the same certificate: no CSR.
    let before = csrs.all();
    let restart = Instant::now();
    kubelet.stop();
    let restarted = now_micros();
    kubelet.start_again();
    assert!(
        wait_renewed_and_ready(&w.admin, NODE, restarted, Duration::from_secs(90)).await,
        "the restarted kubelet does not renew its Lease\n{}",
        diagnostics(&kubelet, &signer, &kcm, &containerd)
    );
    let restarted_after = restart.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    let served_again = loop {
        match kubelet.served_certificate(&ca) {
            Ok(pem) => break pem,
            Err(why) => assert!(Instant::now() < deadline, "after the restart: {why}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(der(&served_again), der(&serving_pem), "the same serving certificate");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = csrs.all();
    assert_eq!(
        after.iter().map(|s| &s.name).collect::<Vec<_>>(),
        before.iter().map(|s| &s.name).collect::<Vec<_>>(),
        "a restart files no CSR"
    );

    // Over the whole run: one bootstrap CSR, the renewals (one taken; those the outage left
    // pending issued too), one serving CSR; nothing for the legacy kubelet signer, nothing
    // refused.
    let all = csrs.all();
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "a CSR for {LEGACY_SIGNER}: {:?}",
        csrs.of(LEGACY_SIGNER)
    );
    let client = csrs.of(CLIENT_SIGNER);
    assert!(client.len() >= 2, "{client:?}");
    assert_eq!(
        client
            .iter()
            .filter(|s| s.username.starts_with("system:bootstrap:"))
            .count(),
        1,
        "exactly one client CSR with the bootstrap token"
    );
    assert_eq!(csrs.of(SERVING_SIGNER).len(), 1);
    assert_eq!(all.len(), client.len() + 1, "{all:?}");
    assert!(all.iter().all(|s| s.refused.is_none()), "{all:?}");
    assert!(
        client
            .iter()
            .all(|s| s.approved_reason.as_deref() == Some("AttestedInsecureV1")),
        "approved by the signer: {client:?}"
    );
    assert!(kcm.alive(), "{}", kcm.log());

    eprintln!(
        "envtest_kubelet timings: setup (apiserver, CRDs, signer, kube-controller-manager, containerd) {}; \
         kubelet start to client CSR filed {}, filed to issued {}; kubelet start to Node registered {}, to Ready {}; \
         serving CSR filed to approved {}, to issued {}, issued to served {}; \
         signer down {} ({} renewal CSRs unanswered, longest Lease gap {} s); renewal taken filed {} after the first issuance, filed to issued {}; first issuance to Ready past its expiry {}; \
         restart to Lease renewed {}; snapshotter {}, node address on a {} link; total {}",
        secs(setup),
        secs(first.first_seen - started),
        secs(first_at - first.first_seen),
        secs(registered_after),
        secs(ready_after),
        secs(serving.approved.unwrap() - serving.first_seen),
        secs(serving_at - serving.first_seen),
        secs(served_after),
        secs(outage),
        unanswered.len(),
        longest_lease_gap / 1_000_000,
        secs(renewal.first_seen - first_at),
        secs(renewed_at - renewal.first_seen),
        secs(past_expiry),
        secs(restarted_after),
        containerd.snapshotter,
        host.interface_kind,
        secs(began.elapsed()),
    );
}
