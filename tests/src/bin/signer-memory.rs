//! Memory harness (a benchmark, not a test): what a replica keeps per Cluster API
//! object, and whether memory follows the shard.
//!
//! One management apiserver from `KUBEBUILDER_ASSETS` holds `--clusters` Clusters (their
//! workload cluster is that same apiserver: none carries load) with `--machines` Machines in
//! all, each with its own KubeadmConfig, shaped as Cluster API writes them (labels, owner
//! references, conditions, addresses, a claim). Then, each on fresh processes of one binary:
//!
//! 1. **baseline**: one replica (`--leader-elect=false`), no Cluster opted in;
//! 2. **single**: one replica, every Cluster opted in;
//! 3. **shard**: `--replicas` `--coordination=shard` replicas, every Cluster opted in.
//!
//! Each run waits until every Cluster is served (`node_attestation_clusters{state="Ready"}`) and,
//! where the binary exports it, `node_attestation_cached_objects` holds the fleet, then
//! `--settle` more, and reads `VmRSS` and `VmHWM`. It prints bytes per cached Machine (with its
//! KubeadmConfig) as (single - baseline) / machines, each shard replica's peak above the
//! baseline against the single replica's (goal 0.45), and the projection to 1,000,000 Machines
//! at 3 replicas.
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-memory --bin node-attestation-signer
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-memory --machines 30000
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kube::Client;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, WatchParams};
use serde_json::json;
use tests::envtest::Envtest;
use tests::live::{self, Signer};
use tests::stats::{CpuTimes, proc_status_kib};

/// The issue's goals.
const GOAL_BYTES_PER_MACHINE: f64 = 1024.0;
const GOAL_SHARD_RATIO: f64 = 0.45;
const GOAL_MILLION_GIB: f64 = 1.0;
const NAMESPACE: &str = "fleet";

#[derive(Parser)]
#[command(about = "Memory harness for node-attestation-signer")]
struct Args {
    /// Machines in all (each with its own KubeadmConfig).
    #[arg(long, default_value_t = 30_000)]
    machines: usize,
    /// Clusters they are spread over.
    #[arg(long, default_value_t = 30)]
    clusters: usize,
    /// Replicas of the shard run.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Objects written at once while the fleet is created.
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Seconds to wait, once served, before RSS is read.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Seconds a run may take to serve the fleet.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The signer binary (default: next to this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
    /// Skip the shard run.
    #[arg(long)]
    no_shard: bool,
    /// Machine writes made while each run's replicas serve (and once with no replica): what
    /// delivering the fleet's changes to the replicas' watches costs the management apiserver.
    #[arg(long, default_value_t = 3000)]
    churn: usize,
    /// Before the runs, what one watch costs kube-apiserver per Machine write: `--churn` writes
    /// with no watch, with this many watches of every Machine (what each replica holds, one per
    /// kind), with as many watches each selecting one Cluster's Machines by label (the
    /// per-Cluster alternative), and with none again. 0: skipped.
    #[arg(long, default_value_t = 0)]
    watch_cost: usize,
    /// Another build of the signer (an earlier commit) to run the same three runs with first,
    /// on the same fleet, for a before/after comparison.
    #[arg(long)]
    before_bin: Option<PathBuf>,
}

/// One run's processes and readings.
struct Reading {
    /// Open watches of the management apiserver, by resource (`apiserver_longrunning_requests`).
    watches: Vec<(String, f64)>,
    /// kube-apiserver's RSS.
    apiserver_rss_kib: u64,
    rss_kib: Vec<u64>,
    hwm_kib: Vec<u64>,
    cached_machines: Vec<f64>,
    served_in: Duration,
    churn: Churn,
}

/// CPU seconds used during `--churn` Machine writes, by kube-apiserver, etcd and the replicas.
#[derive(Debug, Default, Clone, Copy)]
struct Churn {
    writes: usize,
    apiserver: f64,
    etcd: f64,
    replicas: f64,
}

impl Churn {
    /// Per write, in ms.
    fn per_write(&self, seconds: f64) -> f64 {
        seconds * 1000.0 / self.writes.max(1) as f64
    }
}

/// Writes an annotation on `writes` Machines of the fleet (a change every watch of Machines
/// receives, as Cluster API's status writes are), 32 at once, and measures the CPU used.
async fn churn(management: &Client, env: &Envtest, replicas: &[u32], args: &Args, round: usize) -> Churn {
    let (machines, writes) = (args.machines, args.churn);
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(management.clone(), NAMESPACE, &resource);
    let per_cluster = machines.div_ceil(args.clusters.max(1));
    let names: Vec<String> = (0..writes.min(machines))
        .map(|k| {
            // Spread over the fleet: every Cluster (so every replica) sees some.
            let i = (k * 7919) % machines;
            format!("{NAMESPACE}-{}-md-0-7d9f8b6c4x-{i:05}", i / per_cluster)
        })
        .collect();
    let apiserver_pids: Vec<u32> = env.apiserver_pid().into_iter().collect();
    let before = CpuTimes::take();
    futures::stream::iter(names.iter().map(|name| {
        let api = api.clone();
        async move {
            let patch = json!({"metadata": {"annotations": {"fleet.example/heartbeat": round.to_string()}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("churn patch");
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
    // Let the watches deliver the last events.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = CpuTimes::take();
    let used = before.used_since(&after, |pid, comm| {
        if apiserver_pids.contains(&pid) {
            Some("apiserver".to_owned())
        } else if comm == "etcd" {
            Some("etcd".to_owned())
        } else if replicas.contains(&pid) {
            Some("replicas".to_owned())
        } else {
            None
        }
    });
    let get = |k: &str| used.get(k).copied().unwrap_or(0.0);
    Churn {
        writes: names.len(),
        apiserver: get("apiserver"),
        etcd: get("etcd"),
        replicas: get("replicas"),
    }
}

/// `count` watches of the fleet's Machines, drained in the background until the handle is
/// dropped; `by_cluster`: each selects one Cluster's Machines by Cluster API's label.
async fn watches_of_machines(
    management: &Client,
    count: usize,
    clusters: usize,
    by_cluster: bool,
) -> Vec<tokio::task::AbortHandle> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(management.clone(), NAMESPACE, &resource);
    let version = api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut handles = Vec::new();
    for i in 0..count {
        let mut params = WatchParams::default().timeout(290);
        if by_cluster {
            params = params.labels(&format!(
                "cluster.x-k8s.io/cluster-name={NAMESPACE}-{}",
                i % clusters.max(1)
            ));
        }
        let stream = api.watch(&params, &version).await.expect("watch");
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while stream.next().await.is_some() {}
        });
        handles.push(task.abort_handle());
    }
    handles
}

/// The `--watch-cost` phases.
async fn watch_cost(management: &Client, env: &Envtest, args: &Args) {
    let per_write = |c: &Churn| c.per_write(c.apiserver);
    let none = churn(management, env, &[], args, 100).await;
    print_churn("0 watches", &none);
    let all = watches_of_machines(management, args.watch_cost, args.clusters, false).await;
    let every = churn(management, env, &[], args, 101).await;
    all.iter().for_each(tokio::task::AbortHandle::abort);
    print_churn(&format!("{} x all", args.watch_cost), &every);
    let one = watches_of_machines(management, args.watch_cost, args.clusters, true).await;
    let selected = churn(management, env, &[], args, 102).await;
    one.iter().for_each(tokio::task::AbortHandle::abort);
    print_churn(&format!("{} x 1 Cluster", args.watch_cost), &selected);
    let again = churn(management, env, &[], args, 103).await;
    print_churn("0 again", &again);
    let zero = (per_write(&none) + per_write(&again)) / 2.0;
    println!(
        "kube-apiserver CPU per Machine write and watch: {:.3} ms for a watch of every Machine, {:.3} ms for a watch of one Cluster's (label-selected, {} Clusters); no watch: {:.2} and {:.2} ms per write",
        (per_write(&every) - zero) / args.watch_cost as f64,
        (per_write(&selected) - zero) / args.watch_cost as f64,
        args.clusters,
        per_write(&none),
        per_write(&again)
    );
}

fn print_churn(what: &str, c: &Churn) {
    println!(
        "{what:<10} churn: {} Machine writes: kube-apiserver {:.2} ms, etcd {:.2} ms, the replicas {:.2} ms of CPU per write",
        c.writes,
        c.per_write(c.apiserver),
        c.per_write(c.etcd),
        c.per_write(c.replicas)
    );
}

async fn set_opt_in(management: &Client, clusters: usize, on: bool) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"));
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(management.clone(), NAMESPACE, &resource);
    for i in 0..clusters {
        let patch = json!({"metadata": {"annotations": {"cluster.x-k8s.io/kubelet-authentication": if on { "true" } else { "false" }}}});
        api.patch(
            &format!("{NAMESPACE}-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("opt-in patch");
    }
}

/// Starts `replicas` processes (one: `--leader-elect=false`), waits until `served` Clusters
/// are Ready across them and (`expect_machines`) the Machines are cached, settles, reads memory.
async fn run(
    args: &Args,
    binary: &Path,
    env: &Envtest,
    replicas: usize,
    served: usize,
    expect_machines: Option<usize>,
) -> Reading {
    let mut signers = Vec::new();
    for r in 0..replicas {
        let name = format!("r{r}");
        let flags: Vec<&str> = if replicas == 1 {
            vec!["--leader-elect=false"]
        } else {
            vec!["--coordination", "shard", "--replica-name", &name]
        };
        signers.push(Signer::start_with_defaults(Path::new(&binary), env, &flags).await);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    loop {
        let texts: Vec<String> = signers.iter().map(Signer::metrics).collect();
        let ready: f64 = texts
            .iter()
            .map(|t| live::metric(t, "node_attestation_clusters{state=\"Ready\"}"))
            .sum();
        let cached: f64 = texts
            .iter()
            .map(|t| live::metric(t, "node_attestation_cached_objects{kind=\"Machine\"}"))
            .sum();
        let exported = texts.iter().any(|t| t.contains("node_attestation_cached_objects"));
        let machines_ok = match expect_machines {
            Some(n) if exported => cached as usize == n,
            _ => true,
        };
        // The Cluster gauges appear with the first reconcile, once the caches have listed.
        let reconciled = texts
            .iter()
            .all(|t| t.contains("node_attestation_clusters{state=\"Ready\"}"));
        if reconciled && ready as usize == served && machines_ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served within --timeout: Ready {ready} of {served}, cached Machines {cached}\n{}",
            signers[0].log().lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let served_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    let pids: Vec<u32> = signers.iter().map(|s| s.pid().expect("pid")).collect();
    let management = live::client(&env.admin_kubeconfig).await;
    let churned = if expect_machines == Some(0) {
        Churn::default()
    } else {
        churn(&management, env, &pids, args, replicas * 10 + served + 1).await
    };
    let apiserver_metrics = String::from_utf8_lossy(&env.kubectl(&["get", "--raw", "/metrics"]).stdout).into_owned();
    let reading = Reading {
        watches: tests::kube_metrics::watches(&apiserver_metrics),
        apiserver_rss_kib: env
            .apiserver_pid()
            .and_then(|p| proc_status_kib(p, "VmRSS"))
            .unwrap_or(0),
        rss_kib: pids.iter().map(|p| proc_status_kib(*p, "VmRSS").unwrap_or(0)).collect(),
        hwm_kib: pids.iter().map(|p| proc_status_kib(*p, "VmHWM").unwrap_or(0)).collect(),
        cached_machines: signers
            .iter()
            .map(|s| live::metric(&s.metrics(), "node_attestation_cached_objects{kind=\"Machine\"}"))
            .collect(),
        served_in,
        churn: churned,
    };
    for mut s in signers {
        s.terminate();
    }
    reading
}

fn print(what: &str, r: &Reading) {
    let list = |v: &[u64]| {
        v.iter()
            .map(|k| format!("{:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "{what:<10} served in {:>6.1} s   RSS {:>22} MiB   peak (VmHWM) {:>22} MiB   cached Machines {:?}",
        r.served_in.as_secs_f64(),
        list(&r.rss_kib),
        list(&r.hwm_kib),
        r.cached_machines
    );
    println!(
        "{:<10} management kube-apiserver RSS {:.0} MiB; its open watches by resource: {:?}",
        "",
        r.apiserver_rss_kib as f64 / 1024.0,
        r.watches
    );
    print_churn("", &r.churn);
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let env = Envtest::start("signer-memory");
    env.install_capi_crds();
    let management = live::client(&env.admin_kubeconfig).await;
    let created = Instant::now();
    let first = live::quiet_clusters(env, &management, NAMESPACE, args.clusters).await;
    let binary = args.signer_bin.clone().unwrap_or_else(|| {
        let me = std::env::current_exe().expect("current exe");
        me.with_file_name("node-attestation-signer")
    });
    // The Clusters alone, before any Machine: what serving them costs apart from their
    // Machines (clients, connections, watches of the workload side).
    let mut clusters_only = Vec::new();
    for bin in args.before_bin.iter().chain([&binary]) {
        let r = run(&args, bin, &first.env, 1, args.clusters, Some(0)).await;
        print(
            &format!("{} Clusters, no Machine ({})", args.clusters, bin.display()),
            &r,
        );
        clusters_only.push(r.rss_kib[0]);
    }
    let clusters: Vec<(String, String)> = (0..args.clusters)
        .map(|i| (NAMESPACE.to_owned(), format!("{NAMESPACE}-{i}")))
        .collect();
    let sample = tests::fleet::create(&management, &clusters, args.machines, args.parallel).await;
    println!(
        "fleet: {} Clusters, {} Machines and {} KubeadmConfigs (a Machine is {} bytes of JSON) created in {:.0} s",
        args.clusters,
        args.machines,
        args.machines,
        sample,
        created.elapsed().as_secs_f64()
    );
    let env = &first.env;
    if args.watch_cost > 0 {
        watch_cost(&management, env, &args).await;
    }
    let alone = churn(&management, env, &[], &args, 0).await;
    print_churn("no signer", &alone);
    if let Some(before) = &args.before_bin {
        println!("before: {}", before.display());
        three_runs(&args, before, env, &management, &alone, clusters_only[0]).await;
        println!("after: {}", binary.display());
    }
    three_runs(
        &args,
        &binary,
        env,
        &management,
        &alone,
        clusters_only[clusters_only.len() - 1],
    )
    .await;
}

/// Baseline, single and shard runs of `binary`, and the figures.
async fn three_runs(
    args: &Args,
    binary: &Path,
    env: &Envtest,
    management: &Client,
    alone: &Churn,
    clusters_only_kib: u64,
) {
    set_opt_in(management, args.clusters, false).await;
    let baseline = run(args, binary, env, 1, 0, None).await;
    print("baseline", &baseline);
    set_opt_in(management, args.clusters, true).await;
    let single = run(args, binary, env, 1, args.clusters, Some(args.machines)).await;
    print("single", &single);
    let shard = if args.no_shard {
        None
    } else {
        let r = run(args, binary, env, args.replicas, args.clusters, Some(args.machines)).await;
        print("shard", &r);
        Some(r)
    };

    let base_rss = baseline.rss_kib[0] as f64 * 1024.0;
    let base_hwm = baseline.hwm_kib[0] as f64 * 1024.0;
    let per_machine = (single.rss_kib[0] as f64 * 1024.0 - base_rss) / args.machines as f64;
    println!(
        "bytes per cached Machine (with its KubeadmConfig), (single RSS - baseline RSS) / machines: {per_machine:.0} (goal {GOAL_BYTES_PER_MACHINE:.0}: {})",
        if per_machine <= GOAL_BYTES_PER_MACHINE {
            "met"
        } else {
            "NOT met"
        }
    );
    let machines_only = (single.rss_kib[0] as f64 - clusters_only_kib as f64) * 1024.0 / args.machines as f64;
    println!(
        "of which the Machines: (single RSS - the same Clusters without Machines) / machines: {machines_only:.0} bytes; the Clusters alone: {:.0} KiB each above the baseline",
        (clusters_only_kib as f64 - baseline.rss_kib[0] as f64) / args.clusters as f64
    );
    let single_above = single.hwm_kib[0] as f64 * 1024.0 - base_hwm;
    if let Some(shard) = &shard {
        let ratios: Vec<f64> = shard
            .hwm_kib
            .iter()
            .map(|h| (*h as f64 * 1024.0 - base_hwm) / single_above)
            .collect();
        let worst = ratios.iter().cloned().fold(0.0, f64::max);
        println!(
            "each shard replica's peak above the baseline / the single replica's: {} (worst {worst:.2}, goal {GOAL_SHARD_RATIO}: {})",
            ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
            if worst <= GOAL_SHARD_RATIO { "met" } else { "NOT met" }
        );
    }
    let above = |r: &Reading| r.churn.per_write(r.churn.apiserver) - alone.per_write(alone.apiserver);
    println!(
        "kube-apiserver CPU per Machine write above no signer: {:.3} ms (1 replica, none served), {:.3} ms (1 replica serving all){}",
        above(&baseline),
        above(&single),
        shard.as_ref().map_or(String::new(), |r| format!(
            ", {:.3} ms ({} replicas: {:.3} ms per replica)",
            above(r),
            args.replicas,
            above(r) / args.replicas as f64
        ))
    );
    let million = (base_hwm + per_machine * 1_000_000.0 / 3.0) / (1024.0 * 1024.0 * 1024.0);
    println!(
        "projection, 1,000,000 Machines at 3 replicas: baseline peak + per-Machine bytes x 333,334 = {million:.2} GiB per replica (goal {GOAL_MILLION_GIB} GiB: {})",
        if million < GOAL_MILLION_GIB { "met" } else { "NOT met" }
    );
}
