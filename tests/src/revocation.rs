//! What a revoked node identity can still do, as the suites ask it (SPEC section 7, "Taking an
//! identity back"): the writes a kubelet makes (its Lease, its Node, its Node's status), and how
//! long until the workload cluster's revocation policy refuses them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::Client;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::live::Signer;

/// What the revocation policy's refusals say.
pub const REFUSAL: &str = "revoked by node-attestation-signer";

/// Now, RFC 3339 in whole seconds (a condition's `lastTransitionTime`; a Lease's `renewTime`
/// wants microseconds added).
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("whole seconds")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("RFC 3339")
}

/// What a kubelet writes, as node `node`: its Lease, its Node (created when missing) and its
/// Node's status. `Err` names the first write refused and why.
pub async fn kubelet_writes(client: &Client, node: &str) -> Result<(), String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": node, "namespace": "kube-node-lease"},
                       "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                                "renewTime": now().replace('Z', ".000000Z")}});
    let apply = PatchParams::apply("kubelet").force();
    leases
        .patch(node, &apply, &Patch::Apply(&lease))
        .await
        .map_err(|e| format!("Lease: {e}"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes
        .get_opt(node)
        .await
        .map_err(|e| format!("get Node: {e}"))?
        .is_none()
    {
        let object: Node = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
        nodes
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("create Node: {e}"))?;
    }
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                   "message": "kubelet is posting ready status",
                                                   "lastHeartbeatTime": now()}]}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .map_err(|e| format!("Node status: {e}"))?;
    Ok(())
}

/// How long until `client`'s writes as `node` are refused (panics after `within`).
pub async fn refused_within(client: &Client, node: &str, within: Duration, signer: &Signer) -> Duration {
    let start = Instant::now();
    loop {
        match kubelet_writes(client, node).await {
            Err(why) if why.contains(REFUSAL) => return start.elapsed(),
            Err(why) => panic!("{node}: refused, but not by the revocation policy: {why}"),
            Ok(()) => {}
        }
        assert!(
            start.elapsed() < within,
            "{node}'s writes still pass after {within:?}\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
