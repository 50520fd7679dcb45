//! The node side: a key, a PKCS#10 request for `system:node:<name>` with the provider-ID
//! extension, and the envelope around it with the attestor's blocks.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use zeroize::Zeroizing;

use crate::attestor::{AttestError, AttestationRequest, Attestor};
use crate::envelope::RequestEnvelope;
use crate::identity::{NodeName, ProviderId};
use crate::names::{GROUP_NODES, PROVIDER_ID_OID};

/// Why a request could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Key generation or CSR serialization failed.
    #[error("building the certificate request failed: {0}")]
    Build(String),
    /// The attestor failed.
    #[error(transparent)]
    Attest(#[from] AttestError),
}

/// Key types a node may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// ECDSA P-256 (kubelet's own choice).
    #[default]
    EcdsaP256,
    /// ECDSA P-384.
    EcdsaP384,
    /// RSA-2048.
    Rsa2048,
    /// Ed25519.
    Ed25519,
}

/// A freshly generated node key.
pub struct NodeKey(KeyPair);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(<redacted>)")
    }
}

impl NodeKey {
    /// Generates a key.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, RequestError> {
        let key = match algorithm {
            KeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            KeyAlgorithm::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            KeyAlgorithm::Rsa2048 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048),
            KeyAlgorithm::Ed25519 => KeyPair::generate_for(&rcgen::PKCS_ED25519),
        };
        key.map(Self).map_err(|e| RequestError::Build(e.to_string()))
    }

    /// The private key as PKCS#8 PEM (zeroized when dropped).
    pub fn private_key_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(self.0.serialize_pem())
    }

    /// The rcgen key pair (for callers building unusual requests, such as tests).
    pub fn key_pair(&self) -> &KeyPair {
        &self.0
    }
}

impl Drop for NodeKey {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.0.zeroize();
    }
}

/// CSR parameters for `CN=system:node:<name>, O=system:nodes` with the provider-ID extension.
pub fn kubelet_client_params(node_name: &NodeName, provider_id: &ProviderId) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, GROUP_NODES);
    dn.push(DnType::CommonName, node_name.username());
    params.distinguished_name = dn;
    params.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
        PROVIDER_ID_OID,
        provider_id.to_extension_value(),
    )];
    params
}

/// Serializes `params` signed by `key`, asks `attestor` for evidence bound to the key (answering
/// the signer's `challenge` on an earlier CSR, when given), and wraps
/// both in the envelope.
pub fn build_envelope(
    params: &CertificateParams,
    key: &NodeKey,
    attestor: &mut dyn Attestor,
    challenge: Option<crate::attestor::ChallengeAnswer<'_>>,
) -> Result<RequestEnvelope, RequestError> {
    let csr = params
        .serialize_request(&key.0)
        .map_err(|e| RequestError::Build(e.to_string()))?;
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key.0);
    let request = match challenge {
        None => AttestationRequest::new(&spki),
        Some(answer) => AttestationRequest::answering(&spki, answer),
    };
    let data = attestor.attest(&request)?;
    Ok(RequestEnvelope {
        csr_der: csr.der().to_vec(),
        provider: Some(attestor.provider_version()),
        data,
    })
}
