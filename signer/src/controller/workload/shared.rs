//! What every workload cluster's worker shares: the management cache, metrics, Events, the
//! fleet's slots, the verifiers and the tunables. The fleet builds one at start and hands it to
//! each worker it starts; nothing here does work of its own.

use std::sync::Arc;
use std::time::Duration;

use attestation::attestor::Verifiers;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::Semaphore;

use super::inflight::InFlight;
use crate::controller::challenge_key::ChallengeKeyLoader;
use crate::controller::events::EventSink;
use crate::controller::management::Management;
use crate::controller::metrics::Metrics;

/// The controller's tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Longest client certificate lifetime.
    pub client_cert_duration: time::Duration,
    /// How long transient gaps are retried before `Expired`.
    pub csr_max_age: time::Duration,
    /// Leave kubeadm's auto-approve binding in place (still reported).
    pub keep_legacy_autoapprove: bool,
    /// Leave join tokens to the bootstrap provider (`--leave-join-tokens`).
    pub leave_join_tokens: bool,
    /// How far ahead a MachinePool's join token is kept valid.
    pub join_token_lifetime: time::Duration,
    /// How often every undecided CSR is looked at again, the legacy binding checked, and the
    /// Secrets of a Cluster that could not be served re-read.
    pub resync: Duration,
    /// How often a served Cluster's Secrets are read again (rotation takes effect within it).
    pub secret_resync: Duration,
    /// Bound of each cluster's queue.
    pub queue_capacity: usize,
    /// Most bytes of CSR requests the watch cache holds per cluster (workload::intake).
    pub csr_request_bytes: usize,
    /// Most CSRs of one cluster in flight at once (the fleet's adaptive limit applies on top).
    pub concurrency: usize,
    /// Timeout of each workload-cluster request.
    pub request_timeout: Duration,
    /// Lifetime of the signer's own client certificate in each workload cluster.
    pub workload_certificate_duration: time::Duration,
}

/// What every worker shares.
pub struct Shared {
    /// The management cluster.
    pub management: Arc<Management>,
    /// Metrics.
    pub metrics: Metrics,
    /// Events in the management cluster written at once (cluster duties of the fleet).
    pub recorder: Recorder,
    /// Who writes the Events (this replica), for those written without the recorder.
    pub reporter: Reporter,
    /// Events of decisions and cluster duties: queued, rate-limited, folded under load.
    pub events: EventSink,
    /// The fleet's slots for CSRs in flight, adapted to how the apiservers answer.
    pub in_flight: Arc<InFlight>,
    /// Attestation verifiers.
    pub verifiers: Verifiers,
    /// Loads the `tpm/v1` challenge key the verifiers derive under, when a TPM CSR needs it.
    pub challenge_key: Arc<ChallengeKeyLoader>,
    /// The `tpm/v1` boot policies, read for the Clusters that name one (or the default).
    pub boot_policies: Arc<crate::controller::boot_policy::BootPolicies>,
    /// Google's keys and STS's answers, fetched when a cloud verifier asks.
    pub cloud: Arc<crate::cloud::Cloud>,
    /// Decisions (the CPU-bound part) across all clusters, as many at once as cores.
    pub crypto: Semaphore,
    /// Tunables.
    pub settings: Settings,
    /// A worker's state changed: the fleet reports the cluster gauges again at once, not at its
    /// next pass (up to `--resync-period` later, when a gained Cluster would show `Unreachable`
    /// for 30 s after its CSRs are watched).
    pub states_changed: tokio::sync::Notify,
}
