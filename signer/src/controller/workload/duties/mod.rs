//! A workload cluster's duties that are not CSR decisions, run by its worker beside the CSR
//! loop on the same client: the signer's own RBAC (first, with the admin client), kubeadm's auto-approve bindings (SPEC section 3), the Nodes outside
//! attestation that decide the rotation binding's fate, the join tokens (SPEC section 7), and
//! the workload apiserver's minor, and the record and list of revoked certificates.
//!
//! A duty may read the management cache and write to the workload cluster's own objects of its
//! concern; it never decides or writes a CSR, and it reports through the worker's Events and
//! metrics.

pub mod apiserver_version;
pub mod join_tokens;
pub mod legacy_bindings;
pub mod outside_attestation;
pub mod own_rbac;
pub mod revocation;
