//! `kubelet-authenticator csr`: a complete envelope on stdout, the key beside it, 0600.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;

fn csr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"))
        .arg("csr")
        .args(args)
        .output()
        .expect("run kubelet-authenticator")
}

#[test]
fn prints_a_signed_envelope_for_the_node_and_keeps_the_key_private() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    for key_type in ["ecdsa-p256", "ecdsa-p384", "rsa2048", "ed25519"] {
        let output = csr(&[
            "--node-name",
            "worker-0",
            "--provider-id",
            "aws:///us-east-1a/i-0abc",
            "--attestor",
            "insecure",
            "--key-out",
            key.to_str().unwrap(),
            "--key-type",
            key_type,
        ]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let envelope = RequestEnvelope::parse(&output.stdout).unwrap();
        assert_eq!(
            envelope.provider.as_ref().map(ToString::to_string).as_deref(),
            Some("insecure/v1")
        );
        assert!(envelope.data.is_none());
        let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
        parsed.verify_signature().unwrap();
        let extension = parsed.provider_id_extensions().next().unwrap();
        assert_eq!(
            ProviderId::from_extension_value(&extension.value).unwrap().as_str(),
            "aws:///us-east-1a/i-0abc"
        );
        let cn: Vec<_> = parsed.common_names().filter_map(|a| a.value.clone()).collect();
        assert_eq!(cn, ["system:node:worker-0"]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let key_pem = std::fs::read_to_string(&key).unwrap();
        let pair = rcgen::KeyPair::from_pem(&key_pem).unwrap();
        assert_eq!(
            rcgen::PublicKeyData::der_bytes(&pair),
            parsed.public_key.as_slice(),
            "{key_type}: the key on disk is the CSR's"
        );
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("PRIVATE KEY"),
            "the key never goes to stdout"
        );
    }
}

#[test]
fn invalid_names_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let output = csr(&[
        "--node-name",
        "Worker_0",
        "--provider-id",
        "aws:///x",
        "--attestor",
        "insecure",
        "--key-out",
        key.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("DNS-1123"));
    assert!(output.stdout.is_empty());
    assert!(!key.exists());
}

/// A loopback stand-in for a cloud metadata service: answers each request (read up to its
/// empty line: the plugin's requests carry no body) with `answer(request line)`, and keeps
/// every request's head.
struct MetadataStandIn {
    address: String,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl MetadataStandIn {
    fn start(answer: fn(&str) -> Vec<u8>) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = std::sync::Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let reply = answer(head.lines().next().unwrap_or_default());
                recorded.lock().unwrap().push(head);
                let _ = stream.write_all(&reply);
            }
        });
        Self { address, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn http_answer(status: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const CLOUD_ENV: [&str; 4] = [
    "GCE_METADATA_HOST",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "AWS_ENDPOINT_URL_STS",
    "AZURE_METADATA_ENDPOINT",
];

fn csr_with_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"));
    command.arg("csr").args(args);
    for name in CLOUD_ENV {
        command.env_remove(name);
    }
    command
        .envs(env.iter().copied())
        .output()
        .expect("run kubelet-authenticator")
}

const GCE_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJ4In0.c2lnbmF0dXJl";

#[test]
fn the_gcp_attestor_asks_the_metadata_server_of_gce_metadata_host_for_a_token_bound_to_the_key() {
    let stand_in = MetadataStandIn::start(|_| http_answer("200 OK", "Metadata-Flavor: Google\r\n", GCE_TOKEN));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let output = csr_with_env(
        &[
            "--node-name",
            "worker-0",
            "--provider-id",
            "gce://project/europe-west1-b/worker-0",
            "--attestor",
            "gcp",
            "--key-out",
            key.to_str().unwrap(),
        ],
        &[("GCE_METADATA_HOST", &stand_in.address)],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(attestation::names::SIGNER_GCP), "{stderr}");
    let envelope = RequestEnvelope::parse(&output.stdout).unwrap();
    assert_eq!(
        envelope.provider.as_ref().map(ToString::to_string).as_deref(),
        Some("gcp/v1")
    );
    let data = attestation::gcp::GcpData::parse(envelope.data.as_deref().unwrap()).unwrap();
    assert_eq!(data.identity_token, GCE_TOKEN);

    let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
    let audience = attestation::gcp::audience(&parsed.spki_der);
    let requests = stand_in.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(
        requests[0].starts_with(&format!(
            "GET /computeMetadata/v1/instance/service-accounts/default/identity?audience={}&format=full HTTP/1.1\r\n",
            audience.replace('/', "%2F")
        )),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].contains("\r\nMetadata-Flavor: Google\r\n"),
        "{}",
        requests[0]
    );
}

#[test]
fn an_unreachable_metadata_server_fails_the_csr_with_nothing_written() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let output = csr_with_env(
        &[
            "--node-name",
            "worker-0",
            "--provider-id",
            "gce://project/europe-west1-b/worker-0",
            "--attestor",
            "gcp",
            "--key-out",
            key.to_str().unwrap(),
        ],
        &[("GCE_METADATA_HOST", &format!("127.0.0.1:{port}"))],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "the GCE metadata server at http://127.0.0.1:{port} is unreachable"
        )),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    assert!(!key.exists());
}

const RSA2048: &str = include_str!("../../testdata/aws/vssm-us-east-1.p7b.b64");

#[test]
fn the_aws_attestor_signs_a_request_the_signer_accepts_from_imdsv2_answers() {
    let stand_in = MetadataStandIn::start(|line| match line.split(' ').take(2).collect::<Vec<_>>()[..] {
        ["PUT", "/latest/api/token"] => http_answer("200 OK", "", "SESSION-TOKEN"),
        ["GET", "/latest/dynamic/instance-identity/rsa2048"] => http_answer("200 OK", "", RSA2048),
        ["GET", "/latest/meta-data/iam/security-credentials/"] => http_answer("200 OK", "", "kubelet-node"),
        ["GET", "/latest/meta-data/iam/security-credentials/kubelet-node"] => http_answer(
            "200 OK",
            "",
            r#"{"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "c2VjcmV0", "Token": "dG9rZW4=", "Expiration": "2099-01-01T00:00:00Z"}"#,
        ),
        _ => http_answer("404 Not Found", "", ""),
    });
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let sts = "http://127.0.0.1:9/sts/{region}";
    let output = csr_with_env(
        &[
            "--node-name",
            "worker-0",
            "--provider-id",
            "aws:///us-east-1e/i-055950b9cfbce0ce3",
            "--attestor",
            "aws",
            "--key-out",
            key.to_str().unwrap(),
        ],
        &[
            (
                "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                &format!("http://{}/", stand_in.address),
            ),
            ("AWS_ENDPOINT_URL_STS", sts),
        ],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains(attestation::names::SIGNER_AWS));
    let envelope = RequestEnvelope::parse(&output.stdout).unwrap();
    assert_eq!(
        envelope.provider.as_ref().map(ToString::to_string).as_deref(),
        Some("aws/v1")
    );
    let data = attestation::aws::AwsData::parse(envelope.data.as_deref().unwrap()).unwrap();
    assert_eq!(data.rsa2048, RSA2048, "the PKCS#7 as served");

    let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
    let binding = attestation::cloud::binding(&parsed.spki_der);
    let endpoints = attestation::aws::StsEndpoints::from_template(sts).unwrap();
    let call = data
        .sts
        .to_call(&attestation::aws::sts::CallChecks {
            region: "us-east-1",
            binding: &binding,
            endpoints: &endpoints,
            now: time::OffsetDateTime::now_utc(),
            max_age: time::Duration::minutes(10),
        })
        .unwrap();
    // The path the node signed, with its `/`: the signer posts there.
    assert_eq!(call.url, "http://127.0.0.1:9/sts/us-east-1/");

    let requests = stand_in.requests();
    let lines: Vec<&str> = requests.iter().filter_map(|r| r.lines().next()).collect();
    assert_eq!(
        lines,
        [
            "PUT /latest/api/token HTTP/1.1",
            "GET /latest/dynamic/instance-identity/rsa2048 HTTP/1.1",
            "GET /latest/meta-data/iam/security-credentials/ HTTP/1.1",
            "GET /latest/meta-data/iam/security-credentials/kubelet-node HTTP/1.1",
        ]
    );
    for get in &requests[1..] {
        assert!(get.contains("\r\nX-aws-ec2-metadata-token: SESSION-TOKEN\r\n"), "{get}");
    }
}

#[test]
fn the_azure_attestor_prints_csr_1_asking_for_a_challenge_without_asking_imds() {
    // Every request answered 500: phase 1 must make none.
    let stand_in = MetadataStandIn::start(|_| http_answer("500 Internal Server Error", "", ""));
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kubelet.key");
    let provider_id = "azure:///subscriptions/8a205152-b25a-417f-a676-80465535a6c9/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/worker-0";
    let args = [
        "--node-name",
        "worker-0",
        "--provider-id",
        provider_id,
        "--attestor",
        "azure",
        "--key-out",
        key.to_str().unwrap(),
    ];
    let output = csr_with_env(
        &args,
        &[("AZURE_METADATA_ENDPOINT", &format!("http://{}/", stand_in.address))],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(attestation::names::SIGNER_AZURE), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "this is CSR #1 of azure/v1: the signer answers it with a challenge in the annotation {}",
            attestation::names::ANNOTATION_AZURE_CHALLENGE
        )),
        "{stderr}"
    );
    let envelope = RequestEnvelope::parse(&output.stdout).unwrap();
    assert_eq!(
        envelope.provider.as_ref().map(ToString::to_string).as_deref(),
        Some("azure/v1")
    );
    let data = envelope.data.as_deref().unwrap();
    assert_eq!(data, br#"{"phase":1}"#, "DATA is phase 1, nothing else");
    assert_eq!(
        attestation::azure::AzureData::parse(data).unwrap(),
        attestation::azure::AzureData::phase_one()
    );
    let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
    parsed.verify_signature().unwrap();
    let extension = parsed.provider_id_extensions().next().unwrap();
    assert_eq!(
        ProviderId::from_extension_value(&extension.value).unwrap().as_str(),
        provider_id
    );
    assert!(stand_in.requests().is_empty(), "{:?}", stand_in.requests());

    // The setting is read all the same: a wrong one is said before anything is written.
    std::fs::remove_file(&key).unwrap();
    let output = csr_with_env(&args, &[("AZURE_METADATA_ENDPOINT", "https://169.254.169.254/")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("AZURE_METADATA_ENDPOINT \"https://169.254.169.254/\": not an http:// URL"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    assert!(!key.exists());
}
