//! `gcp/v1`'s metadata service: [`GceMetadataHttp`], the identity token of the instance's
//! default service account from the Compute Engine metadata server (`GCE_METADATA_HOST`), with
//! `Metadata-Flavor: Google` sent and required in return. A room of its own, as the attestation
//! crate's `gcp/`, so what is asked of GCE and how its answer is read stand together over the
//! shared [`super::http`] client.

use anyhow::{Context, Result, bail};
use attestation::attestor::AttestError;
use attestation::gcp::attestor::GceMetadata;

use super::env_value;
use super::http::{Server, parse_authority, percent_encode};

/// The environment variable naming the GCE metadata server (host\[:port\]), as Google's SDKs
/// read it.
pub const GCE_METADATA_HOST_ENV: &str = "GCE_METADATA_HOST";

/// The GCE metadata server's name inside Compute Engine.
const DEFAULT_GCE_METADATA_HOST: &str = "metadata.google.internal";

/// The identity endpoint of the instance's default service account.
const GCE_IDENTITY_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/identity";

const GCE_SERVICE: &str = "the GCE metadata server";

/// [`GceMetadata`] over HTTP: the identity token of the instance's default service account,
/// asked of the Compute Engine metadata server with `Metadata-Flavor: Google`. An answer
/// without that header in return is refused: whatever answered is not the metadata server
/// (a captive proxy, a stray listener), and its "token" is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceMetadataHttp {
    pub(super) server: Server,
}

impl GceMetadataHttp {
    /// The metadata server named by `GCE_METADATA_HOST` when it is set (a proxy or an
    /// emulator, as Google's SDKs allow), else `metadata.google.internal`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(GCE_METADATA_HOST_ENV)?.as_deref())
    }

    /// The metadata server at `host` (host\[:port\], no scheme: the SDK convention), or the
    /// default one.
    pub fn new(host: Option<&str>) -> Result<Self> {
        let authority = host.unwrap_or(DEFAULT_GCE_METADATA_HOST);
        if authority.contains("://") {
            bail!("{GCE_METADATA_HOST_ENV} {authority:?} is host[:port], without a scheme");
        }
        let (host, port) =
            parse_authority(authority).with_context(|| format!("{GCE_METADATA_HOST_ENV} {authority:?}"))?;
        Ok(Self {
            server: Server::new(GCE_SERVICE, host, port, authority, ""),
        })
    }
}

impl GceMetadata for GceMetadataHttp {
    fn identity_token(&mut self, audience: &str) -> Result<String, AttestError> {
        let target = format!("{GCE_IDENTITY_PATH}?audience={}&format=full", percent_encode(audience));
        let response = self.server.send("GET", &target, &[("Metadata-Flavor", "Google")])?;
        if response.header("metadata-flavor") != Some("Google") {
            return Err(AttestError::Failed(format!(
                "the answer from {} has no `Metadata-Flavor: Google` header: it is not the GCE metadata server's, and it is not used",
                self.server.url(&target)
            )));
        }
        let body = self.server.success(&response, &target, "an identity token")?;
        let token = std::str::from_utf8(body)
            .map_err(|_| self.server.bad_body(&target, "the identity token is not UTF-8"))?
            .trim();
        if token.is_empty() {
            return Err(self.server.bad_body(&target, "the identity token is empty"));
        }
        Ok(token.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::test_support::{StandIn, answer, failed, google, ok};

    #[test]
    fn the_gce_audience_is_url_encoded_in_the_query_and_metadata_flavor_is_sent() {
        let stand_in = StandIn::answering(vec![google("h.p.s\n")]);
        let token = stand_in
            .gce()
            .identity_token("node-attestation.cluster.x-k8s.io/ab_-c+d e&f")
            .unwrap();
        assert_eq!(token, "h.p.s");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(
            request.starts_with(
                "GET /computeMetadata/v1/instance/service-accounts/default/identity?audience=node-attestation.cluster.x-k8s.io%2Fab_-c%2Bd%20e%26f&format=full HTTP/1.1\r\n"
            ),
            "{request}"
        );
        assert!(request.contains("\r\nMetadata-Flavor: Google\r\n"), "{request}");
        assert!(
            request.contains(&format!("\r\nHost: {}\r\n", stand_in.address)),
            "{request}"
        );
        assert!(request.contains("\r\nConnection: close\r\n"), "{request}");
    }

    #[test]
    fn a_gce_answer_without_metadata_flavor_is_refused_and_its_token_unused() {
        let stand_in = StandIn::answering(vec![ok("not.the.token")]);
        let message = failed(stand_in.gce().identity_token("aud"));
        assert!(message.contains("Metadata-Flavor: Google"), "{message}");
        assert!(!message.contains("not.the.token"), "{message}");
    }

    #[test]
    fn a_gce_error_status_names_the_url_and_the_status() {
        let stand_in = StandIn::answering(vec![answer(
            "400 Bad Request",
            &[("Metadata-Flavor", "Google")],
            "non-empty audience parameter required",
        )]);
        let message = failed(stand_in.gce().identity_token("aud"));
        assert!(message.contains("400 Bad Request"), "{message}");
        assert!(
            message.contains(&format!(
                "http://{}/computeMetadata/v1/instance/service-accounts/default/identity?audience=aud&format=full",
                stand_in.address
            )),
            "{message}"
        );
        assert!(message.contains("an identity token"), "{message}");
    }
}
