//! Soak harness (a benchmark that prints figures, not a test): three
//! `--coordination=shard` signer replicas against one management kube-apiserver and several
//! loaded workload apiservers (all on one etcd, from `KUBEBUILDER_ASSETS`), CSRs filed at an
//! even rate — first joins from the bootstrap token, renewals by nodes that joined earlier
//! (their own certificate, as `system:node:<name>`), and deliberate duplicate joins racing for
//! a Machine already used — while a random replica is SIGKILLed every `--kill-every` and
//! restarted after a random 0 to `--down-for`.
//!
//! It prints: CSRs filed, issued, denied as expected (duplicates), LOST (never issued nor
//! denied), DOUBLE-SIGNED (two join certificates for one Machine, or a certificate written
//! twice), WRONGLY DENIED (a valid join or renewal denied, with the reason), join latency
//! p50/p99 overall and for joins filed within `--around` after each kill, per-replica peak RSS
//! (`VmHWM` of every incarnation), and per kill the hand-over: when the killed replica's
//! clusters were taken again (its `shard hand-over` log lines, `direction=gained`) and when
//! each of its loaded clusters had its next certificate. Goal line for the p99 around a kill:
//! Lease duration + 5 s. Exits non-zero when anything was lost, double-signed or wrongly
//! denied.
//!
//! With `--cut-every`, each replica reaches the management apiserver through a proxy of its own
//! (its workload clusters stay reachable), and every `--cut-every` a random replica's is cut for
//! `--cut-for`: during each cut a Machine is created in one of its loaded clusters and its join
//! filed a second later, which the cut replica's cache cannot hold. Those joins count like any:
//! one denied from the stale cache is WRONGLY DENIED.
//!
//! ```sh
//! cargo build --release -p signer -p tests --bin signer-soak --bin node-attestation-signer
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-soak                      # 10,000 CSRs over 10 min
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-soak --csrs 600 --duration 90s --kill-every 30s
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/signer-soak --csrs 600 --duration 90s --kill-every 40s --cut-every 15s
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use attestation::request::KeyAlgorithm;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tests::csr::RequestSpec;
use tests::envtest::{Envtest, SharedEtcd};
use tests::live::{self, Final, Signer, Workload, file_csr, metric};
use tests::proxy::Proxy;
use tests::stats::{mib, percentile, proc_status_kib, secs};

const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
/// The membership Lease duration of `--coordination=shard`.
const LEASE: Duration = Duration::from_secs(15);
/// What the goal allows beyond the Lease duration for a join filed around a kill.
const GOAL_SLACK: Duration = Duration::from_secs(5);
/// `--leader-election-id`'s default: member `<id>-<replica>`.
const MEMBER_PREFIX: &str = "node-attestation-signer-";

#[derive(Parser)]
#[command(about = "Soak of sharded node-attestation-signer replicas under SIGKILLs")]
struct Args {
    /// CSRs filed in all (joins, renewals, duplicates).
    #[arg(long, default_value_t = 10_000)]
    csrs: usize,
    /// Over how long, at an even rate (`90s`, `10m`).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// Share of renewals by nodes that joined, in percent.
    #[arg(long, default_value_t = 25)]
    renewals: usize,
    /// Share of duplicate joins for a Machine already used, in percent (expected denials).
    #[arg(long, default_value_t = 5)]
    duplicates: usize,
    /// SIGKILL a random replica this often while CSRs are filed (`0s`: never).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    kill_every: Duration,
    /// A killed replica stays down a random 0 to this long before it is restarted.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    down_for: Duration,
    /// Cut a random replica's connection to the management apiserver this often (`0s`: never;
    /// then the replicas connect to it directly).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    cut_every: Duration,
    /// How long each cut lasts (under the Lease duration: the replica keeps its share).
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    cut_for: Duration,
    /// The window after each kill whose joins count as "around the kill".
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    around: Duration,
    /// How long after the last filing stragglers may still end.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    grace: Duration,
    /// Signer replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Replica names, comma-separated (default: chosen among a..z so that rendezvous hashing
    /// gives every replica at least one loaded cluster).
    #[arg(long, value_delimiter = ',')]
    replica_names: Vec<String>,
    /// Loaded workload apiservers, each an opted-in Cluster.
    #[arg(long, default_value_t = 4)]
    workloads: usize,
    /// Quiet opted-in Clusters (one more apiserver, no CSRs) that widen the fleet.
    #[arg(long, default_value_t = 8)]
    quiet: usize,
    /// Machines (each with its KubeadmConfig, shaped as Cluster API writes them) added to the
    /// fleet beyond those the joins name, spread over every Cluster, loaded and quiet: what a
    /// replica lists when it gains a Cluster, and caches, at scale (docs/capacity.md measures 30000).
    #[arg(long, default_value_t = 0)]
    fleet_machines: usize,
    /// Writes every CSR (cluster, name, kind, filed and ended at, in seconds from the start,
    /// how it ended) to this CSV file.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Random seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// The signer binary (default: next to this one).
    #[arg(long)]
    signer_bin: Option<PathBuf>,
    /// Extra flags for every replica (repeat; `--signer-flag=--concurrency-per-cluster=16`).
    #[arg(long = "signer-flag", allow_hyphen_values = true)]
    signer_flags: Vec<String>,
}

/// `500ms`, `90s`, `10m`, `1h`, `1m30s`; a bare number is seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Ok(seconds) = text.parse::<f64>() {
        return Ok(Duration::from_secs_f64(seconds.max(0.0)));
    }
    let (mut total, mut number) = (0.0, String::new());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = match (c, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                0.001
            }
            ('s', _) => 1.0,
            ('m', _) => 60.0,
            ('h', _) => 3600.0,
            _ => return Err(format!("{text}: not a duration (500ms, 90s, 10m, 1h)")),
        };
        let value: f64 = number.parse().map_err(|_| format!("{text}: not a duration"))?;
        total += value * unit;
        number.clear();
    }
    if !number.is_empty() {
        return Err(format!("{text}: a number without a unit"));
    }
    Ok(Duration::from_secs_f64(total))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(clock_seed);
    eprintln!("seed {seed}");
    let world = World::start(&args).await;
    let plan = Plan::new(&args, seed);
    let report = soak(&args, world, &plan, seed).await;
    report.print(&args, &plan);
    if !report.clean() {
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// A small deterministic random source (no dependency for a harness)

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `[0, max]`.
    fn duration(&mut self, max: Duration) -> Duration {
        max.mul_f64((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

// ---------------------------------------------------------------------------------------------
// The world: apiservers, Clusters, Machines, replicas

/// One etcd, the management apiserver, the loaded workload apiservers, the quiet one, and the
/// replicas serving them.
struct World {
    management: Envtest,
    loaded: Vec<Workload>,
    /// Per loaded cluster, its Cluster's UID.
    uids: Vec<String>,
    /// Every opted-in Cluster's UID.
    all_uids: Vec<String>,
    quiet: Option<Workload>,
    quiet_clusters: usize,
    replicas: Vec<Replica>,
    _etcd: SharedEtcd,
}

impl World {
    async fn start(args: &Args) -> Self {
        let etcd = SharedEtcd::start("signer-soak");
        eprintln!(
            "starting the management apiserver and {} workload apiserver(s)…",
            args.workloads
        );
        let management = Envtest::start_on("signer-soak management", &etcd);
        management.install_capi_crds();
        let admin = live::client(&management.admin_kubeconfig).await;
        let mut loaded = Vec::new();
        for i in 0..args.workloads.max(1) {
            let env = Envtest::start_on(&format!("signer-soak c{i}"), &etcd);
            let w = Workload::register(env, &admin, &namespace(i), &format!("c{i}"), "insecure").await;
            loaded.push(w);
        }
        let quiet = match args.quiet {
            0 => None,
            n => Some(add_quiet(&etcd, &admin, n).await),
        };
        let mut uids = Vec::new();
        for w in &loaded {
            uids.push(cluster_uid(&admin, &w.namespace, &w.cluster).await);
        }
        // The shard's caps count every opted-in Cluster, the quiet ones too.
        let mut all_uids = uids.clone();
        for k in 0..args.quiet {
            all_uids.push(cluster_uid(&admin, "quiet", &format!("quiet-{k}")).await);
        }
        let mut world = Self {
            management,
            loaded,
            uids,
            all_uids,
            quiet,
            quiet_clusters: args.quiet,
            replicas: Vec::new(),
            _etcd: etcd,
        };
        world.add_machines(&admin, args).await;
        world.add_fleet(&admin, args).await;
        world.start_replicas(args).await;
        world
    }

    /// Every Machine the plan's joins name, before any replica starts (a Machine missing from
    /// a cache is `MachineNotFound`, final).
    async fn add_machines(&self, admin: &Client, args: &Args) {
        let per_cluster = Plan::machines_per_cluster(args, self.loaded.len());
        eprintln!(
            "creating {} Machines ({per_cluster} per cluster)…",
            per_cluster * self.loaded.len()
        );
        let started = Instant::now();
        for (i, w) in self.loaded.iter().enumerate() {
            let machines: Vec<(String, String)> = (0..per_cluster)
                .map(|j| (machine_name(j), provider_id(i, &machine_name(j))))
                .collect();
            w.add_machines(admin, &machines, 32).await;
        }
        eprintln!("Machines created in {}", secs(started.elapsed()));
    }

    /// `--fleet-machines` more Machines and KubeadmConfigs, over every Cluster.
    async fn add_fleet(&self, admin: &Client, args: &Args) {
        if args.fleet_machines == 0 {
            return;
        }
        let mut clusters: Vec<(String, String)> = (0..self.loaded.len())
            .map(|i| (namespace(i), format!("c{i}")))
            .collect();
        clusters.extend((0..self.quiet_clusters).map(|k| ("quiet".to_owned(), format!("quiet-{k}"))));
        eprintln!(
            "creating a fleet of {} Machines and KubeadmConfigs over {} Clusters…",
            args.fleet_machines,
            clusters.len()
        );
        let started = Instant::now();
        tests::fleet::create(admin, &clusters, args.fleet_machines, 64).await;
        eprintln!("fleet created in {}", secs(started.elapsed()));
    }

    async fn start_replicas(&mut self, args: &Args) {
        let names = if args.replica_names.is_empty() {
            choose_names(&self.uids, &self.all_uids, args.replicas)
        } else {
            args.replica_names.clone()
        };
        eprintln!("replica names: {}", names.join(", "));
        let binary = signer_binary(args);
        for name in names {
            let mut flags: Vec<String> = [
                "--coordination",
                "shard",
                "--replica-name",
                &name,
                "--log-format",
                "json",
            ]
            .map(String::from)
            .to_vec();
            flags.extend(args.signer_flags.iter().cloned());
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let (signer, proxy) = if args.cut_every.is_zero() {
                (
                    Signer::start_with_defaults(&binary, &self.management, &flags).await,
                    None,
                )
            } else {
                // Its own way to the management apiserver, which the chaos can cut.
                let direct = Signer::management_identity(&self.management).await;
                let server: std::net::SocketAddr =
                    self.management.server.trim_start_matches("https://").parse().unwrap();
                let proxy = Proxy::start(server);
                let kubeconfig = self.management.dir().join(format!("replica-{name}.kubeconfig"));
                let text = std::fs::read_to_string(&direct).unwrap();
                std::fs::write(&kubeconfig, text.replace(&self.management.server, &proxy.url())).unwrap();
                let signer = Signer::spawn_with(&binary, &self.management, &kubeconfig, &[], &flags);
                (signer, Some(proxy))
            };
            let mut replica = Replica::new(name, signer);
            replica.proxy = proxy;
            self.replicas.push(replica);
        }
        self.wait_shared().await;
    }

    fn fleet(&self) -> usize {
        self.loaded.len() + self.quiet_clusters
    }

    /// Until every replica counts every member and their Ready clusters sum to the fleet.
    async fn wait_shared(&mut self) {
        let (n, fleet) = (self.replicas.len() as f64, self.fleet() as f64);
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let texts: Vec<String> = self.replicas.iter().map(|r| r.signer.metrics()).collect();
            let members_ok = texts.iter().all(|t| metric(t, "node_attestation_shard_members ") == n);
            let ready: f64 = texts
                .iter()
                .map(|t| metric(t, "node_attestation_clusters{state=\"Ready\"}"))
                .sum();
            if members_ok && ready == fleet {
                return;
            }
            for r in &mut self.replicas {
                assert!(r.signer.alive(), "replica {} exited:\n{}", r.name, r.signer.log());
            }
            assert!(
                Instant::now() < deadline,
                "replicas not sharing the fleet of {fleet} after 180 s (Ready {ready}):\n{}",
                tail(&self.replicas[0].signer.log(), 40)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn log_path(&self) -> PathBuf {
        self.replicas[0].signer.log_path().to_owned()
    }
}

fn namespace(cluster: usize) -> String {
    format!("soak-{cluster}")
}

/// `<namespace>/<name>` of loaded cluster `i`, as the signer's logs name it.
fn cluster_key(i: usize) -> String {
    format!("{}/c{i}", namespace(i))
}

fn machine_name(j: usize) -> String {
    format!("n-{j}")
}

fn provider_id(cluster: usize, machine: &str) -> String {
    format!("soak:///c{cluster}/{machine}")
}

async fn cluster_uid(admin: &Client, namespace: &str, name: &str) -> String {
    let cluster = live::get(
        admin,
        &json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": name, "namespace": namespace}}),
    )
    .await;
    cluster["metadata"]["uid"].as_str().expect("uid").to_owned()
}

/// `count` quiet opted-in Clusters in namespace `quiet` on one more apiserver.
async fn add_quiet(etcd: &SharedEtcd, admin: &Client, count: usize) -> Workload {
    live::quiet_clusters(Envtest::start_on("signer-soak quiet", etcd), admin, "quiet", count).await
}

/// `--signer-bin`, else `node-attestation-signer` next to this binary.
fn signer_binary(args: &Args) -> PathBuf {
    args.signer_bin.clone().unwrap_or_else(|| {
        let me = std::env::current_exe().expect("own path");
        live::sibling_binary(me.to_str().expect("UTF-8 path"), "node-attestation-signer")
    })
}

// ---------------------------------------------------------------------------------------------
// Which replica names give every replica a loaded cluster

/// The signer's own assignment, compiled in here: the signer is a binary (no library to link),
/// and the names must be chosen by exactly the code its replicas run.
#[path = "../../../signer/src/controller/fleet/shard.rs"]
mod shard;

/// `replicas` names among a..z (first in order) under which every replica owns at least one of
/// the loaded clusters `loaded`, all replicas live; a, b, c, … when none does. Owners as the
/// signer assigns them over `all` opted-in Clusters ([`shard::assign`]).
fn choose_names(loaded: &[String], all: &[String], replicas: usize) -> Vec<String> {
    let candidates: Vec<String> = ('a'..='z').map(String::from).collect();
    let uids: Vec<&str> = all.iter().map(String::as_str).collect();
    let covers = |chosen: &[usize]| {
        let members: Vec<String> = chosen.iter().map(|c| member(&candidates[*c])).collect();
        let owners = shard::assign(&uids, &members);
        let serving_loaded: HashSet<&str> = uids
            .iter()
            .zip(owners)
            .filter(|(uid, _)| loaded.iter().any(|l| l == *uid))
            .filter_map(|(_, owner)| owner)
            .collect();
        members.iter().all(|m| serving_loaded.contains(m.as_str()))
    };
    let chosen = combinations(candidates.len(), replicas)
        .find(|chosen| covers(chosen))
        .unwrap_or_else(|| (0..replicas).collect());
    chosen.into_iter().map(|c| candidates[c].clone()).collect()
}

/// Every `k`-subset of `0..n` in lexicographic order.
fn combinations(n: usize, k: usize) -> impl Iterator<Item = Vec<usize>> {
    let mut next = (k <= n).then(|| (0..k).collect::<Vec<usize>>());
    std::iter::from_fn(move || {
        let current = next.clone()?;
        let mut following = current.clone();
        next = (0..k).rev().find(|&i| following[i] < n - k + i).map(|i| {
            following[i] += 1;
            for j in i + 1..k {
                following[j] = following[j - 1] + 1;
            }
            following
        });
        Some(current)
    })
}

fn member(replica: &str) -> String {
    format!("{MEMBER_PREFIX}{replica}")
}

// ---------------------------------------------------------------------------------------------
// Replicas and their log

/// A replica: its process and the figures kept across its incarnations.
struct Replica {
    name: String,
    signer: Signer,
    /// Its way to the management apiserver, with `--cut-every`.
    proxy: Option<Proxy>,
    /// Highest `VmHWM` of any incarnation.
    peak_kib: u64,
    incarnations: usize,
    /// Exits nobody asked for.
    crashes: usize,
}

impl Replica {
    fn new(name: String, signer: Signer) -> Self {
        Self {
            name,
            signer,
            proxy: None,
            peak_kib: 0,
            incarnations: 1,
            crashes: 0,
        }
    }

    fn sample_rss(&mut self) {
        if let Some(kib) = self.signer.pid().and_then(|pid| proc_status_kib(pid, "VmHWM")) {
            self.peak_kib = self.peak_kib.max(kib);
        }
    }

    fn kill(&mut self) {
        self.sample_rss();
        self.signer.kill();
    }

    fn restart(&mut self) {
        self.signer.restart();
        self.incarnations += 1;
    }
}

/// The replicas' shared JSON log, followed for `shard hand-over` lines: who serves which
/// Cluster now, and when each gain was read.
struct ShardLog {
    path: PathBuf,
    offset: u64,
    partial: String,
    gains: Vec<Gain>,
    owner: HashMap<String, String>,
}

/// A replica started serving a Cluster (read within a tick of the line being written).
struct Gain {
    at: Instant,
    cluster: String,
    replica: String,
}

impl ShardLog {
    fn new(path: PathBuf) -> Self {
        let mut log = Self {
            path,
            offset: 0,
            partial: String::new(),
            gains: Vec::new(),
            owner: HashMap::new(),
        };
        log.poll();
        log
    }

    fn poll(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_string(&mut text).is_err() {
            return;
        }
        self.offset += text.len() as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=end).collect();
        let now = Instant::now();
        for line in complete.lines() {
            if let Some((cluster, replica)) = gained(line) {
                self.owner.insert(cluster.clone(), replica.clone());
                self.gains.push(Gain {
                    at: now,
                    cluster,
                    replica,
                });
            }
        }
    }

    /// The Clusters `replica` serves now (as far as the log says).
    fn served_by(&self, replica: &str) -> Vec<String> {
        let member = member(replica);
        let mut clusters: Vec<String> = self
            .owner
            .iter()
            .filter(|(_, r)| **r == member)
            .map(|(c, _)| c.clone())
            .collect();
        clusters.sort();
        clusters
    }

    /// The first gain of `cluster` after `since`.
    fn gained_after(&self, cluster: &str, since: Instant) -> Option<&Gain> {
        self.gains.iter().find(|g| g.cluster == cluster && g.at >= since)
    }
}

/// `(cluster, replica)` of a JSON `shard hand-over` line with `direction` `gained`.
fn gained(line: &str) -> Option<(String, String)> {
    if !line.contains("shard hand-over") {
        return None;
    }
    let v: Value = serde_json::from_str(line).ok()?;
    let field = |name: &str| {
        v.get(name)
            .or_else(|| v.pointer(&format!("/fields/{name}")))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    (field("direction")? == "gained").then_some(())?;
    Some((field("cluster")?, field("replica")?))
}

// ---------------------------------------------------------------------------------------------
// The plan: which kind of CSR each slot files

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A first join from the bootstrap token.
    Join,
    /// Another join for a Machine already used: must be denied.
    Duplicate,
    /// A renewal by a node that joined, with its own certificate.
    Renewal,
}

struct Plan {
    kinds: Vec<Kind>,
    interval: Duration,
}

impl Plan {
    /// Exact shares, shuffled; the first slots are joins so that renewals and duplicates have
    /// something to renew and to duplicate.
    fn new(args: &Args, seed: u64) -> Self {
        let (joins, duplicates, renewals) = Self::shares(args);
        let warmup = joins.min((args.csrs / 50).max(30));
        let mut rest: Vec<Kind> = std::iter::repeat_n(Kind::Join, joins - warmup)
            .chain(std::iter::repeat_n(Kind::Duplicate, duplicates))
            .chain(std::iter::repeat_n(Kind::Renewal, renewals))
            .collect();
        let mut rng = Rng::new(seed ^ 0x504c_414e);
        for i in (1..rest.len()).rev() {
            rest.swap(i, rng.below(i + 1));
        }
        let kinds: Vec<Kind> = std::iter::repeat_n(Kind::Join, warmup).chain(rest).collect();
        Self {
            interval: args.duration.div_f64(kinds.len().max(1) as f64),
            kinds,
        }
    }

    /// `(joins, duplicates, renewals)` summing to `--csrs`.
    fn shares(args: &Args) -> (usize, usize, usize) {
        let duplicates = args.csrs * args.duplicates.min(100) / 100;
        let renewals = (args.csrs * args.renewals.min(100) / 100).min(args.csrs - duplicates);
        (args.csrs - duplicates - renewals, duplicates, renewals)
    }

    fn machines_per_cluster(args: &Args, clusters: usize) -> usize {
        Self::shares(args).0.div_ceil(clusters.max(1))
    }

    fn count(&self, kind: Kind) -> usize {
        self.kinds.iter().filter(|k| **k == kind).count()
    }
}

// ---------------------------------------------------------------------------------------------
// What was filed and how it ended

/// One CSR filed: `(loaded cluster, CSR name)`.
type Key = (usize, String);

struct Record {
    kind: Kind,
    /// The node (and Machine) it asks for.
    node: String,
    filed_at: Instant,
    /// The creation failed (the apiserver, not the signer).
    not_filed: bool,
    /// First end the harness's watch saw, and when.
    end: Option<(Instant, Final)>,
    /// A second, different certificate was seen on this CSR.
    rewritten: bool,
}

#[derive(Default)]
struct Ledger {
    records: HashMap<Key, Record>,
    /// Nodes with a join certificate: `(cluster, node, certificate PEM)`.
    joined: Vec<(usize, String, String)>,
    /// Joins filed so far: `(cluster, machine, when)`, for duplicates to aim at.
    join_targets: Vec<(usize, String, Instant)>,
}

impl Ledger {
    fn record_end(&mut self, key: &Key, state: Final) {
        let Some(record) = self.records.get_mut(key) else {
            return;
        };
        match (&record.end, &state) {
            (None, _) => {
                if let (Final::Issued(pem), Kind::Join | Kind::Duplicate) = (&state, record.kind) {
                    self.joined.push((key.0, record.node.clone(), pem.clone()));
                }
                record.end = Some((Instant::now(), state));
            }
            (Some((_, Final::Issued(first))), Final::Issued(again)) if first != again => record.rewritten = true,
            _ => {}
        }
    }

    fn pending(&self) -> usize {
        self.records
            .values()
            .filter(|r| r.end.is_none() && !r.not_filed)
            .count()
    }
}

type Shared = Arc<Mutex<Ledger>>;

/// A watch of every loaded cluster's CSRs into the ledger.
fn watch(ledger: &Shared, cluster: usize, admin: &Client) -> tokio::task::JoinHandle<()> {
    let (ledger, api) = (Arc::clone(ledger), Api::<CertificateSigningRequest>::all(admin.clone()));
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) = event else {
                continue;
            };
            let state = live::state_of(&csr);
            if matches!(state, Final::Issued(_) | Final::Denied(..) | Final::Failed(..)) {
                let key = (cluster, csr.metadata.name.clone().unwrap_or_default());
                ledger.lock().unwrap().record_end(&key, state);
            }
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Filing

/// Files the plan's CSRs at its even rate; returns when every creation has returned.
async fn file_all(loaded: &[Workload], plan: &Plan, ledger: &Shared, seed: u64, start: Instant) {
    let mut rng = Rng::new(seed ^ 0x4649_4c45);
    let mut next_machine = vec![0usize; loaded.len()];
    let mut joins = 0usize;
    let mut tasks = Vec::new();
    for (slot, planned) in plan.kinds.iter().enumerate() {
        tokio::time::sleep_until((start + plan.interval.mul_f64(slot as f64)).into()).await;
        let filing = match planned {
            Kind::Join => {
                let cluster = joins % loaded.len();
                joins += 1;
                let machine = machine_name(next_machine[cluster]);
                next_machine[cluster] += 1;
                Filing::join(&loaded[cluster], cluster, &machine, "join", Kind::Join)
            }
            Kind::Renewal => match pick_joined(ledger, &mut rng) {
                Some((cluster, node, pem)) => Filing::renewal(&loaded[cluster], cluster, &node, &pem, slot),
                None => duplicate(loaded, ledger, &mut rng, slot),
            },
            Kind::Duplicate => duplicate(loaded, ledger, &mut rng, slot),
        };
        tasks.push((filing.key.clone(), filing.start(ledger)));
    }
    for (key, task) in tasks {
        if task.await.is_err()
            && let Some(r) = ledger.lock().unwrap().records.get_mut(&key)
        {
            r.not_filed = true;
        }
    }
}

/// A duplicate join: half the time for a Machine whose join was filed in the last 5 s (it may
/// still be pending: a real race), else for any Machine used before.
fn duplicate(loaded: &[Workload], ledger: &Shared, rng: &mut Rng, slot: usize) -> Filing {
    let (cluster, machine) = {
        let ledger = ledger.lock().unwrap();
        let targets = &ledger.join_targets;
        let recent = targets.partition_point(|(_, _, at)| at.elapsed() > Duration::from_secs(5));
        let from = if recent < targets.len() && rng.below(2) == 0 {
            recent
        } else {
            0
        };
        let (cluster, machine, _) = &targets[from + rng.below(targets.len() - from)];
        (*cluster, machine.clone())
    };
    Filing::join(
        &loaded[cluster],
        cluster,
        &machine,
        &format!("dup-{slot}"),
        Kind::Duplicate,
    )
}

fn pick_joined(ledger: &Shared, rng: &mut Rng) -> Option<(usize, String, String)> {
    let ledger = ledger.lock().unwrap();
    let joined = &ledger.joined;
    (!joined.is_empty()).then(|| joined[rng.below(joined.len())].clone())
}

/// One CSR about to be filed: its key, kind, node, request, and who files it.
struct Filing {
    key: Key,
    kind: Kind,
    node: String,
    request: Vec<u8>,
    requester: Requester,
}

enum Requester {
    /// The cluster's bootstrap-token client.
    Bootstrap(Client),
    /// A kubeconfig with the node's own certificate (a client built when filing).
    Node(PathBuf),
}

impl Filing {
    /// A join (or duplicate) of `machine`, named `<prefix>-<machine>`.
    fn join(w: &Workload, cluster: usize, machine: &str, prefix: &str, kind: Kind) -> Self {
        Self {
            key: (cluster, format!("{prefix}-{machine}")),
            kind,
            node: machine.to_owned(),
            request: RequestSpec::kubelet(machine, &provider_id(cluster, machine)).build(),
            requester: Requester::Bootstrap(w.bootstrap.clone()),
        }
    }

    /// A renewal by `node` with its certificate `pem` (the fixtures' one P-256 key).
    fn renewal(w: &Workload, cluster: usize, node: &str, pem: &str, slot: usize) -> Self {
        let name = format!("renew-{slot}-{node}");
        let key_pem = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
        let kubeconfig = w.env.kubeconfig_for_certificate(&name, pem, &key_pem);
        Self {
            key: (cluster, name),
            kind: Kind::Renewal,
            node: node.to_owned(),
            request: RequestSpec::kubelet(node, &provider_id(cluster, node)).build(),
            requester: Requester::Node(kubeconfig),
        }
    }

    /// Records the CSR, then files it in a task of its own (which panics if it cannot).
    fn start(self, ledger: &Shared) -> tokio::task::JoinHandle<()> {
        {
            let mut ledger = ledger.lock().unwrap();
            if self.kind == Kind::Join {
                ledger
                    .join_targets
                    .push((self.key.0, self.node.clone(), Instant::now()));
            }
            ledger.records.insert(
                self.key.clone(),
                Record {
                    kind: self.kind,
                    node: self.node.clone(),
                    filed_at: Instant::now(),
                    not_filed: false,
                    end: None,
                    rewritten: false,
                },
            );
        }
        tokio::spawn(async move {
            let client = match self.requester {
                Requester::Bootstrap(client) => client,
                Requester::Node(kubeconfig) => live::client(&kubeconfig).await,
            };
            file_csr(&client, &self.key.1, SIGNER_INSECURE, &self.request, CLIENT_USAGES).await;
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Chaos: kills, restarts, memory, the log

/// One SIGKILL and what the killed replica served at that moment.
struct Kill {
    at: Instant,
    /// Since the first CSR was filed.
    after_start: Duration,
    replica: String,
    down_for: Duration,
    /// Every Cluster it served (`<namespace>/<name>`).
    clusters: Vec<String>,
    /// The loaded clusters among them, by index.
    loaded: Vec<usize>,
}

/// One cut of a replica's management connection.
struct Cut {
    replica: String,
    /// The join filed during it, if the replica served a loaded cluster then.
    join: Option<Key>,
}

/// What the chaos needs to file a join during a cut.
struct CutJoins<'a> {
    admin: Client,
    loaded: &'a [Workload],
    ledger: &'a Shared,
}

struct Chaos {
    replicas: Vec<Replica>,
    log: ShardLog,
    kills: Vec<Kill>,
    cuts: Vec<Cut>,
    /// The replica cut now and when its connection comes back.
    restore: Option<(usize, Instant)>,
    rng: Rng,
    loaded: usize,
    restart: Option<(usize, Instant)>,
    /// When the first CSR was filed.
    start: Instant,
}

impl Chaos {
    /// Kills every `kill_every` (and cuts every `cut_every`) until `filing_ends`, then keeps
    /// sampling until `stop` says so.
    async fn run(
        &mut self,
        args: &Args,
        start: Instant,
        filing_ends: Instant,
        stop: &Mutex<bool>,
        joins: &CutJoins<'_>,
    ) {
        let mut next_kill = (!args.kill_every.is_zero()).then(|| start + args.kill_every);
        let mut next_cut = (!args.cut_every.is_zero()).then(|| start + args.cut_every / 2);
        while !*stop.lock().unwrap() {
            self.tick();
            if let Some((index, at)) = self.restore
                && Instant::now() >= at
            {
                if let Some(proxy) = &self.replicas[index].proxy {
                    proxy.restore();
                }
                eprintln!(
                    "management connection of replica {} restored",
                    self.replicas[index].name
                );
                self.restore = None;
            }
            if let Some(at) = next_cut.filter(|at| Instant::now() >= *at) {
                if at < filing_ends && self.restore.is_none() {
                    self.cut_one(args, joins).await;
                }
                next_cut = Some(at + args.cut_every);
            }
            if let Some((index, at)) = self.restart
                && Instant::now() >= at
            {
                self.replicas[index].restart();
                self.restart = None;
            }
            if let Some(at) = next_kill.filter(|at| Instant::now() >= *at) {
                if at < filing_ends && self.restart.is_none() {
                    self.kill_one(args);
                }
                next_kill = Some(at + args.kill_every);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if let Some((index, _)) = self.restart.take() {
            self.replicas[index].restart();
        }
        if let Some((index, _)) = self.restore.take()
            && let Some(proxy) = &self.replicas[index].proxy
        {
            proxy.restore();
        }
        self.tick();
    }

    /// Cuts a random live replica's management connection for `--cut-for`; meanwhile creates a
    /// Machine in one of its loaded clusters and files its join a second later.
    async fn cut_one(&mut self, args: &Args, joins: &CutJoins<'_>) {
        let live: Vec<usize> = (0..self.replicas.len())
            .filter(|i| self.restart.is_none_or(|(r, _)| r != *i))
            .collect();
        if live.is_empty() {
            return;
        }
        let index = live[self.rng.below(live.len())];
        self.log.poll();
        let name = self.replicas[index].name.clone();
        let served = self.log.served_by(&name);
        let loaded: Vec<usize> = (0..self.loaded).filter(|i| served.contains(&cluster_key(*i))).collect();
        if let Some(proxy) = &self.replicas[index].proxy {
            proxy.cut();
        }
        self.restore = Some((index, Instant::now() + args.cut_for));
        let mut cut = Cut {
            replica: name.clone(),
            join: None,
        };
        if !loaded.is_empty() {
            let cluster = loaded[self.rng.below(loaded.len())];
            let machine = format!("cut-{}", self.cuts.len());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let w = &joins.loaded[cluster];
            w.add_machine(&joins.admin, &machine, &provider_id(cluster, &machine))
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let filing = Filing::join(w, cluster, &machine, "cut", Kind::Join);
            cut.join = Some(filing.key.clone());
            drop(filing.start(joins.ledger));
        }
        eprintln!(
            "cut replica {name}'s management connection for {} (serving {}); join filed meanwhile: {}",
            secs(args.cut_for),
            served.join(", "),
            cut.join
                .as_ref()
                .map_or("none (no loaded cluster)".to_owned(), |(c, n)| format!("c{c}/{n}")),
        );
        self.cuts.push(cut);
    }

    fn tick(&mut self) {
        self.log.poll();
        for (i, r) in self.replicas.iter_mut().enumerate() {
            r.sample_rss();
            let restarting = self.restart.is_some_and(|(index, _)| index == i);
            if !restarting && !r.signer.alive() {
                eprintln!(
                    "replica {} exited by itself; restarting it:\n{}",
                    r.name,
                    tail(&r.signer.log(), 20)
                );
                r.crashes += 1;
                r.restart();
            }
        }
    }

    fn kill_one(&mut self, args: &Args) {
        let index = self.rng.below(self.replicas.len());
        let down_for = self.rng.duration(args.down_for);
        self.log.poll();
        let replica = &mut self.replicas[index];
        let clusters = self.log.served_by(&replica.name);
        let loaded = (0..self.loaded)
            .filter(|i| clusters.contains(&cluster_key(*i)))
            .collect();
        replica.kill();
        eprintln!(
            "SIGKILL replica {} (serving {}); back in {}",
            replica.name,
            clusters.join(", "),
            secs(down_for)
        );
        self.kills.push(Kill {
            at: Instant::now(),
            after_start: self.start.elapsed(),
            replica: replica.name.clone(),
            down_for,
            clusters,
            loaded,
        });
        self.restart = Some((index, Instant::now() + down_for));
    }
}

// ---------------------------------------------------------------------------------------------
// The soak

async fn soak(args: &Args, world: World, plan: &Plan, seed: u64) -> Report {
    let ledger: Shared = Arc::default();
    let watches: Vec<_> = world
        .loaded
        .iter()
        .enumerate()
        .map(|(i, w)| watch(&ledger, i, &w.admin))
        .collect();
    let log = ShardLog::new(world.log_path());
    let assignment = Assignment::read(&world, &log);
    let World {
        loaded,
        replicas,
        management,
        quiet,
        _etcd,
        ..
    } = world;
    let mut chaos = Chaos {
        replicas,
        log,
        kills: Vec::new(),
        cuts: Vec::new(),
        restore: None,
        rng: Rng::new(seed ^ 0x4b49_4c4c),
        loaded: loaded.len(),
        restart: None,
        start: Instant::now(),
    };
    eprintln!(
        "filing {} CSRs over {} ({} joins, {} renewals, {} duplicates), a kill every {}…",
        plan.kinds.len(),
        secs(args.duration),
        plan.count(Kind::Join),
        plan.count(Kind::Renewal),
        plan.count(Kind::Duplicate),
        secs(args.kill_every)
    );
    let start = chaos.start;
    let filing_ends = start + args.duration;
    let stop = Mutex::new(false);
    let filing = async {
        file_all(&loaded, plan, &ledger, seed, start).await;
        let deadline = Instant::now().max(filing_ends) + args.grace;
        while ledger.lock().unwrap().pending() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        *stop.lock().unwrap() = true;
    };
    let joins = CutJoins {
        admin: live::client(&management.admin_kubeconfig).await,
        loaded: &loaded,
        ledger: &ledger,
    };
    tokio::join!(filing, chaos.run(args, start, filing_ends, &stop, &joins));
    drop(joins);
    let elapsed = start.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    watches.iter().for_each(|w| w.abort());
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    if let Some(path) = &args.dump {
        dump(path, &ledger, start);
    }
    let report = Report::new(ledger, &chaos, assignment, elapsed, args);
    if !report.clean() {
        eprintln!("replicas' log (end):\n{}", tail(&chaos.replicas[0].signer.log(), 60));
    }
    drop((chaos, loaded, quiet, management));
    report
}

/// Who served what when the soak began.
struct Assignment {
    /// Per replica: name, Clusters owned (its gauge), loaded clusters (its log).
    replicas: Vec<(String, f64, Vec<usize>)>,
}

impl Assignment {
    fn read(world: &World, log: &ShardLog) -> Self {
        let replicas = world
            .replicas
            .iter()
            .map(|r| {
                let owned = metric(&r.signer.metrics(), "node_attestation_shard_clusters_owned ");
                let served = log.served_by(&r.name);
                let loaded = (0..world.loaded.len())
                    .filter(|i| served.contains(&cluster_key(*i)))
                    .collect();
                (r.name.clone(), owned, loaded)
            })
            .collect();
        Self { replicas }
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

/// What the soak measured.
struct Report {
    filed: BTreeMap<&'static str, usize>,
    not_filed: Vec<String>,
    issued_joins: usize,
    renewal_certificates: usize,
    renewed_nodes: usize,
    /// Denials (and `Failed`) of duplicates and of joins that lost to one, by reason.
    expected_denials: BTreeMap<String, usize>,
    lost: Vec<String>,
    double_signed: Vec<String>,
    wrongly_denied: Vec<String>,
    /// Joins' creation to certificate observed, sorted.
    join_latencies: Vec<Duration>,
    kills: Vec<KillFigures>,
    /// Per cut: the replica cut, and how the join filed during it ended (and after how long).
    cuts: Vec<(String, String)>,
    /// Per replica: name, peak `VmHWM`, incarnations, exits nobody asked for.
    rss: Vec<(String, u64, usize, usize)>,
    assignment: Assignment,
    elapsed: Duration,
}

/// One kill's hand-over and the joins around it.
struct KillFigures {
    after_start: Duration,
    replica: String,
    down_for: Duration,
    clusters: usize,
    /// Kill to the last of its Clusters gained again (by anyone), and by whom each.
    taken_over: Option<Duration>,
    taken_by: BTreeMap<String, usize>,
    /// Per loaded cluster it served: kill to the first certificate of a CSR filed after it.
    served_again: Vec<(usize, Option<Duration>)>,
    /// Joins filed within `--around` after the kill: all clusters, and the victim's.
    around: Vec<Duration>,
    around_victim: Vec<Duration>,
}

impl Report {
    fn new(ledger: Ledger, chaos: &Chaos, assignment: Assignment, elapsed: Duration, args: &Args) -> Self {
        let mut report = Self {
            filed: BTreeMap::new(),
            not_filed: Vec::new(),
            issued_joins: 0,
            renewal_certificates: 0,
            renewed_nodes: 0,
            expected_denials: BTreeMap::new(),
            lost: Vec::new(),
            double_signed: Vec::new(),
            wrongly_denied: Vec::new(),
            join_latencies: Vec::new(),
            kills: Vec::new(),
            cuts: chaos
                .cuts
                .iter()
                .map(|cut| (cut.replica.clone(), cut_outcome(cut, &ledger)))
                .collect(),
            rss: chaos
                .replicas
                .iter()
                .map(|r| (r.name.clone(), r.peak_kib, r.incarnations, r.crashes))
                .collect(),
            assignment,
            elapsed,
        };
        report.count(&ledger);
        report.judge_joins(&ledger);
        report.judge_renewals(&ledger);
        report.join_latencies = join_latencies(&ledger, |_, _| true);
        report.kills = chaos
            .kills
            .iter()
            .map(|k| kill_figures(k, &ledger, &chaos.log, args))
            .collect();
        report
    }

    fn count(&mut self, ledger: &Ledger) {
        for ((cluster, name), r) in &ledger.records {
            *self.filed.entry(kind_name(r.kind)).or_default() += 1;
            if r.not_filed {
                self.not_filed.push(format!("c{cluster}/{name}"));
            } else if r.end.is_none() {
                self.lost.push(format!("c{cluster}/{name} ({})", kind_name(r.kind)));
            }
            if r.rewritten {
                self.double_signed
                    .push(format!("c{cluster}/{name}: certificate written twice"));
            }
        }
    }

    /// Per Machine, its join and duplicates: one certificate, the rest denied; none issued and
    /// some denied is a valid join wrongly denied.
    fn judge_joins(&mut self, ledger: &Ledger) {
        let mut machines: BTreeMap<(usize, &str), Vec<(&str, &Record)>> = BTreeMap::new();
        for ((cluster, name), r) in &ledger.records {
            if r.kind != Kind::Renewal {
                machines
                    .entry((*cluster, r.node.as_str()))
                    .or_default()
                    .push((name.as_str(), r));
            }
        }
        for ((cluster, machine), csrs) in machines {
            let issued: Vec<&str> = csrs
                .iter()
                .filter(|(_, r)| matches!(r.end, Some((_, Final::Issued(_)))))
                .map(|(name, _)| *name)
                .collect();
            if issued.len() > 1 {
                self.double_signed
                    .push(format!("c{cluster}/{machine}: certificates from {issued:?}"));
            }
            self.issued_joins += usize::from(!issued.is_empty());
            for (name, r) in &csrs {
                let Some((_, Final::Denied(reason, message) | Final::Failed(reason, message))) = &r.end else {
                    continue;
                };
                if issued.is_empty() && r.kind == Kind::Join {
                    self.wrongly_denied
                        .push(format!("c{cluster}/{name} (join of {machine}): {reason}: {message}"));
                } else {
                    *self.expected_denials.entry(reason.clone()).or_default() += 1;
                }
            }
        }
    }

    fn judge_renewals(&mut self, ledger: &Ledger) {
        let mut nodes = std::collections::HashSet::new();
        for ((cluster, name), r) in ledger.records.iter().filter(|(_, r)| r.kind == Kind::Renewal) {
            match &r.end {
                Some((_, Final::Issued(_))) => {
                    self.renewal_certificates += 1;
                    nodes.insert((*cluster, r.node.clone()));
                }
                Some((_, Final::Denied(reason, message) | Final::Failed(reason, message))) => self.wrongly_denied.push(
                    format!("c{cluster}/{name} (renewal of {}): {reason}: {message}", r.node),
                ),
                _ => {}
            }
        }
        self.renewed_nodes = nodes.len();
    }

    fn clean(&self) -> bool {
        self.lost.is_empty() && self.double_signed.is_empty() && self.wrongly_denied.is_empty()
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Join => "joins",
        Kind::Duplicate => "duplicates",
        Kind::Renewal => "renewals",
    }
}

/// Sorted latencies of issued joins whose `(cluster, filed_at)` pass `keep`.
fn join_latencies(ledger: &Ledger, keep: impl Fn(usize, Instant) -> bool) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = ledger
        .records
        .iter()
        .filter(|((cluster, _), r)| r.kind == Kind::Join && keep(*cluster, r.filed_at))
        .filter_map(|(_, r)| match &r.end {
            Some((at, Final::Issued(_))) => Some(at.saturating_duration_since(r.filed_at)),
            _ => None,
        })
        .collect();
    latencies.sort();
    latencies
}

fn kill_figures(kill: &Kill, ledger: &Ledger, log: &ShardLog, args: &Args) -> KillFigures {
    let gains: Vec<&Gain> = kill
        .clusters
        .iter()
        .filter_map(|c| log.gained_after(c, kill.at))
        .collect();
    let mut taken_by = BTreeMap::new();
    for g in &gains {
        let by = g.replica.strip_prefix(MEMBER_PREFIX).unwrap_or(&g.replica);
        let who = if by == kill.replica {
            format!("{by} (restarted)")
        } else {
            by.to_owned()
        };
        *taken_by.entry(who).or_default() += 1;
    }
    let taken_over = (gains.len() == kill.clusters.len())
        .then(|| gains.iter().map(|g| g.at - kill.at).max())
        .flatten();
    let window = kill.at..kill.at + args.around;
    KillFigures {
        after_start: kill.after_start,
        replica: kill.replica.clone(),
        down_for: kill.down_for,
        clusters: kill.clusters.len(),
        taken_over,
        taken_by,
        served_again: kill
            .loaded
            .iter()
            .map(|c| (*c, first_certificate_after(ledger, *c, kill.at)))
            .collect(),
        around: join_latencies(ledger, |_, filed| window.contains(&filed)),
        around_victim: join_latencies(ledger, |c, filed| kill.loaded.contains(&c) && window.contains(&filed)),
    }
}

/// How the join filed during `cut` ended.
fn cut_outcome(cut: &Cut, ledger: &Ledger) -> String {
    let Some(key) = &cut.join else {
        return "no join (it served no loaded cluster)".to_owned();
    };
    let name = format!("c{}/{}", key.0, key.1);
    match ledger
        .records
        .get(key)
        .and_then(|r| r.end.as_ref().map(|(at, end)| (*at - r.filed_at, end)))
    {
        Some((after, Final::Issued(_))) => format!("{name} issued {} after it was filed", secs(after)),
        Some((_, Final::Denied(reason, _) | Final::Failed(reason, _))) => format!("{name} DENIED {reason}"),
        _ => format!("{name} not ended"),
    }
}

/// Kill to the first certificate observed in `cluster` for a CSR filed after the kill.
fn first_certificate_after(ledger: &Ledger, cluster: usize, kill: Instant) -> Option<Duration> {
    ledger
        .records
        .iter()
        .filter(|((c, _), r)| *c == cluster && r.filed_at >= kill)
        .filter_map(|(_, r)| match &r.end {
            Some((at, Final::Issued(_))) => Some(*at - kill),
            _ => None,
        })
        .min()
}

/// One CSV line per CSR filed.
fn dump(path: &std::path::Path, ledger: &Ledger, start: Instant) {
    let mut lines = vec!["cluster,name,kind,filed_s,ended_s,end".to_owned()];
    for ((cluster, name), r) in &ledger.records {
        let (ended, end) = match &r.end {
            Some((at, Final::Issued(_))) => (at.saturating_duration_since(start).as_secs_f64(), "Issued".to_owned()),
            Some((at, Final::Denied(reason, _))) => (
                at.saturating_duration_since(start).as_secs_f64(),
                format!("Denied {reason}"),
            ),
            Some((at, Final::Failed(reason, _))) => (
                at.saturating_duration_since(start).as_secs_f64(),
                format!("Failed {reason}"),
            ),
            _ => (f64::NAN, "none".to_owned()),
        };
        lines.push(format!(
            "c{cluster},{name},{},{:.3},{ended:.3},{end}",
            kind_name(r.kind),
            r.filed_at.saturating_duration_since(start).as_secs_f64()
        ));
    }
    std::fs::write(path, lines.join("\n") + "\n").expect("write --dump");
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Printing

impl Report {
    fn print(&self, args: &Args, plan: &Plan) {
        println!(
            "\nsoak: {} CSRs over {} ({} per s), {} replicas --coordination=shard, {} loaded workload apiservers + {} quiet Clusters, SIGKILL every {} (down 0 to {}), grace {}",
            plan.kinds.len(),
            secs(args.duration),
            format_args!("{:.1}", plan.kinds.len() as f64 / args.duration.as_secs_f64().max(1e-9)),
            self.rss.len(),
            args.workloads,
            args.quiet,
            secs(args.kill_every),
            secs(args.down_for),
            secs(args.grace),
        );
        if args.fleet_machines > 0 {
            println!(
                "fleet: {} more Machines and KubeadmConfigs over the {} Clusters",
                args.fleet_machines,
                args.workloads + args.quiet
            );
        }
        self.print_assignment();
        self.print_outcomes();
        self.print_latencies(args);
        self.print_kills(args);
        if args.cut_every > Duration::ZERO {
            println!(
                "\ncuts (a replica's management connection down for {}; a Machine created meanwhile, its join filed a second later):",
                secs(args.cut_for)
            );
            for (replica, outcome) in &self.cuts {
                println!("  {replica}: {outcome}");
            }
        }
        self.print_rss();
        let verdict = if self.clean() { "PASS" } else { "FAIL" };
        println!(
            "\n{verdict}: lost {}, double-signed {}, wrongly denied {} (all must be 0); ran {}",
            self.lost.len(),
            self.double_signed.len(),
            self.wrongly_denied.len(),
            secs(self.elapsed)
        );
    }

    fn print_assignment(&self) {
        println!(
            "\nassignment at the start (gauge node_attestation_shard_clusters_owned; loaded clusters from the hand-over log):"
        );
        for (name, owned, loaded) in &self.assignment.replicas {
            let loaded: Vec<String> = loaded.iter().map(|c| format!("c{c}")).collect();
            println!(
                "  replica {name}: owns {owned} Clusters, loaded: {}",
                if loaded.is_empty() {
                    "none".to_owned()
                } else {
                    loaded.join(", ")
                }
            );
        }
    }

    fn print_outcomes(&self) {
        let filed: usize = self.filed.values().sum();
        let kinds: Vec<String> = self.filed.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!("\nfiled:            {filed} ({})", kinds.join(", "));
        if !self.not_filed.is_empty() {
            println!(
                "  not filed (the creation failed): {} {:?}",
                self.not_filed.len(),
                first(&self.not_filed, 5)
            );
        }
        println!(
            "issued:           {} (Machines joined: {}; renewal certificates: {} for {} nodes)",
            self.issued_joins + self.renewal_certificates,
            self.issued_joins,
            self.renewal_certificates,
            self.renewed_nodes
        );
        let expected: usize = self.expected_denials.values().sum();
        println!("denied expectedly: {expected} {:?}", self.expected_denials);
        print_list("LOST (never issued nor denied)", &self.lost);
        print_list("DOUBLE-SIGNED", &self.double_signed);
        print_list("WRONGLY DENIED", &self.wrongly_denied);
    }

    fn print_latencies(&self, args: &Args) {
        let goal = LEASE + GOAL_SLACK;
        let mut around: Vec<Duration> = self.kills.iter().flat_map(|k| k.around.clone()).collect();
        let mut victims: Vec<Duration> = self.kills.iter().flat_map(|k| k.around_victim.clone()).collect();
        around.sort();
        victims.sort();
        println!("\njoin latency (creation -> certificate observed):");
        println!("  overall:                    {}", quantiles(&self.join_latencies));
        println!(
            "  filed within {} after a kill: {}",
            secs(args.around),
            quantiles(&around)
        );
        println!("    in the killed replica's clusters: {}", quantiles(&victims));
        let p99 = percentile(&around, 99.0).max(percentile(&victims, 99.0));
        println!(
            "  goal: p99 around a kill < Lease duration + 5 s = {}: {}",
            secs(goal),
            if around.is_empty() {
                "no kill"
            } else if p99 < goal {
                "met"
            } else {
                "NOT met"
            }
        );
    }

    fn print_kills(&self, args: &Args) {
        if self.kills.is_empty() {
            return;
        }
        println!(
            "\nkills (hand-over: kill -> every Cluster of the killed replica gained again, by whom; its loaded clusters' next certificate):"
        );
        for (i, k) in self.kills.iter().enumerate() {
            let served: Vec<String> = k
                .served_again
                .iter()
                .map(|(c, d)| format!("c{c} {}", d.map_or("never".to_owned(), secs)))
                .collect();
            println!(
                "  {}. t={:>5.0} s replica {} down {}: {} Clusters, taken over in {} by {:?}; next certificate: {}; joins filed in the next {}: {} (victim's clusters p99 {})",
                i + 1,
                k.after_start.as_secs_f64(),
                k.replica,
                secs(k.down_for),
                k.clusters,
                k.taken_over.map_or("(not all)".to_owned(), secs),
                k.taken_by,
                if served.is_empty() {
                    "no loaded cluster".to_owned()
                } else {
                    served.join(", ")
                },
                secs(args.around),
                quantiles(&k.around),
                secs(percentile(&k.around_victim, 99.0)),
            );
        }
    }

    fn print_rss(&self) {
        println!("\npeak RSS per replica (VmHWM, highest of its incarnations):");
        for (name, kib, incarnations, crashes) in &self.rss {
            println!(
                "  replica {name}: {} ({incarnations} incarnations{})",
                mib(*kib),
                if *crashes > 0 {
                    format!(", {crashes} exits by itself")
                } else {
                    String::new()
                }
            );
        }
    }
}

fn quantiles(sorted: &[Duration]) -> String {
    format!(
        "n {}, p50 {}, p99 {}, max {}",
        sorted.len(),
        secs(percentile(sorted, 50.0)),
        secs(percentile(sorted, 99.0)),
        secs(percentile(sorted, 100.0))
    )
}

fn print_list(what: &str, items: &[String]) {
    println!("{what}: {}", items.len());
    let mut sorted = items.to_vec();
    sorted.sort();
    for item in first(&sorted, 50) {
        println!("  {item}");
    }
    if items.len() > 50 {
        println!("  … and {} more", items.len() - 50);
    }
}

fn first(items: &[String], n: usize) -> &[String] {
    &items[..items.len().min(n)]
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn combinations_in_order() {
        let all: Vec<Vec<usize>> = combinations(4, 2).collect();
        assert_eq!(all, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]);
        assert_eq!(combinations(2, 3).count(), 0);
    }

    #[test]
    fn chosen_names_give_every_replica_a_loaded_cluster_as_the_signer_assigns_them() {
        let all: Vec<String> = (0..12).map(|i| format!("7c0e{i:02}-uid")).collect();
        let names = choose_names(&all[..4], &all, 3);
        let members: Vec<String> = names.iter().map(|n| member(n)).collect();
        let uids: Vec<&str> = all.iter().map(String::as_str).collect();
        let owners = shard::assign(&uids, &members);
        for m in &members {
            assert!(owners[..4].contains(&Some(m.as_str())), "{names:?}: {owners:?}");
        }
    }

    #[test]
    fn gained_lines() {
        let line = r#"{"timestamp":"t","level":"INFO","message":"shard hand-over","cluster":"soak-0/c0","replica":"node-attestation-signer-a","direction":"gained"}"#;
        assert_eq!(
            gained(line),
            Some(("soak-0/c0".into(), "node-attestation-signer-a".into()))
        );
        assert_eq!(gained(&line.replace("gained", "released")), None);
    }
}
