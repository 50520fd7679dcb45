//! Sharding on real kube-apiservers (`KUBEBUILDER_ASSETS`; skipped loudly without): three
//! `--coordination=shard` replicas share 32 opted-in Clusters (two loaded workload apiservers and
//! 30 quiet Clusters on a third). Every replica serves some and the sum of their
//! `node_attestation_clusters{state="Ready"}` is the fleet; the replica serving a loaded cluster
//! is SIGKILLed and that cluster's new CSRs are issued by another within the Lease duration plus
//! a few seconds; the killed replica rejoins and takes its share back; a fourth process serving
//! every Cluster (the overlap a hand-over can leave, made permanent) races a shard replica on
//! pairs of CSRs for one Machine; a SIGTERMed replica hands over at once. Throughout, a watch of
//! both loaded clusters' CSRs checks that no certificate is ever written twice and no Machine
//! gets two. Each Machine is kept in memory by the replica serving its Cluster only, before and
//! after the hand-overs.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::events::v1::Event;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::Value;
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::Envtest;
use tests::live::{self, Final, Signer, Workload, file_csr, metric, wait_final};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const REPLICAS: [&str; 3] = ["a", "b", "c"];
const QUIET: usize = 30;
const FLEET: f64 = (QUIET + 2) as f64;
/// The membership Lease duration.
const LEASE: Duration = Duration::from_secs(15);
/// What a hand-over may take beyond the Lease duration: the check tick, the Secrets, the
/// worker's first list, the decision.
const SLACK: Duration = Duration::from_secs(8);

fn pid(cluster: &str, name: &str) -> String {
    format!("aws:///{cluster}/i-{name}")
}

fn ready(signer: &Signer) -> f64 {
    metric(&signer.metrics(), "node_attestation_clusters{state=\"Ready\"}")
}

/// Machines of the loaded clusters (16 each); the quiet ones have none.
const MACHINES: f64 = 32.0;

/// Machines the replica keeps.
fn cached_machines(signer: &Signer) -> f64 {
    metric(&signer.metrics(), "node_attestation_cached_objects{kind=\"Machine\"}")
}

/// Memory follows the shard: every Machine is kept by the one live replica serving its
/// Cluster, none by the others.
fn machines_follow_the_shard(live: &[(&str, &Signer)]) -> bool {
    let cached: Vec<f64> = live.iter().map(|(_, s)| cached_machines(s)).collect();
    cached.iter().sum::<f64>() == MACHINES && cached.iter().all(|c| [0.0, 16.0, 32.0].contains(c))
}

fn members(signer: &Signer) -> f64 {
    metric(&signer.metrics(), "node_attestation_shard_members ")
}

/// The member (Lease) name of replica `name`.
fn member(name: &str) -> String {
    format!("node-attestation-signer-{name}")
}

/// Every CSR's certificate as first seen, every CSR seen with a second, different one, and
/// (through the caller's plan) which Machine each CSR asked for.
#[derive(Default)]
struct Ledger {
    issued: BTreeMap<(String, String), String>,
    rewritten: Vec<(String, String)>,
}

fn watch_csrs(ledger: &Arc<Mutex<Ledger>>, w: &Workload) -> tokio::task::JoinHandle<()> {
    let (ledger, api, cluster) = (
        Arc::clone(ledger),
        Api::<CertificateSigningRequest>::all(w.admin.clone()),
        w.cluster.clone(),
    );
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let (Ok(watcher::Event::Apply(csr)) | Ok(watcher::Event::InitApply(csr))) = event else {
                continue;
            };
            if let Final::Issued(pem) = live::state_of(&csr) {
                let key = (cluster.clone(), csr.metadata.name.clone().unwrap_or_default());
                let mut ledger = ledger.lock().unwrap();
                match ledger.issued.get(&key) {
                    Some(first) if *first != pem => ledger.rewritten.push(key),
                    Some(_) => {}
                    None => {
                        ledger.issued.insert(key, pem);
                    }
                }
            }
        }
    })
}

/// Files CSR `csr` for Machine `machine` of `w` and records which Machine it asked for.
async fn file(w: &Workload, plan: &Mutex<HashMap<(String, String), String>>, csr: &str, machine: &str) {
    file_csr(
        &w.bootstrap,
        csr,
        SIGNER_INSECURE,
        &RequestSpec::kubelet(machine, &pid(&w.cluster, machine)).build(),
        CLIENT_USAGES,
    )
    .await;
    plan.lock()
        .unwrap()
        .insert((w.cluster.clone(), csr.to_owned()), machine.to_owned());
}

/// Waits until `done` holds over the live replicas' metrics, or panics after `within`.
async fn until(what: &str, replicas: &[(&str, Signer)], within: Duration, done: impl Fn(&[(&str, &Signer)]) -> bool) {
    let start = Instant::now();
    loop {
        let mut live: Vec<(&str, &Signer)> = Vec::new();
        for (name, signer) in replicas {
            if !signer.metrics().is_empty() {
                live.push((name, signer));
            }
        }
        if done(&live) {
            return;
        }
        if start.elapsed() > within {
            let figures: Vec<String> = replicas
                .iter()
                .map(|(n, s)| {
                    let text = s.metrics();
                    let gauges: Vec<&str> = text
                        .lines()
                        .filter(|l| {
                            l.starts_with("node_attestation_clusters{") || l.starts_with("node_attestation_shard_")
                        })
                        .collect();
                    format!("{n}: {gauges:?}")
                })
                .collect();
            let log = replicas[0].1.log();
            let tail: Vec<&str> = log.lines().rev().take(300).collect();
            panic!(
                "{what}: not within {within:?}\n{}\nlast lines of the replicas' log:\n{}",
                figures.join("\n"),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `replicas` live replicas each counting `replicas` members, each serving some Clusters (when
/// `each_serves`), and summing to the fleet.
fn shared_by(live: &[(&str, &Signer)], replicas: usize, each_serves: bool) -> bool {
    let n = replicas as f64;
    live.len() == replicas
        && live
            .iter()
            .all(|(_, s)| members(s) == n && (!each_serves || ready(s) > 0.0))
        && live.iter().map(|(_, s)| ready(s)).sum::<f64>() == FLEET
}

/// The replica among `live` that serves the Cluster by the replicas' own logs: the last
/// `shard hand-over` line for the Cluster that says `gained` names it, and it has not logged
/// releasing it since. The processes' own word, not the Events (which can trail a hand-over:
/// they are queued and, under a burst, folded).
fn owner_by_log(live: &[(&str, &Signer)], w: &Workload) -> Option<String> {
    let cluster = format!("cluster={}/{} ", w.namespace, w.cluster);
    // The replicas may share one log file: each file read once, one ordered set of lines (they
    // start with the time).
    let files: std::collections::BTreeSet<&Path> = live.iter().map(|(_, s)| s.log_path()).collect();
    let lines: std::collections::BTreeSet<String> = files
        .into_iter()
        .flat_map(|file| {
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("shard hand-over") && l.contains(&cluster))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let replica_of = |line: &str| {
        live.iter()
            .map(|(n, _)| *n)
            .find(|n| line.contains(&format!("replica={} ", member(n))))
    };
    let (at, gained) = lines
        .iter()
        .enumerate()
        .rev()
        .find(|(_, l)| l.contains("direction=\"gained\""))?;
    let owner = replica_of(gained)?;
    let released_since = lines
        .iter()
        .skip(at + 1)
        .any(|l| l.contains("direction=\"released\"") && replica_of(l) == Some(owner));
    (!released_since).then(|| owner.to_owned())
}

/// The replica whose latest `ShardAcquired` Event on the Cluster names it.
async fn owner(management: &Client, w: &Workload) -> Option<String> {
    let api: Api<Event> = Api::namespaced(management.clone(), &w.namespace);
    let events = api.list(&Default::default()).await.ok()?;
    let latest = events
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ShardAcquired")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(w.cluster.as_str())
        })
        .max_by_key(|e| {
            e.series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        })?;
    let note = latest.note.unwrap_or_default();
    REPLICAS
        .iter()
        .find(|r| note.contains(&format!("signer replica {} serves", member(r))))
        .map(|r| (*r).to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn three_replicas_share_the_fleet_hand_over_on_kill_and_never_sign_twice() {
    let management_env = Envtest::start("envtest_sharding (management)");
    let beta_env = Envtest::start("envtest_sharding (beta)");
    let quiet_env = Envtest::start("envtest_sharding (quiet)");
    management_env.install_capi_crds();
    let management = live::client(&management_env.admin_kubeconfig).await;
    let alpha = Workload::register(management_env, &management, "team-a", "alpha", "insecure").await;
    let beta = Workload::register(beta_env, &management, "team-b", "beta", "insecure").await;
    let quiet = Workload::register(quiet_env, &management, "quiet", "quiet-0", "insecure").await;
    for i in 1..QUIET {
        quiet.add_sibling(&management, &format!("quiet-{i}")).await;
    }
    for w in [&alpha, &beta] {
        for prefix in ["m", "late", "back", "race"] {
            for i in 0..4 {
                let name = format!("{prefix}-{i}");
                w.add_machine(&management, &name, &pid(&w.cluster, &name)).await;
            }
        }
    }
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let plan: Mutex<HashMap<(String, String), String>> = Mutex::default();
    let watches = [watch_csrs(&ledger, &alpha), watch_csrs(&ledger, &beta)];

    let mut replicas: Vec<(&str, Signer)> = Vec::new();
    for name in REPLICAS {
        let flags = ["--coordination", "shard", "--replica-name", name];
        replicas.push((name, Signer::start(Path::new(SIGNER_BIN), &alpha.env, &flags).await));
    }

    // Every replica serves some; the sum is the fleet.
    until(
        "three members, each serving some, summing to the fleet",
        &replicas,
        Duration::from_secs(60),
        |live| shared_by(live, 3, true),
    )
    .await;
    for (_, s) in &replicas {
        let text = s.metrics();
        assert_eq!(
            metric(&text, "node_attestation_shard_clusters_owned "),
            ready(s),
            "owned = served"
        );
        assert_eq!(metric(&text, "node_attestation_leader "), 0.0, "no leader when sharded");
    }
    until(
        "each Machine kept by the replica serving its Cluster only",
        &replicas,
        Duration::from_secs(40),
        machines_follow_the_shard,
    )
    .await;

    // Both loaded clusters sign.
    for w in [&alpha, &beta] {
        for i in 0..4 {
            file(w, &plan, &format!("m-{i}"), &format!("m-{i}")).await;
        }
    }
    for w in [&alpha, &beta] {
        for i in 0..4 {
            let state = wait_final(&w.admin, &format!("m-{i}"), false, Duration::from_secs(40)).await;
            assert!(
                matches!(state, Final::Issued(_)),
                "{} m-{i}: {state:?}\n{}",
                w.cluster,
                replicas[0].1.log()
            );
        }
    }

    // SIGKILL the replica serving alpha: no Lease deleted, no goodbye. Its clusters move.
    let live: Vec<(&str, &Signer)> = replicas.iter().map(|(n, s)| (*n, s)).collect();
    let started = Instant::now();
    let victim = loop {
        if let Some(owner) = owner_by_log(&live, &alpha) {
            break owner;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no replica's log says it serves alpha:\n{}",
            replicas[0].1.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let index = replicas.iter().position(|(n, _)| *n == victim).unwrap();
    replicas[index].1.kill();
    let killed = Instant::now();
    for i in 0..4 {
        file(&alpha, &plan, &format!("late-{i}"), &format!("late-{i}")).await;
    }
    for i in 0..4 {
        let state = wait_final(&alpha.admin, &format!("late-{i}"), false, LEASE + SLACK).await;
        assert!(
            matches!(state, Final::Issued(_)),
            "late-{i} after replica {victim} was killed: {state:?} after {:?}\n{}",
            killed.elapsed(),
            replicas[0].1.log()
        );
    }
    let moved_in = killed.elapsed();
    assert!(moved_in < LEASE + SLACK, "{moved_in:?}");
    until(
        "the survivors re-count the fleet",
        &replicas,
        // Every Cluster of the killed replica starts on a survivor (Secrets, first list): on a
        // loaded 2-core machine that may take a while beyond the loaded cluster's own move.
        Duration::from_secs(25),
        |live| shared_by(live, 2, false),
    )
    .await;
    // alpha's ShardAcquired Event names its new replica. It may be folded with the other
    // Clusters the survivor took over (Events beyond the burst go out folded every 10 s), so it
    // can trail the hand-over itself.
    let start = Instant::now();
    loop {
        match owner(&management, &alpha).await {
            Some(owner) if owner != victim => break,
            latest => assert!(
                start.elapsed() < Duration::from_secs(25),
                "alpha's latest ShardAcquired Event still names {latest:?}, not a survivor"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The killed replica comes back under its name and takes its share again; CSRs filed
    // during that hand-over are issued once.
    replicas[index].1.restart();
    for i in 0..4 {
        file(&alpha, &plan, &format!("back-{i}"), &format!("back-{i}")).await;
        file(&beta, &plan, &format!("back-{i}"), &format!("back-{i}")).await;
    }
    until(
        "three members again, each serving some",
        &replicas,
        Duration::from_secs(30),
        |live| shared_by(live, 3, true),
    )
    .await;
    for w in [&alpha, &beta] {
        for i in 0..4 {
            let state = wait_final(&w.admin, &format!("back-{i}"), false, Duration::from_secs(40)).await;
            assert!(matches!(state, Final::Issued(_)), "{} back-{i}: {state:?}", w.cluster);
        }
    }
    let handovers = |s: &Signer, direction: &str| {
        metric(
            &s.metrics(),
            &format!("node_attestation_shard_handovers_total{{direction=\"{direction}\"}}"),
        )
    };
    assert!(
        replicas.iter().any(|(_, s)| handovers(s, "released") > 0.0),
        "the survivors released the returning replica's share"
    );
    // After a kill, a hand-over and a return, the Machines are still where the shard says, and
    // the survivors dropped what they handed back.
    until(
        "each Machine kept by the replica serving its Cluster only, after the hand-overs",
        &replicas,
        Duration::from_secs(40),
        machines_follow_the_shard,
    )
    .await;

    // The overlap a hand-over can leave, made permanent: a process serving every Cluster
    // beside the shard. Two CSRs per Machine, each possibly handled by both processes: one
    // certificate per Machine, the other CSR denied or failed.
    let mut overlap = vec![(
        "everything",
        Signer::start(Path::new(SIGNER_BIN), &alpha.env, &["--leader-elect=false"]).await,
    )];
    until(
        "the overlapping process serves every Cluster",
        &overlap,
        Duration::from_secs(30),
        |live| live.len() == 1 && ready(live[0].1) == FLEET,
    )
    .await;
    for w in [&alpha, &beta] {
        let races = (0..4).flat_map(|i| {
            let machine = format!("race-{i}");
            ["x", "y"].map(|side| {
                let (csr, machine) = (format!("race-{i}-{side}"), machine.clone());
                let plan = &plan;
                async move { file(w, plan, &csr, &machine).await }
            })
        });
        futures::future::join_all(races).await;
    }
    for w in [&alpha, &beta] {
        for i in 0..4 {
            let x = wait_final(&w.admin, &format!("race-{i}-x"), false, Duration::from_secs(40)).await;
            let y = wait_final(&w.admin, &format!("race-{i}-y"), false, Duration::from_secs(40)).await;
            let issued = [&x, &y].iter().filter(|s| matches!(s, Final::Issued(_))).count();
            assert_eq!(issued, 1, "{} race-{i}: {x:?} / {y:?}", w.cluster);
            for loser in [&x, &y].into_iter().filter(|s| !matches!(s, Final::Issued(_))) {
                assert_eq!(loser.reason(), Some("MachineAlreadyClaimed"), "{loser:?}");
            }
        }
    }
    overlap[0].1.kill();

    // SIGTERM: the replica deletes its Lease, and the others take its clusters at once rather
    // than after the Lease duration.
    let (name, leaving) = &mut replicas[0];
    let lease = member(name);
    leaving.terminate();
    let terminated = Instant::now();
    let out = alpha
        .env
        .kubectl(&["get", "lease", &lease, "-n", "node-attestation-system"]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{lease} is still there after SIGTERM"
    );
    until(
        "the others take a terminated replica's share at once",
        &replicas,
        LEASE / 2,
        |live| shared_by(live, 2, false),
    )
    .await;
    let handed_over_in = terminated.elapsed();

    // Nothing signed twice, across every kill, hand-over and overlap.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for watch in watches {
        watch.abort();
    }
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    assert!(
        ledger.rewritten.is_empty(),
        "certificates written twice: {:?}",
        ledger.rewritten
    );
    let plan = std::mem::take(&mut *plan.lock().unwrap());
    let mut per_machine: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (cluster, csr) in ledger.issued.keys() {
        let machine = plan
            .get(&(cluster.clone(), csr.clone()))
            .unwrap_or_else(|| panic!("{cluster}/{csr} was not filed by this test"));
        per_machine
            .entry((cluster.clone(), machine.clone()))
            .or_default()
            .push(csr.clone());
    }
    for (machine, csrs) in &per_machine {
        assert_eq!(csrs.len(), 1, "{machine:?} got certificates from {csrs:?}");
    }
    // 4 Machines per prefix and cluster (m, back, race on both; late on alpha).
    assert_eq!(per_machine.len(), 4 * 3 * 2 + 4, "{per_machine:?}");
    for ((cluster, machine), csrs) in &per_machine {
        let w = if *cluster == alpha.cluster { &alpha } else { &beta };
        let m = live::get(&management, &w.own(capi::machine(machine, None))).await;
        let claim: Value = serde_json::from_str(
            m["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let csr = Api::<CertificateSigningRequest>::all(w.admin.clone())
            .get(&csrs[0])
            .await
            .unwrap();
        assert_eq!(
            claim["csrUID"].as_str(),
            csr.metadata.uid.as_deref(),
            "{cluster}/{machine} is claimed by the one CSR that was signed"
        );
    }
    eprintln!("hand-over after SIGKILL: CSRs issued {moved_in:?} after the kill; after SIGTERM: {handed_over_in:?}");
}
