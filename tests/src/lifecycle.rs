//! Cluster API's lifecycle, played by the suites where its controllers cannot run (they are Go,
//! and this workspace builds none): each function does exactly the writes the named controller
//! function of kubernetes-sigs/cluster-api v1.13.5 does, in its order, and no more (v1.14 moved
//! the same functions from `internal/controllers/` to `core/reconcilers/`, and KCP's from
//! `controlplane/kubeadm/internal/controllers/` to `controlplane/kubeadm/reconcilers/`). What
//! the signer cannot see (infrastructure objects, etcd members, pod evictions) is left out and
//! said so where it happens.
//!
//! [`PluginNode`] is the node: the real plugin (`kubelet-authenticator`) run by `kubectl` from a
//! kubelet kubeconfig whose user is the plugin, as client-go runs it for kubelet
//! (`provideClusterInfo`), so each call is one exec-plugin call, and a certificate made due for
//! rotation ([`crate::ca::make_due_for_rotation`]) is renewed on the next one as kubelet would
//! see it renewed from half of its life, without waiting for it.

use std::path::{Path, PathBuf};
use std::process::Output;

use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::envtest::Envtest;

/// `clusterv1.MachineFinalizer`: set by the Machine controller (`Reconcile`,
/// `finalizers.EnsureFinalizer`) and by MachineSet's `computeDesiredMachine` at creation.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// `clusterv1.PreTerminateDeleteHookAnnotationPrefix`: the Machine controller's
/// `reconcileDelete` waits while an annotation with this prefix is on the Machine.
pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io";
/// `controlplanev1.PreTerminateHookCleanupAnnotation`: KCP puts it on every control-plane
/// Machine (`desiredstate.ComputeDesiredMachine`) and removes it once the Machine's etcd member
/// is gone (`reconcilePreTerminateHook`).
pub const KCP_CLEANUP_HOOK: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// Machines (v1beta2) of `namespace` in the management cluster.
pub fn machines(management: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        management.clone(),
        namespace,
        &resource("cluster.x-k8s.io", "v1beta2", "Machine"),
    )
}

/// MachinePools (v1beta2) of `namespace` in the management cluster.
pub fn machine_pools(management: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        management.clone(),
        namespace,
        &resource("cluster.x-k8s.io", "v1beta2", "MachinePool"),
    )
}

fn kubeadm_configs(management: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        management.clone(),
        namespace,
        &resource("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig"),
    )
}

fn nodes(workload: &Client) -> Api<DynamicObject> {
    Api::all_with(workload.clone(), &resource("", "v1", "Node"))
}

fn json_of(object: DynamicObject) -> Value {
    serde_json::to_value(object).expect("JSON")
}

/// Machine `name`, or `None` once it is gone.
pub async fn machine(management: &Client, namespace: &str, name: &str) -> Option<Value> {
    machines(management, namespace)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get Machine {name}: {e}"))
        .map(json_of)
}

/// The claim annotation of Machine `name` (`cluster.x-k8s.io/kubelet-claim`), parsed.
pub async fn machine_claim(management: &Client, namespace: &str, name: &str) -> Option<Value> {
    let machine = machine(management, namespace, name).await?;
    machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM]
        .as_str()
        .map(|text| serde_json::from_str(text).expect("the claim is JSON"))
}

/// The claims annotation of MachinePool `name` (`cluster.x-k8s.io/kubelet-claims`), parsed
/// (an empty object when it has none).
pub async fn pool_claims(management: &Client, namespace: &str, name: &str) -> Value {
    let pool = json_of(
        machine_pools(management, namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get MachinePool {name}: {e}")),
    );
    pool["metadata"]["annotations"][attestation::names::ANNOTATION_POOL_CLAIMS]
        .as_str()
        .map_or(json!({}), |text| {
            serde_json::from_str(text).expect("the claims are JSON")
        })
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}

async fn merge_status(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch the status of {name}: {e}"));
}

/// The Machine controller's `reconcileNode` (`machine_controller_noderef.go`) once the Node
/// carrying the Machine's `spec.providerID` exists (`getNode`): `status.nodeRef` set to it, and
/// `patchNode`'s annotations on the Node (cluster name and namespace, Machine, owner kind and
/// name). Panics when no Node carries the provider ID: the controller would wait.
pub async fn set_node_ref(management: &Client, workload: &Client, namespace: &str, name: &str) -> String {
    let machine = machine(management, namespace, name)
        .await
        .unwrap_or_else(|| panic!("Machine {name} is gone"));
    let provider_id = machine["spec"]["providerID"]
        .as_str()
        .expect("a provider ID")
        .to_owned();
    let node = nodes(workload)
        .list(&Default::default())
        .await
        .expect("list Nodes")
        .items
        .into_iter()
        .map(json_of)
        .find(|n| n["spec"]["providerID"] == json!(provider_id))
        .unwrap_or_else(|| panic!("no Node carries {provider_id}: reconcileNode waits"));
    let node_name = node["metadata"]["name"].as_str().expect("a name").to_owned();
    merge_status(
        &machines(management, namespace),
        name,
        json!({"status": {"nodeRef": {"name": node_name}}}),
    )
    .await;
    let owner = machine["metadata"]["ownerReferences"]
        .as_array()
        .and_then(|o| o.iter().find(|r| r["controller"] == json!(true)))
        .cloned()
        .unwrap_or(Value::Null);
    let mut annotations = json!({
        "cluster.x-k8s.io/cluster-name": machine["spec"]["clusterName"],
        "cluster.x-k8s.io/cluster-namespace": namespace,
        "cluster.x-k8s.io/machine": name,
    });
    if owner.is_object() {
        annotations["cluster.x-k8s.io/owner-kind"] = owner["kind"].clone();
        annotations["cluster.x-k8s.io/owner-name"] = owner["name"].clone();
    }
    merge(
        &nodes(workload),
        &node_name,
        json!({"metadata": {"annotations": annotations}}),
    )
    .await;
    node_name
}

/// The owner's `Delete` of a Machine (MachineSet's `deleteMachines` on a scale-down and
/// `reconcileUnhealthyMachines` on a remediation, KCP's `scaleDownControlPlane`, or an
/// operator's `kubectl delete`): `metadata.deletionTimestamp` is set, and the Machine stays,
/// held by [`MACHINE_FINALIZER`], until [`finish_deletion`].
pub async fn begin_deletion(management: &Client, namespace: &str, name: &str) {
    machines(management, namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete Machine {name}: {e}"));
    let machine = machine(management, namespace, name)
        .await
        .unwrap_or_else(|| panic!("Machine {name} went at once: it carries no finalizer"));
    assert!(machine["metadata"]["deletionTimestamp"].is_string(), "{machine}");
}

/// The Machine controller's `reconcileDelete` (`machine_controller.go`) of a Machine whose
/// deletion began, in its order:
///
/// 1. `isDeleteNodeAllowed`: the Node is deleted only when `status.nodeRef` is set and an
///    active (not deleting) control-plane Machine of the Cluster remains;
/// 2. `drainNode`: the Node cordoned (`spec.unschedulable`); no Pod runs here to evict, and no
///    volume to wait for (`shouldWaitForNodeVolumes`);
/// 3. pre-terminate hooks: none may be left (KCP removes its own first, [`remove_annotation`]);
///    panics otherwise, where the controller would wait;
/// 4. `reconcileDeleteInfrastructure`: the infrastructure Machine (not modelled here: the
///    instance is gone from here on);
/// 5. `reconcileDeleteBootstrap`: the KubeadmConfig `spec.bootstrap.configRef` names;
/// 6. `deleteNode`, when allowed;
/// 7. the finalizer removed: the Machine, and the claim it carries, are gone.
pub async fn finish_deletion(management: &Client, workload: &Client, namespace: &str, name: &str) {
    let api = machines(management, namespace);
    let machine = machine(management, namespace, name)
        .await
        .unwrap_or_else(|| panic!("Machine {name} is gone already"));
    assert!(
        machine["metadata"]["deletionTimestamp"].is_string(),
        "Machine {name}'s deletion has not begun"
    );
    let node = machine["status"]["nodeRef"]["name"].as_str().map(str::to_owned);
    let cluster = machine["spec"]["clusterName"].as_str().unwrap_or_default().to_owned();
    let control_planes = api
        .list(&kube::api::ListParams::default().labels(&format!(
            "cluster.x-k8s.io/cluster-name={cluster},cluster.x-k8s.io/control-plane"
        )))
        .await
        .expect("list control-plane Machines")
        .items
        .into_iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .count();
    let delete_node_allowed = node.is_some() && control_planes > 0;
    if let (true, Some(node)) = (delete_node_allowed, &node) {
        merge(&nodes(workload), node, json!({"spec": {"unschedulable": true}})).await;
    }
    let hooks: Vec<&String> = machine["metadata"]["annotations"]
        .as_object()
        .map(|a| a.keys().filter(|k| k.starts_with(PRE_TERMINATE_HOOK_PREFIX)).collect())
        .unwrap_or_default();
    assert!(
        hooks.is_empty(),
        "Machine {name} waits for its pre-terminate hooks {hooks:?}"
    );
    if let Some(config) = machine["spec"]["bootstrap"]["configRef"]["name"].as_str() {
        let _ = kubeadm_configs(management, namespace)
            .delete(config, &DeleteParams::default())
            .await;
    }
    if let (true, Some(node)) = (delete_node_allowed, &node) {
        let _ = nodes(workload).delete(node, &DeleteParams::default()).await;
    }
    merge(&api, name, json!({"metadata": {"finalizers": null}})).await;
    assert!(
        self::machine(management, namespace, name).await.is_none(),
        "Machine {name} is still there without its finalizer"
    );
}

/// Removes annotation `key` from Machine `name` (KCP's `removePreTerminateHookAnnotationFromMachine`,
/// called by `reconcilePreTerminateHook` once the Machine's etcd member is removed).
pub async fn remove_annotation(management: &Client, namespace: &str, name: &str, key: &str) {
    merge(
        &machines(management, namespace),
        name,
        json!({"metadata": {"annotations": {key: null}}}),
    )
    .await;
}

/// Sets Machine conditions (`metav1.Condition`s of v1beta2 `status.conditions`), replacing
/// those of the same type: `(type, status, reason, message)`.
pub async fn set_conditions(management: &Client, namespace: &str, name: &str, conditions: &[(&str, &str, &str, &str)]) {
    let machine = machine(management, namespace, name)
        .await
        .unwrap_or_else(|| panic!("Machine {name} is gone"));
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("whole seconds")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    let mut all: Vec<Value> = machine["status"]["conditions"].as_array().cloned().unwrap_or_default();
    for (kind, status, reason, message) in conditions {
        all.retain(|c| c["type"] != json!(kind));
        all.push(
            json!({"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}),
        );
    }
    merge_status(
        &machines(management, namespace),
        name,
        json!({"status": {"conditions": all}}),
    )
    .await;
}

/// A MachinePool's instances changing (a scale-down or scale-up by its infrastructure
/// provider), as the MachinePool controller follows them:
///
/// - `reconcileInfrastructure` (`machinepool_controller_phases.go`) copies the infrastructure
///   pool's `spec.providerIDList` to the MachinePool's, and `status.replicas`;
/// - `reconcileNodeRefs` (`machinepool_controller_noderef.go`): `deleteRetiredNodes` deletes the
///   Nodes of `status.nodeRefs` whose provider ID is no longer listed ("a MachinePool
///   infrastructure provider indicates an instance in the set has been deleted by removing its
///   ProviderID from the slice"), then `getNodeReferences` sets `status.nodeRefs` to the Nodes
///   carrying a listed provider ID.
///
/// Returns the Nodes deleted.
pub async fn pool_instances(
    management: &Client,
    workload: &Client,
    namespace: &str,
    pool: &str,
    provider_ids: &[&str],
) -> Vec<String> {
    let pools = machine_pools(management, namespace);
    merge(
        &pools,
        pool,
        json!({"spec": {"providerIDList": provider_ids, "replicas": provider_ids.len()}}),
    )
    .await;
    merge_status(&pools, pool, json!({"status": {"replicas": provider_ids.len()}})).await;
    let current = json_of(pools.get(pool).await.expect("the MachinePool"));
    let node_api = nodes(workload);
    let mut deleted = Vec::new();
    for node_ref in current["status"]["nodeRefs"].as_array().cloned().unwrap_or_default() {
        let Some(name) = node_ref["name"].as_str() else {
            continue;
        };
        let Some(node) = node_api.get_opt(name).await.expect("get Node").map(json_of) else {
            continue;
        };
        let listed = node["spec"]["providerID"]
            .as_str()
            .is_none_or(|p| p.is_empty() || provider_ids.contains(&p));
        if !listed {
            let _ = node_api.delete(name, &DeleteParams::default()).await;
            deleted.push(name.to_owned());
        }
    }
    let refs: Vec<Value> = node_api
        .list(&Default::default())
        .await
        .expect("list Nodes")
        .items
        .into_iter()
        .map(json_of)
        .filter(|n| {
            n["spec"]["providerID"]
                .as_str()
                .is_some_and(|p| provider_ids.contains(&p))
        })
        .map(
            |n| json!({"apiVersion": "v1", "kind": "Node", "name": n["metadata"]["name"], "uid": n["metadata"]["uid"]}),
        )
        .collect();
    merge_status(&pools, pool, json!({"status": {"nodeRefs": refs}})).await;
    deleted
}

/// A node whose kubelet authenticates through the plugin: its cert dir, its kubelet
/// kubeconfig (the plugin's `kubeconfig` command's), and, for a joining node, the bootstrap
/// kubeconfig of its join token.
pub struct PluginNode {
    plugin: PathBuf,
    dir: tempfile::TempDir,
    kubectl: PathBuf,
    /// Node name.
    pub name: String,
    /// Its Machine's (or pool instance's) provider ID.
    pub provider_id: String,
    /// The kubelet kubeconfig whose user is the plugin.
    pub kubeconfig: PathBuf,
    bootstrap: PathBuf,
}

impl PluginNode {
    /// A node about to join with join token `token` (`<id>.<secret>`, which must exist):
    /// nothing in its cert dir yet.
    pub fn joining(plugin: &Path, env: &Envtest, name: &str, provider_id: &str, token: &str) -> Self {
        let bootstrap = env.bootstrap_kubeconfig(token);
        let node = Self::new(plugin, name, provider_id, bootstrap);
        let out = node.plugin_command(&["kubeconfig", "--server", &env.server, "--ca-file"], |c| {
            c.arg(&env.client_ca.cert_path)
                .args(["--command"])
                .arg(&node.plugin)
                .args(["--output"])
                .arg(&node.kubeconfig);
        });
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        node
    }

    /// The first control-plane node as `kubeadm init` leaves it: a `kubelet.conf` holding
    /// kubeadm's client certificate for the node (`cert_pem`, `key_pem`), no bootstrap
    /// kubeconfig; then the plugin installed as the image role's `ExecStartPre` does it
    /// (`kubeconfig --adopt`): the certificate becomes the plugin's current credential, the
    /// plugin's kubeconfig replaces `kubelet.conf`.
    pub fn adopting(
        plugin: &Path,
        env: &Envtest,
        name: &str,
        provider_id: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Self {
        let kubeadm = env.kubeconfig_for_certificate(&format!("{name}-kubeadm"), cert_pem, key_pem);
        let node = Self::new(
            plugin,
            name,
            provider_id,
            PathBuf::from("/nonexistent/bootstrap-kubelet.conf"),
        );
        std::fs::copy(&kubeadm, &node.kubeconfig).expect("kubeadm's kubelet.conf");
        let out = node.plugin_command(&["kubeconfig", "--command"], |c| {
            c.arg(&node.plugin)
                .args(["--output"])
                .arg(&node.kubeconfig)
                .arg("--adopt");
        });
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.contains("adopted"), "{said}");
        node
    }

    fn new(plugin: &Path, name: &str, provider_id: &str, bootstrap: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir_all(dir.path().join("pki")).expect("cert dir");
        let kubeconfig = dir.path().join("kubelet.conf");
        Self {
            plugin: plugin.to_owned(),
            kubectl: crate::envtest::assets("the plugin's node").join("kubectl"),
            name: name.to_owned(),
            provider_id: provider_id.to_owned(),
            kubeconfig,
            bootstrap,
            dir,
        }
    }

    /// Its cert dir.
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// The plugin's flags for this node (also exec mode's: the kubeconfig names them).
    pub fn flags(&self) -> Vec<String> {
        self.flags_waiting("60s")
    }

    /// [`PluginNode::flags`] waiting `timeout` for a certificate (`--timeout`).
    fn flags_waiting(&self, timeout: &str) -> Vec<String> {
        vec![
            "--bootstrap-kubeconfig".into(),
            self.bootstrap.display().to_string(),
            "--cert-dir".into(),
            self.cert_dir().display().to_string(),
            "--node-name".into(),
            self.name.clone(),
            "--provider-id".into(),
            self.provider_id.clone(),
            "--attestor".into(),
            "insecure".into(),
            "--timeout".into(),
            timeout.into(),
        ]
    }

    /// Exec mode run directly (no `KUBERNETES_EXEC_INFO`: the apiserver from the bootstrap
    /// kubeconfig), waiting at most `timeout` for a certificate.
    pub fn exec_waiting(&self, timeout: &str) -> Output {
        std::process::Command::new(&self.plugin)
            .args(self.flags_waiting(timeout))
            .env_remove("KUBERNETES_EXEC_INFO")
            .output()
            .expect("run the plugin")
    }

    fn plugin_command(&self, args: &[&str], more: impl FnOnce(&mut std::process::Command)) -> Output {
        let mut command = std::process::Command::new(&self.plugin);
        command.args(self.flags()).args(args).env_remove("KUBERNETES_EXEC_INFO");
        more(&mut command);
        command.output().expect("run the plugin")
    }

    /// kubectl as the node's kubelet: client-go runs the plugin for the credential.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// One call through the plugin (`kubectl auth whoami`): the user the apiserver saw, and
    /// what the plugin said on stderr (a refusal while the old certificate still serves).
    pub fn call(&self) -> (String, String) {
        let out = self.kubectl(&["auth", "whoami", "-o", "json"], None);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kubectl auth whoami as {}: {stderr}", self.name);
        let who: Value = serde_json::from_slice(&out.stdout).expect("whoami JSON");
        (
            who["status"]["userInfo"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            stderr,
        )
    }

    /// The certificate (PEM) and key the node holds now (`kubelet-client-current.pem`): after a
    /// join or a renewal, the one the signer issued.
    pub fn identity(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.cert_dir().join("kubelet-client-current.pem"))
            .expect("the current certificate");
        let blocks = pem::parse_many(text.as_bytes()).expect("PEM");
        let find = |tag: &str| {
            blocks
                .iter()
                .find(|b| b.tag().contains(tag))
                .map(pem::encode)
                .unwrap_or_else(|| panic!("no {tag} in {}'s current certificate file", self.name))
        };
        (find("CERTIFICATE"), find("PRIVATE KEY"))
    }

    /// Registers its Node as kubelet does, with its own identity, carrying its provider ID.
    pub fn register(&self) {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name}},
            "spec": {"providerID": self.provider_id}});
        let out = self.kubectl(&["create", "-f", "-"], Some(&node.to_string()));
        assert!(
            out.status.success(),
            "{} registers its Node: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Its current certificate made due for rotation (same key, 10 minutes left): the next
    /// call renews, as kubelet's would from half of the certificate's life.
    pub fn due_for_rotation(&self, env: &Envtest) {
        crate::ca::make_due_for_rotation(&env.client_ca, &self.cert_dir(), &self.name, &self.provider_id);
    }

    /// The plugin's back-off after a refusal (`kubelet-authenticator-backoff` in the cert dir)
    /// over: its `retryAt` moved to now, as if the 30 seconds had passed.
    pub fn backoff_over(&self) {
        let path = self.cert_dir().join("kubelet-authenticator-backoff");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let mut record: Value = serde_json::from_str(&text).expect("the back-off record");
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .expect("whole seconds")
            .format(&time::format_description::well_known::Rfc3339)
            .expect("RFC 3339");
        record["retryAt"] = json!(now);
        std::fs::write(&path, record.to_string()).expect("write the back-off record");
    }
}
