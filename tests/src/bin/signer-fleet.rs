//! Fleet harness (a benchmark, not a test): three shard replicas started cold on a management
//! apiserver holding a platform's fleet, and one of them SIGKILLed.
//!
//! One management apiserver from `KUBEBUILDER_ASSETS` holds `--clusters` opted-in Clusters
//! with `--machines-per-cluster` Machines each, every Machine with its KubeadmConfig, shaped as
//! Cluster API writes them ([`tests::fleet`]). The Clusters are in namespace `fleet`, or with
//! `--namespaces N` (N > 1) dealt round-robin over `fleet-0` … `fleet-{N-1}` (Cluster `fleet-i`
//! in `fleet-{i mod N}`), as a platform keeps a namespace per team or per cluster; a Cluster's
//! Machines, KubeadmConfigs and Secrets are in its namespace. Every Cluster's workload cluster
//! is that same apiserver ([`live::quiet_clusters_in`]: the first through
//! `<cluster>-kubeconfig`, the others through `<cluster>-node-attestation-kubeconfig` with a CA of their own), so a replica holds
//! one client, one HTTP/2 connection and two watches (CSRs, Nodes) per served Cluster, all to
//! one apiserver. That apiserver gets `--max-requests-inflight` and
//! `--max-mutating-requests-inflight` raised (its API Priority and Fairness seats are their
//! sum): a thousand Clusters' first lists and watches at once from one user would otherwise
//! queue and be answered 429, a limit of one test apiserver serving a thousand workload
//! clusters, not of the signer. etcd gets `--quota-backend-bytes` raised above its 2 GiB default.
//!
//! Then it measures:
//!
//! 1. **creation**: the Clusters (with their Secrets) and the Machines and KubeadmConfigs, objects
//!    a second;
//! 2. **start-up**: `--replicas` `--coordination=shard` replicas started at once, from cold, until
//!    each serves its share (`node_attestation_clusters{state="Ready"}` equal to its
//!    `node_attestation_shard_clusters_owned`, the shares summing to the fleet): each
//!    replica's time, its `VmRSS` and `VmHWM` then and `--settle` later; the management
//!    apiserver's LISTs and WATCHes in that window by resource (count, seconds, bytes answered:
//!    `apiserver_request_total`, `apiserver_request_duration_seconds`,
//!    `apiserver_response_sizes`), and kube-apiserver's, etcd's and the replicas' CPU from
//!    `/proc`;
//! 3. **a quiet minute** (`--quiet`): the same CPU with nothing happening, and the watches open
//!    (`apiserver_longrunning_requests{verb="WATCH"}`);
//! 4. **hand-over**: the first replica SIGKILLed (its member Lease lapses after 15 s): the time
//!    until the survivors own and serve every Cluster, the requests and CPU meanwhile, and the
//!    survivors' memory after.
//!
//! The workload side (CSRs, Nodes, Secrets' reads of the quiet Clusters) lands on the same
//! apiserver, so its CPU is both sides'; the requests are split by resource.
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-fleet --bin node-attestation-signer
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-fleet --clusters 1000 --machines-per-cluster 100
//! # the same platform spread out: 10 Clusters in each of 100 namespaces
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-fleet --clusters 1000 --machines-per-cluster 50 --namespaces 100
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use tests::envtest::Envtest;
use tests::kube_metrics::{by_resource, delta, watches};
use tests::live::{self, Signer};
use tests::stats::{CpuTimes, proc_status_kib};

/// The namespace of a fleet in one namespace, and the prefix of the Clusters' names and of the
/// namespaces of a spread-out one.
const NAMESPACE: &str = "fleet";

#[derive(Parser)]
#[command(about = "Fleet harness for node-attestation-signer: a cold start of shard replicas and a SIGKILL")]
struct Args {
    /// Clusters, named `fleet-0`, `fleet-1`, ….
    #[arg(long, default_value_t = 1000)]
    clusters: usize,
    /// Namespaces the Clusters are dealt over round-robin: `fleet` when 1, else `fleet-0` …
    /// `fleet-{N-1}`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    namespaces: u32,
    /// Machines of each Cluster (each with its own KubeadmConfig).
    #[arg(long, default_value_t = 100)]
    machines_per_cluster: usize,
    /// Shard replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Objects written at once while the fleet is created.
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Seconds to wait, once served, before memory is read again.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Seconds of the quiet window.
    #[arg(long, default_value_t = 60)]
    quiet: u64,
    /// Seconds the start-up or the hand-over may take.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// The test apiserver's `--max-requests-inflight`.
    #[arg(long, default_value_t = 2000)]
    max_requests_inflight: u32,
    /// The test apiserver's `--max-mutating-requests-inflight`.
    #[arg(long, default_value_t = 1000)]
    max_mutating_requests_inflight: u32,
    /// The test etcd's `--quota-backend-bytes`, in GiB.
    #[arg(long, default_value_t = 8)]
    etcd_quota_gib: u64,
    /// The signer binary (default: next to this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
}

/// The namespaces of a fleet spread over `count` of them.
fn namespaces(count: u32) -> Vec<String> {
    match count {
        0 | 1 => vec![NAMESPACE.to_owned()],
        n => (0..n).map(|k| format!("{NAMESPACE}-{k}")).collect(),
    }
}

/// The Clusters (`namespace`, `name`): `fleet-i`, dealt round-robin over `namespaces`.
fn clusters(count: usize, namespaces: &[String]) -> Vec<(String, String)> {
    (0..count)
        .map(|i| (namespaces[i % namespaces.len()].clone(), format!("{NAMESPACE}-{i}")))
        .collect()
}

/// "1 namespace", "4 namespaces".
fn in_namespaces(count: usize) -> String {
    format!("{count} namespace{}", if count == 1 { "" } else { "s" })
}

/// One replica's gauges now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Share {
    owned: f64,
    ready: f64,
}

fn share(signer: &Signer) -> Option<Share> {
    let text = signer.metrics();
    // The Cluster gauges appear with the first reconcile, once the caches have listed.
    text.contains("node_attestation_clusters{").then(|| Share {
        owned: live::metric(&text, "node_attestation_shard_clusters_owned"),
        ready: live::metric(&text, "node_attestation_clusters{state=\"Ready\"}"),
    })
}

/// Polls `signers` (`None`: killed) until every live one serves what it owns and the owned
/// shares cover `clusters`. Returns, per replica, when it last changed to serving its share.
async fn until_served(
    signers: &[Option<Signer>],
    clusters: usize,
    since: Instant,
    timeout: u64,
) -> Vec<Option<Duration>> {
    let mut served_at: Vec<Option<Duration>> = vec![None; signers.len()];
    let mut last: Vec<Share> = vec![Share::default(); signers.len()];
    let deadline = since + Duration::from_secs(timeout);
    loop {
        let shares: Vec<Option<Share>> = signers.iter().map(|s| s.as_ref().and_then(share)).collect();
        for (i, s) in shares.iter().enumerate() {
            match s {
                Some(s) if s.owned > 0.0 && s.ready == s.owned => {
                    if served_at[i].is_none() || *s != last[i] {
                        served_at[i] = Some(since.elapsed());
                    }
                    last[i] = *s;
                }
                _ => served_at[i] = None,
            }
        }
        let live: Vec<usize> = (0..signers.len()).filter(|i| signers[*i].is_some()).collect();
        let owned: f64 = shares.iter().flatten().map(|s| s.owned).sum();
        if owned as usize == clusters && live.iter().all(|i| served_at[*i].is_some()) {
            return served_at;
        }
        assert!(
            Instant::now() < deadline,
            "not served within --timeout: {shares:?}\n{}",
            signers
                .iter()
                .flatten()
                .next()
                .map(|s| s.log().lines().rev().take(20).collect::<Vec<_>>().join("\n"))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// kube-apiserver's `/metrics`.
fn apiserver_metrics(env: &Envtest) -> String {
    String::from_utf8_lossy(&env.kubectl(&["get", "--raw", "/metrics"]).stdout).into_owned()
}

/// The management apiserver's request figures at one moment.
struct Requests {
    lists: BTreeMap<String, f64>,
    list_seconds: BTreeMap<String, f64>,
    list_bytes: BTreeMap<String, f64>,
    watches_started: BTreeMap<String, f64>,
    gets: BTreeMap<String, f64>,
    throttled: f64,
}

impl Requests {
    fn take(env: &Envtest) -> Self {
        let m = apiserver_metrics(env);
        let throttled = m
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("code=\"429\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Self {
            lists: by_resource(&m, "apiserver_request_total", "LIST"),
            list_seconds: by_resource(&m, "apiserver_request_duration_seconds_sum", "LIST"),
            list_bytes: by_resource(&m, "apiserver_response_sizes_sum", "LIST"),
            watches_started: by_resource(&m, "apiserver_request_total", "WATCH"),
            gets: by_resource(&m, "apiserver_request_total", "GET"),
            throttled,
        }
    }

    /// Prints what happened between `self` and `later`.
    fn print_since(&self, later: &Self, what: &str) {
        let lists = delta(&self.lists, &later.lists);
        let seconds = delta(&self.list_seconds, &later.list_seconds);
        let bytes = delta(&self.list_bytes, &later.list_bytes);
        println!("{what}: LISTs by resource (count, seconds summed, MiB answered):");
        for (resource, n) in &lists {
            println!(
                "    {resource:<28} {n:>7.0}  {:>8.2} s  {:>9.1} MiB",
                seconds.get(resource).copied().unwrap_or(0.0),
                bytes.get(resource).copied().unwrap_or(0.0) / 1048576.0
            );
        }
        println!(
            "{what}: WATCHes started {:?}; GETs {:?}; 429 answers {:.0}",
            delta(&self.watches_started, &later.watches_started),
            delta(&self.gets, &later.gets),
            later.throttled - self.throttled
        );
    }
}

/// CPU seconds of kube-apiserver, etcd and the replicas between two readings.
fn print_cpu(what: &str, env: &Envtest, pids: &[u32], before: &CpuTimes, after: &CpuTimes, wall: Duration) {
    let apiserver = env.apiserver_pid();
    let etcd = env.etcd_pid();
    let used = before.used_since(after, |pid, _| {
        if Some(pid) == apiserver {
            Some("kube-apiserver".to_owned())
        } else if pid == etcd {
            Some("etcd".to_owned())
        } else if pids.contains(&pid) {
            Some("replicas".to_owned())
        } else {
            Some("other".to_owned())
        }
    });
    let get = |k: &str| used.get(k).copied().unwrap_or(0.0);
    println!(
        "{what}: {:.1} s wall; CPU s: kube-apiserver {:.1}, etcd {:.1}, the replicas {:.1}, other processes {:.1}; cores {:.0}% busy",
        wall.as_secs_f64(),
        get("kube-apiserver"),
        get("etcd"),
        get("replicas"),
        get("other"),
        before.machine_busy_since(after) * 100.0
    );
}

fn memory(pid: Option<u32>) -> String {
    let read = |f| pid.and_then(|p| proc_status_kib(p, f)).unwrap_or(0) as f64 / 1024.0;
    format!("RSS {:.1} MiB, peak {:.1} MiB", read("VmRSS"), read("VmHWM"))
}

fn print_servers(env: &Envtest) {
    let db = std::fs::metadata(env.dir().join("etcd/member/snap/db")).map_or(0, |m| m.len());
    println!(
        "kube-apiserver {}; etcd {}, its database {:.0} MiB",
        memory(env.apiserver_pid()),
        memory(Some(env.etcd_pid())),
        db as f64 / 1048576.0
    );
}

/// A measured window: from [`Window::open`] until every live replica serves its share.
struct Window {
    requests: Requests,
    cpu: CpuTimes,
    started: Instant,
}

impl Window {
    fn open(env: &Envtest) -> Self {
        Self {
            requests: Requests::take(env),
            cpu: CpuTimes::take(),
            started: Instant::now(),
        }
    }

    /// Waits until `signers` (`None`: killed) serve the fleet, then prints when each served its
    /// share and its memory, the CPU and the requests of the window, and the memory again
    /// `--settle` later.
    async fn close(self, what: &str, env: &Envtest, signers: &[Option<Signer>], args: &Args) {
        let served = until_served(signers, args.clusters, self.started, args.timeout).await;
        let wall = self.started.elapsed();
        let cpu = CpuTimes::take();
        let requests = Requests::take(env);
        let live = || signers.iter().enumerate().filter_map(|(r, s)| Some((r, s.as_ref()?)));
        for (r, s) in live() {
            println!(
                "  r{r}: {:.0} Clusters served at {:.1} s; {}",
                share(s).unwrap_or_default().ready,
                served[r].unwrap_or_default().as_secs_f64(),
                memory(s.pid())
            );
        }
        let pids: Vec<u32> = live().filter_map(|(_, s)| s.pid()).collect();
        print_cpu(what, env, &pids, &self.cpu, &cpu, wall);
        self.requests.print_since(&requests, what);
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        for (r, s) in live() {
            println!("  r{r} {} s later: {}", args.settle, memory(s.pid()));
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let binary = args.signer_bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("current exe")
            .with_file_name("node-attestation-signer")
    });
    let env = Envtest::start_tuned(
        "signer-fleet",
        &[format!("--quota-backend-bytes={}", args.etcd_quota_gib << 30)],
        &[
            format!("--max-requests-inflight={}", args.max_requests_inflight),
            format!(
                "--max-mutating-requests-inflight={}",
                args.max_mutating_requests_inflight
            ),
        ],
    );
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;

    // The Machines and KubeadmConfigs are written while the Clusters are (a Machine does not
    // need its Cluster to exist; each Cluster's CA is an `openssl` run).
    let machines = args.clusters * args.machines_per_cluster;
    let namespaces = namespaces(args.namespaces);
    let clusters = clusters(args.clusters, &namespaces);
    for namespace in &namespaces {
        live::apply(
            &management,
            &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await;
    }
    let started = Instant::now();
    // A thread and runtime of their own: the Clusters' `openssl` runs block theirs.
    let fleet = std::thread::spawn({
        let (kubeconfig, parallel) = (env.admin_kubeconfig.clone(), args.parallel);
        let clusters = clusters.clone();
        move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                let management = live::client(&kubeconfig).await;
                let sample = tests::fleet::post(&management, &clusters, machines, parallel).await;
                (sample, started.elapsed())
            })
        }
    });
    let first = live::quiet_clusters_in(env, &management, &clusters).await;
    let env = &first.env;
    println!(
        "{} Clusters (each with its Secrets and CA) in {} created in {:.0} s",
        clusters.len(),
        in_namespaces(namespaces.len()),
        started.elapsed().as_secs_f64()
    );
    let (sample, took) = fleet.join().expect("the fleet's writes");
    let took = took.as_secs_f64();
    println!(
        "{machines} Machines ({sample} bytes of JSON each) and {machines} KubeadmConfigs created in {took:.0} s: {:.0} objects/s, {:.0} writes/s (a Machine is a POST and a status patch), {} at once",
        2.0 * machines as f64 / took,
        3.0 * machines as f64 / took,
        args.parallel
    );
    print_servers(env);

    // Start-up: every replica from cold, at once.
    let kubeconfig = Signer::management_identity(env).await;
    let window = Window::open(env);
    let signers: Vec<Option<Signer>> = (0..args.replicas)
        .map(|r| {
            let name = format!("r{r}");
            Some(Signer::spawn_with(
                &binary,
                env,
                &kubeconfig,
                &[],
                &["--coordination", "shard", "--replica-name", &name],
            ))
        })
        .collect();
    println!(
        "start-up of {} replicas, {} Clusters in {}, {machines} Machines:",
        args.replicas,
        args.clusters,
        in_namespaces(namespaces.len())
    );
    window.close("start-up window", env, &signers, &args).await;

    // A quiet minute.
    let pids: Vec<u32> = signers.iter().flatten().filter_map(Signer::pid).collect();
    let cpu = CpuTimes::take();
    let quiet_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.quiet)).await;
    let cpu_after = CpuTimes::take();
    print_cpu("quiet window", env, &pids, &cpu, &cpu_after, quiet_started.elapsed());
    println!("open watches by resource: {:?}", watches(&apiserver_metrics(env)));
    print_servers(env);

    // Hand-over: the first replica SIGKILLed, never restarted.
    let mut signers = signers;
    let killed_share = signers[0].as_ref().and_then(share).unwrap_or_default();
    let window = Window::open(env);
    if let Some(mut s) = signers[0].take() {
        s.kill();
    }
    println!(
        "hand-over: r0 (serving {:.0} Clusters) SIGKILLed, its member Lease left to lapse:",
        killed_share.ready
    );
    window.close("hand-over window", env, &signers, &args).await;
    print_servers(env);
    for mut s in signers.into_iter().flatten() {
        s.terminate();
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn one_namespace_keeps_the_fleet_as_it_was() {
        assert_eq!(namespaces(1), ["fleet"]);
        let clusters = clusters(3, &namespaces(1));
        assert_eq!(clusters[2], ("fleet".to_owned(), "fleet-2".to_owned()));
    }

    #[test]
    fn clusters_are_dealt_round_robin() {
        let spread = namespaces(4);
        assert_eq!(spread, ["fleet-0", "fleet-1", "fleet-2", "fleet-3"]);
        let clusters = clusters(10, &spread);
        assert_eq!(clusters[5], ("fleet-1".to_owned(), "fleet-5".to_owned()));
        assert_eq!(clusters.iter().filter(|(ns, _)| ns == "fleet-3").count(), 2);
    }
}
