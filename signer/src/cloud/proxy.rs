//! The egress proxy of every cloud call (Google's keys, STS, Azure Resource Manager and its
//! token endpoint): `HTTPS_PROXY` / `https_proxy` (and `ALL_PROXY`), with `NO_PROXY` /
//! `no_proxy` exempting hosts, read as curl and Kubernetes' own components read them (Go's
//! `httpproxy.FromEnvironment`). An HTTPS destination the proxy applies to is reached through an
//! HTTP `CONNECT` tunnel to the proxy (with `Proxy-Authorization` when the proxy URL carries
//! credentials), TLS then running end to end inside it, so the proxy sees the host name and port
//! only; the proxy's own CA, where it intercepts TLS, goes in `--cloud-ca-bundle`. A plain-HTTP
//! destination (a test's local endpoint) is always reached directly.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::Service;

/// A connector that tunnels through the environment's proxy where it applies.
#[derive(Clone)]
pub struct ProxyConnector {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl ProxyConnector {
    /// Proxies as the process environment names them.
    pub fn from_env(direct: HttpConnector) -> Self {
        Self::with(direct, Matcher::from_env())
    }

    /// Proxies as `proxies` names them.
    pub fn with(direct: HttpConnector, proxies: Matcher) -> Self {
        Self {
            direct,
            proxies: Arc::new(proxies),
        }
    }

    /// The proxy an HTTPS call to `uri` goes through, for logs (`None`: directly).
    pub fn proxy_for(&self, uri: &Uri) -> Option<Uri> {
        (uri.scheme_str() == Some("https"))
            .then(|| self.proxies.intercept(uri).map(|i| i.uri().clone()))
            .flatten()
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Service<Uri> for ProxyConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.direct.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let intercept = (dst.scheme_str() == Some("https"))
            .then(|| self.proxies.intercept(&dst))
            .flatten();
        match intercept {
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), self.direct.clone());
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move { tunnel.call(dst).await.map_err(Into::into) })
            }
            None => {
                let connecting = self.direct.call(dst);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A CONNECT proxy on loopback that logs each request's first line and target, answers 200
    /// and then closes (the TLS that follows fails, which the tests expect).
    async fn logging_proxy() -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).into_owned();
                seen.lock().unwrap().push(text);
                let _ = socket.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
            }
        });
        (address, log)
    }

    fn connector(proxy: &str, no_proxy: &str) -> ProxyConnector {
        let mut direct = HttpConnector::new();
        direct.enforce_http(false);
        ProxyConnector::with(direct, Matcher::builder().https(proxy).no(no_proxy).build())
    }

    #[tokio::test]
    async fn https_calls_go_through_the_proxys_tunnel_and_no_proxy_hosts_do_not() {
        let (proxy, log) = logging_proxy().await;
        let mut c = connector(&format!("http://user:secret@{}", &proxy[7..]), "metadata.internal,.svc");
        let sts: Uri = "https://sts.us-east-1.amazonaws.com/".parse().unwrap();
        assert!(c.proxy_for(&sts).is_some());
        c.call(sts).await.expect("the tunnel is up (the proxy answered 200)");
        let keys: Uri = "https://www.googleapis.com/oauth2/v3/certs".parse().unwrap();
        c.call(keys).await.unwrap();
        let seen = log.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(
            seen[0].starts_with("CONNECT sts.us-east-1.amazonaws.com:443 HTTP/1.1"),
            "{seen:?}"
        );
        assert!(
            seen[0]
                .to_ascii_lowercase()
                .contains("proxy-authorization: basic dxnlcjpzzwnyzxq="),
            "{seen:?}"
        );
        assert!(seen[1].starts_with("CONNECT www.googleapis.com:443 "), "{seen:?}");
        // NO_PROXY: directly (here to a port nobody listens on: refused, and the proxy saw nothing).
        let exempt: Uri = "https://a.svc:1/".parse().unwrap();
        assert!(c.proxy_for(&exempt).is_none());
        assert!(c.call(exempt).await.is_err());
        assert_eq!(log.lock().unwrap().len(), 2);
        // Plain HTTP is never proxied.
        assert!(c.proxy_for(&"http://127.0.0.1:1/".parse().unwrap()).is_none());
    }
}
