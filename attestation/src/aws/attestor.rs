//! The `aws/v1` node side: the identity document's PKCS#7 from the metadata service, and a
//! `GetCallerIdentity` request signed (SigV4, the official `aws-sigv4` crate) with the instance
//! role's credentials, carrying the key binding as a signed header. The metadata calls are the
//! plugin's ([`Ec2Metadata`]); nothing here sends anything.

use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::Engine as _;
use zeroize::Zeroizing;

use super::document::IdentityDocument;
use super::pkcs7::SignedDocument;
use super::sts::{BINDING_HEADER, GET_CALLER_IDENTITY_BODY, SignedStsRequest, StsEndpoints};
use super::{AwsData, PROVIDER};
use crate::attestor::{AttestError, AttestationRequest, Attestor};
use crate::envelope::ProviderVersion;
use crate::names::SIGNER_AWS;

/// The instance role's temporary credentials, as the metadata service serves them.
pub struct RoleCredentials {
    /// `AccessKeyId`.
    pub access_key_id: String,
    /// `SecretAccessKey`.
    pub secret_access_key: Zeroizing<String>,
    /// `Token`.
    pub session_token: Zeroizing<String>,
}

impl std::fmt::Debug for RoleCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// The EC2 instance metadata service (IMDSv2), as the node reaches it.
pub trait Ec2Metadata {
    /// `dynamic/instance-identity/rsa2048`: base64 PKCS#7.
    fn identity_rsa2048(&mut self) -> Result<String, AttestError>;
    /// `meta-data/iam/security-credentials/<role>` of the instance's one role.
    fn role_credentials(&mut self) -> Result<RoleCredentials, AttestError>;
}

/// Node side of `aws/v1`.
pub struct AwsAttestor<M> {
    metadata: M,
    endpoints: StsEndpoints,
    clock: fn() -> SystemTime,
}

impl<M> std::fmt::Debug for AwsAttestor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsAttestor")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl<M: Ec2Metadata> AwsAttestor<M> {
    /// An attestor asking `metadata`, signing for `endpoints` (`AWS_ENDPOINT_URL_STS`, else
    /// the regional endpoints) at the system clock's time.
    pub fn new(metadata: M, endpoints: StsEndpoints) -> Self {
        Self {
            metadata,
            endpoints,
            clock: SystemTime::now,
        }
    }

    /// Signs at `clock`'s time instead (tests).
    pub fn with_clock(mut self, clock: fn() -> SystemTime) -> Self {
        self.clock = clock;
        self
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> AttestError {
    AttestError::Failed(format!("{what}: {e}"))
}

impl<M: Ec2Metadata> Attestor for AwsAttestor<M> {
    fn provider_version(&self) -> ProviderVersion {
        ProviderVersion::new(PROVIDER, "v1")
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_AWS
    }

    fn attest(&mut self, request: &AttestationRequest<'_>) -> Result<Option<Vec<u8>>, AttestError> {
        let rsa2048 = self.metadata.identity_rsa2048()?;
        let probe = AwsData {
            rsa2048: rsa2048.clone(),
            sts: SignedStsRequest {
                headers: BTreeMap::new(),
                body: String::new(),
            },
        };
        let signed = SignedDocument::parse(&probe.pkcs7().map_err(|e| failed("identity document", e))?)
            .map_err(|e| failed("identity document", e))?;
        let document = IdentityDocument::parse(signed.content()).map_err(|e| failed("identity document", e))?;
        let credentials = self.metadata.role_credentials()?;
        let host = self.endpoints.host(&document.region);
        let url = self.endpoints.url(&document.region);
        let binding = crate::cloud::binding(request.spki_der);
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let unsigned = [
            ("host", host.as_str()),
            ("content-type", content_type),
            (BINDING_HEADER, binding.as_str()),
        ];
        let identity = aws_credential_types::Credentials::new(
            credentials.access_key_id.as_str(),
            credentials.secret_access_key.as_str(),
            Some(credentials.session_token.to_string()),
            None,
            "instance-metadata",
        )
        .into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&document.region)
            .name("sts")
            .time((self.clock)())
            .settings(aws_sigv4::http_request::SigningSettings::default())
            .build()
            .map_err(|e| failed("SigV4 parameters", e))?
            .into();
        let signable = aws_sigv4::http_request::SignableRequest::new(
            "POST",
            url.as_str(),
            unsigned.iter().copied(),
            aws_sigv4::http_request::SignableBody::Bytes(GET_CALLER_IDENTITY_BODY.as_bytes()),
        )
        .map_err(|e| failed("SigV4 request", e))?;
        let (instructions, _signature) = aws_sigv4::http_request::sign(signable, &params)
            .map_err(|e| failed("SigV4 signing", e))?
            .into_parts();
        let mut headers: BTreeMap<String, String> = unsigned
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (name, value) in instructions.headers() {
            headers.insert(name.to_ascii_lowercase(), value.to_owned());
        }
        let data = AwsData {
            rsa2048,
            sts: SignedStsRequest {
                headers,
                body: base64::engine::general_purpose::STANDARD.encode(GET_CALLER_IDENTITY_BODY),
            },
        };
        Ok(Some(data.to_bytes()))
    }
}
