//! `tpm/v1`, signer side, in pure Rust (the signer links no TPM library): the TPM 2.0
//! structures a node sends (SPEC section 5) and the checks on them.
//!
//! - [`wire`]: the TPM encoding, read without ever passing the end.
//! - [`public`]: `TPM2B_PUBLIC` (EK, AK), the TPM Name, AK attributes, the canonical EK
//!   SubjectPublicKeyInfo.
//! - [`quote`]: `TPMS_ATTEST` quotes and `TPMT_SIGNATURE`s, verified under the AK.
//! - [`credential`]: MakeCredential in software (RSA-OAEP or ECDH seeds), for the phase-1 challenge.
//! - [`ek`]: EK trust by certificate chain to `--tpm-ek-ca-bundle`.
//! - [`data`]: the DATA block, the challenge annotation, and the derived challenge secret.
//! - [`challenge_key`]: the key challenges are derived under, and the keys it replaced.
//! - `attestor` (feature `tpm-attestor`): the node side, through tss-esapi.
//! - [`boot_policy`]: a Cluster's boot policy (revision 5): its format and the judge on the
//!   event log's replayed events; `measured_boot`: the verifier's use of it (log replayed
//!   against the quote, phase 2 held to the same boot).
//! - [`verifier`]: [`TpmVerifier`], the two phases put together.
//!
//! Tested on structures a real TPM produced: `testdata/tpm/` was made by swtpm with
//! tpm2-tools (`tpm2_createek`, `tpm2_createak`, `tpm2_quote -q <nonce> -l sha256:0,1,7`).

#[cfg(feature = "tpm-attestor")]
pub mod attestor;
pub mod authenticode;
pub mod boot_policy;
pub mod challenge_key;
pub mod credential;
pub mod data;
pub mod ek;
pub mod event_log;
mod measured_boot;
pub mod public;
pub mod quote;
pub mod verifier;
pub mod wire;

pub use verifier::TpmVerifier;

/// `TPM_ALG_ID` and `TPM_ECC_CURVE` values (TPM 2.0 Part 2, tables 9 and 10).
pub mod alg {
    /// RSA.
    pub const RSA: u16 = 0x0001;
    /// SHA-256.
    pub const SHA256: u16 = 0x000B;
    /// No algorithm.
    pub const NULL: u16 = 0x0010;
    /// RSASSA-PKCS1-v1_5.
    pub const RSASSA: u16 = 0x0014;
    /// RSASSA-PSS.
    pub const RSAPSS: u16 = 0x0016;
    /// ECDSA.
    pub const ECDSA: u16 = 0x0018;
    /// ECDAA.
    pub const ECDAA: u16 = 0x001A;
    /// ECC.
    pub const ECC: u16 = 0x0023;
    /// NIST P-256 (`TPM_ECC_NIST_P256`).
    pub const NIST_P256: u16 = 0x0003;
}
