//! moto's server (PyPI `moto[server]`) as the real third-party STS of the `aws/v1` suites,
//! with request authentication on: `INITIAL_NO_AUTH_ACTION_COUNT` lets the first calls (the
//! IAM role and the instance sessions this fixture sets up) through unsigned, and from then on
//! moto verifies every request's SigV4 signature and session token, as STS does. moto does not
//! check a request's age: that is the signer's own check.
//!
//! The binary is `$MOTO_SERVER`, else `/opt/moto/bin/moto_server` (where `scripts/deps`
//! installs it), else `moto_server` on `PATH`.

#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// moto's default account.
pub const ACCOUNT: &str = "123456789012";

/// The moto server binary, if installed.
pub fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MOTO_SERVER") {
        return Some(PathBuf::from(path));
    }
    let installed = PathBuf::from("/opt/moto/bin/moto_server");
    if installed.is_file() {
        return Some(installed);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("moto_server"))
            .find(|p| p.is_file())
    })
}

/// One moto server on loopback; killed on drop.
pub struct Moto {
    child: Child,
    port: u16,
    unsigned_left: usize,
}

/// Temporary credentials of an assumed role.
#[derive(Debug, Clone)]
pub struct Session {
    /// AccessKeyId
    pub access_key_id: String,
    /// SecretAccessKey
    pub secret_access_key: String,
    /// SessionToken
    pub session_token: String,
}

impl Moto {
    /// Starts moto with `unsigned_actions` calls let through before authentication starts (the
    /// role plus one `AssumeRole` per session the suite needs). Panics saying what to install
    /// when moto is absent.
    pub fn start(unsigned_actions: usize, log: &std::path::Path) -> Self {
        let binary = binary().expect(
            "moto_server is not installed: scripts/deps installs PyPI moto[server] into /opt/moto (as root), or set MOTO_SERVER",
        );
        let port = crate::envtest::free_port();
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", unsigned_actions.to_string())
            .stdout(Stdio::from(std::fs::File::create(log).expect("moto log")))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(log).expect("moto log"),
            ))
            .spawn()
            .expect("start moto_server");
        let moto = Self {
            child,
            port,
            unsigned_left: unsigned_actions,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        // /moto-api/ does not count as an action.
        while moto.call("GET", "/moto-api/", "", "").is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// `http://127.0.0.1:<port>`: the STS endpoint for the plugin and the signer.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One HTTP/1.1 exchange: status and body.
    fn call(&self, method: &str, path: &str, headers: &str, body: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded; charset=utf-8\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            self.port,
            body.len()
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not HTTP: {answer:.80}")))?;
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// An unsigned (not yet authenticated) AWS query call to `service`: moto routes it by the
    /// credential scope of the Authorization header and, while unsigned actions are left, does
    /// not check the signature.
    fn unsigned(&mut self, service: &str, body: &str) -> String {
        assert!(self.unsigned_left > 0, "moto's unauthenticated calls are used up");
        self.unsigned_left -= 1;
        let headers = format!(
            "X-Amz-Date: 20260101T000000Z\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host;x-amz-date, Signature=00\r\n"
        );
        let (status, answer) = self.call("POST", "/", &headers, body).expect("moto answers");
        assert_eq!(status, 200, "{service}: {answer}");
        answer
    }

    /// Creates IAM role `role`, assumable by anyone (one unsigned action).
    pub fn create_role(&mut self, role: &str) {
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"sts:AssumeRole"}]}"#;
        let body = format!(
            "Action=CreateRole&Version=2010-05-08&RoleName={role}&AssumeRolePolicyDocument={}",
            crate::cloud::percent_encode(policy)
        );
        self.unsigned("iam", &body);
    }

    /// Assumes `role` with session name `session` (EC2 names instance-profile sessions after
    /// the instance ID), one unsigned action.
    pub fn assume_role(&mut self, role: &str, session: &str) -> Session {
        let body = format!(
            "Action=AssumeRole&Version=2011-06-15&RoleArn={}&RoleSessionName={session}",
            crate::cloud::percent_encode(&format!("arn:aws:iam::{ACCOUNT}:role/{role}"))
        );
        let answer = self.unsigned("sts", &body);
        let field = |name: &str| {
            answer
                .split_once(&format!("<{name}>"))
                .and_then(|(_, r)| r.split_once(&format!("</{name}>")))
                .map(|(v, _)| v.to_owned())
                .expect("an AssumeRole answer")
        };
        Session {
            access_key_id: field("AccessKeyId"),
            secret_access_key: field("SecretAccessKey"),
            session_token: field("SessionToken"),
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
