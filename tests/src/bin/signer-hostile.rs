//! Hostile-workload-cluster harness (a benchmark, not a test; SPEC section 7, "A hostile
//! workload cluster"): what one workload cluster's CSRs cost the signer, on real apiservers from
//! `KUBEBUILDER_ASSETS`, the management and the workload cluster apart (each its own
//! kube-apiserver and etcd). Run it once per signer build (`--signer-bin`) to compare.
//!
//! - `big`: a signer started over `--csrs` pending CSRs of `--size-kib` for an unrelated signer
//!   name, and as many for the signer's own `insecure` name from a junk requester (bootstrap
//!   token, a node name no Machine has), all filed while it was stopped (the worst case: its
//!   first list holds them all). Prints its peak RSS above a run over none, how long the junk
//!   took to be denied, and how long a legitimate join filed afterwards took to be signed.
//! - `misnamed`: a node (a certificate for `system:node:worker-0`) files `--rate` CSRs a second
//!   for other nodes' names for `--seconds`, in a namespace holding `--machines` Machines of
//!   `--clusters` other Clusters. Prints the management apiserver's LISTs of Machines,
//!   MachinePools and KubeadmConfigs in that window and its CPU, and the denials; and the join
//!   latencies of a sibling opted-in Cluster (its own workload apiserver), `--joins` of them
//!   before the flood and as many during it, side by side (goal: p99 under the flood at most
//!   1.5 times the quiet p99).
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-hostile --bin node-attestation-signer
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-hostile --scenario big
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use kube::Client;
use serde_json::json;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, apply, file_csr, wait_final};
use tests::stats::{CpuTimes, mib, percentile, proc_status_kib, secs};

const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const PID: &str = "aws:///us-east-1a/i-0hostile";

#[derive(Parser)]
#[command(about = "What a hostile workload cluster costs node-attestation-signer")]
struct Args {
    /// Which scenario.
    #[arg(long, value_enum, default_value_t = Scenario::Big)]
    scenario: Scenario,
    /// The signer binary (default: beside this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
    /// `big`: CSRs of each kind.
    #[arg(long, default_value_t = 400)]
    csrs: usize,
    /// `big`: each CSR's size, KiB.
    #[arg(long, default_value_t = 1024)]
    size_kib: usize,
    /// `misnamed`: CSRs a second.
    #[arg(long, default_value_t = 20)]
    rate: u64,
    /// `misnamed`: for how long.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// `misnamed`: Machines of the other Clusters in the namespace.
    #[arg(long, default_value_t = 2000)]
    machines: usize,
    /// `misnamed`: the other Clusters.
    #[arg(long, default_value_t = 20)]
    clusters: usize,
    /// `misnamed`: the sibling Cluster's joins in each phase (quiet, flood).
    #[arg(long, default_value_t = 20)]
    joins: usize,
    /// `misnamed`: the flood's signer name (default: the signer's `insecure` one). Another
    /// name (`example.com/other`) is a control run: the same CSRs, apiservers and harness, none
    /// for the signer to decide, so what the sibling's joins lose then is the machine's, not the
    /// signer's.
    #[arg(long)]
    flood_signer_name: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Scenario {
    Big,
    Misnamed,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let binary = args.signer_bin.clone().unwrap_or_else(|| {
        live::sibling_binary(
            std::env::current_exe().unwrap().to_str().unwrap(),
            "node-attestation-signer",
        )
    });
    println!("signer: {}", binary.display());
    match args.scenario {
        Scenario::Big => big(&args, &binary).await,
        Scenario::Misnamed => misnamed(&args, &binary).await,
    }
}

/// The management and the workload apiserver, apart, and the Cluster `team-a/prod`.
async fn world(name: &str) -> (Envtest, Client, Workload) {
    let management = Envtest::start(&format!("{name}-management"));
    management.install_capi_crds();
    let admin = live::client(&management.admin_kubeconfig).await;
    let workload = Envtest::start(&format!("{name}-workload"));
    let w = Workload::register(workload, &admin, "team-a", "prod", "insecure").await;
    (management, admin, w)
}

async fn ready(signer: &Signer) {
    let start = Instant::now();
    while live::metric(&signer.metrics(), "node_attestation_clusters{state=\"Ready\"}") < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not Ready:\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn peak_kib(signer: &Signer) -> u64 {
    proc_status_kib(signer.pid().unwrap(), "VmHWM").unwrap_or(0)
}

/// A join of Machine `machine`, filed now: the time until its certificate is observed, or how
/// the CSR ended instead.
async fn join(w: &Workload, management: &Client, machine: &str) -> Result<Duration, Final> {
    let pid = format!("{PID}-{machine}");
    w.add_machine(management, machine, &pid).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let request = RequestSpec::kubelet(machine, &pid).build();
    file_csr(
        &w.bootstrap,
        &format!("join-{machine}"),
        attestation::names::SIGNER_INSECURE,
        &request,
        CLIENT_USAGES,
    )
    .await;
    match wait_final(&w.admin, &format!("join-{machine}"), false, Duration::from_secs(120)).await {
        Final::Issued(_) => Ok(started.elapsed()),
        other => Err(other),
    }
}

/// [`join`], which must succeed.
async fn joined(w: &Workload, management: &Client, machine: &str, signer: &Signer) -> Duration {
    join(w, management, machine)
        .await
        .unwrap_or_else(|end| panic!("{end:?}\n{}", signer.log()))
}

/// A valid CSR PEM for `node` followed by filler up to `size` bytes: kube-apiserver reads
/// only the first PEM block.
fn padded(node: &str, size: usize) -> Vec<u8> {
    let mut request = RequestSpec::kubelet(node, "aws:///us-east-1a/i-junk").build();
    request.push(b'\n');
    while request.len() < size {
        request.extend_from_slice(b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n");
    }
    request
}

async fn big(args: &Args, binary: &std::path::Path) {
    let (management, admin, w) = world("hostile-big").await;
    // Over nothing: the baseline.
    let signer = Signer::start(binary, &management, &["--leader-elect=false"]).await;
    ready(&signer).await;
    let quiet_join = joined(&w, &admin, "worker-0", &signer).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let quiet_peak = peak_kib(&signer);
    drop(signer);

    // Filed while no signer runs.
    let size = args.size_kib * 1024;
    let filed = Instant::now();
    let filings = (0..args.csrs).flat_map(|i| {
        [
            ("unrelated", format!("unrelated-{i}"), "example.com/unrelated"),
            ("junk", format!("junk-{i}"), attestation::names::SIGNER_INSECURE),
        ]
    });
    let bootstrap = &w.bootstrap;
    futures::stream::iter(filings.map(|(_, name, signer_name)| async move {
        let request = padded(&format!("ghost-{name}"), size);
        file_csr(bootstrap, &name, signer_name, &request, CLIENT_USAGES).await;
    }))
    .buffer_unordered(8)
    .collect::<Vec<_>>()
    .await;
    println!(
        "filed {} CSRs of {} KiB for example.com/unrelated and {} for {} in {}",
        args.csrs,
        args.size_kib,
        args.csrs,
        attestation::names::SIGNER_INSECURE,
        secs(filed.elapsed())
    );

    let started = Instant::now();
    let signer = Signer::start(binary, &management, &["--leader-elect=false"]).await;
    ready(&signer).await;
    let mut junk_done = None;
    while started.elapsed() < Duration::from_secs(300) {
        let denied = live::metric(
            &signer.metrics(),
            "node_attestation_decisions_total{cluster=\"team-a/prod\",signer=\"cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure\",decision=\"Denied\"",
        );
        if denied >= args.csrs as f64 {
            junk_done = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let flooded_join = joined(&w, &admin, "worker-1", &signer).await;
    let flooded_peak = peak_kib(&signer);
    let withheld = live::metric(
        &signer.metrics(),
        "node_attestation_csrs_withheld_total{cluster=\"team-a/prod\",what=\"request\"}",
    );
    println!("\nbig: peak RSS (VmHWM) of the signer");
    println!("  over no CSR:                 {}", mib(quiet_peak));
    println!("  over the {} pending CSRs:   {}", 2 * args.csrs, mib(flooded_peak));
    println!(
        "  growth:                      {} (goal < 64 MiB)",
        mib(flooded_peak.saturating_sub(quiet_peak))
    );
    println!(
        "  junk of its own name denied: {}",
        junk_done.map_or("not within 300 s".to_owned(), secs)
    );
    println!("  requests withheld (metric):  {withheld}");
    println!("  a join, quiet:               {}", secs(quiet_join));
    println!("  a join after the flood:      {} (goal < 10 s)", secs(flooded_join));
    drop(management);
}

/// The management apiserver's LISTs of the three kinds so far.
async fn lists(admin: &Client) -> f64 {
    let request = kube::core::Request::new("")
        .get("metrics", &Default::default())
        .unwrap();
    let text = admin.request_text(request).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("verb=\"LIST\""))
        .filter(|l| {
            ["machines", "machinepools", "kubeadmconfigs"]
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

async fn misnamed(args: &Args, binary: &std::path::Path) {
    let (management, admin, w) = world("hostile-misnamed").await;
    // The namespace's other Clusters' Machines (their Clusters are not opted in: only their
    // objects weigh on a namespace-wide read).
    let per = args.machines / args.clusters.max(1);
    let writes = (0..args.clusters)
        .flat_map(|c| (0..per).map(move |m| (c, m)))
        .map(|(c, m)| {
            let admin = admin.clone();
            async move {
                let mut machine = tests::capi::machine(
                    &format!("other-{c}-{m}"),
                    Some(&format!("aws:///us-east-1a/i-o{c}-{m}")),
                );
                machine["metadata"]["namespace"] = json!("team-a");
                machine["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(format!("other-{c}"));
                machine["spec"]["clusterName"] = json!(format!("other-{c}"));
                apply(&admin, &machine).await;
            }
        });
    futures::stream::iter(writes)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    w.add_machine(&admin, "worker-0", PID).await;
    // The sibling: another opted-in Cluster whose nodes join while `prod` floods.
    let sibling = std::sync::Arc::new(
        Workload::register(
            Envtest::start("hostile-misnamed-sibling"),
            &admin,
            "team-b",
            "sibling",
            "insecure",
        )
        .await,
    );
    let signer = Signer::start(binary, &management, &["--leader-elect=false"]).await;
    while live::metric(&signer.metrics(), "node_attestation_clusters{state=\"Ready\"}") < 2.0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut quiet = Vec::with_capacity(args.joins);
    for j in 0..args.joins {
        quiet.push(joined(&sibling, &admin, &format!("quiet-{j}"), &signer).await);
    }

    // The node's own identity, as the signer would have issued it.
    let (cert, key) = w.env.client_certificate("system:node:worker-0", &["system:nodes"]);
    let node = w.node_client("worker-0", &cert, &key).await;
    let before = lists(&admin).await;
    let cpu_before = CpuTimes::take();
    let started = Instant::now();
    let total = args.rate * args.seconds;
    let flood_signer: &'static str = match &args.flood_signer_name {
        Some(name) => Box::leak(name.clone().into_boxed_str()),
        None => attestation::names::SIGNER_INSECURE,
    };
    // The sibling's joins, spread over the flood's window.
    let flood_joins = {
        let (sibling, admin) = (sibling.clone(), admin.clone());
        let joins = args.joins;
        let spacing = Duration::from_secs(args.seconds) / (joins as u32 + 1);
        tokio::spawn(async move {
            let mut took = Vec::with_capacity(joins);
            for j in 0..joins {
                let started = Instant::now();
                took.push(join(&sibling, &admin, &format!("flood-{j}")).await);
                tokio::time::sleep(spacing.saturating_sub(started.elapsed())).await;
            }
            took
        })
    };
    let mut ticker = tokio::time::interval(Duration::from_millis(1000 / args.rate.max(1)));
    for i in 0..total {
        ticker.tick().await;
        let node = node.clone();
        tokio::spawn(async move {
            let request = RequestSpec::kubelet(&format!("ghost-{i}"), PID).build();
            file_csr(&node, &format!("misnamed-{i}"), flood_signer, &request, CLIENT_USAGES).await;
        });
    }
    let window = started.elapsed();
    let mut flood = flood_joins
        .await
        .unwrap()
        .into_iter()
        .map(|end| end.unwrap_or_else(|end| panic!("{end:?}\n{}", signer.log())))
        .collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = lists(&admin).await;
    let management_pids = [management.apiserver_pid().unwrap_or(0), management.etcd_pid()];
    let cpu: f64 = cpu_before
        .used_since(&CpuTimes::take(), |pid, _| {
            management_pids.contains(&pid).then(|| "management".to_owned())
        })
        .values()
        .sum();
    let denied = live::metric(
        &signer.metrics(),
        "node_attestation_decisions_total{cluster=\"team-a/prod\",signer=\"cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure\",decision=\"Denied\",reason=\"RequesterNotAllowed\"}",
    );
    println!(
        "\nmisnamed: {total} CSRs for other nodes' names from system:node:worker-0 over {}, in a namespace of {} Machines of {} other Clusters",
        secs(window),
        per * args.clusters,
        args.clusters
    );
    println!("  denied RequesterNotAllowed:          {denied}");
    println!(
        "  management LISTs (Machines, MachinePools, KubeadmConfigs): {} (goal <= 10)",
        after - before
    );
    println!(
        "  management apiserver + etcd CPU:     {:.1} s over {}",
        cpu,
        secs(window + Duration::from_secs(5))
    );
    quiet.sort();
    flood.sort();
    let (q99, f99) = (percentile(&quiet, 99.0), percentile(&flood, 99.0));
    println!(
        "  sibling team-b/sibling joins, quiet:  p50 {} p99 {} ({} joins)",
        secs(percentile(&quiet, 50.0)),
        secs(q99),
        quiet.len()
    );
    println!(
        "  sibling team-b/sibling joins, flood:  p50 {} p99 {} ({} joins)",
        secs(percentile(&flood, 50.0)),
        secs(f99),
        flood.len()
    );
    println!(
        "  flood p99 / quiet p99:               {:.2} (goal <= 1.5)",
        f99.as_secs_f64() / q99.as_secs_f64().max(1e-9)
    );
    drop(signer);
    drop(management);
}
