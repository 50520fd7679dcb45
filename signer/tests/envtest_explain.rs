//! `node-attestation-signer explain` against a real kube-apiserver and etcd (`KUBEBUILDER_ASSETS`;
//! skipped loudly without), next to the running signer: for a join, a denied hijack and a CSR
//! left pending, explain's decision now is the one the signer took (same outcome, same reason),
//! it names the Machine, its claim and the Events the signer wrote, `--pending` lists what is
//! waiting or refused, and it runs under the read-only roles of `config/explain/` and writes
//! nothing. With swtpm too: a `tpm/v1` CSR #1 the signer challenged is explained as waiting for
//! CSR #2, without the challenge key.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use attestation::names::{SIGNER_INSECURE, SIGNER_TPM};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, apply_file, file_csr, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(30);

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

/// A user of the management apiserver holding only config/explain's roles (the kubeconfig
/// Secrets' role in the Cluster's namespace when `kubeconfigs`).
async fn explainer(w: &Workload, user: &str, kubeconfigs: bool) -> PathBuf {
    apply_file(&w.admin, "config/explain/management-cluster.yaml").await;
    apply(
        &w.admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": user},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-attestation-explain"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    )
    .await;
    if kubeconfigs {
        // The least privilege explain-rbac prints: get on this Cluster's kubeconfig Secret only.
        let out = Command::new(SIGNER_BIN)
            .args([
                "explain-rbac",
                "--namespace",
                &w.namespace,
                "--cluster",
                &w.cluster,
                "--user",
                user,
            ])
            .args(["--name", &format!("{user}-kubeconfigs")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("WARNING")
                && String::from_utf8_lossy(&out.stderr).contains("cluster-admin"),
            "explain-rbac says what it grants: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tests::live::apply_yaml(&w.admin, &String::from_utf8_lossy(&out.stdout)).await;
        let can = |secret: &str| {
            let out = w.env.kubectl(&[
                "auth",
                "can-i",
                "get",
                &format!("secret/{secret}"),
                "-n",
                &w.namespace,
                "--as",
                user,
            ]);
            String::from_utf8_lossy(&out.stdout).trim() == "yes"
        };
        assert!(
            can(&format!("{}-kubeconfig", w.cluster)),
            "{user} reads the kubeconfig Secret"
        );
        assert!(!can(&format!("{}-ca", w.cluster)), "{user} never reads the CA Secret");
    }
    let (cert, key) = w.env.client_certificate(user, &[]);
    w.env.kubeconfig_for_certificate(user, &cert, &key)
}

/// Runs explain as `kubeconfig`'s user: (success, stdout, stderr).
fn explain(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(SIGNER_BIN)
        .arg("explain")
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn explain_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, stdout, stderr) = explain(kubeconfig, &all);
    assert!(ok, "explain {args:?} failed: {stderr}{stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("explain {args:?}: not JSON ({e}): {stdout}"))
}

/// The resourceVersions of every CSR, Machine and Cluster: what a write would change.
async fn versions(w: &Workload) -> Vec<String> {
    let mut all = Vec::new();
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());
    for csr in csrs.list(&Default::default()).await.unwrap().items {
        all.push(format!(
            "csr {} {}",
            csr.metadata.name.unwrap(),
            csr.metadata.resource_version.unwrap()
        ));
    }
    for kind in ["machines.cluster.x-k8s.io", "clusters.cluster.x-k8s.io"] {
        let out = w.env.kubectl(&["get", kind, "-A", "-o", "json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        for item in list["items"].as_array().unwrap() {
            all.push(format!(
                "{kind} {} {}",
                item["metadata"]["name"], item["metadata"]["resourceVersion"]
            ));
        }
    }
    all.sort();
    all
}

/// Waits until an Event in the Cluster's namespace has `reason` and a note mentioning `text`.
async fn wait_event(w: &Workload, reason: &str, text: &str, signer: &Signer) {
    for _ in 0..150 {
        let out = w
            .env
            .kubectl(&["get", "events.events.k8s.io", "-n", &w.namespace, "-o", "json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        if list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == reason && e["note"].as_str().unwrap_or_default().contains(text))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no {reason} Event naming {text}; signer log:\n{}", signer.log());
}

/// The signer's recorded outcome on a CSR, as explain must report it.
fn recorded(state: &Final) -> (&'static str, Option<String>) {
    match state {
        Final::Issued(_) => ("Issued", None),
        other => ("Denied", other.reason().map(str::to_owned)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn explain_tells_what_the_running_signer_decided_and_writes_nothing() {
    let env = Envtest::start("envtest_explain");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "insecure").await;
    let cluster = format!("{}/{}", w.namespace, w.cluster);
    for name in ["worker-0", "worker-1"] {
        w.add_machine(&admin, name, &pid(name)).await;
    }
    // A Machine whose provider ID is not set yet: a CSR for an unknown provider ID waits.
    apply(&admin, &w.own(capi::machine("worker-9", None))).await;
    let signer = Signer::start(Path::new(SIGNER_BIN), &w.env, &[]).await;

    // A join, a hijack of the joined Machine's identity, and a CSR for a Machine not there yet.
    let worker0 = RequestSpec::kubelet("worker-0", &pid("worker-0"));
    file_csr(
        &w.bootstrap,
        "join-worker-0",
        SIGNER_INSECURE,
        &worker0.build(),
        CLIENT_USAGES,
    )
    .await;
    let join = wait_final(&w.admin, "join-worker-0", false, WAIT).await;
    assert!(matches!(join, Final::Issued(_)), "{join:?}\n{}", signer.log());
    // In a later second than the join: creationTimestamp has whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    file_csr(
        &w.bootstrap,
        "hijack-worker-0",
        SIGNER_INSECURE,
        &worker0.build(),
        CLIENT_USAGES,
    )
    .await;
    let hijack = wait_final(&w.admin, "hijack-worker-0", false, WAIT).await;
    assert_eq!(hijack.reason(), Some("MachineAlreadyClaimed"), "{hijack:?}");
    let later = RequestSpec::kubelet("worker-9", &pid("worker-9"));
    file_csr(
        &w.bootstrap,
        "join-worker-9",
        SIGNER_INSECURE,
        &later.build(),
        CLIENT_USAGES,
    )
    .await;
    wait_event(&w, "CSRDenied", "hijack-worker-0", &signer).await;
    // The signer has looked at worker-9's CSR and left it pending.
    let mut retried = false;
    for _ in 0..100 {
        retried = signer
            .metrics()
            .lines()
            .any(|l| l.starts_with("node_attestation_decisions_total{") && l.contains(r#"decision="Retry""#));
        if retried {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(retried, "the signer left join-worker-9 pending:\n{}", signer.log());
    assert!(matches!(
        wait_final(&w.admin, "join-worker-9", false, Duration::from_secs(1)).await,
        Final::Pending
    ));

    let reader = explainer(&w, "explainer", true).await;
    let before = versions(&w).await;

    // Each CSR: explain's decision now is the signer's.
    for (csr, state) in [("join-worker-0", &join), ("hijack-worker-0", &hijack)] {
        let report = explain_json(&reader, &["--cluster", &cluster, csr]);
        let (recorded_state, reason) = recorded(state);
        assert_eq!(report["recorded"]["state"], recorded_state, "{csr}: {report:#}");
        let now_reason = report["now"]["reason"].as_str().map(str::to_owned);
        match recorded_state {
            "Issued" => {
                assert_eq!(report["now"]["decision"], "Approved", "{csr}: {report:#}");
                assert_eq!(
                    now_reason.as_deref(),
                    report["recorded"]["reason"].as_str(),
                    "{csr}: the approval's reason is the recorded one: {report:#}"
                );
                let message = report["recorded"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("/worker-0, approved by replica "),
                    "{csr}: the record names the Machine and the replica: {report:#}"
                );
            }
            _ => {
                assert_eq!(report["now"]["decision"], "Denied", "{csr}: {report:#}");
                assert_eq!(now_reason, reason, "{csr}: {report:#}");
                assert_eq!(report["recorded"]["reason"].as_str().map(str::to_owned), reason);
            }
        }
        assert!(
            report["now"]["rules"].as_array().unwrap().len() > 5,
            "every rule: {report:#}"
        );
        assert_eq!(report["machine"]["name"], format!("{}/worker-0", w.namespace));
        assert_eq!(report["machine"]["claim"]["state"], "valid", "{report:#}");
        assert_eq!(report["machine"]["claim"]["nodeName"], "worker-0");
    }
    let hijack_report = explain_json(&reader, &["--cluster", &cluster, "hijack-worker-0"]);
    assert_eq!(hijack_report["machine"]["claim"]["heldBy"], "CSR join-worker-0");
    let events = hijack_report["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "CSRDenied" && e["note"].as_str().unwrap().contains("hijack-worker-0")),
        "the signer's Event: {hijack_report:#}"
    );
    assert!(
        !events.iter().any(|e| e["reason"] == "CertificateIssued"),
        "a certificate's record is its approval condition: {hijack_report:#}"
    );
    assert_eq!(hijack_report["otherCSRs"][0]["name"], "join-worker-0");

    // The pending one: the signer left it pending, explain says Retry and why.
    let waiting = explain_json(&reader, &["--cluster", &cluster, "join-worker-9"]);
    assert_eq!(waiting["recorded"]["state"], "Pending");
    assert_eq!(waiting["now"]["decision"], "Retry", "{waiting:#}");
    assert!(
        waiting["now"]["message"].as_str().unwrap().contains("worker-9"),
        "{waiting:#}"
    );

    // By node, finding the Cluster from the provider ID (what kubelet-authenticator status
    // prints): the node's newest CSR, for people.
    let (ok, text, stderr) = explain(&reader, &["--provider-id", &pid("worker-0"), "--node", "worker-0"]);
    assert!(ok, "{stderr}");
    eprintln!("explain --provider-id {} --node worker-0:\n{text}", pid("worker-0"));
    assert!(text.contains("CSR hijack-worker-0 of Cluster"), "{text}");
    assert!(text.contains("Denied (MachineAlreadyClaimed)"), "{text}");
    assert!(text.contains("held by CSR join-worker-0"), "{text}");
    assert!(text.contains("CSRDenied"), "{text}");
    assert!(text.contains("FAIL"), "{text}");

    // --pending: the hijack with the signer's reason and worker-9 waiting; not the issued join.
    let pending = explain_json(&reader, &["--cluster", &cluster, "--pending"]);
    let listed: Vec<(String, String, String)> = pending["csrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let reason = c["recorded"]["reason"]
                .as_str()
                .or(c["nowReason"].as_str())
                .unwrap_or("-")
                .to_owned();
            (
                c["name"].as_str().unwrap().to_owned(),
                c["recorded"]["state"].as_str().unwrap().to_owned(),
                format!("{reason} {}", c["now"].as_str().unwrap_or_default()),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            (
                "hijack-worker-0".to_owned(),
                "Denied".to_owned(),
                "MachineAlreadyClaimed ".to_owned()
            ),
            ("join-worker-9".to_owned(), "Pending".to_owned(), "- Retry".to_owned()),
        ],
        "{pending:#}"
    );
    // The workload apiserver's minor: what it lacks is a note, a gauge and a Warning Event.
    let minor = tests::envtest::kubernetes_minor();
    let notes = pending["notes"].to_string();
    assert_eq!(notes.contains("KEP-4601"), minor < 32, "minor {minor}: {notes}");
    assert_eq!(notes.contains("credential-id"), minor < 32, "minor {minor}: {notes}");
    let metrics = signer.metrics();
    assert_eq!(
        live::metric(
            &metrics,
            &format!("node_attestation_workload_kubernetes_minor{{cluster=\"{cluster}\"}}")
        ),
        f64::from(minor),
        "{metrics}"
    );
    let lacks_selectors =
        format!("node_attestation_workload_limitations{{cluster=\"{cluster}\",limitation=\"WiderNodeReads\"}}");
    assert_eq!(metrics.contains(&lacks_selectors), minor < 32, "{metrics}");
    if minor < 32 {
        wait_event(&w, "WorkloadKubernetesLimited", "KEP-4601", &signer).await;
    }

    let (ok, text, _) = explain(&reader, &["--cluster", &cluster, "--pending"]);
    eprintln!("explain --pending:\n{text}");
    assert!(ok && text.contains("2 CSRs pending, denied or failed"), "{text}");

    // Nothing was written, by explain or through it.
    assert_eq!(versions(&w).await, before, "explain wrote something");

    // Without the kubeconfig Secrets' role it says what it needs; with --workload-kubeconfig
    // it needs no Secret at all.
    let no_secrets = explainer(&w, "explainer-no-secrets", false).await;
    let (ok, _, stderr) = explain(&no_secrets, &["--cluster", &cluster, "hijack-worker-0"]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("{}-kubeconfig", w.cluster)) && stderr.contains("--workload-kubeconfig"),
        "{stderr}"
    );
    let report = explain_json(
        &no_secrets,
        &[
            "--cluster",
            &cluster,
            "hijack-worker-0",
            "--workload-kubeconfig",
            w.env.admin_kubeconfig.to_str().unwrap(),
        ],
    );
    assert_eq!(report["now"]["reason"], "MachineAlreadyClaimed");

    // Questions without an answer fail with a reason.
    let (ok, _, stderr) = explain(&reader, &["--cluster", &format!("{}/nope", w.namespace), "--pending"]);
    assert!(!ok && stderr.contains("there is no Cluster"), "{stderr}");
    let (ok, _, stderr) = explain(&reader, &["--cluster", &cluster, "no-such-csr"]);
    assert!(!ok && stderr.contains("there is no CSR \"no-such-csr\""), "{stderr}");
    let (ok, _, stderr) = explain(&reader, &["--provider-id", &pid("nowhere"), "--pending"]);
    assert!(!ok && stderr.contains("--cluster"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS (a real kube-apiserver and etcd) and swtpm"]
async fn a_challenged_tpm_csr_is_explained_as_waiting_for_its_answer_without_the_challenge_key() {
    use attestation::request::build_envelope;
    use attestation::tpm::attestor::TpmAttestor;
    use tests::swtpm::{Swtpm, localca_bundle};
    use tests::tpm_world;

    let env = Envtest::start("envtest_explain_tpm");
    let tpm = Swtpm::start("envtest_explain_tpm");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "tpm").await;
    let cluster = format!("{}/{}", w.namespace, w.cluster);
    w.add_machine(&admin, tpm_world::NODE, tpm_world::PID).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ek-ca.pem");
    std::fs::write(&bundle, localca_bundle()).unwrap();
    let signer = Signer::start(
        Path::new(SIGNER_BIN),
        &w.env,
        &["--tpm-ek-ca-bundle", bundle.to_str().unwrap()],
    )
    .await;

    // CSR #1 from the TPM; the node never answers.
    let key = tpm_world::key();
    let mut attestor = TpmAttestor::new(&tpm.tcti).unwrap();
    let envelope = build_envelope(&tpm_world::params(), &key, &mut attestor, None).unwrap();
    file_csr(
        &w.bootstrap,
        "tpm-worker-0",
        SIGNER_TPM,
        envelope.encode().as_bytes(),
        CLIENT_USAGES,
    )
    .await;
    let csrs: Api<CertificateSigningRequest> = Api::all(w.admin.clone());
    let mut challenged = false;
    for _ in 0..150 {
        let csr = csrs.get("tpm-worker-0").await.unwrap();
        if csr
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key(attestation::names::ANNOTATION_TPM_CHALLENGE))
        {
            challenged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(challenged, "the signer challenges CSR #1:\n{}", signer.log());
    wait_event(&w, "CSRChallenged", "tpm-worker-0", &signer).await;

    let reader = explainer(&w, "explainer", true).await;
    let before = versions(&w).await;
    let report = explain_json(
        &reader,
        &[
            "--cluster",
            &cluster,
            "tpm-worker-0",
            "--tpm-ek-ca-bundle",
            bundle.to_str().unwrap(),
        ],
    );
    assert_eq!(report["recorded"]["state"], "Pending", "{report:#}");
    assert_eq!(report["now"]["decision"], "Retry", "{report:#}");
    let attestation_rule = report["now"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "attestation")
        .cloned()
        .unwrap_or_else(|| panic!("an attestation rule: {report:#}"));
    let note = attestation_rule.to_string();
    assert!(note.contains("waiting for CSR #2 until"), "{note}");
    assert!(note.contains("explain holds no challenge key"), "{note}");
    assert!(
        report["now"]["annotations"].is_null(),
        "explain would write no challenge: {report:#}"
    );
    assert!(
        report["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "CSRChallenged"),
        "{report:#}"
    );
    let (ok, text, stderr) = explain(
        &reader,
        &[
            "--cluster",
            &cluster,
            "--node",
            tpm_world::NODE,
            "--tpm-ek-ca-bundle",
            bundle.to_str().unwrap(),
        ],
    );
    assert!(ok, "{stderr}");
    eprintln!("explain --node {}:\n{text}", tpm_world::NODE);
    assert!(text.contains("Retry (left pending)"), "{text}");
    assert!(text.contains("waiting for CSR #2"), "{text}");
    assert!(text.contains("attestor tpm/v1"), "{text}");
    assert_eq!(versions(&w).await, before, "explain wrote something");

    // Join tokens (SPEC section 7): a MachinePool's token is listed as kept, with the expiry
    // the signer keeps ahead; the Machine's (unclaimed) is held.
    live::add_bootstrap_token(&w.admin, "pool01", "0123456789abcdef").await;
    apply(&admin, &w.own(capi::kubeadm_config("pool-a-kc", "pool01", "v1beta2"))).await;
    apply(&admin, &w.own(capi::machine_pool("pool-a", &[]))).await;
    let mut tokens = Value::Null;
    for _ in 0..50 {
        let pending = explain_json(
            &reader,
            &[
                "--cluster",
                &cluster,
                "--pending",
                "--tpm-ek-ca-bundle",
                bundle.to_str().unwrap(),
            ],
        );
        tokens = pending["joinTokens"]["tokens"].clone();
        let pool = tokens.as_array().into_iter().flatten().find(|t| t["id"] == "pool01");
        if pool.is_some_and(|t| t["secret"].as_str().unwrap_or_default().starts_with("expires")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pool = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "pool01")
        .unwrap_or_else(|| panic!("{tokens:#}"));
    assert_eq!(pool["plan"], "kept", "{tokens:#}");
    assert!(
        pool["detail"].as_str().unwrap().contains("MachinePool pool-a"),
        "{tokens:#}"
    );
    assert!(pool["secret"].as_str().unwrap().starts_with("expires 20"), "{tokens:#}");
    let machine = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "abcdef")
        .unwrap_or_else(|| panic!("{tokens:#}"));
    assert_eq!(machine["plan"], "held", "{tokens:#}");
    let (ok, text, stderr) = explain(
        &reader,
        &[
            "--cluster",
            &cluster,
            "--pending",
            "--tpm-ek-ca-bundle",
            bundle.to_str().unwrap(),
        ],
    );
    assert!(ok, "{stderr}");
    eprintln!("explain --pending:\n{text}");
    assert!(text.contains("Join tokens: 2"), "{text}");
}
