//! `clusterctl move` (SPEC section 7, revision 5) on real kube-apiservers (`KUBEBUILDER_ASSETS`;
//! skipped loudly without): two management clusters, source and target (each with the Cluster API
//! CRDs and a signer of its own), and one workload cluster whose Cluster object is moved from the
//! one to the other. The move is played as clusterctl's own code does it,
//! sigs.k8s.io/cluster-api `cmd/clusterctl/client/cluster/mover.go` (each step below names its
//! function): the source Cluster paused by `spec.paused`, its objects copied (the claims with
//! them: they are annotations; status is not: the API server drops it on create, so the target's
//! Cluster API controllers rebuild it), the source's deleted, and the copy unpaused. Not played,
//! having nothing to act on here: `checkTargetProviders` and the providers' namespace Secrets
//! (no clusterctl inventory), `setClusterClassPause` (no ClusterClass).
//!
//! Before the move the source signer issues the Machines' and a MachinePool instance's first
//! certificates and a renewal. A join in flight when the move starts (its claim's PATCH held in
//! the source signer's connection until after the copy, as an API server's priority-and-fairness
//! queue can hold it) is not signed by the source. During the move nobody decides: a racing pair
//! of joins for an unclaimed pool instance (two keys, one bootstrap token), a renewal, a second
//! join for a claimed Machine, and the held join's own rival all wait for the target's unpause.
//! After it the target decides each once: one certificate per Machine and instance, the copied
//! claims refusing the second join, and a node renewing through the target. Every CSR is decided
//! once, by one signer (each signer's log names the CSRs it decided), and each certificate's
//! record is its approval condition, naming the replica of the signer that approved it; neither
//! management cluster holds an Event per certificate.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use attestation::names::SIGNER_INSECURE;
use attestation::request::KeyAlgorithm;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tests::capi;
use tests::csr::RequestSpec;
use tests::envtest::{Envtest, SharedEtcd};
use tests::live::{self, Final, Signer, Workload, apply, file_csr, metric, state_of, wait_final};
use tests::revocation::now;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIGNER_BIN: &str = env!("CARGO_BIN_EXE_node-attestation-signer");
const CLIENT_USAGES: &[&str] = &["digital signature", "client auth"];
const WAIT: Duration = Duration::from_secs(40);
const NS: &str = capi::NAMESPACE;
const CLUSTER: &str = capi::CLUSTER;
/// The stand-alone Machines (all joined before the move: clusterctl moves nothing else).
const MACHINES: [&str; 4] = ["m-0", "m-1", "m-2", "m-3"];
/// The MachinePool's instances: pool-0 joined before the move; pool-1 and pool-2 still booting.
const INSTANCES: [&str; 3] = ["pool-0", "pool-1", "pool-2"];
/// The annotations clusterctl reads and writes.
const BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";
const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";
const MOVE_HIERARCHY_LABEL: &str = "clusterctl.cluster.x-k8s.io/move-hierarchy";
/// util/secret's allSecretPurposes: the suffixes that tie a Secret to its Cluster by name.
const SECRET_PURPOSES: [&str; 6] = ["kubeconfig", "ca", "etcd", "sa", "proxy", "apiserver-etcd-client"];

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

// ---------------------------------------------------------------------------------------------
// A TCP relay whose traffic can be held (not cut): what a request queued in an API server's
// priority-and-fairness queue looks like to the client that sent it.

struct Valve {
    url: String,
    held: Arc<AtomicBool>,
    /// Bytes the client sent while held.
    sent_while_held: Arc<AtomicUsize>,
}

impl Valve {
    async fn start(server: &str) -> Self {
        let target = server.trim_start_matches("https://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let (held, sent_while_held) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (h, s) = (Arc::clone(&held), Arc::clone(&sent_while_held));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(relay(client_read, server_write, Arc::clone(&h), Some(Arc::clone(&s))));
                tokio::spawn(relay(server_read, client_write, Arc::clone(&h), None));
            }
        });
        Self {
            url,
            held,
            sent_while_held,
        }
    }

    fn hold(&self) {
        self.sent_while_held.store(0, Ordering::SeqCst);
        self.held.store(true, Ordering::SeqCst);
    }

    fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
    }
}

async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    held: Arc<AtomicBool>,
    counted: Option<Arc<AtomicUsize>>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if held.load(Ordering::SeqCst)
            && let Some(counted) = &counted
        {
            counted.fetch_add(n, Ordering::SeqCst);
        }
        while held.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// clusterctl move, as cmd/clusterctl/client/cluster/mover.go and objectgraph.go do it.

/// A kind clusterctl discovers (objectgraph.go, `getDiscoveryTypes`): every CRD's storage
/// version, plus Secrets and ConfigMaps.
#[derive(Clone)]
struct DiscoveryType {
    resource: ApiResource,
    /// `kubectl`'s name for it.
    kubectl: String,
    force_move: bool,
    force_move_hierarchy: bool,
}

/// An object of the graph (objectgraph.go, `node`).
struct GraphNode {
    kind: DiscoveryType,
    name: String,
    uid: String,
    /// Owner UIDs with the reference's `controller` and `blockOwnerDeletion`.
    owners: Vec<(String, Value)>,
    soft_owners: Vec<String>,
    force_move: bool,
    force_move_hierarchy: bool,
    tenant: bool,
    blocking_move: bool,
    /// The UID the copy got in the target (`newUID`).
    new_uid: Option<String>,
}

struct Move {
    from: Client,
    to: Client,
    namespace: String,
    nodes: Vec<GraphNode>,
}

impl Move {
    /// `getObjectGraph`: `getDiscoveryTypes`, `Discovery` (owner references, `setSoftOwnership`,
    /// `setTenants`), then `checkProvisioningCompleted`.
    async fn discover(from: &Client, to: &Client, namespace: &str) -> Self {
        let crds = Api::<CustomResourceDefinition>::all(from.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let mut types = Vec::new();
        for crd in crds.items {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            let (group, kind) = (crd.spec.group.clone(), crd.spec.names.kind.clone());
            for version in crd.spec.versions.iter().filter(|v| v.storage) {
                // Cluster, ClusterClass and ClusterResourceSet always move with their hierarchy.
                let force_move_hierarchy = (group == "cluster.x-k8s.io"
                    && ["Cluster", "ClusterClass"].contains(&kind.as_str()))
                    || (group == "addons.cluster.x-k8s.io" && kind == "ClusterResourceSet")
                    || labels.contains_key(MOVE_HIERARCHY_LABEL);
                let gvk = GroupVersionKind::gvk(&group, &version.name, &kind);
                types.push(DiscoveryType {
                    resource: ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural),
                    kubectl: format!("{}.{group}", crd.spec.names.plural),
                    force_move: force_move_hierarchy || labels.contains_key(MOVE_LABEL),
                    force_move_hierarchy,
                });
            }
        }
        for (kind, plural) in [("Secret", "secrets"), ("ConfigMap", "configmaps")] {
            types.push(DiscoveryType {
                resource: ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", kind), plural),
                kubectl: plural.to_owned(),
                force_move: false,
                force_move_hierarchy: false,
            });
        }
        let mut nodes = Vec::new();
        for kind in types {
            let api: Api<DynamicObject> = Api::namespaced_with(from.clone(), namespace, &kind.resource);
            for object in api.list(&Default::default()).await.unwrap() {
                let labels = object.metadata.labels.clone().unwrap_or_default();
                let annotations = object.metadata.annotations.clone().unwrap_or_default();
                nodes.push(GraphNode {
                    name: object.metadata.name.clone().unwrap(),
                    uid: object.metadata.uid.clone().unwrap(),
                    owners: object
                        .metadata
                        .owner_references
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|o| {
                            (
                                o.uid,
                                json!({"controller": o.controller, "blockOwnerDeletion": o.block_owner_deletion}),
                            )
                        })
                        .collect(),
                    soft_owners: Vec::new(),
                    force_move: kind.force_move || labels.contains_key(MOVE_LABEL),
                    force_move_hierarchy: kind.force_move_hierarchy || labels.contains_key(MOVE_HIERARCHY_LABEL),
                    tenant: false,
                    blocking_move: annotations.contains_key(BLOCK_MOVE),
                    new_uid: None,
                    kind: kind.clone(),
                });
            }
        }
        let mut graph = Self {
            from: from.clone(),
            to: to.clone(),
            namespace: namespace.to_owned(),
            nodes,
        };
        graph.set_soft_ownership();
        graph.set_tenants();
        graph.check_provisioning_completed().await;
        graph
    }

    fn is(&self, i: usize, group: &str, kind: &str) -> bool {
        let gvk = &self.nodes[i].kind.resource;
        gvk.group == group && gvk.kind == kind
    }

    /// `setSoftOwnership`: a Secret without owners whose name is `<cluster>-<purpose>` belongs to
    /// that Cluster (`secret.ParseSecretName`: the purpose after the last `-`).
    fn set_soft_ownership(&mut self) {
        let clusters: Vec<(String, String)> = (0..self.nodes.len())
            .filter(|i| self.is(*i, "cluster.x-k8s.io", "Cluster"))
            .map(|i| (self.nodes[i].name.clone(), self.nodes[i].uid.clone()))
            .collect();
        for node in &mut self.nodes {
            if node.kind.resource.kind != "Secret" || !node.owners.is_empty() {
                continue;
            }
            let Some((cluster, purpose)) = node.name.rsplit_once('-') else {
                continue;
            };
            if !SECRET_PURPOSES.contains(&purpose) {
                continue;
            }
            for (name, uid) in &clusters {
                if name == cluster {
                    node.soft_owners.push(uid.clone());
                }
            }
        }
    }

    /// `setTenants`: everything a Cluster (or another force-move-hierarchy object) owns or
    /// soft-owns, down the owner chain, moves with it.
    fn set_tenants(&mut self) {
        let mut frontier: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.force_move_hierarchy)
            .map(|n| n.uid.clone())
            .collect();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        while let Some(uid) = frontier.pop() {
            if !seen.insert(uid.clone()) {
                continue;
            }
            for node in &mut self.nodes {
                if node.uid == uid || node.owners.iter().any(|(o, _)| *o == uid) || node.soft_owners.contains(&uid) {
                    node.tenant = true;
                    frontier.push(node.uid.clone());
                }
            }
        }
    }

    /// `getMoveNodes`.
    fn move_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].tenant || self.nodes[*i].force_move)
            .collect()
    }

    /// `checkProvisioningCompleted`: every Cluster's infrastructure provisioned and control plane
    /// initialized, every Machine with a `status.nodeRef`. (MachinePools are not checked.)
    async fn check_provisioning_completed(&self) {
        for i in 0..self.nodes.len() {
            let object = self.get(&self.from, i).await.unwrap();
            if self.is(i, "cluster.x-k8s.io", "Cluster") {
                let status = &object["status"];
                assert_eq!(
                    status["initialization"]["infrastructureProvisioned"], true,
                    "{object:#}"
                );
                assert_eq!(status["initialization"]["controlPlaneInitialized"], true, "{object:#}");
                let initialized = status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "ControlPlaneInitialized" && c["status"] == "True");
                assert!(
                    initialized,
                    "clusterctl refuses the move: control plane not initialized"
                );
            }
            if self.is(i, "cluster.x-k8s.io", "Machine") {
                assert!(
                    object["status"]["nodeRef"]["name"].is_string(),
                    "clusterctl refuses the move: Machine {} is still provisioning the node",
                    self.nodes[i].name
                );
            }
        }
    }

    fn api(&self, client: &Client, i: usize) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.namespace, &self.nodes[i].kind.resource)
    }

    async fn get(&self, client: &Client, i: usize) -> Option<Value> {
        let object = self.api(client, i).get_opt(&self.nodes[i].name).await.unwrap()?;
        let mut value = serde_json::to_value(object).unwrap();
        let resource = &self.nodes[i].kind.resource;
        value["apiVersion"] = json!(resource.api_version);
        value["kind"] = json!(resource.kind);
        Some(value)
    }

    fn clusters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.is(*i, "cluster.x-k8s.io", "Cluster"))
            .collect()
    }

    /// `checkClustersNotPaused`, then `setClusterPause(..., true, ...)`: a merge patch of
    /// `{"spec":{"paused":true}}` on each source Cluster (`patchCluster`). There is no
    /// ClusterClass here, so `setClusterClassPause` has nothing to do.
    async fn pause_source(&self) {
        for i in self.clusters() {
            let cluster = self.get(&self.from, i).await.unwrap();
            assert!(
                cluster["spec"]["paused"] != true,
                "clusterctl refuses to move a paused Cluster"
            );
            self.set_paused(&self.from, i, json!(true)).await;
        }
    }

    /// `setClusterPause(toProxy, clusters, false, ...)`: `{"spec":{"paused":null}}`, dropping the
    /// field rather than setting it false.
    async fn unpause_target(&self) {
        for i in self.clusters() {
            self.set_paused(&self.to, i, Value::Null).await;
        }
    }

    async fn set_paused(&self, client: &Client, i: usize, value: Value) {
        self.api(client, i)
            .patch(
                &self.nodes[i].name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"paused": value}})),
            )
            .await
            .unwrap();
    }

    /// `waitReadyForMove`: every move node blocking the move (`clusterctl.cluster.x-k8s.io/
    /// block-move`, read at discovery) must lose the annotation first. None does here.
    async fn wait_ready_for_move(&self) {
        for i in self.move_nodes() {
            if self.nodes[i].blocking_move {
                let object = self.get(&self.from, i).await.unwrap();
                assert!(
                    object["metadata"]["annotations"][BLOCK_MOVE].is_null(),
                    "{} blocks the move",
                    self.nodes[i].name
                );
            }
        }
    }

    /// `getMoveSequence`: groups of move nodes whose owners (and soft owners) are all in earlier
    /// groups.
    fn sequence(&self) -> Vec<Vec<usize>> {
        let moving = self.move_nodes();
        let mut placed: BTreeSet<String> = BTreeSet::new();
        let mut groups = Vec::new();
        loop {
            let group: Vec<usize> = moving
                .iter()
                .copied()
                .filter(|i| !placed.contains(&self.nodes[*i].uid))
                .filter(|i| {
                    let node = &self.nodes[*i];
                    node.owners.iter().map(|(o, _)| o).chain(&node.soft_owners).all(|o| {
                        // Owners outside the graph are virtual nodes: never moved, never waited for.
                        placed.contains(o) || !moving.iter().any(|m| self.nodes[*m].uid == *o)
                    })
                })
                .collect();
            if group.is_empty() {
                return groups;
            }
            placed.extend(group.iter().map(|i| self.nodes[*i].uid.clone()));
            groups.push(group);
        }
    }

    /// `createGroup` for each group in turn, each object by `createTargetObject`: read from the
    /// source, `resourceVersion` cleared, owner references rebuilt with the owners' new UIDs
    /// (`buildOwnerChain`), the namespace ensured (`ensureNamespace`), created in the target.
    /// The object is sent whole, status included; the API server drops status on create for a
    /// kind with a status subresource, and sets a new UID and creationTimestamp.
    async fn copy(&mut self, between_groups: &mut dyn FnMut(usize)) {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.to.clone());
        if namespaces.get_opt(&self.namespace).await.unwrap().is_none() {
            namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": self.namespace}})).unwrap(),
                )
                .await
                .unwrap();
        }
        for (g, group) in self.sequence().into_iter().enumerate() {
            between_groups(g);
            for i in group {
                let mut object = self.get(&self.from, i).await.unwrap();
                let meta = object["metadata"].as_object_mut().unwrap();
                meta.remove("resourceVersion");
                meta.remove("ownerReferences");
                let owners: Vec<Value> = self.nodes[i]
                    .owners
                    .iter()
                    .filter_map(|(uid, attributes)| {
                        let owner = self.nodes.iter().find(|n| n.uid == *uid)?;
                        let mut reference = json!({"apiVersion": owner.kind.resource.api_version, "kind": owner.kind.resource.kind,
                                                   "name": owner.name, "uid": owner.new_uid.clone()?});
                        for key in ["controller", "blockOwnerDeletion"] {
                            if attributes[key].is_boolean() {
                                reference[key] = attributes[key].clone();
                            }
                        }
                        Some(reference)
                    })
                    .collect();
                if !owners.is_empty() {
                    meta.insert("ownerReferences".into(), json!(owners));
                }
                let created = self
                    .api(&self.to, i)
                    .create(&PostParams::default(), &serde_json::from_value(object).unwrap())
                    .await
                    .unwrap_or_else(|e| panic!("create {} in the target: {e}", self.nodes[i].name));
                self.nodes[i].new_uid = created.metadata.uid.clone();
            }
        }
    }

    /// `deleteGroup` for each group in reverse order, each object by `deleteSourceObject`: the
    /// `delete-for-move` annotation added by a JSON patch (`add` on `/metadata/annotations`,
    /// which replaces every annotation, the claims included), the object deleted, and its
    /// finalizers removed so that it goes at once.
    async fn delete_source(&self, kubectl: impl Fn(&[&str])) {
        for group in self.sequence().into_iter().rev() {
            for i in group {
                let node = &self.nodes[i];
                let Some(object) = self.get(&self.from, i).await else {
                    continue;
                };
                let patch = json!([{"op": "add", "path": "/metadata/annotations", "value": {DELETE_FOR_MOVE: ""}}]);
                kubectl(&[
                    "patch",
                    &node.kind.kubectl,
                    &node.name,
                    "-n",
                    &self.namespace,
                    "--type",
                    "json",
                    "-p",
                    &patch.to_string(),
                ]);
                let _ = self
                    .api(&self.from, i)
                    .delete(&node.name, &DeleteParams::default())
                    .await;
                if object["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
                {
                    let _ = self
                        .api(&self.from, i)
                        .patch(
                            &node.name,
                            &PatchParams::default(),
                            &Patch::Merge(&json!({"metadata": {"finalizers": []}})),
                        )
                        .await;
                }
            }
        }
    }

    fn moved(&self) -> Vec<String> {
        self.move_nodes()
            .into_iter()
            .map(|i| format!("{}/{}", self.nodes[i].kind.resource.kind, self.nodes[i].name))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The fixture: what Cluster API's controllers write, so that clusterctl finds a provisioned
// Cluster and the owner chain it moves by.

/// The Cluster as provisioned: its finalizer, and the status `checkProvisioningCompleted` reads.
async fn provisioned_cluster(management: &Client) -> String {
    let mut cluster = capi::cluster("insecure");
    cluster["metadata"]["finalizers"] = json!(["cluster.cluster.x-k8s.io"]);
    cluster["status"] = json!({
        "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
        "conditions": [{"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized", "message": "",
                        "lastTransitionTime": now()}]
    });
    let applied = apply(management, &cluster).await;
    applied["metadata"]["uid"].as_str().unwrap().to_owned()
}

fn owner(kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": name, "uid": uid}])
}

/// A stand-alone Machine, owned by the Cluster as the Machine controller adopts one
/// (`reconcileMachineOwnerAndLabels`), and its KubeadmConfig, owned by the Machine
/// (`ensureExternalOwnershipAndWatch`).
async fn add_machine(management: &Client, name: &str, cluster_uid: &str) {
    let mut machine = capi::machine(name, Some(&pid(name)));
    machine["metadata"]["ownerReferences"] = owner("Cluster", CLUSTER, cluster_uid);
    machine["metadata"]["finalizers"] = json!(["machine.cluster.x-k8s.io"]);
    let machine_uid = apply(management, &machine).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut config = capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2");
    config["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": CLUSTER});
    config["metadata"]["ownerReferences"] = owner("Machine", name, &machine_uid);
    apply(management, &config).await;
}

/// The MachinePool, owned by the Cluster (`reconcileSetOwnerAndLabels`), with its
/// KubeadmConfig.
async fn add_pool(management: &Client, cluster_uid: &str) {
    let ids: Vec<String> = INSTANCES.iter().map(|i| pid(i)).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut pool = capi::machine_pool("pool", &ids);
    pool["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": CLUSTER});
    pool["metadata"]["ownerReferences"] = owner("Cluster", CLUSTER, cluster_uid);
    pool["metadata"]["finalizers"] = json!(["machinepool.cluster.x-k8s.io"]);
    let pool_uid = apply(management, &pool).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut config = capi::kubeadm_config("pool-kc", "abcdef", "v1beta2");
    config["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": CLUSTER});
    config["metadata"]["ownerReferences"] = owner("MachinePool", "pool", &pool_uid);
    apply(management, &config).await;
}

/// What the Machine and MachinePool controllers write in status once nodes registered (and,
/// after a move, rebuild in the target: clusterctl never restores status).
async fn controllers_write_status(management: &Client, registered_instances: &[&str]) {
    for name in MACHINES {
        let mut status = capi::machine(name, None)["status"].clone();
        status["nodeRef"] = json!({"name": name});
        patch_status(management, "machines", name, status).await;
    }
    let mut status = capi::machine_pool("pool", &[])["status"].clone();
    status["nodeRefs"] = registered_instances
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Node", "name": n}))
        .collect();
    patch_status(management, "machinepools", "pool", status).await;
    let mut cluster = capi::cluster("insecure");
    cluster["status"] = json!({
        "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
        "conditions": [{"type": "ControlPlaneInitialized", "status": "True", "reason": "Initialized", "message": "",
                        "lastTransitionTime": now()}]
    });
    patch_status(management, "clusters", CLUSTER, cluster["status"].clone()).await;
}

async fn patch_status(management: &Client, plural: &str, name: &str, status: Value) {
    let kind = match plural {
        "machines" => "Machine",
        "machinepools" => "MachinePool",
        _ => "Cluster",
    };
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind), plural);
    Api::<DynamicObject>::namespaced_with(management.clone(), NS, &resource)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .unwrap_or_else(|e| panic!("status of {plural}/{name}: {e}"));
}

// ---------------------------------------------------------------------------------------------
// The nodes' side.

/// Which Machine or instance each CSR asks for, and whether it is a renewal.
#[derive(Default)]
struct Plan(BTreeMap<String, (String, bool)>);

impl Plan {
    /// Files a join for `machine` (node name = Machine or instance name) with `key`.
    async fn join(&mut self, w: &Workload, csr: &str, machine: &str, key: KeyAlgorithm) {
        let spec = RequestSpec {
            key,
            ..RequestSpec::kubelet(machine, &pid(machine))
        };
        file_csr(&w.bootstrap, csr, SIGNER_INSECURE, &spec.build(), CLIENT_USAGES).await;
        self.0.insert(csr.to_owned(), (machine.to_owned(), false));
    }

    /// Files a renewal by `machine`'s node with the certificate it holds.
    async fn renew(&mut self, w: &Workload, csr: &str, machine: &str, cert: &str) {
        let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
        let node = w.node_client(machine, cert, &key).await;
        let spec = RequestSpec::kubelet(machine, &pid(machine));
        file_csr(&node, csr, SIGNER_INSECURE, &spec.build(), CLIENT_USAGES).await;
        self.0.insert(csr.to_owned(), (machine.to_owned(), true));
    }
}

fn issued(state: Final, what: &str, log: &str) -> String {
    match state {
        Final::Issued(pem) => pem,
        other => panic!("{what}: {other:?}\n{log}"),
    }
}

/// The node registers its Node with the certificate it was just issued (the Node authorizer
/// and NodeRestriction let it create its own).
async fn register_node(w: &Workload, name: &str, cert: &str) {
    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
    let node = w.node_client(name, cert, &key).await;
    Api::<k8s_openapi::api::core::v1::Node>::all(node)
        .create(
            &PostParams::default(),
            &serde_json::from_value(capi::node(name, Some(&pid(name)))).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Node {name} registered by its kubelet: {e}"));
}

// ---------------------------------------------------------------------------------------------
// Reading what the signers did.

/// Lines of `log` that decide CSR `name`: signed, denied, or failed after approval.
fn decisions_of(log: &str, name: &str) -> usize {
    let (spaced, closed) = (format!("csr={name} "), format!("csr={name}}}"));
    log.lines()
        .filter(|l| l.contains(&spaced) || l.contains(&closed))
        .filter(|l| {
            l.contains("approved and signed") || l.contains(" denied") || l.contains("was approved but is not signed")
        })
        .count()
}

/// `node_attestation_clusters{state=...}` of a signer.
fn clusters(signer: &Signer, state: &str) -> f64 {
    metric(
        &signer.metrics(),
        &format!("node_attestation_clusters{{state=\"{state}\"}}"),
    )
}

/// Waits (`within`) until `check` holds, or panics with both signers' logs.
async fn until(what: &str, within: Duration, logs: [&Signer; 2], mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}\nsource log:\n{}\ntarget log:\n{}",
            logs[0].log(),
            logs[1].log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The claims, by Machine or instance name, on the Machines and MachinePool of `management`.
async fn claims(management: &Client) -> BTreeMap<String, Value> {
    let mut found = BTreeMap::new();
    for name in MACHINES {
        let machine = live::get(management, &capi::machine(name, None)).await;
        if let Some(text) = machine["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claim"].as_str() {
            found.insert(name.to_owned(), serde_json::from_str(text).unwrap());
        }
    }
    let pool = live::get(management, &capi::machine_pool("pool", &[])).await;
    if let Some(text) = pool["metadata"]["annotations"]["cluster.x-k8s.io/kubelet-claims"].as_str() {
        let records: BTreeMap<String, Value> = serde_json::from_str(text).unwrap();
        for instance in INSTANCES {
            if let Some(record) = records.get(&pid(instance)) {
                found.insert(instance.to_owned(), record.clone());
            }
        }
    }
    found
}

/// The Events in the Cluster's namespace of `management`, as reasons.
async fn event_reasons(management: &Client) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(management.clone(), NS);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

/// `system:node:<name>` from a certificate's subject.
fn subject_node(pem: &str) -> String {
    let block = pem::parse(pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    cn.strip_prefix("system:node:").unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn clusterctl_move_keeps_one_identity_per_machine_and_the_target_signer_takes_over() {
    let started = Instant::now();
    let etcd = SharedEtcd::start("envtest_move");
    // Three apiservers on one etcd, started at once.
    let (source_env, target_env, workload_env) = std::thread::scope(|s| {
        let start = |what: &'static str| {
            let etcd = &etcd;
            s.spawn(move || {
                let env = Envtest::start_on(what, etcd);
                if what != "envtest_move (workload)" {
                    env.install_capi_crds();
                }
                env
            })
        };
        let (a, b, c) = (
            start("envtest_move (source)"),
            start("envtest_move (target)"),
            start("envtest_move (workload)"),
        );
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    let source = live::client(&source_env.admin_kubeconfig).await;
    let target = live::client(&target_env.admin_kubeconfig).await;
    let w = Workload::register(workload_env, &source, NS, CLUSTER, "insecure").await;
    let cluster_uid = provisioned_cluster(&source).await;
    for name in MACHINES {
        add_machine(&source, name, &cluster_uid).await;
    }
    add_pool(&source, &cluster_uid).await;

    // One signer per management cluster, one process each. The source's management connection
    // goes through a valve the test can hold.
    let valve = Valve::start(&source_env.server).await;
    let direct = Signer::management_identity(&source_env).await;
    let through_valve = source_env.dir().join("signer-through-valve.kubeconfig");
    std::fs::write(
        &through_valve,
        std::fs::read_to_string(&direct)
            .unwrap()
            .replace(&source_env.server, &valve.url),
    )
    .unwrap();
    let source_signer = Signer::run_as(
        Path::new(SIGNER_BIN),
        &source_env,
        &through_valve,
        &["--leader-elect=false", "--replica-name", "source"],
    );
    let target_signer = Signer::start(
        Path::new(SIGNER_BIN),
        &target_env,
        &["--leader-elect=false", "--replica-name", "target"],
    )
    .await;
    let logs = [&source_signer, &target_signer];
    until(
        "the source serves the Cluster",
        Duration::from_secs(60),
        logs,
        async || clusters(&source_signer, "Ready") == 1.0,
    )
    .await;
    until("the target signer is up", Duration::from_secs(60), logs, async || {
        !target_signer.metrics().is_empty()
    })
    .await;
    eprintln!("[{:?}] set up", started.elapsed());

    // Before the move: the source issues every Machine's first certificate and pool-0's; the
    // nodes register their Nodes, the Machine and MachinePool controllers write their nodeRefs
    // (without which clusterctl refuses to move), and m-0 renews once.
    let mut plan = Plan::default();
    let mut certs: BTreeMap<String, String> = BTreeMap::new();
    for name in MACHINES.iter().chain(&INSTANCES[..1]) {
        plan.join(&w, &format!("join-{name}"), name, KeyAlgorithm::EcdsaP256)
            .await;
    }
    for name in MACHINES.iter().chain(&INSTANCES[..1]) {
        let state = wait_final(&w.admin, &format!("join-{name}"), false, WAIT).await;
        let cert = issued(state, &format!("join-{name} before the move"), &source_signer.log());
        register_node(&w, name, &cert).await;
        certs.insert((*name).to_owned(), cert);
    }
    controllers_write_status(&source, &INSTANCES[..1]).await;
    plan.renew(&w, "renew-m-0", "m-0", &certs["m-0"]).await;
    issued(
        wait_final(&w.admin, "renew-m-0", false, WAIT).await,
        "m-0's renewal before the move",
        &source_signer.log(),
    );

    // A join in flight as the move starts: pool-2's node asks, and the source's claim PATCH is
    // held in its connection (an API server's priority-and-fairness queue can hold a request
    // this long) until after clusterctl has copied the MachinePool.
    valve.hold();
    plan.join(&w, "join-pool-2-a", "pool-2", KeyAlgorithm::EcdsaP256).await;
    let in_flight = || metric(&source_signer.metrics(), "node_attestation_csrs_in_flight ");
    until(
        "the source works on pool-2's join",
        Duration::from_secs(20),
        logs,
        async || in_flight() >= 1.0 && valve.sent_while_held.load(Ordering::SeqCst) > 0,
    )
    .await;

    // clusterctl move (mover.go `Move` -> `getObjectGraph` -> `move`).
    let mut mover = Move::discover(&source, &target, NS).await;
    let moved = mover.moved();
    for expected in [
        "Cluster/prod",
        "Machine/m-0",
        "MachinePool/pool",
        "KubeadmConfig/m-0-kc",
        "KubeadmConfig/pool-kc",
        "Secret/prod-kubeconfig",
        "Secret/prod-ca",
    ] {
        assert!(moved.iter().any(|m| m == expected), "{expected} not moved: {moved:?}");
    }
    let groups: Vec<Vec<String>> = mover
        .sequence()
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|i| format!("{}/{}", mover.nodes[i].kind.resource.kind, mover.nodes[i].name))
                .collect()
        })
        .collect();
    mover.pause_source().await;
    let paused_at = Instant::now();
    mover.wait_ready_for_move().await;
    mover.copy(&mut |_| {}).await;
    eprintln!("[{:?}] copied, group by group: {groups:?}", started.elapsed());

    // What the target holds: the Cluster paused (copied from the paused source), the claims
    // (annotations) copied, no status (the API server drops it on create), new UIDs.
    let copied = live::get(&target, &capi::cluster("insecure")).await;
    assert_eq!(copied["spec"]["paused"], true, "created paused");
    assert_ne!(copied["metadata"]["uid"], cluster_uid.as_str());
    assert!(
        copied.get("status").is_none_or(|s| s["initialization"].is_null()),
        "{copied:#}"
    );
    let copied_machine = live::get(&target, &capi::machine("m-1", None)).await;
    assert!(
        copied_machine["status"]["nodeRef"].is_null(),
        "status is never restored"
    );
    let target_claims = claims(&target).await;
    for name in MACHINES.iter().chain(&INSTANCES[..1]) {
        assert_eq!(
            target_claims.get(*name).map(|c| c["nodeName"].clone()),
            Some(json!(name)),
            "{name}'s claim moved with it"
        );
    }
    assert!(
        !target_claims.contains_key("pool-2"),
        "the held claim was not in the copy: {target_claims:?}"
    );

    // The held PATCH lands in the source after the copy: the claim is written there, and only
    // there.
    valve.release();
    until(
        "the held claim lands in the source",
        Duration::from_secs(20),
        logs,
        async || claims(&source).await.contains_key("pool-2"),
    )
    .await;
    until(
        "the source counts the Cluster paused",
        Duration::from_secs(20),
        logs,
        async || clusters(&source_signer, "Paused") == 1.0 && in_flight() == 0.0,
    )
    .await;
    let source_decisions = || {
        metric(
            &source_signer.metrics(),
            "node_attestation_decisions_total{cluster=\"team-a/prod\"",
        )
    };
    let decided_before = source_decisions();

    // During the move (the source paused, the target's copy paused): a racing pair for pool-1
    // (two keys, one bootstrap token), pool-2's second join, m-1's renewal, and a second join
    // for m-2, which is claimed. Nobody decides them.
    plan.join(&w, "join-pool-1-a", "pool-1", KeyAlgorithm::EcdsaP256).await;
    plan.join(&w, "join-pool-1-b", "pool-1", KeyAlgorithm::EcdsaP384).await;
    plan.join(&w, "join-pool-2-b", "pool-2", KeyAlgorithm::EcdsaP384).await;
    plan.renew(&w, "renew-m-1", "m-1", &certs["m-1"]).await;
    plan.join(&w, "again-m-2", "m-2", KeyAlgorithm::EcdsaP384).await;
    let during = [
        "join-pool-1-a",
        "join-pool-1-b",
        "join-pool-2-a",
        "join-pool-2-b",
        "renew-m-1",
        "again-m-2",
    ];
    // Two of the signers' resync periods (2 s) and more.
    let quiet_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < quiet_until {
        for name in during {
            let csr = Api::<CertificateSigningRequest>::all(w.admin.clone())
                .get(name)
                .await
                .unwrap();
            assert_eq!(
                state_of(&csr),
                Final::Pending,
                "{name} decided during the move\nsource log:\n{}\ntarget log:\n{}",
                source_signer.log(),
                target_signer.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        source_decisions(),
        decided_before,
        "the source decided nothing while paused"
    );

    // `deleteGroup` in reverse order, then the target's Cluster unpaused.
    mover
        .delete_source(|args| {
            let out = source_env.kubectl(args);
            assert!(
                out.status.success(),
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        })
        .await;
    mover.unpause_target().await;
    let unpaused_at = Instant::now();
    eprintln!(
        "[{:?}] moved: the source paused {:?} before the target's unpause",
        started.elapsed(),
        unpaused_at - paused_at
    );
    // The target's Cluster API controllers rebuild status (clusterctl never restores it).
    controllers_write_status(&target, &INSTANCES[..1]).await;

    // The target decides what waited, each once: one of each racing pair signed, the other
    // refused for the claim; m-1's renewal signed; m-2's second join refused (its claim moved).
    let mut ended: BTreeMap<&str, Final> = BTreeMap::new();
    for name in during {
        ended.insert(name, wait_final(&w.admin, name, false, WAIT).await);
    }
    let took = unpaused_at.elapsed();
    for pair in [["join-pool-1-a", "join-pool-1-b"], ["join-pool-2-a", "join-pool-2-b"]] {
        let (a, b) = (&ended[pair[0]], &ended[pair[1]]);
        let signed = [a, b].iter().filter(|s| matches!(s, Final::Issued(_))).count();
        assert_eq!(
            signed,
            1,
            "{pair:?}: {a:?} / {b:?}\nsource log:\n{}\ntarget log:\n{}",
            source_signer.log(),
            target_signer.log()
        );
        let loser = if matches!(a, Final::Issued(_)) { b } else { a };
        assert_eq!(
            loser.reason(),
            Some("MachineAlreadyClaimed"),
            "{pair:?}: {loser:?}\nsource log:\n{}\ntarget log:\n{}",
            source_signer.log(),
            target_signer.log()
        );
    }
    assert!(
        matches!(ended["renew-m-1"], Final::Issued(_)),
        "{:?}",
        ended["renew-m-1"]
    );
    assert_eq!(
        ended["again-m-2"].reason(),
        Some("MachineAlreadyClaimed"),
        "the claim moved with m-2: {:?}",
        ended["again-m-2"]
    );

    // After the move: m-3's node renews through the target.
    plan.renew(&w, "renew-m-3", "m-3", &certs["m-3"]).await;
    let renewed = issued(
        wait_final(&w.admin, "renew-m-3", false, WAIT).await,
        "m-3's renewal after the move",
        &target_signer.log(),
    );
    assert_eq!(subject_node(&renewed), "m-3");

    // Every CSR ended, each decided once, by one signer: the source before the pause, the
    // target after its unpause. A decision's log line trails
    // its write to the CSR by a request or two: waited for.
    let all: Vec<CertificateSigningRequest> = Api::<CertificateSigningRequest>::all(w.admin.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), plan.0.len(), "every CSR is the test's");
    until("every decision logged", Duration::from_secs(20), logs, async || {
        let (source_log, target_log) = (source_signer.log(), target_signer.log());
        all.iter().all(|csr| {
            let name = csr.metadata.name.clone().unwrap();
            decisions_of(&source_log, &name) + decisions_of(&target_log, &name) > 0
        })
    })
    .await;
    let source_log = source_signer.log();
    let target_log = target_signer.log();
    let mut by_source = Vec::new();
    for csr in &all {
        let name = csr.metadata.name.clone().unwrap();
        assert_ne!(state_of(csr), Final::Pending, "{name} left pending");
        let (s, t) = (decisions_of(&source_log, &name), decisions_of(&target_log, &name));
        assert_eq!(s + t, 1, "{name} decided {s} times by the source and {t} by the target");
        if s == 1 {
            by_source.push(name);
        }
    }
    by_source.sort();
    let mut before: Vec<String> = MACHINES
        .iter()
        .chain(&INSTANCES[..1])
        .map(|n| format!("join-{n}"))
        .chain(["renew-m-0".to_owned()])
        .collect();
    before.sort();
    assert_eq!(
        by_source, before,
        "the source decided exactly the CSRs filed before the move"
    );

    // One certificate per Machine and instance (renewals by the node itself apart), its
    // subject the Machine's node, and the target's claim naming that CSR.
    let target_claims = claims(&target).await;
    let mut joins: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut renewals = 0;
    for csr in &all {
        let name = csr.metadata.name.clone().unwrap();
        let Final::Issued(pem) = state_of(csr) else {
            continue;
        };
        let (machine, renewal) = plan.0[&name].clone();
        assert_eq!(subject_node(&pem), machine, "{name}");
        if renewal {
            assert_eq!(
                csr.spec.username.as_deref(),
                Some(format!("system:node:{machine}").as_str())
            );
            renewals += 1;
            continue;
        }
        let claim = &target_claims[&machine];
        assert_eq!(
            claim["csrUID"].as_str(),
            csr.metadata.uid.as_deref(),
            "{machine}'s claim"
        );
        joins.entry(machine).or_default().push(name);
    }
    let expected: BTreeSet<&str> = MACHINES.iter().chain(&INSTANCES).copied().collect();
    assert_eq!(
        joins.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        expected,
        "{joins:?}"
    );
    for (machine, csrs) in &joins {
        assert_eq!(csrs.len(), 1, "{machine} got certificates from {csrs:?}");
    }
    assert_eq!(renewals, 3);

    // Each certificate's record is its Approved condition (SPEC section 3, revision 5), naming
    // the Machine and the replica of the signer that approved it; no Event is written for a
    // certificate in either management cluster.
    for csr in &all {
        if !matches!(state_of(csr), Final::Issued(_)) {
            continue;
        }
        let name = csr.metadata.name.clone().unwrap();
        let approved = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Approved"))
            .unwrap();
        assert_eq!(approved.reason.as_deref(), Some("AttestedInsecureV1"), "{name}");
        let message = approved.message.clone().unwrap_or_default();
        let expected = if by_source.contains(&name) {
            "approved by replica source_"
        } else {
            "approved by replica target_"
        };
        assert!(message.contains(expected), "{name}'s record: {message}");
        assert!(
            message.contains(&format!("; Machine {NS}/")) || message.contains(&format!("; MachinePool {NS}/")),
            "{name}'s record: {message}"
        );
    }
    for management in [&source, &target] {
        let reasons = event_reasons(management).await;
        assert!(
            !reasons.iter().any(|r| r == "CertificateIssued"),
            "no Event per certificate: {reasons:?}"
        );
    }
    for log in [&source_log, &target_log] {
        // kube-apiserver v1.30.0 and v1.33.3 (not the v1.32 build here) serve a read "not older
        // than" a resourceVersion from the watch cache only once it has caught up, which with no
        // change of that resource takes etcd's progress notifications; Debian's etcd 3.4.23 here
        // gives none, and the read answers ResourceVersionTooLarge after 3 s. The signer then
        // reads from etcd, as designed; the suite says so instead of failing on the etcd it was
        // given.
        let fell_back = log.contains("joins read their Cluster from etcd");
        if fell_back && log.contains("Too large resource version") {
            eprintln!(
                "note: kube-apiserver 1.{} could not serve the Cluster read from its watch cache (no etcd progress notifications): the signer read from etcd",
                tests::envtest::kubernetes_minor()
            );
            continue;
        }
        assert!(
            !fell_back,
            "a join's Cluster re-read comes from the watch cache, not older than its claim: {log}"
        );
    }
    assert!(source_log.contains("Cluster paused"));
    let held_join_refused = source_log
        .lines()
        .any(|l| l.contains("csr=join-pool-2-a") && l.contains("not approved") && l.contains("is paused"));
    eprintln!(
        "move: {} CSRs ({} before the move, {} during, 1 after); {} Machines and instances with one \
         certificate each, {renewals} renewals; the target decided what waited within {took:?} of its unpause; \
         the held join's late claim seen paused by the source itself: {held_join_refused} (else its task was \
         stopped with the worker); whole test {:?}",
        all.len(),
        before.len(),
        during.len(),
        joins.len(),
        started.elapsed()
    );
}
