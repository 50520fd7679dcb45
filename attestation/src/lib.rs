//! Attested kubelet identity for Cluster API: the shared library.
//!
//! - [`envelope`] and [`csr`]: the `spec.request` wire format (SPEC section 2) and PKCS#10;
//!   [`csr_object`]: the CertificateSigningRequest object's fields and the other CSRs.
//! - [`rules`]: the pure rule engine of SPEC sections 3 and 4, returning a [`Decision`].
//! - [`machine`] and [`claim`]: read-only views of Cluster API objects and the signer's claim.
//! - [`attestor`]: the provider trait pair; [`insecure`] is `insecure/v1`, [`tpm`] `tpm/v1`,
//!   [`gcp`] and [`aws`] the cloud identity providers ([`cloud`] holds what they share).
//! - [`ca`]: the workload cluster CA and certificate issuance.
//! - [`request`]: the node side: keys, CSRs and envelopes.
//! - [`outside_attestation`]: the Nodes still outside attestation, and whether kubeadm's
//!   rotation binding may go (SPEC section 7).
//! - [`join_tokens`]: which join tokens the signer keeps for MachinePools and retires for
//!   claimed Machines (SPEC section 7).
//!
//! Like `kube-core`, this crate does no I/O: no client, no files, no clock.

pub mod attestor;
pub mod aws;
pub mod azure;
pub mod ca;
mod challenge;
pub mod claim;
pub mod cloud;
pub mod csr;
pub mod csr_object;
pub mod decision;
mod digest;
pub mod envelope;
pub mod gcp;
pub mod identity;
pub mod insecure;
pub mod join_tokens;
pub mod kubernetes_minor;
pub mod machine;
pub mod names;
pub mod outside_attestation;
pub mod request;
pub mod revocation;
pub mod rules;
pub mod target;
pub mod tpm;

pub use csr_object::{CsrDirectory, CsrObject, CsrRef, NoCsrs};
pub use decision::{Decision, DenyReason, Outcome, Rule, Verdict};
pub use rules::{Clock, Inputs, NodeDirectory, NodeLookup, decide, requested_node_name};
