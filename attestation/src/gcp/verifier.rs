//! The `gcp/v1` verifier: SPEC section 5's checks on a Compute Engine identity token, in an
//! order that reads nothing the signature does not cover: the header (algorithm, key ID), the
//! key, the signature, and only then the claims (issuer, audience, age, instance).

use std::sync::Arc;

use time::{Duration, OffsetDateTime};

use super::jwt::{ComputeEngine, IdentityClaims, SignedToken};
use super::keys::{GoogleKeys, KeyLookup};
use super::{GcpData, ISSUERS, PROVIDER, audience};
use crate::attestor::{Evidence, Verification, Verifier};
use crate::cloud::{CloudCall, DEFAULT_MAX_AGE, allow_list, check_fresh, rfc3339};
use crate::decision::DenyReason;
use crate::names::{ANNOTATION_GCP_PROJECTS, SIGNER_GCP};

/// Signer side of `gcp/v1`.
pub struct GcpVerifier {
    keys: Arc<dyn GoogleKeys>,
    max_age: Duration,
}

impl std::fmt::Debug for GcpVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpVerifier")
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl GcpVerifier {
    /// A verifier finding Google's keys through `keys`.
    pub fn new(keys: Arc<dyn GoogleKeys>) -> Self {
        Self {
            keys,
            max_age: DEFAULT_MAX_AGE,
        }
    }

    /// How old a token may be (`--cloud-attestation-max-age`).
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    fn judge(&self, evidence: &Evidence<'_>) -> Result<Verification, Failure> {
        let data = evidence.data.ok_or_else(|| fail("needs an ATTESTATION DATA block"))?;
        let data = GcpData::parse(data).map_err(fail)?;
        let token = SignedToken::parse(&data.identity_token).map_err(|e| fail(format!("signature: {e}")))?;
        let key = match self.keys.key(token.kid()) {
            KeyLookup::Found(key) => key,
            KeyLookup::Unknown { fetched_at } => return self.unknown_key(evidence, token.kid(), fetched_at),
            KeyLookup::NotLoaded { why } => {
                return Ok(Verification::NeedsCloud {
                    call: CloudCall::RefreshGoogleKeys,
                    message: format!(
                        "gcp/v1: Google's keys are not loaded yet{}",
                        why.map(|w| format!(" (last fetch: {w})")).unwrap_or_default()
                    ),
                });
            }
        };
        let claims = token.verify(&key).map_err(|e| fail(format!("signature: {e}")))?;
        let instance = self.check_claims(evidence, &claims)?;
        Ok(Verification::Verified {
            ek_sha256: None,
            instance: Some(format!("{PROVIDER}:{}/{}", instance.project_id, instance.instance_id)),
            note: format!(
                "gcp/v1: Google-signed token (key {}) for instance {} ({}) of project {}, bound to the CSR key, issued {}",
                token.kid(),
                instance.instance_name,
                instance.instance_id,
                instance.project_id,
                rfc3339(OffsetDateTime::from_unix_timestamp(claims.iat).unwrap_or(OffsetDateTime::UNIX_EPOCH)),
            ),
            supersedes: None,
        })
    }

    /// A token naming a key the set lacks: refused once the set was fetched after the signer
    /// first saw the CSR (the token is older than the CSR, so a key Google still used would be
    /// there); otherwise the keys are fetched again first, since Google may have rotated. Both
    /// times are the signer's own clock: the CSR's creationTimestamp is the apiserver's, and an
    /// apiserver clock ahead of the signer's would keep the CSR waiting until it expired.
    fn unknown_key(
        &self,
        evidence: &Evidence<'_>,
        kid: &str,
        fetched_at: Option<OffsetDateTime>,
    ) -> Result<Verification, Failure> {
        match fetched_at {
            None => Err(fail(format!("signature: key {kid:?} is not among Google's keys"))),
            Some(fetched) if fetched > evidence.first_seen => Err(fail(format!(
                "signature: key {kid:?} is not among Google's keys (fetched {}, after the CSR was filed)",
                rfc3339(fetched)
            ))),
            Some(fetched) => Ok(Verification::NeedsCloud {
                call: CloudCall::RefreshGoogleKeys,
                message: format!(
                    "gcp/v1: key {kid:?} is not among Google's keys fetched {}; fetching them again",
                    rfc3339(fetched)
                ),
            }),
        }
    }

    fn check_claims<'c>(
        &self,
        evidence: &Evidence<'_>,
        claims: &'c IdentityClaims,
    ) -> Result<&'c ComputeEngine, Failure> {
        if !ISSUERS.contains(&claims.iss.as_str()) {
            return Err(fail(format!(
                "issuer: {} is not Google's ({})",
                shown(&claims.iss),
                ISSUERS.join(" or ")
            )));
        }
        let expected = audience(&evidence.csr.spki_der);
        if claims.aud != expected {
            return Err(fail(format!(
                "audience/binding: the token is for audience {}, not {expected} (this CSR's key)",
                shown(&claims.aud)
            )));
        }
        let at = |secs: i64, what: &str| {
            OffsetDateTime::from_unix_timestamp(secs).map_err(|_| fail(format!("age: {what} {secs} is out of range")))
        };
        let (exp, iat) = (at(claims.exp, "exp")?, at(claims.iat, "iat")?);
        if exp + crate::cloud::CLOCK_SKEW <= evidence.now {
            return Err(fail(format!(
                "age: the token expired at {} (now {})",
                rfc3339(exp),
                rfc3339(evidence.now)
            )));
        }
        if let Some(nbf) = claims.nbf {
            let nbf = at(nbf, "nbf")?;
            if nbf > evidence.now + crate::cloud::CLOCK_SKEW {
                return Err(fail(format!(
                    "age: the token is not valid before {} (now {})",
                    rfc3339(nbf),
                    rfc3339(evidence.now)
                )));
            }
        }
        check_fresh("the token's iat", iat, evidence.now, self.max_age).map_err(|e| fail(format!("age: {e}")))?;
        let instance = claims
            .google
            .as_ref()
            .and_then(|g| g.compute_engine.as_ref())
            .ok_or_else(|| fail("provider ID: the token names no Compute Engine instance (format=full is needed)"))?;
        instance.check_shape().map_err(|e| fail(format!("provider ID: {e}")))?;
        if let Some(projects) = allow_list(evidence.cluster, ANNOTATION_GCP_PROJECTS)
            .map_err(|e| (DenyReason::AttestationNotAllowed, format!("gcp/v1 {e}")))?
            && !projects.contains(&instance.project_id)
        {
            return Err(fail(format!(
                "project: {} is not in the Cluster's {ANNOTATION_GCP_PROJECTS} ({})",
                shown(&instance.project_id),
                projects.join(",")
            )));
        }
        let provider_id = format!(
            "gce://{}/{}/{}",
            instance.project_id, instance.zone, instance.instance_name
        );
        if evidence.provider_id.as_str() != provider_id {
            return Err(fail(format!(
                "provider ID: the token is for {}, the CSR asks for {}",
                shown(&provider_id),
                shown(evidence.provider_id.as_str())
            )));
        }
        Ok(instance)
    }
}

type Failure = (DenyReason, String);

fn fail(message: impl Into<String>) -> Failure {
    (DenyReason::AttestationInvalid, format!("gcp/v1 {}", message.into()))
}

fn shown(value: &str) -> String {
    format!("{:?}", crate::identity::truncate(value, 96))
}

impl Verifier for GcpVerifier {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }

    fn signer_name(&self) -> &'static str {
        SIGNER_GCP
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
