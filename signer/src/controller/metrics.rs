//! Prometheus metrics. Every label is bounded: cluster names come from opted-in Clusters (an
//! operator's list), signer names and reasons from fixed sets; nothing a requester writes
//! becomes a label.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The Cluster, `<namespace>/<name>`.
    pub cluster: String,
    /// The CSR's signer name (one of ours).
    pub signer: String,
    /// `Approved`, `Denied`, `Retry`, `Failed`.
    pub decision: String,
    /// The condition reason (a SPEC name), or `Pending` for a retry.
    pub reason: String,
}

/// A watched cluster's state.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ClusterState {
    /// Watching its CSRs.
    Ready,
    /// Its workload apiserver does not answer (or answers errors); retried with backoff.
    Unreachable,
    /// `<cluster>-kubeconfig` or `<cluster>-ca` missing or unusable.
    SecretsInvalid,
    /// Refused: its CA certificate is also another opted-in Cluster's.
    SharedCa,
    /// Just gained: its CSRs are watched, its Machines still being listed (nothing is decided).
    Listing,
    /// Paused (`spec.paused` or the `cluster.x-k8s.io/paused` annotation): no worker runs, its
    /// CSRs stay pending and nothing is written for it until it is unpaused (SPEC section 7).
    Paused,
}

impl ClusterState {
    /// Every state, for resetting gauges.
    pub const ALL: [Self; 6] = [
        Self::Ready,
        Self::Unreachable,
        Self::SecretsInvalid,
        Self::SharedCa,
        Self::Listing,
        Self::Paused,
    ];
}

/// Which way a Cluster moved between replicas.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Direction {
    /// This replica took the Cluster over.
    Gained,
    /// This replica handed the Cluster to another (or was fenced).
    Released,
}

impl Direction {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gained => "gained",
            Self::Released => "released",
        }
    }
}

impl prometheus_client::encoding::EncodeLabelValue for Direction {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: ClusterState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

/// A hostile CSR's part the watch cache withheld: its cluster, and what (`request`: larger
/// than its signer name allows; `metadata`: annotations and labels past 16 KiB).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WithheldLabels {
    cluster: String,
    what: &'static str,
}

/// An issued client certificate: its cluster, and whether it was a join or a renewal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IssuedLabels {
    cluster: String,
    kind: &'static str,
}

/// How something the signer does for itself in the workload clusters went: bounded
/// (`issued`/`failed` for its certificates; `applied`/`refused`/`failed` for its RBAC).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// A change the signer made to a join token: bounded (`extended`, `deleted`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JoinTokenLabels {
    cluster: String,
    action: &'static str,
}

/// A kubeadm binding in a cluster: bounded (two binding names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BindingLabels {
    cluster: String,
    binding: String,
}

/// What became of an Event: `written`, `folded` (into a summary Event), `dropped` (queue full),
/// `paused` (not written: its Cluster was paused before it was).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventOutcomeLabels {
    /// `written`, `folded`, `dropped` or `paused`.
    pub outcome: String,
}

/// The gauges the fleet's in-flight limiter keeps current.
#[derive(Debug, Clone, Default)]
pub struct InFlightGauges {
    /// CSRs in flight now.
    pub in_flight: Gauge,
    /// The adaptive limit now.
    pub limit: Gauge,
}

/// The signer's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    in_flight: InFlightGauges,
    events: Family<EventOutcomeLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    issue_latency: Histogram,
    clusters: Family<StateLabels, Gauge>,
    legacy_autoapprove: Family<BindingLabels, Gauge>,
    legacy_binding_kept: Family<BindingLabels, Gauge>,
    nodes_outside: Family<ClusterLabels, Gauge>,
    legacy_csrs_pending: Family<ClusterLabels, Gauge>,
    ca_not_after: Family<ClusterLabels, Gauge>,
    oldest_waiting: Family<ClusterLabels, Gauge>,
    apply_errors: Family<ClusterLabels, Counter>,
    join_token_changes: Family<JoinTokenLabels, Counter>,
    workload_identity_certificates: Family<ResultLabels, Counter>,
    workload_rbac_applies: Family<ResultLabels, Counter>,
    issued: Family<IssuedLabels, Counter>,
    tpm_challenge_key_loaded: Gauge,
    queue_dropped: Family<ClusterLabels, Counter>,
    csrs_withheld: Family<WithheldLabels, Counter>,
    leader: Gauge,
    shard_members: Gauge,
    shard_fenced: Gauge,
    shard_clusters_owned: Gauge,
    shard_handovers: Family<DirectionLabels, Counter>,
    cached_objects: Family<KindLabels, Gauge>,
    workload_minor: Family<ClusterLabels, Gauge>,
    workload_limitations: Family<LimitationLabels, Gauge>,
    certificates_revoked: Family<RevokedLabels, Counter>,
    revoked_listed: Family<ClusterLabels, Gauge>,
    revocation_list_missing: Family<ClusterLabels, Gauge>,
    certificates_unrecorded: Family<ClusterLabels, Counter>,
    build_info: Family<BuildLabels, Gauge>,
    client_certificate_duration: Gauge,
    paused_alert_after: Gauge,
    paused_since: Family<ClusterLabels, Gauge>,
    identities_earliest_expiry: Family<ClusterLabels, Gauge>,
    templated_not_opted_in: Family<ClusterLabels, Gauge>,
}

/// The running build: one series, always 1, so that `absent()` says every replica is gone.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Labels of a revoked certificate.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevokedLabels {
    /// `<namespace>/<name>`.
    pub cluster: String,
    /// [`attestation::revocation::RevokeReason`]'s word.
    pub reason: String,
}

/// Labels of a workload minor's limitation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitationLabels {
    /// `<namespace>/<name>`.
    pub cluster: String,
    /// [`attestation::kubernetes_minor::Limitation`]'s name.
    pub limitation: &'static str,
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            in_flight: InFlightGauges::default(),
            events: Family::default(),
            decisions: Family::default(),
            // 50 ms .. ~100 s: a join is a few hundred ms; minutes mean a stuck cluster.
            issue_latency: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.05, 2.0, 12,
            )),
            clusters: Family::default(),
            legacy_autoapprove: Family::default(),
            legacy_binding_kept: Family::default(),
            nodes_outside: Family::default(),
            legacy_csrs_pending: Family::default(),
            ca_not_after: Family::default(),
            oldest_waiting: Family::default(),
            apply_errors: Family::default(),
            join_token_changes: Family::default(),
            workload_identity_certificates: Family::default(),
            workload_rbac_applies: Family::default(),
            issued: Family::default(),
            tpm_challenge_key_loaded: Gauge::default(),
            queue_dropped: Family::default(),
            csrs_withheld: Family::default(),
            leader: Gauge::default(),
            shard_members: Gauge::default(),
            shard_fenced: Gauge::default(),
            shard_clusters_owned: Gauge::default(),
            shard_handovers: Family::default(),
            cached_objects: Family::default(),
            workload_minor: Family::default(),
            workload_limitations: Family::default(),
            certificates_revoked: Family::default(),
            revoked_listed: Family::default(),
            revocation_list_missing: Family::default(),
            certificates_unrecorded: Family::default(),
            build_info: Family::default(),
            client_certificate_duration: Gauge::default(),
            paused_alert_after: Gauge::default(),
            paused_since: Family::default(),
            identities_earliest_expiry: Family::default(),
            templated_not_opted_in: Family::default(),
        };
        metrics
            .build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let r = registry.sub_registry_with_prefix("node_attestation");
        r.register(
            "decisions",
            "CSR decisions by cluster, signer, decision and reason",
            metrics.decisions.clone(),
        );
        r.register(
            "issue_latency_seconds",
            "Time from a client CSR's creation to its certificate being written",
            metrics.issue_latency.clone(),
        );
        r.register("clusters", "Opted-in clusters by state", metrics.clusters.clone());
        r.register(
            "csrs_in_flight",
            "CSRs being decided and applied now, across the clusters this replica serves",
            metrics.in_flight.in_flight.clone(),
        );
        r.register(
            "csrs_in_flight_limit",
            "The fleet's limit of CSRs in flight, adapted to how the apiservers answer",
            metrics.in_flight.limit.clone(),
        );
        r.register(
            "events",
            "Events by outcome: written as they are, folded into a per-Cluster summary under load, or dropped (queue full)",
            metrics.events.clone(),
        );
        r.register(
            "legacy_autoapprove_binding",
            "1 while a kubeadm auto-approve binding (node-autoapprove-bootstrap, node-autoapprove-certificate-rotation) exists in the workload cluster",
            metrics.legacy_autoapprove.clone(),
        );
        r.register(
            "legacy_binding_kept",
            "1 while the signer keeps kubeadm's rotation binding on purpose: Nodes outside attestation still renew through it",
            metrics.legacy_binding_kept.clone(),
        );
        r.register(
            "nodes_outside_attestation",
            "Nodes of the workload cluster whose Machine or pool instance holds no valid claim for them (they renew outside attestation)",
            metrics.nodes_outside.clone(),
        );
        r.register(
            "legacy_kubelet_csrs_pending",
            "CSRs for kubernetes.io/kube-apiserver-client-kubelet left pending in the workload cluster (kubeadm's TLS bootstrap or rotation, which the removed bindings no longer serve)",
            metrics.legacy_csrs_pending.clone(),
        );
        r.register(
            "cluster_ca_not_after_timestamp_seconds",
            "NotAfter of each served Cluster's CA (<cluster>-ca), in seconds since the epoch: issued certificates end there at the latest",
            metrics.ca_not_after.clone(),
        );
        r.register(
            "csr_oldest_waiting_seconds",
            "Age of the oldest CSR of each served Cluster still waiting for this signer (0 when none waits)",
            metrics.oldest_waiting.clone(),
        );
        r.register(
            "certificates_issued",
            "Client certificates issued, by cluster and kind (join: a bootstrap-token request; renewal: the node's own)",
            metrics.issued.clone(),
        );
        r.register(
            "apply_errors",
            "Decisions that could not be applied for an apiserver error (retried), by cluster",
            metrics.apply_errors.clone(),
        );
        r.register(
            "join_token_changes",
            "Join tokens the signer extended (a MachinePool's) or deleted (a claimed Machine's), by cluster and action",
            metrics.join_token_changes.clone(),
        );
        r.register(
            "workload_identity_certificates",
            "Client certificates the signer issued itself from a Cluster's CA to act as node-attestation-signer in its workload cluster (at a worker's start and on renewal), by result",
            metrics.workload_identity_certificates.clone(),
        );
        r.register(
            "workload_rbac_applies",
            "Server-side applies of the signer's workload RBAC with a Cluster's admin kubeconfig (at a worker's start), by result: applied, refused (401/403/4xx: the signer goes on as its own user), failed (retried)",
            metrics.workload_rbac_applies.clone(),
        );
        r.register(
            "tpm_challenge_key_loaded",
            "1 once the tpm/v1 challenge key is loaded from its Secret; 0 while tpm/v1 CSRs are held back for want of it",
            metrics.tpm_challenge_key_loaded.clone(),
        );
        r.register(
            "csrs_withheld",
            "CSRs of the signer's names the watch cache keeps without a part a hostile requester made large, by cluster and what: request (larger than its signer name allows; denied InvalidRequest) or metadata (annotations and labels past 16 KiB)",
            metrics.csrs_withheld.clone(),
        );
        r.register(
            "queue_dropped",
            "CSR names dropped because the cluster's queue was full (picked up again at resync)",
            metrics.queue_dropped.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease",
            metrics.leader.clone(),
        );
        r.register(
            "shard_members",
            "Signer replicas sharing the clusters, as this replica counts them: live, and new ones once none has arrived for 2 s (0 when not sharded)",
            metrics.shard_members.clone(),
        );
        r.register(
            "shard_fenced",
            "1 while this replica could not renew its membership Lease in time and serves no cluster",
            metrics.shard_fenced.clone(),
        );
        r.register(
            "shard_clusters_owned",
            "Opted-in clusters assigned to this replica (served, or held back by their own problem)",
            metrics.shard_clusters_owned.clone(),
        );
        r.register(
            "shard_handovers",
            "Clusters this replica took over (gained) or handed to another (released)",
            metrics.shard_handovers.clone(),
        );
        r.register(
            "cached_objects",
            "Cluster API objects this replica keeps, by kind: those of the Clusters it serves",
            metrics.cached_objects.clone(),
        );
        r.register(
            "workload_kubernetes_minor",
            "The Kubernetes minor each workload cluster's apiserver reports (/version)",
            metrics.workload_minor.clone(),
        );
        r.register(
            "workload_limitations",
            "1 for each thing a workload cluster's Kubernetes minor lacks that changes what its node identities can do or what revocation refuses (WiderNodeReads, NoCredentialId, NoAdmissionPolicy)",
            metrics.workload_limitations.clone(),
        );
        r.register(
            "certificates_revoked",
            "Certificates the signer listed as revoked in their workload cluster, by reason (MachineGone, MachineReleased, ClaimReplaced, PoolInstanceGone, PoolGone, Operator)",
            metrics.certificates_revoked.clone(),
        );
        r.register(
            "revoked_listed",
            "Entries of each workload cluster's revoked list (kube-system/node-attestation-revoked), pruned as certificates expire",
            metrics.revoked_listed.clone(),
        );
        r.register(
            "revocation_list_missing",
            "1 while a workload cluster's revoked list is missing: its admission policy refuses nothing revoked",
            metrics.revocation_list_missing.clone(),
        );
        r.register(
            "certificates_unrecorded",
            "Certificates issued without a record because the workload cluster refused the signer its record ConfigMaps (its RBAC predates revocation): they cannot be revoked",
            metrics.certificates_unrecorded.clone(),
        );
        r.register(
            "build_info",
            "1, labelled with the signer's version: every replica exports it, so its absence from every scrape means no replica runs (NodeAttestationSignerAbsent)",
            metrics.build_info.clone(),
        );
        r.register(
            "client_certificate_duration_seconds",
            "The lifetime this replica gives client certificates (--client-cert-duration): nodes tolerate an outage of 45% of it (the plugin renews from half of it)",
            metrics.client_certificate_duration.clone(),
        );
        r.register(
            "paused_cluster_alert_after_seconds",
            "How long a Cluster may stay paused before NodeAttestationClusterPausedLong fires (--paused-cluster-alert-after)",
            metrics.paused_alert_after.clone(),
        );
        r.register(
            "cluster_paused_since_timestamp_seconds",
            "When each paused Cluster this replica owns was paused (its Paused condition's lastTransitionTime, else when this replica first saw it paused), in seconds since the epoch: its nodes renew nothing meanwhile",
            metrics.paused_since.clone(),
        );
        r.register(
            "cluster_templated_not_opted_in",
            "1 for each Cluster (of this replica's share) that is not opted in although its control plane or a MachineDeployment's bootstrap template runs kubelet-authenticator: its new nodes wait for an answer no signer gives",
            metrics.templated_not_opted_in.clone(),
        );
        r.register(
            "identities_earliest_expiry_timestamp_seconds",
            "For each served Cluster, when the first of its live nodes' newest recorded certificates expires, in seconds since the epoch: the moment a node loses its identity if nothing renews before",
            metrics.identities_earliest_expiry.clone(),
        );
        metrics
    }

    /// The Clusters found templated with the plugin but not opted in; the others lose their series.
    pub fn templated_not_opted_in(&self, clusters: &[String]) {
        self.templated_not_opted_in.clear();
        for cluster in clusters {
            self.templated_not_opted_in
                .get_or_create(&ClusterLabels {
                    cluster: cluster.clone(),
                })
                .set(1);
        }
    }

    /// The lifetime given to client certificates (`--client-cert-duration`).
    pub fn client_certificate_duration(&self, duration: std::time::Duration) {
        self.client_certificate_duration
            .set(i64::try_from(duration.as_secs()).unwrap_or(i64::MAX));
    }

    /// How long a Cluster may stay paused before the alert (`--paused-cluster-alert-after`).
    pub fn paused_cluster_alert_after(&self, after: std::time::Duration) {
        self.paused_alert_after
            .set(i64::try_from(after.as_secs()).unwrap_or(i64::MAX));
    }

    /// When each paused Cluster this replica owns was paused; the others lose their series.
    pub fn paused_since(&self, paused: &[(String, i64)]) {
        self.paused_since.clear();
        for (cluster, since) in paused {
            self.paused_since
                .get_or_create(&ClusterLabels {
                    cluster: cluster.clone(),
                })
                .set(*since);
        }
    }

    /// When the first of `cluster`'s live nodes loses its identity without a renewal; `None`
    /// (no recorded certificate of a live node) removes the series.
    pub fn identities_earliest_expiry(&self, cluster: &str, at: Option<i64>) {
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        match at {
            Some(at) => {
                self.identities_earliest_expiry.get_or_create(&labels).set(at);
            }
            None => {
                self.identities_earliest_expiry.remove(&labels);
            }
        }
    }

    /// Counts a certificate of `cluster` issued unrecorded.
    pub fn certificate_unrecorded(&self, cluster: &str) {
        self.certificates_unrecorded
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .inc();
    }

    /// Counts a revoked certificate of `cluster`.
    pub fn certificate_revoked(&self, cluster: &str, reason: &str) {
        self.certificates_revoked
            .get_or_create(&RevokedLabels {
                cluster: cluster.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The entries of `cluster`'s revoked list.
    pub fn revoked_listed(&self, cluster: &str, entries: usize) {
        self.revoked_listed
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Whether `cluster`'s revoked list is missing.
    pub fn revocation_list_missing(&self, cluster: &str, missing: bool) {
        self.revocation_list_missing
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .set(i64::from(missing));
    }

    /// A workload cluster's minor, and what it lacks.
    pub fn workload_minor(&self, cluster: &str, version: &attestation::kubernetes_minor::ApiserverVersion) {
        self.workload_minor
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .set(i64::from(version.minor));
        let lacks = version.limitations();
        for limitation in attestation::kubernetes_minor::Limitation::ALL {
            let labels = LimitationLabels {
                cluster: cluster.to_owned(),
                limitation: limitation.as_str(),
            };
            if lacks.contains(&limitation) {
                self.workload_limitations.get_or_create(&labels).set(1);
            } else {
                self.workload_limitations.remove(&labels);
            }
        }
    }

    /// Objects kept by the shard's caches, by kind.
    pub fn cached_objects(&self, counts: &[(&str, usize)]) {
        for (kind, n) in counts {
            self.cached_objects
                .get_or_create(&KindLabels {
                    kind: (*kind).to_owned(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// The in-flight gauges, for the limiter to keep current.
    pub fn in_flight_gauges(&self) -> InFlightGauges {
        self.in_flight.clone()
    }

    /// The Event outcome counters, for the Event sink.
    pub fn event_outcomes(&self) -> Family<EventOutcomeLabels, Counter> {
        self.events.clone()
    }

    /// Counts one decision.
    pub fn decision(&self, labels: DecisionLabels) {
        self.decisions.get_or_create(&labels).inc();
    }

    /// Records a creation-to-issued latency.
    pub fn issued_after(&self, seconds: f64) {
        self.issue_latency.observe(seconds.max(0.0));
    }

    /// Sets the number of clusters in each state.
    pub fn cluster_states(&self, counts: &[(ClusterState, i64)]) {
        for state in ClusterState::ALL {
            let n = counts.iter().filter(|(s, _)| *s == state).map(|(_, n)| n).sum();
            self.clusters.get_or_create(&StateLabels { state }).set(n);
        }
    }

    /// The CAs of the Clusters this replica serves now: (cluster, NotAfter in Unix seconds).
    /// Clusters no longer served lose their series.
    pub fn ca_expiries(&self, cas: &[(String, i64)]) {
        self.ca_not_after.clear();
        for (cluster, not_after) in cas {
            self.ca_not_after
                .get_or_create(&ClusterLabels {
                    cluster: cluster.clone(),
                })
                .set(*not_after);
        }
    }

    /// The age of each served Cluster's oldest waiting CSR, in seconds (0: none waits).
    /// Clusters no longer served lose their series.
    pub fn oldest_waiting(&self, ages: &[(String, i64)]) {
        self.oldest_waiting.clear();
        for (cluster, age) in ages {
            self.oldest_waiting
                .get_or_create(&ClusterLabels {
                    cluster: cluster.clone(),
                })
                .set(*age);
        }
    }

    /// A client certificate issued in `cluster`, a `join` or a `renewal`.
    pub fn issued(&self, cluster: &str, kind: &'static str) {
        self.issued
            .get_or_create(&IssuedLabels {
                cluster: cluster.to_owned(),
                kind,
            })
            .inc();
    }

    /// A decision of `cluster` that could not be applied.
    pub fn apply_error(&self, cluster: &str) {
        self.apply_errors
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .inc();
    }

    /// A join token of `cluster` extended or deleted (`action`).
    pub fn join_token_change(&self, cluster: &str, action: &'static str) {
        self.join_token_changes
            .get_or_create(&JoinTokenLabels {
                cluster: cluster.to_owned(),
                action,
            })
            .inc();
    }

    /// One of the signer's own workload certificates issued or failed (`result`).
    pub fn workload_identity_certificate(&self, result: &'static str) {
        self.workload_identity_certificates
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// One apply of the signer's workload RBAC, by `result`.
    pub fn workload_rbac_apply(&self, result: &'static str) {
        self.workload_rbac_applies.get_or_create(&ResultLabels { result }).inc();
    }

    /// Whether the `tpm/v1` challenge key is loaded.
    pub fn tpm_challenge_key(&self, loaded: bool) {
        self.tpm_challenge_key_loaded.set(i64::from(loaded));
    }

    /// Reports a legacy binding's presence in `cluster`.
    pub fn legacy_autoapprove(&self, cluster: &str, binding: &str, present: bool) {
        self.legacy_autoapprove
            .get_or_create(&BindingLabels {
                cluster: cluster.to_owned(),
                binding: binding.to_owned(),
            })
            .set(i64::from(present));
    }

    /// Whether the signer keeps `binding` of `cluster` on purpose (Nodes outside attestation).
    pub fn legacy_binding_kept(&self, cluster: &str, binding: &str, kept: bool) {
        self.legacy_binding_kept
            .get_or_create(&BindingLabels {
                cluster: cluster.to_owned(),
                binding: binding.to_owned(),
            })
            .set(i64::from(kept));
    }

    /// The Nodes of `cluster` outside attestation, and its pending legacy kubelet CSRs.
    pub fn outside_attestation(&self, cluster: &str, nodes: usize, legacy_csrs: usize) {
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        self.nodes_outside
            .get_or_create(&labels)
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
        self.legacy_csrs_pending
            .get_or_create(&labels)
            .set(i64::try_from(legacy_csrs).unwrap_or(i64::MAX));
    }

    /// Forgets a cluster's per-cluster series once it is no longer watched.
    pub fn forget_cluster(&self, cluster: &str) {
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        for binding in super::kubeadm::LEGACY_AUTOAPPROVE_BINDINGS {
            let labels = BindingLabels {
                cluster: cluster.to_owned(),
                binding: binding.name.to_owned(),
            };
            self.legacy_autoapprove.remove(&labels);
            self.legacy_binding_kept.remove(&labels);
        }
        self.nodes_outside.remove(&labels);
        self.legacy_csrs_pending.remove(&labels);
        self.workload_minor.remove(&labels);
        self.revoked_listed.remove(&labels);
        self.revocation_list_missing.remove(&labels);
        self.certificates_unrecorded.remove(&labels);
        self.identities_earliest_expiry.remove(&labels);
        for reason in attestation::revocation::RevokeReason::ALL {
            self.certificates_revoked.remove(&RevokedLabels {
                cluster: cluster.to_owned(),
                reason: reason.as_str().to_owned(),
            });
        }
        for limitation in attestation::kubernetes_minor::Limitation::ALL {
            self.workload_limitations.remove(&LimitationLabels {
                cluster: cluster.to_owned(),
                limitation: limitation.as_str(),
            });
        }
        self.queue_dropped.remove(&labels);
        for what in ["request", "metadata"] {
            self.csrs_withheld.remove(&WithheldLabels {
                cluster: cluster.to_owned(),
                what,
            });
        }
    }

    /// Counts a CSR part the watch cache withheld (`request` or `metadata`).
    pub fn csr_withheld(&self, cluster: &str, what: &'static str) {
        self.csrs_withheld
            .get_or_create(&WithheldLabels {
                cluster: cluster.to_owned(),
                what,
            })
            .inc();
    }

    /// Counts a dropped queue entry.
    pub fn queue_dropped(&self, cluster: &str) {
        self.queue_dropped
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .inc();
    }

    /// Sets the leader gauge.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Sets the shard gauges: live members, and whether this replica is fenced.
    pub fn shard_view(&self, members: usize, fenced: bool) {
        self.shard_members.set(i64::try_from(members).unwrap_or(i64::MAX));
        self.shard_fenced.set(i64::from(fenced));
    }

    /// Sets the number of opted-in clusters assigned to this replica.
    pub fn shard_clusters_owned(&self, owned: usize) {
        self.shard_clusters_owned.set(i64::try_from(owned).unwrap_or(i64::MAX));
    }

    /// Counts `n` hand-overs in `direction`.
    pub fn shard_handovers(&self, direction: Direction, n: usize) {
        self.shard_handovers
            .get_or_create(&DirectionLabels { direction })
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

/// The text exposition of `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_minor_and_revocation_series_go_with_it() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let old = attestation::kubernetes_minor::ApiserverVersion::parse("1", "30", "v1.30.0").unwrap();
        for cluster in ["team-a/prod", "team-a/dev"] {
            m.workload_minor(cluster, &old);
            m.revoked_listed(cluster, 2);
            m.revocation_list_missing(cluster, false);
            m.certificate_revoked(cluster, "MachineGone");
            m.certificate_unrecorded(cluster);
        }
        let text = encode(&registry);
        assert!(
            text.contains(
                r#"node_attestation_workload_limitations{cluster="team-a/prod",limitation="NoCredentialId"} 1"#
            ),
            "{text}"
        );
        // Upgraded: the limitations clear.
        let upgraded = attestation::kubernetes_minor::ApiserverVersion::parse("1", "32", "v1.32.0").unwrap();
        m.workload_minor("team-a/dev", &upgraded);
        let text = encode(&registry);
        assert!(
            !text.contains(r#"node_attestation_workload_limitations{cluster="team-a/dev""#),
            "{text}"
        );
        m.forget_cluster("team-a/prod");
        let text = encode(&registry);
        let series = |cluster: &str| {
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains(&format!("cluster=\"{cluster}\"")))
                .count()
        };
        assert_eq!(series("team-a/prod"), 0, "{text}");
        assert_eq!(series("team-a/dev"), 5, "{text}");
    }

    #[test]
    fn ca_expiries_follow_the_served_clusters_and_the_challenge_key_is_reported() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.ca_expiries(&[
            ("team-a/prod".into(), 1_900_000_000),
            ("team-a/dev".into(), 1_800_000_000),
        ]);
        m.ca_expiries(&[("team-a/prod".into(), 1_900_000_000)]);
        m.tpm_challenge_key(true);
        m.oldest_waiting(&[("team-a/prod".into(), 0)]);
        m.apply_error("team-a/prod");
        m.join_token_change("team-a/prod", "deleted");
        m.issued("team-a/prod", "join");
        let text = encode(&registry);
        assert!(
            text.contains(r#"node_attestation_certificates_issued_total{cluster="team-a/prod",kind="join"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"node_attestation_csr_oldest_waiting_seconds{cluster="team-a/prod"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"node_attestation_apply_errors_total{cluster="team-a/prod"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"node_attestation_join_token_changes_total{cluster="team-a/prod",action="deleted"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"node_attestation_cluster_ca_not_after_timestamp_seconds{cluster="team-a/prod"} 1900000000"#
            ),
            "{text}"
        );
        assert!(
            !text.contains("team-a/dev"),
            "a Cluster no longer served keeps no series: {text}"
        );
        assert!(text.contains("node_attestation_tpm_challenge_key_loaded 1"), "{text}");
    }

    #[test]
    fn decisions_and_states_are_exposed() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.decision(DecisionLabels {
            cluster: "team-a/prod".into(),
            signer: "s".into(),
            decision: "Denied".into(),
            reason: "MachineNotFound".into(),
        });
        m.cluster_states(&[
            (ClusterState::Ready, 2),
            (ClusterState::SharedCa, 1),
            (ClusterState::Paused, 1),
            (ClusterState::Paused, 1),
        ]);
        m.issued_after(0.3);
        let text = encode(&registry);
        assert!(
            text.contains(r#"node_attestation_decisions_total{cluster="team-a/prod",signer="s",decision="Denied",reason="MachineNotFound"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"node_attestation_clusters{state="Ready"} 2"#), "{text}");
        assert!(
            text.contains(r#"node_attestation_clusters{state="Paused"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"node_attestation_clusters{state="Unreachable"} 0"#),
            "{text}"
        );
        assert!(
            text.contains("node_attestation_issue_latency_seconds_count 1"),
            "{text}"
        );
    }

    #[test]
    fn the_outage_series_are_exposed_and_follow_their_clusters() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.client_certificate_duration(std::time::Duration::from_secs(168 * 3600));
        m.paused_cluster_alert_after(std::time::Duration::from_secs(86_400));
        m.paused_since(&[("team-a/prod".into(), 1_800_000_000), ("team-a/dev".into(), 1)]);
        m.paused_since(&[("team-a/prod".into(), 1_800_000_000)]);
        m.identities_earliest_expiry("team-a/prod", Some(1_900_000_000));
        m.identities_earliest_expiry("team-a/dev", Some(1_900_000_000));
        m.identities_earliest_expiry("team-a/dev", None);
        m.identities_earliest_expiry("team-a/gone", Some(1));
        m.forget_cluster("team-a/gone");
        let text = encode(&registry);
        for line in [
            concat!(
                r#"node_attestation_build_info{version=""#,
                env!("CARGO_PKG_VERSION"),
                r#""} 1"#
            ),
            "node_attestation_client_certificate_duration_seconds 604800",
            "node_attestation_paused_cluster_alert_after_seconds 86400",
            r#"node_attestation_cluster_paused_since_timestamp_seconds{cluster="team-a/prod"} 1800000000"#,
            r#"node_attestation_identities_earliest_expiry_timestamp_seconds{cluster="team-a/prod"} 1900000000"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("team-a/dev") && !text.contains("team-a/gone"), "{text}");
    }

    #[test]
    fn shard_gauges_and_handovers_are_exposed() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.shard_view(3, false);
        m.shard_clusters_owned(11);
        m.shard_handovers(Direction::Gained, 11);
        m.shard_handovers(Direction::Released, 2);
        m.shard_handovers(Direction::Released, 1);
        let text = encode(&registry);
        for line in [
            "node_attestation_shard_members 3",
            "node_attestation_shard_fenced 0",
            "node_attestation_shard_clusters_owned 11",
            r#"node_attestation_shard_handovers_total{direction="gained"} 11"#,
            r#"node_attestation_shard_handovers_total{direction="released"} 3"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
