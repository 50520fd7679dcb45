//! Shared fixtures for the suites and benchmarks: certificate authorities in every key format
//! Cluster API may hand the signer, kubelet-shaped CSRs (and deliberately broken ones), and
//! Cluster API objects. Objects built here are validated against the real CRDs in
//! `testdata/crds` by the `crd_fixtures` suite.

pub mod azure;
pub mod boot_log;
pub mod ca;
pub mod cabpk;
pub mod capi;
pub mod cloud;
pub mod cloud_init;
pub mod connect_proxy;
pub mod csr;
pub mod envtest;
pub mod fleet;
pub mod kube_metrics;
pub mod kubeadm_config;
pub mod kubeadm_node;
pub mod kubelet;
pub mod lifecycle;
pub mod live;
pub mod moto;
pub mod pkcs10;
pub mod prometheus;
pub mod proxy;
pub mod real_ek;
pub mod revocation;
pub mod stats;
pub mod strict_der;
pub mod swtpm;
pub mod tpm_world;
pub mod worker0;

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}
