//! What happens to one CSR: its inputs gathered (the Cluster and its Machines from the
//! management cache, Nodes and the other CSRs from the workload cluster's watches), the rule
//! engine's decision taken (twice when a cloud verifier needs a call made first), and the
//! decision handed to [`super::apply`]; how the apiservers answered goes back to the fleet's
//! slots.

use std::time::Duration;

use attestation::cloud::CloudCall;
use attestation::decision::{DenyReason, Outcome};
use attestation::machine::ClusterView;
use attestation::tpm::boot_policy::PolicyState;
use attestation::{Clock, CsrObject, Inputs};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use time::OffsetDateTime;

use super::inflight::Answer;
use super::worker::{FINISHED_MEMORY, Worker, needs_us};
use crate::controller::management::ApplyError;
use crate::controller::management::fresh::FreshRead;
use crate::csr_object::{Stage, csr_object, stage};
use crate::locks::lock;

/// How soon a CSR of a Cluster whose Machines are still being listed is looked at again.
const UNLISTED_RETRY: Duration = Duration::from_millis(250);

/// Least time between two `TpmChallengeKeyUnavailable` Events on one Cluster.
const KEY_WARNING_INTERVAL: Duration = Duration::from_secs(300);

/// The workload cluster's CSRs, from the watch cache.
struct StoreCsrs<'a>(&'a Store<CertificateSigningRequest>);

impl attestation::CsrDirectory for StoreCsrs<'_> {
    fn csr(&self, name: &str) -> Option<CsrObject> {
        self.0.get(&ObjectRef::new(name)).map(|c| csr_object(&c))
    }

    fn pending_with(&self, annotation: &str) -> Vec<CsrObject> {
        self.0
            .state()
            .iter()
            .filter(|c| c.annotations().contains_key(annotation) && stage(c) != Stage::Done)
            .map(|c| csr_object(c))
            .collect()
    }
}

impl Worker {
    /// The rule engine's decision, in turn with the other CPU-bound decisions.
    pub(super) async fn decide(
        &self,
        csr: &attestation::CsrObject,
        cluster: &ClusterView,
        inventory: &attestation::machine::Inventory,
        clock: Clock,
    ) -> Option<attestation::Decision> {
        let _turn = self.shared.crypto.acquire().await;
        let inputs = Inputs {
            csr,
            cluster,
            inventory,
            nodes: &self.nodes,
            csrs: &StoreCsrs(&self.csrs),
            verifiers: &self.shared.verifiers,
            clock,
        };
        attestation::decide(&inputs).ok()
    }

    /// Decides `name` and applies the decision; says how the apiservers answered.
    pub(super) async fn process(&self, name: &str) -> Answer {
        let Some(csr) = self.csrs.get(&ObjectRef::new(name)) else {
            return Answer::Idle;
        };
        // Held without its request past the cluster's cap (super::intake): read it now.
        let csr = if super::intake::deferred(&csr) {
            match self.csr_api().get_opt(name).await {
                Ok(Some(fresh)) => std::sync::Arc::new(fresh),
                Ok(None) => return Answer::Idle,
                Err(e) => {
                    let e = ApplyError::from_kube(e);
                    tracing::warn!(error = %e, "could not read a CSR held without its request; retrying");
                    self.retry(&csr, &e.to_string());
                    return if e.is_overload() {
                        Answer::Overloaded
                    } else {
                        Answer::Answered
                    };
                }
            }
        } else {
            csr
        };
        // Opted out or paused since this worker started: it is about to be stopped, and nothing
        // is decided or written meanwhile; a paused Cluster's CSRs stay pending (the worker an
        // unpause starts queues them again).
        let Some(cluster) = self.served_cluster() else {
            return Answer::Idle;
        };
        if !needs_us(&csr) {
            return Answer::Idle;
        }
        if csr
            .uid()
            .and_then(|uid| lock(&self.finished).get(&uid).copied())
            .is_some_and(|at| at.elapsed() < FINISHED_MEMORY)
        {
            tracing::debug!("finished by this worker; the watch cache has not caught up yet");
            return Answer::Idle;
        }
        // A Cluster just gained is decided only once its Machines are listed: an unlisted
        // Machine would be denied MachineNotFound, which is final.
        let Some(inventory) = self.shared.management.inventory(&cluster) else {
            tracing::debug!("the Cluster's Machines are not listed yet");
            self.queue.push_after(name.to_owned(), UNLISTED_RETRY);
            return Answer::Idle;
        };
        // tpm/v1 and azure/v1 challenge under the same key.
        if matches!(
            csr.spec.signer_name.as_str(),
            attestation::names::SIGNER_TPM | attestation::names::SIGNER_AZURE
        ) && let Err(failure) = self.shared.challenge_key.ensure().await
        {
            // The verifier holds the CSR (pending) until the key is there; the Cluster's owner
            // hears why, once per KEY_WARNING_INTERVAL (the Event keeps its tpm/v1 name).
            let due = {
                let mut warned = lock(&self.key_warned);
                let due = warned.is_none_or(|at| at.elapsed() >= KEY_WARNING_INTERVAL);
                if due {
                    *warned = Some(std::time::Instant::now());
                }
                due
            };
            if due {
                self.cluster_event(EventType::Warning, "TpmChallengeKeyUnavailable", &failure.message);
            }
        }
        // tpm/v1: the Cluster's boot policy, read (cached) for the verifier, which is pure. One
        // that cannot be used holds the CSR, and the Cluster's owner hears why.
        let cluster = if csr.spec.signer_name == attestation::names::SIGNER_TPM {
            let resolved = self.shared.boot_policies.resolve(&cluster).await;
            let unusable = match &resolved.boot_policy {
                PolicyState::Invalid { source, message } => Some(format!(
                    "tpm/v1 boot policy {source}: {message}; the Cluster's tpm/v1 CSRs are held until it is fixed"
                )),
                PolicyState::Required => Some(
                    "tpm/v1: the signer requires a boot policy of every tpm/v1 Cluster (--tpm-require-boot-policy) and this Cluster names none: annotate it with cluster.x-k8s.io/kubelet-tpm-boot-policy naming a ConfigMap of its namespace; its tpm/v1 CSRs are held until then".to_owned(),
                ),
                _ => None,
            };
            if let Some(note) = unusable
                && self.shared.boot_policies.warning_due(&self.key)
            {
                self.cluster_event(EventType::Warning, "BootPolicyInvalid", &note);
            }
            resolved
        } else {
            cluster
        };
        let now = OffsetDateTime::now_utc();
        let object = csr_object(&csr);
        let first_seen = *lock(&self.first_seen).entry(object.uid.clone()).or_insert(now);
        let clock = Clock {
            now,
            first_seen,
            max_age: self.shared.settings.csr_max_age,
        };
        let Some(mut decision) = self.decide(&object, &cluster, &inventory, clock).await else {
            return Answer::Idle;
        };
        if !decision.cloud_calls.is_empty() {
            // A cloud verifier needs Google's keys or STS's answer, or the tpm/v1 verifier the
            // challenge key read again: ask, then decide once more (a second miss waits for the
            // retry, like any transient gap).
            if decision.cloud_calls.contains(&CloudCall::ReloadChallengeKey) {
                self.shared.challenge_key.reread().await;
            }
            self.shared.cloud.make(&decision.cloud_calls).await;
            let Some(again) = self.decide(&object, &cluster, &inventory, clock).await else {
                return Answer::Idle;
            };
            decision = again;
        }
        if let Some(reason) = denied_on_management_state(&decision) {
            match self.confirm_denial(&csr, &object, &cluster, clock, reason).await {
                Confirmed::Denied(again) => decision = *again,
                Confirmed::Waits(answer) => return answer,
            }
        }
        if let Some(target) = &decision.target {
            tracing::Span::current().record("machine", tracing::field::display(&target.name));
        }
        if self.served_cluster().is_none_or(|now| now.uid != cluster.uid) {
            // Paused (or opted out, or replaced) while this CSR was decided (a cloud call, a
            // fresh read): nothing is written.
            tracing::debug!("the Cluster is no longer served as it was; the CSR stays pending");
            return Answer::Idle;
        }
        // A decision applied without a request says nothing about the apiservers.
        let mut asked = true;
        let result = match &decision.outcome {
            Outcome::Retry { message } if !decision.annotations.is_empty() => {
                self.challenge(&csr, &decision, message).await
            }
            Outcome::Retry { message } => {
                self.count(&csr, "Retry", "Pending");
                self.retry(&csr, message);
                asked = false;
                Ok(())
            }
            Outcome::Denied { reason, message } => self.refuse(&csr, &decision, reason.as_str(), message).await,
            Outcome::Approved { .. } if decision.issuance.is_some() && self.ca.is_err() => {
                // No claim, no approval: nothing is written until the CA can sign.
                let why = self.ca.as_ref().err().cloned().unwrap_or_default();
                if now - first_seen > self.shared.settings.csr_max_age {
                    let message = format!("still pending after --csr-max-age: {why}");
                    self.refuse(&csr, &decision, DenyReason::Expired.as_str(), &message)
                        .await
                } else {
                    self.count(&csr, "Retry", "Pending");
                    self.retry(&csr, &why);
                    asked = false;
                    Ok(())
                }
            }
            Outcome::Approved { reason, message } => {
                self.approve(&csr, &object, &cluster, &decision, reason, message).await
            }
            _ => {
                asked = false;
                Ok(())
            }
        };
        match result {
            Ok(()) if asked => Answer::Answered,
            Ok(()) => Answer::Idle,
            Err(ApplyError::Conflict(why)) => {
                tracing::debug!(%why, "conflict; deciding again on fresh state");
                self.queue.push_after(name.to_owned(), Duration::from_millis(100));
                Answer::Answered
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not apply the decision; retrying");
                self.apply_failed();
                self.retry(&csr, &e.to_string());
                if e.is_overload() {
                    Answer::Overloaded
                } else {
                    Answer::Answered
                }
            }
        }
    }
}

/// What a fresh read made of a denial the management cache gave.
enum Confirmed {
    /// Still denied on the fresh read: the decision to write.
    Denied(Box<attestation::Decision>),
    /// Not denied, or not confirmed: the CSR waits, and the apiservers answered so.
    Waits(Answer),
}

impl Worker {
    /// A denial by a rule that reads the Cluster's Machines (final, and resting on the cache)
    /// decided again on a fresh read of them first (management::fresh). A cache that is behind,
    /// or a management apiserver out of reach, makes the CSR wait, never a wrong denial.
    ///
    /// The fresh read may be one another CSR of the Cluster started after this CSR was first
    /// seen, and so older than what the cache showed this decision (a racing CSR's claim
    /// written since): one that disagrees is taken again, newer than the decision, before the
    /// cache is called behind. Otherwise the loser of a race would wait on that older read
    /// (reused as long as it started after the CSR was first seen) and never be denied.
    async fn confirm_denial(
        &self,
        csr: &CertificateSigningRequest,
        object: &CsrObject,
        cluster: &ClusterView,
        clock: Clock,
        reason: DenyReason,
    ) -> Confirmed {
        // The cache showed the decision nothing newer than this instant.
        let decided_at = OffsetDateTime::now_utc();
        let mut again = None;
        for not_before in [clock.first_seen, decided_at] {
            let fresh = match self.shared.management.fresh_inventory(cluster, not_before).await {
                Ok(FreshRead::Read(fresh)) => fresh,
                Ok(FreshRead::TooSoon(wait)) => {
                    // Reads of a Cluster are spaced (management::fresh); this CSR is looked at
                    // again once the next may start, holding no slot meanwhile.
                    tracing::debug!(wait_ms = wait.as_millis() as u64, "waiting for the next fresh read");
                    self.queue.push_after(csr.name_any(), wait);
                    return Confirmed::Waits(Answer::Idle);
                }
                Err(e) => {
                    let why = format!("cannot confirm the {reason} denial against the management cluster: {e}");
                    tracing::warn!("{why}; the CSR waits");
                    self.count(csr, "Retry", "Pending");
                    self.retry(csr, &why);
                    return Confirmed::Waits(if e.is_overload() {
                        Answer::Overloaded
                    } else {
                        Answer::Idle
                    });
                }
            };
            let Some(decision) = self.decide(object, cluster, &fresh, clock).await else {
                return Confirmed::Waits(Answer::Idle);
            };
            if matches!(decision.outcome, Outcome::Denied { .. }) {
                return Confirmed::Denied(Box::new(decision));
            }
            again = Some(decision);
        }
        // With backoff: a cache that never catches up costs a read per backoff step.
        tracing::info!(
            cached = %reason,
            fresh = ?again.map(|d| d.outcome),
            "the management cache was behind the apiserver; deciding again when it catches up"
        );
        self.count(csr, "Retry", "Pending");
        self.retry(csr, "the management cache was behind the apiserver");
        Confirmed::Waits(Answer::Answered)
    }
}

/// The reason of a denial by a rule that reads the Cluster's Machines, MachinePools or
/// KubeadmConfigs (rules 7, 9, 10, 11), which the cache may hold stale or not yet. Not one
/// settled by the CSR alone (a node asking for another node's name): no read changes it, and a
/// node filing such CSRs would otherwise keep a fresh read running.
fn denied_on_management_state(decision: &attestation::Decision) -> Option<DenyReason> {
    if decision.settled_by_request {
        return None;
    }
    match &decision.outcome {
        Outcome::Denied { reason, .. }
            if matches!(
                reason,
                DenyReason::RequesterNotAllowed
                    | DenyReason::MachineNotFound
                    | DenyReason::MachineNotReady
                    | DenyReason::NodeNameMismatch
                    | DenyReason::NodeAlreadyRegistered
                    | DenyReason::MachineAlreadyClaimed
            ) =>
        {
            Some(*reason)
        }
        _ => None,
    }
}
