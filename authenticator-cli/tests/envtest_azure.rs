//! `azure/v1` end to end on a real kube-apiserver (`KUBEBUILDER_ASSETS`) with the real signer
//! and the real plugin, Azure stood in for on loopback:
//!
//! - IMDS (plain HTTP, `AZURE_METADATA_ENDPOINT`): attested documents signed by a synthetic
//!   Microsoft PKI for the nonce asked (the signer is given its root as `--azure-ca-bundle`),
//!   and the VM's resource ID, from which the plugin writes the provider ID as CAPZ does (the
//!   resource group lower-cased).
//! - Entra ID and Azure Resource Manager (HTTPS, `--cloud-ca-bundle`): the signer gets a token
//!   with a client secret (`AZURE_CLIENT_SECRET`, `AZURE_AUTHORITY_HOST`) and reads the VM's
//!   `vmId` with it; ARM refuses any other bearer token. Both are reached at their own names
//!   (`login.microsoftonline.com`, `management.azure.com`) through an egress proxy
//!   (`HTTPS_PROXY`) that logs each host and tunnels to the stand-in.
//!
//! A VM and a scale-set instance join and renew; a document of another VM, a stale document, a
//! document fetched for another challenge, an answer with another key and a replayed answer are
//! refused and claim nothing; ARM unreachable holds a join back until it answers.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use attestation::attestor::ChallengeAnswer;
use attestation::azure::AzureAttestor;
use attestation::names::SIGNER_AZURE;
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope};
use kube::Api;
use serde_json::Value;
use tests::azure::{ArmStandIn, AzurePki, ImdsStandIn, SUBSCRIPTION};
use tests::capi;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const VM0: &str = "b1310a36-d400-46f6-82cb-6217df846586";
const VM_SS: &str = "20835698-65ee-46e6-809f-30dc266e1aed";
const VM1: &str = "ddc87bd2-3ebb-43dc-92a9-90b104cd9527";
const VM2: &str = "9b8e2728-7a37-4a9e-a5d3-a942fd311e2d";
const VM3: &str = "f9cc27a0-2d12-40cf-adc9-7a676efec010";
const OTHER_VM: &str = "11111111-2222-3333-4444-555555555555";

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// The VM `name`'s resource ID as IMDS writes it (the resource group as created, upper-case).
fn resource_id(name: &str) -> String {
    format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/{name}")
}

/// CAPZ's provider ID of `resource_id` (the resource group lower-cased).
fn provider_id(resource_id: &str) -> String {
    format!(
        "azure://{}",
        resource_id.replace("/resourceGroups/CAPZ-RG/", "/resourceGroups/capz-rg/")
    )
}

fn scale_set_resource_id() -> String {
    format!(
        "/subscriptions/{SUBSCRIPTION}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachineScaleSets/pool-0/virtualMachines/3"
    )
}

/// The plugin in exec mode for `node`: the provider ID from IMDS (no flag), IMDS at `imds`.
fn plugin(bootstrap: &Path, cert_dir: &Path, node: &str, imds: &ImdsStandIn) -> Output {
    std::process::Command::new(PLUGIN)
        .args(["--bootstrap-kubeconfig", bootstrap.to_str().unwrap()])
        .args(["--cert-dir", cert_dir.to_str().unwrap()])
        .args(["--node-name", node, "--attestor", "azure", "--timeout", "90s"])
        .env_remove("KUBERNETES_EXEC_INFO")
        .env("AZURE_METADATA_ENDPOINT", imds.endpoint())
        .output()
        .unwrap()
}

fn credential(out: &Output, signer: &Signer) -> Value {
    assert!(
        out.status.success(),
        "the plugin failed: {}\n--- signer log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        signer.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Who the workload apiserver says the ExecCredential's certificate is (strict DER checked).
async fn who(w: &Workload, credential: &Value) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let cert = credential["status"]["clientCertificateData"].as_str().unwrap();
    let key = credential["status"]["clientKeyData"].as_str().unwrap();
    tests::strict_der::assert_strict_der_pem("the plugin's certificate", cert.as_bytes());
    let client = w.node_client("azure-node", cert, key).await;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&kube::api::PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    review.status.unwrap().user_info.unwrap().username.unwrap()
}

fn denied_with(out: &Output, reason: &str, what: &str) {
    assert!(!out.status.success(), "{what}: the plugin succeeded");
    assert!(out.stdout.is_empty(), "{what}: no partial credential");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(reason), "{what}: {stderr}");
}

async fn claim_of(admin: &kube::Client, name: &str, provider_id: &str) -> Option<Value> {
    let machine = live::get(admin, &capi::machine(name, Some(provider_id))).await;
    machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM]
        .as_str()
        .map(|c| serde_json::from_str(c).unwrap())
}

/// CSR `name` once it carries its challenge: (UID, annotation).
async fn challenged(admin: &kube::Client, name: &str, signer: &Signer) -> (String, String) {
    live::wait_annotation(admin, name, attestation::names::ANNOTATION_AZURE_CHALLENGE, signer).await
}

/// A node built in the test: its key, and CSRs filed with worker-`name`'s join token.
struct Node {
    name: String,
    provider_id: String,
    key: NodeKey,
}

impl Node {
    fn new(name: &str, provider_id: &str) -> Self {
        Self {
            name: name.into(),
            provider_id: provider_id.into(),
            key: NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap(),
        }
    }

    /// Files CSR `csr` (phase 1, or answering `answer` with `imds`'s document).
    async fn file(
        &self,
        w: &Workload,
        csr: &str,
        imds: tests::azure::Imds,
        answer: Option<ChallengeAnswer<'_>>,
    ) -> Vec<u8> {
        let params = attestation::request::kubelet_client_params(
            &attestation::identity::NodeName::new(&self.name).unwrap(),
            &attestation::identity::ProviderId::new(&self.provider_id).unwrap(),
        );
        let mut attestor = AzureAttestor::new(imds);
        let envelope = build_envelope(&params, &self.key, &mut attestor, answer).unwrap();
        let request = envelope.encode().into_bytes();
        live::file_csr(
            &w.bootstrap,
            csr,
            SIGNER_AZURE,
            &request,
            &["digital signature", "client auth"],
        )
        .await;
        request
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn azure_vms_and_scale_set_instances_join_and_renew_and_every_bent_answer_is_refused() {
    let env = Envtest::start("envtest_azure");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "azure").await;
    let pki = Arc::new(AzurePki::new(&["eastus.metadata.azure.com", "metadata.azure.com"]));
    let arm = ArmStandIn::start();
    let machines = [
        ("worker-0", resource_id("worker-0"), VM0),
        ("worker-ss-3", scale_set_resource_id(), VM_SS),
        ("worker-1", resource_id("worker-1"), VM1),
        ("worker-2", resource_id("worker-2"), VM2),
        ("worker-3", resource_id("worker-3"), VM3),
    ];
    for (name, rid, vm_id) in &machines {
        apply(
            &admin,
            &capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"),
        )
        .await;
        apply(&admin, &capi::machine(name, Some(&provider_id(rid)))).await;
        arm.add_vm(&provider_id(rid), vm_id);
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("azure-ca.pem");
    std::fs::write(&bundle, pki.bundle_pem()).unwrap();
    let cloud_ca = dir.path().join("cloud-ca.pem");
    std::fs::write(&cloud_ca, arm.ca_pem()).unwrap();
    // Azure Resource Manager and Entra ID at their own names, through an egress proxy that logs
    // the hosts it is asked for and tunnels to the stand-in; the apiservers exempted.
    let egress = tests::connect_proxy::ConnectProxy::start(std::collections::HashMap::from([
        ("management.azure.com:443".to_owned(), arm.address()),
        ("login.microsoftonline.com:443".to_owned(), arm.address()),
    ]));
    let mut env = arm.signer_env();
    env.retain(|(name, _)| name != "AZURE_AUTHORITY_HOST");
    env.extend([
        (
            "AZURE_AUTHORITY_HOST".to_owned(),
            "https://login.microsoftonline.com".to_owned(),
        ),
        ("HTTPS_PROXY".to_owned(), egress.url()),
        ("NO_PROXY".to_owned(), "127.0.0.1,localhost".to_owned()),
    ]);
    let signer = Signer::start_with_env(
        &signer_bin(),
        &w.env,
        &[
            "--azure-ca-bundle",
            bundle.to_str().unwrap(),
            "--azure-arm-endpoint",
            "https://management.azure.com",
            "--cloud-ca-bundle",
            cloud_ca.to_str().unwrap(),
        ],
        env,
    )
    .await;
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let imds = |rid: &str, vm_id: &str| ImdsStandIn::start(pki.clone(), rid, vm_id, SUBSCRIPTION);

    // A VM joins: two CSRs, the provider ID read from IMDS, ARM asked with the signer's token.
    let imds0 = imds(&resource_id("worker-0"), VM0);
    let pki0 = dir.path().join("pki-0");
    let joined = credential(&plugin(&bootstrap, &pki0, "worker-0", &imds0), &signer);
    assert_eq!(who(&w, &joined).await, "system:node:worker-0");
    assert_eq!(imds0.documents(), 1, "one attested document, for the challenge's nonce");
    assert!(arm.tokens() >= 1 && arm.lookups() >= 1, "ARM read with an Entra token");
    let targets = egress.targets();
    assert!(
        targets.contains(&"login.microsoftonline.com:443".to_owned())
            && targets.contains(&"management.azure.com:443".to_owned())
            && targets
                .iter()
                .all(|t| t == "login.microsoftonline.com:443" || t == "management.azure.com:443"),
        "Entra ID and ARM reached through the proxy, by name: {targets:?}"
    );
    assert_eq!(arm.refused(), 0, "the signer's credentials were always good");
    let claim = claim_of(&admin, "worker-0", &provider_id(&resource_id("worker-0")))
        .await
        .unwrap();
    assert_eq!(claim["instance"], format!("azure:{SUBSCRIPTION}/{VM0}"));

    // It renews: both phases again, as the node itself.
    let aging = tests::ca::make_due_for_rotation(
        &w.env.client_ca,
        &pki0,
        "worker-0",
        &provider_id(&resource_id("worker-0")),
    );
    let renewed = credential(&plugin(&bootstrap, &pki0, "worker-0", &imds0), &signer);
    assert_eq!(who(&w, &renewed).await, "system:node:worker-0");
    assert_ne!(
        renewed["status"]["clientCertificateData"].as_str().unwrap(),
        aging,
        "a new certificate"
    );
    assert_eq!(imds0.documents(), 2, "the renewal re-attested");

    // A scale-set instance joins and renews.
    let imds_ss = imds(&scale_set_resource_id(), VM_SS);
    let pki_ss = dir.path().join("pki-ss");
    let joined = credential(&plugin(&bootstrap, &pki_ss, "worker-ss-3", &imds_ss), &signer);
    assert_eq!(who(&w, &joined).await, "system:node:worker-ss-3");
    tests::ca::make_due_for_rotation(
        &w.env.client_ca,
        &pki_ss,
        "worker-ss-3",
        &provider_id(&scale_set_resource_id()),
    );
    let renewed = credential(&plugin(&bootstrap, &pki_ss, "worker-ss-3", &imds_ss), &signer);
    assert_eq!(who(&w, &renewed).await, "system:node:worker-ss-3");
    let claim = claim_of(&admin, "worker-ss-3", &provider_id(&scale_set_resource_id()))
        .await
        .unwrap();
    assert_eq!(claim["instance"], format!("azure:{SUBSCRIPTION}/{VM_SS}"));

    // A document of another VM (IMDS of another machine, the provider ID of worker-1).
    let elsewhere = imds(&resource_id("worker-1"), OTHER_VM);
    let refused = plugin(&bootstrap, &dir.path().join("pki-1"), "worker-1", &elsewhere);
    denied_with(&refused, "AttestationInvalid", "another VM's document");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("another VM's"));
    assert!(
        claim_of(&admin, "worker-1", &provider_id(&resource_id("worker-1")))
            .await
            .is_none()
    );

    // A stale document (created seven hours ago: it expired an hour ago).
    let stale = imds(&resource_id("worker-2"), VM2);
    stale.set_created_offset(-7 * 3600);
    let refused = plugin(&bootstrap, &dir.path().join("pki-2"), "worker-2", &stale);
    denied_with(&refused, "AttestationInvalid", "a stale document");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("expired"));
    assert!(
        claim_of(&admin, "worker-2", &provider_id(&resource_id("worker-2")))
            .await
            .is_none()
    );

    // worker-3, by hand: CSR #1 is challenged; the answer with another key, then a document
    // fetched for another challenge (an earlier nonce), are refused; then ARM is down, and the
    // right answer waits until it is back; replayed under another name it claims nothing more.
    let node = Node::new("worker-3", &provider_id(&resource_id("worker-3")));
    let in_process = |vm_id: &str, nonce: Option<&str>| tests::azure::Imds {
        pki: pki.clone(),
        vm_id: vm_id.into(),
        subscription: SUBSCRIPTION.into(),
        created: time::OffsetDateTime::now_utc(),
        nonce_override: nonce.map(str::to_owned),
        asked: Arc::default(),
    };
    node.file(&w, "w3-first", in_process(VM3, None), None).await;
    let (uid, annotation) = challenged(&w.admin, "w3-first", &signer).await;
    let answer = || ChallengeAnswer {
        csr_name: "w3-first",
        csr_uid: &uid,
        annotation: &annotation,
    };
    let thief = Node::new("worker-3", &provider_id(&resource_id("worker-3")));
    thief
        .file(&w, "w3-other-key", in_process(VM3, None), Some(answer()))
        .await;
    match live::wait_final(&w.admin, "w3-other-key", false, Duration::from_secs(30)).await {
        Final::Denied(reason, message) => assert!(
            reason == "ChallengeFailed" && message.contains("key differs"),
            "{message}"
        ),
        other => panic!("an answer with another key: {other:?}"),
    }
    node.file(
        &w,
        "w3-old-nonce",
        in_process(VM3, Some("20260728-132400")),
        Some(answer()),
    )
    .await;
    match live::wait_final(&w.admin, "w3-old-nonce", false, Duration::from_secs(30)).await {
        Final::Denied(reason, message) => {
            assert!(reason == "ChallengeFailed" && message.contains("nonce"), "{message}")
        }
        other => panic!("a document for another challenge: {other:?}"),
    }
    arm.set_down(true);
    let lookups = arm.lookups();
    let request = node.file(&w, "w3-second", in_process(VM3, None), Some(answer())).await;
    assert_eq!(
        live::wait_final(&w.admin, "w3-second", false, Duration::from_secs(8)).await,
        Final::Pending,
        "ARM down: the answer waits (a transient gap)"
    );
    assert!(arm.lookups() > lookups, "the signer asked ARM, which failed");
    arm.set_down(false);
    match live::wait_final(&w.admin, "w3-second", false, Duration::from_secs(60)).await {
        Final::Issued(_) => {}
        other => panic!("once ARM answers: {other:?}\n{}", signer.log()),
    }
    match live::wait_final(&w.admin, "w3-first", false, Duration::from_secs(20)).await {
        Final::Denied(reason, _) => assert_eq!(reason, "Superseded"),
        other => panic!("CSR #1 after CSR #2: {other:?}"),
    }
    let claimed = claim_of(&admin, "worker-3", &provider_id(&resource_id("worker-3")))
        .await
        .unwrap();
    live::file_csr(
        &w.bootstrap,
        "w3-replayed",
        SIGNER_AZURE,
        &request,
        &["digital signature", "client auth"],
    )
    .await;
    match live::wait_final(&w.admin, "w3-replayed", false, Duration::from_secs(30)).await {
        Final::Denied(..) => {}
        other => panic!("a replayed answer: {other:?}"),
    }
    assert_eq!(
        claim_of(&admin, "worker-3", &provider_id(&resource_id("worker-3")))
            .await
            .unwrap(),
        claimed,
        "the replay changed no claim"
    );
    assert_eq!(arm.refused(), 0);
}
