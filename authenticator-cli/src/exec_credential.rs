//! The client-go exec credential protocol: `KUBERNETES_EXEC_INFO` in, an `ExecCredential` of
//! the same apiVersion out (`client.authentication.k8s.io/v1` and `v1beta1`).

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The protocol versions this plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecApiVersion {
    /// `client.authentication.k8s.io/v1`
    V1,
    /// `client.authentication.k8s.io/v1beta1`
    V1beta1,
}

impl ExecApiVersion {
    /// The apiVersion string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "client.authentication.k8s.io/v1",
            Self::V1beta1 => "client.authentication.k8s.io/v1beta1",
        }
    }
}

/// Why `KUBERNETES_EXEC_INFO` is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExecInfoError {
    /// Not JSON, or not an object.
    #[error("KUBERNETES_EXEC_INFO is not a JSON ExecCredential: {0}")]
    Malformed(String),
    /// A version this plugin does not speak.
    #[error("KUBERNETES_EXEC_INFO asks for {0:?}; this plugin speaks client.authentication.k8s.io/v1 and v1beta1")]
    UnsupportedVersion(String),
}

/// Reads `KUBERNETES_EXEC_INFO`; absent or empty means v1 (client-go sends it unless the
/// kubeconfig's exec config says `provideClusterInfo: false` with an old client).
pub fn parse_exec_info(raw: Option<&str>) -> Result<ExecApiVersion, ExecInfoError> {
    let Some(raw) = raw.filter(|r| !r.trim().is_empty()) else {
        return Ok(ExecApiVersion::V1);
    };
    let value: Value = serde_json::from_str(raw).map_err(|e| ExecInfoError::Malformed(e.to_string()))?;
    if value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "ExecCredential")
    {
        return Err(ExecInfoError::Malformed("kind is not ExecCredential".into()));
    }
    match value.get("apiVersion").and_then(Value::as_str) {
        Some("client.authentication.k8s.io/v1") => Ok(ExecApiVersion::V1),
        Some("client.authentication.k8s.io/v1beta1") => Ok(ExecApiVersion::V1beta1),
        Some(other) => Err(ExecInfoError::UnsupportedVersion(other.chars().take(80).collect())),
        None => Err(ExecInfoError::Malformed("apiVersion is missing".into())),
    }
}

/// The workload apiserver as client-go describes it in `KUBERNETES_EXEC_INFO` when the
/// kubeconfig says `provideClusterInfo: true`: kubelet's own kubeconfig's cluster. Renewals use
/// it, so they keep working after `kubeadm join` deleted the bootstrap kubeconfig.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecCluster {
    /// `spec.cluster.server`
    pub server: String,
    /// `spec.cluster.certificate-authority-data` (PEM bytes; client-go reads a CA file in).
    pub certificate_authority: Option<Vec<u8>>,
    /// `spec.cluster.tls-server-name`
    pub tls_server_name: Option<String>,
}

impl std::fmt::Debug for ExecCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCluster")
            .field("server", &self.server)
            .field(
                "certificate_authority",
                &self.certificate_authority.as_ref().map(Vec::len),
            )
            .finish_non_exhaustive()
    }
}

/// Reads `spec.cluster` of `KUBERNETES_EXEC_INFO`, when client-go sent one. A cluster whose
/// TLS is not verified (`insecure-skip-tls-verify`) is refused: a renewal sends the node's
/// attestation and wants the real apiserver.
pub fn parse_exec_cluster(raw: Option<&str>) -> Result<Option<ExecCluster>, ExecInfoError> {
    use base64::Engine;
    let Some(raw) = raw.filter(|r| !r.trim().is_empty()) else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(raw).map_err(|e| ExecInfoError::Malformed(e.to_string()))?;
    let Some(cluster) = value.pointer("/spec/cluster").filter(|c| !c.is_null()) else {
        return Ok(None);
    };
    let text = |key: &str| cluster.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
    let Some(server) = text("server") else {
        return Err(ExecInfoError::Malformed("spec.cluster.server is missing".into()));
    };
    if cluster.get("insecure-skip-tls-verify").and_then(Value::as_bool) == Some(true) {
        return Err(ExecInfoError::Malformed(
            "spec.cluster.insecure-skip-tls-verify is set: the plugin renews only over verified TLS".into(),
        ));
    }
    let certificate_authority = text("certificate-authority-data")
        .map(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| ExecInfoError::Malformed(format!("spec.cluster.certificate-authority-data: {e}")))
        })
        .transpose()?;
    Ok(Some(ExecCluster {
        server: server.to_owned(),
        certificate_authority,
        tls_server_name: text("tls-server-name").map(str::to_owned),
    }))
}

/// The whole `ExecCredential` to print: built completely before anything is written, so
/// stdout never holds a partial credential.
pub fn exec_credential(version: ExecApiVersion, cert_pem: &str, key_pem: &str, expires: OffsetDateTime) -> String {
    let expiration = expires
        .replace_nanosecond(0)
        .unwrap_or(expires)
        .format(&Rfc3339)
        .unwrap_or_default();
    json!({
        "apiVersion": version.as_str(),
        "kind": "ExecCredential",
        "status": {
            "expirationTimestamp": expiration,
            "clientCertificateData": cert_pem,
            "clientKeyData": key_pem,
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_versions_are_answered_in_kind_and_absence_means_v1() {
        assert_eq!(parse_exec_info(None), Ok(ExecApiVersion::V1));
        assert_eq!(parse_exec_info(Some("  ")), Ok(ExecApiVersion::V1));
        let v1beta1 = r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}"#;
        assert_eq!(parse_exec_info(Some(v1beta1)), Ok(ExecApiVersion::V1beta1));
        let v1 = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false,"cluster":{"server":"https://x"}}}"#;
        assert_eq!(parse_exec_info(Some(v1)), Ok(ExecApiVersion::V1));
        assert!(matches!(
            parse_exec_info(Some(
                r#"{"apiVersion":"client.authentication.k8s.io/v1alpha1","kind":"ExecCredential"}"#
            )),
            Err(ExecInfoError::UnsupportedVersion(_))
        ));
        assert!(matches!(parse_exec_info(Some("{")), Err(ExecInfoError::Malformed(_))));
        assert!(matches!(
            parse_exec_info(Some(r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Pod"}"#)),
            Err(ExecInfoError::Malformed(_))
        ));
    }

    #[test]
    fn the_cluster_client_go_provides_is_read_and_an_unverified_one_refused() {
        assert_eq!(parse_exec_cluster(None), Ok(None));
        let without =
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false}}"#;
        assert_eq!(parse_exec_cluster(Some(without)), Ok(None));
        let with = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false,
            "cluster":{"server":"https://10.0.0.1:6443","certificate-authority-data":"UEVN","tls-server-name":"api"}}}"#;
        assert_eq!(
            parse_exec_cluster(Some(with)),
            Ok(Some(ExecCluster {
                server: "https://10.0.0.1:6443".into(),
                certificate_authority: Some(b"PEM".to_vec()),
                tls_server_name: Some("api".into()),
            }))
        );
        for bad in [
            r#"{"spec":{"cluster":{"server":"https://x","insecure-skip-tls-verify":true}}}"#,
            r#"{"spec":{"cluster":{"certificate-authority-data":"UEVN"}}}"#,
            r#"{"spec":{"cluster":{"server":"https://x","certificate-authority-data":"!"}}}"#,
            "[",
        ] {
            assert!(parse_exec_cluster(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_credential_echoes_the_version_and_carries_cert_key_and_expiry() {
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let out: Value = serde_json::from_str(&exec_credential(ExecApiVersion::V1beta1, "C", "K", at)).unwrap();
        assert_eq!(out["apiVersion"], "client.authentication.k8s.io/v1beta1");
        assert_eq!(out["kind"], "ExecCredential");
        assert_eq!(out["status"]["clientCertificateData"], "C");
        assert_eq!(out["status"]["clientKeyData"], "K");
        assert_eq!(out["status"]["expirationTimestamp"], "2027-01-15T08:00:00Z");
    }
}
