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
//! Proxies, as client-go takes them: a kubeconfig's `proxy-url` gets kube's own client (HTTP/1.1),
//! which knows proxies; otherwise `HTTPS_PROXY` and `NO_PROXY` from the environment are matched
//! against the apiserver's own address ([`crate::cloud::proxy`], the cloud calls' connector), so
//! `NO_PROXY` exempts an apiserver. kube's loader takes `HTTPS_PROXY` itself and matches
//! `NO_PROXY` against the proxy's address, which can exempt no apiserver: that value is set aside
//! ([`environment_proxy_set_aside`]). An operator who sets `HTTPS_PROXY` for the cloud calls must
//! therefore name in `NO_PROXY` the apiservers the signer reaches directly.

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
    build_with(config, false)
}

/// A client that sends only `GET`s (gets, lists, watches): any other request is refused before
/// it leaves the process. `explain` runs on production clusters with this, so its promise to
/// write nothing does not rest on every code path remembering it.
pub fn build_read_only(config: Config) -> Result<Client, kube::Error> {
    build_with(config, true)
}

fn build_with(config: Config, read_only: bool) -> Result<Client, kube::Error> {
    let config = environment_proxy_set_aside(config);
    if config.proxy_url.is_some() {
        if read_only {
            // kube's own client (which knows proxies) has no room for the guard.
            return Err(kube::Error::Service(
                "a kubeconfig naming a proxy is not supported by a read-only client".into(),
            ));
        }
        return Client::try_from(config);
    }
    let transport = transport(&config)?;
    let service = ServiceBuilder::new()
        .option_layer(read_only.then_some(GetOnlyLayer))
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace))
}

/// `config` without the proxy kube's loader took from `HTTPS_PROXY` (the connector applies the
/// environment's proxies itself, `NO_PROXY` matched against the apiserver); a kubeconfig's own
/// `proxy-url` (another value) is kept.
pub fn environment_proxy_set_aside(mut config: Config) -> Config {
    let from_environment = ["HTTPS_PROXY", "https_proxy"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .and_then(|value| value.parse::<hyper::Uri>().ok());
    if config.proxy_url.is_some() && config.proxy_url == from_environment {
        config.proxy_url = None;
    }
    config
}

/// The HTTP(S) connection pool under a client: TLS from `config` (its server CA, its client
/// certificate if any), HTTP/2 when the apiserver offers it. Everything above it (base URI,
/// bearer token, headers) is layered on by the client.
pub type Transport = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<crate::cloud::proxy::ProxyConnector>,
    kube::client::Body,
>;

/// The connection pool for `config` (see [`Transport`]).
pub fn transport(config: &Config) -> Result<Transport, kube::Error> {
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
    let https = builder
        .enable_all_versions()
        .wrap_connector(crate::cloud::proxy::ProxyConnector::from_env(http));
    Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_max_idle_per_host(IDLE_HTTP1_CONNECTIONS)
        .http2_keep_alive_interval(Some(Duration::from_secs(30)))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_keep_alive_while_idle(true)
        .build(https))
}

/// A client over `transport` (any service that sends a request over `config`'s TLS): the
/// layers kube puts above its own transport, from `config`.
pub fn over<S>(config: &Config, transport: S) -> Result<Client, kube::Error>
where
    S: tower::Service<
            hyper::http::Request<kube::client::Body>,
            Response = hyper::http::Response<hyper::body::Incoming>,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// Lets only `GET` requests through ([`build_read_only`]).
#[derive(Debug, Clone, Copy)]
struct GetOnlyLayer;

impl<S> tower::Layer<S> for GetOnlyLayer {
    type Service = GetOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GetOnly(inner)
    }
}

/// The service [`GetOnlyLayer`] wraps around the transport.
#[derive(Debug, Clone)]
pub struct GetOnly<S>(S);

impl<S, B> tower::Service<hyper::http::Request<B>> for GetOnly<S>
where
    S: tower::Service<hyper::http::Request<B>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: hyper::http::Request<B>) -> Self::Future {
        if request.method() != hyper::http::Method::GET {
            let refused = format!(
                "read-only client: refused {} {} before sending it",
                request.method(),
                request.uri().path()
            );
            return Box::pin(async move { Err(refused.into()) });
        }
        let answer = self.0.call(request);
        Box::pin(async move { answer.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn the_read_only_guard_sends_gets_and_refuses_every_other_method() {
        let transport =
            tower::service_fn(|_request: hyper::http::Request<()>| async { Ok::<_, std::convert::Infallible>("sent") });
        let mut guarded = tower::Layer::layer(&GetOnlyLayer, transport);
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let request = hyper::http::Request::builder()
                .method(method)
                .uri("/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m")
                .body(())
                .unwrap();
            let answer = guarded.ready().await.unwrap().call(request).await;
            match method {
                "GET" => assert_eq!(answer.unwrap(), "sent"),
                _ => assert!(
                    answer
                        .unwrap_err()
                        .to_string()
                        .contains(&format!("refused {method} /apis/")),
                    "{method} must be refused"
                ),
            }
        }
    }
}
