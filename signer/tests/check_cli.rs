//! `node-attestation-signer check` as an operator runs it: exit codes, output, errors.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn check(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
        .arg("check")
        .args(args)
        .current_dir(root())
        .output()
        .expect("run signer")
}

const EXAMPLE: &[&str] = &[
    "--machine",
    "examples/machines.yaml",
    "--cluster",
    "examples/cluster.yaml",
    "--bootstrap-config",
    "examples/kubeadmconfigs.yaml",
    "--ca-cert",
    "examples/ca.crt",
    "--ca-key",
    "examples/ca.key",
    "--now",
    "2026-12-01T12:00:00Z",
];

fn with_example(extra: &[&str]) -> Vec<String> {
    extra.iter().chain(EXAMPLE).map(|s| (*s).to_owned()).collect()
}

fn run(args: &[String]) -> Output {
    check(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn the_bundled_example_is_approved_and_signed_with_exit_0() {
    let output = run(&with_example(&[
        "--csr",
        "examples/csr-worker-0.yaml",
        "--output",
        "json",
    ]));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["decision"], "Approved");
    assert_eq!(report["reason"], "AttestedInsecureV1");
    assert_eq!(report["rules"].as_array().unwrap().len(), 12);
    assert!(
        report["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["outcome"] == "passed")
    );
    assert_eq!(report["claim"]["record"]["nodeName"], "worker-0");
    let certificate = report["certificate"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join("leaf.pem");
    std::fs::write(&leaf, certificate).unwrap();
    // openssl checks the chain at its own clock; the example is pinned to 2026-12-01T12:00Z.
    let verify = Command::new("openssl")
        .args(["verify", "-attime", "1796126400", "-purpose", "sslclient", "-CAfile"])
        .arg(root().join("examples/ca.crt"))
        .arg(&leaf)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

#[test]
fn the_hijack_example_is_denied_with_exit_1_and_every_failing_rule() {
    let output = run(&with_example(&[
        "--csr",
        "examples/csr-hijack-cp-0.yaml",
        "--output",
        "json",
    ]));
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["decision"], "Denied");
    assert_eq!(report["reason"], "RequesterNotAllowed");
    assert!(report.get("certificate").is_none(), "a denied CSR is never signed");
    let failed: Vec<&str> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outcome"] == "failed")
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["RequesterNotAllowed", "MachineAlreadyClaimed"]);
}

#[test]
fn text_output_lists_every_rule() {
    let output = run(&with_example(&["--csr", "examples/csr-hijack-cp-0.yaml"]));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.starts_with("Denied (RequesterNotAllowed)"), "{text}");
    for rule in [
        "request",
        "signature",
        "subject",
        "subject-alt-names",
        "extensions",
        "usages",
        "requester",
        "provider-id",
        "machine",
        "node-name",
        "one-identity",
        "attestation",
    ] {
        assert!(
            text.lines().any(|l| l.split_whitespace().nth(1) == Some(rule)),
            "{rule} missing:\n{text}"
        );
    }
}

#[test]
fn a_bare_pem_request_is_checked_with_stated_assumptions() {
    use attestation::identity::{NodeName, ProviderId};
    use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
    let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let params = kubelet_client_params(
        &NodeName::new("worker-0").unwrap(),
        &ProviderId::new("aws:///us-east-1a/i-0a1b2c3d4e5f60718").unwrap(),
    );
    let envelope = build_envelope(&params, &key, &mut attestation::insecure::InsecureAttestor, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("request.pem");
    std::fs::write(&pem, envelope.encode()).unwrap();
    let output = run(&with_example(&["--csr", pem.to_str().unwrap(), "--output", "json"]));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        report["assumptions"][0]
            .as_str()
            .unwrap()
            .contains("system:bootstrap:abcdef"),
        "the join token user is assumed: {report}"
    );
}

#[test]
fn unusable_input_exits_2_with_a_clear_error() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--csr", "examples/nope.yaml", "--machine", "examples/machines.yaml"],
            "cannot read examples/nope.yaml",
        ),
        (
            &["--csr", "examples/machines.yaml", "--machine", "examples/machines.yaml"],
            "holds 2 objects",
        ),
        (
            &["--csr", "examples/cluster.yaml", "--machine", "examples/machines.yaml"],
            "not a CertificateSigningRequest",
        ),
        (
            &[
                "--csr",
                "examples/csr-worker-0.yaml",
                "--machine",
                "examples/cluster.yaml",
            ],
            "expected Machine",
        ),
        (
            &[
                "--csr",
                "examples/csr-worker-0.yaml",
                "--machine",
                "examples/machines.yaml",
                "--now",
                "yesterday",
            ],
            "not RFC 3339",
        ),
        (
            &[
                "--csr",
                "examples/csr-worker-0.yaml",
                "--machine",
                "examples/machines.yaml",
                "--ca-cert",
                "examples/ca.key",
                "--ca-key",
                "examples/ca.key",
            ],
            "CA examples/ca.key",
        ),
    ];
    for (args, expected) in cases {
        let output = check(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        // Said once: no cause repeated after its own message.
        let lines: Vec<&str> = stderr.lines().collect();
        for line in &lines {
            for part in line.split(": ").filter(|p| p.len() > 12) {
                assert!(line.matches(part).count() == 1, "{args:?} repeats {part:?}: {stderr}");
            }
        }
        assert!(output.stdout.is_empty(), "nothing on stdout for unusable input");
    }
}

#[test]
fn a_cluster_that_did_not_opt_in_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    let text = std::fs::read_to_string(root().join("examples/cluster.yaml"))
        .unwrap()
        .replace("kubelet-authentication: \"true\"", "kubelet-authentication: \"false\"");
    std::fs::write(&cluster, text).unwrap();
    let output = check(&[
        "--csr",
        "examples/csr-worker-0.yaml",
        "--machine",
        "examples/machines.yaml",
        "--cluster",
        cluster.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not opted in"), "{stderr}");
    // It says what the annotation holds, not that it is missing.
    assert!(
        stderr.contains(r#"kubelet-authentication is "false", not "true""#),
        "{stderr}"
    );
}

#[test]
fn a_paused_cluster_is_decided_with_a_note_that_the_signer_waits() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(root().join("examples/cluster.yaml")).unwrap();
    let forms = [
        (
            "spec",
            example.replace("spec:\n", "spec:\n  paused: true\n"),
            "spec.paused is true",
        ),
        (
            "annotation",
            example.replace(
                "  annotations:\n",
                "  annotations:\n    cluster.x-k8s.io/paused: \"\"\n",
            ),
            "cluster.x-k8s.io/paused annotation",
        ),
    ];
    for (form, text, said) in forms {
        assert_ne!(text, example, "{form}: the example changed shape");
        let cluster = dir.path().join(format!("cluster-{form}.yaml"));
        std::fs::write(&cluster, text).unwrap();
        let mut args: Vec<String> = with_example(&["--csr", "examples/csr-worker-0.yaml", "--output", "json"]);
        let at = args.iter().position(|a| a == "examples/cluster.yaml").unwrap();
        args[at] = cluster.to_str().unwrap().to_owned();
        let output = run(&args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{form}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["decision"], "Approved", "{form}: decided as once unpaused");
        let notes = report["assumptions"].to_string();
        assert!(
            notes.contains("Cluster team-a/prod is paused") && notes.contains(said) && notes.contains("stay pending"),
            "{form}: {notes}"
        );
    }
}

#[test]
fn a_manifest_without_a_kind_is_said_to_have_none_and_what_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none.yaml");
    std::fs::write(&none, "metadata:\n  name: x\nspec: {}\n").unwrap();
    let none = none.to_str().unwrap();
    let csr = "examples/csr-worker-0.yaml";
    let machines = "examples/machines.yaml";
    let cases: &[(&[&str], &str)] = &[
        (
            &["--csr", none, "--machine", machines],
            "a CertificateSigningRequest manifest or a PEM request",
        ),
        (&["--csr", csr, "--machine", none], "Machine or MachinePool"),
        (&["--csr", csr, "--machine", machines, "--cluster", none], "a Cluster"),
        (&["--csr", csr, "--machine", machines, "--node", none], "Node"),
        (
            &["--csr", csr, "--machine", machines, "--bootstrap-config", none],
            "KubeadmConfig",
        ),
        (
            &["--csr", csr, "--machine", machines, "--related-csr", none],
            "a CertificateSigningRequest manifest",
        ),
    ];
    for (args, accepted) in cases {
        let output = check(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr,
            format!("error: {none} has no kind: expected {accepted}\n"),
            "{args:?}"
        );
    }
}

#[test]
fn a_bad_now_is_said_once_with_an_accepted_value() {
    let output = check(&[
        "--csr",
        "examples/csr-worker-0.yaml",
        "--machine",
        "examples/machines.yaml",
        "--now",
        "tomorrow",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "error: --now \"tomorrow\" is not RFC 3339 (the 'year' component could not be parsed): give e.g. 2026-11-22T08:00:00Z\n"
    );
}

fn explain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-attestation-signer"))
        .arg("explain")
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run signer")
}

#[test]
fn explain_refuses_a_malformed_cluster_before_it_reads_any_kubeconfig() {
    let output = explain(&["--cluster", "prod", "--kubeconfig", "/nonexistent", "x"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr, "error: --cluster \"prod\": expected <namespace>/<name>\n");
    // So is a malformed node name.
    let output = explain(&[
        "--cluster",
        "team-a/prod",
        "--kubeconfig",
        "/nonexistent",
        "--node",
        "Worker_0",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: --node: \"Worker_0\" is not a DNS-1123 subdomain"),
        "{stderr}"
    );
}

#[test]
fn explain_says_a_missing_kubeconfig_once() {
    let output = explain(&["--cluster", "team-a/prod", "--kubeconfig", "/nonexistent", "x"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent"), "{stderr}");
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
}

#[test]
fn explain_help_promises_no_certificate() {
    let output = explain(&["--help"]);
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("`otherCSRs`") && help.contains("`joinTokens`"), "{help}");
    assert!(!help.contains("certificate`"), "explain prints no certificate: {help}");
}

#[test]
fn without_a_cluster_only_tpm_is_allowed_and_that_is_said() {
    let output = check(&[
        "--csr",
        "examples/csr-worker-0.yaml",
        "--machine",
        "examples/machines.yaml",
        "--bootstrap-config",
        "examples/kubeadmconfigs.yaml",
        "--now",
        "2026-11-22T08:00:00Z",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("note: no --cluster") && text.contains("Denied (AttestationNotAllowed)"),
        "{text}"
    );
}

#[test]
fn a_csr_left_pending_too_long_expires() {
    let output = check(&[
        "--csr",
        "examples/csr-worker-0.yaml",
        "--machine",
        "examples/machines.yaml",
        "--cluster",
        "examples/cluster.yaml",
        "--now",
        "2026-11-22T08:30:00Z",
    ]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text.starts_with("Denied (Expired)") && text.contains("KubeadmConfig prod-md-0-worker-0"),
        "{text}"
    );
}
