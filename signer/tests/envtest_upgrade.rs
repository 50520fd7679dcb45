//! Upgrading the signer (SPEC section 7, revision 5: "a rolling update of its Deployment loses no
//! CSR and signs nothing twice") on real kube-apiservers (`KUBEBUILDER_ASSETS`; skipped loudly
//! without). Three `--coordination=shard` replicas, named as a Deployment's pods are, serve 12
//! opted-in Clusters (three loaded workload clusters and nine quiet ones) and are replaced one by
//! one while 120 Machines join (with duplicate joins and renewals by the nodes that joined), the
//! way `config/manager/deployment.yaml` has Kubernetes roll them.
//!
//! The Deployment sets no strategy, so it gets apps/v1's default (pkg/apis/apps/v1/defaults.go,
//! `SetDefaults_Deployment`): RollingUpdate with maxSurge and maxUnavailable 25%, which for 3
//! replicas resolve to 1 and 0 (pkg/controller/deployment/util/deployment_util.go,
//! `ResolveFenceposts`: surge rounded up, unavailable down). The deployment controller
//! (pkg/controller/deployment/rolling.go, `rolloutRolling`) then scales the new ReplicaSet up by
//! one (`reconcileNewReplicaSet`, `NewRSNewReplicas`: at most replicas + maxSurge pods), waits for
//! that pod to be available (ready, `minReadySeconds` 0: the readiness probe's `/readyz`, probed
//! at start and every `periodSeconds` 5, pkg/kubelet/prober/worker.go `run`), scales the old
//! ReplicaSet down by one (`reconcileOldReplicaSets`, `scaleDownOldReplicaSetsForRollingUpdate`:
//! only while more than replicas - maxUnavailable pods are available), and on the next sync (the
//! ReplicaSet's change triggers it) the new one up by one again: the next new pod starts as the
//! old one is being stopped, and so on. Each old pod deleted gets SIGTERM from the kubelet, then
//! SIGKILL once `terminationGracePeriodSeconds` (10) has passed (pkg/kubelet/kuberuntime,
//! `killContainer`). Which old pod goes is the ReplicaSet controller's choice
//! (pkg/controller/controller_utils.go, `ActivePodsWithRanks`: pods ready for about as long are
//! ordered by UID); here the newest first. The second old pod hangs on SIGTERM (stopped), so the
//! kubelet SIGKILLs it after the grace period and its Lease is left to expire: the one SIGKILL.
//! Old and new replicas run the same build (there is no older one to run): what is tested is the
//! turnover, not a skew between versions. A new replica is ready only once it serves its share
//! (`fleet::readiness`): at its first ready probe it owns Clusters and none is still listed.
//!
//! Afterwards every CSR has ended (issued, or denied for the rule it broke: a duplicate join
//! `MachineAlreadyClaimed`), every Machine has exactly one certificate from a join (renewals by
//! the node itself apart) and its claim names that CSR, no certificate was ever written twice
//! (a watch of every workload cluster's CSRs), every certificate's record is its approval naming
//! the Machine and a replica (SPEC section 3, revision 5), and the
//! hand-over of each replaced replica is measured from the replicas' own log.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use attestation::request::KeyAlgorithm;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::runtime::watcher;
use serde_json::Value;
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::{Envtest, SharedEtcd};
use tests::live::{self, Final, Signer, Workload, file_csr, metric, state_of};
use time::OffsetDateTime;

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
/// The loaded workload clusters, each its own apiserver.
const LOADED: [&str; 3] = ["alpha", "beta", "gamma"];
/// Machines joining in each loaded cluster.
const MACHINES: usize = 40;
/// Quiet Clusters (no CSRs) on the management apiserver: the fleet the replicas share.
const QUIET: usize = 9;
const FLEET: f64 = (QUIET + LOADED.len()) as f64;
/// Every this many Machines, a second join with another key right after the first.
const DUPLICATE_EVERY: usize = 10;
/// Every this many Machines, the node renews once its join is issued.
const RENEW_EVERY: usize = 4;
/// Between two filings of the storm.
const PACE: Duration = Duration::from_millis(180);
/// config/manager/deployment.yaml: `terminationGracePeriodSeconds` and the readiness probe's
/// `periodSeconds`.
const GRACE: Duration = Duration::from_secs(10);
const PROBE_PERIOD: Duration = Duration::from_secs(5);
/// The membership Lease duration.
const LEASE: Duration = Duration::from_secs(15);
/// The pods of the two ReplicaSets (`<deployment>-<pod-template-hash>-<suffix>`), in start order.
const OLD: [&str; 3] = [
    "node-attestation-signer-5d8f7c9b4-x7k2p",
    "node-attestation-signer-5d8f7c9b4-m4q9z",
    "node-attestation-signer-5d8f7c9b4-b8w3n",
];
const NEW: [&str; 3] = [
    "node-attestation-signer-7c6d9f8b5-r2t6v",
    "node-attestation-signer-7c6d9f8b5-h5j8c",
    "node-attestation-signer-7c6d9f8b5-z9d4f",
];

fn pid(cluster: &str, machine: &str) -> String {
    format!("aws:///eu-central-1a/i-{cluster}-{machine}")
}

fn machine(i: usize) -> String {
    format!("m-{i:02}")
}

/// The member (Lease) name of replica `name`.
fn member(name: &str) -> String {
    format!("node-attestation-signer-{name}")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Join,
    Duplicate,
    Renewal,
}

/// What the test filed and what the watches saw.
#[derive(Default)]
struct Ledger {
    /// (cluster, CSR) -> (Machine, kind).
    plan: BTreeMap<(String, String), (String, Kind)>,
    /// (cluster, CSR) -> the certificate first seen.
    issued: BTreeMap<(String, String), String>,
    /// CSRs seen with a second, different certificate.
    rewritten: Vec<(String, String)>,
    /// When each cluster's certificates were first seen.
    issued_at: BTreeMap<String, Vec<OffsetDateTime>>,
    /// Machines whose renewal was filed.
    renewing: BTreeSet<(String, String)>,
}

/// Watches `w`'s CSRs: records every certificate once (and any rewrite), and files a renewal by
/// the node when the join of a Machine chosen to renew is issued.
fn watch(ledger: &Arc<Mutex<Ledger>>, w: &Arc<Workload>) -> tokio::task::JoinHandle<()> {
    let (ledger, w) = (Arc::clone(ledger), Arc::clone(w));
    tokio::spawn(async move {
        let api = Api::<CertificateSigningRequest>::all(w.admin.clone());
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let (Ok(watcher::Event::Apply(csr)) | Ok(watcher::Event::InitApply(csr))) = event else {
                continue;
            };
            let Final::Issued(pem) = state_of(&csr) else {
                continue;
            };
            let key = (w.cluster.clone(), csr.metadata.name.clone().unwrap_or_default());
            let renew = {
                let mut ledger = ledger.lock().unwrap();
                match ledger.issued.get(&key) {
                    Some(first) if *first != pem => ledger.rewritten.push(key.clone()),
                    Some(_) => {}
                    None => {
                        ledger.issued.insert(key.clone(), pem.clone());
                        ledger
                            .issued_at
                            .entry(w.cluster.clone())
                            .or_default()
                            .push(OffsetDateTime::now_utc());
                    }
                }
                match ledger.plan.get(&key).cloned() {
                    Some((m, Kind::Join)) if m[2..].parse::<usize>().unwrap() % RENEW_EVERY == 0 => {
                        ledger.renewing.insert((w.cluster.clone(), m.clone())).then_some(m)
                    }
                    _ => None,
                }
            };
            if let Some(m) = renew {
                let (ledger, w) = (Arc::clone(&ledger), Arc::clone(&w));
                tokio::spawn(async move {
                    let name = format!("renew-{m}");
                    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
                    let node = w.node_client(&m, &pem, &key).await;
                    let request = RequestSpec::kubelet(&m, &pid(&w.cluster, &m)).build();
                    ledger
                        .lock()
                        .unwrap()
                        .plan
                        .insert((w.cluster.clone(), name.clone()), (m.clone(), Kind::Renewal));
                    file_csr(&node, &name, SIGNER_INSECURE, &request, CLIENT_USAGES).await;
                });
            }
        }
    })
}

/// Files every join (and the duplicates) at an even pace, round robin over the clusters.
fn storm(ledger: &Arc<Mutex<Ledger>>, loaded: &[Arc<Workload>]) -> tokio::task::JoinHandle<()> {
    let (ledger, loaded) = (Arc::clone(ledger), loaded.to_vec());
    tokio::spawn(async move {
        for i in 0..MACHINES {
            for w in &loaded {
                let m = machine(i);
                let mut filings = vec![(format!("join-{m}"), KeyAlgorithm::EcdsaP256, Kind::Join)];
                if i % DUPLICATE_EVERY == 3 {
                    filings.push((format!("again-{m}"), KeyAlgorithm::EcdsaP384, Kind::Duplicate));
                }
                for (name, key, kind) in filings {
                    ledger
                        .lock()
                        .unwrap()
                        .plan
                        .insert((w.cluster.clone(), name.clone()), (m.clone(), kind));
                    let request = RequestSpec {
                        key,
                        ..RequestSpec::kubelet(&m, &pid(&w.cluster, &m))
                    }
                    .build();
                    file_csr(&w.bootstrap, &name, SIGNER_INSECURE, &request, CLIENT_USAGES).await;
                }
                tokio::time::sleep(PACE).await;
            }
        }
    })
}

/// A pod of the Deployment: its replica process and its name.
struct Pod {
    name: &'static str,
    signer: Signer,
}

/// `GET /readyz` on the replica's metrics port (the health port serves the same endpoints).
async fn ready(signer: &Signer) -> bool {
    let url = signer.metrics_url.replace("/metrics", "/readyz");
    let host = url.trim_start_matches("http://").split('/').next().unwrap().to_owned();
    let Ok(mut stream) = tokio::net::TcpStream::connect(&host).await else {
        return false;
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    answer.starts_with("HTTP/1.1 200")
}

/// The kubelet's readiness probe on a pod started at `started`: at once, then every
/// `periodSeconds`; the pod is available (`minReadySeconds` 0) at the first success.
async fn available(pod: &Pod, started: Instant) -> Instant {
    let mut at = started;
    loop {
        tokio::time::sleep_until(at.into()).await;
        if ready(&pod.signer).await {
            return at;
        }
        at += PROBE_PERIOD;
        assert!(at - started < Duration::from_secs(60), "{} never ready", pod.name);
    }
}

fn signal(pod: &Pod, signal: &str) {
    let pid = pod.signer.pid().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The kubelet stopping a deleted pod: SIGTERM, then SIGKILL once the grace period is over.
/// Returns whether the process had to be killed.
async fn kubelet_stops(pod: &mut Pod) -> bool {
    signal(pod, "-TERM");
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        if !pod.signer.alive() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pod.signer.kill();
    true
}

/// The live pods (serving metrics) each count `members` members and serve the fleet between
/// them.
fn fleet_served(pods: &[Pod], members: usize) -> bool {
    let live: Vec<String> = pods
        .iter()
        .map(|p| p.signer.metrics())
        .filter(|m| !m.is_empty())
        .collect();
    live.len() == members
        && live
            .iter()
            .all(|m| metric(m, "node_attestation_shard_members ") == members as f64)
        && live
            .iter()
            .map(|m| metric(m, "node_attestation_clusters{state=\"Ready\"}"))
            .sum::<f64>()
            == FLEET
}

async fn until(what: &str, within: Duration, log: &dyn Fn() -> String, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > within {
            let log = log();
            let tail: Vec<&str> = log.lines().rev().take(200).collect();
            panic!(
                "{what}: not within {within:?}\nlast lines of the replicas' log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A log line's time (text format: RFC 3339 first).
fn time_of(line: &str) -> Option<OffsetDateTime> {
    let stamp = line.split_whitespace().next()?;
    OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).ok()
}

/// From the replicas' log (`shard hand-over` lines): the Clusters `replica` served at `at`, and
/// for each how long after `at` another live replica (not `replica`, none of `gone`) served it:
/// zero when one already did (a hand-over overlaps while an arrival settles), else its first
/// `gained` line after `at`; `None` if none did.
fn handed_over(log: &str, replica: &str, gone: &[&str], at: OffsetDateTime) -> BTreeMap<String, Option<Duration>> {
    let field = |l: &str, key: &str| {
        l.split_whitespace()
            .find_map(|f| f.strip_prefix(key))
            .unwrap_or_default()
            .to_owned()
    };
    // (time, cluster, member, gained)
    let lines: Vec<(OffsetDateTime, String, String, bool)> = log
        .lines()
        .filter(|l| l.contains("shard hand-over"))
        .filter_map(|l| {
            Some((
                time_of(l)?,
                field(l, "cluster="),
                field(l, "replica="),
                l.contains("direction=\"gained\""),
            ))
        })
        .collect();
    let serves = |who: &str, cluster: &str| {
        lines
            .iter()
            .rfind(|(t, c, m, _)| *t <= at && c == cluster && m == who)
            .is_some_and(|(_, _, _, gained)| *gained)
    };
    let me = member(replica);
    let others: BTreeSet<&String> = lines
        .iter()
        .map(|(_, _, m, _)| m)
        .filter(|m| **m != me && !gone.iter().any(|g| member(g) == **m))
        .collect();
    let clusters: BTreeSet<&String> = lines.iter().map(|(_, c, _, _)| c).collect();
    clusters
        .into_iter()
        .filter(|c| serves(&me, c))
        .map(|c| {
            let after = if others.iter().any(|o| serves(o, c)) {
                Some(Duration::ZERO)
            } else {
                lines
                    .iter()
                    .find(|(t, cluster, m, gained)| *t >= at && cluster == c && *m != me && *gained)
                    .map(|(t, ..)| (*t - at).unsigned_abs())
            };
            (c.clone(), after)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn a_rolling_update_of_the_signer_loses_no_csr_and_signs_nothing_twice() {
    let started = Instant::now();
    let etcd = SharedEtcd::start("envtest_upgrade");
    // Four apiservers on one etcd, started at once: the management cluster (also the quiet
    // Clusters' workload apiserver) and one per loaded cluster.
    let mut envs: Vec<Envtest> = std::thread::scope(|s| {
        let starts: Vec<_> = (0..=LOADED.len())
            .map(|i| {
                let etcd = &etcd;
                s.spawn(move || {
                    let env = Envtest::start_on("envtest_upgrade", etcd);
                    if i == 0 {
                        env.install_capi_crds();
                    }
                    env
                })
            })
            .collect();
        starts.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let management_env = envs.remove(0);
    let management = live::client(&management_env.admin_kubeconfig).await;
    let mut loaded: Vec<Arc<Workload>> = Vec::new();
    for (env, name) in envs.into_iter().zip(LOADED) {
        let w = Workload::register(env, &management, &format!("team-{name}"), name, "insecure").await;
        let machines: Vec<(String, String)> = (0..MACHINES).map(|i| (machine(i), pid(name, &machine(i)))).collect();
        w.add_machines(&management, &machines, 8).await;
        loaded.push(Arc::new(w));
    }
    let quiet = live::quiet_clusters(management_env, &management, "quiet", QUIET).await;
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let watches: Vec<_> = loaded.iter().map(|w| watch(&ledger, w)).collect();

    // The old ReplicaSet's three pods, as they run before the update.
    let start_pod = async |name: &'static str| Pod {
        name,
        signer: Signer::start(
            Path::new(SIGNER_BIN),
            &quiet.env,
            &["--coordination", "shard", "--replica-name", name],
        )
        .await,
    };
    let mut pods: Vec<Pod> = Vec::new();
    for name in OLD {
        pods.push(start_pod(name).await);
    }
    let log = || pods_log(&quiet.env);
    until(
        "three old replicas share the fleet",
        Duration::from_secs(60),
        &log,
        || fleet_served(&pods, 3),
    )
    .await;
    eprintln!("[{:?}] three replicas serve {FLEET} Clusters", started.elapsed());

    // The storm, and the rolling update under it.
    let storm_at = OffsetDateTime::now_utc();
    let storm = storm(&ledger, &loaded);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut steps: Vec<(&str, &str, OffsetDateTime, bool, Duration)> = Vec::new();
    let mut stopping = Vec::new();
    let mut next_started = Instant::now();
    pods.push(start_pod(NEW[0]).await);
    for step in 0..3 {
        let new = pods.iter().position(|p| p.name == NEW[step]).unwrap();
        let ready_at = available(&pods[new], next_started).await;
        let probe_wait = ready_at - next_started;
        // Ready means it serves its share (fleet::readiness): the shard gave it Clusters, and
        // each has a worker past listing its objects, before the old replica is stopped.
        let at_ready = pods[new].signer.metrics();
        let owned = metric(&at_ready, "node_attestation_shard_clusters_owned");
        let listing = metric(&at_ready, "node_attestation_clusters{state=\"Listing\"}");
        let counted = metric(&at_ready, "node_attestation_clusters{");
        assert!(
            owned >= 1.0 && listing == 0.0 && counted == owned,
            "{} ready before serving its share: {owned} owned, {counted} counted, {listing} listing",
            NEW[step]
        );
        // The old ReplicaSet down by one: the kubelet stops one old pod (newest first). The
        // second hangs on SIGTERM and is SIGKILLed after the grace period.
        let old = pods.iter().position(|p| p.name == OLD[2 - step]).unwrap();
        let mut pod = pods.remove(old);
        let hangs = step == 1;
        if hangs {
            signal(&pod, "-STOP");
        }
        let at = OffsetDateTime::now_utc();
        stopping.push(tokio::spawn(async move {
            let killed = kubelet_stops(&mut pod).await;
            (pod, killed)
        }));
        steps.push((OLD[2 - step], NEW[step], at, hangs, probe_wait));
        // ... and the new one up by one.
        if step < 2 {
            next_started = Instant::now();
            pods.push(start_pod(NEW[step + 1]).await);
        }
    }
    let mut killed = Vec::new();
    for stop in stopping {
        let (pod, was_killed) = stop.await.unwrap();
        killed.push((pod.name, was_killed));
        drop(pod);
    }
    until("the new replicas share the fleet", LEASE * 2, &log, || {
        fleet_served(&pods, 3)
    })
    .await;
    let rolled = started.elapsed();
    storm.await.unwrap();
    eprintln!("[{rolled:?}] rolled over; storm filed");

    // Every CSR ends: issued, or denied for a rule.
    let all_filed = || {
        let ledger = ledger.lock().unwrap();
        ledger.plan.len()
    };
    let expected = LOADED.len() * (MACHINES + MACHINES / DUPLICATE_EVERY + MACHINES.div_ceil(RENEW_EVERY));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut states: BTreeMap<(String, String), CertificateSigningRequest> = BTreeMap::new();
    loop {
        states.clear();
        for w in &loaded {
            for csr in Api::<CertificateSigningRequest>::all(w.admin.clone())
                .list(&Default::default())
                .await
                .unwrap()
            {
                states.insert((w.cluster.clone(), csr.metadata.name.clone().unwrap()), csr);
            }
        }
        let pending: Vec<&(String, String)> = states
            .iter()
            .filter(|(_, c)| matches!(state_of(c), Final::Pending | Final::Approved))
            .map(|(k, _)| k)
            .collect();
        if pending.is_empty() && states.len() == expected && all_filed() == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "LOST: {} of {expected} CSRs filed, {} seen, still pending: {pending:?}\n{}",
            all_filed(),
            states.len(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for w in watches {
        w.abort();
    }
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    assert!(
        ledger.rewritten.is_empty(),
        "certificates written twice: {:?}",
        ledger.rewritten
    );

    // One certificate per Machine from a join, the duplicate refused for the claim, every
    // renewal by the node itself signed, and the claim naming the join that was signed.
    let mut joins: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let (mut renewals, mut refused) = (0, 0);
    for ((cluster, name), csr) in &states {
        let (m, kind) = ledger.plan[&(cluster.clone(), name.clone())].clone();
        match (state_of(csr), kind) {
            (Final::Issued(_), Kind::Renewal) => {
                assert_eq!(csr.spec.username.as_deref(), Some(format!("system:node:{m}").as_str()));
                renewals += 1;
            }
            (Final::Issued(_), _) => joins.entry((cluster.clone(), m)).or_default().push(name.clone()),
            (state, Kind::Renewal) => panic!("{cluster}/{name}: a renewal by the node itself {state:?}"),
            (state, _) => {
                assert_eq!(state.reason(), Some("MachineAlreadyClaimed"), "{cluster}/{name}");
                refused += 1;
            }
        }
    }
    assert_eq!(joins.len(), LOADED.len() * MACHINES, "a certificate for every Machine");
    for ((cluster, m), csrs) in &joins {
        assert_eq!(csrs.len(), 1, "{cluster}/{m} got certificates from {csrs:?}");
        let w = loaded.iter().find(|w| w.cluster == *cluster).unwrap();
        let object = live::get(&management, &w.own(capi::machine(m, None))).await;
        let claim: Value = serde_json::from_str(
            object["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let signed = &states[&(cluster.clone(), csrs[0].clone())];
        assert_eq!(
            claim["csrUID"].as_str(),
            signed.metadata.uid.as_deref(),
            "{cluster}/{m}"
        );
    }
    assert_eq!(refused, LOADED.len() * MACHINES / DUPLICATE_EVERY);
    assert_eq!(renewals, LOADED.len() * MACHINES.div_ceil(RENEW_EVERY));

    // Every certificate's record is its Approved condition, naming the Machine and the replica
    // that approved it (SPEC section 3, revision 5), whichever replica signed it.
    for ((cluster, name), csr) in &states {
        if !matches!(state_of(csr), Final::Issued(_)) {
            continue;
        }
        let message = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Approved"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains(", approved by replica ") && message.contains("; Machine "),
            "{cluster}/{name}'s record: {message}"
        );
    }
    let text = log();
    for ((cluster, name), csr) in &states {
        if !matches!(state_of(csr), Final::Issued(_)) {
            continue;
        }
        let namespace = &loaded.iter().find(|w| w.cluster == *cluster).unwrap().namespace;
        let (span, open, closed) = (
            format!("cluster={namespace}/{cluster}}}"),
            format!("csr={name} "),
            format!("csr={name}}}"),
        );
        let logged = text
            .lines()
            .filter(|l| l.contains(&span) && (l.contains(&open) || l.contains(&closed)))
            .filter(|l| l.contains("approved and signed"))
            .count();
        assert!(logged <= 1, "{cluster}/{name} logged as signed {logged} times");
    }

    // Hand-overs: when each replaced replica's Clusters were gained by another (its log), and
    // each loaded cluster's next certificate after the stop.
    let mut report = Vec::new();
    for (n, (old, new, at, hangs, probe_wait)) in steps.iter().enumerate() {
        let gone: Vec<&str> = steps[..n].iter().map(|(old, ..)| *old).collect();
        let clusters = handed_over(&text, old, &gone, *at);
        let late: Vec<&String> = clusters.iter().filter(|(_, t)| t.is_none()).map(|(c, _)| c).collect();
        assert!(
            late.is_empty(),
            "{old}'s Clusters {late:?} never served by another replica\n{text}"
        );
        let longest = clusters.values().flatten().max().copied().unwrap_or_default();
        let next_certificate: Vec<String> = ledger
            .issued_at
            .iter()
            .map(|(cluster, times)| {
                let next = times
                    .iter()
                    .filter(|t| **t >= *at)
                    .min()
                    .map(|t| (*t - *at).unsigned_abs());
                format!("{cluster} {next:.1?}")
            })
            .collect();
        let how = if *hangs {
            "SIGTERM ignored, SIGKILL after the grace"
        } else {
            "SIGTERM"
        };
        report.push(format!(
            "{new} available {probe_wait:.1?} after start; {:.1?} into the storm {old} stopped ({how}): its {} Clusters \
             served by others within {longest:.1?}; next certificate per loaded cluster: {next_certificate:?}",
            (*at - storm_at).unsigned_abs(),
            clusters.len()
        ));
        // A SIGTERMed replica deletes its Lease: its own Clusters wait for no Lease. Those the
        // assignment hands to the hung replica (a member until its Lease, last renewed before the
        // previous step, expires) wait out the rest of that Lease.
        if !*hangs {
            assert!(longest < LEASE, "{old}'s Clusters waited {longest:?}\n{text}");
        }
    }
    for (name, was_killed) in &killed {
        assert_eq!(*was_killed, *name == OLD[1], "{name} SIGKILLed: {was_killed}");
    }
    let csrs = states.len();
    eprintln!(
        "upgrade: {csrs} CSRs ({} joins issued, {refused} duplicates refused MachineAlreadyClaimed, {renewals} renewals), \
         none lost, none signed twice; rolled over in {rolled:?}, every CSR ended at {settled:?}\n{}",
        joins.len(),
        report.join("\n")
    );
}

/// The replicas' shared log (every process of one management Envtest appends to it).
fn pods_log(management: &Envtest) -> String {
    std::fs::read_to_string(management.dir().join("signer.log")).unwrap_or_default()
}
