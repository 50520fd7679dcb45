//! `certificates.k8s.io/v1` CertificateSigningRequest -> the rule engine's [`CsrObject`].

use attestation::CsrObject;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use time::OffsetDateTime;

/// The fields the rules read, copied out of the API object.
pub fn csr_object(csr: &CertificateSigningRequest) -> CsrObject {
    let spec = &csr.spec;
    CsrObject {
        name: csr.metadata.name.clone().unwrap_or_default(),
        uid: csr.metadata.uid.clone().unwrap_or_default(),
        request: spec.request.0.clone(),
        signer_name: spec.signer_name.clone(),
        usages: spec.usages.clone().unwrap_or_default(),
        username: spec.username.clone().unwrap_or_default(),
        groups: spec.groups.clone().unwrap_or_default(),
        expiration_seconds: spec.expiration_seconds.map(i64::from),
        created: csr
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| OffsetDateTime::from_unix_timestamp_nanos(t.0.as_nanosecond()).ok()),
        annotations: csr.metadata.annotations.clone().unwrap_or_default(),
        finished: stage(csr) == Stage::Done,
    }
}

/// Where a CSR stands, from its conditions and certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// No decision yet.
    Pending,
    /// Approved, no certificate yet.
    Approved,
    /// Denied, Failed, or issued: nothing left to do.
    Done,
}

pub fn stage(csr: &CertificateSigningRequest) -> Stage {
    let status = csr.status.as_ref();
    if status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
    {
        return Stage::Done;
    }
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let has = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
    if has("Denied") || has("Failed") {
        Stage::Done
    } else if has("Approved") {
        Stage::Approved
    } else {
        Stage::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_copied_and_the_request_is_base64_decoded() {
        let csr: CertificateSigningRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": "csr-1", "uid": "u-1", "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"request": "aGVsbG8=", "signerName": "s", "usages": ["client auth"],
                     "username": "system:bootstrap:abcdef", "groups": ["system:bootstrappers"], "expirationSeconds": 3600}
        }))
        .unwrap();
        let object = csr_object(&csr);
        assert_eq!(object.request, b"hello");
        assert_eq!(object.expiration_seconds, Some(3600));
        assert_eq!(object.created.map(|t| t.unix_timestamp()), Some(1_767_323_045));
        assert_eq!((object.name.as_str(), object.uid.as_str()), ("csr-1", "u-1"));
    }
}
