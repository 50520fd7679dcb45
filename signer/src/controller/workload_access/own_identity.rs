//! The signer's own identity in a workload cluster: user [`USER`], with a client certificate
//! the signer issues itself from `<cluster>-ca` for a key it generates and keeps in memory, and
//! renews ahead of expiry.
//!
//! The certificate sits under the client in a [`Renewing`] transport: each request takes the
//! current connection pool, and the first request after two thirds of the certificate's life
//! issues a new key and certificate and starts a new pool. The apiserver checks a client
//! certificate per request against its own clock (not once per connection), so requests must
//! move to the new certificate before the old one expires; requests already running (a watch)
//! finish on the old connection, which closes when they do. A failed renewal keeps the current
//! certificate and is tried again a minute later (sooner for short lifetimes), with a third of
//! the lifetime left to do so.
//!
//! Nothing of the Cluster API admin kubeconfig reaches this client but where and how to reach
//! the apiserver (URL, its CA, TLS server name, timeouts): no token, no exec plugin, no
//! impersonation header.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use attestation::ca::ClusterCa;
use base64::Engine;
use kube::config::AuthInfo;
use kube::{Client, Config};
use time::{Duration, OffsetDateTime};
use zeroize::Zeroizing;

use crate::controller::client::{Transport, over, transport};
use crate::controller::metrics::Metrics;
use crate::locks::lock;

/// The user the signer is in every workload cluster (config/workload binds it).
pub const USER: &str = "node-attestation-signer";

/// How long after a failed renewal the next request tries again: a twelfth of the lifetime
/// (four tries in the third left), between 10 seconds and a minute.
fn renewal_retry(lifetime: Duration) -> Duration {
    (lifetime / 12_i32).clamp(Duration::seconds(10), Duration::minutes(1))
}

/// When a certificate valid from `issued` to `not_after` is replaced: after two thirds of its
/// life, leaving a third (20 minutes of the default hour) for failed renewals to be retried.
pub fn renew_at(issued: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    issued + (not_after - issued) * 2 / 3
}

/// Why the signer's own identity could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The kubeconfig names a proxy, which this transport does not speak.
    #[error(
        "it names a proxy ({proxy}), which the signer's own identity does not go through; give the signer a kubeconfig of your own in Secret <cluster>-node-attestation-kubeconfig"
    )]
    Proxy {
        /// The proxy URL.
        proxy: String,
    },
    /// No key could be generated.
    #[error("cannot generate a key for the signer's own certificate: {0}")]
    Key(String),
    /// The CA would not issue (expired, say).
    #[error("cannot issue the signer's own certificate from the Cluster's CA: {0}")]
    Issue(#[from] attestation::ca::IssueError),
    /// The TLS configuration could not be built from the certificate and the apiserver's CA.
    #[error("cannot set up TLS with the signer's own certificate: {0}")]
    Tls(String),
}

/// Where and how to reach one workload apiserver, and the CA to issue from.
struct Issuer {
    /// The admin kubeconfig's connection settings, without its credentials.
    reach: Config,
    ca: Arc<ClusterCa>,
    lifetime: Duration,
}

impl Issuer {
    /// A new key and certificate, and a connection pool presenting them.
    fn issue(&self, now: OffsetDateTime) -> Result<(Transport, OffsetDateTime), IdentityError> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| IdentityError::Key(e.to_string()))?;
        let issued = self.ca.issue_own_identity(&key, USER, now, self.lifetime)?;
        let key_pem = Zeroizing::new(key.serialize_pem());
        let engine = base64::engine::general_purpose::STANDARD;
        let mut config = self.reach.clone();
        config.auth_info = AuthInfo {
            client_certificate_data: Some(engine.encode(issued.pem())),
            client_key_data: Some(engine.encode(key_pem.as_bytes()).into()),
            ..AuthInfo::default()
        };
        let pool = transport(&config).map_err(|e| IdentityError::Tls(e.to_string()))?;
        Ok((pool, issued.not_after))
    }
}

/// The connection pool in use and when it is replaced.
struct Current {
    pool: Transport,
    renew_at: OffsetDateTime,
    /// The next renewal attempt after a failed one.
    retry_at: Option<OffsetDateTime>,
    not_after: OffsetDateTime,
}

/// A transport that presents the signer's current certificate and renews it on the first
/// request after [`renew_at`] (see the module's documentation).
#[derive(Clone)]
pub struct Renewing {
    issuer: Arc<Issuer>,
    current: Arc<Mutex<Current>>,
    metrics: Metrics,
}

impl Renewing {
    /// The pool to send the next request on, renewed first when due.
    fn pool(&self) -> Transport {
        let now = OffsetDateTime::now_utc();
        let mut current = lock(&self.current);
        let due = now >= current.renew_at && current.retry_at.is_none_or(|at| now >= at);
        if due {
            match self.issuer.issue(now) {
                Ok((pool, not_after)) => {
                    self.metrics.workload_identity_certificate("issued");
                    tracing::debug!(%not_after, "renewed the signer's own client certificate");
                    *current = Current {
                        pool,
                        renew_at: renew_at(now, not_after),
                        retry_at: None,
                        not_after,
                    };
                }
                Err(e) => {
                    self.metrics.workload_identity_certificate("failed");
                    tracing::warn!(
                        error = %e,
                        not_after = %current.not_after,
                        "cannot renew the signer's own client certificate; the current one is used until it expires, and renewal is tried again shortly"
                    );
                    current.retry_at = Some(now + renewal_retry(self.issuer.lifetime));
                }
            }
        }
        current.pool.clone()
    }
}

impl tower::Service<hyper::http::Request<kube::client::Body>> for Renewing {
    type Response = <Transport as tower::Service<hyper::http::Request<kube::client::Body>>>::Response;
    type Error = <Transport as tower::Service<hyper::http::Request<kube::client::Body>>>::Error;
    type Future = <Transport as tower::Service<hyper::http::Request<kube::client::Body>>>::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's pool is always ready; the pool a request goes to is chosen in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: hyper::http::Request<kube::client::Body>) -> Self::Future {
        let mut pool = self.pool();
        tower::Service::call(&mut pool, request)
    }
}

/// A client of the workload apiserver `admin` reaches, as [`USER`] with a certificate from `ca`
/// of `lifetime`, renewed as it ages.
pub fn client(
    admin: &Config,
    ca: Arc<ClusterCa>,
    lifetime: Duration,
    metrics: Metrics,
) -> Result<Client, IdentityError> {
    if let Some(proxy) = &admin.proxy_url {
        return Err(IdentityError::Proxy {
            proxy: proxy.to_string(),
        });
    }
    let mut reach = Config::new(admin.cluster_url.clone());
    reach.default_namespace = admin.default_namespace.clone();
    reach.root_cert = admin.root_cert.clone();
    reach.accept_invalid_certs = admin.accept_invalid_certs;
    reach.tls_server_name = admin.tls_server_name.clone();
    reach.connect_timeout = admin.connect_timeout;
    reach.read_timeout = admin.read_timeout;
    reach.write_timeout = admin.write_timeout;
    reach.disable_compression = admin.disable_compression;
    let issuer = Arc::new(Issuer { reach, ca, lifetime });
    let now = OffsetDateTime::now_utc();
    let (pool, not_after) = issuer.issue(now)?;
    metrics.workload_identity_certificate("issued");
    let current = Current {
        pool,
        renew_at: renew_at(now, not_after),
        retry_at: None,
        not_after,
    };
    let renewing = Renewing {
        current: Arc::new(Mutex::new(current)),
        issuer: Arc::clone(&issuer),
        metrics,
    };
    over(&issuer.reach, renewing).map_err(|e| IdentityError::Tls(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_renewed_after_two_thirds_of_its_life() {
        let issued = OffsetDateTime::UNIX_EPOCH + Duration::days(20_000);
        assert_eq!(
            renew_at(issued, issued + Duration::hours(1)),
            issued + Duration::minutes(40)
        );
        assert_eq!(
            renew_at(issued, issued + Duration::minutes(15)),
            issued + Duration::minutes(10)
        );
        // Clamped to the CA: a certificate the CA cut short is renewed sooner, not later.
        assert_eq!(
            renew_at(issued, issued + Duration::minutes(3)),
            issued + Duration::minutes(2)
        );
    }

    #[test]
    fn a_failed_renewal_is_tried_again_several_times_before_the_certificate_expires() {
        assert_eq!(renewal_retry(Duration::hours(1)), Duration::minutes(1));
        assert_eq!(renewal_retry(Duration::minutes(3)), Duration::seconds(15));
        assert_eq!(renewal_retry(Duration::minutes(1)), Duration::seconds(10));
        for lifetime in [
            Duration::minutes(3),
            Duration::minutes(10),
            Duration::hours(1),
            Duration::hours(24),
        ] {
            let left = lifetime
                - (renew_at(OffsetDateTime::UNIX_EPOCH, OffsetDateTime::UNIX_EPOCH + lifetime)
                    - OffsetDateTime::UNIX_EPOCH);
            assert!(left / renewal_retry(lifetime) >= 4.0, "{lifetime}: at least four tries");
        }
    }
}
