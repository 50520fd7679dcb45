//! The one HTTP client the signer reaches the clouds with (hyper over rustls with aws-lc-rs, the
//! public roots compiled in plus `--cloud-ca-bundle`), a bounded exchange over it, and the
//! memory the clouds' answers are kept in. Shared by Google's keys, STS and Azure Resource
//! Manager (and the Azure SDK's token requests, [`super::azure`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Longest answer read from Google, STS, ARM or a token endpoint.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// An HTTPS client for the cloud endpoints (plain HTTP too, for a test or a local endpoint),
/// through the environment's egress proxy where it applies ([`super::proxy`]).
pub type HttpClient = Client<hyper_rustls::HttpsConnector<super::proxy::ProxyConnector>, Full<Bytes>>;

/// The client, trusting the public roots and the PEM certificates of `ca_bundle`.
pub fn http_client(ca_bundle: Option<&Path>, timeout: Duration) -> Result<HttpClient> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Only fails when another thread installed one first, which is as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_bundle {
        let pem = std::fs::read(path).with_context(|| format!("cannot read --cloud-ca-bundle {}", path.display()))?;
        let blocks =
            pem::parse_many(&pem).with_context(|| format!("--cloud-ca-bundle {} is not PEM", path.display()))?;
        for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
            roots
                .add(rustls::pki_types::CertificateDer::from(block.contents().to_vec()))
                .with_context(|| format!("--cloud-ca-bundle {}: a certificate is not usable", path.display()))?;
        }
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector({
            let connector = super::proxy::ProxyConnector::from_env(http);
            let probe: hyper::Uri = hyper::Uri::from_static("https://sts.amazonaws.com/");
            if let Some(proxy) = connector.proxy_for(&probe) {
                // Host and port only: a proxy URL may carry credentials.
                tracing::info!(
                    proxy_host = proxy.host().unwrap_or_default(),
                    proxy_port = proxy.port_u16(),
                    "cloud calls go through the egress proxy (HTTPS_PROXY; NO_PROXY exempts hosts)"
                );
            }
            connector
        });
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// An answer: status, `Cache-Control: max-age`, headers, body.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// `Cache-Control: max-age`.
    pub max_age: Option<Duration>,
    /// The headers.
    pub headers: hyper::HeaderMap,
    /// The body (at most [`MAX_ANSWER_BYTES`]).
    pub body: Vec<u8>,
}

/// Sends `request` and reads the answer, all within `timeout`.
pub async fn send(
    client: &HttpClient,
    request: hyper::Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<Answer, String> {
    let exchange = async {
        let response = client.request(request).await.map_err(|e| format!("{e}"))?;
        let status = response.status().as_u16();
        let max_age = response
            .headers()
            .get(hyper::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .and_then(cache_max_age);
        let headers = response.headers().clone();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes()
            .to_vec();
        Ok(Answer {
            status,
            max_age,
            headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", timeout.as_secs())))
}

/// `max-age=N` of a `Cache-Control` value.
pub fn cache_max_age(value: &str) -> Option<Duration> {
    value
        .split(',')
        .filter_map(|d| d.trim().strip_prefix("max-age="))
        .find_map(|n| n.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Keeps `answer` for `key` in a map of at most `max` answers, each good for `lifetime(answer)`
/// from when it was kept. A full map first forgets expired answers, then the oldest: the newest
/// answer is always kept, since the decision that asked reads it next (dropping it would make
/// that CSR ask again, and again, while thousands of fresh answers fill the map).
pub fn remember<K: Eq + Hash + Clone, V>(
    answers: &mut HashMap<K, (V, Instant)>,
    key: K,
    answer: V,
    max: usize,
    lifetime: impl Fn(&V) -> Duration,
) {
    if answers.len() >= max {
        answers.retain(|_, (answer, at)| at.elapsed() < lifetime(answer));
    }
    while answers.len() >= max {
        let Some(oldest) = answers.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) else {
            break;
        };
        answers.remove(&oldest);
    }
    answers.insert(key, (answer, Instant::now()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_max_age_is_read() {
        assert_eq!(
            cache_max_age("public, max-age=19817, must-revalidate, no-transform"),
            Some(Duration::from_secs(19817))
        );
        assert_eq!(cache_max_age("no-cache"), None);
    }
}
