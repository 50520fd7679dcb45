//! The `azure/v1` node side: CSR #1 asks for a challenge; once the signer has written it, CSR #2
//! (same key) carries the attested document IMDS signs over the challenge's nonce. The IMDS
//! calls are the plugin's ([`AzureImds`]); nothing here sends anything.

use base64::Engine as _;

use super::challenge::AzureChallenge;
use super::document::AttestedDocument;
use super::{AzureData, ChallengeReference, PROVIDER};
use crate::attestor::{AttestError, AttestationRequest, Attestor};
use crate::cloud::pkcs7::{Profile, SignedStatement};
use crate::envelope::ProviderVersion;
use crate::names::{ANNOTATION_AZURE_CHALLENGE, SIGNER_AZURE};

/// The Azure Instance Metadata Service, as the node reaches it.
pub trait AzureImds {
    /// `/metadata/attested/document` fetched with `nonce`: its `signature` (base64 PKCS#7),
    /// whose statement carries that nonce (IMDS may answer a stale document first: see
    /// [`nonce_of`]).
    fn attested_document(&mut self, nonce: &str) -> Result<String, AttestError>;
}

/// The nonce an attested document (base64 PKCS#7) carries, read without verifying anything: the
/// node's check that IMDS answered this nonce's document and not a cached one.
pub fn nonce_of(document_base64: &str) -> Result<String, String> {
    let compact: String = document_base64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let pkcs7 = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("the attested document is not base64: {e}"))?;
    let signed = SignedStatement::parse(&pkcs7, Profile::AZURE)?;
    Ok(AttestedDocument::parse(signed.content())?.nonce)
}

/// Node side of `azure/v1`.
#[derive(Debug)]
pub struct AzureAttestor<M> {
    imds: M,
}

impl<M: AzureImds> AzureAttestor<M> {
    /// An attestor asking `imds`.
    pub fn new(imds: M) -> Self {
        Self { imds }
    }
}

impl<M: AzureImds> Attestor for AzureAttestor<M> {
    fn provider_version(&self) -> ProviderVersion {
        ProviderVersion::new(PROVIDER, "v1")
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_AZURE
    }

    fn challenge_annotation(&self) -> Option<&'static str> {
        Some(ANNOTATION_AZURE_CHALLENGE)
    }

    fn attest(&mut self, request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError> {
        let Some(answer) = request.challenge else {
            return Ok(Some(AzureData::phase_one().to_bytes()));
        };
        let challenge = AzureChallenge::parse(answer.annotation)
            .map_err(|e| AttestError::Failed(format!("CSR #1's {ANNOTATION_AZURE_CHALLENGE}: {e}")))?;
        let document = self.imds.attested_document(&challenge.nonce)?;
        Ok(Some(
            AzureData {
                phase: 2,
                challenge: Some(ChallengeReference {
                    csr_name: answer.csr_name.to_owned(),
                    csr_uid: answer.csr_uid.to_owned(),
                }),
                attested_document: Some(document),
            }
            .to_bytes(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestor::ChallengeAnswer;

    struct Imds(Vec<String>);

    impl AzureImds for Imds {
        fn attested_document(&mut self, nonce: &str) -> Result<String, AttestError> {
            self.0.push(nonce.to_owned());
            Ok("TUlJ".into())
        }
    }

    #[test]
    fn phase_one_asks_and_phase_two_fetches_with_the_challenges_nonce() {
        let mut attestor = AzureAttestor::new(Imds(Vec::new()));
        let first = attestor.attest(&AttestationRequest::new(b"spki")).unwrap().unwrap();
        assert_eq!(AzureData::parse(&first).unwrap(), AzureData::phase_one());
        let challenge = AzureChallenge::issue(&[1; 32], "uid-1", "2026-11-26T15:00:00Z".into(), &[0; 32]);
        let annotation = serde_json::to_string(&challenge).unwrap();
        let second = attestor
            .attest(&AttestationRequest::answering(
                b"spki",
                ChallengeAnswer {
                    csr_name: "csr-1",
                    csr_uid: "uid-1",
                    annotation: &annotation,
                },
            ))
            .unwrap()
            .unwrap();
        let data = AzureData::parse(&second).unwrap();
        assert_eq!(data.phase, 2);
        assert_eq!(data.challenge.unwrap().csr_uid, "uid-1");
        assert_eq!(attestor.imds.0, [challenge.nonce]);
        let refused = attestor.attest(&AttestationRequest::answering(
            b"spki",
            ChallengeAnswer {
                csr_name: "csr-1",
                csr_uid: "uid-1",
                annotation: "{\"nonce\":\"x\"}",
            },
        ));
        assert!(refused.is_err(), "a challenge that is not one");
    }
}
