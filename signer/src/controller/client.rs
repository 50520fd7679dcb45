//! Kubernetes clients that speak HTTP/2 when the apiserver offers it.
//!
//! kube's default client speaks HTTP/1.1 only, so every request in flight holds its own TCP and
//! TLS connection: 64 CSRs in flight were 64 handshakes on the apiserver and 64 sets of TLS and
//! HTTP buffers in the signer (the RSS climbed from 24 to 70 MiB in a 500-CSR storm). Every
//! kube-apiserver offers `h2` through ALPN, so this builds the same stack kube builds (base
//! URI, credentials, extra headers from the kubeconfig, TLS from it) on a connector that offers
//! `h2` and `http/1.1`: one connection per apiserver then carries every request and watch
//! at once. Keep-alive pings find a dead connection in under a minute, since with one
//! connection a silent failure would hold every request, not one.
//!
//! A kubeconfig naming a proxy gets kube's own client (HTTP/1.1), which knows proxies.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::{Client, Config};
use tower::ServiceBuilder;

/// Idle HTTP/1.1 connections kept per apiserver when it does not offer HTTP/2.
const IDLE_HTTP1_CONNECTIONS: usize = 8;

/// A client for `config`: HTTP/2 when the apiserver negotiates it, HTTP/1.1 otherwise.
pub fn build(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Only fails when another thread installed one first, which is as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config.rustls_client_config()?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| kube::Error::Service(format!("tls-server-name {name:?}: {e}").into()))?;
        builder = builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_all_versions().wrap_connector(http);
    let transport: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(IDLE_HTTP1_CONNECTIONS)
            .http2_keep_alive_interval(Some(Duration::from_secs(30)))
            .http2_keep_alive_timeout(Duration::from_secs(15))
            .http2_keep_alive_while_idle(true)
            .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace))
}
