//! What revocation costs a workload apiserver (a benchmark, not a test; SPEC section 7, "Taking
//! an identity back"): a node's heartbeats (Lease updates, as kubelet renews its Lease every
//! 10 s) on a real kube-apiserver from `KUBEBUILDER_ASSETS`, side by side in one run: without
//! the revocation policy (the anchor: no revocation at all), with it and an empty list, and with
//! `--entries` revoked certificates listed. Prints each phase's request latency percentiles and
//! the apiserver's CPU per update, and the ratios to the anchor.
//!
//! ```sh
//! cargo build --release -p tests --bin revocation-cost
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/revocation-cost
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tests::envtest::Envtest;
use tests::live;
use tests::stats::{CpuTimes, percentile};

#[derive(Parser)]
#[command(about = "What the revocation policy costs a workload apiserver per node heartbeat")]
struct Args {
    /// Lease updates per phase.
    #[arg(long, default_value_t = 3000)]
    updates: usize,
    /// Nodes heartbeating at once.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Revoked certificates listed in the last phase.
    #[arg(long, default_value_t = 5000)]
    entries: usize,
}

/// One phase's figures.
struct Phase {
    name: String,
    p50: Duration,
    p99: Duration,
    cpu_ms_per_update: f64,
}

async fn heartbeats(env: &Envtest, nodes: &[(String, Client)], updates: usize) -> Phase {
    let apiserver = env.apiserver_pid().unwrap_or(0);
    let before = CpuTimes::take();
    let per_node = updates / nodes.len();
    let work = nodes.iter().map(|(name, client)| {
        let (name, client) = (name.clone(), client.clone());
        async move {
            let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
            let mut took = Vec::with_capacity(per_node);
            for _ in 0..per_node {
                let renew = time::OffsetDateTime::now_utc()
                    .format(&time::macros::format_description!(
                        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
                    ))
                    .unwrap();
                let patch = json!({"spec": {"holderIdentity": name, "renewTime": renew}});
                let start = Instant::now();
                leases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap_or_else(|e| panic!("Lease {name}: {e}"));
                took.push(start.elapsed());
            }
            took
        }
    });
    let mut took: Vec<Duration> = futures::stream::iter(work)
        .buffer_unordered(nodes.len())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flatten()
        .collect();
    let cpu: f64 = before
        .used_since(&CpuTimes::take(), |pid, _| {
            (pid == apiserver).then(|| "apiserver".to_owned())
        })
        .values()
        .sum();
    took.sort();
    Phase {
        name: String::new(),
        p50: percentile(&took, 50.0),
        p99: percentile(&took, 99.0),
        cpu_ms_per_update: cpu * 1000.0 / took.len() as f64,
    }
}

fn listed(entries: usize) -> BTreeMap<String, String> {
    let listed: Vec<attestation::revocation::revoked_list::Listed> = (0..entries)
        .map(|i| attestation::revocation::revoked_list::Listed {
            id: attestation::revocation::CredentialId::of_certificate(format!("revoked-{i}").as_bytes()),
            not_after: 2_000_000_000,
            why: attestation::revocation::RevokeReason::MachineGone,
        })
        .collect();
    attestation::revocation::revoked_list::with_certificates(&BTreeMap::new(), &listed)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let env = Envtest::start("revocation-cost");
    let admin = live::client(&env.admin_kubeconfig).await;
    let mut nodes = Vec::new();
    for i in 0..args.nodes {
        let name = format!("bench-{i}");
        let (cert, key) = env.client_certificate(&format!("system:node:{name}"), &["system:nodes"]);
        let client = live::client(&env.kubeconfig_for_certificate(&name, &cert, &key)).await;
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": name, "namespace": "kube-node-lease"},
                           "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}});
        Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
            .create(&PostParams::default(), &serde_json::from_value(lease).unwrap())
            .await
            .unwrap();
        nodes.push((name, client));
    }
    // Warm-up: connections, the apiserver's caches.
    heartbeats(&env, &nodes, args.nodes * 50).await;
    let mut phases = Vec::new();
    let mut anchor = heartbeats(&env, &nodes, args.updates).await;
    anchor.name = "no revocation policy (anchor)".into();
    phases.push(anchor);

    let dir = tests::repo_root().join("config/workload");
    let out = env.kubectl(&["apply", "--server-side", "-k", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    for (name, entries) in [("policy, empty list", 0), ("policy, listed", args.entries)] {
        let data = listed(entries);
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": attestation::revocation::revoked_list::NAME, "namespace": "kube-system"},
                            "data": data});
        configmaps
            .patch(
                attestation::revocation::revoked_list::NAME,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap();
        // The policy's parameter informer and the node's first refusal-free write.
        tokio::time::sleep(Duration::from_secs(3)).await;
        heartbeats(&env, &nodes, args.nodes * 20).await;
        let mut phase = heartbeats(&env, &nodes, args.updates).await;
        phase.name = if entries == 0 {
            name.to_owned()
        } else {
            format!("{name} ({entries} revoked certificates)")
        };
        phases.push(phase);
    }
    // The policy is live: a listed certificate is refused.
    let (cert, key) = env.client_certificate("system:node:bench-0", &["system:nodes"]);
    let der = pem::parse(&cert).unwrap();
    let id = attestation::revocation::CredentialId::of_certificate(der.contents());
    let current = configmaps
        .get(attestation::revocation::revoked_list::NAME)
        .await
        .unwrap();
    let set = attestation::revocation::revoked_list::with_certificates(
        &current.data.unwrap_or_default(),
        &[attestation::revocation::revoked_list::Listed {
            id,
            not_after: 2_000_000_000,
            why: attestation::revocation::RevokeReason::Operator,
        }],
    );
    configmaps
        .patch(
            attestation::revocation::revoked_list::NAME,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": set})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let revoked = live::client(&env.kubeconfig_for_certificate("bench-revoked", &cert, &key)).await;
    let refused = Api::<Lease>::namespaced(revoked, "kube-node-lease")
        .patch(
            "bench-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"holderIdentity": "x"}})),
        )
        .await
        .is_err();

    let anchor = &phases[0];
    println!(
        "\nLease updates by {} nodes at once, {} a phase, one kube-apiserver (KUBEBUILDER_ASSETS)",
        args.nodes, args.updates
    );
    println!(
        "{:<52} {:>9} {:>9} {:>15} {:>12}",
        "phase", "p50 ms", "p99 ms", "CPU ms/update", "CPU ratio"
    );
    for p in &phases {
        println!(
            "{:<52} {:>9.2} {:>9.2} {:>15.3} {:>12.2}",
            p.name,
            p.p50.as_secs_f64() * 1000.0,
            p.p99.as_secs_f64() * 1000.0,
            p.cpu_ms_per_update,
            p.cpu_ms_per_update / anchor.cpu_ms_per_update.max(1e-9)
        );
    }
    println!("a listed certificate refused: {refused}");
}
