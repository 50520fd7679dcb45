//! The record of an issuance (SPEC section 3, revision 5): the CSR's own `Approved` condition,
//! whose reason names the attestor and whose message names the Machine and the replica that
//! approved it, written through `/approval` before the certificate through `/status`.
//!
//! So a replica stopped between the certificate and its log line leaves the record all the
//! same, and recording costs no write in the management cluster: a join writes its claim there
//! and nothing more, a renewal nothing. What the pass that signed adds is the report: the
//! `certificates_issued_total` count, the latency histogram and the "approved and signed" log
//! line, in this process only. No Event is written per certificate: Events are the report of
//! what an operator must look at (refusals, cluster duties), folded per Machine and reason by
//! [`crate::controller::events`].

use attestation::machine::{TargetKind, TargetRef};
use attestation::names::BOOTSTRAP_USER_PREFIX;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use time::OffsetDateTime;

use super::worker::Worker;

/// The `Approved` condition's message: the decision's (it names the node, the attestor and the
/// Machine or pool instance), the Machine or MachinePool with its namespace, and the replica
/// approving it (`--replica-name` and process id, as in its Lease and Events).
pub(super) fn approval_message(decision_message: &str, target: Option<&TargetRef>, replica: &str) -> String {
    match target {
        Some(t) => {
            let kind = match t.kind {
                TargetKind::Machine => "Machine",
                TargetKind::MachinePool => "MachinePool",
            };
            format!(
                "{decision_message}; {kind} {}/{}, approved by replica {replica}",
                t.namespace, t.name
            )
        }
        None => format!("{decision_message}; approved by replica {replica}"),
    }
}

/// What the pass that signed knows of the issuance.
pub(super) struct Signed<'a> {
    /// The approval's reason.
    pub reason: &'a str,
    /// The certificate's NotAfter.
    pub not_after: String,
    /// Whether this pass claimed the Machine.
    pub claimed_now: bool,
    /// The CSR's creation, for the latency histogram.
    pub created: Option<OffsetDateTime>,
}

impl Worker {
    /// Reports the certificate this pass wrote on `csr` (see the module): counted, timed and
    /// logged, in the CSR's span (which names the cluster, the CSR and the Machine).
    pub(super) fn report_issuance(&self, csr: &CertificateSigningRequest, signed: &Signed<'_>) {
        let joined = csr
            .spec
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with(BOOTSTRAP_USER_PREFIX));
        let kind = if joined { "join" } else { "renewal" };
        self.shared.metrics.issued(&self.key, kind);
        if let Some(created) = signed.created {
            self.shared
                .metrics
                .issued_after((OffsetDateTime::now_utc() - created).as_seconds_f64());
        }
        tracing::info!(
            reason = signed.reason,
            claimed_now = signed.claimed_now,
            not_after = %signed.not_after,
            "approved and signed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_names_the_machine_and_the_replica() {
        let decided = "system:node:worker-0 attested by insecure/v1 for Machine worker-0";
        let machine = TargetRef::machine("worker-0", "prod", "u-1");
        assert_eq!(
            approval_message(decided, Some(&machine), "node-attestation-signer-7d9f_41"),
            "system:node:worker-0 attested by insecure/v1 for Machine worker-0; \
             Machine prod/worker-0, approved by replica node-attestation-signer-7d9f_41"
        );
        assert_eq!(
            approval_message("serving", None, "r_1"),
            "serving; approved by replica r_1"
        );
    }
}
