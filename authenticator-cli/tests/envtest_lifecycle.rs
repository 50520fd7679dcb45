//! Cluster API's lifecycle, end to end (SPEC revision 5, section 7; rules 7, 9, 11): Machines
//! created, remediated, scaled and rolled out while their nodes renew through the real signer,
//! on a real kube-apiserver (`KUBEBUILDER_ASSETS`; skipped loudly without), one apiserver
//! playing management and workload cluster, the signer under `config/rbac/` and its own
//! workload role.
//!
//! Cluster API's controllers cannot run here (they are Go): [`tests::lifecycle`] plays each step
//! as kubernetes-sigs/cluster-api v1.13.5 does it, and each step below names the function it
//! plays. The nodes are the real plugin, run by `kubectl` from a kubelet kubeconfig whose user
//! is the plugin, as client-go runs it for kubelet ([`PluginNode`]); a renewal is one call after
//! the node's certificate was made due for rotation. No kubelet runs: one kubelet per host (the
//! kubelet suites take a host-wide lock and one node address), and a kubelet renews only once a
//! certificate reaches 50-55% of its life (minutes, as `envtest_kubelet` shows), where this suite
//! renews each of its seven nodes several times in well under a minute. What a kubelet adds (it
//! runs the same plugin the same way) is covered by `envtest_kubelet` and `envtest_kubeadm`.
//!
//! 0. The first control-plane Machine (KCP's `initializeControlPlane`) and its node, which
//!    `kubeadm init` gave kubeadm's own certificate: the plugin installed
//!    (`kubeconfig --adopt`), the node registered, the Machine controller's `reconcileNode` sets
//!    `status.nodeRef`, the plugin's first request is an adoption, and the node renews.
//! 1. A Machine deleted while its node still renews (a MachineDeployment scaled down: MachineSet
//!    `deleteMachines`; the Machine controller's `reconcileDelete`): while the deletion runs
//!    (drain, hooks) the renewal is `MachineNotReady` "being deleted"; once the Machine is gone,
//!    with its claim, `MachineNotFound` saying the Machine was deleted.
//! 2. MachineHealthCheck remediation: the Node goes `Ready=Unknown`, MHC's
//!    `patchUnhealthyTargets` marks the Machine, MachineSet's `reconcileUnhealthyMachines` deletes
//!    it and `createMachines` makes a replacement with a new name (no provider ID yet). The old
//!    node's renewal is refused at once, while the replacement still has no provider ID (a
//!    node's renewal never waits on that gap); the replacement joins with its own join token as
//!    a new Machine, new name, new claim, and renews.
//! 3. A MachinePool scaled down and up (`reconcileInfrastructure` copies `providerIDList`,
//!    `reconcileNodeRefs`/`deleteRetiredNodes` deletes the removed instance's Node): the removed
//!    instance's renewal is refused, naming the pool and the claim that ended; its record stays
//!    in `cluster.x-k8s.io/kubelet-claims`, inert, until the pool's next claim write prunes it: a
//!    new instance's join, which claims its own.
//! 4. A KCP rollout (`rollingUpdate`: `scaleUpControlPlane` while there are fewer Machines than
//!    replicas + maxSurge, then `scaleDownControlPlane` of the outdated Machine): the new
//!    control-plane Machine joins first; both nodes renew while both Machines exist; the old
//!    Machine is deleted (KCP's pre-terminate hook held until `reconcilePreTerminateHook`
//!    removes it): its renewal is refused, the new node's keeps working.
//!
//! Every CSR the suite files ends (none left pending) and every refusal names the deletion.
//!
//! Taking an identity back (SPEC section 7, revision 6): in each of the four, the certificate the
//! signer issued to the old node keeps writing while its Machine drains, and is refused every
//! write (Lease, Node, Node status) within 10 s of Cluster API being done with the node: the
//! Machine gone (1, 2), the instance out of `providerIDList` (3), KCP's Machine at
//! `WaitingForPreTerminateHook` (4). Before 1.32 (no credential ID) the revoked node name refuses
//! the old node's renewal before it is filed, whatever certificate it is made with.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use serde_json::json;
use tests::capi;
use tests::envtest::Envtest;
use tests::lifecycle::{
    self, KCP_CLEANUP_HOOK, MACHINE_FINALIZER, PluginNode, begin_deletion, finish_deletion, machine_claim, pool_claims,
    pool_instances, set_conditions, set_node_ref,
};
use tests::live::{self, Final, Signer, Workload, apply, state_of};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
const NS: &str = capi::NAMESPACE;
const KCP: &str = "prod-cp";
const MACHINE_SET: &str = "md-0-5d8f7";
const POOL: &str = "mp-0";

fn pid(name: &str) -> String {
    format!("aws:///us-east-1a/i-{name}")
}

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// The workload cluster, its signer and every CSR name seen so far.
struct Life {
    w: Workload,
    signer: Signer,
    seen: HashSet<String>,
}

impl Life {
    fn plugin() -> &'static Path {
        Path::new(PLUGIN)
    }

    /// A join token `<id>.0123456789abcdef` in kube-system, as the bootstrap provider creates one
    /// for each KubeadmConfig.
    async fn token(&self, id: &str) -> String {
        live::add_bootstrap_token(&self.w.admin, id, "0123456789abcdef").await;
        format!("{id}.0123456789abcdef")
    }

    /// The CSRs for `node` filed since the last look, oldest first.
    async fn new_csrs(&mut self, node: &str) -> Vec<CertificateSigningRequest> {
        let api: Api<CertificateSigningRequest> = Api::all(self.w.admin.clone());
        let mut fresh: Vec<CertificateSigningRequest> = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| {
                attestation::requested_node_name(&c.spec.request.0).map(|n| n.as_str().to_owned())
                    == Some(node.to_owned())
            })
            .filter(|c| !self.seen.contains(c.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        fresh.sort_by_key(|c| c.metadata.creation_timestamp.clone().map(|t| t.0));
        for c in &fresh {
            self.seen.insert(c.metadata.name.clone().unwrap_or_default());
        }
        fresh
    }

    /// One call through the node's plugin; the one CSR it filed, its requester and its end.
    async fn one_csr(&mut self, node: &PluginNode, what: &str) -> (String, Final, String) {
        let (user, stderr) = node.call();
        assert_eq!(user, format!("system:node:{}", node.name), "{what}: {stderr}");
        let filed = self.new_csrs(&node.name).await;
        assert_eq!(
            filed.len(),
            1,
            "{what}: one CSR, got {:?}\n{stderr}\n{}",
            filed.iter().map(|c| c.metadata.name.clone()).collect::<Vec<_>>(),
            self.signer.log()
        );
        (
            filed[0].spec.username.clone().unwrap_or_default(),
            state_of(&filed[0]),
            stderr,
        )
    }

    /// The node's first request, with its join token: issued, and its claim written.
    async fn join(&mut self, node: &PluginNode) {
        let (requester, state, stderr) = self.one_csr(node, &format!("{} joins", node.name)).await;
        assert!(
            requester.starts_with("system:bootstrap:"),
            "{} joins with its join token: {requester}",
            node.name
        );
        assert!(
            matches!(state, Final::Issued(_)),
            "{} joins: {state:?}\n{stderr}\n{}",
            node.name,
            self.signer.log()
        );
    }

    /// A renewal by the node itself (`system:node:<name>`), and how it ended.
    async fn renew(&mut self, node: &PluginNode) -> (Final, String) {
        node.due_for_rotation(&self.w.env);
        node.backoff_over();
        let (requester, state, stderr) = self.one_csr(node, &format!("{} renews", node.name)).await;
        assert_eq!(requester, format!("system:node:{}", node.name), "renewed as the node");
        (state, stderr)
    }

    /// A renewal that must be signed.
    async fn renews(&mut self, node: &PluginNode, when: &str) {
        let (state, stderr) = self.renew(node).await;
        assert!(
            matches!(state, Final::Issued(_)),
            "{} renews {when}: {state:?}\n{stderr}\n{}",
            node.name,
            self.signer.log()
        );
    }

    /// A renewal that must be refused with `reason`, its message containing `says`; the plugin
    /// says so on stderr and answers with the certificate it still holds.
    async fn refused(&mut self, node: &PluginNode, reason: &str, says: &str, when: &str) -> String {
        let (state, stderr) = self.renew(node).await;
        match state {
            Final::Denied(r, message) => {
                assert_eq!(r, reason, "{} renews {when}: {message}", node.name);
                assert!(message.contains(says), "{} renews {when}: {message}", node.name);
                assert!(stderr.contains(reason), "the plugin says why ({when}): {stderr}");
                eprintln!("{} renews {when}: {reason}: {message}", node.name);
                message
            }
            other => panic!(
                "{} renews {when}: expected {reason}, got {other:?}\n{}",
                node.name,
                self.signer.log()
            ),
        }
    }

    /// Revocation (SPEC section 7, "Taking an identity back"): `identity`, a certificate the
    /// signer issued to `node`, can no longer write (its Lease, its Node, its Node's status)
    /// within 10 s; how long it took.
    async fn revoked(&self, identity: &(String, String), node: &str, when: &str) -> std::time::Duration {
        let client = self
            .w
            .node_client(&format!("{node}-revoked"), &identity.0, &identity.1)
            .await;
        let had_node = tests::kubelet::node(&self.w.admin, node).await.is_some();
        let took =
            tests::revocation::refused_within(&client, node, std::time::Duration::from_secs(10), &self.signer).await;
        // The probe's own writes before the refusal (within the window the SPEC allows) may have
        // re-created the Node Cluster API deleted: gone again, as the suite left it.
        if !had_node {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.w.admin.clone());
            let _ = nodes.delete(node, &Default::default()).await;
        }
        eprintln!("{node}'s certificate refused {when}, {took:?} after the trigger");
        took
    }

    /// A renewal once the node's identity is revoked. The suite's renewal is filed with a
    /// certificate the suite made due for rotation (`make_due_for_rotation`: the test CA, not
    /// the signer, so not in the signer's record). From 1.32 (credential IDs) only the signer's
    /// certificates are refused, so the renewal is filed and denied `reason`; before 1.32 the
    /// revoked node name refuses every certificate of that name, the renewal's CSR included.
    async fn refused_once_revoked(&mut self, node: &PluginNode, reason: &str, says: &str, when: &str) {
        if tests::envtest::kubernetes_minor() >= 32 {
            self.refused(node, reason, says, when).await;
            return;
        }
        node.due_for_rotation(&self.w.env);
        node.backoff_over();
        let (_, stderr) = node.call();
        assert!(
            stderr.contains(tests::revocation::REFUSAL),
            "{} renews {when}: the CSR's creation is refused by the revoked node name: {stderr}",
            node.name
        );
        assert!(self.new_csrs(&node.name).await.is_empty(), "no CSR filed");
    }

    /// A Machine of the Cluster as its owner creates it: owned (controller reference),
    /// labeled, with the Machine controller's finalizer, its KubeadmConfig (named after it, as
    /// MachineSet's `createMachines` and KCP's `cloneConfigsAndGenerateMachine` name it) naming
    /// join token `token_id` (none: an init configuration).
    async fn machine(
        &self,
        name: &str,
        provider_id: Option<&str>,
        owner: (&str, &str, &str),
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        token_id: Option<&str>,
    ) {
        let config = match token_id {
            Some(id) => capi::kubeadm_config(name, id, "v1beta2"),
            None => json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
                           "metadata": {"name": name, "namespace": NS},
                           "spec": {"initConfiguration": {"nodeRegistration": {"name": name}}}}),
        };
        apply(&self.w.admin, &self.w.own(config)).await;
        let mut machine = self.w.own(capi::machine(name, provider_id));
        let (api_version, kind, owner_name) = owner;
        machine["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind, "name": owner_name,
            "uid": format!("00000000-0000-4000-8000-{:012x}", owner_name.len()), "controller": true, "blockOwnerDeletion": true}]);
        machine["metadata"]["finalizers"] = json!([MACHINE_FINALIZER]);
        for (key, value) in labels {
            machine["metadata"]["labels"][*key] = json!(value);
        }
        for (key, value) in annotations {
            capi::annotate(&mut machine, key, value);
        }
        machine["spec"]["bootstrap"]["configRef"]["name"] = json!(name);
        if provider_id.is_none() {
            // Created, not provisioned yet: no bootstrap data, no instance.
            machine["status"] =
                json!({"initialization": {"bootstrapDataSecretCreated": false, "infrastructureProvisioned": false}});
        }
        apply(&self.w.admin, &machine).await;
    }

    /// A control-plane Machine of the KubeadmControlPlane (`desiredstate.ComputeDesiredMachine`:
    /// its labels and KCP's pre-terminate hook).
    async fn control_plane_machine(&self, name: &str, token_id: Option<&str>) {
        self.machine(
            name,
            Some(&pid(name)),
            ("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", KCP),
            &[
                ("cluster.x-k8s.io/control-plane", ""),
                ("cluster.x-k8s.io/control-plane-name", KCP),
            ],
            &[(KCP_CLEANUP_HOOK, "")],
            token_id,
        )
        .await;
    }

    /// A worker Machine of MachineSet [`MACHINE_SET`] (MachineDeployment `md-0`).
    async fn worker_machine(&self, name: &str, provider_id: Option<&str>, token_id: &str) {
        self.machine(
            name,
            provider_id,
            ("cluster.x-k8s.io/v1beta2", "MachineSet", MACHINE_SET),
            &[
                ("cluster.x-k8s.io/set-name", MACHINE_SET),
                ("cluster.x-k8s.io/deployment-name", "md-0"),
            ],
            &[],
            Some(token_id),
        )
        .await;
    }

    /// The node registers its Node (as kubelet does, as itself) and the Machine controller sets
    /// the Machine's `status.nodeRef` (`reconcileNode`).
    async fn registered(&self, node: &PluginNode, machine: &str) {
        node.register();
        let name = set_node_ref(&self.w.admin, &self.w.admin, NS, machine).await;
        assert_eq!(name, node.name);
    }

    async fn claimed_node(&self, machine: &str) -> Option<String> {
        machine_claim(&self.w.admin, NS, machine)
            .await
            .and_then(|c| c["nodeName"].as_str().map(str::to_owned))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
async fn machines_deleted_remediated_scaled_and_rolled_out_end_their_nodes_renewals_and_new_ones_join() {
    let began = Instant::now();
    let env = Envtest::start("envtest_lifecycle");
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, NS, capi::CLUSTER, "insecure").await;
    let signer = Signer::start(&signer_bin(), &w.env, &[]).await;
    let mut life = Life {
        w,
        signer,
        seen: HashSet::new(),
    };
    let mut timings = Vec::new();

    // 0. The first control-plane Machine (KCP's initializeControlPlane ->
    //    cloneConfigsAndGenerateMachine, an init configuration: no join token) and its node,
    //    whose kubelet.conf `kubeadm init` filled with its own certificate. The plugin is
    //    installed (kubeconfig --adopt), kubelet registers the Node with that certificate, the
    //    Machine controller's reconcileNode sets status.nodeRef, and the plugin's first request
    //    is an adoption (SPEC rule 7): claimed for the node.
    let cp_old = "prod-cp-a1b2c";
    life.control_plane_machine(cp_old, None).await;
    let (kubeadm_cert, kubeadm_key) = life
        .w
        .env
        .client_certificate(&format!("system:node:{cp_old}"), &["system:nodes"]);
    let cp_a = PluginNode::adopting(
        Life::plugin(),
        &life.w.env,
        cp_old,
        &pid(cp_old),
        &kubeadm_cert,
        &kubeadm_key,
    );
    life.registered(&cp_a, cp_old).await;
    assert!(
        life.new_csrs(cp_old).await.is_empty(),
        "no CSR before the Node was registered"
    );
    let (requester, adopted, stderr) = life.one_csr(&cp_a, "the first control-plane node is adopted").await;
    assert_eq!(requester, format!("system:node:{cp_old}"));
    assert!(
        matches!(adopted, Final::Issued(_)),
        "adoption: {adopted:?}\n{stderr}\n{}",
        life.signer.log()
    );
    assert_eq!(life.claimed_node(cp_old).await.as_deref(), Some(cp_old));
    life.renews(&cp_a, "after its adoption").await;
    timings.push(("control plane adopted", began.elapsed()));

    // 1. A Machine deleted while its node still renews. MachineDeployment md-0 scaled down:
    //    MachineSet deleteMachines deletes the Machine; the Machine controller's reconcileDelete
    //    drains (cordon), waits for hooks and volumes, deletes the infrastructure and the
    //    KubeadmConfig, then the Node, then drops its finalizer.
    let doomed = "md-0-5d8f7-k2x9p";
    let token = life.token("k2x9pa").await;
    life.worker_machine(doomed, Some(&pid(doomed)), "k2x9pa").await;
    let worker_a = PluginNode::joining(Life::plugin(), &life.w.env, doomed, &pid(doomed), &token);
    life.join(&worker_a).await;
    assert_eq!(life.claimed_node(doomed).await.as_deref(), Some(doomed));
    life.registered(&worker_a, doomed).await;
    life.renews(&worker_a, "while its Machine lives").await;
    let worker_a_identity = worker_a.identity();
    begin_deletion(&life.w.admin, NS, doomed).await;
    life.refused(
        &worker_a,
        "MachineNotReady",
        "is being deleted",
        "while its Machine is being deleted",
    )
    .await;
    assert_eq!(
        life.claimed_node(doomed).await.as_deref(),
        Some(doomed),
        "the claim stays on the Machine until it goes"
    );
    // A deletion does not revoke: the draining kubelet still writes.
    tests::revocation::kubelet_writes(
        &life
            .w
            .node_client("md-draining", &worker_a_identity.0, &worker_a_identity.1)
            .await,
        doomed,
    )
    .await
    .expect("a node whose Machine is being deleted (draining) keeps writing");
    finish_deletion(&life.w.admin, &life.w.admin, NS, doomed).await;
    assert!(
        lifecycle::machine(&life.w.admin, NS, doomed).await.is_none(),
        "the Machine, and its claim, are gone"
    );
    life.revoked(
        &worker_a_identity,
        doomed,
        "once its Machine is gone (MachineDeployment scale-down)",
    )
    .await;
    assert!(
        tests::kubelet::node(&life.w.admin, doomed).await.is_none(),
        "reconcileDelete deleted the Node"
    );
    life.refused_once_revoked(
        &worker_a,
        "MachineNotFound",
        "Machine was deleted",
        "once its Machine is gone",
    )
    .await;
    timings.push(("Machine deleted", began.elapsed()));

    // 2. MachineHealthCheck remediation. The Node stops reporting (kube-controller-manager's
    //    node lifecycle controller sets Ready=Unknown), MHC's patchUnhealthyTargets marks the
    //    Machine (HealthCheckSucceeded=False UnhealthyNode, OwnerRemediated=False
    //    WaitingForRemediation), MachineSet's reconcileUnhealthyMachines sets OwnerRemediated
    //    MachineDeleting and deletes it, and syncReplicas -> createMachines makes a replacement
    //    with a new name (computeDesiredMachine: "<machineset>-<random>"), whose instance the
    //    infrastructure provider has not created yet (no provider ID).
    let sick = "md-0-5d8f7-w7m4q";
    let token = life.token("w7m4qa").await;
    life.worker_machine(sick, Some(&pid(sick)), "w7m4qa").await;
    let worker_b = PluginNode::joining(Life::plugin(), &life.w.env, sick, &pid(sick), &token);
    life.join(&worker_b).await;
    life.registered(&worker_b, sick).await;
    life.renews(&worker_b, "while healthy").await;
    let worker_b_identity = worker_b.identity();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(life.w.admin.clone());
    nodes
        .patch_status(
            sick,
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    set_conditions(
        &life.w.admin,
        NS,
        sick,
        &[
            (
                "HealthCheckSucceeded",
                "False",
                "UnhealthyNode",
                "Condition Ready on Node is reporting status Unknown for more than 5m0s",
            ),
            ("OwnerRemediated", "False", "WaitingForRemediation", ""),
        ],
    )
    .await;
    set_conditions(
        &life.w.admin,
        NS,
        sick,
        &[("OwnerRemediated", "False", "MachineDeleting", "Machine is deleting")],
    )
    .await;
    begin_deletion(&life.w.admin, NS, sick).await;
    let replacement = "md-0-5d8f7-r4t6v";
    let token = life.token("r4t6va").await;
    life.worker_machine(replacement, None, "r4t6va").await;
    life.refused(
        &worker_b,
        "MachineNotReady",
        "is being deleted",
        "while its Machine is remediated",
    )
    .await;
    finish_deletion(&life.w.admin, &life.w.admin, NS, sick).await;
    life.revoked(&worker_b_identity, sick, "once remediated (MachineHealthCheck)")
        .await;
    // Refused at once, not held while the replacement has no provider ID yet.
    life.refused_once_revoked(
        &worker_b,
        "MachineNotFound",
        "Machine was deleted",
        "once remediated, its replacement not provisioned",
    )
    .await;
    // The infrastructure provider creates the replacement's instance: provider ID, bootstrap
    // data, addresses.
    life.worker_machine(replacement, Some(&pid(replacement)), "r4t6va")
        .await;
    let worker_c = PluginNode::joining(Life::plugin(), &life.w.env, replacement, &pid(replacement), &token);
    life.join(&worker_c).await;
    assert_eq!(
        life.claimed_node(replacement).await.as_deref(),
        Some(replacement),
        "the replacement is a new Machine with a new claim"
    );
    life.registered(&worker_c, replacement).await;
    life.renews(&worker_c, "after the remediation").await;
    timings.push(("Machine remediated", began.elapsed()));

    // 3. A MachinePool scaled down and up.
    let token = life.token("mp0tok").await;
    apply(
        &life.w.admin,
        &life.w.own(capi::kubeadm_config(POOL, "mp0tok", "v1beta2")),
    )
    .await;
    let (a, b, c) = (pid("mp-0-a"), pid("mp-0-b"), pid("mp-0-c"));
    let mut pool = life.w.own(capi::machine_pool(POOL, &[&a, &b]));
    pool["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] = json!(POOL);
    apply(&life.w.admin, &pool).await;
    let instance_a = PluginNode::joining(Life::plugin(), &life.w.env, "mp-0-a", &a, &token);
    let instance_b = PluginNode::joining(Life::plugin(), &life.w.env, "mp-0-b", &b, &token);
    for instance in [&instance_a, &instance_b] {
        life.join(instance).await;
        instance.register();
    }
    pool_instances(&life.w.admin, &life.w.admin, NS, POOL, &[&a, &b]).await;
    life.renews(&instance_b, "while listed").await;
    let instance_b_identity = instance_b.identity();
    // The infrastructure provider scales down: instance b's provider ID leaves the list, and
    // reconcileNodeRefs' deleteRetiredNodes deletes its Node.
    let deleted = pool_instances(&life.w.admin, &life.w.admin, NS, POOL, &[&a]).await;
    assert_eq!(deleted, ["mp-0-b"], "deleteRetiredNodes");
    life.revoked(&instance_b_identity, "mp-0-b", "once its instance left the pool")
        .await;
    if tests::envtest::kubernetes_minor() >= 32 {
        let removed = life
            .refused(
                &instance_b,
                "MachineNotFound",
                "removed from MachinePool mp-0's spec.providerIDList",
                "once its instance left the pool",
            )
            .await;
        assert!(removed.contains("\"mp-0-b\""), "{removed}");
    } else {
        life.refused_once_revoked(&instance_b, "MachineNotFound", "", "once its instance left the pool")
            .await;
    }
    let claims = pool_claims(&life.w.admin, NS, POOL).await;
    assert!(
        claims.get(&b).is_some(),
        "the removed instance's record lingers until the pool's next claim write: {claims}"
    );
    life.renews(&instance_a, "beside the removed instance").await;
    // ... and up: a new instance joins with the pool's join token and claims its own; that write
    // prunes the removed instance's record.
    pool_instances(&life.w.admin, &life.w.admin, NS, POOL, &[&a, &c]).await;
    let instance_c = PluginNode::joining(Life::plugin(), &life.w.env, "mp-0-c", &c, &token);
    life.join(&instance_c).await;
    instance_c.register();
    pool_instances(&life.w.admin, &life.w.admin, NS, POOL, &[&a, &c]).await;
    let claims = pool_claims(&life.w.admin, NS, POOL).await;
    let mut instances: Vec<&String> = claims.as_object().unwrap().keys().collect();
    instances.sort();
    assert_eq!(instances, [&a, &c], "pruned on the next claim write: {claims}");
    assert_eq!(claims[&c]["nodeName"], "mp-0-c");
    life.renews(&instance_c, "after the scale-up").await;
    life.renews(&instance_a, "after the scale-up").await;
    timings.push(("MachinePool scaled", began.elapsed()));

    // 4. A KCP rollout (a new version): rollingUpdate scales up first (scaleUpControlPlane ->
    //    cloneConfigsAndGenerateMachine, a join configuration with its own join token), and
    //    only once the new Machine has its node scales down (scaleDownControlPlane of the
    //    outdated Machine, selectMachineForInPlaceUpdateOrScaleDown).
    let cp_new = "prod-cp-d4e5f";
    let token = life.token("d4e5fa").await;
    life.control_plane_machine(cp_new, Some("d4e5fa")).await;
    let cp_b = PluginNode::joining(Life::plugin(), &life.w.env, cp_new, &pid(cp_new), &token);
    life.join(&cp_b).await;
    assert_eq!(life.claimed_node(cp_new).await.as_deref(), Some(cp_new));
    life.registered(&cp_b, cp_new).await;
    life.renews(&cp_a, "during the surge").await;
    life.renews(&cp_b, "during the surge").await;
    let cp_a_identity = cp_a.identity();
    begin_deletion(&life.w.admin, NS, cp_old).await;
    life.refused(
        &cp_a,
        "MachineNotReady",
        "is being deleted",
        "once KCP deletes its Machine",
    )
    .await;
    life.renews(&cp_b, "while the old control-plane Machine is deleted")
        .await;
    // The Machine controller waits on KCP's pre-terminate hook (Deleting condition
    // WaitingForPreTerminateHook); KCP's reconcilePreTerminateHook removes the etcd member (not
    // modelled: etcd is the suite's own) and then the hook; reconcileDelete finishes
    // (isDeleteNodeAllowed: a control-plane Machine remains, so the Node goes too).
    set_conditions(
        &life.w.admin,
        NS,
        cp_old,
        &[(
            "Deleting",
            "True",
            "WaitingForPreTerminateHook",
            "Waiting for pre-terminate hooks to succeed (hooks: kcp-cleanup)",
        )],
    )
    .await;
    // Drain and volume detach are over: the old control-plane node's identity goes now, while
    // KCP's hook still holds the Machine; the new one's stays.
    life.revoked(&cp_a_identity, cp_old, "at WaitingForPreTerminateHook (KCP rollout)")
        .await;
    life.renews(&cp_b, "while the old control-plane Machine waits on KCP's hook")
        .await;
    lifecycle::remove_annotation(&life.w.admin, NS, cp_old, KCP_CLEANUP_HOOK).await;
    finish_deletion(&life.w.admin, &life.w.admin, NS, cp_old).await;
    assert!(tests::kubelet::node(&life.w.admin, cp_old).await.is_none());
    life.refused_once_revoked(
        &cp_a,
        "MachineNotFound",
        "Machine was deleted",
        "once its Machine is gone",
    )
    .await;
    life.renews(&cp_b, "after the rollout").await;
    timings.push(("KCP rolled out", began.elapsed()));

    // Every CSR ended; none was left pending or expired.
    let csrs: Api<CertificateSigningRequest> = Api::all(life.w.admin.clone());
    let all = csrs.list(&Default::default()).await.unwrap().items;
    let mut issued = 0;
    for csr in &all {
        match state_of(csr) {
            Final::Issued(_) => issued += 1,
            Final::Denied(reason, message) => assert!(
                ["MachineNotReady", "MachineNotFound"].contains(&reason.as_str()),
                "{:?}: {reason} {message}",
                csr.metadata.name
            ),
            other => panic!("{:?} ended {other:?}", csr.metadata.name),
        }
    }
    assert_eq!(all.len(), life.seen.len(), "every CSR is one the nodes filed");
    assert!(life.signer.alive(), "{}", life.signer.log());
    let denied = all.len() - issued;
    eprintln!(
        "envtest_lifecycle: {} CSRs ({issued} issued, {denied} refused); {}",
        all.len(),
        timings
            .iter()
            .map(|(what, at)| format!("{what} at {}", tests::kubelet::secs(*at)))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
