//! What a join's management requests cost the management apiserver (a benchmark, not a test):
//! issue 41 asks for the claim under 3 ms of kube-apiserver + etcd CPU per join, "if the design
//! allows it; say what bounds it if not".
//!
//! One apiserver and etcd from `KUBEBUILDER_ASSETS` with Cluster API's CRDs hold one Cluster and
//! `--machines` Machines (and as many ConfigMaps of the same size, for a built-in reference).
//! Each request kind is then made once per object, `--concurrency` at a time, as a storm of
//! joins makes it, with kube-apiserver's and etcd's CPU taken from `/proc` around it:
//!
//! - `claim PATCH`: the signer's claim, a JSON merge patch of one annotation under the
//!   resourceVersion the decision was made on (`management::write_claim`);
//! - `claim PATCH, no precondition`: the same without the resourceVersion;
//! - `ConfigMap PATCH`: the same patch on a ConfigMap of the Machine's size (a built-in type,
//!   stored as protobuf, no CRD schema);
//! - `schemaless PATCH`: the same patch on a custom resource holding the Machine's own JSON
//!   under a CRD with no schema (`x-kubernetes-preserve-unknown-fields`): what Machine's schema
//!   costs, against the custom-resource path itself;
//! - `Cluster GET`: the join's fresh read of its Cluster, a quorum read from etcd;
//! - `Cluster GET at the claim's resourceVersion`: the same served from the watch cache, not
//!   older than the claim just written (what a fresh-enough read could be).
//!
//! ```sh
//! cargo build --release -p tests --bin claim-cost
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets target/release/claim-cost --machines 1000
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, stream};
use kube::api::{ApiResource, DynamicObject, GetParams, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tests::capi;
use tests::envtest::Envtest;
use tests::live;
use tests::stats::{CpuTimes, percentile};

#[derive(Parser)]
#[command(about = "What a join's management requests cost kube-apiserver and etcd")]
struct Args {
    /// Machines (and ConfigMaps), one request of each kind per object.
    #[arg(long, default_value_t = 1000)]
    machines: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

/// One kind of request, measured.
struct Row {
    what: &'static str,
    apiserver_ms: f64,
    etcd_ms: f64,
    p50: Duration,
    p99: Duration,
}

fn machine_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"))
}

fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"))
}

/// The claim annotation's value as the signer writes it (about its size and shape).
fn claim_value(name: &str) -> String {
    json!({"nodeName": name, "providerID": format!("aws:///eu-west-1a/i-{name}"),
           "csrName": format!("join-{name}"), "csrUID": "0fcbc6a0-9f3e-4c1a-8d3b-7a0e6f2b1c44",
           "claimedAt": "2026-11-28T18:00:00Z", "signer": "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure"})
    .to_string()
}

/// Makes `requests` `concurrency` at a time and measures them.
async fn measure<F, Fut>(env: &Envtest, what: &'static str, concurrency: usize, requests: Vec<F>) -> (Row, Vec<String>)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let (apiserver, etcd) = (env.apiserver_pid().unwrap(), env.etcd_pid());
    let n = requests.len() as f64;
    let before = CpuTimes::take();
    let results: Vec<(Duration, String)> = stream::iter(requests)
        .map(|request| async move {
            let started = Instant::now();
            let out = request().await;
            (started.elapsed(), out)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let after = CpuTimes::take();
    let used = before.used_since(&after, |pid, _| {
        if pid == apiserver {
            Some("apiserver".to_owned())
        } else if pid == etcd {
            Some("etcd".to_owned())
        } else {
            None
        }
    });
    let mut latencies: Vec<Duration> = results.iter().map(|(d, _)| *d).collect();
    latencies.sort();
    let row = Row {
        what,
        apiserver_ms: used.get("apiserver").copied().unwrap_or_default() * 1000.0 / n,
        etcd_ms: used.get("etcd").copied().unwrap_or_default() * 1000.0 / n,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
    };
    (row, results.into_iter().map(|(_, out)| out).collect())
}

/// A CRD with no schema, to tell what the Machine's schema costs from the custom-resource path.
fn schemaless_crd() -> serde_json::Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "blobs.claimcost.example.com"},
        "spec": {"group": "claimcost.example.com", "scope": "Namespaced",
            "names": {"plural": "blobs", "singular": "blob", "kind": "Blob", "listKind": "BlobList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn resource_version(object: &DynamicObject) -> String {
    object.metadata.resource_version.clone().unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let env = Envtest::start("claim_cost");
    env.install_capi_crds();
    let client: Client = live::client(&env.admin_kubeconfig).await;
    live::apply(
        &client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": capi::NAMESPACE}}),
    )
    .await;
    live::create(&client, &capi::cluster("insecure")).await;
    env.apply(&[schemaless_crd()]);
    for _ in 0..100 {
        let listed = env.kubectl(&["get", "blobs.claimcost.example.com", "-A"]);
        if listed.status.success() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<String> = (0..args.machines).map(|i| format!("worker-{i}")).collect();
    let created = Instant::now();
    stream::iter(names.iter())
        .for_each_concurrent(args.concurrency, |name| {
            let client = client.clone();
            async move {
                let machine = capi::machine(name, Some(&format!("aws:///eu-west-1a/i-{name}")));
                let size = machine.to_string().len();
                live::create(&client, &machine).await;
                let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": capi::NAMESPACE},
                    "data": {"padding": "x".repeat(size)}});
                live::create(&client, &config_map).await;
                let mut blob = machine.clone();
                blob["apiVersion"] = json!("claimcost.example.com/v1");
                blob["kind"] = json!("Blob");
                // No status subresource here: the status rides in the object, the same bytes.
                let status = blob.as_object_mut().and_then(|o| o.remove("status"));
                blob["observed"] = status.unwrap_or_default();
                live::create(&client, &blob).await;
            }
        })
        .await;
    eprintln!(
        "{} Machines and ConfigMaps created in {:.1} s",
        args.machines,
        created.elapsed().as_secs_f64()
    );

    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), capi::NAMESPACE, &machine_resource());
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), capi::NAMESPACE, &cluster_resource());
    let config_maps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        capi::NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap")),
    );
    let ignore = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Ignore),
        ..PatchParams::default()
    };
    let blobs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        capi::NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("claimcost.example.com", "v1", "Blob")),
    );
    let mut rows = Vec::new();

    // The claim, as the signer writes it: under the resourceVersion it decided on.
    let versions: Vec<String> = stream::iter(names.iter())
        .then(|name| {
            let machines = machines.clone();
            async move { resource_version(&machines.get(name).await.unwrap()) }
        })
        .collect()
        .await;
    let requests = names
        .iter()
        .zip(versions)
        .map(|(name, version)| {
            let (machines, ignore) = (machines.clone(), ignore.clone());
            move || async move {
                let patch = json!({"metadata": {"resourceVersion": version,
                    "annotations": {"cluster.x-k8s.io/kubelet-claim": claim_value(name)}}});
                resource_version(&machines.patch(name, &ignore, &Patch::Merge(&patch)).await.unwrap())
            }
        })
        .collect();
    let (row, claimed_versions) = measure(
        &env,
        "claim PATCH (merge, resourceVersion precondition)",
        args.concurrency,
        requests,
    )
    .await;
    rows.push(row);

    let requests = names
        .iter()
        .map(|name| {
            let (machines, ignore) = (machines.clone(), ignore.clone());
            move || async move {
                let patch =
                    json!({"metadata": {"annotations": {"cluster.x-k8s.io/kubelet-claim-2": claim_value(name)}}});
                resource_version(&machines.patch(name, &ignore, &Patch::Merge(&patch)).await.unwrap())
            }
        })
        .collect();
    rows.push(
        measure(&env, "claim PATCH, no precondition", args.concurrency, requests)
            .await
            .0,
    );

    let requests = names
        .iter()
        .map(|name| {
            let (config_maps, ignore) = (config_maps.clone(), ignore.clone());
            move || async move {
                let patch = json!({"metadata": {"annotations": {"cluster.x-k8s.io/kubelet-claim": claim_value(name)}}});
                resource_version(&config_maps.patch(name, &ignore, &Patch::Merge(&patch)).await.unwrap())
            }
        })
        .collect();
    rows.push(
        measure(
            &env,
            "the same PATCH on a ConfigMap of the Machine's size",
            args.concurrency,
            requests,
        )
        .await
        .0,
    );

    let requests = names
        .iter()
        .map(|name| {
            let (blobs, ignore) = (blobs.clone(), ignore.clone());
            move || async move {
                let patch = json!({"metadata": {"annotations": {"cluster.x-k8s.io/kubelet-claim": claim_value(name)}}});
                resource_version(&blobs.patch(name, &ignore, &Patch::Merge(&patch)).await.unwrap())
            }
        })
        .collect();
    rows.push(
        measure(
            &env,
            "the same PATCH on the Machine's JSON under a CRD with no schema",
            args.concurrency,
            requests,
        )
        .await
        .0,
    );

    let requests = (0..args.machines)
        .map(|_| {
            let clusters = clusters.clone();
            move || async move { resource_version(&clusters.get(capi::CLUSTER).await.unwrap()) }
        })
        .collect();
    rows.push(
        measure(&env, "Cluster GET (quorum read)", args.concurrency, requests)
            .await
            .0,
    );

    let requests = claimed_versions
        .into_iter()
        .map(|version| {
            let clusters = clusters.clone();
            move || async move {
                let object = clusters
                    .get_with(capi::CLUSTER, &GetParams::at(&version))
                    .await
                    .unwrap_or_else(|e| panic!("GET at {version}: {e}"));
                resource_version(&object)
            }
        })
        .collect();
    rows.push(
        measure(
            &env,
            "Cluster GET not older than the claim (watch cache)",
            args.concurrency,
            requests,
        )
        .await
        .0,
    );

    println!(
        "\n{} requests of each kind, {} at once, one kube-apiserver v1.32 and etcd (CPU from /proc):\n",
        args.machines, args.concurrency
    );
    println!("| request | kube-apiserver CPU | etcd CPU | both | latency p50 | p99 |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {:.1} ms |",
            row.what,
            row.apiserver_ms,
            row.etcd_ms,
            row.apiserver_ms + row.etcd_ms,
            row.p50.as_secs_f64() * 1000.0,
            row.p99.as_secs_f64() * 1000.0
        );
    }
}
