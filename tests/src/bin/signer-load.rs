//! Load harness (a benchmark, not a test): files bootstrap-token kubelet CSRs at once against
//! real kube-apiservers from `KUBEBUILDER_ASSETS` and measures, the same way for every
//! controller, the time from the first creation to the last certificate observed, each CSR's
//! latency (creation to certificate observed), the controller's peak RSS and the API calls it
//! made per issued CSR (`apiserver_request_total` of every apiserver involved, before and
//! after, less the harness's own calls). Each run gets fresh apiservers and etcd. It also prints
//! the CPU every process used per issued CSR over the window and how busy the cores were
//! (`/proc`): on a machine where the apiservers share the cores with everything else, a run
//! whose cores are all busy is bound by CPU, and its time follows the CPU per join.
//!
//! Scenarios (`--scenario`):
//! - `storm` (default): kube-controller-manager (`--kube-api-qps=1000 --kube-api-burst=2000`,
//!   its CSR approver and signer) with 500 `kube-apiserver-client-kubelet` CSRs, then the signer
//!   at default flags with 500 `insecure` CSRs; prints both rows and the ratios against its goals.
//!   With `--split`, the signer also runs as production splits it: the Machines on a management
//!   apiserver with an etcd of its own, the CSRs on the workload apiserver; CPU per issued CSR
//!   is then printed per process (each kube-apiserver and etcd apart) with the split storm's goals.
//! - `fleet`: a lone workload cluster with 100 CSRs as the reference, then 50 workload clusters
//!   with 100 CSRs each at once (their apiservers share one etcd); each cluster's p99 against
//!   the lone one's.
//! - `flood`: two clusters join 100 nodes each, first alone, then while a third receives 5,000
//!   junk CSRs from a bootstrap token (all must end denied); their p99s in both runs.
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-load --bin node-attestation-signer
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-load
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use rcgen::DnType;
use serde_json::json;
use tests::csr::{RequestSpec, subject};
use tests::envtest::{self, Envtest, SharedEtcd};
use tests::live::{self, Final, Signer, Workload, apply, file_csr};
use tests::stats::{CpuTimes, mib, percentile, proc_status_kib, secs};

/// kube-controller-manager's signer for kubelet client certificates.
const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
/// The storm's goals.
const GOAL_TOTAL: f64 = 0.8;
const GOAL_P99: f64 = 0.5;
const GOAL_RSS_MIB: f64 = 48.0;
const GOAL_CLUSTER_P99: f64 = 2.0;

#[derive(Parser)]
#[command(about = "Load harness for node-attestation-signer")]
struct Args {
    /// What to run.
    #[arg(long, value_enum, default_value_t = Scenario::Storm)]
    scenario: Scenario,
    /// storm: CSRs filed at once.
    #[arg(long, default_value_t = 500)]
    csrs: usize,
    /// storm: also run kube-controller-manager with its default flags (client QPS 20).
    #[arg(long)]
    kcm_default: bool,
    /// storm: also run the signer with the management cluster on an apiserver and etcd of its
    /// own, apart from the workload apiserver the CSRs are filed at.
    #[arg(long)]
    split: bool,
    /// storm: further opted-in clusters the signer watches, all served by one extra, quiet
    /// apiserver.
    #[arg(long, default_value_t = 0)]
    idle_clusters: usize,
    /// fleet: workload clusters (fewer run when the machine cannot hold them; it is said).
    #[arg(long, default_value_t = 50)]
    clusters: usize,
    /// fleet and flood: CSRs of each joining cluster.
    #[arg(long, default_value_t = 100)]
    csrs_per_cluster: usize,
    /// flood: junk CSRs filed at the flooded cluster.
    #[arg(long, default_value_t = 5000)]
    junk: usize,
    /// flood: junk CSRs being filed at once.
    #[arg(long, default_value_t = 100)]
    junk_parallel: usize,
    /// flood: seconds the junk has been filed for before the joins start.
    #[arg(long, default_value_t = 2.0)]
    flood_lead: f64,
    /// fleet: starts no further apiserver when less memory than this (MiB) is available.
    #[arg(long, default_value_t = 3072)]
    min_available_mib: u64,
    /// CSRs of a joining cluster being filed at once (0: all).
    #[arg(long, default_value_t = 0)]
    parallel: usize,
    /// Seconds a run may take before what has not ended counts as not ended.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The signer binary (default: next to this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
    /// The key of every cluster CA (the apiservers' client CA, `<cluster>-ca`, what
    /// kube-controller-manager signs with): Cluster API's RSA-2048 default, or ECDSA P-256.
    #[arg(long, value_enum, default_value_t = CaKey::Rsa)]
    ca_key: CaKey,
    /// Extra flags for the signer (repeat; `--signer-flag=--concurrency-per-cluster=16`).
    #[arg(long = "signer-flag", allow_hyphen_values = true)]
    signer_flags: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// 500 CSRs at once on one apiserver: kube-controller-manager, then the signer.
    Storm,
    /// A lone cluster, then 50 clusters with 100 CSRs each.
    Fleet,
    /// Two clusters joining, without and with 5,000 junk CSRs at a third.
    Flood,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CaKey {
    /// RSA-2048 (PKCS#1), as Cluster API generates `<cluster>-ca`.
    Rsa,
    /// ECDSA P-256 (SEC1), a CA the operator brought.
    EcP256,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.ca_key == CaKey::EcP256 {
        envtest::use_client_ca(tests::ca::CaKeyFormat::EcP256Sec1);
    }
    let ok = match args.scenario {
        Scenario::Storm => storm(&args).await,
        Scenario::Fleet => fleet(&args).await,
        Scenario::Flood => flood(&args).await,
    };
    if !ok {
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

async fn storm(args: &Args) -> bool {
    let mut runs = Vec::new();
    match kcm_binary() {
        Some(kcm) => {
            if args.kcm_default {
                runs.push(kcm_storm(args, &kcm, "kube-controller-manager, default flags", &[]).await);
            }
            let tuned = ["--kube-api-qps=1000", "--kube-api-burst=2000"];
            let who = "kube-controller-manager `--kube-api-qps=1000 --kube-api-burst=2000`";
            runs.push(kcm_storm(args, &kcm, who, &tuned).await);
        }
        None => println!(
            "kube-controller-manager is not in KUBEBUILDER_ASSETS: only the signer's row (build it from the same Kubernetes source as kube-apiserver to compare)"
        ),
    }
    let world = SignerWorld::start(args, &Layout::storm(args)).await;
    let signer = world
        .measure(args, &signer_label(args), vec![world.joins(args.parallel)])
        .await;
    drop(world);
    runs.push(signer);
    let split = if args.split {
        let layout = Layout {
            separate_management: true,
            ..Layout::storm(args)
        };
        let world = SignerWorld::start(args, &layout).await;
        let run = world
            .measure(
                args,
                &format!("{}, management apart", signer_label(args)),
                vec![world.joins(args.parallel)],
            )
            .await;
        drop(world);
        Some(run)
    } else {
        None
    };

    println!(
        "\nstorm: {} P-256 bootstrap-token CSRs filed at once, fresh apiserver and etcd per row, {} cluster CAs",
        args.csrs,
        match args.ca_key {
            CaKey::Rsa => "RSA-2048",
            CaKey::EcP256 => "ECDSA P-256",
        }
    );
    let shared_runs = runs.len();
    runs.extend(split);
    print_table(&runs);
    let signer = &runs[shared_runs - 1];
    let kcm = shared_runs.checked_sub(2).map(|i| &runs[i]);
    match kcm {
        Some(kcm) => print_ratios(signer, kcm),
        None => print_rss_goal(signer),
    }
    if let (Some(split), Some(kcm)) = (runs.get(shared_runs), kcm) {
        println!(
            "
management apart:"
        );
        print_ratios(split, kcm);
        print_split_goals(split, kcm);
    }
    print_calls(&runs);
    report_wrong(&runs)
}

/// The split storm's goals: on the workload apiserver the signer's CPU per join at
/// most kube-controller-manager's (whose one apiserver is its workload apiserver), its own
/// process at most half of kube-controller-manager's; and what the claim costs the management
/// side per join.
fn print_split_goals(split: &Run, kcm: &Run) {
    let per = |run: &Run, role: &str| 1000.0 * run.cpu.get(role).copied().unwrap_or(0.0) / run.issued().max(1) as f64;
    let workload = per(split, "kube-apiserver (workload)");
    let kcm_workload = per(kcm, "kube-apiserver (workload)");
    print_ratio(
        &format!(
            "signer's workload kube-apiserver CPU per join {workload:.2} ms / kube-controller-manager's {kcm_workload:.2} ms"
        ),
        workload / kcm_workload.max(f64::EPSILON),
        1.0,
    );
    let own = per(split, "controller");
    let kcm_own = per(kcm, "controller");
    print_ratio(
        &format!("signer process CPU per join {own:.2} ms / kube-controller-manager process {kcm_own:.2} ms"),
        own / kcm_own.max(f64::EPSILON),
        0.5,
    );
    let management = per(split, "kube-apiserver (management)") + per(split, "etcd (management)");
    let calls = split
        .management_calls
        .as_ref()
        .map_or(0.0, |c| split.calls_per_issued(c));
    println!(
        "  the claim's cost on the management side per join: {management:.2} ms of kube-apiserver and etcd CPU, {calls:.2} API calls"
    );
}

async fn fleet(args: &Args) -> bool {
    let lone = SignerWorld::start(args, &Layout::fleet(1, args)).await;
    let reference = lone
        .measure(args, "signer, lone cluster", vec![lone.joins(args.parallel)])
        .await;
    drop(lone);
    let world = SignerWorld::start(args, &Layout::fleet(args.clusters, args)).await;
    let clusters = world.workloads.len();
    let fleet = world
        .measure(
            args,
            &format!("signer, {clusters} clusters"),
            vec![world.joins(args.parallel)],
        )
        .await;
    drop(world);

    println!(
        "\nfleet: {clusters} workload clusters × {} CSRs at once (asked for {}; all apiservers of a run share one etcd)",
        args.csrs_per_cluster, args.clusters
    );
    if clusters < args.clusters {
        println!(
            "  only {clusters} of {} clusters ran: this machine held no more (see above)",
            args.clusters
        );
    }
    let runs = [reference, fleet];
    print_table(&runs);
    let [reference, fleet] = &runs;
    let mut p99s = fleet.cluster_p99s();
    print_cluster_p99s("per-cluster p99 (s)", 0, &p99s);
    p99s.sort();
    let (max, median) = (max_of(&p99s), percentile(&p99s, 50.0));
    let lone = reference.percentile(99.0);
    println!(
        "  per-cluster p99: max {}, median {}; lone cluster p99 {}",
        secs(max),
        secs(median),
        secs(lone)
    );
    print_ratio("max per-cluster p99 / lone p99", ratio(max, lone), GOAL_CLUSTER_P99);
    print_calls(&runs);
    report_wrong(&runs)
}

async fn flood(args: &Args) -> bool {
    let layout = Layout::flood(args);
    let quiet = SignerWorld::start(args, &layout).await;
    let reference = quiet
        .measure(args, "signer, no flood", vec![quiet.joins(args.parallel)])
        .await;
    drop(quiet);
    let world = SignerWorld::start(args, &layout).await;
    let lead = Duration::from_secs_f64(args.flood_lead.max(0.0));
    let waves = vec![world.junk(args), world.joins(args.parallel).after(lead)];
    let flooded = world.measure(args, "signer, flood", waves).await;
    drop(world);

    println!(
        "\nflood: clusters c1 and c2 join {} nodes each; c0 receives {} junk CSRs ({} at once) from {:.1} s before",
        args.csrs_per_cluster, args.junk, args.junk_parallel, args.flood_lead
    );
    let runs = [reference, flooded];
    print_table(&runs);
    let [reference, flooded] = &runs;
    let joining = |run: &Run| run.cluster_p99s().into_iter().skip(1).collect::<Vec<_>>();
    let (before, during) = (joining(reference), joining(flooded));
    print_cluster_p99s("joining clusters' p99 without the flood (s)", 1, &before);
    print_cluster_p99s("joining clusters' p99 during the flood (s)", 1, &during);
    let worst = before
        .iter()
        .zip(&during)
        .map(|(b, d)| ratio(*d, *b))
        .fold(0.0, f64::max);
    print_ratio(
        "joining clusters' p99, flood / no flood (worst)",
        worst,
        GOAL_CLUSTER_P99,
    );
    println!(
        "  junk denied: {} of {}; decided in {}",
        flooded.denied,
        args.junk,
        secs(flooded.all_done)
    );
    println!(
        "  signer RSS: peak {} without the flood, peak {} with it, {} after it",
        mib(reference.peak_rss_kib),
        mib(flooded.peak_rss_kib),
        mib(flooded.rss_after_kib)
    );
    print_calls(&runs);
    report_wrong(&runs)
}

fn signer_label(args: &Args) -> String {
    if args.signer_flags.is_empty() {
        "node-attestation-signer, default flags".to_owned()
    } else {
        format!("node-attestation-signer `{}`", args.signer_flags.join(" "))
    }
}

// ---------------------------------------------------------------------------------------------
// What a run files and measures

/// What a CSR must end as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    Issued,
    Denied,
}

/// One CSR: the loaded cluster it goes to, its name and body, what it must end as.
struct Filing {
    cluster: usize,
    name: String,
    request: Vec<u8>,
    signer: &'static str,
    expect: Expect,
}

/// CSRs filed with their own concurrency from `after` the run's start; a run's waves go
/// side by side (the flood's junk and the joins).
struct Wave {
    filings: Vec<Filing>,
    parallel: usize,
    after: Duration,
}

impl Wave {
    fn new(filings: Vec<Filing>, parallel: usize) -> Self {
        let parallel = if parallel == 0 { filings.len() } else { parallel };
        Self {
            filings,
            parallel: parallel.max(1),
            after: Duration::ZERO,
        }
    }

    fn after(self, after: Duration) -> Self {
        Self { after, ..self }
    }
}

/// `count` kubelet client CSRs `n-<j>` of loaded cluster `cluster` for `signer`; for the
/// signer's `insecure` they carry the provider ID of Machine `n-<j>` and the PROVIDER block.
fn kubelet_filings(cluster: usize, count: usize, signer: &'static str) -> Vec<Filing> {
    (0..count)
        .map(|j| {
            let name = format!("n-{j}");
            let mut spec = RequestSpec::kubelet(&name, &provider_id(cluster, &name));
            if signer == KUBELET_CLIENT_SIGNER {
                spec.provider_id_extension = None;
                spec.provider = None;
            }
            Filing {
                cluster,
                request: spec.build(),
                name,
                signer,
                expect: Expect::Issued,
            }
        })
        .collect()
}

fn provider_id(cluster: usize, name: &str) -> String {
    format!("load:///{cluster}/{name}")
}

/// Where a run's CSRs go and whose calls count.
struct Apiservers {
    /// Per loaded cluster: admin (watches) and bootstrap-token (files) clients.
    loaded: Vec<(Client, Client)>,
    /// Admin clients of every apiserver involved, the loaded ones included.
    counted: Vec<Client>,
    /// The management apiserver's admin when it is none of the loaded ones (also counted).
    management: Option<Client>,
    /// Roles of the apiservers' and etcds' processes (`kube-apiserver (workload)`, ...), for
    /// CPU per process.
    roles: HashMap<u32, String>,
}

/// `kube-apiserver (<side>)` and `etcd (<side>)` for `env`'s processes.
fn roles_of(env: &Envtest, side: &str) -> Vec<(u32, String)> {
    env.pids()
        .into_iter()
        .filter_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            Some((pid, format!("{} ({side})", comm.trim())))
        })
        .collect()
}

/// API calls by `VERB resource[/subresource]`.
type Calls = BTreeMap<String, f64>;

/// What one run measured.
struct Run {
    who: String,
    filed: usize,
    /// Latencies of the issued CSRs, per loaded cluster, sorted.
    latencies: Vec<Vec<Duration>>,
    denied: usize,
    /// CSRs that did not end as expected, and how they ended.
    wrong: Vec<String>,
    /// First creation to the last certificate observed.
    all_issued: Duration,
    /// First creation to the last CSR observed ending (denials too).
    all_done: Duration,
    peak_rss_kib: u64,
    rss_after_kib: u64,
    /// Every apiserver involved, less the harness's own calls.
    calls: Calls,
    /// The management apiserver alone, when it is not a loaded one.
    management_calls: Option<Calls>,
    /// The harness's CSR creations the apiservers answered 429 (retried after 200 ms: their
    /// latency counts from the first attempt).
    creations_throttled: f64,
    /// Seconds of CPU each role used over the window (kube-apiserver, etcd, the controller,
    /// the harness, other processes).
    cpu: BTreeMap<String, f64>,
    /// The share of the machine's cores that was busy over the window.
    cores_busy: f64,
}

impl Run {
    fn issued(&self) -> usize {
        self.latencies.iter().map(Vec::len).sum()
    }

    fn percentile(&self, p: f64) -> Duration {
        let mut all: Vec<Duration> = self.latencies.concat();
        all.sort();
        percentile(&all, p)
    }

    /// Each loaded cluster's p99, by cluster index.
    fn cluster_p99s(&self) -> Vec<Duration> {
        self.latencies.iter().map(|l| percentile(l, 99.0)).collect()
    }

    fn calls_per_issued(&self, calls: &Calls) -> f64 {
        calls.values().sum::<f64>() / self.issued().max(1) as f64
    }

    fn calls_per_decided(&self, calls: &Calls) -> f64 {
        calls.values().sum::<f64>() / (self.issued() + self.denied).max(1) as f64
    }
}

/// How each CSR ended, as the harness's watches saw it first: `(cluster, name)` to the
/// moment and the end.
type Seen = Arc<Mutex<HashMap<(usize, String), (Instant, Final)>>>;

/// Files every wave at once and measures until each CSR has ended (or `--timeout`): the one
/// measurement of every controller, `pid` its process.
async fn measure(who: &str, apis: &Apiservers, waves: Vec<Wave>, pid: u32, timeout: Duration) -> Run {
    let seen: Seen = Arc::default();
    let watches = Watches::start(&apis.loaded, &seen).await;
    let before = Snapshot::take(apis).await;
    let total: usize = waves.iter().map(|w| w.filings.len()).sum();
    eprintln!("{who}: filing {total} CSRs…");

    let cpu_before = CpuTimes::take();
    let start = Instant::now();
    let filed_at: HashMap<(usize, String), Instant> =
        futures::future::join_all(waves.iter().map(|wave| file_wave(apis, wave, start)))
            .await
            .into_iter()
            .flatten()
            .collect();
    let deadline = start + timeout;
    while seen.lock().unwrap().len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu_after = CpuTimes::take();
    let (peak_rss_kib, rss_after_kib) = (
        proc_status_kib(pid, "VmHWM").unwrap_or(0),
        proc_status_kib(pid, "VmRSS").unwrap_or(0),
    );
    let after = Snapshot::take(apis).await;
    let relists = watches.stop();
    let seen = seen.lock().unwrap().clone();

    let all_calls = after.all.minus(&before.all);
    let mut run = Run {
        who: who.to_owned(),
        filed: total,
        latencies: vec![Vec::new(); apis.loaded.len()],
        denied: 0,
        wrong: Vec::new(),
        all_issued: Duration::ZERO,
        all_done: seen
            .values()
            .map(|(at, _)| at.saturating_duration_since(start))
            .max()
            .unwrap_or_default(),
        peak_rss_kib,
        rss_after_kib,
        creations_throttled: all_calls
            .get("POST certificatesigningrequests [429]")
            .copied()
            .unwrap_or(0.0),
        calls: without_own_calls(all_calls, apis.counted.len(), relists),
        cpu: cpu_before.used_since(&cpu_after, |p, comm| {
            Some(apis.roles.get(&p).cloned().unwrap_or_else(|| cpu_role(p, comm, pid)))
        }),
        cores_busy: cpu_before.machine_busy_since(&cpu_after),
        management_calls: after
            .management
            .zip(before.management)
            .map(|(a, b)| without_own_calls(a.minus(&b), 1, 0)),
    };
    for filing in waves.iter().flat_map(|w| &w.filings) {
        let key = (filing.cluster, filing.name.clone());
        match (seen.get(&key), filing.expect) {
            (Some((at, Final::Issued(_))), Expect::Issued) => {
                run.latencies[filing.cluster].push(at.saturating_duration_since(filed_at[&key]));
                run.all_issued = run.all_issued.max(at.saturating_duration_since(start));
            }
            (Some((_, Final::Denied(..))), Expect::Denied) => run.denied += 1,
            (end, expect) => run.wrong.push(format!(
                "c{}/{}: expected {expect:?}, {}",
                filing.cluster,
                filing.name,
                end.map_or("did not end".to_owned(), |(_, f)| format!("ended {f:?}"))
            )),
        }
    }
    run.latencies.iter_mut().for_each(|l| l.sort());
    eprintln!(
        "{who}: {} issued, {} denied in {}",
        run.issued(),
        run.denied,
        secs(run.all_done)
    );
    run
}

/// Files `wave` from `start + wave.after`; returns when each creation started.
async fn file_wave(apis: &Apiservers, wave: &Wave, start: Instant) -> Vec<((usize, String), Instant)> {
    tokio::time::sleep_until((start + wave.after).into()).await;
    futures::stream::iter(&wave.filings)
        .map(|filing| async move {
            let began = Instant::now();
            let client = &apis.loaded[filing.cluster].1;
            file_csr(client, &filing.name, filing.signer, &filing.request, CLIENT_USAGES).await;
            ((filing.cluster, filing.name.clone()), began)
        })
        .buffer_unordered(wave.parallel)
        .collect()
        .await
}

/// The harness's CSR watches, one per loaded cluster, opened (listed) before the first
/// snapshot so that only their relists fall into the measured window.
struct Watches {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    lists: Arc<AtomicUsize>,
}

impl Watches {
    async fn start(loaded: &[(Client, Client)], seen: &Seen) -> Self {
        let lists = Arc::new(AtomicUsize::new(0));
        let tasks = loaded
            .iter()
            .enumerate()
            .map(|(cluster, (admin, _))| {
                let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
                tokio::spawn(watch_csrs(api, cluster, Arc::clone(seen), Arc::clone(&lists)))
            })
            .collect();
        while lists.load(Ordering::SeqCst) < loaded.len() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { tasks, lists }
    }

    /// Stops the watches; returns how many times they listed again after starting.
    fn stop(self) -> usize {
        self.tasks.iter().for_each(|t| t.abort());
        self.lists.load(Ordering::SeqCst).saturating_sub(self.tasks.len())
    }
}

async fn watch_csrs(api: Api<CertificateSigningRequest>, cluster: usize, seen: Seen, lists: Arc<AtomicUsize>) {
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitDone) => {
                lists.fetch_add(1, Ordering::SeqCst);
            }
            Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) => {
                let end = live::state_of(&csr);
                if matches!(end, Final::Issued(_) | Final::Denied(..) | Final::Failed(..)) {
                    let name = csr.metadata.name.clone().unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .entry((cluster, name))
                        .or_insert((Instant::now(), end));
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// API calls

/// `apiserver_request_total` of every counted apiserver (summed) and of the management one.
struct Snapshot {
    all: Calls,
    management: Option<Calls>,
}

impl Snapshot {
    async fn take(apis: &Apiservers) -> Self {
        let mut all = Calls::new();
        for client in &apis.counted {
            for (key, n) in request_totals(client).await {
                *all.entry(key).or_default() += n;
            }
        }
        let management = match &apis.management {
            Some(client) => Some(request_totals(client).await),
            None => None,
        };
        Self { all, management }
    }
}

trait Minus {
    fn minus(&self, before: &Self) -> Self;
}

impl Minus for Calls {
    fn minus(&self, before: &Self) -> Self {
        self.iter()
            .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, n)| *n > 0.0)
            .collect()
    }
}

/// The harness's own calls out: its CSR creations, throttled ones too (no controller creates
/// CSRs; [`Run::creations_throttled`] keeps the 429s), the first
/// `/metrics` scrape of each of `apiservers` (a request counts when it ends, so the second
/// is not in its own figures), and the relists of its watches.
fn without_own_calls(mut calls: Calls, apiservers: usize, relists: usize) -> Calls {
    calls.retain(|key, _| !key.starts_with("POST certificatesigningrequests"));
    for (key, own) in [
        ("GET (non-resource)", apiservers),
        ("LIST certificatesigningrequests", relists),
        ("WATCH certificatesigningrequests", relists),
    ] {
        if let Some(n) = calls.get_mut(key) {
            *n -= own as f64;
            if *n <= 0.0 {
                calls.remove(key);
            }
        }
    }
    calls
}

/// One apiserver's `apiserver_request_total` by verb and resource (summed over the rest),
/// answers other than 2xx as rows of their own (`PUT certificatesigningrequests/status [409]`).
async fn request_totals(admin: &Client) -> Calls {
    let request = kube::core::Request::new("")
        .get("metrics", &Default::default())
        .expect("GET /metrics");
    let text = admin.request_text(request).await.expect("the apiserver's /metrics");
    let mut calls = Calls::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let (verb, resource, subresource, code) = (
            label(labels, "verb"),
            label(labels, "resource"),
            label(labels, "subresource"),
            label(labels, "code"),
        );
        let mut key = match (resource, subresource) {
            ("", _) => format!("{verb} (non-resource)"),
            (r, "") => format!("{verb} {r}"),
            (r, s) => format!("{verb} {r}/{s}"),
        };
        if !code.starts_with('2') {
            // Conflicts, throttling and errors apart: calls that did not do their work.
            key = format!("{key} [{code}]");
        }
        *calls.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    calls
}

/// A label's value in a Prometheus label set `a="x",b="y"`.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// kube-controller-manager

/// The storm against kube-controller-manager's CSR approver and signer, `flags` added.
async fn kcm_storm(args: &Args, binary: &Path, who: &str, flags: &[&str]) -> Run {
    eprintln!("{who}: starting a fresh apiserver…");
    let env = Envtest::start("signer-load kcm");
    let admin = live::client(&env.admin_kubeconfig).await;
    let bootstrap = kcm_bootstrap_client(&env, &admin).await;
    let kcm = ControllerManager::start(binary, &env, flags);
    kcm.wait_synced(Duration::from_secs(120)).await;
    let apis = Apiservers {
        loaded: vec![(admin.clone(), bootstrap)],
        counted: vec![admin],
        management: None,
        roles: roles_of(&env, "workload").into_iter().collect(),
    };
    let wave = Wave::new(kubelet_filings(0, args.csrs, KUBELET_CLIENT_SIGNER), args.parallel);
    let run = measure(who, &apis, vec![wave], kcm.pid(), timeout(args)).await;
    if !run.wrong.is_empty() {
        eprintln!("kube-controller-manager's log (end):\n{}", kcm.log_tail());
    }
    run
}

/// kubeadm's bootstrap token and bindings: bootstrappers may file CSRs, and
/// kube-controller-manager's approver approves their node client CSRs.
async fn kcm_bootstrap_client(env: &Envtest, admin: &Client) -> Client {
    let (id, secret) = live::TOKEN.split_once('.').expect("token");
    live::add_bootstrap_token(admin, id, secret).await;
    for (binding, role) in [
        ("kubeadm:kubelet-bootstrap", "system:node-bootstrapper"),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
    ] {
        apply(
            admin,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": binding},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}),
        )
        .await;
    }
    live::client(&env.bootstrap_kubeconfig(live::TOKEN)).await
}

fn kcm_binary() -> Option<PathBuf> {
    let path = envtest::assets("signer-load").join("kube-controller-manager");
    path.exists().then_some(path)
}

/// kube-controller-manager running only `csrapproving,csrsigning`, signing with the
/// apiserver's client CA (so its certificates authenticate), as admin, no leader election.
struct ControllerManager {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ControllerManager {
    fn start(binary: &Path, env: &Envtest, flags: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let log = dir.path().join("kube-controller-manager.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary)
            .args(tests::kubelet::controller_manager_args(
                env,
                &["csrapproving", "csrsigning"],
            ))
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().expect("log file")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start kube-controller-manager");
        Self { child, log, _dir: dir }
    }

    /// Waits until both controllers' caches are synced, as its log says.
    async fn wait_synced(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let synced = |log: &str| {
            ["certificate-csrapproving", "certificate-csrsigning-kubelet-client"]
                .iter()
                .all(|c| log.contains(&format!("Caches are synced for {c}")))
        };
        while !synced(&std::fs::read_to_string(&self.log).unwrap_or_default()) {
            assert!(
                Instant::now() < deadline,
                "kube-controller-manager not synced after {timeout:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 40)
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The signer's world

/// Which apiservers a signer run gets.
struct Layout {
    /// Loaded workload clusters, each with this many Machines (and CSRs).
    machines: Vec<usize>,
    /// A management apiserver of its own, not a loaded one.
    separate_management: bool,
    /// All apiservers on one etcd (the fleet: many apiservers are heavy).
    shared_etcd: bool,
    /// Further quiet clusters on one extra apiserver.
    idle_clusters: usize,
}

impl Layout {
    /// The storm: one apiserver, management and workload alike, as kube-controller-manager has.
    fn storm(args: &Args) -> Self {
        Self {
            machines: vec![args.csrs],
            separate_management: false,
            shared_etcd: false,
            idle_clusters: args.idle_clusters,
        }
    }

    fn fleet(clusters: usize, args: &Args) -> Self {
        Self {
            machines: vec![args.csrs_per_cluster; clusters.max(1)],
            separate_management: true,
            shared_etcd: true,
            idle_clusters: 0,
        }
    }

    /// c0, the flooded cluster, has no Machines: its junk is denied at once (no Machine has
    /// the provider ID and none lacks one).
    fn flood(args: &Args) -> Self {
        Self {
            machines: vec![0, args.csrs_per_cluster, args.csrs_per_cluster],
            separate_management: true,
            shared_etcd: false,
            idle_clusters: 0,
        }
    }
}

/// Fresh apiservers, Clusters and Machines, and the signer watching them, ready.
struct SignerWorld {
    signer: Signer,
    workloads: Vec<Workload>,
    /// Machines (and CSRs) of each workload cluster.
    machines: Vec<usize>,
    management: Option<(Envtest, Client)>,
    idle: Option<Workload>,
    _etcd: Option<SharedEtcd>,
}

impl SignerWorld {
    async fn start(args: &Args, layout: &Layout) -> Self {
        let etcd = layout.shared_etcd.then(|| SharedEtcd::start("signer-load"));
        let start_env = |name: &str| match &etcd {
            Some(etcd) => Envtest::start_on(name, etcd),
            None => Envtest::start(name),
        };
        eprintln!("starting apiservers for {} workload cluster(s)…", layout.machines.len());
        let first = start_env("signer-load");
        first.install_capi_crds();
        let first_admin = live::client(&first.admin_kubeconfig).await;
        let (management, mut first) = if layout.separate_management {
            (Some((first, first_admin.clone())), None)
        } else {
            (None, Some(first))
        };
        let mut workloads = Vec::new();
        for (i, machines) in layout.machines.iter().enumerate() {
            let env = match first.take() {
                Some(env) => env,
                None if i > 0 && !room_for_another(args) => break,
                None => start_env(&format!("signer-load c{i}")),
            };
            let w = Workload::register(env, &first_admin, &format!("load-{i}"), &format!("c{i}"), "insecure").await;
            let names: Vec<(String, String)> = (0..*machines)
                .map(|j| {
                    let name = format!("n-{j}");
                    let pid = provider_id(i, &name);
                    (name, pid)
                })
                .collect();
            w.add_machines(&first_admin, &names, 16).await;
            workloads.push(w);
        }
        let idle = match layout.idle_clusters {
            0 => None,
            n => Some(add_idle_clusters(&first_admin, n).await),
        };
        let management_env = management.as_ref().map_or(&workloads[0].env, |(env, _)| env);
        let flags: Vec<&str> = args.signer_flags.iter().map(String::as_str).collect();
        let signer = Signer::start_with_defaults(&signer_binary(args), management_env, &flags).await;
        let mut world = Self {
            signer,
            machines: layout.machines[..workloads.len()].to_vec(),
            workloads,
            management,
            idle,
            _etcd: etcd,
        };
        world.wait_ready(layout.idle_clusters).await;
        world
    }

    /// Waits until the signer serves every cluster; panics with its log if it exits.
    async fn wait_ready(&mut self, idle_clusters: usize) {
        let watched = self.workloads.len() + idle_clusters;
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let ready = live::metric(&self.signer.metrics(), "node_attestation_clusters{state=\"Ready\"}") as usize;
            if ready >= watched {
                break;
            }
            assert!(self.signer.alive(), "the signer exited:\n{}", self.signer.log());
            assert!(
                Instant::now() < deadline,
                "only {ready} of {watched} clusters ready:\n{}",
                self.signer.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!(
            "signer serving {watched} clusters, RSS {}",
            mib(proc_status_kib(self.pid(), "VmRSS").unwrap_or(0))
        );
    }

    fn pid(&self) -> u32 {
        self.signer.pid().expect("signer pid")
    }

    /// Every Machine's CSR, `parallel` at once per cluster's share.
    fn joins(&self, parallel: usize) -> Wave {
        let filings = self
            .machines
            .iter()
            .enumerate()
            .flat_map(|(i, n)| kubelet_filings(i, *n, attestation::names::SIGNER_INSECURE))
            .collect();
        Wave::new(filings, parallel)
    }

    /// `--junk` CSRs at c0 from its bootstrap token, all to be denied: half name a provider ID
    /// no Machine has (`MachineNotFound`), half are not for a node (`SubjectMismatch`).
    fn junk(&self, args: &Args) -> Wave {
        let filings = (0..args.junk)
            .map(|j| {
                let name = format!("junk-{j}");
                let mut spec = RequestSpec::kubelet(&name, &provider_id(0, &name));
                if j % 2 == 1 {
                    spec.subject = subject(&[(DnType::CommonName, &name)]);
                }
                Filing {
                    cluster: 0,
                    request: spec.build(),
                    name,
                    signer: attestation::names::SIGNER_INSECURE,
                    expect: Expect::Denied,
                }
            })
            .collect();
        Wave::new(filings, args.junk_parallel)
    }

    async fn measure(&self, args: &Args, who: &str, waves: Vec<Wave>) -> Run {
        let loaded: Vec<(Client, Client)> = self
            .workloads
            .iter()
            .map(|w| (w.admin.clone(), w.bootstrap.clone()))
            .collect();
        let management = self.management.as_ref().map(|(_, admin)| admin.clone());
        let counted = loaded
            .iter()
            .map(|(admin, _)| admin.clone())
            .chain(management.clone())
            .chain(self.idle.as_ref().map(|w| w.admin.clone()))
            .collect();
        let mut roles: HashMap<u32, String> = HashMap::new();
        let loaded_side = if self.management.is_some() {
            "workload"
        } else {
            "workload and management"
        };
        for w in &self.workloads {
            roles.extend(roles_of(&w.env, loaded_side));
        }
        if let Some((env, _)) = &self.management {
            roles.extend(roles_of(env, "management"));
        }
        if let Some(idle) = &self.idle {
            roles.extend(roles_of(&idle.env, "idle"));
        }
        let apis = Apiservers {
            loaded,
            counted,
            management,
            roles,
        };
        let run = measure(who, &apis, waves, self.pid(), timeout(args)).await;
        if !run.wrong.is_empty() {
            eprintln!("signer log (end):\n{}", tail(&self.signer.log(), 40));
        }
        run
    }
}

/// Whether another apiserver fits: enough memory available (`--min-available-mib`).
fn room_for_another(args: &Args) -> bool {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(u64::MAX);
    let room = available / 1024 >= args.min_available_mib;
    if !room {
        eprintln!(
            "only {} MiB available (< --min-available-mib {}): no further apiserver",
            available / 1024,
            args.min_available_mib
        );
    }
    room
}

/// `count` opted-in Clusters in namespace `idle`, each with its own CA, all watching one
/// extra apiserver that carries no load.
async fn add_idle_clusters(management: &Client, count: usize) -> Workload {
    let env = Envtest::start("signer-load idle");
    let w = Workload::register(env, management, "idle", "idle-0", "insecure").await;
    for i in 1..count {
        w.add_sibling(management, &format!("idle-{i}")).await;
    }
    w
}

fn signer_binary(args: &Args) -> PathBuf {
    let path = args.signer_bin.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("own path")
            .with_file_name("node-attestation-signer")
    });
    assert!(
        path.exists(),
        "{} not found: build it or pass --signer-bin",
        path.display()
    );
    path
}

fn timeout(args: &Args) -> Duration {
    Duration::from_secs(args.timeout)
}

// ---------------------------------------------------------------------------------------------
// Figures

fn max_of(durations: &[Duration]) -> Duration {
    durations.iter().copied().max().unwrap_or_default()
}

/// Whose CPU time a process's is: the measured controller's, the harness's, the apiservers',
/// etcd's or another process's.
fn cpu_role(process: u32, comm: &str, controller: u32) -> String {
    match comm {
        _ if process == controller => "controller",
        _ if process == std::process::id() => "harness",
        "kube-apiserver" | "etcd" => comm,
        _ => "other",
    }
    .to_owned()
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::EPSILON)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn print_table(runs: &[Run]) {
    println!("\n| who | all issued | p50 | p99 | max | peak RSS | API calls/CSR |");
    println!("|---|---|---|---|---|---|---|");
    for run in runs {
        println!(
            "| {} | {} of {} in {} | {} | {} | {} | {} | {:.2} |",
            run.who,
            run.issued(),
            run.filed - run.denied,
            secs(run.all_issued),
            secs(run.percentile(50.0)),
            secs(run.percentile(99.0)),
            secs(run.percentile(100.0)),
            mib(run.peak_rss_kib),
            run.calls_per_issued(&run.calls)
        );
    }
    for run in runs {
        println!(
            "  {}: p90 {}, {:.0} certificates/s, {} creations throttled (429) and retried",
            run.who,
            secs(run.percentile(90.0)),
            run.issued() as f64 / run.all_issued.as_secs_f64().max(f64::EPSILON),
            run.creations_throttled
        );
    }
    println!(
        "\nCPU per issued CSR over each window (/proc; the cores are shared, so a run whose cores are all busy is bound by CPU, not round trips):"
    );
    for run in runs {
        let issued = run.issued().max(1) as f64;
        let all: f64 = run.cpu.values().sum::<f64>() * 1000.0 / issued;
        let roles: Vec<String> = run
            .cpu
            .iter()
            .map(|(role, seconds)| format!("{role} {:.1} ms", 1000.0 * seconds / issued))
            .collect();
        println!(
            "  {}: {}; all {all:.1} ms; cores busy {:.0}%",
            run.who,
            roles.join(", "),
            100.0 * run.cores_busy
        );
    }
}

fn print_ratio(what: &str, value: f64, goal: f64) {
    let verdict = if value <= goal { "met" } else { "not met" };
    println!("  {what} = {value:.2} (goal <= {goal:.2}: {verdict})");
}

fn print_ratios(signer: &Run, kcm: &Run) {
    println!("\nsigner / {}:", kcm.who);
    print_ratio("total", ratio(signer.all_issued, kcm.all_issued), GOAL_TOTAL);
    print_ratio("p99", ratio(signer.percentile(99.0), kcm.percentile(99.0)), GOAL_P99);
    print_rss_goal(signer);
}

fn print_rss_goal(signer: &Run) {
    let peak = signer.peak_rss_kib as f64 / 1024.0;
    print_ratio(
        &format!("signer peak RSS {peak:.1} MiB / {GOAL_RSS_MIB:.0} MiB"),
        peak / GOAL_RSS_MIB,
        1.0,
    );
}

/// `p99s` of clusters `c<first>`, `c<first + 1>`, … on one line.
fn print_cluster_p99s(what: &str, first: usize, p99s: &[Duration]) {
    let listed: Vec<String> = p99s
        .iter()
        .enumerate()
        .map(|(i, d)| format!("c{} {:.2}", first + i, d.as_secs_f64()))
        .collect();
    println!("  {what}: {}", listed.join(", "));
}

/// API calls per issued CSR by verb and resource, every apiserver of the run summed; the
/// management apiserver's share apart when it is not a loaded one.
fn print_calls(runs: &[Run]) {
    println!("\nAPI calls per issued CSR (apiserver_request_total, the harness's own calls out):");
    println!(
        "  (each apiserver also renews its own identity Lease every 10 s: `PUT leases` rows grow with apiservers x time)"
    );
    for run in runs {
        println!("  {}: {}", run.who, per_csr(run, &run.calls));
        print_breakdown(run, &run.calls);
        if let Some(management) = &run.management_calls {
            println!("    of which the management apiserver: {}", per_csr(run, management));
            print_breakdown(run, management);
        }
    }
}

/// Calls per issued CSR, and per CSR decided when some were denied.
fn per_csr(run: &Run, calls: &Calls) -> String {
    match run.denied {
        0 => format!("{:.2}", run.calls_per_issued(calls)),
        _ => format!(
            "{:.2} per issued CSR, {:.2} per CSR decided",
            run.calls_per_issued(calls),
            run.calls_per_decided(calls)
        ),
    }
}

/// Rows of at least 0.01 per issued CSR, most first; the rest (mostly the apiservers' own
/// watch restarts and heartbeats) summed in one line.
fn print_breakdown(run: &Run, calls: &Calls) {
    let issued = run.issued().max(1) as f64;
    let mut rows: Vec<(&String, &f64)> = calls.iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1));
    let (shown, rest): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(_, n)| **n / issued >= 0.01);
    for (key, n) in shown {
        println!("      {key:<48} {:>8.2}  ({n})", n / issued);
    }
    if !rest.is_empty() {
        let n: f64 = rest.iter().map(|(_, n)| **n).sum();
        let what = format!("{} more rows below 0.01", rest.len());
        println!("      {what:<48} {:>8.2}  ({n})", n / issued);
    }
}

/// Says which CSRs did not end as expected; true when all did.
fn report_wrong(runs: &[Run]) -> bool {
    let mut ok = true;
    for run in runs.iter().filter(|r| !r.wrong.is_empty()) {
        ok = false;
        println!(
            "\n{}: {} of {} CSRs did not end as expected:",
            run.who,
            run.wrong.len(),
            run.filed
        );
        for line in run.wrong.iter().take(10) {
            println!("  {line}");
        }
    }
    ok
}
