//! What a worker knows of the certificates it issued in its workload cluster and of that
//! cluster's revoked list, in memory between the revocation duty's passes
//! ([`super::duties::revocation`]): the record read back and added to at each issuance, each
//! record shard's size, the list as last read or written.

use std::collections::{BTreeMap, HashMap};

use attestation::revocation::CredentialId;
use attestation::revocation::record::IssuedCertificate;

/// What the worker keeps of the record and the list.
#[derive(Default)]
pub struct RevocationState {
    /// The record, by credential ID; `None` until read.
    pub(in crate::controller::workload) issued: Option<HashMap<CredentialId, IssuedCertificate>>,
    /// Bytes of each shard's `data`, as last read or written.
    pub(in crate::controller::workload) shard_bytes: [usize; 16],
    /// The list as last read or written; `None` until read (or while it is missing).
    pub(in crate::controller::workload) listed: Option<BTreeMap<String, String>>,
    /// The list's resourceVersion as last read or written: its values are rewritten from what was
    /// read, so each write is conditional on it.
    pub(in crate::controller::workload) listed_version: Option<String>,
    /// What the last look at the triggers saw (see [`LookedAt`]): the same again means nothing
    /// can have changed, and the look is skipped.
    pub(in crate::controller::workload) looked_at: Option<LookedAt>,
    /// The list is missing (the policy then allows every write): reported once.
    pub(in crate::controller::workload) missing_reported: bool,
}

/// What a look at the triggers depended on: the Cluster's objects (the management cache's
/// `Arc` of its inventory), the Nodes' index, the record and the list, the minor's reading and the
/// minute (an entry expires at its NotAfter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookedAt {
    /// The inventory's address.
    pub(in crate::controller::workload) inventory: usize,
    /// The Nodes' index generation.
    pub(in crate::controller::workload) nodes: Option<u64>,
    /// Entries in the record.
    pub(in crate::controller::workload) issued: usize,
    /// The list's resourceVersion.
    pub(in crate::controller::workload) listed_version: Option<String>,
    /// Whether the apiserver names credential IDs.
    pub(in crate::controller::workload) by_id: bool,
    /// Unix minutes.
    pub(in crate::controller::workload) minute: i64,
}
