//! The CertificateSigningRequest as an object of the workload cluster: the fields the rules
//! read ([`CsrObject`]), a reference to one ([`CsrRef`]), and where the other CSRs of the same
//! cluster are looked up ([`CsrDirectory`]).
//!
//! Below the rule engine and the providers alike: a second-phase verifier reads its first CSR
//! through the directory, and a decision names the CSR it supersedes.

use std::collections::BTreeMap;

use time::OffsetDateTime;

/// The fields of a `certificates.k8s.io/v1` CertificateSigningRequest the rules read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CsrObject {
    /// metadata.name
    pub name: String,
    /// metadata.uid
    pub uid: String,
    /// spec.request, decoded from base64 (PEM text).
    pub request: Vec<u8>,
    /// spec.signerName
    pub signer_name: String,
    /// spec.usages
    pub usages: Vec<String>,
    /// spec.username
    pub username: String,
    /// spec.groups
    pub groups: Vec<String>,
    /// spec.expirationSeconds
    pub expiration_seconds: Option<i64>,
    /// metadata.creationTimestamp
    pub created: Option<OffsetDateTime>,
    /// metadata.annotations (set by anyone who could create the CSR: trusted only where a
    /// verifier can check them).
    pub annotations: BTreeMap<String, String>,
    /// Denied, Failed, or its certificate issued: nothing more will happen to it.
    pub finished: bool,
}

/// Other CSRs of the same workload cluster: a second-phase request names its first, and a
/// provider bounds how many of its challenges are pending.
pub trait CsrDirectory {
    /// The CSR called `name`, if the signer knows it.
    fn csr(&self, name: &str) -> Option<CsrObject>;
    /// The unfinished CSRs carrying `annotation`.
    fn pending_with(&self, annotation: &str) -> Vec<CsrObject>;
}

/// No other CSRs (offline use).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCsrs;

impl CsrDirectory for NoCsrs {
    fn csr(&self, _name: &str) -> Option<CsrObject> {
        None
    }

    fn pending_with(&self, _annotation: &str) -> Vec<CsrObject> {
        Vec::new()
    }
}

impl CsrDirectory for [CsrObject] {
    fn csr(&self, name: &str) -> Option<CsrObject> {
        self.iter().find(|c| c.name == name).cloned()
    }

    fn pending_with(&self, annotation: &str) -> Vec<CsrObject> {
        self.iter()
            .filter(|c| !c.finished && c.annotations.contains_key(annotation))
            .cloned()
            .collect()
    }
}

impl CsrDirectory for Vec<CsrObject> {
    fn csr(&self, name: &str) -> Option<CsrObject> {
        self.as_slice().csr(name)
    }

    fn pending_with(&self, annotation: &str) -> Vec<CsrObject> {
        self.as_slice().pending_with(annotation)
    }
}

/// A CSR named by name and UID.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CsrRef {
    /// metadata.name
    pub name: String,
    /// metadata.uid
    pub uid: String,
}
