//! `/metrics`, `/healthz` and `/readyz` over plain HTTP/1 (hyper): probes and Prometheus
//! scrapes are all it serves.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// What the endpoints answer from.
#[derive(Clone)]
pub struct Endpoints {
    /// The metrics registry.
    pub registry: Arc<Registry>,
    /// Set once the signer has started (its management client works) and, sharded or alone,
    /// once it serves its share (`fleet::readiness`).
    pub ready: Arc<AtomicBool>,
}

fn respond(endpoints: &Endpoints, path: &str) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            super::metrics::encode(&endpoints.registry),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if endpoints.ready.load(Ordering::Relaxed) => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: the management cluster not reached yet, or this replica's share of the Clusters not taken up yet\n".to_owned(),
        ),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Binds `addr` and serves until the process ends. Returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, endpoints: Endpoints) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of file descriptors, say: do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let response = respond(&endpoints, request.uri().path());
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_follows_the_flag_and_unknown_paths_are_404() {
        let endpoints = Endpoints {
            registry: Arc::new(Registry::default()),
            ready: Arc::new(AtomicBool::new(false)),
        };
        assert_eq!(respond(&endpoints, "/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        endpoints.ready.store(true, Ordering::Relaxed);
        assert_eq!(respond(&endpoints, "/readyz").status(), StatusCode::OK);
        assert_eq!(respond(&endpoints, "/healthz").status(), StatusCode::OK);
        assert_eq!(respond(&endpoints, "/metrics").status(), StatusCode::OK);
        assert_eq!(respond(&endpoints, "/secrets").status(), StatusCode::NOT_FOUND);
    }
}
