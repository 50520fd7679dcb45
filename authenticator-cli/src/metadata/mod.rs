//! The clouds' instance metadata services, as the `gcp/v1`, `aws/v1` and `azure/v1` attestors
//! reach them: [`GceMetadataHttp`] implements the attestation crate's [`GceMetadata`], [`ImdsV2`]
//! its [`Ec2Metadata`], [`AzureImdsHttp`] its [`AzureImds`] (and finds the VM's CAPZ provider ID,
//! [`AzureImdsHttp::provider_id`]).
//!
//! The services speak plain HTTP/1.1 on a link-local address, a few small requests per
//! attestation, and the attestor traits are synchronous: a blocking client over
//! [`std::net::TcpStream`] is all it takes, so no HTTP stack comes in for it. It connects to the
//! address configured, never through the environment's proxy (`HTTP_PROXY` is not read: Azure
//! does not support reaching IMDS through a proxy, and the services are link-local). One request per
//! connection (`Connection: close`); every wait is bounded ([`CONNECT_TIMEOUT`], then
//! [`READ_TIMEOUT`] for the whole answer) and so is every size (16 KiB of status line and
//! headers, [`MAX_BODY`] of body, read by `Content-Length`, chunked, or until the close).
//! Answers can carry credentials (a session token, the role's secret key), so their bytes are
//! kept in memory that is zeroed when dropped, and no error ever quotes a body: errors name
//! the service, the URL and the status.
//!
//! An unreachable service (no route, refused, no answer in time) is
//! [`AttestError::DeviceUnavailable`]: the node is not on that cloud, or the service is
//! briefly away. An answer that is wrong (an error status, a missing header, a malformed
//! body) is [`AttestError::Failed`]. Azure's IMDS alone is asked again, a bounded number of
//! times ([`AZURE_TRIES`]), when it says so (429, 410, 5xx) or answers a stale document.
//!
//! Where the services are follows the platforms' SDK conventions (SPEC section 5):
//! `GCE_METADATA_HOST` (host\[:port\]) and `AWS_EC2_METADATA_SERVICE_ENDPOINT` (a URL), for a
//! proxy, an emulator or a test's stand-in. The Azure SDKs have no such setting for IMDS as a
//! whole (azure-identity's `AZURE_POD_IDENTITY_AUTHORITY_HOST` and `IMDS_ENDPOINT` move only the
//! managed-identity token endpoint), so `AZURE_METADATA_ENDPOINT` (a URL) is this plugin's, the
//! name other Azure tools (lego) give the metadata service's URL.
//!
//! - [`http`]: the blocking HTTP/1.1 client the three share (one request a connection, every
//!   wait and size bounded, endpoints read from their settings), and the two small helpers every
//!   room needs for what it sends and says ([`http::percent_encode`], [`http::shown`]).
//! - [`gce`]: [`GceMetadataHttp`], the GCE metadata server's identity token.
//! - [`ec2`]: [`ImdsV2`], the EC2 instance metadata service over IMDSv2: the identity document's
//!   signature and the instance role's credentials.
//! - [`azure`]: [`AzureImdsHttp`], Azure's IMDS: the attested document, asked again as IMDS says,
//!   and the VM's provider ID as CAPZ writes it ([`capz_provider_id`]).
//!
//! [`CONNECT_TIMEOUT`]: http::CONNECT_TIMEOUT
//! [`READ_TIMEOUT`]: http::READ_TIMEOUT
//! [`MAX_BODY`]: http::MAX_BODY
//! [`AZURE_TRIES`]: azure::AZURE_TRIES
//! [`capz_provider_id`]: azure::capz_provider_id
//! [`GceMetadata`]: attestation::gcp::attestor::GceMetadata
//! [`Ec2Metadata`]: attestation::aws::attestor::Ec2Metadata
//! [`AzureImds`]: attestation::azure::attestor::AzureImds
//! [`AttestError::DeviceUnavailable`]: attestation::attestor::AttestError::DeviceUnavailable
//! [`AttestError::Failed`]: attestation::attestor::AttestError::Failed

mod azure;
mod ec2;
mod gce;
mod http;

use anyhow::{Result, bail};

pub use azure::AzureImdsHttp;
pub use ec2::ImdsV2;
pub use gce::GceMetadataHttp;

/// An environment variable's value when it is set and not empty (how the SDKs treat theirs);
/// a value that is not UTF-8 is an error rather than silently ignored.
pub fn env_value(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(Some(value.trim().to_owned())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{name} is not UTF-8"),
    }
}

/// What the rooms' tests share: a loopback stand-in for a metadata service, and canned answers.
#[cfg(test)]
mod test_support {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use attestation::attestor::AttestError;

    use super::{AzureImdsHttp, GceMetadataHttp, ImdsV2};

    /// A loopback stand-in for a metadata service: answers each connection with the next
    /// canned answer, in order, and records each request's head.
    pub(super) struct StandIn {
        pub(super) address: String,
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl StandIn {
        pub(super) fn answering(answers: Vec<Vec<u8>>) -> Self {
            Self::answering_then(answers, Duration::ZERO)
        }

        /// Keeps each connection open `hold` after answering, as a server ignoring
        /// `Connection: close` would.
        pub(super) fn answering_then(answers: Vec<Vec<u8>>, hold: Duration) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let recorded = Arc::clone(&requests);
            std::thread::spawn(move || {
                for answer in answers {
                    let Ok((mut stream, _)) = listener.accept() else {
                        return;
                    };
                    let request = read_head(&mut stream);
                    recorded.lock().unwrap().push(request);
                    let _ = stream.write_all(&answer);
                    std::thread::sleep(hold);
                }
            });
            Self { address, requests }
        }

        pub(super) fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }

        pub(super) fn gce(&self) -> GceMetadataHttp {
            GceMetadataHttp::new(Some(&self.address)).unwrap()
        }

        pub(super) fn imds(&self) -> ImdsV2 {
            ImdsV2::new(Some(&format!("http://{}/", self.address))).unwrap()
        }

        /// Azure's IMDS here, waiting 10 ms (doubled each time) instead of 1 s between tries.
        pub(super) fn azure(&self) -> AzureImdsHttp {
            let mut imds = AzureImdsHttp::new(Some(&format!("http://{}/", self.address))).unwrap();
            imds.first_delay = Duration::from_millis(10);
            imds
        }
    }

    /// The request's head (this client's requests have no body).
    fn read_head(stream: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    pub(super) fn answer(status: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
        let mut text = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        text.into_bytes()
    }

    pub(super) fn ok(body: &str) -> Vec<u8> {
        answer("200 OK", &[], body)
    }

    pub(super) fn google(body: &str) -> Vec<u8> {
        answer("200 OK", &[("Metadata-Flavor", "Google")], body)
    }

    pub(super) const RSA2048: &str = "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSABIIB\nbnsKICAiYWNjb3VudElkIiA6ICIxMjM0NTY3ODkwMTIiLAo=";

    pub(super) fn failed(result: Result<impl std::fmt::Debug, AttestError>) -> String {
        match result {
            Err(AttestError::Failed(message)) => message,
            other => panic!("expected AttestError::Failed, got {other:?}"),
        }
    }
}
