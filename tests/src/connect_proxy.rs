//! An egress proxy on loopback, as a management cluster's would be: it takes HTTP `CONNECT
//! host:port` requests, logs each target, and tunnels the bytes to where the test routes that
//! host (a stand-in of Google's or Azure's endpoints on loopback), so the client's TLS runs end
//! to end with the stand-in while the proxy sees only the host name. A target it has no route
//! for is answered 502.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// The proxy; it stops taking connections when dropped (open tunnels end with their peers).
pub struct ConnectProxy {
    address: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    /// Listens on a free loopback port; `routes` maps `host:port` (as a `CONNECT` names it) to
    /// the address that serves it.
    pub fn start(routes: HashMap<String, SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let address = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&log);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let routes = routes.clone();
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || tunnel(client, &routes, &seen));
            }
        });
        Self { address, log }
    }

    /// `http://127.0.0.1:<port>`: the value for `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every `CONNECT` target asked for so far, in order.
    pub fn targets(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn tunnel(mut client: TcpStream, routes: &HashMap<String, SocketAddr>, log: &Mutex<Vec<String>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut words = text.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    log.lock().unwrap().push(target.to_owned());
    let Some(upstream) = routes.get(target).and_then(|a| TcpStream::connect(a).ok()) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let (mut client_read, mut upstream_write) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let forward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut upstream_write);
        let _ = upstream_write.shutdown(Shutdown::Write);
    });
    let (mut upstream_read, mut client_write) = (upstream, client);
    let _ = std::io::copy(&mut upstream_read, &mut client_write);
    let _ = client_write.shutdown(Shutdown::Write);
    let _ = forward.join();
}
