//! `tpm/v1` end to end: a real kube-apiserver (`KUBEBUILDER_ASSETS`), the real signer, the
//! plugin, and a real TPM (swtpm with an EK certificate from `swtpm_localca`). kubectl whose
//! kubeconfig user is the plugin becomes `system:node:worker-0`: CSR #1 is challenged, CSR #2
//! signed, CSR #1 denied `Superseded` and never signed, the claim records the EK. A renewal
//! re-attests through both phases. Skips loudly without the apiserver or swtpm.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::Value;
use tests::capi;
use tests::envtest::Envtest;
use tests::live::{self, Signer, Workload, apply};
use tests::strict_der::assert_strict_der_pem;
use tests::swtpm::{Swtpm, localca_bundle};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const PID: &str = "aws:///us-east-1a/i-tpm0";

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

fn plugin(args: &[String]) -> Output {
    Command::new(PLUGIN)
        .args(args)
        .env_remove("KUBERNETES_EXEC_INFO")
        .output()
        .unwrap()
}

/// The CSRs `requester` filed: (CSR #1, CSR #2) pairs told apart by their DATA's phase, since
/// both are filed within one second.
async fn phases(admin: &kube::Client, requester: &str) -> Vec<CertificateSigningRequest> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut items: Vec<_> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.username.as_deref() == Some(requester))
        .collect();
    items.sort_by_key(|c| {
        let envelope = attestation::envelope::RequestEnvelope::parse(&c.spec.request.0).unwrap();
        attestation::tpm::data::TpmData::parse(envelope.data.as_deref().unwrap())
            .unwrap()
            .phase
    });
    items
}

fn condition(csr: &CertificateSigningRequest, type_: &str) -> Option<String> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

/// A signed CSR's certificate is strict DER.
fn assert_strict_der(csr: &CertificateSigningRequest, what: &str) {
    let certificate = csr.status.as_ref().and_then(|s| s.certificate.as_ref());
    assert_strict_der_pem(what, &certificate.expect("a certificate").0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS (a real kube-apiserver and etcd) and swtpm"]
async fn a_tpm_node_joins_through_both_phases_and_renews_by_attesting_again() {
    let env = Envtest::start("envtest_tpm");
    let tpm = Swtpm::start("envtest_tpm");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "tpm").await;
    apply(&admin, &capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2")).await;
    apply(&admin, &capi::machine("worker-0", Some(PID))).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ek-ca.pem");
    std::fs::write(&bundle, localca_bundle()).unwrap();
    let signer = Signer::start(&signer_bin(), &w.env, &["--tpm-ek-ca-bundle", bundle.to_str().unwrap()]).await;

    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let cert_dir = dir.path().join("pki");
    let flags: Vec<String> = [
        "--bootstrap-kubeconfig",
        bootstrap.to_str().unwrap(),
        "--cert-dir",
        cert_dir.to_str().unwrap(),
        "--node-name",
        "worker-0",
        "--provider-id",
        PID,
        "--attestor",
        "tpm",
        "--tpm-tcti",
        &tpm.tcti,
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
    let kubelet_kubeconfig = live::kubelet_kubeconfig(PLUGIN, &w.env, &flags, dir.path());

    // The join.
    assert_eq!(
        live::whoami(&w.env, &kubelet_kubeconfig, &signer),
        "system:node:worker-0"
    );
    let filed = phases(&w.admin, "system:bootstrap:abcdef").await;
    assert_eq!(filed.len(), 2, "CSR #1 and CSR #2");
    let (one, two) = (&filed[0], &filed[1]);
    assert!(
        one.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(attestation::names::ANNOTATION_TPM_CHALLENGE)),
        "CSR #1 carries the challenge"
    );
    assert!(issued(two), "CSR #2 is signed");
    assert_strict_der(two, "CSR #2's status.certificate");
    assert_strict_der_pem(
        "the plugin's cached certificate",
        &std::fs::read(cert_dir.join("kubelet-client-current.pem")).unwrap(),
    );
    assert_eq!(condition(two, "Approved").as_deref(), Some("AttestedTpmV1"));
    // The signer marks CSR #1 right after signing CSR #2; give it the moment.
    let mut superseded = None;
    for _ in 0..50 {
        let now = phases(&w.admin, "system:bootstrap:abcdef").await;
        superseded = condition(&now[0], "Denied");
        if superseded.is_some() {
            assert!(!issued(&now[0]), "CSR #1 is never signed");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(superseded.as_deref(), Some("Superseded"), "{}", signer.log());
    let machine = live::get(&admin, &capi::machine("worker-0", Some(PID))).await;
    let claim: Value = serde_json::from_str(
        machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        claim["ekSHA256"].as_str().map(str::len),
        Some(64),
        "the claim records the EK: {claim}"
    );

    // Renewal: the certificate is due (a node certificate near its end, same key), and the
    // node, as itself, attests again through both phases.
    let aging = tests::ca::make_due_for_rotation(&w.env.client_ca, &cert_dir, "worker-0", PID);
    let renewed = plugin(&flags);
    assert!(
        renewed.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&renewed.stderr),
        signer.log()
    );
    let answered: Value = serde_json::from_slice(&renewed.stdout).unwrap();
    assert_ne!(
        answered["status"]["clientCertificateData"].as_str().unwrap(),
        aging,
        "the renewed certificate is answered"
    );
    let after = phases(&w.admin, "system:node:worker-0").await;
    assert_eq!(after.len(), 2, "the renewal's two phases, filed as the node");
    assert!(issued(&after[1]), "the renewal's CSR #2 is signed");
    assert_strict_der(&after[1], "the renewal's CSR #2's status.certificate");
    assert_strict_der_pem(
        "the renewed certificate",
        answered["status"]["clientCertificateData"].as_str().unwrap().as_bytes(),
    );
    assert!(!issued(&after[0]), "the renewal's CSR #1 is not");
    let renewed_claim = live::get(&admin, &capi::machine("worker-0", Some(PID))).await;
    assert_eq!(
        renewed_claim["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM],
        machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM],
        "a renewal keeps the claim"
    );
}

/// A node's TPM, key and name, driving the two phases by hand so the test can rotate the key
/// between them.
struct TpmNode {
    attestor: attestation::tpm::attestor::TpmAttestor,
    key: attestation::request::NodeKey,
    name: &'static str,
    pid: &'static str,
}

impl TpmNode {
    fn new(tpm: &Swtpm, name: &'static str, pid: &'static str) -> Self {
        Self {
            attestor: attestation::tpm::attestor::TpmAttestor::new(&tpm.tcti).unwrap(),
            key: attestation::request::NodeKey::generate(attestation::request::KeyAlgorithm::EcdsaP256).unwrap(),
            name,
            pid,
        }
    }

    /// Files `csr` for phase 1 (`answer` None) or phase 2.
    async fn file(&mut self, w: &Workload, csr: &str, answer: Option<attestation::attestor::ChallengeAnswer<'_>>) {
        let params = attestation::request::kubelet_client_params(
            &attestation::identity::NodeName::new(self.name).unwrap(),
            &attestation::identity::ProviderId::new(self.pid).unwrap(),
        );
        let envelope = attestation::request::build_envelope(&params, &self.key, &mut self.attestor, answer).unwrap();
        live::file_csr(
            &w.bootstrap,
            csr,
            attestation::names::SIGNER_TPM,
            envelope.encode().as_bytes(),
            &["digital signature", "client auth"],
        )
        .await;
    }
}

/// CSR `name` once it carries its challenge: (UID, annotation).
async fn challenged(admin: &kube::Client, name: &str, signer: &Signer) -> (String, String) {
    live::wait_annotation(admin, name, attestation::names::ANNOTATION_TPM_CHALLENGE, signer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS (a real kube-apiserver and etcd) and swtpm"]
async fn replicas_follow_a_rotated_challenge_key_and_pending_challenges_survive_it() {
    use k8s_openapi::api::core::v1::Secret;
    let env = Envtest::start("envtest_tpm_rotation");
    let (tpm0, tpm1) = (Swtpm::start("envtest_tpm_rot0"), Swtpm::start("envtest_tpm_rot1"));
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, "tpm").await;
    const PID1: &str = "aws:///us-east-1a/i-tpm1";
    for (name, pid) in [("worker-0", PID), ("worker-1", PID1)] {
        apply(
            &admin,
            &capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"),
        )
        .await;
        apply(&admin, &capi::machine(name, Some(pid))).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ek-ca.pem");
    std::fs::write(&bundle, localca_bundle()).unwrap();
    let flags = ["--leader-elect=false", "--tpm-ek-ca-bundle", bundle.to_str().unwrap()];
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "node-attestation-system");
    let key_secret = "node-attestation-signer-tpm-challenge";

    // Replica A alone challenges worker-0's CSR #1 under the first key.
    let mut a = Signer::start(&signer_bin(), &w.env, &flags).await;
    let mut node0 = TpmNode::new(&tpm0, "worker-0", PID);
    node0.file(&w, "w0-first", None).await;
    let (uid0, annotation0) = challenged(&w.admin, "w0-first", &a).await;
    let first_key = secrets.get(key_secret).await.unwrap().data.unwrap()["key"].clone();

    // The operator deletes the Secret; replica B starts and creates a new key. A, still
    // running, follows it and records the key it replaced beside it.
    secrets.delete(key_secret, &Default::default()).await.unwrap();
    let mut b = Signer::start(&signer_bin(), &w.env, &flags).await;
    let mut recorded = None;
    for _ in 0..300 {
        if let Ok(secret) = secrets.get(key_secret).await
            && let Some(data) = secret.data
            && data.contains_key("previous")
        {
            recorded = Some(data);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let recorded = recorded.unwrap_or_else(|| panic!("the replaced key was never recorded\n{}", a.log()));
    assert_ne!(recorded["key"], first_key, "a new key");
    assert_eq!(recorded["previous"], first_key, "the replaced key, recorded");

    // B stops; A alone challenges worker-1 under the new key (it follows the Secret).
    b.kill();
    let mut node1 = TpmNode::new(&tpm1, "worker-1", PID1);
    node1.file(&w, "w1-first", None).await;
    let (uid1, annotation1) = challenged(&w.admin, "w1-first", &a).await;

    // A stops; B, which never held the first key, decides both answers: worker-0's challenge
    // of the replaced key (from the Secret's record) and worker-1's of the new one.
    a.kill();
    b.restart();
    for (node, csr, first, uid, annotation) in [
        (&mut node0, "w0-second", "w0-first", &uid0, &annotation0),
        (&mut node1, "w1-second", "w1-first", &uid1, &annotation1),
    ] {
        let answer = attestation::attestor::ChallengeAnswer {
            csr_name: first,
            csr_uid: uid,
            annotation,
        };
        node.file(&w, csr, Some(answer)).await;
        match live::wait_final(&w.admin, csr, false, std::time::Duration::from_secs(30)).await {
            live::Final::Issued(_) => {}
            other => panic!("{csr}: {other:?}\n{}", b.log()),
        }
    }
    for first in ["w0-first", "w1-first"] {
        match live::wait_final(&w.admin, first, false, std::time::Duration::from_secs(10)).await {
            live::Final::Denied(reason, _) => assert_eq!(reason, "Superseded", "{first}"),
            other => panic!("{first}: {other:?}\n{}", b.log()),
        }
    }
    assert!(
        b.log().contains("the tpm/v1 challenge key changed"),
        "A logged the rotation"
    );
}
