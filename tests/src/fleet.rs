//! A realistic fleet of Cluster API objects for the scale harnesses (`signer-memory`,
//! `signer-soak --fleet-machines`): what a replica caches and lists per Machine is measured on
//! objects of the size and shape Cluster API writes, not on minimal ones.

use futures::StreamExt;
use kube::Client;
use serde_json::{Value, json};

use crate::live;

/// Machine `index` of `namespace/cluster`, as Cluster API and a provider write one for a running,
/// claimed node: labels, owner reference, addresses, conditions and a claim (its node name and
/// provider ID are its own, so it never stands in the way of another join).
pub fn machine(namespace: &str, cluster: &str, index: usize) -> Value {
    let name = format!("{cluster}-md-0-7d9f8b6c4x-{index:05}");
    let pid = format!(
        "aws:///us-east-1a/i-0{:016x}",
        (index as u64) * 7919 + cluster.len() as u64
    );
    let claim = json!({"nodeName": format!("ip-10-{}-{}-{}.ec2.internal", index / 65536 % 256, index / 256 % 256, index % 256),
                       "providerID": pid, "csrUID": "7d1c1f9e-2c4b-4f7a-9a58-0f3f5d7b9e21", "claimedAt": "2026-11-25T10:00:00Z"});
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": format!("{cluster}-md-0"),
                       "cluster.x-k8s.io/set-name": format!("{cluster}-md-0-7d9f8b6c4x"), "machine-template-hash": "3851462708"},
            "annotations": {"cluster.x-k8s.io/kubelet-claim": claim.to_string(),
                            "controlplane.cluster.x-k8s.io/kubeadm-cluster-configuration": "{\"etcd\":{},\"networking\":{},\"apiServer\":{},\"controllerManager\":{},\"scheduler\":{},\"dns\":{}}"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": format!("{cluster}-md-0-7d9f8b6c4x"),
                                 "uid": "0b6c1a5e-8f0e-4d3c-9c7b-2a1e5f4d3c2b", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "clusterName": cluster, "providerID": pid, "version": "v1.32.13",
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": name}},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSMachine", "name": name}
        },
        "status": {
            "initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
            "addresses": [
                {"type": "InternalIP", "address": format!("10.{}.{}.{}", index / 65536 % 256, index / 256 % 256, index % 256)},
                {"type": "InternalDNS", "address": format!("ip-10-{}-{}-{}.ec2.internal", index / 65536 % 256, index / 256 % 256, index % 256)},
                {"type": "Hostname", "address": format!("ip-10-{}-{}-{}", index / 65536 % 256, index / 256 % 256, index % 256)}
            ],
            "nodeRef": {"name": format!("ip-10-{}-{}-{}.ec2.internal", index / 65536 % 256, index / 256 % 256, index % 256)},
            "phase": "Running",
            "conditions": [
                {"type": "Available", "status": "True", "reason": "Available", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "UpToDate", "status": "True", "reason": "UpToDate", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "BootstrapConfigReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "InfrastructureReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "NodeHealthy", "status": "True", "reason": "NodeHealthy", "message": "", "lastTransitionTime": "2026-11-25T10:00:00Z"}
            ]
        }
    })
}

/// The KubeadmConfig of [`machine`] `index`.
pub fn kubeadm_config(namespace: &str, cluster: &str, index: usize) -> Value {
    let name = format!("{cluster}-md-0-7d9f8b6c4x-{index:05}");
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": format!("{cluster}-md-0")}},
        "spec": {"joinConfiguration": {
            "discovery": {"bootstrapToken": {"apiServerEndpoint": "10.0.0.1:6443", "token": "abcdef.0123456789abcdef",
                                             "caCertHashes": ["sha256:4d2b6f1e8a7c9d3e5f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a"]}},
            "nodeRegistration": {"name": "{{ ds.meta_data.local_hostname }}", "kubeletExtraArgs": [{"name": "provider-id", "value": "aws:///{{ ds.meta_data.placement.availability_zone }}/{{ ds.meta_data.instance_id }}"}]}
        }}
    })
}

/// Creates `machines` Machines, each with its KubeadmConfig, spread evenly over `clusters`
/// (`namespace`, `name`), `parallel` writes at once. Returns one Machine's size in JSON bytes.
pub async fn create(management: &Client, clusters: &[(String, String)], machines: usize, parallel: usize) -> usize {
    write(management, clusters, machines, parallel, false).await
}

/// [`create`] with `POST`s instead of server-side applies ([`crate::live::create`]): the
/// objects' field owners are an update's, not an apply's, and the apiserver spends less per write,
/// which a fleet of 100,000 Machines needs to be written in minutes on two cores.
pub async fn post(management: &Client, clusters: &[(String, String)], machines: usize, parallel: usize) -> usize {
    write(management, clusters, machines, parallel, true).await
}

async fn write(
    management: &Client,
    clusters: &[(String, String)],
    machines: usize,
    parallel: usize,
    post: bool,
) -> usize {
    if clusters.is_empty() || machines == 0 {
        return 0;
    }
    let per_cluster = machines.div_ceil(clusters.len());
    let objects: Vec<Value> = (0..machines)
        .flat_map(|i| {
            let (namespace, cluster) = &clusters[i / per_cluster];
            [kubeadm_config(namespace, cluster, i), machine(namespace, cluster, i)]
        })
        .collect();
    let sample = serde_json::to_vec(&objects[1]).map(|v| v.len()).unwrap_or(0);
    futures::stream::iter(objects.iter().map(|o| async move {
        if post {
            live::create(management, o).await
        } else {
            live::apply(management, o).await
        }
    }))
    .buffer_unordered(parallel.max(1))
    .collect::<Vec<_>>()
    .await;
    sample
}
