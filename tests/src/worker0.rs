//! The smallest world in which worker-0's request is approved: one opted-in Cluster, worker-0's
//! bootstrapped Machine and its KubeadmConfig (join token `abcdef`), no Node yet, the insecure
//! verifier. The suites that bend requests (`never_panic`, `csr_differential`) and the
//! benchmarks decide in it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use attestation::attestor::Verifiers;
use attestation::insecure::InsecureVerifier;
use attestation::machine::{ClusterView, Inventory, KubeadmConfigView, MachineView, NodeView};
use attestation::{Clock, CsrObject, Decision, Inputs};
use time::{Duration, OffsetDateTime};

use crate::capi;

/// worker-0's provider ID.
pub const PID: &str = "aws:///us-east-1a/i-0abc";

/// The Cluster, its inventory, the (empty) Node directory and the verifiers.
pub struct Worker0 {
    /// The Cluster.
    pub cluster: ClusterView,
    /// worker-0's Machine and KubeadmConfig (and whatever a caller adds).
    pub inventory: Inventory,
    /// No Node yet.
    pub nodes: Vec<NodeView>,
    /// `insecure/v1`.
    pub verifiers: Verifiers,
}

impl Worker0 {
    /// The world, the Cluster allowing `attestors` (a comma list).
    pub fn new(attestors: &str) -> Self {
        Self::with_provider_id(attestors, PID)
    }

    /// The world with worker-0's Machine at `provider_id` (a cloud's own form).
    pub fn with_provider_id(attestors: &str, provider_id: &str) -> Self {
        Self {
            cluster: ClusterView::from_object(&capi::cluster(attestors)).expect("fixture Cluster"),
            inventory: Inventory {
                index: Default::default(),
                machines: vec![
                    MachineView::from_object(&capi::machine("worker-0", Some(provider_id)))
                        .expect("fixture")
                        .into(),
                ],
                pools: Vec::new(),
                kubeadm_configs: vec![
                    KubeadmConfigView::from_object(&capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2"))
                        .expect("fixture")
                        .into(),
                ],
            },
            nodes: Vec::new(),
            verifiers: Verifiers::new().with(InsecureVerifier),
        }
    }

    /// The decision on `csr` at `now`, first seen then (`--csr-max-age` 15m).
    pub fn decide(&self, csr: &CsrObject, now: OffsetDateTime) -> Decision {
        self.decide_with(csr, now, &self.verifiers)
    }

    /// [`Worker0::decide`] with other verifiers (the cloud providers').
    pub fn decide_with(&self, csr: &CsrObject, now: OffsetDateTime, verifiers: &Verifiers) -> Decision {
        attestation::decide(&Inputs {
            csr,
            cluster: &self.cluster,
            inventory: &self.inventory,
            nodes: &self.nodes,
            csrs: &attestation::NoCsrs,
            verifiers,
            clock: Clock {
                now,
                first_seen: now,
                max_age: Duration::minutes(15),
            },
        })
        .expect("a kubelet client CSR")
    }
}
