//! What the cloud identity providers (`gcp/v1`, `aws/v1`, `azure/v1`, SPEC section 5) share: the key
//! binding, freshness, the instance recorded in the claim, and the calls the signer makes to
//! the cloud on a verifier's behalf.
//!
//! A cloud's signed statement says "this is instance X"; on its own it is a bearer token that
//! anyone who reads it off the node could replay. Each provider therefore binds it to the CSR's
//! key: the statement (GCE: the token's audience; AWS: a signed STS header) carries
//! [`binding`] of the CSR's SubjectPublicKeyInfo, so a copied statement is useless with any
//! other key, and it must be minutes old, so a stolen one expires. Azure's statement can carry
//! neither, so `azure/v1` binds it through a challenge instead: its nonce answers one
//! challenge the signer wrote for one key ([`crate::azure`]).
//!
//! Verification stays pure: the cloud's keys and answers reach the verifiers through traits
//! ([`crate::gcp::GoogleKeys`], [`crate::aws::CallerIdentity`],
//! [`crate::azure::VirtualMachines`]) that the signer implements
//! over caches. When a verifier needs something the cache does not hold yet, it answers
//! [`crate::attestor::Verification::NeedsCloud`] with the [`CloudCall`] to make; the
//! controller makes it and decides again.

pub mod pkcs7;
pub mod statement;

pub use statement::{CLOCK_SKEW, DEFAULT_MAX_AGE, binding, check_fresh};
pub(crate) use statement::{allow_list, rfc3339};

/// A call to a cloud that a verifier needs made before it can judge a CSR. The controller makes
/// it (through the same traits' implementations) and decides again; offline, `check` says
/// which call it could not make.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloudCall {
    /// Fetch Google's signing keys again: a token names a key the cached set lacks, or no set
    /// is loaded yet. The fetcher rate-limits itself.
    RefreshGoogleKeys,
    /// Send this STS `GetCallerIdentity` request (the node's, replayed to the signer's own
    /// endpoint) and keep the answer.
    CallerIdentity(crate::aws::StsCall),
    /// Ask Azure Resource Manager for this VM's `vmId` and keep the answer.
    AzureVm(crate::azure::AzureVm),
    /// Not a cloud, but the same kind of call: read the signer's own `tpm/v1` challenge key
    /// Secret again. A challenge verifies under no key this replica holds, and the key may have
    /// been rotated since this replica read it ([`crate::tpm::challenge_key`]).
    ReloadChallengeKey,
}
