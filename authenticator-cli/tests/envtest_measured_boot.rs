//! The `tpm/v1` boot policy end to end (SPEC section 5, revision 5), on real parts: a real
//! kube-apiserver (`KUBEBUILDER_ASSETS`), the real signer, the real plugin run by kubectl, and a
//! real TPM (swtpm) whose PCRs are extended as firmware would from a real measured-boot log
//! (`testdata/event_logs/`, google/go-attestation's Ubuntu 21.04 Shielded VM log: Secure Boot
//! off, shim and grub in PCR 4, grub's commands and the kernel command line in PCR 8, the files
//! grub read in PCR 9). The plugin reads the log from `--tpm-event-log`, as it would read the
//! kernel's. The Cluster names its policy in a ConfigMap.
//!
//! With Secure Boot off, grub loads the kernel itself (no shim_lock verification), so this log's
//! last PCR 4 boot application, what a policy calls the kernel, is grub; the kernel file is in
//! PCR 9 only, as grub's plain SHA-256. The cases edit that last boot application.
//!
//! - A policy built from the log's own values (Secure Boot optional, the boot applications and
//!   grub's kernel command line): the join is signed.
//! - The same boot when the policy requires Secure Boot: refused, naming PCR 7's event.
//! - A kernel the policy does not list: refused, naming the last boot application's event.
//! - One extend after the log (PCR 4), and a log with an event changed: refused, the log does
//!   not match the quote.
//! - A "kernel update" (swtpm restarted on its state: same EK, PCRs reset; a log whose kernel
//!   event differs): renewals are refused until the ConfigMap lists the new image beside the old,
//!   then signed once the signer reads the ConfigMap again (it keeps a policy 30 s).
//!
//! - Revision 6: keylime's real RHEL 9 boot (Secure Boot on) signed under the policy its own
//!   measurements make, then the five forged boots of the attack review
//!   (`tests::boot_log::forgery`), each refused by the signer naming the event it falsified.
//!
//! swtpm starts with zero PCRs at locality 0: the log has no StartupLocality event, so every
//! quoted PCR, 0 included, is compared. Skips loudly without the apiserver or swtpm.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use attestation::tpm::event_log::{self, HashAlg};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::json;
use tests::boot_log::{self, boot_applications, hex, image, policy, replaced};
use tests::capi;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply};
use tests::swtpm::{Swtpm, localca_bundle};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const PID: &str = "aws:///us-east-1a/i-boot0";
const NODE: &str = "worker-0";
/// The ConfigMap the Cluster names for the allowed boot, edited for the rollout.
const POLICY: &str = "boot-policy";
/// How long the signer keeps a policy it read before reading it again (its
/// `controller::boot_policy::TTL`, 30 s), and a second more.
const POLICY_TTL: Duration = Duration::from_secs(31);

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// The node: its TPM, the log file the plugin reads, its cert dir and flags.
struct Node {
    tpm: Swtpm,
    log_file: PathBuf,
    cert_dir: PathBuf,
    flags: Vec<String>,
}

impl Node {
    fn new(dir: &Path, bootstrap: &Path) -> Self {
        let tpm = Swtpm::start("envtest_measured_boot");
        let log_file = dir.join("binary_bios_measurements");
        let cert_dir = dir.join("pki");
        let flags = [
            "--bootstrap-kubeconfig",
            bootstrap.to_str().unwrap(),
            "--cert-dir",
            cert_dir.to_str().unwrap(),
            "--node-name",
            NODE,
            "--provider-id",
            PID,
            "--attestor",
            "tpm",
            "--tpm-tcti",
            &tpm.tcti,
            "--tpm-event-log",
            log_file.to_str().unwrap(),
            "--timeout",
            "60s",
            // A TPM renewal's two phases under a loaded CI machine: the call waits for them (the
            // default, 20 s, would answer the current certificate and retry later).
            "--renewal-timeout",
            "60s",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        Self {
            tpm,
            log_file,
            cert_dir,
            flags,
        }
    }

    /// A boot: the TPM reset (a fresh swtpm start on the same state), `measured` played into
    /// its PCRs, and `reported` left where the plugin reads the log (the same log, unless a
    /// case makes the node lie). The PCRs now equal `measured`'s replay.
    fn boot(&mut self, measured: &[u8], reported: &[u8]) {
        self.tpm.reboot();
        let log = event_log::parse(measured).unwrap();
        assert_eq!(self.tpm.measure_boot(&log), ["sha256"], "swtpm allocates SHA-256");
        let replay = log.replay(HashAlg::Sha256).unwrap();
        for pcr in [0, 1, 4, 7, 8, 9, 11] {
            let expected = replay.get(&pcr).cloned().unwrap_or_else(|| vec![0; 32]);
            assert_eq!(
                hex(&self.tpm.pcr("sha256", pcr)),
                hex(&expected),
                "PCR {pcr} after the log"
            );
        }
        std::fs::write(&self.log_file, reported).unwrap();
    }

    /// A renewal by the node, as itself: its certificate made due, the backoff a denial left
    /// forgotten, the plugin run once.
    fn renew(&self, w: &Workload) -> Output {
        tests::ca::make_due_for_rotation(&w.env.client_ca, &self.cert_dir, NODE, PID);
        let _ = std::fs::remove_file(self.cert_dir.join("kubelet-authenticator-backoff"));
        Command::new(PLUGIN)
            .args(&self.flags)
            .env_remove("KUBERNETES_EXEC_INFO")
            .output()
            .unwrap()
    }
}

/// The CSRs `requester` filed since the last call (`seen` keeps the names), phase 1 first.
async fn new_csrs(
    admin: &kube::Client,
    requester: &str,
    seen: &mut BTreeSet<String>,
) -> Vec<CertificateSigningRequest> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut items: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.username.as_deref() == Some(requester))
        .filter(|c| seen.insert(c.metadata.name.clone().unwrap_or_default()))
        .collect();
    items.sort_by_key(|c| {
        let envelope = attestation::envelope::RequestEnvelope::parse(&c.spec.request.0).unwrap();
        attestation::tpm::data::TpmData::parse(envelope.data.as_deref().unwrap())
            .unwrap()
            .phase
    });
    items
}

/// The one CSR filed since the last look, denied: its reason and message.
async fn refused(
    w: &Workload,
    requester: &str,
    seen: &mut BTreeSet<String>,
    signer: &Signer,
    case: &str,
) -> (String, String) {
    let filed = new_csrs(&w.admin, requester, seen).await;
    assert_eq!(
        filed.len(),
        1,
        "{case}: phase 1 only, refused before any challenge\n{}",
        signer.log()
    );
    let name = filed[0].metadata.name.clone().unwrap();
    match live::wait_final(&w.admin, &name, false, Duration::from_secs(30)).await {
        Final::Denied(reason, message) => {
            eprintln!("{case}: {reason}: {message}");
            (reason, message)
        }
        other => panic!("{case}: expected a denial, got {other:?}\n{}", signer.log()),
    }
}

/// The two CSRs filed since the last look: CSR #2 signed `AttestedTpmV1`, CSR #1 superseded.
async fn signed(w: &Workload, requester: &str, seen: &mut BTreeSet<String>, signer: &Signer, case: &str) {
    let filed = new_csrs(&w.admin, requester, seen).await;
    assert_eq!(filed.len(), 2, "{case}: CSR #1 and CSR #2\n{}", signer.log());
    let two = filed[1].metadata.name.clone().unwrap();
    match live::wait_final(&w.admin, &two, false, Duration::from_secs(30)).await {
        Final::Issued(_) => {}
        other => panic!("{case}: CSR #2 {other:?}\n{}", signer.log()),
    }
    let csr: CertificateSigningRequest = Api::all(w.admin.clone()).get(&two).await.unwrap();
    let approved = csr
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Approved")
        .unwrap();
    assert_eq!(approved.reason.as_deref(), Some("AttestedTpmV1"), "{case}");
    eprintln!("{case}: approved: {}", approved.message.unwrap_or_default());
}

/// Writes ConfigMap `name` holding `text` and has the Cluster name it. The signer reads a
/// ConfigMap it has not read within its TTL at once, so each case names a ConfigMap of its own;
/// the rollout edits one the signer has read, and waits out the TTL.
async fn set_policy(admin: &kube::Client, name: &str, text: &str) {
    apply(
        admin,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": capi::NAMESPACE},
                "data": {"policy.yaml": text}}),
    )
    .await;
    let mut cluster = capi::cluster("tpm");
    capi::annotate(&mut cluster, attestation::names::ANNOTATION_TPM_BOOT_POLICY, name);
    apply(admin, &cluster).await;
    // The signer's management cache sees the Cluster through its watch.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS (a real kube-apiserver and etcd) and swtpm"]
async fn a_boot_policy_judges_the_replayed_log_of_a_real_boot_on_join_and_renewal() {
    let env = Envtest::start("envtest_measured_boot");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "tpm").await;
    apply(&admin, &capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2")).await;
    apply(&admin, &capi::machine(NODE, Some(PID))).await;

    let original = boot_log::read(boot_log::UBUNTU_2104);
    let log = event_log::parse(&original).unwrap();
    assert_eq!(log.startup_locality, None, "PCR 0 starts at zero, as on swtpm");
    let apps = boot_applications(&log);
    assert_eq!(apps.len(), 2, "shim and grub (which loads the kernel itself)");
    let (kernel_event, kernel) = apps.last().cloned().unwrap();
    let kernel_event = log.events[kernel_event].describe();
    let allowed = image("ubuntu-2104", &log);
    set_policy(&admin, POLICY, &policy("optional", std::slice::from_ref(&allowed))).await;

    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ek-ca.pem");
    std::fs::write(&bundle, localca_bundle()).unwrap();
    let signer = Signer::start(&signer_bin(), &w.env, &["--tpm-ek-ca-bundle", bundle.to_str().unwrap()]).await;
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let mut node = Node::new(dir.path(), &bootstrap);
    let kubelet_kubeconfig = live::kubelet_kubeconfig(PLUGIN, &w.env, &node.flags, dir.path());
    let mut seen = BTreeSet::new();
    let me = format!("system:node:{NODE}");

    // Allowed: the policy is the log's own boot, Secure Boot not required (it is off here).
    node.boot(&original, &original);
    assert_eq!(
        live::whoami(&w.env, &kubelet_kubeconfig, &signer),
        format!("system:node:{NODE}")
    );
    signed(&w, "system:bootstrap:abcdef", &mut seen, &signer, "the log's own boot").await;

    // Secure Boot required: this boot has it off. PCR 7's SecureBoot variable is named.
    set_policy(
        &admin,
        "boot-policy-secure-boot",
        &policy("required", std::slice::from_ref(&allowed)),
    )
    .await;
    let _ = node.renew(&w);
    let (reason, message) = refused(&w, &me, &mut seen, &signer, "Secure Boot required").await;
    assert_eq!(reason, "AttestationInvalid", "{message}");
    assert!(
        message.contains("PCR 7") && message.contains("SecureBoot"),
        "names the SecureBoot variable's event: {message}"
    );

    // A kernel the policy does not list: the last boot application's event is named.
    let mut other_kernel = allowed.clone();
    other_kernel["kernel"] = json!("ab".repeat(32));
    set_policy(&admin, "boot-policy-other-kernel", &policy("optional", &[other_kernel])).await;
    let _ = node.renew(&w);
    let (reason, message) = refused(&w, &me, &mut seen, &signer, "a kernel not listed").await;
    assert_eq!(reason, "AttestationInvalid", "{message}");
    assert!(message.contains(&kernel_event), "names {kernel_event}: {message}");

    // One extend after the log: the log no longer explains PCR 4.
    set_policy(&admin, POLICY, &policy("optional", std::slice::from_ref(&allowed))).await;
    node.tpm.extend(&[(4, vec![("sha256", vec![0x42; 32])])]);
    let _ = node.renew(&w);
    let (reason, message) = refused(&w, &me, &mut seen, &signer, "an extend after the log").await;
    assert_eq!(reason, "AttestationInvalid", "{message}");
    assert!(message.contains("does not match the quote"), "{message}");

    // A log with an event changed (shim's digest), the TPM measured with the real one.
    let (_, shim) = apps[0].clone();
    let lying = replaced(&original, &shim, &[0x17; 32]);
    node.boot(&original, &lying);
    let _ = node.renew(&w);
    let (reason, message) = refused(&w, &me, &mut seen, &signer, "a log with an event changed").await;
    assert_eq!(reason, "AttestationInvalid", "{message}");
    assert!(message.contains("does not match the quote"), "{message}");

    // The untouched boot renews.
    node.boot(&original, &original);
    let renewed = node.renew(&w);
    assert!(renewed.status.success(), "{}", String::from_utf8_lossy(&renewed.stderr));
    signed(&w, &me, &mut seen, &signer, "a renewal of the allowed boot").await;

    // A kernel update: same TPM and EK, PCRs reset, a log whose kernel event differs.
    let updated = replaced(&original, &kernel, &[0x61; 32]);
    node.boot(&updated, &updated);
    let _ = node.renew(&w);
    let (reason, message) = refused(
        &w,
        &me,
        &mut seen,
        &signer,
        "the updated kernel before the policy allows it",
    )
    .await;
    assert_eq!(reason, "AttestationInvalid", "{message}");
    assert!(message.contains(&kernel_event), "names {kernel_event}: {message}");
    // The rollout: the ConfigMap lists the new image beside the old; once the signer reads it
    // again, the renewal is signed.
    let new_image = image("ubuntu-2104-new-kernel", &event_log::parse(&updated).unwrap());
    set_policy(&admin, POLICY, &policy("optional", &[allowed, new_image])).await;
    tokio::time::sleep(POLICY_TTL).await;
    let renewed = node.renew(&w);
    assert!(renewed.status.success(), "{}", String::from_utf8_lossy(&renewed.stderr));
    signed(
        &w,
        &me,
        &mut seen,
        &signer,
        "the updated kernel once the policy lists it",
    )
    .await;

    // Revision 6: keylime's real RHEL 9 boot (Secure Boot on, shim, grub, the kernel shim
    // verified) under its own policy, then the five forged boots of the attack review, each
    // played into the TPM with the extends the attacker's boot makes: each refused by the real
    // signer, naming the event it falsified.
    let rhel9 = event_log::parse(&boot_log::read(boot_log::RHEL9)).unwrap();
    set_policy(&admin, "boot-policy-rhel9", &boot_log::own_policy(&rhel9, "rhel-9")).await;
    let real = boot_log::encode(&rhel9);
    node.boot(&real, &real);
    let renewed = node.renew(&w);
    assert!(renewed.status.success(), "{}", String::from_utf8_lossy(&renewed.stderr));
    signed(&w, &me, &mut seen, &signer, "the real RHEL 9 boot").await;
    for forged in boot_log::forgery::all(&rhel9) {
        let bytes = boot_log::encode(&forged.log);
        node.boot(&bytes, &bytes);
        let _ = node.renew(&w);
        let (reason, message) = refused(&w, &me, &mut seen, &signer, forged.what).await;
        assert_eq!(reason, "AttestationInvalid", "{message}");
        assert!(message.contains(&forged.refusal), "{}: {message}", forged.what);
    }
}
