//! Load harness (not a test): files N kubelet CSRs across M workload clusters, each a real
//! kube-apiserver from `KUBEBUILDER_ASSETS`, against a running `node-attestation-signer`, and
//! prints creation-to-issued latency percentiles, throughput and the signer's peak RSS.
//!
//! `--idle-clusters K` adds K more opted-in Clusters whose workload apiserver (one extra, shared)
//! carries none of the load: the signer watches M + K clusters, as a management cluster with
//! many quiet clusters would have it.
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-load
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-load --csrs 500 --clusters 1 --idle-clusters 49
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::runtime::watcher;
use serde_json::json;
use tests::ca::{CaKeyFormat, openssl_ca};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr};

#[derive(Parser)]
#[command(about = "Load harness for node-attestation-signer")]
struct Args {
    /// CSRs to file, spread over the loaded clusters.
    #[arg(long, default_value_t = 500)]
    csrs: usize,
    /// Workload clusters carrying the load (one kube-apiserver each; the first is also the
    /// management cluster).
    #[arg(long, default_value_t = 1)]
    clusters: usize,
    /// Further opted-in clusters, all served by one extra, quiet apiserver.
    #[arg(long, default_value_t = 0)]
    idle_clusters: usize,
    /// Share of the CSRs going to the first cluster (the rest are spread evenly): 0.9 floods
    /// one cluster to show the others are not starved. Default: even.
    #[arg(long)]
    flood_share: Option<f64>,
    /// CSRs being filed at once.
    #[arg(long, default_value_t = 32)]
    parallel: usize,
    /// The signer binary (default: next to this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
    /// Extra flags for the signer.
    #[arg(long = "signer-flag", allow_hyphen_values = true)]
    signer_flags: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A `/proc/<pid>/status` figure in KiB: `VmRSS` now, `VmHWM` the peak.
fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let signer_bin = args.signer_bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("own path")
            .with_file_name("node-attestation-signer")
    });
    assert!(
        signer_bin.exists(),
        "{} not found: build it or pass --signer-bin",
        signer_bin.display()
    );
    let clusters = args.clusters.max(1);

    eprintln!(
        "starting {} apiserver(s)…",
        clusters + usize::from(args.idle_clusters > 0)
    );
    let management_env = Envtest::start("signer-load");
    management_env.install_capi_crds();
    let management = live::client(&management_env.admin_kubeconfig).await;
    let mut envs = vec![management_env];
    for i in 1..clusters {
        envs.push(Envtest::start(&format!("signer-load {i}")));
    }
    let mut loaded = Vec::new();
    for (i, env) in envs.into_iter().enumerate() {
        loaded.push(Workload::register(env, &management, &format!("load-{i}"), &format!("c{i}"), "insecure").await);
    }
    let idle = if args.idle_clusters > 0 {
        let env = Envtest::start("signer-load idle");
        let w = Workload::register(env, &management, "idle", "idle-0", "insecure").await;
        let kubeconfig = live::get(
            &management,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "idle-0-kubeconfig", "namespace": "idle"}}),
        )
        .await;
        for i in 1..args.idle_clusters {
            // Each its own CA (a shared one is refused), all watching the quiet apiserver.
            let ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
            let mut cluster = capi::cluster("insecure");
            cluster["metadata"]["name"] = json!(format!("idle-{i}"));
            cluster["metadata"]["namespace"] = json!("idle");
            apply(&management, &cluster).await;
            let mut secret = kubeconfig.clone();
            secret["metadata"] = json!({"name": format!("idle-{i}-kubeconfig"), "namespace": "idle"});
            apply(&management, &secret).await;
            apply(
                &management,
                &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("idle-{i}-ca"), "namespace": "idle"},
                        "stringData": {"tls.crt": String::from_utf8_lossy(&ca.cert_pem), "tls.key": String::from_utf8_lossy(&ca.key_pem)}}),
            )
            .await;
        }
        Some(w)
    } else {
        None
    };

    eprintln!("creating {} Machines…", args.csrs);
    let mut plan: Vec<(usize, String)> = Vec::new();
    for w in &loaded {
        let mut kc = w.own(capi::kubeadm_config("shared-kc", "abcdef", "v1beta2"));
        kc["metadata"]["name"] = json!("shared-kc");
        apply(&management, &kc).await;
    }
    let flooded = args
        .flood_share
        .map_or(0, |share| ((args.csrs as f64) * share.clamp(0.0, 1.0)).round() as usize);
    let creations = (0..args.csrs).map(|n| {
        let i = match (n < flooded, clusters) {
            (true, _) | (_, 1) => 0,
            (false, _) if args.flood_share.is_some() => 1 + n % (clusters - 1),
            _ => n % clusters,
        };
        let w = &loaded[i];
        let name = format!("n-{n}");
        let mut machine = w.own(capi::machine(&name, Some(&format!("load:///{i}/{name}"))));
        machine["spec"]["bootstrap"]["configRef"]["name"] = json!("shared-kc");
        plan.push((i, name));
        let management = management.clone();
        async move {
            apply(&management, &machine).await;
        }
    });
    futures::stream::iter(creations)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;

    let mut signer_args: Vec<&str> = Vec::new();
    signer_args.extend(args.signer_flags.iter().map(String::as_str));
    let signer = Signer::start(&signer_bin, &loaded[0].env, &signer_args).await;
    let pid = signer.pid().expect("signer pid");
    // Wait until every cluster is served.
    let watched = clusters + args.idle_clusters;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = live::metric(&signer.metrics(), "node_attestation_clusters{state=\"Ready\"}");
        if ready as usize >= watched {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {ready} of {watched} clusters ready:\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let idle_rss = proc_status_kib(pid, "VmRSS").unwrap_or(0);
    eprintln!(
        "signer watching {watched} clusters, RSS {idle_rss} KiB; filing {} CSRs…",
        args.csrs
    );

    // Watch for certificates while filing.
    let issued_at: Arc<Mutex<HashMap<(usize, String), Instant>>> = Arc::default();
    let mut watchers = Vec::new();
    for (i, w) in loaded.iter().enumerate() {
        let api: Api<CertificateSigningRequest> = Api::all(w.admin.clone());
        let issued_at = Arc::clone(&issued_at);
        watchers.push(tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Apply(csr) | watcher::Event::InitApply(csr) = event
                    && matches!(live::state_of(&csr), Final::Issued(_))
                {
                    let name = csr.metadata.name.clone().unwrap_or_default();
                    issued_at.lock().unwrap().entry((i, name)).or_insert_with(Instant::now);
                }
            }
        }));
    }
    let requests: Vec<(usize, String, Vec<u8>)> = plan
        .iter()
        .map(|(i, name)| {
            (
                *i,
                name.clone(),
                RequestSpec::kubelet(name, &format!("load:///{i}/{name}")).build(),
            )
        })
        .collect();
    let filed_at: Arc<Mutex<HashMap<(usize, String), Instant>>> = Arc::default();
    let start = Instant::now();
    let filing = requests.iter().map(|(i, name, request)| {
        let (client, filed_at) = (loaded[*i].bootstrap.clone(), Arc::clone(&filed_at));
        async move {
            let before = Instant::now();
            file_csr(
                &client,
                name,
                attestation::names::SIGNER_INSECURE,
                request,
                &["digital signature", "client auth"],
            )
            .await;
            filed_at.lock().unwrap().insert((*i, name.clone()), before);
        }
    });
    futures::stream::iter(filing)
        .buffer_unordered(args.parallel.max(1))
        .collect::<Vec<_>>()
        .await;
    let filed_in = start.elapsed();

    let deadline = Instant::now() + Duration::from_secs(300);
    while issued_at.lock().unwrap().len() < args.csrs && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_in = start.elapsed();
    let peak = proc_status_kib(pid, "VmHWM").unwrap_or(0);
    for w in watchers {
        w.abort();
    }

    let issued = issued_at.lock().unwrap().clone();
    let filed = filed_at.lock().unwrap().clone();
    let mut latencies: Vec<Duration> = issued
        .iter()
        .filter_map(|(k, at)| Some(at.saturating_duration_since(*filed.get(k)?)))
        .collect();
    latencies.sort();
    println!(
        "node-attestation-signer load: {} CSRs over {clusters} loaded cluster(s), {watched} watched",
        args.csrs
    );
    println!("  issued:      {} of {}", issued.len(), args.csrs);
    println!(
        "  filed in:    {:.2} s ({} at once)",
        filed_in.as_secs_f64(),
        args.parallel
    );
    println!("  all issued:  {:.2} s after the first CSR", all_in.as_secs_f64());
    println!(
        "  throughput:  {:.0} certificates/s",
        issued.len() as f64 / all_in.as_secs_f64()
    );
    for p in [50.0, 90.0, 99.0] {
        println!(
            "  p{p:<3}        {:.0} ms (filed -> certificate observed)",
            percentile(&latencies, p).as_secs_f64() * 1000.0
        );
    }
    println!(
        "  max:         {:.0} ms",
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
    if clusters > 1 {
        for i in 0..clusters {
            let mut own: Vec<Duration> = issued
                .iter()
                .filter(|((c, _), _)| *c == i)
                .filter_map(|(k, at)| Some(at.saturating_duration_since(*filed.get(k)?)))
                .collect();
            own.sort();
            println!(
                "  cluster c{i}: {} CSRs, p50 {:.0} ms, p99 {:.0} ms",
                own.len(),
                percentile(&own, 50.0).as_secs_f64() * 1000.0,
                percentile(&own, 99.0).as_secs_f64() * 1000.0
            );
        }
    }
    println!(
        "  signer RSS:  {:.1} MiB watching {watched} clusters before load; peak {:.1} MiB",
        idle_rss as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    drop(idle);
    if issued.len() < args.csrs {
        eprintln!("not every CSR was issued; signer log:\n{}", signer.log());
        std::process::exit(1);
    }
}
