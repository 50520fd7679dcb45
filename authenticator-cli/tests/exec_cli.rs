//! Exec mode without a cluster: the errors a person acts on, the old certificate answered when
//! renewal fails, and a foreign cache file refused. Every failure leaves stdout empty. A fake
//! apiserver (plain HTTP, below) that denies or issues every CSR drives the backoff after a
//! denial end to end.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tests::ca::{CaKeyFormat, node_certificate, openssl_ca};
use time::{Duration, OffsetDateTime};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const PID: &str = "aws:///us-east-1a/i-0abc";

fn plugin(bootstrap: &Path, cert_dir: &Path, extra: &[&str], exec_info: Option<&str>) -> Output {
    let mut command = Command::new(PLUGIN);
    command.args([
        "--bootstrap-kubeconfig",
        bootstrap.to_str().unwrap(),
        "--cert-dir",
        cert_dir.to_str().unwrap(),
    ]);
    command.args(["--node-name", "worker-0", "--timeout", "5s"]);
    for (flag, default) in [("--provider-id", PID), ("--attestor", "insecure")] {
        if !extra.contains(&flag) {
            command.args([flag, default]);
        }
    }
    command.args(extra);
    match exec_info {
        Some(info) => command.env("KUBERNETES_EXEC_INFO", info),
        None => command.env_remove("KUBERNETES_EXEC_INFO"),
    };
    command.output().unwrap()
}

/// A bootstrap kubeconfig whose apiserver refuses connections.
fn unreachable_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("bootstrap.conf");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
    )
    .unwrap();
    path
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn status_creates_nothing_and_a_provider_id_file_it_cannot_read_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    let status = |extra: &[&str]| {
        Command::new(PLUGIN)
            .args([
                "--cert-dir",
                cert_dir.to_str().unwrap(),
                "--node-name",
                "worker-0",
                "--attestor",
                "insecure",
            ])
            .args(extra)
            .arg("status")
            .env_remove("KUBERNETES_EXEC_INFO")
            .output()
            .unwrap()
    };
    let out = status(&["--provider-id", PID]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("none yet"), "{text}");
    assert!(!cert_dir.exists(), "status created the cert dir");
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with("cert dir:")
            && first.contains(cert_dir.to_str().unwrap())
            && first.contains("does not exist"),
        "status says the cert dir does not exist: {text}"
    );
    let out = status(&["--provider-id-file", "/nope"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a provider ID file that cannot be read exits 1, as every failure does: {}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("cannot read the provider ID file /nope (--provider-id-file): No such file"),
        "{}",
        stderr(&out)
    );
    // The flag after the subcommand: clap's usage error (exit 2), whose usage line says where
    // the flags go.
    let after = Command::new(PLUGIN)
        .args(["status", "--provider-id-file", "/nope"])
        .output()
        .unwrap();
    assert_eq!(after.status.code(), Some(2));
    assert!(
        stderr(&after).contains("kubelet-authenticator [OPTIONS] status"),
        "{}",
        stderr(&after)
    );

    // Its times are RFC 3339.
    std::fs::create_dir_all(&cert_dir).unwrap();
    store_due_certificate(&cert_dir);
    let out = status(&["--provider-id", PID]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for field in ["not before:", "not after:", "rotation at:"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field}: {text}"));
        let value = line[field.len()..].split_whitespace().next().unwrap();
        OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{field} {value:?} is not RFC 3339 ({e}): {text}"));
    }
}

#[test]
fn the_help_says_the_bare_command_is_the_exec_plugin() {
    let help = |flag: &str| {
        let out = Command::new(PLUGIN).arg(flag).output().unwrap();
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        (help.split_whitespace().collect::<Vec<_>>().join(" "), help)
    };
    let (flat, long) = help("--help");
    assert!(
        flat.contains("Without a subcommand it is the client-go exec credential plugin"),
        "{long}"
    );
    assert!(flat.contains("(exec mode: what kubelet runs)"), "{long}");
    let (flat, short) = help("-h");
    assert!(
        flat.contains("Without a subcommand: the client-go exec credential plugin kubelet runs"),
        "{short}"
    );
}

#[test]
fn a_missing_bootstrap_kubeconfig_or_unreachable_apiserver_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = plugin(&dir.path().join("nope.conf"), &dir.path().join("pki"), &[], None);
    assert!(!missing.status.success());
    assert!(missing.stdout.is_empty());
    assert!(
        stderr(&missing).contains("--bootstrap-kubeconfig"),
        "{}",
        stderr(&missing)
    );

    let bootstrap = unreachable_kubeconfig(dir.path());
    let down = plugin(&bootstrap, &dir.path().join("pki"), &[], None);
    assert!(!down.status.success());
    assert!(down.stdout.is_empty());
    assert!(stderr(&down).contains("unreachable"), "{}", stderr(&down));
    let status = plugin(&bootstrap, &dir.path().join("pki"), &["status"], None);
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(text.contains("unreachable"), "status shows the last error");
    // Its time too is RFC 3339.
    let line = text.lines().find(|l| l.starts_with("last error:")).unwrap();
    let at = line["last error:".len()..].trim_start().split(": ").next().unwrap();
    OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("last error's time {at:?} is not RFC 3339 ({e}): {text}"));
}

/// The OS's text for ENOENT, as Rust prints an `io::Error` of it.
fn no_such_file() -> String {
    std::io::Error::from_raw_os_error(2).to_string()
}

#[test]
fn a_missing_kubeconfig_or_ca_file_is_named_once_with_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("x.conf");
    let path = missing.to_str().unwrap();
    let exec = plugin(&missing, &dir.path().join("pki"), &[], None);
    let render = Command::new(PLUGIN)
        .args(["--bootstrap-kubeconfig", path, "kubeconfig"])
        .output()
        .unwrap();
    for out in [&exec, &render] {
        let text = stderr(out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert_eq!(text.matches(path).count(), 1, "the path once: {text}");
        assert!(!text.contains('"'), "the path is not debug-quoted: {text}");
        assert_eq!(text.matches(&no_such_file()).count(), 1, "the cause once: {text}");
        assert!(
            text.contains(&format!(
                "cannot read the bootstrap kubeconfig {path} (--bootstrap-kubeconfig)"
            )),
            "{text}"
        );
    }

    // A CA file the kubeconfig names, missing: kube's own error nests the OS error three deep.
    let ca = dir.path().join("ca.crt");
    let bootstrap = dir.path().join("bootstrap.conf");
    std::fs::write(
        &bootstrap,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            ca.display()
        ),
    )
    .unwrap();
    let out = plugin(&bootstrap, &dir.path().join("pki"), &[], None);
    let text = stderr(&out);
    assert!(!out.status.success());
    assert_eq!(text.matches(ca.to_str().unwrap()).count(), 1, "{text}");
    assert!(!text.contains('"'), "{text}");
    assert_eq!(text.matches(&no_such_file()).count(), 1, "{text}");
    assert!(
        text.contains(&format!("cannot read the certificate authority {}", ca.display())),
        "{text}"
    );
}

#[test]
fn an_unreachable_apiserver_is_named_with_its_url_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    // A loopback port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let bootstrap = dir.path().join("bootstrap.conf");
    std::fs::write(
        &bootstrap,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let cert_dir = dir.path().join("pki");
    let out = plugin(&bootstrap, &cert_dir, &[], None);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(out.stdout.is_empty());
    assert!(
        text.contains(&format!("filing the CSR: the workload apiserver {url} is unreachable")),
        "the URL: {text}"
    );
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let refused_os = std::io::Error::from_raw_os_error(111).to_string();
    assert!(
        text.contains(&refused_os) || text.contains(&refused.to_string()),
        "the cause: {text}"
    );
    let status = plugin(&bootstrap, &cert_dir, &["status"], None);
    let last = String::from_utf8_lossy(&status.stdout).into_owned();
    let line = last.lines().find(|l| l.starts_with("last error:")).unwrap();
    assert!(line.contains(&url) && line.contains(&refused_os), "{last}");
}

/// `--attestor tpm` without a TPM: no tpm2-tss log lines before the plugin's own message,
/// which names the device and the OS error once.
#[cfg(feature = "tpm")]
#[test]
fn a_missing_tpm_device_is_said_once_without_the_tpm_librarys_log() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let device = dir.path().join("tpmrm0");
    let tcti = format!("device:{}", device.display());
    let out = plugin(
        &bootstrap,
        &dir.path().join("pki"),
        &["--attestor", "tpm", "--tpm-tcti", &tcti],
        None,
    );
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(out.stdout.is_empty());
    assert!(!text.contains("ERROR:"), "tpm2-tss is never loaded: {text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains(&format!(
            "--attestor tpm: no TPM at {} (--tpm-tcti {tcti}): {}",
            device.display(),
            no_such_file()
        )),
        "{text}"
    );
}

/// A TCTI tpm2-tss itself fails to open (a swtpm nobody listens for): its own `ERROR:` lines
/// are explained after the message, unless the operator set `TSS2_LOG`, which silences them.
#[cfg(feature = "tpm")]
#[test]
fn tpm_library_log_lines_are_explained_and_tss2_log_silences_them() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcti = format!("swtpm:host=127.0.0.1,port={port}");
    let run = |tss2_log: Option<&str>| {
        let mut command = Command::new(PLUGIN);
        command
            .args(["--bootstrap-kubeconfig", bootstrap.to_str().unwrap()])
            .args(["--cert-dir", dir.path().join("pki").to_str().unwrap()])
            .args(["--node-name", "worker-0", "--provider-id", PID, "--timeout", "5s"])
            .args(["--attestor", "tpm", "--tpm-tcti", &tcti])
            .env_remove("KUBERNETES_EXEC_INFO");
        match tss2_log {
            Some(value) => command.env("TSS2_LOG", value),
            None => command.env_remove("TSS2_LOG"),
        };
        command.output().unwrap()
    };
    let plain = run(None);
    let text = stderr(&plain);
    assert_eq!(plain.status.code(), Some(1), "{text}");
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("kubelet-authenticator: "), "{text}");
    assert!(last.contains("TSS2_LOG=all+none"), "the lines are explained: {text}");

    let quiet = run(Some("all+none"));
    let text = stderr(&quiet);
    assert_eq!(quiet.status.code(), Some(1), "{text}");
    assert!(!text.contains("ERROR:"), "{text}");
    assert!(!text.contains("TSS2_LOG"), "no hint when the operator chose: {text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

/// Stores worker-0's certificate 95% through its life (due for renewal, still valid) as the
/// current one in `cert_dir`; returns its PEM.
fn store_due_certificate(cert_dir: &Path) -> String {
    let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let now = OffsetDateTime::now_utc();
    let due = node_certificate(
        &ca,
        &key,
        "worker-0",
        PID,
        now - Duration::hours(19),
        now + Duration::hours(1),
    );
    std::fs::write(cert_dir.join("kubelet-client-current.pem"), format!("{due}{key}")).unwrap();
    due
}

#[test]
fn a_failed_renewal_answers_the_still_valid_certificate_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let due = store_due_certificate(&cert_dir);
    let bootstrap = unreachable_kubeconfig(dir.path());
    let out = plugin(&bootstrap, &cert_dir, &[], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(credential["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        due.trim()
    );
    assert!(stderr(&out).contains("renewal failed"), "{}", stderr(&out));

    // The same file for another Machine's provider ID is not this node's: refused, not answered.
    let other = plugin(
        &bootstrap,
        &cert_dir,
        &["--provider-id", "aws:///us-east-1a/i-other"],
        None,
    );
    assert!(!other.status.success());
    assert!(other.stdout.is_empty());
    assert!(
        stderr(&other).contains("ignoring the cached certificate"),
        "{}",
        stderr(&other)
    );
}

#[test]
fn unusable_exec_info_and_an_absent_tpm_are_errors_not_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let alpha = plugin(
        &bootstrap,
        &dir.path().join("pki"),
        &[],
        Some(r#"{"apiVersion":"client.authentication.k8s.io/v1alpha1","kind":"ExecCredential"}"#),
    );
    assert!(!alpha.status.success());
    assert!(alpha.stdout.is_empty());
    assert!(stderr(&alpha).contains("v1alpha1"), "{}", stderr(&alpha));
    let tpm = plugin(&bootstrap, &dir.path().join("pki"), &["--attestor", "tpm"], None);
    assert!(!tpm.status.success());
    assert!(tpm.stdout.is_empty());
    assert!(stderr(&tpm).contains("tpm"), "{}", stderr(&tpm));
}

/// What the fake apiserver answers for every CSR filed with it.
#[derive(Clone, Copy)]
enum Verdict {
    /// `Denied` with this reason.
    Deny(&'static str),
    /// Issued: a certificate for the CSR's key, subject and provider ID, signed by a test CA.
    Issue,
    /// A CSR whose DATA is phase 1 gets the annotation (name, value) and stays pending, as a
    /// two-phase provider's CSR #1 does; any other is issued.
    Challenge(&'static str, &'static str),
}

/// One CSR filed with the fake apiserver.
#[derive(Debug, Clone)]
struct Filed {
    /// The name the fake gave it.
    name: String,
    /// Filed with a bearer token (the bootstrap kubeconfig's user); without one, the client
    /// authenticated with its certificate (a renewal as the node).
    bootstrap_token: bool,
    /// `spec.signerName`.
    signer: String,
    /// `spec.request`: the envelope.
    request: Vec<u8>,
}

/// A stand-in for the workload apiserver, plain HTTP on a loopback port: it takes CSRs and
/// answers the watch's first list of each with the verdict. Enough for exec mode's file-and-wait
/// (the signer's checks are the envtest suites' business); it records what was filed and how.
struct FakeApiserver {
    kubeconfig: std::path::PathBuf,
    filed: std::sync::Arc<std::sync::Mutex<Vec<Filed>>>,
    verdict: std::sync::Arc<std::sync::Mutex<Verdict>>,
}

impl FakeApiserver {
    fn start(dir: &Path, verdict: Verdict) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let kubeconfig = dir.join("fake-bootstrap.conf");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
            ),
        )
        .unwrap();
        let filed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let verdict = std::sync::Arc::new(std::sync::Mutex::new(verdict));
        let (seen, answer) = (filed.clone(), verdict.clone());
        let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
        std::thread::spawn(move || {
            let mut csrs: Vec<Value> = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some((head, body)) = read_request(&mut stream) else {
                    continue;
                };
                let line = head.lines().next().unwrap_or_default().to_owned();
                let bearer = head.to_ascii_lowercase().contains("\nauthorization: bearer ");
                let (status, response) = if line.starts_with("POST ") {
                    let mut csr: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let name = format!("node-csr-fake-{}", csrs.len());
                    csr["metadata"] =
                        serde_json::json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"});
                    let request = envelope_of(&csr);
                    seen.lock().unwrap().push(Filed {
                        name,
                        bootstrap_token: bearer,
                        signer: csr["spec"]["signerName"].as_str().unwrap_or_default().to_owned(),
                        request: request.clone(),
                    });
                    let mut decided = csr.clone();
                    match *answer.lock().unwrap() {
                        Verdict::Deny(reason) => {
                            decided["status"] = serde_json::json!({"conditions": [{
                            "type": "Denied", "status": "True", "reason": reason,
                            "message": format!("fake apiserver says {reason}"),
                            "lastUpdateTime": "2026-01-01T00:00:00Z"}]});
                        }
                        Verdict::Challenge(annotation, value) if phase(&request) == Some(1) => {
                            decided["metadata"]["annotations"] = serde_json::json!({ annotation: value });
                        }
                        Verdict::Issue | Verdict::Challenge(..) => {
                            decided["status"] = serde_json::json!({"certificate": issue(&ca, &csr)});
                        }
                    }
                    csrs.push(decided);
                    ("201 Created", csr)
                } else if line.starts_with("GET ") && !line.contains("watch=") {
                    let items: Vec<&Value> = csrs
                        .iter()
                        .filter(|c| {
                            c["metadata"]["name"].as_str().is_some_and(|n| {
                                line.contains(&format!("metadata.name%3D{n} "))
                                    || line.contains(&format!("metadata.name%3D{n}&"))
                            })
                        })
                        .collect();
                    (
                        "200 OK",
                        serde_json::json!({
                        "apiVersion": "certificates.k8s.io/v1",
                        "kind": "CertificateSigningRequestList",
                        "metadata": {"resourceVersion": "1"},
                        "items": items}),
                    )
                } else {
                    // A watch after the list: nothing more to say.
                    ("200 OK", Value::Null)
                };
                let body = if response.is_null() {
                    String::new()
                } else {
                    response.to_string()
                };
                let _ = std::io::Write::write_all(
                    &mut stream,
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Self {
            kubeconfig,
            filed,
            verdict,
        }
    }

    fn filed(&self) -> Vec<Filed> {
        self.filed.lock().unwrap().clone()
    }

    fn answer(&self, verdict: Verdict) {
        *self.verdict.lock().unwrap() = verdict;
    }
}

/// The head (as text) and body of one HTTP/1.1 request.
fn read_request(stream: &mut std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    use std::io::Read;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

/// The envelope of a filed CSR (`spec.request`, base64 in JSON).
fn envelope_of(csr: &Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap_or_default())
        .unwrap_or_default()
}

/// The `phase` of an envelope's DATA block, for the two-phase providers.
fn phase(envelope: &[u8]) -> Option<u64> {
    let envelope = attestation::envelope::RequestEnvelope::parse(envelope).ok()?;
    serde_json::from_slice::<Value>(envelope.data.as_deref()?).ok()?["phase"].as_u64()
}

/// A certificate for the filed CSR's key and provider ID, as the signer would issue it (base64
/// of the PEM, as `status.certificate` travels).
fn issue(ca: &tests::ca::TestCa, csr: &Value) -> String {
    use base64::Engine;
    use x509_parser::prelude::FromDer;
    let b64 = base64::engine::general_purpose::STANDARD;
    let request = envelope_of(csr);
    let envelope = attestation::envelope::RequestEnvelope::parse(&request).unwrap();
    let provider_id = attestation::csr::ParsedCsr::from_der(&envelope.csr_der)
        .unwrap()
        .provider_id_extensions()
        .next()
        .map(|extension| {
            attestation::identity::ProviderId::from_extension_value(&extension.value)
                .unwrap()
                .as_str()
                .to_owned()
        })
        .unwrap_or_else(|| PID.to_owned());
    let (_, parsed) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&envelope.csr_der).unwrap();
    let spki = rcgen::SubjectPublicKeyInfo::from_der(parsed.certification_request_info.subject_pki.raw).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:worker-0");
    params.custom_extensions.push(rcgen::CustomExtension::from_oid_content(
        attestation::names::PROVIDER_ID_OID,
        attestation::identity::ProviderId::new(&provider_id)
            .unwrap()
            .to_extension_value(),
    ));
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::hours(24);
    let cert = params.signed_by(&spki, &tests::ca::issuer(ca)).unwrap();
    b64.encode(cert.pem())
}

fn backoff_record(cert_dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(cert_dir.join("kubelet-authenticator-backoff")).unwrap()).unwrap()
}

/// Moves the backoff's end into the past, as if its delay had been waited out.
fn end_backoff(cert_dir: &Path) {
    let mut record = backoff_record(cert_dir);
    record["retryAt"] = "2000-01-01T00:00:00Z".into();
    std::fs::write(cert_dir.join("kubelet-authenticator-backoff"), record.to_string()).unwrap();
}

#[test]
fn a_denial_backs_off_files_nothing_while_it_lasts_and_doubles_when_denied_again() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    let api = FakeApiserver::start(dir.path(), Verdict::Deny("MachineAlreadyClaimed"));

    let denied = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(!denied.status.success());
    assert!(denied.stdout.is_empty(), "no partial credential");
    assert!(
        stderr(&denied).contains("denied: MachineAlreadyClaimed") && stderr(&denied).contains("no new CSR before"),
        "{}",
        stderr(&denied)
    );
    assert_eq!(api.filed().len(), 1);
    let record = backoff_record(&cert_dir);
    assert_eq!(record["denials"], 1);
    assert_eq!(record["reason"], "MachineAlreadyClaimed");
    assert_eq!(record["csr"], "node-csr-fake-0");
    assert_eq!(api.filed()[0].name, "node-csr-fake-0");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(cert_dir.join("kubelet-authenticator-backoff"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // kubelet calls again at once, and again: nothing is filed, the reason is repeated.
    for _ in 0..3 {
        let held = plugin(&api.kubeconfig, &cert_dir, &[], None);
        assert!(!held.status.success());
        assert!(held.stdout.is_empty());
        assert!(
            stderr(&held).contains("backing off") && stderr(&held).contains("MachineAlreadyClaimed"),
            "{}",
            stderr(&held)
        );
    }
    assert_eq!(api.filed().len(), 1, "no CSR while backing off");
    let status = plugin(&api.kubeconfig, &cert_dir, &["status"], None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("backoff:       1 denial in a row") && text.contains("next CSR:      not before"),
        "{text}"
    );
    // status names the attestor, the denial, and what to ask the management side.
    assert!(text.contains("attestor:      insecure/v1"), "{text}");
    assert!(
        text.contains("last denial:   ") && text.contains("CSR node-csr-fake-0 Denied (MachineAlreadyClaimed)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "node-attestation-signer explain --provider-id {PID} --node worker-0"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "node-attestation-signer explain --provider-id {PID} node-csr-fake-0"
        )),
        "{text}"
    );

    // The delay passes (the record says so): one CSR, denied again, twice the delay.
    end_backoff(&cert_dir);
    let again = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(!again.status.success());
    assert_eq!(api.filed().len(), 2);
    let record = backoff_record(&cert_dir);
    assert_eq!(record["denials"], 2);
    let denied_at = OffsetDateTime::parse(
        record["deniedAt"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let retry_at = OffsetDateTime::parse(
        record["retryAt"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let delay = retry_at - denied_at;
    assert!(
        delay >= Duration::seconds(47) && delay <= Duration::seconds(60),
        "{delay}"
    );

    // Other flags are another request: the record does not hold them back.
    let signer = plugin(
        &api.kubeconfig,
        &cert_dir,
        &["--signer-name", "example.com/other"],
        None,
    );
    assert!(!signer.status.success());
    assert_eq!(api.filed().len(), 3, "a changed configuration is tried at once");

    // Issued at last: answered, and the backoff is gone.
    api.answer(Verdict::Issue);
    end_backoff(&cert_dir);
    let issued = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(issued.status.success(), "{}", stderr(&issued));
    let credential: Value = serde_json::from_slice(&issued.stdout).unwrap();
    assert!(
        credential["status"]["clientCertificateData"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    assert!(!cert_dir.join("kubelet-authenticator-backoff").exists());
    // The last denial outlives the backoff, and status says it is behind the node now.
    let status = plugin(&api.kubeconfig, &cert_dir, &["status"], None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("backoff:       none"), "{text}");
    assert!(
        text.contains("(a certificate was issued since): CSR node-csr-fake-"),
        "{text}"
    );
    assert!(
        api.filed().iter().all(|f| f.bootstrap_token),
        "no certificate yet: every CSR was a bootstrap"
    );
}

#[test]
fn while_backing_off_a_still_valid_certificate_is_answered_until_the_delay_ends() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let api = FakeApiserver::start(dir.path(), Verdict::Deny("EndorsementKeyMismatch"));
    let due = store_due_certificate(&cert_dir);

    // The renewal is denied: the old certificate is answered, held until the delay ends.
    let denied = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(denied.status.success(), "{}", stderr(&denied));
    assert!(
        stderr(&denied).contains("EndorsementKeyMismatch"),
        "{}",
        stderr(&denied)
    );
    assert_eq!(api.filed().len(), 1);
    assert!(!api.filed()[0].bootstrap_token, "a renewal, as the node");
    let credential: Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        due.trim()
    );
    let record = backoff_record(&cert_dir);
    assert_eq!(
        credential["status"]["expirationTimestamp"], record["retryAt"],
        "client-go calls again when the delay ends, not before"
    );

    let held = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(held.status.success(), "{}", stderr(&held));
    assert!(stderr(&held).contains("backing off"), "{}", stderr(&held));
    let again: Value = serde_json::from_slice(&held.stdout).unwrap();
    assert_eq!(again["status"], credential["status"]);
    assert_eq!(api.filed().len(), 1, "nothing filed while backing off");
}

#[test]
fn a_corrupt_or_implausible_backoff_record_is_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let api = FakeApiserver::start(dir.path(), Verdict::Deny("MachineNotFound"));
    let file = cert_dir.join("kubelet-authenticator-backoff");

    std::fs::write(&file, "{\"denials\": \"many\"").unwrap();
    let status = plugin(&api.kubeconfig, &cert_dir, &["status"], None);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("backoff:       ignored, not a record"),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    let corrupt = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(
        stderr(&corrupt).contains("ignoring the backoff record"),
        "{}",
        stderr(&corrupt)
    );
    assert_eq!(api.filed().len(), 1, "treated as absent: one CSR");
    assert_eq!(backoff_record(&cert_dir)["denials"], 1, "and a fresh record");

    // A record from the future (the clock moved back): not believed beyond the cap.
    let mut record = backoff_record(&cert_dir);
    record["retryAt"] = "2999-01-01T00:00:00Z".into();
    record["denials"] = 7.into();
    std::fs::write(&file, record.to_string()).unwrap();
    let future = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(stderr(&future).contains("beyond the"), "{}", stderr(&future));
    assert_eq!(api.filed().len(), 2);
    assert_eq!(backoff_record(&cert_dir)["denials"], 8, "still consecutive");
}

/// What kube-controller-manager issues when kubelet's own rotation renews: the node's subject,
/// no provider-ID extension.
fn kcm_certificate(
    ca: &tests::ca::TestCa,
    key_pem: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> String {
    let key = rcgen::KeyPair::from_pem(key_pem).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:worker-0");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    params.signed_by(&key, &tests::ca::issuer(ca)).unwrap().pem()
}

#[test]
fn a_certificate_kubelets_rotation_wrote_is_reported_and_renewed_as_the_node_never_bootstrapped() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let api = FakeApiserver::start(dir.path(), Verdict::Deny("EndorsementKeyMismatch"));
    let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let now = OffsetDateTime::now_utc();
    // Fresh: a year to go, far from any rotation point. Still not answered as if it were ours.
    let kcm = kcm_certificate(&ca, &key, now - Duration::minutes(5), now + Duration::days(365));
    std::fs::write(cert_dir.join("kubelet-client-kcm.pem"), format!("{kcm}{key}")).unwrap();
    std::os::unix::fs::symlink("kubelet-client-kcm.pem", cert_dir.join("kubelet-client-current.pem")).unwrap();

    let status = plugin(&api.kubeconfig, &cert_dir, &["status"], None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("FOREIGN: not obtained by kubelet-authenticator")
            && text.contains("--rotate-certificates=false")
            && text.contains("the next call renews with it as the node's identity"),
        "{text}"
    );

    // The renewal is denied: said loudly, the foreign certificate answered until the backoff ends.
    let denied = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(denied.status.success(), "{}", stderr(&denied));
    let err = stderr(&denied);
    assert!(
        err.contains("WARNING")
            && err.contains("not obtained by kubelet-authenticator")
            && err.contains("--rotate-certificates=false"),
        "{err}"
    );
    assert!(err.contains("EndorsementKeyMismatch"), "{err}");
    let filed = api.filed();
    assert_eq!(filed.len(), 1);
    assert!(!filed[0].bootstrap_token, "a renewal as the node, not a bootstrap");
    let credential: Value = serde_json::from_slice(&denied.stdout).unwrap();
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        kcm.trim()
    );
    assert_eq!(
        credential["status"]["expirationTimestamp"],
        backoff_record(&cert_dir)["retryAt"]
    );

    let held = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(held.status.success(), "{}", stderr(&held));
    assert!(
        stderr(&held).contains("not obtained by kubelet-authenticator"),
        "said on every call"
    );
    assert_eq!(api.filed().len(), 1, "backing off");

    // Renewed: replaced, said so, and `status` keeps the note.
    api.answer(Verdict::Issue);
    end_backoff(&cert_dir);
    let renewed = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(renewed.status.success(), "{}", stderr(&renewed));
    assert!(
        stderr(&renewed).contains("replaced the certificate it did not obtain"),
        "{}",
        stderr(&renewed)
    );
    assert!(api.filed().iter().all(|f| !f.bootstrap_token), "never a bootstrap");
    let credential: Value = serde_json::from_slice(&renewed.stdout).unwrap();
    assert_ne!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        kcm.trim()
    );
    let cached = plugin(&api.kubeconfig, &cert_dir, &[], None);
    assert!(cached.status.success());
    assert!(
        stderr(&cached).is_empty(),
        "ours now: answered from the cache: {}",
        stderr(&cached)
    );
    assert_eq!(api.filed().len(), 2);
    let status = plugin(&api.kubeconfig, &cert_dir, &["status"], None);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("cached, answered at once")
            && text.contains("replaced:")
            && text.contains("--rotate-certificates=false"),
        "{text}"
    );
}

#[test]
fn a_foreign_certificate_answered_after_a_failed_renewal_is_asked_for_again_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let now = OffsetDateTime::now_utc();
    let kcm = kcm_certificate(&ca, &key, now - Duration::minutes(5), now + Duration::days(365));
    std::fs::write(cert_dir.join("kubelet-client-current.pem"), format!("{kcm}{key}")).unwrap();
    let out = plugin(&unreachable_kubeconfig(dir.path()), &cert_dir, &[], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("renewal failed") && stderr(&out).contains("unreachable"),
        "{}",
        stderr(&out)
    );
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        kcm.trim()
    );
    let expires = OffsetDateTime::parse(
        credential["status"]["expirationTimestamp"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    // Asked for again after an unanswered renewal's first retry delay (a minute), not held
    // until its own rotation point, months away.
    assert!(
        expires <= OffsetDateTime::now_utc() + Duration::seconds(61),
        "not held until its own rotation point, months away: {expires}"
    );
    assert!(
        !cert_dir.join("kubelet-authenticator-backoff").exists(),
        "no denial, no backoff"
    );
}

#[test]
fn a_renewal_finds_the_apiserver_in_the_exec_info_once_the_bootstrap_kubeconfig_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();
    let api = FakeApiserver::start(dir.path(), Verdict::Issue);
    let server = std::fs::read_to_string(&api.kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .unwrap();
    let due = store_due_certificate(&cert_dir);
    // What kubeadm join leaves: no bootstrap kubeconfig.
    let gone = dir.path().join("bootstrap-kubelet.conf");

    // Without cluster info the renewal has nowhere to go: the old certificate is answered and
    // stderr says what to set.
    let blind = plugin(&gone, &cert_dir, &[], None);
    assert!(blind.status.success(), "{}", stderr(&blind));
    assert!(stderr(&blind).contains("provideClusterInfo"), "{}", stderr(&blind));
    assert!(api.filed().is_empty());

    // With kubelet's kubeconfig's cluster in KUBERNETES_EXEC_INFO it renews, as the node.
    let info = format!(
        r#"{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{{"interactive":false,"cluster":{{"server":"{server}"}}}}}}"#
    );
    let renewed = plugin(&gone, &cert_dir, &[], Some(&info));
    assert!(renewed.status.success(), "{}", stderr(&renewed));
    let filed = api.filed();
    assert_eq!(filed.len(), 1, "{}", stderr(&renewed));
    assert!(!filed[0].bootstrap_token, "a renewal, as the node");
    let answer: serde_json::Value = serde_json::from_slice(&renewed.stdout).unwrap();
    assert_ne!(
        answer["status"]["clientCertificateData"].as_str().unwrap().trim(),
        due.trim(),
        "the renewed certificate is answered, not the due one"
    );
}

/// Azure's instance metadata service on loopback: the VM's resource ID, and attested documents
/// signed by a synthetic Microsoft PKI (`tests::azure`) over the nonce each request asks with.
struct AzureImdsStandIn {
    address: String,
    pki: std::sync::Arc<tests::azure::AzurePki>,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl AzureImdsStandIn {
    fn start(resource_id: &'static str) -> Self {
        let pki = std::sync::Arc::new(tests::azure::AzurePki::new(&[
            "eastus.metadata.azure.com",
            "metadata.azure.com",
        ]));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (signer, recorded) = (pki.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some((head, _)) = read_request(&mut stream) else {
                    continue;
                };
                let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let (status, body) = if target.starts_with("/metadata/instance/compute/resourceId?") {
                    ("200 OK", resource_id.to_owned())
                } else if let Some(query) = target.strip_prefix("/metadata/attested/document?") {
                    let nonce = query
                        .split('&')
                        .find_map(|pair| pair.strip_prefix("nonce="))
                        .unwrap_or_default();
                    let statement = tests::azure::statement(
                        nonce,
                        tests::azure::VM_ID,
                        tests::azure::SUBSCRIPTION,
                        OffsetDateTime::now_utc(),
                    );
                    let document =
                        serde_json::json!({"encoding": "pkcs7", "signature": signer.sign_base64(&statement)});
                    ("200 OK", document.to_string())
                } else {
                    ("404 Not Found", String::new())
                };
                recorded.lock().unwrap().push(head);
                let _ = std::io::Write::write_all(
                    &mut stream,
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Self { address, pki, requests }
    }

    /// The request lines.
    fn lines(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|head| head.lines().next().unwrap_or_default().to_owned())
            .collect()
    }
}

/// The nonce of the fake signer's challenge (32 letters and digits, as the signer's are).
const AZURE_NONCE: &str = "NonceOfTheFakeSignersChallenge01";

#[test]
fn azure_answers_the_challenge_on_csr_1_with_csr_2_and_finds_its_provider_id_at_imds() {
    use attestation::azure::AzureData;
    use attestation::envelope::RequestEnvelope;
    use attestation::names::{ANNOTATION_AZURE_CHALLENGE, SIGNER_AZURE};

    const RESOURCE_ID: &str = "/subscriptions/8a205152-b25a-417f-a676-80465535a6c9/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/worker-0";
    let challenge =
        format!(r#"{{"issuedAt":"2026-01-01T00:00:00Z","nonce":"{AZURE_NONCE}","mac":"bm90IGNoZWNrZWQ="}}"#);
    let challenge: &'static str = Box::leak(challenge.into_boxed_str());
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    let api = FakeApiserver::start(dir.path(), Verdict::Challenge(ANNOTATION_AZURE_CHALLENGE, challenge));
    let imds = AzureImdsStandIn::start(RESOURCE_ID);
    // No --provider-id: the VM's, from IMDS.
    let run = || {
        Command::new(PLUGIN)
            .args(["--bootstrap-kubeconfig", api.kubeconfig.to_str().unwrap()])
            .args(["--cert-dir", cert_dir.to_str().unwrap()])
            .args(["--node-name", "worker-0", "--timeout", "30s", "--attestor", "azure"])
            .env("AZURE_METADATA_ENDPOINT", format!("http://{}/", imds.address))
            .env_remove("KUBERNETES_EXEC_INFO")
            .env_remove("KUBELET_AUTHENTICATOR_PROVIDER_ID")
            .env_remove("KUBELET_AUTHENTICATOR_PROVIDER_ID_FILE")
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        credential["status"]["clientCertificateData"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );

    // IMDS: the resource ID, then the document for the challenge's nonce; Metadata: true each.
    assert_eq!(
        imds.lines(),
        [
            "GET /metadata/instance/compute/resourceId?api-version=2021-02-01&format=text HTTP/1.1".to_owned(),
            format!("GET /metadata/attested/document?api-version=2021-02-01&nonce={AZURE_NONCE} HTTP/1.1"),
        ]
    );
    assert!(
        imds.requests
            .lock()
            .unwrap()
            .iter()
            .all(|head| head.contains("\r\nMetadata: true\r\n"))
    );

    // Two CSRs to the azure signer, one key, the provider ID as CAPZ writes it.
    let filed = api.filed();
    assert_eq!(filed.len(), 2, "{filed:?}");
    let expected_pid = tests::azure::provider_id("worker-0");
    assert!(expected_pid.contains("/resourceGroups/capz-rg/"), "{expected_pid}");
    let mut spkis = Vec::new();
    for csr in &filed {
        assert_eq!(csr.signer, SIGNER_AZURE);
        assert!(csr.bootstrap_token);
        let envelope = RequestEnvelope::parse(&csr.request).unwrap();
        assert_eq!(envelope.provider.unwrap().to_string(), "azure/v1");
        let parsed = attestation::csr::ParsedCsr::from_der(&envelope.csr_der).unwrap();
        let extension = parsed.provider_id_extensions().next().unwrap();
        assert_eq!(
            attestation::identity::ProviderId::from_extension_value(&extension.value)
                .unwrap()
                .as_str(),
            expected_pid
        );
        spkis.push(parsed.spki_der.clone());
    }
    assert_eq!(spkis[0], spkis[1], "CSR #2 has CSR #1's key");
    let first = RequestEnvelope::parse(&filed[0].request).unwrap();
    assert_eq!(first.data.as_deref().unwrap(), br#"{"phase":1}"#);
    let second = RequestEnvelope::parse(&filed[1].request).unwrap();
    let data = AzureData::parse(second.data.as_deref().unwrap()).unwrap();
    assert_eq!(data.phase, 2);
    let reference = data.challenge.as_ref().unwrap();
    assert_eq!(
        (reference.csr_name.as_str(), reference.csr_uid.as_str()),
        ("node-csr-fake-0", "uid-node-csr-fake-0")
    );
    // The document as IMDS served it: it verifies, and answers the challenge's nonce.
    let verifier = attestation::azure::AzureVerifier::new(
        attestation::tpm::challenge_key::ChallengeKey::loaded(vec![7; 32]).unwrap(),
        std::sync::Arc::new(tests::azure::Arm::default()),
    )
    .with_trust(imds.pki.trust());
    let (document, _) = verifier
        .verified_document(&data.pkcs7().unwrap(), OffsetDateTime::now_utc())
        .unwrap();
    assert_eq!(document.nonce, AZURE_NONCE);

    // Answered from the cert dir now: no CSR, and no request to IMDS either.
    let again = run();
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(api.filed().len(), 2);
    assert_eq!(imds.lines().len(), 2, "{:?}", imds.lines());
}

#[test]
fn azure_without_imds_or_a_provider_id_says_where_it_looked() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = unreachable_kubeconfig(dir.path());
    let cert_dir = dir.path().join("pki");
    let run = || {
        Command::new(PLUGIN)
            .args(["--bootstrap-kubeconfig", bootstrap.to_str().unwrap()])
            .args(["--cert-dir", cert_dir.to_str().unwrap()])
            .args(["--node-name", "worker-0", "--attestor", "azure"])
            .env("AZURE_METADATA_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env_remove("KUBERNETES_EXEC_INFO")
            .env_remove("KUBELET_AUTHENTICATOR_PROVIDER_ID")
            .env_remove("KUBELET_AUTHENTICATOR_PROVIDER_ID_FILE")
            .output()
            .unwrap()
    };
    let why = format!(
        "no --provider-id or --provider-id-file: --attestor azure reads the VM's from the Azure instance metadata service: attestation device unavailable: the Azure instance metadata service at http://127.0.0.1:{port} is unreachable: "
    );
    let out = run();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).contains(&why), "{}", stderr(&out));

    // With a certificate due for renewal and still valid: answered, as after a failed renewal.
    let due = store_due_certificate(&cert_dir);
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    let credential: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        credential["status"]["clientCertificateData"].as_str().unwrap().trim(),
        due.trim()
    );
    assert!(
        stderr(&out).contains("renewal failed, answering with the current certificate"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains(&why), "{}", stderr(&out));
}
