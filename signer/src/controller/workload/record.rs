//! Every certificate the signer writes is recorded once (its `CertificateIssued` Event, the
//! `certificates_issued_total` count and the "approved and signed" log line), whoever finishes
//! the work.
//!
//! A replica may stop between writing a certificate and recording it. The record is an Event
//! whose name is the CSR's UID, created only if it does not exist yet, and only the pass that
//! created it counts and logs it. A worker starting on a Cluster (a restart, a hand-over) looks
//! at the CSRs of this signer approved and signed within [`RECOVERY_WINDOW`] and records those
//! that are not: an Event that exists already makes the attempt a no-op, so a record is never
//! made twice, and the hot path of a join writes nothing more than its Event.

use attestation::names::BOOTSTRAP_USER_PREFIX;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use time::OffsetDateTime;

use super::worker::Worker;
use crate::controller::events::{Once, note, record_once};
use crate::csr_object::{Stage, stage};

/// How far back a starting worker looks for certificates a stopped replica wrote: far longer
/// than a hand-over (a Lease, 15 s) or a restart takes.
pub const RECOVERY_WINDOW: time::Duration = time::Duration::minutes(5);

/// What the pass that signed knows of the issuance.
pub(super) struct Signed<'a> {
    /// The Machine or MachinePool the Event is about.
    pub regarding: ObjectReference,
    /// The approval's reason.
    pub reason: &'a str,
    /// The decision's message.
    pub message: &'a str,
    /// The certificate's NotAfter.
    pub not_after: String,
    /// Whether this pass claimed the Machine.
    pub claimed_now: bool,
    /// The CSR's creation, for the latency histogram.
    pub created: Option<OffsetDateTime>,
}

/// An issued CSR of this signer's client signers, approved within [`RECOVERY_WINDOW`] of `now`
/// and after the second `cluster_created` (the Cluster's creation in this management cluster,
/// when known): one a stopped replica may have left unrecorded. A certificate approved before
/// the Cluster existed here was signed for its copy in another management cluster (the source
/// of a `clusterctl move`, or what a restore was taken from) and recorded there; the record
/// Events stay in that management cluster, so recording it here would record it twice.
pub(super) fn maybe_unrecorded(
    csr: &CertificateSigningRequest,
    now: OffsetDateTime,
    cluster_created: Option<OffsetDateTime>,
) -> bool {
    let Some(status) = csr.status.as_ref() else {
        return false;
    };
    let approved_at = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Approved" && c.status == "True")
        .and_then(|c| c.last_update_time.as_ref())
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok());
    stage(csr) == Stage::Done
        && status.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
        && matches!(
            attestation::rules::classify(&csr.spec.signer_name),
            Some(attestation::decision::CsrKind::KubeletClient)
        )
        && approved_at.is_some_and(|at| {
            // Both in whole seconds: an approval in the second of the creation is not known to
            // be this management cluster's, and is left as recorded elsewhere.
            now - at <= RECOVERY_WINDOW
                && cluster_created.is_none_or(|created| at.unix_timestamp() > created.unix_timestamp())
        })
}

impl Worker {
    /// Records the certificate written on `csr` once (see the module); `signed` when this pass
    /// wrote it. A failure is logged; the next worker to start on the Cluster tries again.
    pub(super) async fn record_issuance(&self, csr: &CertificateSigningRequest, signed: Option<Signed<'_>>) {
        let name = csr.name_any();
        let Some(uid) = csr.uid() else {
            return;
        };
        let joined = csr
            .spec
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with(BOOTSTRAP_USER_PREFIX));
        let kind = if joined { "join" } else { "renewal" };
        let (regarding, text) = match &signed {
            Some(s) => (
                s.regarding.clone(),
                format!("CSR {name} approved and signed until {}: {}", s.not_after, s.message),
            ),
            None => (
                self.cluster_ref.clone(),
                format!("CSR {name} was approved and signed; the replica that signed it stopped before recording it"),
            ),
        };
        let once = Once {
            name: format!("node-attestation-issued.{uid}"),
            regarding,
            reason: "CertificateIssued",
            action: "Decide",
            note: note(&text),
        };
        match record_once(self.shared.management.client(), &self.shared.reporter, &once).await {
            Ok(true) => {
                self.shared.metrics.issued(&self.key, kind);
                match &signed {
                    Some(s) => {
                        if let Some(created) = s.created {
                            self.shared
                                .metrics
                                .issued_after((OffsetDateTime::now_utc() - created).as_seconds_f64());
                        }
                        tracing::info!(
                            reason = s.reason,
                            claimed_now = s.claimed_now,
                            not_after = %s.not_after,
                            "approved and signed"
                        );
                    }
                    None => tracing::info!(csr = %name, "recorded a certificate a stopped replica wrote"),
                }
            }
            Ok(false) => tracing::debug!(csr = %name, "already recorded"),
            Err(e) => tracing::warn!(csr = %name, error = %e, "cannot record the certificate written"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::workload::apply::tests::csr;

    #[test]
    fn only_a_recent_issuance_of_ours_is_looked_at_again() {
        use attestation::names::{SIGNER_INSECURE, SIGNER_KUBELET_SERVING};
        let now = OffsetDateTime::now_utc();
        let later = now + RECOVERY_WINDOW + time::Duration::seconds(1);
        assert!(maybe_unrecorded(&csr(SIGNER_INSECURE, &["Approved"], true), now, None));
        assert!(
            !maybe_unrecorded(&csr(SIGNER_INSECURE, &["Approved"], true), later, None),
            "long recorded or lost"
        );
        assert!(
            !maybe_unrecorded(&csr(SIGNER_INSECURE, &["Approved"], false), now, None),
            "no certificate yet"
        );
        assert!(!maybe_unrecorded(&csr(SIGNER_INSECURE, &["Denied"], false), now, None));
        assert!(
            !maybe_unrecorded(&csr(SIGNER_KUBELET_SERVING, &["Approved"], true), now, None),
            "kcm's"
        );
        assert!(!maybe_unrecorded(
            &csr("kubernetes.io/kube-apiserver-client-kubelet", &["Approved"], true),
            now,
            None
        ));
    }

    #[test]
    fn an_issuance_from_before_the_cluster_was_created_here_was_recorded_where_it_was_signed() {
        use attestation::names::SIGNER_INSECURE;
        let approved = csr(SIGNER_INSECURE, &["Approved"], true);
        let now = OffsetDateTime::now_utc();
        let second = time::Duration::seconds(1);
        assert!(
            maybe_unrecorded(&approved, now, Some(now - second * 2)),
            "approved after the Cluster was created here"
        );
        assert!(
            !maybe_unrecorded(&approved, now, Some(now + second * 2)),
            "approved before: for the Cluster's copy in the source of a move, and recorded there"
        );
        assert!(
            !maybe_unrecorded(&approved, now, Some(now)),
            "approved in the second of the creation: not known to be this management cluster's"
        );
    }
}
