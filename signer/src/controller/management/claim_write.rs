//! A join's writes and reads in the management cluster: the claim, the claim read back, and the
//! join's re-read of its Cluster.
//!
//! The claim is a merge patch of one annotation under the resourceVersion the decision was made
//! on, so the apiserver refuses it (409) if the Machine changed since. Its answer is the Machine
//! as written, which serves as the re-check before signing. The claim is the one write a join
//! makes in the management cluster; what it costs there is bounded by kube-apiserver's update
//! path for custom resources, not by the patch (`claim-cost`, docs/capacity.md).
//!
//! The join then reads its Cluster again (`workload::apply`: a `clusterctl move` pauses the
//! Cluster before it copies, so a claim written after the copy would be lost to the target). That
//! read must see every write made before the claim, and no more: it asks for the Cluster "not
//! older than" the claim's resourceVersion, which the apiserver serves from its watch cache once
//! the cache has caught up with that version (0.35 ms of kube-apiserver and etcd CPU against
//! 1.2 ms for a quorum read from etcd, measured by `claim-cost`). A pause written before the claim
//! has a lower version and is seen; one written after it comes before the copy, which then holds
//! the claim. Where the apiserver cannot serve such a read promptly (an apiserver older than
//! v1.31, whose watch cache waits for etcd's progress notifications, or Machines and Clusters in
//! different etcd clusters, whose versions do not compare), the read is refused or slow: the
//! join falls back to a quorum read, and so does every later join of this process.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use attestation::claim::{ClaimState, ClaimWrite};
use attestation::machine::{ClusterView, MachinePoolView, MachineView, TargetKind, TargetRef};
use kube::Api;
use kube::api::{DynamicObject, GetParams, Patch, PatchParams, ValidationDirective};

use super::Management;
use super::lean::LeanObject;
use crate::controller::management::ApplyError;

/// A Cluster read from the watch cache that takes longer than this is given up for good: the
/// cache is not kept fresh by progress notifications, and a quorum read is quicker.
const CACHE_READ_PATIENCE: Duration = Duration::from_secs(1);

/// A claim as written: the claim the apiserver holds now, and the Machine's (or MachinePool's)
/// resourceVersion after the write.
#[derive(Debug)]
pub struct Claimed {
    /// The claim read from the write's answer.
    pub state: ClaimState,
    /// The object's resourceVersion after the write.
    pub version: Option<String>,
}

impl Management {
    /// Writes a claim (see the module) and returns it as the apiserver holds it after the write,
    /// read from the PATCH's answer.
    pub async fn write_claim(&self, claim: &ClaimWrite) -> Result<Claimed, ApplyError> {
        let Some(resource_version) = &claim.resource_version else {
            return Err(ApplyError::Transient(
                "the decision carries no resourceVersion to write the claim under".into(),
            ));
        };
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { claim.annotation: claim.value },
            }
        });
        // Nothing but one annotation is sent: the unknown-field check has nothing to find.
        let params = PatchParams {
            field_validation: Some(ValidationDirective::Ignore),
            ..PatchParams::default()
        };
        let api = self.api_for(&claim.target)?;
        let mut request = kube::core::Request::new(api.resource_url())
            .patch(&claim.target.name, &params, &Patch::Merge(&patch))
            .map_err(|e| ApplyError::Transient(format!("cannot build the claim's PATCH: {e}")))?;
        request.extensions_mut().insert("patch");
        let written: LeanObject = self.client.request(request).await.map_err(ApplyError::from_kube)?;
        Ok(Claimed {
            state: claim_of(&claim.target, &claim.record.provider_id, &written)?,
            version: written.resource_version().map(str::to_owned),
        })
    }

    /// The claim on `target` for `provider_id`, read from the API server, not the cache: the
    /// re-check just before a certificate is written, when this pass wrote no claim.
    pub async fn fresh_claim(&self, target: &TargetRef, provider_id: &str) -> Result<ClaimState, ApplyError> {
        let api = self.api_for(target)?;
        let mut request = kube::core::Request::new(api.resource_url())
            .get(&target.name, &GetParams::default())
            .map_err(|e| ApplyError::Transient(format!("cannot build the claim's GET: {e}")))?;
        request.extensions_mut().insert("get");
        let object: LeanObject = self.client.request(request).await.map_err(ApplyError::from_kube)?;
        claim_of(target, provider_id, &object)
    }

    /// The Cluster `namespace/name` as the API server holds it no earlier than `claimed` (the
    /// claim's resourceVersion; see the module), or now when `claimed` is `None`: `None` when it
    /// is gone. Read by a join once its claim is written (`workload::apply`).
    pub async fn fresh_cluster(
        &self,
        namespace: &str,
        name: &str,
        claimed: Option<&str>,
    ) -> Result<Option<ClusterView>, ApplyError> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &self.cluster_resource);
        let object = match claimed {
            Some(version) if self.cluster_reads_from_cache.load(Ordering::Relaxed) => {
                let started = Instant::now();
                let read = match api.get_with(name, &GetParams::at(version)).await {
                    Ok(object) => Ok(Some(object)),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
                    Err(e) => Err(e),
                };
                let slow = started.elapsed() > CACHE_READ_PATIENCE;
                match read {
                    Ok(object) if !slow => object,
                    other => {
                        self.cluster_reads_from_cache.store(false, Ordering::Relaxed);
                        tracing::warn!(
                            took_ms = started.elapsed().as_millis() as u64,
                            error = other.err().map(|e| e.to_string()),
                            "the apiserver's watch cache cannot serve a Cluster read not older than the claim \
                             promptly; joins read their Cluster from etcd from now on"
                        );
                        api.get_opt(name).await.map_err(ApplyError::from_kube)?
                    }
                }
            }
            _ => api.get_opt(name).await.map_err(ApplyError::from_kube)?,
        };
        let Some(object) = object else {
            return Ok(None);
        };
        let unreadable = |e: String| ApplyError::Transient(format!("cannot read Cluster {namespace}/{name}: {e}"));
        let object = serde_json::to_value(object).map_err(|e| unreadable(e.to_string()))?;
        ClusterView::from_object(&object)
            .map(Some)
            .map_err(|e| unreadable(e.to_string()))
    }
}

fn claim_of(target: &TargetRef, provider_id: &str, object: &LeanObject) -> Result<ClaimState, ApplyError> {
    if object.str_at("/metadata/uid") != Some(target.uid.as_str()) {
        return Ok(ClaimState::Unreadable(format!(
            "{} was replaced by another object of the same name",
            target.name
        )));
    }
    let value = &object.0;
    Ok(match target.kind {
        TargetKind::Machine => MachineView::from_object(value)
            .map(|m| m.claim())
            .unwrap_or_else(|e| ClaimState::Unreadable(e.to_string())),
        TargetKind::MachinePool => MachinePoolView::from_object(value)
            .map(|p| p.claims.instance(provider_id))
            .unwrap_or_else(|e| ClaimState::Unreadable(e.to_string())),
    })
}
