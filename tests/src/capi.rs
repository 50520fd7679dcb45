//! Cluster API objects as the management cluster serves them (v1beta2 unless said otherwise).

use serde_json::{Value, json};

/// Namespace of every fixture.
pub const NAMESPACE: &str = "team-a";
/// Cluster of every fixture.
pub const CLUSTER: &str = "prod";

/// An opted-in Cluster allowing `attestors` (comma list); allowing `aws`, it names the test
/// instances' role ([`AWS_NODE_ROLE`]).
pub fn cluster(attestors: &str) -> Value {
    let mut cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "uid": "c1a55e00-0000-4000-8000-00000000c1a5",
            "annotations": {"cluster.x-k8s.io/kubelet-authentication": "true", "cluster.x-k8s.io/kubelet-authorized-attestors": attestors}},
        "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "prod-cp"},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": "prod"}}
    });
    if attestors.split(',').any(|a| a.trim() == "aws") {
        // aws/v1 needs the nodes' roles (SPEC section 5): the suites' instances assume this one.
        cluster["metadata"]["annotations"][attestation::names::ANNOTATION_AWS_ROLES] = json!(AWS_NODE_ROLE);
    }
    cluster
}

/// The IAM role the test EC2 instances' credentials come from.
pub const AWS_NODE_ROLE: &str = "node-role";

/// A bootstrapped v1beta2 Machine of the Cluster with `provider_id`, its KubeadmConfig
/// `<name>-kc`, no node yet.
pub fn machine(name: &str, provider_id: Option<&str>) -> Value {
    let mut spec = json!({
        "clusterName": CLUSTER,
        "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": format!("{name}-kc")}},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": format!("{name}-infra")}
    });
    if let Some(pid) = provider_id {
        spec["providerID"] = json!(pid);
    }
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "100",
                     "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
        "spec": spec,
        "status": {"initialization": {"bootstrapDataSecretCreated": true, "infrastructureProvisioned": true},
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "InternalDNS", "address": format!("{name}.internal")}]}
    })
}

/// The same Machine as the v1beta1 API serves it.
pub fn machine_v1beta1(name: &str, provider_id: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "100"},
        "spec": {"clusterName": CLUSTER, "providerID": provider_id,
                 "bootstrap": {"configRef": {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": format!("{name}-kc")}},
                 "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": format!("{name}-infra")}},
        "status": {"bootstrapReady": true, "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}
    })
}

/// A v1beta2 MachinePool listing `provider_ids`, bootstrapped by KubeadmConfig `<name>-kc`.
pub fn machine_pool(name: &str, provider_ids: &[&str]) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "200"},
        "spec": {"clusterName": CLUSTER, "replicas": provider_ids.len(), "providerIDList": provider_ids,
                 "template": {"spec": {"clusterName": CLUSTER,
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": format!("{name}-kc")}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachinePool", "name": format!("{name}-infra")}}}},
        "status": {"initialization": {"bootstrapDataSecretCreated": true}}
    })
}

/// The v1beta1 form of [`machine_pool`].
pub fn machine_pool_v1beta1(name: &str, provider_ids: &[&str]) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachinePool",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"), "resourceVersion": "200"},
        "spec": {"clusterName": CLUSTER, "providerIDList": provider_ids,
                 "template": {"spec": {"clusterName": CLUSTER,
                     "bootstrap": {"configRef": {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": format!("{name}-kc")}},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachinePool", "name": format!("{name}-infra")}}}},
        "status": {"bootstrapReady": true}
    })
}

/// A KubeadmConfig whose join configuration names bootstrap token `<token_id>.<secret>`.
pub fn kubeadm_config(name: &str, token_id: &str, api_version: &str) -> Value {
    json!({
        "apiVersion": format!("bootstrap.cluster.x-k8s.io/{api_version}"), "kind": "KubeadmConfig",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"joinConfiguration": {"discovery": {"bootstrapToken": {
            "apiServerEndpoint": "10.0.0.1:6443", "token": format!("{token_id}.0123456789abcdef"), "unsafeSkipCAVerification": true}}}}
    })
}

/// Sets an annotation.
pub fn annotate(object: &mut Value, key: &str, value: &str) {
    let meta = &mut object["metadata"];
    if meta.get("annotations").is_none() {
        meta["annotations"] = json!({});
    }
    meta["annotations"][key] = json!(value);
}

/// A workload-cluster Node.
pub fn node(name: &str, provider_id: Option<&str>) -> Value {
    let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}});
    if let Some(pid) = provider_id {
        node["spec"]["providerID"] = json!(pid);
    }
    node
}

/// The rule engine's decision on `csr` in `cluster` with `machines` (worker-0 and worker-1, whose
/// KubeadmConfigs `worker-0-kc` and `worker-1-kc` name tokens `abcdef` and `ghijkl`), the other
/// CSRs `csrs`, no Nodes, `verifiers`, at `now` (first seen then): the two-phase providers'
/// worlds (`tpm_world`, `azure`).
pub fn decide_among(
    csr: &attestation::CsrObject,
    cluster: &Value,
    machines: &[Value],
    csrs: &dyn attestation::CsrDirectory,
    verifiers: attestation::attestor::Verifiers,
    now: time::OffsetDateTime,
) -> attestation::Decision {
    let cluster = attestation::machine::ClusterView::from_object(cluster).expect("a Cluster");
    decide_in(csr, &cluster, machines, csrs, verifiers, now)
}

/// [`decide_among`] in a Cluster already read (a suite sets what the signer would have added,
/// such as the boot policy it read).
pub fn decide_in(
    csr: &attestation::CsrObject,
    cluster: &attestation::machine::ClusterView,
    machines: &[Value],
    csrs: &dyn attestation::CsrDirectory,
    verifiers: attestation::attestor::Verifiers,
    now: time::OffsetDateTime,
) -> attestation::Decision {
    use attestation::machine::{Inventory, KubeadmConfigView, MachineView};
    let inventory = Inventory {
        index: Default::default(),
        machines: machines
            .iter()
            .map(|m| MachineView::from_object(m).expect("a Machine").into())
            .collect(),
        kubeadm_configs: ["worker-0-kc", "worker-1-kc"]
            .iter()
            .zip(["abcdef", "ghijkl"])
            .map(|(name, token)| {
                KubeadmConfigView::from_object(&kubeadm_config(name, token, "v1beta2"))
                    .expect("a KubeadmConfig")
                    .into()
            })
            .collect(),
        ..Inventory::default()
    };
    let nodes: Vec<attestation::machine::NodeView> = Vec::new();
    attestation::decide(&attestation::Inputs {
        csr,
        cluster,
        inventory: &inventory,
        nodes: &nodes,
        csrs,
        verifiers: &verifiers,
        clock: attestation::Clock {
            now,
            first_seen: now,
            max_age: time::Duration::minutes(15),
        },
    })
    .expect("a kubelet client CSR")
}
