//! The `gcp/v1` node side: ask the metadata server for an identity token whose audience binds
//! the CSR's key. The HTTP call is the plugin's ([`GceMetadata`]); this module only decides
//! what to ask for and packs the answer.

use super::{GcpData, PROVIDER, audience};
use crate::attestor::{AttestError, AttestationRequest, Attestor};
use crate::envelope::ProviderVersion;
use crate::names::SIGNER_GCP;

/// The Compute Engine metadata server, as the node reaches it.
pub trait GceMetadata {
    /// `instance/service-accounts/default/identity?audience=<audience>&format=full`.
    fn identity_token(&mut self, audience: &str) -> Result<String, AttestError>;
}

/// Node side of `gcp/v1`.
#[derive(Debug)]
pub struct GcpAttestor<M> {
    metadata: M,
}

impl<M: GceMetadata> GcpAttestor<M> {
    /// An attestor asking `metadata`.
    pub fn new(metadata: M) -> Self {
        Self { metadata }
    }
}

impl<M: GceMetadata> Attestor for GcpAttestor<M> {
    fn provider_version(&self) -> ProviderVersion {
        ProviderVersion::new(PROVIDER, "v1")
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_GCP
    }

    fn attest(&mut self, request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError> {
        let identity_token = self.metadata.identity_token(&audience(request.spki_der))?;
        if identity_token.split('.').count() != 3 {
            return Err(AttestError::Failed(
                "the metadata server's identity token is not a JWT".into(),
            ));
        }
        Ok(Some(GcpData { identity_token }.to_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder(Vec<String>);

    impl GceMetadata for Recorder {
        fn identity_token(&mut self, audience: &str) -> Result<String, AttestError> {
            self.0.push(audience.to_owned());
            Ok("h.p.s".into())
        }
    }

    #[test]
    fn the_audience_binds_the_csr_key() {
        let mut attestor = GcpAttestor::new(Recorder(Vec::new()));
        let data = attestor.attest(&AttestationRequest::new(b"spki")).unwrap().unwrap();
        assert_eq!(attestor.metadata.0, [audience(b"spki")]);
        assert_eq!(GcpData::parse(&data).unwrap().identity_token, "h.p.s");
        assert_eq!(attestor.signer_name(), SIGNER_GCP);
    }
}
