//! `gcp/v1` and `aws/v1` end to end on a real kube-apiserver (`KUBEBUILDER_ASSETS`) with the
//! real signer and the real plugin, the clouds' services stood in for on loopback:
//!
//! - GCE: a metadata server that mints identity tokens with a test RSA key (the plugin reaches
//!   it through `GCE_METADATA_HOST`), the signer fetching the matching JWKS at Google's own URL
//!   through an egress proxy (`HTTPS_PROXY`) that logs the host and tunnels to a loopback
//!   stand-in (`--cloud-ca-bundle`). A node joins, its key is rotated at Google, and its
//!   renewal makes the signer fetch the keys again; a stale token is refused.
//! - EC2: an IMDSv2 stand-in serving an identity document signed by a test CA (given to the
//!   signer as `--aws-iid-certificates`) and the instance role's credentials, which come from
//!   an `AssumeRole` in moto's STS (PyPI `moto[server]`, authentication on) whose session name
//!   is the instance ID; the signer replays the node's signed request to moto. A node joins and
//!   renews; a request signed by another principal, one signed with a wrong secret (moto
//!   refuses it) and one replayed after the window are refused, and none of them claims the
//!   Machine.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;
use tests::capi;
use tests::cloud::{
    AwsIdentityCa, GceInstance, GceMetadataStandIn, GoogleSigner, ImdsV2StandIn, JwksServer, document, rsa2048_body,
};
use tests::connect_proxy::ConnectProxy;
use tests::envtest::Envtest;
use tests::live::{self, Signer, Workload, apply};
use tests::moto::{ACCOUNT, Moto};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// The plugin in exec mode for `node`, with `env` (the metadata endpoints) set for it alone.
fn plugin(
    bootstrap: &Path,
    cert_dir: &Path,
    node: &str,
    provider_id: &str,
    attestor: &str,
    env: &[(&str, String)],
) -> Output {
    tests::cloud::plugin_exec(Path::new(PLUGIN), bootstrap, cert_dir, node, provider_id, attestor, env)
}

/// The username the workload apiserver sees for the ExecCredential the plugin printed.
async fn who(w: &Workload, out: &Output, signer: &Signer) -> String {
    assert!(
        out.status.success(),
        "the plugin failed: {}\n--- signer log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        signer.log()
    );
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cert = credential["status"]["clientCertificateData"].as_str().unwrap();
    let key = credential["status"]["clientKeyData"].as_str().unwrap();
    tests::strict_der::assert_strict_der_pem("the plugin's certificate", cert.as_bytes());
    let client = w.node_client("cloud-node", cert, key).await;
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    review.status.unwrap().user_info.unwrap().username.unwrap()
}

/// The certificate of the ExecCredential the plugin printed.
fn certificate_of(out: &Output) -> String {
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    credential["status"]["clientCertificateData"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The claim on Machine `name`, as JSON.
async fn claim_of(admin: &kube::Client, name: &str, provider_id: &str) -> Option<Value> {
    let machine = live::get(admin, &capi::machine(name, Some(provider_id))).await;
    machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM]
        .as_str()
        .map(|c| serde_json::from_str(c).unwrap())
}

fn denied_with(out: &Output, reason: &str, what: &str) {
    assert!(!out.status.success(), "{what}: the plugin succeeded");
    assert!(out.stdout.is_empty(), "{what}: no partial credential");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(reason), "{what}: {stderr}");
}

async fn workload(name: &str, attestors: &str) -> (kube::Client, Workload) {
    let env = Envtest::start(name);
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, attestors).await;
    (admin, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_gce_node_joins_with_its_identity_token_and_renews_across_a_google_key_rotation() {
    let (admin, w) = workload("envtest_cloud_gcp", "gcp").await;
    let worker0 = GceInstance::new("team-a-prod", "europe-west1-b", "4473882541632117237", "worker-0");
    let worker1 = GceInstance::new("team-a-prod", "europe-west1-b", "5581923371298830011", "worker-1");
    for (name, instance) in [("worker-0", &worker0), ("worker-1", &worker1)] {
        apply(
            &admin,
            &capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"),
        )
        .await;
        apply(&admin, &capi::machine(name, Some(&instance.provider_id()))).await;
    }
    let google = Arc::new(Mutex::new(GoogleSigner::new()));
    let jwks = JwksServer::start(google.clone());
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("jwks-ca.pem");
    std::fs::write(&ca, jwks.ca_pem()).unwrap();
    // The signer's egress goes through a proxy (HTTPS_PROXY, as a management cluster without
    // direct Internet access has it), which sees the host it is asked for and tunnels to the
    // stand-in of Google's keys; the signer's TLS runs end to end with it under Google's name.
    let egress = ConnectProxy::start(HashMap::from([("www.googleapis.com:443".to_owned(), jwks.address())]));
    let signer = Signer::start_with_env(
        &signer_bin(),
        &w.env,
        &[
            "--gcp-jwks-url",
            "https://www.googleapis.com/oauth2/v3/certs",
            "--cloud-ca-bundle",
            ca.to_str().unwrap(),
        ],
        vec![
            ("HTTPS_PROXY".to_owned(), egress.url()),
            ("NO_PROXY".to_owned(), "127.0.0.1,localhost".to_owned()),
        ],
    )
    .await;
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let metadata = GceMetadataStandIn::start(google.clone(), worker0.clone());
    let gce = [("GCE_METADATA_HOST", metadata.host())];
    let pki = dir.path().join("pki-0");

    // Join: the token's audience binds the CSR key; the signer fetches Google's keys on first need.
    let joined = plugin(&bootstrap, &pki, "worker-0", &worker0.provider_id(), "gcp", &gce);
    assert_eq!(who(&w, &joined, &signer).await, "system:node:worker-0");
    assert_eq!(metadata.tokens(), 1);
    assert!(metadata.audiences()[0].starts_with("node-attestation.cluster.x-k8s.io/"));
    assert_eq!(jwks.fetches(), 1, "Google's keys fetched once, on the first gcp/v1 CSR");
    assert_eq!(
        egress.targets(),
        ["www.googleapis.com:443"],
        "Google's keys fetched through the proxy, by name"
    );
    let claim = claim_of(&admin, "worker-0", &worker0.provider_id()).await.unwrap();
    assert_eq!(claim["instance"], "gcp:team-a-prod/4473882541632117237");

    // Google rotates its key; the renewal's token names the new kid: the signer fetches again.
    let new_kid = google.lock().unwrap().rotate();
    let aging = tests::ca::make_due_for_rotation(&w.env.client_ca, &pki, "worker-0", &worker0.provider_id());
    let renewed = plugin(&bootstrap, &pki, "worker-0", &worker0.provider_id(), "gcp", &gce);
    assert_eq!(who(&w, &renewed, &signer).await, "system:node:worker-0");
    assert_ne!(
        certificate_of(&renewed),
        aging,
        "a new certificate, not the aging one answered after a failed renewal: {}",
        String::from_utf8_lossy(&renewed.stderr)
    );
    assert_eq!(metadata.tokens(), 2, "the renewal re-attested");
    assert!(
        jwks.fetches() >= 2,
        "the unknown kid {new_kid} made the signer fetch the keys again\n--- plugin ---\n{}\n--- signer ---\n{}",
        String::from_utf8_lossy(&renewed.stderr),
        signer.log()
    );

    assert!(
        egress.targets().len() >= 2 && egress.targets().iter().all(|t| t == "www.googleapis.com:443"),
        "every fetch through the proxy: {:?}",
        egress.targets()
    );

    // A stale token (an hour old) for worker-1: refused, and worker-1 stays unclaimed.
    let stale = GceMetadataStandIn::start(google.clone(), worker1.clone());
    stale.set_iat_offset(-3600);
    let refused = plugin(
        &bootstrap,
        &dir.path().join("pki-1"),
        "worker-1",
        &worker1.provider_id(),
        "gcp",
        &[("GCE_METADATA_HOST", stale.host())],
    );
    denied_with(&refused, "AttestationInvalid", "a stale token");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("age"));
    assert!(claim_of(&admin, "worker-1", &worker1.provider_id()).await.is_none());
}

/// IMDS for a CSR built in the test (no HTTP): a document and credentials.
struct Imds(String, tests::moto::Session);

impl attestation::aws::attestor::Ec2Metadata for Imds {
    fn identity_rsa2048(&mut self) -> Result<String, attestation::attestor::AttestError> {
        Ok(self.0.clone())
    }
    fn role_credentials(
        &mut self,
    ) -> Result<attestation::aws::attestor::RoleCredentials, attestation::attestor::AttestError> {
        Ok(attestation::aws::attestor::RoleCredentials {
            access_key_id: self.1.access_key_id.clone(),
            secret_access_key: zeroize::Zeroizing::new(self.1.secret_access_key.clone()),
            session_token: zeroize::Zeroizing::new(self.1.session_token.clone()),
        })
    }
}

fn twenty_minutes_ago() -> std::time::SystemTime {
    std::time::SystemTime::now() - Duration::from_secs(20 * 60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS and moto_server: a real kube-apiserver, etcd and moto's STS"]
async fn an_ec2_node_joins_through_moto_sts_and_requests_of_other_principals_or_times_are_refused() {
    let (admin, w) = workload("envtest_cloud_aws", "aws").await;
    let dir = tempfile::tempdir().unwrap();
    // The role, and the instance-profile sessions EC2 would hand each instance.
    let mut moto = Moto::start(6, &w.env.dir().join("moto.log"));
    moto.create_role(capi::AWS_NODE_ROLE);
    let (id0, id1, other) = ("i-0123456789abcdef0", "i-0aaaabbbbccccdddd", "i-0fedcba9876543210");
    let session0 = moto.assume_role(capi::AWS_NODE_ROLE, id0);
    let session1 = moto.assume_role(capi::AWS_NODE_ROLE, id1);
    let session_other = moto.assume_role(capi::AWS_NODE_ROLE, other);
    // A role the Cluster does not name, assumed with worker-1's instance ID as session name.
    moto.create_role("unrelated-role");
    let forged_session = moto.assume_role("unrelated-role", id1);
    let pid = |id: &str| format!("aws:///us-east-1a/{id}");
    for (name, id) in [("worker-0", id0), ("worker-1", id1)] {
        apply(
            &admin,
            &capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"),
        )
        .await;
        apply(&admin, &capi::machine(name, Some(&pid(id)))).await;
    }
    let ca = AwsIdentityCa::new();
    let certificates = dir.path().join("aws-iid.pem");
    std::fs::write(&certificates, ca.regions_pem(&["us-east-1"])).unwrap();
    let signer = Signer::start(
        &signer_bin(),
        &w.env,
        &[
            "--aws-iid-certificates",
            certificates.to_str().unwrap(),
            "--aws-sts-endpoint",
            &moto.endpoint(),
        ],
    )
    .await;
    let bootstrap = w.env.bootstrap_kubeconfig(live::TOKEN);
    let signed = |id: &str| rsa2048_body(&ca.sign_document(&document(ACCOUNT, id, "us-east-1", "us-east-1a")));
    fn creds(s: &tests::moto::Session) -> (&str, &str, &str) {
        (&s.access_key_id, &s.secret_access_key, &s.session_token)
    }
    let imds0 = ImdsV2StandIn::start(signed(id0), capi::AWS_NODE_ROLE, creds(&session0));
    let env0 = [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds0.endpoint()),
        ("AWS_ENDPOINT_URL_STS", moto.endpoint()),
    ];
    let pki = dir.path().join("pki-0");

    // Join, then renew: moto verifies each signed request and names the instance's session.
    let joined = plugin(&bootstrap, &pki, "worker-0", &pid(id0), "aws", &env0);
    assert_eq!(who(&w, &joined, &signer).await, "system:node:worker-0");
    let claim = claim_of(&admin, "worker-0", &pid(id0)).await.unwrap();
    assert_eq!(claim["instance"], format!("aws:{ACCOUNT}/{id0}"));
    let aging = tests::ca::make_due_for_rotation(&w.env.client_ca, &pki, "worker-0", &pid(id0));
    let renewed = plugin(&bootstrap, &pki, "worker-0", &pid(id0), "aws", &env0);
    assert_eq!(who(&w, &renewed, &signer).await, "system:node:worker-0");
    assert_ne!(certificate_of(&renewed), aging, "a new certificate");

    // worker-1's document with another instance's session: STS names the other principal.
    let imds1 = ImdsV2StandIn::start(signed(id1), capi::AWS_NODE_ROLE, creds(&session_other));
    let env1 = [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds1.endpoint()),
        ("AWS_ENDPOINT_URL_STS", moto.endpoint()),
    ];
    let other_principal = plugin(
        &bootstrap,
        &dir.path().join("pki-1a"),
        "worker-1",
        &pid(id1),
        "aws",
        &env1,
    );
    denied_with(
        &other_principal,
        "AttestationInvalid",
        "a request signed by another principal",
    );
    assert!(String::from_utf8_lossy(&other_principal.stderr).contains(other));

    // The review's forgery: any principal allowed to assume some role picks the session name.
    // A session of an unrelated role named after worker-1's instance, worker-1's document, a
    // request bound to the forger's key: STS vouches for the session, the role is not the
    // Cluster's (kubelet-aws-roles), and nothing is claimed.
    imds1.set_credentials(creds(&forged_session));
    let unrelated = plugin(
        &bootstrap,
        &dir.path().join("pki-1r"),
        "worker-1",
        &pid(id1),
        "aws",
        &env1,
    );
    denied_with(
        &unrelated,
        "AttestationInvalid",
        "a session of a role the Cluster does not name",
    );
    assert!(String::from_utf8_lossy(&unrelated.stderr).contains("unrelated-role"));

    // Signed with a wrong secret: moto refuses the signature.
    let (a, _, c) = creds(&session1);
    imds1.set_credentials((a, "wrong-secret-wrong-secret-wrong-secret00", c));
    let forged = plugin(
        &bootstrap,
        &dir.path().join("pki-1b"),
        "worker-1",
        &pid(id1),
        "aws",
        &env1,
    );
    denied_with(&forged, "SignatureDoesNotMatch", "a request with a forged signature");

    // A correctly signed request, 20 minutes old: moto would take it; the signer does not.
    let key = attestation::request::NodeKey::generate(attestation::request::KeyAlgorithm::EcdsaP256).unwrap();
    let mut attestor = attestation::aws::attestor::AwsAttestor::new(
        Imds(signed(id1), session1.clone()),
        attestation::aws::StsEndpoints::from_template(&moto.endpoint()).unwrap(),
    )
    .with_clock(twenty_minutes_ago);
    let params = attestation::request::kubelet_client_params(
        &attestation::identity::NodeName::new("worker-1").unwrap(),
        &attestation::identity::ProviderId::new(&pid(id1)).unwrap(),
    );
    let envelope = attestation::request::build_envelope(&params, &key, &mut attestor, None).unwrap();
    live::file_csr(
        &w.bootstrap,
        "replayed-after-the-window",
        attestation::names::SIGNER_AWS,
        envelope.encode().as_bytes(),
        &["digital signature", "client auth"],
    )
    .await;
    match live::wait_final(&w.admin, "replayed-after-the-window", false, Duration::from_secs(30)).await {
        live::Final::Denied(reason, message) => {
            assert_eq!(reason, "AttestationInvalid", "{message}");
            assert!(message.contains("age"), "{message}");
        }
        other => panic!("a replay after the window: {other:?}\n{}", signer.log()),
    }
    assert!(
        claim_of(&admin, "worker-1", &pid(id1)).await.is_none(),
        "no attack claimed worker-1"
    );

    // worker-1 with its own session joins.
    imds1.set_credentials(creds(&session1));
    let joined1 = plugin(
        &bootstrap,
        &dir.path().join("pki-1c"),
        "worker-1",
        &pid(id1),
        "aws",
        &env1,
    );
    assert_eq!(who(&w, &joined1, &signer).await, "system:node:worker-1");
}
