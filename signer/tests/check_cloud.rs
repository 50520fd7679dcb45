//! `node-attestation-signer check` on cloud CSRs, as an operator judges a real token or document
//! after the fact: at its own `--now`, with Google's keys of that day (`--gcp-jwks-file`) and
//! STS's recorded answer (`--aws-sts-response`). The message names what failed; without the
//! answers and `--offline`, the decision says which call it could not make.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use attestation::attestor::{AttestError, Attestor};
use attestation::identity::{NodeName, ProviderId};
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
use serde_json::Value;
use tests::capi;
use tests::cloud::{AwsIdentityCa, GceInstance, GoogleSigner, document, rsa2048_body};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

fn check(dir: &Path, extra: &[&str]) -> (Option<i32>, Value, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
        .arg("check")
        .args([
            "--csr",
            "csr.pem",
            "--machine",
            "machine.yaml",
            "--cluster",
            "cluster.yaml",
        ])
        .args(["--bootstrap-config", "config.yaml", "--output", "json"])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes worker-0's Machine (`provider_id`), its KubeadmConfig, a Cluster allowing
/// `attestor`, and the CSR `attestor` builds.
fn scene(provider_id: &str, allowed: &str, attestor: &mut dyn Attestor) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, value: &Value| {
        std::fs::write(dir.path().join(name), serde_yaml::to_string(value).unwrap()).unwrap()
    };
    write("machine.yaml", &capi::machine("worker-0", Some(provider_id)));
    write("config.yaml", &capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2"));
    write("cluster.yaml", &capi::cluster(allowed));
    let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let params = kubelet_client_params(
        &NodeName::new("worker-0").unwrap(),
        &ProviderId::new(provider_id).unwrap(),
    );
    let envelope = build_envelope(&params, &key, attestor, None).unwrap();
    std::fs::write(dir.path().join("csr.pem"), envelope.encode()).unwrap();
    dir
}

fn at(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .unwrap()
        .format(&Rfc3339)
        .unwrap()
}

/// A metadata server minting with `signer` at `iat`.
struct Google<'a> {
    signer: &'a GoogleSigner,
    instance: GceInstance,
    iat: i64,
}

impl attestation::gcp::attestor::GceMetadata for Google<'_> {
    fn identity_token(&mut self, audience: &str) -> Result<String, AttestError> {
        Ok(self.signer.current_token(self.instance.claims(audience, self.iat)))
    }
}

#[test]
fn a_gce_token_is_judged_at_its_own_time_with_the_keys_of_that_day() {
    let google = GoogleSigner::new();
    let instance = GceInstance::new("team-a-prod", "europe-west1-b", "4473882541632117237", "worker-0");
    let iat = 1_790_000_000;
    let mut attestor = attestation::gcp::GcpAttestor::new(Google {
        signer: &google,
        instance: instance.clone(),
        iat,
    });
    let dir = scene(&instance.provider_id(), "gcp", &mut attestor);
    std::fs::write(dir.path().join("jwks.json"), google.jwks()).unwrap();

    let (code, report, stderr) = check(dir.path(), &["--gcp-jwks-file", "jwks.json", "--now", &at(iat + 120)]);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    assert_eq!(report["reason"], "AttestedGcpV1");
    assert_eq!(
        report["claim"]["record"]["instance"],
        "gcp:team-a-prod/4473882541632117237"
    );

    // An hour later the same token is stale: the message says it is its age.
    let (code, report, _) = check(dir.path(), &["--gcp-jwks-file", "jwks.json", "--now", &at(iat + 3600)]);
    assert_eq!(code, Some(1));
    assert_eq!(report["reason"], "AttestationInvalid");
    assert!(report["message"].as_str().unwrap().contains("gcp/v1 age"), "{report}");

    // Another day's keys: the kid is unknown, and a file is final.
    std::fs::write(dir.path().join("other.json"), GoogleSigner::new().jwks()).unwrap();
    let (_, report, _) = check(dir.path(), &["--gcp-jwks-file", "other.json", "--now", &at(iat + 120)]);
    assert!(
        report["message"].as_str().unwrap().contains("gcp/v1 signature"),
        "{report}"
    );
}

#[test]
fn offline_the_decision_names_the_call_it_could_not_make() {
    let google = GoogleSigner::new();
    let instance = GceInstance::new("team-a-prod", "europe-west1-b", "4473882541632117237", "worker-0");
    let mut attestor = attestation::gcp::GcpAttestor::new(Google {
        signer: &google,
        instance: instance.clone(),
        iat: OffsetDateTime::now_utc().unix_timestamp(),
    });
    let dir = scene(&instance.provider_id(), "gcp", &mut attestor);
    let (code, report, _) = check(dir.path(), &["--offline"]);
    assert_eq!(code, Some(1));
    assert_eq!(report["decision"], "Retry", "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("Google's keys are not loaded yet"),
        "{report}"
    );
    assert!(report["assumptions"].to_string().contains("--offline"), "{report}");
}

struct Imds(String);

impl attestation::aws::attestor::Ec2Metadata for Imds {
    fn identity_rsa2048(&mut self) -> Result<String, AttestError> {
        Ok(self.0.clone())
    }
    fn role_credentials(&mut self) -> Result<attestation::aws::attestor::RoleCredentials, AttestError> {
        Ok(attestation::aws::attestor::RoleCredentials {
            access_key_id: "ASIATESTTESTTESTTEST".into(),
            secret_access_key: zeroize::Zeroizing::new("secret".into()),
            session_token: zeroize::Zeroizing::new("session".into()),
        })
    }
}

fn signed_long_ago() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_790_000_000)
}

#[test]
fn an_ec2_document_is_judged_with_stss_recorded_answer_and_the_arn_is_named() {
    let ca = AwsIdentityCa::new();
    let id = "i-0123456789abcdef0";
    let pid = format!("aws:///us-east-1a/{id}");
    let rsa2048 = rsa2048_body(&ca.sign_document(&document("123456789012", id, "us-east-1", "us-east-1a")));
    let mut attestor =
        attestation::aws::attestor::AwsAttestor::new(Imds(rsa2048), attestation::aws::StsEndpoints::regional())
            .with_clock(signed_long_ago);
    let dir = scene(&pid, "aws", &mut attestor);
    std::fs::write(dir.path().join("iid.pem"), ca.regions_pem(&["us-east-1"])).unwrap();
    let answer = |arn: &str| {
        format!(
            "<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>{arn}</Arn><UserId>AROA:{id}</UserId><Account>123456789012</Account></GetCallerIdentityResult></GetCallerIdentityResponse>"
        )
    };
    std::fs::write(
        dir.path().join("sts.xml"),
        answer(&format!("arn:aws:sts::123456789012:assumed-role/node-role/{id}")),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("other.xml"),
        answer("arn:aws:sts::123456789012:assumed-role/node-role/i-0fedcba9876543210"),
    )
    .unwrap();
    let now = at(1_790_000_060);
    let base = ["--aws-iid-certificates", "iid.pem", "--now", now.as_str()];

    let (code, report, stderr) = check(dir.path(), &[&base[..], &["--aws-sts-response", "sts.xml"]].concat());
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    assert_eq!(report["reason"], "AttestedAwsV1");
    assert_eq!(report["claim"]["record"]["instance"], format!("aws:123456789012/{id}"));

    let (_, report, _) = check(dir.path(), &[&base[..], &["--aws-sts-response", "other.xml"]].concat());
    assert!(report["message"].as_str().unwrap().contains("aws/v1 ARN"), "{report}");

    // The shipped certificates do not know the test CA: the signature is what failed.
    let (_, report, _) = check(dir.path(), &["--now", now.as_str(), "--aws-sts-response", "sts.xml"]);
    assert!(
        report["message"].as_str().unwrap().contains("aws/v1 signature"),
        "{report}"
    );

    // Offline without STS's answer: pending, naming STS.
    let (code, report, _) = check(dir.path(), &[&base[..], &["--offline"]].concat());
    assert_eq!(code, Some(1));
    assert!(report["message"].as_str().unwrap().contains("asking STS"), "{report}");
}

/// A CSR object as a `certificates.k8s.io/v1` manifest.
fn csr_manifest(csr: &attestation::CsrObject) -> Value {
    use base64::Engine as _;
    serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {
            "name": csr.name, "uid": csr.uid, "annotations": csr.annotations,
            "creationTimestamp": csr.created.unwrap().format(&Rfc3339).unwrap(),
        },
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(&csr.request),
            "signerName": csr.signer_name, "usages": csr.usages,
            "username": csr.username, "groups": csr.groups,
        },
    })
}

/// ARM's JSON for `provider_id`'s VM (as `az vm show` prints it).
fn arm_vm(provider_id: &str, vm_id: &str) -> String {
    let vm = attestation::azure::AzureVm::parse(provider_id).unwrap();
    serde_json::json!({
        "name": "worker-0", "id": vm.resource_id(), "location": "eastus", "type": "Microsoft.Compute/virtualMachines",
        "properties": {"vmId": vm_id, "provisioningState": "Succeeded"},
    })
    .to_string()
}

#[test]
fn an_azure_document_is_judged_with_arms_recorded_answer() {
    use tests::azure;
    let mut world = azure::World::new();
    let key = azure::key();
    let first = world.challenged(&key);
    let imds = world.imds();
    let (second, _) = world.answer(&key, &first, imds);
    let pid = azure::provider_id(azure::NODE);

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    let yaml = |value: &Value| serde_yaml::to_string(value).unwrap();
    write("machine.yaml", yaml(&capi::machine(azure::NODE, Some(&pid))));
    write(
        "config.yaml",
        yaml(&capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2")),
    );
    write("cluster.yaml", yaml(&capi::cluster("azure")));
    write("csr-1.yaml", yaml(&csr_manifest(&first)));
    write("csr.yaml", yaml(&csr_manifest(&second)));
    std::fs::write(dir.path().join("challenge.key"), &world.challenge_key).unwrap();
    write("bundle.pem", world.pki.bundle_pem());
    write("vm.json", arm_vm(&pid, azure::VM_ID));
    write("other-vm.json", arm_vm(&pid, "0e5ac0b5-0000-4000-8000-000000000001"));
    write("worker-1.json", arm_vm(&azure::provider_id("worker-1"), azure::VM_ID));
    write("not-arm.json", "{\"properties\": {}}".into());
    let now = world.now.format(&Rfc3339).unwrap();
    let check = |extra: &[&str]| {
        let out: Output = Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
            .arg("check")
            .args([
                "--csr",
                "csr.yaml",
                "--related-csr",
                "csr-1.yaml",
                "--machine",
                "machine.yaml",
            ])
            .args([
                "--cluster",
                "cluster.yaml",
                "--bootstrap-config",
                "config.yaml",
                "--output",
                "json",
            ])
            .args([
                "--tpm-challenge-key",
                "challenge.key",
                "--azure-ca-bundle",
                "bundle.pem",
            ])
            .args(["--now", now.as_str()])
            .args(extra)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code(),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, report, stderr) = check(&["--azure-vm", "vm.json"]);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    assert_eq!(report["reason"], "AttestedAzureV1");
    assert_eq!(
        report["claim"]["record"]["instance"],
        format!("azure:{}/{}", azure::SUBSCRIPTION, azure::VM_ID)
    );

    // ARM says the VM has another vmId: the document is another VM's.
    let (code, report, _) = check(&["--azure-vm", "other-vm.json"]);
    assert_eq!(code, Some(1));
    assert_eq!(report["reason"], "AttestationInvalid", "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("the document is another VM's"),
        "{report}"
    );

    // ARM's answer for another VM is not taken for this one's.
    let (code, report, _) = check(&["--azure-vm", "worker-1.json"]);
    assert_eq!(code, Some(1));
    assert_eq!(report["decision"], "Retry", "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("--azure-vm is ARM's answer for"),
        "{report}"
    );

    // Without ARM's answer and offline: pending, naming the call.
    let (code, report, _) = check(&["--offline"]);
    assert_eq!(code, Some(1));
    assert_eq!(report["decision"], "Retry", "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("asking Azure Resource Manager for the vmId"),
        "{report}"
    );
    assert!(
        report["assumptions"].to_string().contains("Azure Resource Manager"),
        "{report}"
    );

    // A file that is not ARM's answer for a VM is unusable input.
    let (code, _, stderr) = check(&["--azure-vm", "not-arm.json"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--azure-vm not-arm.json: ARM's answer has no properties.vmId"),
        "{stderr}"
    );

    // Without the synthetic PKI's bundle, Microsoft's: the chain is what fails.
    let out = Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
        .arg("check")
        .args([
            "--csr",
            "csr.yaml",
            "--related-csr",
            "csr-1.yaml",
            "--machine",
            "machine.yaml",
        ])
        .args([
            "--cluster",
            "cluster.yaml",
            "--bootstrap-config",
            "config.yaml",
            "--output",
            "json",
        ])
        .args([
            "--tpm-challenge-key",
            "challenge.key",
            "--azure-vm",
            "vm.json",
            "--now",
            now.as_str(),
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["reason"], "AttestationInvalid", "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("does not chain to the Azure CA bundle"),
        "{report}"
    );
}
