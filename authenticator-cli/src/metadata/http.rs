//! The blocking HTTP/1.1 client the three metadata services share: a [`Server`] (where to
//! connect, the `Host`, a path prefix, what errors call it), one request per connection over a
//! [`TcpStream`] straight to the address configured (no proxy), every wait ([`CONNECT_TIMEOUT`],
//! [`READ_TIMEOUT`]) and every size ([`MAX_BODY`]) bounded, the answer read by `Content-Length`,
//! chunked or until the close into memory zeroed when dropped; and the endpoints' settings read
//! (`http://host[:port][/path]`, host\[:port\]). One client because the three speak the same
//! small HTTP; what each cloud asks and how it reads the answer is in its own room (the parent
//! module's documentation says why the client is this small).

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attestation::attestor::AttestError;
use zeroize::Zeroizing;

/// How long a connection may take: the services are link-local and answer in milliseconds,
/// and a node off that cloud must learn so at once rather than after the system's minutes-long
/// connect timeout on an address nothing answers.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the whole answer may take once connected (sending the request included): bounds a
/// service that accepts and then stalls, or sends one byte at a time.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest body accepted. The answers asked for are an identity token, a PKCS#7 signature
/// or a credential document, each a few KiB: anything larger is not one of them.
pub const MAX_BODY: usize = 64 * 1024;

/// The largest status line and headers accepted.
const MAX_HEAD: usize = 16 * 1024;

/// The most read from one connection: head, body, and room for chunked framing.
const MAX_RAW: usize = MAX_HEAD + MAX_BODY + 16 * 1024;

/// A value from the network, fit for an error message: quoted, escaped, at most 64 characters.
pub(super) fn shown(value: &str) -> String {
    let short: String = value.chars().take(64).collect();
    if short.len() < value.len() {
        format!("{short:?}...")
    } else {
        format!("{short:?}")
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters: a query value or a path
/// segment, whatever it holds.
pub(super) fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// The `service` at `endpoint`, an `http://host[:port][/path]` URL that `setting` (an
/// environment variable) names in errors.
pub(super) fn http_endpoint(service: &'static str, endpoint: &str, setting: &str) -> Result<Server> {
    let context = || format!("{setting} {endpoint:?}");
    let Some(rest) = strip_prefix_ignore_case(endpoint, "http://") else {
        bail!(
            "{}: not an http:// URL (the instance metadata service is plain HTTP on a link-local address)",
            context()
        );
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if path.contains(['?', '#']) {
        bail!("{}: a query or fragment has no place in it", context());
    }
    let (host, port) = parse_authority(authority).with_context(context)?;
    let prefix = path.trim_end_matches('/');
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("/{prefix}")
    };
    Ok(Server::new(service, host, port, authority, &prefix))
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &text[prefix.len()..])
}

/// `host[:port]` (an IPv6 address in brackets) into what to connect to; port 80 by default.
pub(super) fn parse_authority(authority: &str) -> Result<(String, u16)> {
    if authority.is_empty() {
        bail!("no host");
    }
    if authority
        .bytes()
        .any(|b| !b.is_ascii_graphic() || b"/?#@\\".contains(&b))
    {
        bail!("not host[:port]");
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .context("an IPv6 address without its closing bracket")?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').context("not [address]:port")?),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((_, rest)) if rest.contains(':') => bail!("an IPv6 address goes in brackets: [address]:port"),
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(['[', ']']) {
        bail!("not host[:port]");
    }
    let port = match port {
        None => 80,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .with_context(|| format!("port {port:?} is not a port number"))?,
    };
    Ok((host.to_owned(), port))
}

/// One metadata service: where to connect, what to call it in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Server {
    /// What errors call it.
    pub(super) service: &'static str,
    /// What to connect to (an IPv6 address without brackets).
    host: String,
    port: u16,
    /// The `Host` header, as configured.
    authority: String,
    /// A path every request's target starts with (empty, or `/path` without a trailing `/`).
    prefix: String,
    /// [`READ_TIMEOUT`]; shorter in tests.
    read_timeout: Duration,
}

/// What went wrong on the wire: the caller decides what to call it.
#[derive(Debug)]
enum Failure {
    /// No connection, or the connection failed or timed out: the service is away.
    Unreachable(String),
    /// An answer came, and it is not HTTP this client accepts.
    Answer(String),
}

impl Server {
    pub(super) fn new(service: &'static str, host: String, port: u16, authority: &str, prefix: &str) -> Self {
        Self {
            service,
            host,
            port,
            authority: authority.to_owned(),
            prefix: prefix.to_owned(),
            read_timeout: READ_TIMEOUT,
        }
    }

    pub(super) fn base_url(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }

    pub(super) fn url(&self, target: &str) -> String {
        format!("{}{target}", self.base_url())
    }

    /// Sends one request and reads its answer, whatever its status.
    pub(super) fn send(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Response, AttestError> {
        self.exchange(method, target, headers).map_err(|failure| match failure {
            Failure::Unreachable(why) => {
                AttestError::DeviceUnavailable(format!("{} at {} is unreachable: {why}", self.service, self.base_url()))
            }
            Failure::Answer(why) => AttestError::Failed(format!(
                "{} at {} gave no usable answer: {why}",
                self.service,
                self.url(target)
            )),
        })
    }

    /// The body of a 2xx answer; any other status is an error naming what was asked for.
    pub(super) fn success<'r>(
        &self,
        response: &'r Response,
        target: &str,
        what: &str,
    ) -> Result<&'r [u8], AttestError> {
        if (200..300).contains(&response.status) {
            Ok(&response.body)
        } else {
            Err(AttestError::Failed(format!(
                "{} at {} answered {} {} to the request for {what}",
                self.service,
                self.url(target),
                response.status,
                response.reason
            )))
        }
    }

    pub(super) fn bad_body(&self, target: &str, why: &str) -> AttestError {
        AttestError::Failed(format!("{} at {}: {why}", self.service, self.url(target)))
    }

    fn exchange(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Response, Failure> {
        let mut stream = connect(&self.host, self.port)?;
        let deadline = Instant::now() + self.read_timeout;
        // Room enough that it never reallocates: a session token in it is zeroed once, here.
        let mut request = Zeroizing::new(String::with_capacity(4096));
        let _ = write!(
            request,
            "{method} {}{target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kubelet-authenticator/{}\r\nConnection: close\r\n",
            self.prefix,
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        for (name, value) in headers {
            let _ = write!(request, "{name}: {value}\r\n");
        }
        if method != "GET" {
            request.push_str("Content-Length: 0\r\n");
        }
        request.push_str("\r\n");
        stream
            .set_write_timeout(Some(self.read_timeout))
            .and_then(|()| stream.write_all(request.as_bytes()))
            .map_err(|e| Failure::Unreachable(describe_io(&e, "sending the request", self.read_timeout)))?;
        Conn::new(stream, deadline, self.read_timeout).response()
    }
}

fn connect(host: &str, port: u16) -> Result<TcpStream, Failure> {
    let addresses: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Failure::Unreachable(format!("cannot resolve {host}: {e}")))?
        .collect();
    let mut last = None;
    for address in &addresses {
        match TcpStream::connect_timeout(address, CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(Failure::Unreachable(match last {
        Some(e) => describe_io(&e, "connecting", CONNECT_TIMEOUT),
        None => format!("{host} resolves to no address"),
    }))
}

fn describe_io(error: &std::io::Error, doing: &str, timeout: Duration) -> String {
    match error.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => format!("{doing}: nothing within {timeout:?}"),
        _ => format!("{doing}: {error}"),
    }
}

/// An answer: status, headers (names lower-cased) and body.
#[derive(Debug)]
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) reason: String,
    headers: Vec<(String, String)>,
    body: Zeroizing<Vec<u8>>,
}

impl Response {
    /// The first header named `name` (lower case).
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }
}

/// The reading side of a connection: everything read stays in one buffer, allocated once at
/// its full size and zeroed when dropped.
struct Conn {
    stream: TcpStream,
    buf: Zeroizing<Vec<u8>>,
    /// Where the unparsed bytes start.
    pos: usize,
    deadline: Instant,
    timeout: Duration,
}

impl Conn {
    fn new(stream: TcpStream, deadline: Instant, timeout: Duration) -> Self {
        Self {
            stream,
            buf: Zeroizing::new(Vec::with_capacity(MAX_RAW)),
            pos: 0,
            deadline,
            timeout,
        }
    }

    /// Reads more; `false` at the end of the stream.
    fn fill(&mut self) -> Result<bool, Failure> {
        let start = self.buf.len();
        if start >= MAX_RAW {
            return Err(Failure::Answer(format!(
                "the answer is larger than the {} KiB accepted",
                MAX_BODY / 1024
            )));
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let timed_out = || {
            Failure::Unreachable(format!(
                "reading the answer: no complete answer within {:?}",
                self.timeout
            ))
        };
        if remaining.is_zero() {
            return Err(timed_out());
        }
        self.stream
            .set_read_timeout(Some(remaining))
            .map_err(|e| Failure::Unreachable(describe_io(&e, "reading the answer", self.timeout)))?;
        self.buf.resize((start + 8192).min(MAX_RAW), 0);
        let read = loop {
            match self.stream.read(&mut self.buf[start..]) {
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                other => break other,
            }
        };
        self.buf.truncate(start + read.as_ref().map_or(0, |n| *n));
        match read {
            Ok(n) => Ok(n > 0),
            Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => Err(timed_out()),
            Err(e) => Err(Failure::Unreachable(format!("reading the answer: {e}"))),
        }
    }

    fn closed_early() -> Failure {
        Failure::Answer("the connection closed before the answer was complete".into())
    }

    /// The next line, without its CRLF (or bare LF).
    fn line(&mut self) -> Result<String, Failure> {
        loop {
            if let Some(at) = self.buf[self.pos..].iter().position(|b| *b == b'\n') {
                let line = &self.buf[self.pos..self.pos + at];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let text = String::from_utf8_lossy(line).into_owned();
                self.pos += at + 1;
                return Ok(text);
            }
            if self.buf.len() - self.pos > MAX_HEAD {
                return Err(Failure::Answer(format!("a line longer than {} KiB", MAX_HEAD / 1024)));
            }
            if !self.fill()? {
                return Err(Self::closed_early());
            }
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&[u8], Failure> {
        while self.buf.len() - self.pos < n {
            if !self.fill()? {
                return Err(Self::closed_early());
            }
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    /// Everything up to the end of the stream.
    fn rest(&mut self) -> Result<&[u8], Failure> {
        while self.fill()? {}
        let start = self.pos;
        self.pos = self.buf.len();
        Ok(&self.buf[start..])
    }

    /// Reads one whole answer, skipping interim (1xx) ones.
    fn response(mut self) -> Result<Response, Failure> {
        loop {
            let head_start = self.pos;
            let (status, reason) = parse_status_line(&self.line()?)?;
            let mut headers = Vec::new();
            loop {
                let line = self.line()?;
                if self.pos - head_start > MAX_HEAD {
                    return Err(Failure::Answer(format!("headers larger than {} KiB", MAX_HEAD / 1024)));
                }
                if line.is_empty() {
                    break;
                }
                headers.push(parse_header(&line)?);
            }
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            let mut response = Response {
                status,
                reason,
                headers,
                body: Zeroizing::new(Vec::new()),
            };
            response.body = self.body(&response)?;
            return Ok(response);
        }
    }

    /// The body, framed as RFC 9112 section 6.3 says for a response to GET or PUT.
    fn body(&mut self, response: &Response) -> Result<Zeroizing<Vec<u8>>, Failure> {
        if matches!(response.status, 101 | 204 | 304) {
            return Ok(Zeroizing::new(Vec::new()));
        }
        let too_large = |size: usize| {
            Failure::Answer(format!(
                "a body of {size} bytes, more than the {} KiB accepted",
                MAX_BODY / 1024
            ))
        };
        let encodings: Vec<String> = response
            .headers
            .iter()
            .filter(|(name, _)| name == "transfer-encoding")
            .flat_map(|(_, value)| value.split(','))
            .map(|coding| coding.trim().to_ascii_lowercase())
            .filter(|coding| !coding.is_empty())
            .collect();
        if !encodings.is_empty() {
            if encodings.iter().any(|coding| coding != "chunked") || encodings.len() > 1 {
                return Err(Failure::Answer(format!(
                    "transfer-encoding {} is not supported",
                    shown(&encodings.join(", "))
                )));
            }
            return self.chunked();
        }
        let lengths: Vec<&str> = response
            .headers
            .iter()
            .filter(|(name, _)| name == "content-length")
            .flat_map(|(_, value)| value.split(','))
            .map(str::trim)
            .collect();
        if let Some(first) = lengths.first() {
            if lengths.iter().any(|l| l != first) || first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Failure::Answer("a malformed Content-Length".into()));
            }
            let length = first.parse::<usize>().map_err(|_| too_large(usize::MAX))?;
            if length > MAX_BODY {
                return Err(too_large(length));
            }
            return Ok(Zeroizing::new(self.take(length)?.to_vec()));
        }
        let rest = self.rest()?;
        if rest.len() > MAX_BODY {
            return Err(too_large(rest.len()));
        }
        Ok(Zeroizing::new(rest.to_vec()))
    }

    fn chunked(&mut self) -> Result<Zeroizing<Vec<u8>>, Failure> {
        let mut body = Zeroizing::new(Vec::with_capacity(MAX_BODY));
        loop {
            let line = self.line()?;
            let size = line.split(';').next().unwrap_or_default().trim();
            if size.is_empty() || size.len() > 8 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Failure::Answer("a malformed chunk size".into()));
            }
            let size = usize::from_str_radix(size, 16).map_err(|_| Failure::Answer("a malformed chunk size".into()))?;
            if size == 0 {
                // Trailers, up to the empty line.
                while !self.line()?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(Failure::Answer(format!(
                    "a chunked body larger than the {} KiB accepted",
                    MAX_BODY / 1024
                )));
            }
            let chunk = self.take(size)?;
            body.extend_from_slice(chunk);
            if !self.line()?.is_empty() {
                return Err(Failure::Answer("a chunk longer than its size".into()));
            }
        }
    }
}

/// `HTTP/1.x SSS reason`.
fn parse_status_line(line: &str) -> Result<(u16, String), Failure> {
    let malformed = || Failure::Answer(format!("not an HTTP/1.x status line: {}", shown(line)));
    let (version, rest) = line.split_once(' ').ok_or_else(malformed)?;
    if !version.starts_with("HTTP/1.") {
        return Err(malformed());
    }
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let status = code.parse::<u16>().map_err(|_| malformed())?;
    let reason: String = reason.chars().filter(|c| !c.is_control()).take(64).collect();
    Ok((status, reason))
}

/// `Name: value`, the name lower-cased and the value trimmed.
fn parse_header(line: &str) -> Result<(String, String), Failure> {
    if line.starts_with([' ', '\t']) {
        return Err(Failure::Answer("a folded header line (obsolete, refused)".into()));
    }
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| Failure::Answer("a header line without a colon".into()))?;
    if name.is_empty() || name.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(Failure::Answer("a malformed header name".into()));
    }
    Ok((name.to_ascii_lowercase(), value.trim_matches([' ', '\t']).to_owned()))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use attestation::aws::attestor::Ec2Metadata;
    use attestation::gcp::attestor::GceMetadata;

    use super::*;
    use crate::metadata::ec2::IMDS_TOKEN_PATH;
    use crate::metadata::test_support::{RSA2048, StandIn, answer, failed, google, ok};
    use crate::metadata::{GceMetadataHttp, ImdsV2};

    #[test]
    fn an_answer_without_a_length_is_read_until_the_service_closes() {
        let stand_in = StandIn::answering(vec![
            b"HTTP/1.0 200 OK\r\nMetadata-Flavor: Google\r\n\r\nh.p.s".to_vec(),
        ]);
        assert_eq!(stand_in.gce().identity_token("aud").unwrap(), "h.p.s");
    }

    #[test]
    fn an_answer_with_a_length_is_complete_without_waiting_for_the_close() {
        let stand_in = StandIn::answering_then(vec![google("h.p.s")], Duration::from_secs(30));
        let started = Instant::now();
        assert_eq!(stand_in.gce().identity_token("aud").unwrap(), "h.p.s");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn a_chunked_answer_is_decoded() {
        let (first, second) = RSA2048.split_at(40);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x};name=value\r\n{first}\r\n{:X}\r\n{second}\r\n0\r\nX-Trailer: t\r\n\r\n",
            first.len(),
            second.len()
        );
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), chunked.into_bytes()]);
        assert_eq!(stand_in.imds().identity_rsa2048().unwrap(), RSA2048);
    }

    #[test]
    fn a_404_says_what_was_asked_for_and_where() {
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), answer("404 Not Found", &[], "")]);
        let message = failed(stand_in.imds().identity_rsa2048());
        assert!(message.contains("404 Not Found"), "{message}");
        assert!(message.contains("the instance identity document"), "{message}");
        assert!(
            message.contains(&format!(
                "http://{}/latest/dynamic/instance-identity/rsa2048",
                stand_in.address
            )),
            "{message}"
        );
    }

    #[test]
    fn an_unreachable_service_is_device_unavailable() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut imds = ImdsV2::new(Some(&format!("http://127.0.0.1:{port}"))).unwrap();
        match imds.identity_rsa2048() {
            Err(AttestError::DeviceUnavailable(message)) => {
                assert!(
                    message.starts_with(&format!(
                        "the EC2 instance metadata service at http://127.0.0.1:{port} is unreachable: "
                    )),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut gce = GceMetadataHttp::new(Some(&format!("127.0.0.1:{port}"))).unwrap();
        assert!(matches!(
            gce.identity_token("aud"),
            Err(AttestError::DeviceUnavailable(m)) if m.starts_with("the GCE metadata server at http://127.0.0.1:")
        ));
    }

    #[test]
    fn a_service_that_stalls_is_device_unavailable_after_the_read_timeout() {
        let stand_in = StandIn::answering_then(vec![b"HTTP/1.1 200 OK\r\n".to_vec()], Duration::from_secs(30));
        let mut gce = stand_in.gce();
        gce.server.read_timeout = Duration::from_millis(300);
        let started = Instant::now();
        match gce.identity_token("aud") {
            Err(AttestError::DeviceUnavailable(message)) => assert!(message.contains("within"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn an_answer_larger_than_64_kib_is_refused() {
        let large = "x".repeat(MAX_BODY + 1);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nMetadata-Flavor: Google\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{large}\r\n0\r\n\r\n",
            large.len()
        );
        let until_close = format!("HTTP/1.1 200 OK\r\nMetadata-Flavor: Google\r\n\r\n{large}");
        for body in [google(&large), chunked.into_bytes(), until_close.into_bytes()] {
            let stand_in = StandIn::answering(vec![body]);
            let message = failed(stand_in.gce().identity_token("aud"));
            assert!(message.contains("64 KiB"), "{message}");
        }
    }

    #[test]
    fn endpoints_follow_the_sdk_conventions() {
        let gce = GceMetadataHttp::new(None).unwrap();
        assert_eq!(
            (gce.server.host.as_str(), gce.server.port),
            ("metadata.google.internal", 80)
        );
        let gce = GceMetadataHttp::new(Some("[::1]:8080")).unwrap();
        assert_eq!((gce.server.host.as_str(), gce.server.port), ("::1", 8080));
        assert_eq!(gce.server.base_url(), "http://[::1]:8080");
        let error = GceMetadataHttp::new(Some("http://127.0.0.1:80")).unwrap_err();
        assert!(format!("{error:#}").contains("host[:port]"), "{error:#}");
        assert!(GceMetadataHttp::new(Some("host:notaport")).is_err());

        let imds = ImdsV2::new(None).unwrap();
        assert_eq!(imds.server.base_url(), "http://169.254.169.254");
        assert_eq!((imds.server.host.as_str(), imds.server.port), ("169.254.169.254", 80));
        let imds = ImdsV2::new(Some("http://[fd00:ec2::254]")).unwrap();
        assert_eq!(imds.server.host, "fd00:ec2::254");
        let imds = ImdsV2::new(Some("HTTP://127.0.0.1:1338/prefix/")).unwrap();
        assert_eq!(
            imds.server.url(IMDS_TOKEN_PATH),
            "http://127.0.0.1:1338/prefix/latest/api/token"
        );
        let error = ImdsV2::new(Some("https://169.254.169.254/")).unwrap_err();
        assert!(format!("{error:#}").contains("not an http:// URL"), "{error:#}");
        assert!(ImdsV2::new(Some("http:///")).is_err());
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("aZ09-._~"), "aZ09-._~");
        assert_eq!(percent_encode("a/b c+é"), "a%2Fb%20c%2B%C3%A9");
    }

    #[test]
    fn malformed_answers_are_failures_naming_what_is_wrong() {
        for (raw, expected) in [
            ("SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
                "closed before the answer was complete",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nab",
                "malformed Content-Length",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                "transfer-encoding",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "chunk size",
            ),
            ("HTTP/1.1 200 OK\r\nBroken\r\n\r\n", "without a colon"),
        ] {
            let stand_in = StandIn::answering(vec![raw.as_bytes().to_vec()]);
            let message = failed(stand_in.gce().identity_token("aud"));
            assert!(message.contains(expected), "{raw:?}: {message}");
        }
    }

    #[test]
    fn an_interim_answer_is_skipped() {
        let mut raw = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        raw.extend(google("h.p.s"));
        let stand_in = StandIn::answering(vec![raw]);
        assert_eq!(stand_in.gce().identity_token("aud").unwrap(), "h.p.s");
    }
}
