//! `node-attestation-signer run`'s flags. Every flag also reads an environment variable, so the
//! Deployment can set them either way.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How replicas share the clusters when `--leader-elect` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Coordination {
    /// One replica holds the leader Lease and serves every cluster; the others stand by.
    Leader,
    /// Every replica renews its own membership Lease and serves its share of the clusters.
    Shard,
}

/// Arguments of `run`. Every flag also reads an environment variable.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster (default: in-cluster, then `~/.kube/config`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Watch Clusters in this namespace only (default: all namespaces).
    #[arg(long, env = "SIGNER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Longest client certificate lifetime.
    #[arg(long, env = "SIGNER_CLIENT_CERT_DURATION", default_value = "168h", value_parser = humantime::parse_duration)]
    pub client_cert_duration: std::time::Duration,
    /// How long a Cluster may stay paused before `NodeAttestationClusterPausedLong` fires: the
    /// signer exports it (`node_attestation_paused_cluster_alert_after_seconds`) for the rule to
    /// compare with, so the threshold is set here rather than by patching the rule.
    #[arg(long, env = "SIGNER_PAUSED_CLUSTER_ALERT_AFTER", default_value = "24h", value_parser = humantime::parse_duration)]
    pub paused_cluster_alert_after: std::time::Duration,
    /// How long transient gaps are retried before a CSR is denied `Expired`.
    #[arg(long, env = "SIGNER_CSR_MAX_AGE", default_value = "15m", value_parser = humantime::parse_duration)]
    pub csr_max_age: std::time::Duration,
    /// Keep kubeadm's `kubeadm:node-autoapprove-bootstrap` and
    /// `kubeadm:node-autoapprove-certificate-rotation` bindings (still reported).
    #[arg(long, env = "SIGNER_KEEP_LEGACY_AUTOAPPROVE")]
    pub keep_legacy_autoapprove: bool,
    /// Leave every Cluster's join tokens to Cluster API's bootstrap provider: keep no
    /// MachinePool's token valid and delete no claimed Machine's (SPEC section 7; one Cluster:
    /// annotate it `cluster.x-k8s.io/kubelet-join-tokens: leave`).
    #[arg(long, env = "SIGNER_LEAVE_JOIN_TOKENS")]
    pub leave_join_tokens: bool,
    /// How far ahead a MachinePool's join token is kept valid: its `expiration` is moved to
    /// now + this whenever less than half of it is left. Must exceed 6/5 of the bootstrap
    /// provider's `--bootstrap-token-ttl` (default 15m) by the resync period, or the provider
    /// rotates the token anyway.
    #[arg(long, env = "SIGNER_JOIN_TOKEN_LIFETIME", default_value = "48h", value_parser = humantime::parse_duration)]
    pub join_token_lifetime: std::time::Duration,
    /// Coordinate replicas through coordination.k8s.io Leases (`--coordination`); false: this
    /// one process serves every opted-in cluster.
    #[arg(long, env = "SIGNER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// With `--leader-elect`: `leader` (one replica serves every cluster, the others stand by)
    /// or `shard` (every replica serves the clusters assigned to it; needs list, watch and
    /// delete on Leases, as config/rbac grants).
    #[arg(long, env = "SIGNER_COORDINATION", value_enum, default_value_t = Coordination::Leader)]
    pub coordination: Coordination,
    /// This replica's stable name (`--coordination=shard`: its membership Lease is
    /// `<--leader-election-id>-<name>`). Default: the host name.
    #[arg(long, env = "POD_NAME")]
    pub replica_name: Option<String>,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "node-attestation-system")]
    pub leader_election_namespace: String,
    /// Name of the leader Lease; with `--coordination=shard`, the prefix of the member Leases
    /// and the value of their `node-attestation.cluster.x-k8s.io/signer-member` label.
    #[arg(long, env = "SIGNER_LEADER_ELECTION_ID", default_value = "node-attestation-signer")]
    pub leader_election_id: String,
    /// Address of `/metrics`.
    #[arg(long, env = "SIGNER_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    #[arg(long, env = "SIGNER_HEALTH_PROBE_BIND_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: SocketAddr,
    /// Log format.
    #[arg(long, env = "SIGNER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How often undecided CSRs are looked at again and cluster Secrets re-read.
    #[arg(long, env = "SIGNER_RESYNC_PERIOD", default_value = "30s", value_parser = humantime::parse_duration)]
    pub resync_period: std::time::Duration,
    /// How often a served Cluster's `<cluster>-kubeconfig` and `<cluster>-ca` are read again
    /// (they are also read at once when the Cluster changes); rotation takes effect within it.
    #[arg(long, env = "SIGNER_SECRET_RESYNC_PERIOD", default_value = "5m", value_parser = humantime::parse_duration)]
    pub secret_resync_period: std::time::Duration,
    /// Most CSR names queued per cluster; more are picked up at the next resync.
    #[arg(long, env = "SIGNER_QUEUE_CAPACITY", default_value_t = 1000)]
    pub queue_capacity: usize,
    /// Most bytes of CSR requests the watch cache holds per workload cluster (SPEC section 7, "A
    /// hostile workload cluster"). Past it, a pending CSR is held without its request and read
    /// from the apiserver when it is decided: a flood costs a read per CSR, never a lost join.
    #[arg(long, env = "SIGNER_CSR_REQUEST_BYTES_PER_CLUSTER", default_value_t = 32 * 1024 * 1024)]
    pub csr_request_bytes_per_cluster: usize,
    /// Most CSRs of one cluster in flight at once. The fleet's limit, adapted to how the
    /// apiservers answer, applies on top and is shared among busy clusters in turn.
    #[arg(long, env = "SIGNER_CONCURRENCY_PER_CLUSTER", default_value_t = 64)]
    pub concurrency_per_cluster: usize,
    /// Lifetime of the client certificate the signer issues itself from `<cluster>-ca` to talk
    /// to a workload cluster as user `node-attestation-signer` (renewed after two thirds of
    /// it; its key never leaves memory). Not used for a Cluster whose
    /// `<cluster>-node-attestation-kubeconfig` Secret gives the signer a kubeconfig of the
    /// operator's own. At least 3m.
    #[arg(long, env = "SIGNER_WORKLOAD_CERTIFICATE_DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub workload_certificate_duration: std::time::Duration,
    /// Timeout of workload-cluster requests.
    #[arg(long, env = "SIGNER_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: std::time::Duration,
    /// `tpm/v1`: PEM bundle of EK CA certificates (a file, or a folder of `*.pem` files such as
    /// the shipped vendors' bundle); an EK whose certificate chains to one is trusted (validity
    /// dates are not enforced). Without it only pinned or claimed EKs are.
    #[arg(long, env = "SIGNER_TPM_EK_CA_BUNDLE")]
    pub tpm_ek_ca_bundle: Option<PathBuf>,
    /// `tpm/v1`: accept an EK with neither chain nor pin for an unclaimed Machine (it is then
    /// recorded in the claim and required from then on).
    #[arg(long, env = "SIGNER_TPM_TRUST_ON_FIRST_USE")]
    pub tpm_trust_on_first_use: bool,
    /// `tpm/v1`: Secret (in the signer's namespace) holding the key challenge secrets are
    /// derived under; created when missing.
    #[arg(
        long,
        env = "SIGNER_TPM_CHALLENGE_KEY_SECRET",
        default_value = "node-attestation-signer-tpm-challenge"
    )]
    pub tpm_challenge_key_secret: String,
    /// `tpm/v1`: the boot policy (revision 5) of every Cluster without a
    /// `cluster.x-k8s.io/kubelet-tpm-boot-policy` annotation: `<namespace>/<name>` of a ConfigMap
    /// whose `policy.yaml` holds it. Without it such Clusters have none (revision 4: any boot).
    #[arg(long, env = "SIGNER_TPM_BOOT_POLICY", value_name = "NAMESPACE/NAME")]
    pub tpm_boot_policy: Option<String>,
    /// `tpm/v1`: the operator's floor under every Cluster's boot policy (revision 6).
    #[command(flatten)]
    pub tpm_boot_policy_floor: crate::controller::boot_policy::Floor,
    /// The cloud identity providers (`gcp/v1`, `aws/v1`, `azure/v1`).
    #[command(flatten)]
    pub cloud: crate::cloud::CloudArgs,
    /// `tpm/v1` and `azure/v1`: how long a challenge may go unanswered (one TTL serves both
    /// providers' challenges).
    #[arg(long, env = "SIGNER_TPM_CHALLENGE_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub tpm_challenge_ttl: std::time::Duration,
}
