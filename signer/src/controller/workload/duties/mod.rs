//! A workload cluster's duties that are not CSR decisions, run by its worker beside the CSR
//! loop on the same client: today kubeadm's auto-approve bindings (SPEC section 3).
//!
//! A duty may read the management cache and write to the workload cluster's own objects of its
//! concern; it never decides or writes a CSR, and it reports through the worker's Events and
//! metrics.

pub mod legacy_bindings;
