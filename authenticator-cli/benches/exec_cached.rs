//! What kubelet pays on every call: the whole `kubelet-authenticator` process answering from a
//! valid cached certificate. Runs the release binary N times (default 500, `EXEC_BENCH_RUNS`)
//! and prints latency percentiles.
//!
//! ```sh
//! cargo bench -p authenticator-cli --bench exec_cached
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;
use std::time::{Duration, Instant};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const PROVIDER_ID: &str = "aws:///us-east-1a/i-0abc";

fn main() {
    let runs: usize = std::env::var("EXEC_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(500);
    let dir = tempfile::tempdir().unwrap();
    let cert_dir = dir.path().join("pki");
    std::fs::create_dir(&cert_dir).unwrap();

    // A node certificate from a CA, as the signer would issue it.
    let ca = tests::ca::openssl_ca(tests::ca::CaKeyFormat::RsaPkcs1, 30);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .unwrap()
        .serialize_pem();
    let now = time::OffsetDateTime::now_utc();
    let cert = tests::ca::node_certificate(
        &ca,
        &key,
        "worker-0",
        PROVIDER_ID,
        now - time::Duration::minutes(5),
        now + time::Duration::hours(168),
    );
    std::fs::write(cert_dir.join("kubelet-client-current.pem"), format!("{cert}{key}")).unwrap();

    let args = [
        "--bootstrap-kubeconfig",
        "/nonexistent/bootstrap.conf",
        "--cert-dir",
        cert_dir.to_str().unwrap(),
        "--node-name",
        "worker-0",
        "--provider-id",
        PROVIDER_ID,
        "--attestor",
        "insecure",
    ];
    let exec_info =
        r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false}}"#;
    let run = || {
        let out = Command::new(PLUGIN)
            .args(args)
            .env("KUBERNETES_EXEC_INFO", exec_info)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.starts_with(b"{\"apiVersion\""));
    };
    for _ in 0..20 {
        run();
    }
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed()
        })
        .collect();
    times.sort();
    let at = |p: f64| times[((p / 100.0 * runs as f64).ceil() as usize).clamp(1, runs) - 1];
    let size = std::fs::metadata(PLUGIN).map(|m| m.len()).unwrap_or(0);
    println!(
        "kubelet-authenticator cached path, whole process, {runs} runs ({PLUGIN}, {:.1} MiB)",
        size as f64 / 1048576.0
    );
    for p in [50.0, 90.0, 99.0] {
        println!("  p{p:<3} {:.2} ms", at(p).as_secs_f64() * 1000.0);
    }
    println!("  max  {:.2} ms", times[runs - 1].as_secs_f64() * 1000.0);
}
