//! Applying a decision to the workload cluster and the management cluster.
//!
//! The order of writes for a client CSR is the SPEC's: the claim (with the resourceVersion the
//! decision was made on), `/approval`, a fresh re-read of the claim, then `/status`; a join also
//! reads its Cluster fresh once the claim is written, and writes nothing more if the Cluster was
//! paused meanwhile (`clusterctl move` copies Machines after it pauses). A conflict
//! at the claim means another CSR got there first: the CSR is decided again on fresh state,
//! which denies it. A claim lost between approval and signing marks the CSR `Failed`. So of two
//! racing CSRs for one Machine, at most one is ever signed, whatever the interleaving and
//! however many replicas or restarts.

use attestation::CsrObject;
use attestation::ca::Validity;
use attestation::claim::ClaimState;
use attestation::decision::{Decision, DenyReason, Issuance};
use attestation::machine::{ClusterView, TargetRef};
use attestation::names::{GROUP_NODES, NODE_USER_PREFIX};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use time::OffsetDateTime;

use super::record;
use super::worker::Worker;
use crate::controller::management::ApplyError;
use crate::csr_object::{Stage, stage};

impl Worker {
    /// Refuses `csr`: `Denied` through `/approval` (with the decision's CSR annotations), or,
    /// when it is already approved, `Failed` through `/status` (the API refuses `Denied` on an
    /// approved CSR). Either way it is never signed.
    pub(super) async fn refuse(
        &self,
        csr: &CertificateSigningRequest,
        decision: &Decision,
        reason: &str,
        message: &str,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let mut current = csr.clone();
        let approved = stage(csr) == Stage::Approved;
        if !approved && !decision.annotations.is_empty() {
            let patch = serde_json::json!({"metadata": {"annotations": decision.annotations}});
            current = self
                .csr_api()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(ApplyError::from_kube)?;
        }
        let (condition_type, event_reason, what) = if approved {
            ("Failed", "CSRFailed", "was approved but is not signed")
        } else {
            ("Denied", "CSRDenied", "denied")
        };
        push_condition(&mut current, condition(condition_type, reason, message));
        // Written from the cache's copy, whose request may be withheld (super::intake): the
        // apiserver takes only the conditions from an /approval or /status update. Its answer,
        // the whole CSR again (a megabyte for a hostile one), is not decoded.
        self.put_csr(if approved { "status" } else { "approval" }, &name, &current)
            .await?;
        tracing::info!(reason, message, "{what}");
        self.mark_finished(csr);
        self.count(csr, condition_type, reason);
        let text = format!("CSR {name} {what} ({reason}): {message}");
        self.event(decision, EventType::Warning, event_reason, &text);
        Ok(())
    }

    /// Approves `csr` as `decision` says, decided on `cluster` as the cache held it, and signs a
    /// client CSR.
    pub(super) async fn approve(
        &self,
        csr: &CertificateSigningRequest,
        object: &CsrObject,
        cluster: &ClusterView,
        decision: &Decision,
        reason: &str,
        message: &str,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let approved_already = stage(csr) == Stage::Approved;
        let mut written = None;
        let mut claimed_version = None;
        if let Some(claim) = &decision.claim {
            let claimed = self.shared.management.write_claim(claim).await?;
            claimed_version = claimed.version;
            written = Some(claimed.state);
            // A claimed Machine's join token may go once its node joins (duties::join_tokens).
            self.claim_written.notify_one();
            // Said at info by the one line of a signed join ("approved and signed", in this
            // span, naming the Machine); a claim whose CSR is not signed logs why it was not.
            tracing::debug!(node = %claim.record.node_name, "claimed {}", claim.target.name);
        }
        if let Some(issuance) = &decision.issuance
            && (written.is_some() || !renewal_by_node(object, issuance))
        {
            // A Machine's one identity: the claim must be in whatever copy of the Machine
            // `clusterctl move` makes, and the move pauses the Cluster before it copies. A claim
            // whose write landed after the copy (held in a queue, or decided on a cache that had
            // not seen the pause yet) is in the source only, and the target would let another
            // CSR claim the Machine. So the Cluster is read again once the claim is there, no
            // older than the claim (management::claim_write): still
            // served as decided, the claim was written before any pause and any copy of it
            // holds it; otherwise nothing more is written here and the CSR stays pending for
            // whichever signer serves the Cluster once it is unpaused (the target's).
            let now = self
                .shared
                .management
                .fresh_cluster(&cluster.namespace, &cluster.name, claimed_version.as_deref())
                .await?;
            if let Some(why) = moved_on(cluster, now.as_ref()) {
                tracing::info!(%why, "not approved: the CSR stays pending for the signer that serves the Cluster next");
                self.retry(csr, &why);
                return Ok(());
            }
        }
        let mut current = csr.clone();
        if !approved_already {
            // The record of the issuance (workload::record): written before the certificate.
            let replica = self
                .shared
                .reporter
                .instance
                .as_deref()
                .unwrap_or(&self.shared.reporter.controller);
            let recorded = record::approval_message(message, decision.target.as_ref(), replica);
            push_condition(&mut current, condition("Approved", reason, &recorded));
            // The CSR as written is ours with a new resourceVersion (the apiserver keeps the
            // Approved condition as sent; its managed fields stay when an update sends none),
            // so only that version is read from the answer.
            let version = self.put_csr("approval", &name, &current).await?.ok_or_else(|| {
                ApplyError::Transient("the apiserver's answer to the approval carries no resourceVersion".into())
            })?;
            current.metadata.resource_version = Some(version);
            self.count(csr, "Approved", reason);
        }
        let Some(issuance) = &decision.issuance else {
            // Serving: the workload cluster's kube-controller-manager signs.
            tracing::info!(reason, "approved");
            self.event(
                decision,
                EventType::Normal,
                "CSRApproved",
                &format!("CSR {name} approved: {message}"),
            );
            return Ok(());
        };
        let Some(target) = &decision.target else {
            return Err(ApplyError::Transient("an approved client CSR without a Machine".into()));
        };
        let claimed_now = written.is_some();
        if let Err(why) = self.recheck_claim(target, object, issuance, written).await? {
            return self.refuse(&current, decision, "MachineAlreadyClaimed", &why).await;
        }
        let validity = Validity {
            now: OffsetDateTime::now_utc(),
            requested_seconds: object.expiration_seconds,
            max: self.shared.settings.client_cert_duration,
        };
        let ca = self.ca.as_ref().map_err(|why| ApplyError::Transient(why.clone()))?;
        let certificate = match ca.issue(&issuance.csr, &issuance.provider_id, validity) {
            Ok(c) => c,
            Err(e) => return Err(ApplyError::Transient(format!("cannot sign with the cluster CA: {e}"))),
        };
        // Recorded before it is written: a certificate is never issued unrecorded (revocation).
        self.record_issued(&certificate, target, node_of(issuance), issuance.provider_id.as_str())
            .await?;
        current.status.get_or_insert_default().certificate =
            Some(k8s_openapi::ByteString(certificate.pem().into_bytes()));
        self.put_csr("status", &name, &current).await?;
        self.mark_finished(csr);
        self.report_issuance(
            &current,
            &record::Signed {
                reason,
                not_after: certificate.not_after.to_string(),
                claimed_now,
                created: object.created,
            },
        );
        if let Some(earlier) = &decision.supersedes {
            self.supersede(earlier, &name, decision).await;
        }
        Ok(())
    }

    /// Replaces `csr`'s `subresource` (`approval`, `status`) and returns its new
    /// resourceVersion (`None` when the answer carries none: the write was made all the same).
    /// The answer (the whole CSR again) is not parsed beyond that version: nothing else of it
    /// is read, and parsing it whole was two of the five CSR decodes of every join.
    pub(super) async fn put_csr(
        &self,
        subresource: &str,
        name: &str,
        csr: &CertificateSigningRequest,
    ) -> Result<Option<String>, ApplyError> {
        let body = serde_json::to_vec(csr).map_err(|e| ApplyError::Transient(format!("cannot encode the CSR: {e}")))?;
        let mut request = kube::core::Request::new(self.csr_api().resource_url())
            .replace_subresource(subresource, name, &PostParams::default(), body)
            .map_err(|e| ApplyError::Transient(format!("cannot build the {subresource} update: {e}")))?;
        request.extensions_mut().insert("replace_subresource");
        // Only the answer's metadata: the whole CSR again is a megabyte for a hostile one, and
        // at the fleet's concurrency the answers alone were most of a flood's memory.
        request.headers_mut().insert(
            hyper::http::header::ACCEPT,
            hyper::http::HeaderValue::from_static(PARTIAL_METADATA),
        );
        let answer = self.client.request_text(request).await.map_err(ApplyError::from_kube)?;
        Ok(written_version(&answer))
    }

    /// Writes a verifier's challenge on the CSR (with the resourceVersion it was decided on, so
    /// two replicas or workers never write two) and looks again when it may have expired.
    pub(super) async fn challenge(
        &self,
        csr: &CertificateSigningRequest,
        decision: &Decision,
        message: &str,
    ) -> Result<(), ApplyError> {
        let name = csr.name_any();
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": csr.resource_version(),
            "annotations": decision.annotations,
        }});
        self.csr_api()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(ApplyError::from_kube)?;
        tracing::info!(message, "challenged");
        self.count(csr, "Challenged", "Pending");
        self.event(
            decision,
            EventType::Normal,
            "CSRChallenged",
            &format!("CSR {name} challenged: {message}"),
        );
        self.retry(csr, message);
        Ok(())
    }

    /// Denies the CSR an approved one replaced (TPM CSR #1 once CSR #2 is signed), unless it
    /// is already finished; it is never signed.
    pub(super) async fn supersede(&self, earlier: &attestation::CsrRef, by: &str, decision: &Decision) {
        let Some(first) = self.csrs.get(&ObjectRef::new(&earlier.name)) else {
            return;
        };
        if first.uid().as_deref() != Some(earlier.uid.as_str()) || stage(&first) != Stage::Pending {
            return;
        }
        let quiet = Decision {
            annotations: Default::default(),
            ..decision.clone()
        };
        let message = format!("its challenge was answered by CSR {by}, which was signed instead");
        if let Err(e) = self
            .refuse(&first, &quiet, DenyReason::Superseded.as_str(), &message)
            .await
        {
            // It stays pending and ends ChallengeFailed when its challenge expires: never signed.
            tracing::warn!(csr = %earlier.name, error = %e, "could not mark the superseded CSR");
        }
    }

    /// The claim, read fresh, must still be this identity's: held by this CSR, or (a renewal by
    /// the node itself) naming this node. `Ok(Err(why))` when it is not. `written`: the claim
    /// this pass wrote, as the PATCH returned it (the API server's state after the write, as
    /// fresh as a GET would be); otherwise it is read.
    pub(super) async fn recheck_claim(
        &self,
        target: &TargetRef,
        csr: &CsrObject,
        issuance: &Issuance,
        written: Option<ClaimState>,
    ) -> Result<Result<(), String>, ApplyError> {
        let state = match written {
            Some(state) => state,
            None => {
                self.shared
                    .management
                    .fresh_claim(target, issuance.provider_id.as_str())
                    .await?
            }
        };
        let node = node_of(issuance);
        let renewal = renewal_by_node(csr, issuance);
        Ok(match state {
            ClaimState::Valid(claim) if claim.node_name == node && (claim.csr_uid == csr.uid || renewal) => Ok(()),
            ClaimState::Valid(claim) => Err(format!(
                "re-check before signing: {} is now claimed by node {} (CSR {})",
                target.name, claim.node_name, claim.csr_uid
            )),
            other => Err(format!(
                "re-check before signing: {} holds no claim for this CSR ({other:?})",
                target.name
            )),
        })
    }
}

/// The node name a client CSR asks for (its CN after `system:node:`).
fn node_of(issuance: &Issuance) -> &str {
    issuance
        .csr
        .common_names()
        .find_map(|a| a.value.as_deref())
        .and_then(|cn| cn.strip_prefix(NODE_USER_PREFIX))
        .unwrap_or_default()
}

/// The CSR is filed by the node it asks for, as that node (a renewal, or an adoption).
fn renewal_by_node(csr: &CsrObject, issuance: &Issuance) -> bool {
    csr.username == format!("{NODE_USER_PREFIX}{}", node_of(issuance)) && csr.groups.iter().any(|g| g == GROUP_NODES)
}

/// Why a join decided on `decided` (the cache's Cluster) must not be approved now that the API
/// server holds `now`: paused (`clusterctl move` starts so), no longer opted in, gone, or
/// another Cluster of the same name. `None`: still served as decided.
pub(super) fn moved_on(decided: &ClusterView, now: Option<&ClusterView>) -> Option<String> {
    let key = decided.key();
    match now {
        None => Some(format!("Cluster {key} is gone since this CSR was decided")),
        Some(now) if now.uid != decided.uid => Some(format!("Cluster {key} was replaced since this CSR was decided")),
        Some(now) => match now.paused {
            Some(how) => Some(format!("Cluster {key} is paused since this CSR was decided ({how})")),
            None if !now.opted_in => Some(format!("Cluster {key} no longer opts in")),
            None => None,
        },
    }
}

fn condition(type_: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    CertificateSigningRequestCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

/// `metadata.resourceVersion` of a written object's JSON; the rest is skipped by the parser.
/// The media type asking an apiserver to answer a write with the object's metadata alone
/// (`meta.k8s.io/v1` `PartialObjectMetadata`), JSON as the fallback of one that cannot.
const PARTIAL_METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json";

fn written_version(answer: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Written {
        metadata: WrittenMeta,
    }
    #[derive(serde::Deserialize)]
    struct WrittenMeta {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    serde_json::from_str::<Written>(answer)
        .ok()?
        .metadata
        .resource_version
        .filter(|v| !v.is_empty())
}

fn push_condition(csr: &mut CertificateSigningRequest, condition: CertificateSigningRequestCondition) {
    csr.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(condition);
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use attestation::machine::Paused;

    /// A CSR of `signer` with `conditions`, and a certificate when `certificate`.
    pub(crate) fn csr(signer: &str, conditions: &[&str], certificate: bool) -> CertificateSigningRequest {
        let mut csr = CertificateSigningRequest::default();
        csr.spec.signer_name = signer.to_owned();
        for c in conditions {
            push_condition(&mut csr, condition(c, "R", "m"));
        }
        if certificate {
            csr.status.get_or_insert_default().certificate = Some(k8s_openapi::ByteString(b"x".to_vec()));
        }
        csr
    }

    #[test]
    fn a_join_is_approved_only_while_its_cluster_is_served_as_decided() {
        let decided = ClusterView {
            uid: "u-1".into(),
            ..ClusterView::named("prod", "team-a", &["insecure"])
        };
        assert_eq!(moved_on(&decided, Some(&decided)), None, "served as decided");
        let paused = ClusterView {
            paused: Some(Paused::Spec),
            ..decided.clone()
        };
        let why = moved_on(&decided, Some(&paused)).unwrap();
        assert!(
            why.contains("team-a/prod is paused") && why.contains("spec.paused is true"),
            "{why}"
        );
        let annotated = ClusterView {
            paused: Some(Paused::Annotation),
            ..decided.clone()
        };
        assert!(moved_on(&decided, Some(&annotated)).unwrap().contains("paused"));
        assert!(moved_on(&decided, None).unwrap().contains("gone"));
        let copy = ClusterView {
            uid: "u-2".into(),
            ..decided.clone()
        };
        assert!(moved_on(&decided, Some(&copy)).unwrap().contains("replaced"));
        let out = ClusterView {
            opted_in: false,
            ..decided.clone()
        };
        assert!(moved_on(&decided, Some(&out)).unwrap().contains("no longer opts in"));
    }

    #[test]
    fn a_written_csrs_version_is_read_and_nothing_else_must_parse() {
        let answer = r#"{"kind": "CertificateSigningRequest", "metadata": {"name": "c",
            "resourceVersion": "812", "managedFields": [{"manager": "x"}]},
            "spec": {"request": "not even base64"}, "status": {"certificate": 5}}"#;
        assert_eq!(written_version(answer).as_deref(), Some("812"));
        for answer in [
            "",
            "{}",
            r#"{"metadata": {}}"#,
            r#"{"metadata": {"resourceVersion": ""}}"#,
            r#"{"metadata": {"resourceVersion": 812}}"#,
            "[1]",
        ] {
            assert_eq!(written_version(answer), None, "{answer}");
        }
    }
}
