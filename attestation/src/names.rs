//! The names of the contract (SPEC section 2): OIDs, PEM labels, signer names, annotations.
//!
//! Everything an apiserver, a node or an operator sees spelled out lives here, once.

/// Provider-ID X.509 extension: OID `1.3.6.1.4.1.11129.2.1.21`, non-critical, value a DER UTF8String.
pub const PROVIDER_ID_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 11129, 2, 1, 21];
/// [`PROVIDER_ID_OID`] in dotted form, as parsed extensions name it.
pub const PROVIDER_ID_OID_DOTTED: &str = "1.3.6.1.4.1.11129.2.1.21";

/// PEM label of block 1 (PKCS#10).
pub const PEM_CSR: &str = "CERTIFICATE REQUEST";
/// PEM label of block 2: `<provider>/<version>`.
pub const PEM_PROVIDER: &str = "KUBELET AUTHENTICATOR ATTESTATION PROVIDER";
/// PEM label of block 3: provider-specific bytes.
pub const PEM_DATA: &str = "KUBELET AUTHENTICATOR ATTESTATION DATA";

/// Client signer for `insecure/v1`.
pub const SIGNER_INSECURE: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-insecure";
/// Client signer for `tpm/v1`.
pub const SIGNER_TPM: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-tpm";
/// Client signer for `gcp/v1`.
pub const SIGNER_GCP: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-gcp";
/// Client signer for `aws/v1`.
pub const SIGNER_AWS: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-aws";
/// Client signer for `azure/v1`.
pub const SIGNER_AZURE: &str = "cluster.x-k8s.io/kube-apiserver-client-kubelet-azure";
/// Serving CSRs this signer approves (the workload cluster's controller-manager signs them).
pub const SIGNER_KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// Cluster opt-in annotation (value `"true"`).
pub const ANNOTATION_OPT_IN: &str = "cluster.x-k8s.io/kubelet-authentication";
/// Cluster allowed attestors (comma list of provider names).
pub const ANNOTATION_ALLOWED_ATTESTORS: &str = "cluster.x-k8s.io/kubelet-authorized-attestors";
/// Cluster list of the IAM roles whose instance-profile sessions prove an instance with `aws/v1`
/// (comma list of role names; required for `aws/v1`, SPEC section 5).
pub const ANNOTATION_AWS_ROLES: &str = "cluster.x-k8s.io/kubelet-aws-roles";
/// Cluster allow-list of AWS account IDs that may attest with `aws/v1` (comma list).
pub const ANNOTATION_AWS_ACCOUNTS: &str = "cluster.x-k8s.io/kubelet-aws-accounts";
/// Cluster allow-list of GCP project IDs that may attest with `gcp/v1` (comma list).
pub const ANNOTATION_GCP_PROJECTS: &str = "cluster.x-k8s.io/kubelet-gcp-projects";
/// Cluster allow-list of Azure subscription IDs that may attest with `azure/v1` (comma list).
pub const ANNOTATION_AZURE_SUBSCRIPTIONS: &str = "cluster.x-k8s.io/kubelet-azure-subscriptions";
/// EK pin on a Machine or MachinePool (comma list of lowercase hex SHA-256).
pub const ANNOTATION_EK_PIN: &str = "cluster.x-k8s.io/tpm-ek-sha256";
/// Cluster API's pause annotation: present (any value) on a Cluster, Cluster API's controllers
/// and the signer leave the Cluster alone (SPEC section 7, "Paused Clusters").
pub const ANNOTATION_PAUSED: &str = "cluster.x-k8s.io/paused";

/// The label Cluster API puts on the objects of a Cluster (a KubeadmConfig's only link to its
/// Cluster: its spec has no `clusterName`).
pub const LABEL_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
/// The signer's claim on a Machine (one JSON record).
pub const ANNOTATION_CLAIM: &str = "cluster.x-k8s.io/kubelet-claim";
/// The signer's claims on a MachinePool: a JSON object keyed by instance provider ID.
///
/// The SPEC leaves the place to the project; one annotation keeps the write atomic under
/// the same resourceVersion precondition as a Machine's claim.
pub const ANNOTATION_POOL_CLAIMS: &str = "cluster.x-k8s.io/kubelet-claims";
/// Written on a CSR whose attestation version the signer does not support.
pub const ANNOTATION_SUPPORTED_VERSIONS: &str = "cluster.x-k8s.io/attestation-supported-versions";
/// The TPM credential challenge the signer writes on CSR #1.
pub const ANNOTATION_TPM_CHALLENGE: &str = "cluster.x-k8s.io/tpm-credential-challenge";
/// The `azure/v1` challenge (the nonce for the attested document) the signer writes on CSR #1.
pub const ANNOTATION_AZURE_CHALLENGE: &str = "cluster.x-k8s.io/azure-attestation-challenge";

/// Group of every bootstrap-token user.
pub const GROUP_BOOTSTRAPPERS: &str = "system:bootstrappers";
/// Group of every node identity.
pub const GROUP_NODES: &str = "system:nodes";
/// Username prefix of bootstrap-token users.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// Common-name prefix of node identities.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// `spec.usages` spellings of `certificates.k8s.io/v1`.
pub mod usage {
    /// digitalSignature
    pub const DIGITAL_SIGNATURE: &str = "digital signature";
    /// keyEncipherment
    pub const KEY_ENCIPHERMENT: &str = "key encipherment";
    /// id-kp-clientAuth
    pub const CLIENT_AUTH: &str = "client auth";
    /// id-kp-serverAuth
    pub const SERVER_AUTH: &str = "server auth";
}

/// Largest `spec.request` the signer reads (SPEC rule 1), for every provider but `tpm/v1`.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Largest `tpm/v1` `spec.request` (revision 5): phase 1 carries the measured-boot event log
/// (up to [`crate::tpm::data::MAX_EVENT_LOG_BYTES`], 256 KiB), base64 in the JSON DATA block,
/// which the PEM encodes again: 256 KiB of log is about 470 KiB of request. Still bounded: a
/// CSR object of this size is a third of etcd's default 1.5 MiB object limit, and a flood of
/// them costs the signer what its watch cache holds of them anyway.
pub const MAX_TPM_REQUEST_BYTES: usize = 576 * 1024;
/// Cluster annotation naming the ConfigMap (in the Cluster's namespace, key `policy.yaml`) of
/// the Cluster's `tpm/v1` boot policy (SPEC section 5, revision 5).
pub const ANNOTATION_TPM_BOOT_POLICY: &str = "cluster.x-k8s.io/kubelet-tpm-boot-policy";
/// Longest provider ID accepted (SPEC rule 8).
pub const MAX_PROVIDER_ID_BYTES: usize = 512;

#[cfg(test)]
mod tests {
    #[test]
    fn dotted_provider_id_oid_matches_its_arcs() {
        let dotted: Vec<String> = super::PROVIDER_ID_OID.iter().map(u64::to_string).collect();
        assert_eq!(dotted.join("."), super::PROVIDER_ID_OID_DOTTED);
    }
}
