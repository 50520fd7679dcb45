//! `azure/v1`: an Azure VM or scale-set instance proves who it is with the attested document
//! of its Instance Metadata Service (SPEC section 5).
//!
//! Azure makes this harder than the other clouds. The attested document is a PKCS#7 signed by
//! Microsoft over a small JSON statement (`vmId`, `subscriptionId`, a nonce of at most 32
//! characters, a six-hour `timeStamp`); it binds no key, and managed-identity tokens take no
//! free audience, so neither can carry the CSR key's binding. The flow is therefore two-phase,
//! like `tpm/v1`'s: CSR #1 asks, the signer answers with a nonce in a challenge annotation
//! authenticated under its challenge key and bound to CSR #1's key, and CSR #2 (same key, same
//! requester) carries the document fetched with that nonce. A copied document is useless: its
//! nonce answers one challenge of one key, once. And since the document names the VM only by
//! `vmId`, which no Cluster API object records, the signer asks Azure Resource Manager for the
//! `vmId` of the VM the Machine's provider ID names.
//!
//! - [`provider_id`]: the VM or scale-set VM a CAPZ provider ID names ([`AzureVm`]).
//! - [`document`]: the statement's fields and its time format.
//! - [`trust`]: Microsoft's roots and intermediates ([`MicrosoftTrust`]), the chain and the
//!   metadata domain of the document's leaf certificate.
//! - [`challenge`]: the challenge annotation and its nonce.
//! - [`vms`]: ARM's answers, reached through the [`VirtualMachines`] trait.
//! - [`verifier`]: the [`AzureVerifier`]; [`attestor`]: the node side.

pub mod attestor;
pub mod challenge;
pub mod document;
pub mod provider_id;
pub mod trust;
pub mod verifier;
pub mod vms;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

pub use attestor::{AzureAttestor, AzureImds};
pub use document::AttestedDocument;
pub use provider_id::AzureVm;
pub use trust::MicrosoftTrust;
pub use verifier::AzureVerifier;
pub use vms::{VirtualMachines, VmAnswer};

/// Provider name.
pub const PROVIDER: &str = "azure";

/// CSR #2's reference to CSR #1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeReference {
    /// CSR #1's name.
    #[serde(rename = "csrName")]
    pub csr_name: String,
    /// CSR #1's UID.
    #[serde(rename = "csrUID")]
    pub csr_uid: String,
}

/// The DATA block of `azure/v1`: `{"phase": 1}`, or `{"phase": 2, "challenge": {...},
/// "attestedDocument": "<base64 PKCS#7>"}`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureData {
    /// 1 or 2.
    pub phase: u8,
    /// Phase 2: CSR #1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ChallengeReference>,
    /// Phase 2: IMDS's attested document (`signature`), base64 PKCS#7.
    #[serde(rename = "attestedDocument", default, skip_serializing_if = "Option::is_none")]
    pub attested_document: Option<String>,
}

impl std::fmt::Debug for AzureData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureData")
            .field("phase", &self.phase)
            .field("challenge", &self.challenge)
            .field(
                "attested_document_bytes",
                &self.attested_document.as_ref().map(String::len),
            )
            .finish()
    }
}

/// Largest base64 attested document read (Azure's is about 4 KiB).
const MAX_DOCUMENT_BASE64: usize = 24 * 1024;

impl AzureData {
    /// CSR #1's DATA.
    pub fn phase_one() -> Self {
        Self {
            phase: 1,
            challenge: None,
            attested_document: None,
        }
    }

    /// Reads the DATA block: phase 1 with nothing else, or phase 2 with both fields.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let data: Self = serde_json::from_slice(bytes).map_err(|e| {
            format!("DATA is not {{\"phase\": 1}} or {{\"phase\": 2, \"challenge\": {{\"csrName\", \"csrUID\"}}, \"attestedDocument\"}}: {e}")
        })?;
        match (data.phase, &data.challenge, &data.attested_document) {
            (1, None, None) => Ok(data),
            (1, _, _) => Err("DATA phase 1 carries nothing but the phase".into()),
            (2, Some(_), Some(document)) if document.len() <= MAX_DOCUMENT_BASE64 => Ok(data),
            (2, Some(_), Some(document)) => Err(format!(
                "DATA attestedDocument is {} characters, more than {MAX_DOCUMENT_BASE64}",
                document.len()
            )),
            (2, _, _) => Err("DATA phase 2 needs both challenge and attestedDocument".into()),
            (phase, _, _) => Err(format!("DATA phase {phase} (1 or 2)")),
        }
    }

    /// The DATA block's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Phase 2's PKCS#7 bytes: standard base64, whitespace tolerated.
    pub fn pkcs7(&self) -> Result<Vec<u8>, String> {
        let text = self
            .attested_document
            .as_deref()
            .ok_or("DATA carries no attestedDocument")?;
        let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| format!("attestedDocument is not base64: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_block_is_one_of_the_two_phases_and_nothing_else() {
        assert_eq!(AzureData::parse(br#"{"phase":1}"#).unwrap(), AzureData::phase_one());
        let two = br#"{"phase":2,"challenge":{"csrName":"a","csrUID":"u"},"attestedDocument":"TUlJ"}"#;
        let parsed = AzureData::parse(two).unwrap();
        assert_eq!(parsed.pkcs7().unwrap(), b"MII");
        assert_eq!(AzureData::parse(&parsed.to_bytes()).unwrap(), parsed);
        for bad in [
            &br#"{"phase":1,"attestedDocument":"TUlJ"}"#[..],
            br#"{"phase":2,"attestedDocument":"TUlJ"}"#,
            br#"{"phase":2,"challenge":{"csrName":"a","csrUID":"u"}}"#,
            br#"{"phase":3}"#,
            br#"{"phase":1,"extra":true}"#,
            b"not json",
        ] {
            assert!(AzureData::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let huge = format!(
            r#"{{"phase":2,"challenge":{{"csrName":"a","csrUID":"u"}},"attestedDocument":"{}"}}"#,
            "A".repeat(MAX_DOCUMENT_BASE64 + 4)
        );
        assert!(AzureData::parse(huge.as_bytes()).unwrap_err().contains("more than"));
    }
}
