//! The `aws/v1` verifier: the identity document verified with the region's certificate, then
//! the signed STS request checked and (through [`CallerIdentity`]) answered, then the answer's
//! ARN matched against the document.

use std::sync::Arc;

use time::Duration;

use super::certificates::RegionCertificates;
use super::document::IdentityDocument;
use super::pkcs7::SignedDocument;
use super::sts::{CallChecks, CallerIdentity, ExpectedCaller, StsAnswer, StsEndpoints, check_instance_arn};
use super::{AwsData, PROVIDER};
use crate::attestor::{Evidence, Verification, Verifier};
use crate::cloud::{CloudCall, DEFAULT_MAX_AGE, allow_list, binding};
use crate::decision::DenyReason;
use crate::names::{ANNOTATION_AWS_ACCOUNTS, ANNOTATION_AWS_ROLES, SIGNER_AWS};

/// Signer side of `aws/v1`.
pub struct AwsVerifier {
    certificates: RegionCertificates,
    endpoints: StsEndpoints,
    sts: Arc<dyn CallerIdentity>,
    max_age: Duration,
}

impl std::fmt::Debug for AwsVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsVerifier")
            .field("certificates", &self.certificates.len())
            .field("endpoints", &self.endpoints)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

type Failure = (DenyReason, String);

fn fail(message: impl Into<String>) -> Failure {
    (DenyReason::AttestationInvalid, format!("aws/v1 {}", message.into()))
}

/// The Cluster's configuration admits no `aws/v1` attestation (SPEC section 5).
fn not_allowed(message: impl Into<String>) -> Failure {
    (DenyReason::AttestationNotAllowed, format!("aws/v1 {}", message.into()))
}

impl AwsVerifier {
    /// A verifier with AWS's shipped certificates and regional STS endpoints, reaching STS's
    /// answers through `sts`.
    pub fn new(sts: Arc<dyn CallerIdentity>) -> Self {
        Self {
            certificates: RegionCertificates::shipped(),
            endpoints: StsEndpoints::regional(),
            sts,
            max_age: DEFAULT_MAX_AGE,
        }
    }

    /// `--aws-iid-certificates`.
    pub fn with_certificates(mut self, certificates: RegionCertificates) -> Self {
        self.certificates = certificates;
        self
    }

    /// `--aws-sts-endpoint`.
    pub fn with_endpoints(mut self, endpoints: StsEndpoints) -> Self {
        self.endpoints = endpoints;
        self
    }

    /// `--cloud-attestation-max-age`.
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The verified identity document of this DATA block.
    pub fn verified_document(&self, data: &AwsData) -> Result<IdentityDocument, String> {
        let signed = SignedDocument::parse(&data.pkcs7().map_err(|e| format!("document: {e}"))?)
            .map_err(|e| format!("document: {e}"))?;
        // The region picks the certificate; a document claiming another region than the one
        // whose key signed it fails the signature below.
        let unverified = IdentityDocument::parse(signed.content()).map_err(|e| format!("document: {e}"))?;
        let certificate = self.certificates.for_region(&unverified.region).ok_or_else(|| {
            format!(
                "document: no AWS certificate for region {} (see --aws-iid-certificates)",
                unverified.region
            )
        })?;
        signed
            .verify(certificate)
            .map_err(|e| format!("signature: {e} ({})", unverified.region))?;
        Ok(unverified)
    }

    fn judge(&self, evidence: &Evidence<'_>) -> Result<Verification, Failure> {
        // The Cluster's configuration first: without its roles nothing is asked of STS.
        let roles = allow_list(evidence.cluster, ANNOTATION_AWS_ROLES)
            .map_err(not_allowed)?
            .ok_or_else(|| {
                not_allowed(format!(
                    "needs the Cluster's {ANNOTATION_AWS_ROLES}: the IAM roles of its nodes' instance profiles \
                     (roles whose trust policy admits only ec2.amazonaws.com), comma-separated"
                ))
            })?;
        let accounts = allow_list(evidence.cluster, ANNOTATION_AWS_ACCOUNTS).map_err(not_allowed)?;
        let data = evidence.data.ok_or_else(|| fail("needs an ATTESTATION DATA block"))?;
        let data = AwsData::parse(data).map_err(fail)?;
        let document = self.verified_document(&data).map_err(fail)?;
        if let Some(accounts) = accounts
            && !accounts.contains(&document.account_id)
        {
            return Err(fail(format!(
                "account: {} is not in the Cluster's {ANNOTATION_AWS_ACCOUNTS} ({})",
                document.account_id,
                accounts.join(",")
            )));
        }
        let provider_id = document.provider_id();
        if evidence.provider_id.as_str() != provider_id {
            return Err(fail(format!(
                "provider ID: the identity document is of {provider_id}, the CSR asks for {:?}",
                crate::identity::truncate(evidence.provider_id.as_str(), 96)
            )));
        }
        let binding = binding(&evidence.csr.spki_der);
        let call = data
            .sts
            .to_call(&CallChecks {
                region: &document.region,
                binding: &binding,
                endpoints: &self.endpoints,
                now: evidence.now,
                max_age: self.max_age,
            })
            .map_err(fail)?;
        let arn = match self.sts.answer(&call) {
            StsAnswer::Caller { arn } => arn,
            StsAnswer::Refused { status, error } => {
                return Err(fail(format!(
                    "STS: {} refused the signed request ({status}): {error}",
                    call.url
                )));
            }
            StsAnswer::Unavailable(why) => {
                return Ok(Verification::Pending {
                    message: format!("aws/v1: STS {} could not be asked: {why}", call.url),
                });
            }
            StsAnswer::NotAsked => {
                return Ok(Verification::NeedsCloud {
                    message: format!("aws/v1: asking STS {} who signed the request", call.url),
                    call: CloudCall::CallerIdentity(call),
                });
            }
        };
        check_instance_arn(
            &arn,
            &ExpectedCaller {
                region: &document.region,
                account_id: &document.account_id,
                instance_id: &document.instance_id,
                roles: &roles,
            },
        )
        .map_err(fail)?;
        Ok(Verification::Verified {
            ek_sha256: None,
            instance: Some(format!("{PROVIDER}:{}/{}", document.account_id, document.instance_id)),
            note: format!(
                "aws/v1: identity document of {} in account {} ({}) signed by AWS, STS names {arn} for a request bound to the CSR key",
                document.instance_id, document.account_id, document.availability_zone
            ),
            supersedes: None,
        })
    }
}

impl Verifier for AwsVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_AWS
    }

    /// The verified document names the instance, and the verifier holds it to the provider ID.
    fn proves_instance(&self) -> bool {
        true
    }

    fn verify(&self, evidence: &Evidence<'_>) -> Verification {
        self.judge(evidence)
            .unwrap_or_else(|(reason, message)| Verification::Failed { reason, message })
    }
}
