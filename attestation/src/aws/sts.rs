//! The time-limited half of `aws/v1`: a SigV4-signed STS `GetCallerIdentity` request.
//!
//! The node signs it with the instance role's credentials; the signer never takes a URL from
//! the requester. It checks, before sending anything, that the request is exactly
//! `GetCallerIdentity` for its own STS endpoint of the document's region, that every header it
//! will forward is covered by the signature, that the binding header is this CSR's key
//! binding and that `x-amz-date` is fresh. Then it sends those headers and that body to its
//! own endpoint ([`StsCall`]); STS verifies the signature and the time and names the caller.

use std::collections::BTreeMap;

use base64::Engine as _;
use time::{Duration, OffsetDateTime, PrimitiveDateTime};

use crate::cloud::statement::check_fresh;

/// The one request accepted.
pub const GET_CALLER_IDENTITY_BODY: &str = "Action=GetCallerIdentity&Version=2011-06-15";

/// The signed header that carries the key binding `B`.
pub const BINDING_HEADER: &str = "x-kubelet-authenticator-binding";

/// The headers a node may send (lowercase). Everything forwarded must also be signed.
pub const ALLOWED_HEADERS: [&str; 7] = [
    "authorization",
    "content-type",
    "host",
    "x-amz-content-sha256",
    "x-amz-date",
    "x-amz-security-token",
    BINDING_HEADER,
];

/// Headers that must be signed.
const REQUIRED_SIGNED: [&str; 3] = ["host", "x-amz-date", BINDING_HEADER];

/// Longest header value read (a session token is about 1 KiB).
const MAX_HEADER_VALUE: usize = 8 * 1024;

/// The `sts` object of the DATA block, as the node sent it.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedStsRequest {
    /// Header name to value.
    pub headers: BTreeMap<String, String>,
    /// Standard base64 of the body.
    pub body: String,
}

impl std::fmt::Debug for SignedStsRequest {
    // Header values (the signature, the session token) are never printed; their names are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedStsRequest")
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

/// Where the signer sends STS requests: a URL per region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StsEndpoints {
    template: Option<String>,
}

impl Default for StsEndpoints {
    fn default() -> Self {
        Self::regional()
    }
}

impl StsEndpoints {
    /// AWS's regional endpoints: `https://sts.<region>.amazonaws.com` (`.com.cn` in China,
    /// `.amazonaws.eu` in the European Sovereign Cloud).
    pub fn regional() -> Self {
        Self { template: None }
    }

    /// `--aws-sts-endpoint`: a URL, `{region}` replaced by the document's region.
    pub fn from_template(template: &str) -> Result<Self, String> {
        let scheme_ok = template.starts_with("https://") || template.starts_with("http://");
        if !scheme_ok || authority(template).is_empty() {
            return Err(format!("--aws-sts-endpoint {template:?} is not an http(s) URL"));
        }
        Ok(Self {
            template: Some(template.trim_end_matches('/').to_owned()),
        })
    }

    /// The URL a `GetCallerIdentity` for `region` is posted to, and signed for: the endpoint
    /// with a `/` after its path, as the AWS SDKs send it (an endpoint `https://proxy/sts`
    /// takes requests at `/sts/`), so the node and the signer name one path.
    pub fn url(&self, region: &str) -> String {
        match &self.template {
            Some(t) => format!("{}/", t.replace("{region}", region)),
            None if region.starts_with("cn-") => format!("https://sts.{region}.amazonaws.com.cn/"),
            // The European Sovereign Cloud is a partition of its own, under its own domain.
            None if region.starts_with("eusc-") => format!("https://sts.{region}.amazonaws.eu/"),
            None => format!("https://sts.{region}.amazonaws.com/"),
        }
    }

    /// The `host` a request for `region` must be signed for.
    pub fn host(&self, region: &str) -> String {
        let url = self.url(region);
        let authority = authority(&url);
        let default_port = if url.starts_with("https://") { ":443" } else { ":80" };
        authority.strip_suffix(default_port).unwrap_or(authority).to_owned()
    }
}

fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or_default()
}

/// A request the signer will send to its own STS endpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct StsCall {
    /// The document's region.
    pub region: String,
    /// The signer's endpoint for it.
    pub url: String,
    /// The node's headers (lowercase names), all signed.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for StsCall {
    // The signature and the session token are credentials: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StsCall")
            .field("region", &self.region)
            .field("url", &self.url)
            .field("headers", &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl StsCall {
    /// A key identifying this exact request, for answer caches.
    pub fn cache_key(&self) -> [u8; 32] {
        let mut all = Vec::new();
        for (k, v) in &self.headers {
            for part in [k.as_bytes(), v.as_bytes()] {
                all.extend_from_slice(&(part.len() as u64).to_be_bytes());
                all.extend_from_slice(part);
            }
        }
        all.extend_from_slice(&self.body);
        all.extend_from_slice(self.url.as_bytes());
        crate::digest::sha256(&all)
    }
}

/// STS's answer to a [`StsCall`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StsAnswer {
    /// 200: the caller's ARN.
    Caller {
        /// `GetCallerIdentityResult.Arn`.
        arn: String,
    },
    /// STS refused the request (a 4xx other than throttling): the signature, the time or the
    /// credentials do not hold.
    Refused {
        /// HTTP status.
        status: u16,
        /// STS's error code and message.
        error: String,
    },
    /// STS could not be asked (unreachable, timed out, 5xx, throttled): transient.
    Unavailable(String),
    /// Not asked yet.
    NotAsked,
}

/// Where a verifier finds STS's answers: a cache the signer fills by sending the calls the
/// verifier asks for; `check` fills it from a file.
pub trait CallerIdentity: Send + Sync {
    /// The answer to `call`, if there is one.
    fn answer(&self, call: &StsCall) -> StsAnswer;
}

/// No STS at all (offline, without an answer file): every call stays unasked.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSts;

impl CallerIdentity for NoSts {
    fn answer(&self, _call: &StsCall) -> StsAnswer {
        StsAnswer::NotAsked
    }
}

/// What the SigV4 `Authorization` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authorization {
    date: String,
    region: String,
    service: String,
    signed_headers: Vec<String>,
}

fn parse_authorization(value: &str) -> Result<Authorization, String> {
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or("the Authorization header is not AWS4-HMAC-SHA256")?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',').map(str::trim) {
        let (key, value) = part.split_once('=').ok_or("the Authorization header is malformed")?;
        let slot = match key {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed,
            "Signature" => &mut signature,
            _ => return Err(format!("the Authorization header has an unknown part {key:?}")),
        };
        if slot.replace(value).is_some() {
            return Err(format!("the Authorization header names {key} twice"));
        }
    }
    let (Some(credential), Some(signed), Some(_)) = (credential, signed, signature) else {
        return Err("the Authorization header lacks Credential, SignedHeaders or Signature".into());
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [_key_id, date, region, service, "aws4_request"] = scope.as_slice() else {
        return Err("the Authorization credential scope is not <key>/<date>/<region>/<service>/aws4_request".into());
    };
    Ok(Authorization {
        date: (*date).to_owned(),
        region: (*region).to_owned(),
        service: (*service).to_owned(),
        signed_headers: signed.split(';').map(str::to_owned).collect(),
    })
}

/// `x-amz-date`: `YYYYMMDD'T'HHMMSS'Z'`.
fn parse_amz_date(value: &str) -> Result<OffsetDateTime, String> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    PrimitiveDateTime::parse(value, format)
        .map(PrimitiveDateTime::assume_utc)
        .map_err(|_| {
            format!(
                "x-amz-date {:?} is not YYYYMMDDTHHMMSSZ",
                crate::identity::truncate(value, 32)
            )
        })
}

/// Everything the signer checks before it sends anything to STS.
pub struct CallChecks<'a> {
    /// The document's region (verified).
    pub region: &'a str,
    /// This CSR's key binding.
    pub binding: &'a str,
    /// The signer's endpoints.
    pub endpoints: &'a StsEndpoints,
    /// Now.
    pub now: OffsetDateTime,
    /// `--cloud-attestation-max-age`.
    pub max_age: Duration,
}

impl SignedStsRequest {
    /// The call to send, once every check holds; the error names what failed.
    pub fn to_call(&self, checks: &CallChecks<'_>) -> Result<StsCall, String> {
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            if !ALLOWED_HEADERS.contains(&lower.as_str()) {
                return Err(format!(
                    "request: header {:?} is not allowed",
                    crate::identity::truncate(name, 40)
                ));
            }
            if value.len() > MAX_HEADER_VALUE || value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(format!("request: header {lower} has a malformed value"));
            }
            if headers.insert(lower.clone(), value.clone()).is_some() {
                return Err(format!("request: header {lower} appears twice"));
            }
        }
        let header = |name: &str| {
            headers
                .get(name)
                .map(String::as_str)
                .ok_or_else(|| format!("request: header {name} is missing"))
        };
        let authorization = parse_authorization(header("authorization")?).map_err(|e| format!("request: {e}"))?;
        if authorization.service != "sts" {
            return Err(format!(
                "request: signed for service {:?}, not sts",
                authorization.service
            ));
        }
        if authorization.region != checks.region {
            return Err(format!(
                "request: signed for region {:?}, the identity document is of {}",
                crate::identity::truncate(&authorization.region, 32),
                checks.region
            ));
        }
        for required in REQUIRED_SIGNED {
            if !authorization.signed_headers.iter().any(|h| h == required) {
                return Err(format!("request: header {required} is not signed"));
            }
        }
        for name in headers.keys().filter(|n| *n != "authorization") {
            if !authorization.signed_headers.iter().any(|h| h == name) {
                return Err(format!("request: header {name} is sent but not signed"));
            }
        }
        if let Some(absent) = authorization.signed_headers.iter().find(|h| !headers.contains_key(*h)) {
            return Err(format!(
                "request: signed header {:?} is not sent",
                crate::identity::truncate(absent, 40)
            ));
        }
        let expected_host = checks.endpoints.host(checks.region);
        if header("host")? != expected_host {
            return Err(format!(
                "request: signed for host {:?}, not this signer's STS endpoint {expected_host}",
                crate::identity::truncate(header("host")?, 64)
            ));
        }
        let body = base64::engine::general_purpose::STANDARD
            .decode(&self.body)
            .map_err(|e| format!("request: the body is not base64: {e}"))?;
        if body != GET_CALLER_IDENTITY_BODY.as_bytes() {
            return Err(format!(
                "request: the body is not {GET_CALLER_IDENTITY_BODY:?} (another action or version)"
            ));
        }
        // A payload hash header, when sent, must be the body's: some STS implementations trust
        // it instead of hashing the body.
        if let Some(declared) = headers.get("x-amz-content-sha256")
            && *declared != crate::digest::hex(&crate::digest::sha256(&body))
        {
            return Err("request: x-amz-content-sha256 is not the body's SHA-256".into());
        }
        if header(BINDING_HEADER)? != checks.binding {
            return Err(format!(
                "binding: {BINDING_HEADER} is {:?}, not this CSR's key binding {}",
                crate::identity::truncate(header(BINDING_HEADER)?, 64),
                checks.binding
            ));
        }
        let date = header("x-amz-date")?;
        let signed_at = parse_amz_date(date).map_err(|e| format!("age: {e}"))?;
        if !date.starts_with(&authorization.date) || authorization.date.len() != 8 {
            return Err("request: the credential scope's date is not x-amz-date's".into());
        }
        check_fresh("x-amz-date", signed_at, checks.now, checks.max_age).map_err(|e| format!("age: {e}"))?;
        Ok(StsCall {
            region: checks.region.to_owned(),
            url: checks.endpoints.url(checks.region),
            headers: headers.into_iter().collect(),
            body,
        })
    }
}

/// Reads the `Arn` of a `GetCallerIdentityResponse` (XML, as STS answers by default).
pub fn caller_arn(response: &str) -> Result<String, String> {
    let element = |name: &str| -> Result<Vec<&str>, String> {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let mut found = Vec::new();
        let mut rest = response;
        while let Some(start) = rest.find(&open) {
            let after = &rest[start + open.len()..];
            let end = after.find(&close).ok_or_else(|| format!("<{name}> is not closed"))?;
            found.push(&after[..end]);
            rest = &after[end + close.len()..];
        }
        Ok(found)
    };
    if element("GetCallerIdentityResult")?.len() != 1 {
        return Err("the answer is not one GetCallerIdentityResult".into());
    }
    match element("Arn")?.as_slice() {
        [arn] if !arn.contains(['<', '&']) => Ok((*arn).trim().to_owned()),
        [_] => Err("the answer's Arn holds markup".into()),
        other => Err(format!("the answer holds {} Arn elements", other.len())),
    }
}

/// Reads STS's `<Error><Code>` and `<Message>` for a refusal's message.
pub fn error_summary(response: &str) -> String {
    let text = |name: &str| {
        response
            .split_once(&format!("<{name}>"))
            .and_then(|(_, r)| r.split_once(&format!("</{name}>")))
            .map(|(t, _)| crate::identity::truncate(t.trim(), 160))
    };
    match (text("Code"), text("Message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code,
        _ => crate::identity::truncate(response.trim(), 160),
    }
}

/// What STS's answer must name for an `aws/v1` request to prove the document's instance.
#[derive(Debug, Clone, Copy)]
pub struct ExpectedCaller<'a> {
    /// The document's region: the ARN's partition must be the region's.
    pub region: &'a str,
    /// The document's account.
    pub account_id: &'a str,
    /// The document's instance: EC2 names an instance profile's session after it.
    pub instance_id: &'a str,
    /// The roles the Cluster names (`cluster.x-k8s.io/kubelet-aws-roles`): any principal
    /// allowed to assume a role chooses its session name, so only roles whose trust policy
    /// admits EC2 alone prove that the session is the instance's.
    pub roles: &'a [String],
}

/// The partition of `region` (what an ARN of that region starts with).
pub fn partition(region: &str) -> &'static str {
    const PREFIXES: [(&str, &str); 7] = [
        ("cn-", "aws-cn"),
        ("us-gov-", "aws-us-gov"),
        ("eusc-", "aws-eusc"),
        ("us-isob-", "aws-iso-b"),
        ("us-isof-", "aws-iso-f"),
        ("eu-isoe-", "aws-iso-e"),
        ("us-iso-", "aws-iso"),
    ];
    PREFIXES
        .iter()
        .find(|(prefix, _)| region.starts_with(prefix))
        .map_or("aws", |(_, partition)| partition)
}

/// Checks that STS's `arn` is `arn:<partition>:sts::<account>:assumed-role/<role>/<instance>`
/// for the document's partition, account and instance, with a `<role>` the Cluster names
/// (IAM role names are unique regardless of case, so they compare so). Returns the role.
pub fn check_instance_arn<'a>(arn: &'a str, expected: &ExpectedCaller<'_>) -> Result<&'a str, String> {
    let shown = || format!("{:?}", crate::identity::truncate(arn, 160));
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let ["arn", partition_of_arn, "sts", "", account, resource] = parts.as_slice() else {
        return Err(format!("ARN: {} is not an STS assumed-role ARN", shown()));
    };
    let wanted = partition(expected.region);
    if *partition_of_arn != wanted {
        return Err(format!(
            "ARN: {} is of partition {:?}, the identity document's region {} is in {wanted}",
            shown(),
            crate::identity::truncate(partition_of_arn, 32),
            expected.region
        ));
    }
    let segments: Vec<&str> = resource.split('/').collect();
    let ["assumed-role", role, session] = segments.as_slice() else {
        return Err(format!("ARN: {} is not assumed-role/<role>/<session>", shown()));
    };
    if role.is_empty() {
        return Err(format!("ARN: {} names no role", shown()));
    }
    if *account != expected.account_id {
        return Err(format!(
            "ARN: {} is of account {account}, the identity document of {}",
            shown(),
            expected.account_id
        ));
    }
    if *session != expected.instance_id {
        return Err(format!(
            "ARN: {} is a session of {session:?}, not instance {} (instance-profile credentials name their instance)",
            shown(),
            expected.instance_id
        ));
    }
    if !expected.roles.iter().any(|r| r.eq_ignore_ascii_case(role)) {
        return Err(format!(
            "role: {} is a session of role {:?}, which is not in the Cluster's {} ({}): a session name is chosen by whoever assumes a role, so only the nodes' own roles prove the instance",
            shown(),
            crate::identity::truncate(role, 64),
            crate::names::ANNOTATION_AWS_ROLES,
            expected.roles.join(",")
        ));
    }
    Ok(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn amz(at: OffsetDateTime) -> String {
        let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
        at.format(format).unwrap()
    }

    fn request(mutate: impl FnOnce(&mut BTreeMap<String, String>, &mut String)) -> SignedStsRequest {
        let date = amz(now());
        let mut headers = BTreeMap::from([
            (
                "Authorization".to_owned(),
                format!(
                    "AWS4-HMAC-SHA256 Credential=ASIA/{}/us-east-1/sts/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-kubelet-authenticator-binding, Signature=00ff",
                    &date[..8]
                ),
            ),
            (
                "content-type".to_owned(),
                "application/x-www-form-urlencoded; charset=utf-8".to_owned(),
            ),
            ("host".to_owned(), "sts.us-east-1.amazonaws.com".to_owned()),
            ("x-amz-date".to_owned(), date),
            ("x-amz-security-token".to_owned(), "SESSION-SECRET".to_owned()),
            (BINDING_HEADER.to_owned(), "B".to_owned()),
        ]);
        let mut body = base64::engine::general_purpose::STANDARD.encode(GET_CALLER_IDENTITY_BODY);
        mutate(&mut headers, &mut body);
        SignedStsRequest { headers, body }
    }

    fn checks(endpoints: &StsEndpoints) -> CallChecks<'_> {
        CallChecks {
            region: "us-east-1",
            binding: "B",
            endpoints,
            now: now(),
            max_age: Duration::minutes(10),
        }
    }

    #[test]
    fn a_well_formed_request_becomes_a_call_to_the_signers_own_endpoint() {
        let endpoints = StsEndpoints::regional();
        let call = request(|_, _| {}).to_call(&checks(&endpoints)).unwrap();
        assert_eq!(call.url, "https://sts.us-east-1.amazonaws.com/");
        assert_eq!(call.body, GET_CALLER_IDENTITY_BODY.as_bytes());
        assert!(call.headers.iter().any(|(k, _)| k == "authorization"));
        assert!(!format!("{call:?}").contains("SESSION-SECRET") && !format!("{call:?}").contains("00ff"));
        let sent = request(|_, _| {});
        assert!(!format!("{sent:?}").contains("SESSION-SECRET") && !format!("{sent:?}").contains("00ff"));
    }

    #[test]
    fn every_tampering_is_refused_before_sending_and_names_what_failed() {
        let endpoints = StsEndpoints::regional();
        type Tamper = Box<dyn FnOnce(&mut BTreeMap<String, String>, &mut String)>;
        let cases: Vec<(&str, Tamper)> = vec![
            (
                "binding",
                Box::new(|h, _| drop(h.insert(BINDING_HEADER.into(), "other".into()))),
            ),
            (
                "\"x-kubelet-authenticator-binding\" is not sent",
                Box::new(|h, _| drop(h.remove(BINDING_HEADER))),
            ),
            (
                "host",
                Box::new(|h, _| drop(h.insert("host".into(), "evil.example".into()))),
            ),
            (
                "body",
                Box::new(|_, b| {
                    *b = base64::engine::general_purpose::STANDARD.encode("Action=AssumeRole&Version=2011-06-15")
                }),
            ),
            (
                "age",
                Box::new(|h, _| drop(h.insert("x-amz-date".into(), amz(now() - Duration::minutes(20))))),
            ),
            (
                "not allowed",
                Box::new(|h, _| drop(h.insert("x-forwarded-for".into(), "1".into()))),
            ),
            (
                "twice",
                Box::new(|h, _| drop(h.insert("HOST".into(), "sts.us-east-1.amazonaws.com".into()))),
            ),
            (
                "region",
                Box::new(|h, _| {
                    let a = h["Authorization"].replace("us-east-1", "eu-west-1");
                    h.insert("Authorization".into(), a);
                }),
            ),
            (
                "service",
                Box::new(|h, _| {
                    let a = h["Authorization"].replace("/sts/", "/iam/");
                    h.insert("Authorization".into(), a);
                }),
            ),
            (
                "not signed",
                Box::new(|h, _| {
                    let a = h["Authorization"].replace(";x-kubelet-authenticator-binding", "");
                    h.insert("Authorization".into(), a);
                }),
            ),
            (
                "malformed value",
                Box::new(|h, _| drop(h.insert("x-amz-security-token".into(), "a\r\nX-Evil: 1".into()))),
            ),
            (
                "AWS4-HMAC-SHA256",
                Box::new(|h, _| drop(h.insert("Authorization".into(), "Basic x".into()))),
            ),
            (
                "x-amz-content-sha256",
                Box::new(|h, _| {
                    let a = h["Authorization"].replace("host;", "host;x-amz-content-sha256;");
                    h.insert("Authorization".into(), a);
                    h.insert("x-amz-content-sha256".into(), "00".repeat(32));
                }),
            ),
        ];
        for (expected, mutate) in cases {
            let why = request(mutate).to_call(&checks(&endpoints)).unwrap_err();
            assert!(why.contains(expected), "{expected}: {why}");
        }
    }

    #[test]
    fn endpoints_and_hosts_follow_the_template() {
        let local = StsEndpoints::from_template("http://127.0.0.1:4566").unwrap();
        assert_eq!(local.url("us-east-1"), "http://127.0.0.1:4566/");
        let proxied = StsEndpoints::from_template("https://proxy.example/sts/{region}/").unwrap();
        assert_eq!(proxied.url("us-east-1"), "https://proxy.example/sts/us-east-1/");
        assert_eq!(proxied.host("us-east-1"), "proxy.example");
        assert_eq!(local.host("us-east-1"), "127.0.0.1:4566");
        let templated = StsEndpoints::from_template("https://sts.{region}.example:443/").unwrap();
        assert_eq!(templated.host("eu-west-1"), "sts.eu-west-1.example");
        assert_eq!(
            StsEndpoints::regional().host("cn-north-1"),
            "sts.cn-north-1.amazonaws.com.cn"
        );
        assert_eq!(
            StsEndpoints::regional().host("eusc-de-east-1"),
            "sts.eusc-de-east-1.amazonaws.eu"
        );
        assert_eq!(
            StsEndpoints::regional().host("us-gov-west-1"),
            "sts.us-gov-west-1.amazonaws.com"
        );
        assert!(StsEndpoints::from_template("sts.example").is_err());
    }

    fn expected(roles: &[String]) -> ExpectedCaller<'_> {
        ExpectedCaller {
            region: "us-east-1",
            account_id: "123456789012",
            instance_id: "i-0123456789abcdef0",
            roles,
        }
    }

    #[test]
    fn arns_must_be_the_documents_instance_profile() {
        let roles = ["node-role".to_owned(), "Control-Plane".to_owned()];
        let ok = "arn:aws:sts::123456789012:assumed-role/node-role/i-0123456789abcdef0";
        assert_eq!(check_instance_arn(ok, &expected(&roles)), Ok("node-role"));
        let cased = "arn:aws:sts::123456789012:assumed-role/control-plane/i-0123456789abcdef0";
        assert_eq!(check_instance_arn(cased, &expected(&roles)), Ok("control-plane"));
        for (arn, what) in [
            (
                "arn:aws:sts::210987654321:assumed-role/node-role/i-0123456789abcdef0",
                "account",
            ),
            (
                "arn:aws:sts::123456789012:assumed-role/node-role/i-0fedcba9876543210",
                "session",
            ),
            ("arn:aws:iam::123456789012:user/alice", "assumed-role ARN"),
            (
                "arn:aws:sts::123456789012:federated-user/i-0123456789abcdef0",
                "assumed-role/",
            ),
            (
                "arn:aws:sts::123456789012:assumed-role/r/i-0123456789abcdef0/x",
                "assumed-role/",
            ),
            // The review's forgery: any role a principal may assume, session named after the
            // victim instance.
            (
                "arn:aws:sts::123456789012:assumed-role/ci-deployer/i-0123456789abcdef0",
                "not in the Cluster's cluster.x-k8s.io/kubelet-aws-roles",
            ),
            (
                "arn:aws-cn:sts::123456789012:assumed-role/node-role/i-0123456789abcdef0",
                "partition \"aws-cn\"",
            ),
            (
                "arn:aws-us-gov:sts::123456789012:assumed-role/node-role/i-0123456789abcdef0",
                "in aws",
            ),
        ] {
            let why = check_instance_arn(arn, &expected(&roles)).unwrap_err();
            assert!(why.contains(what), "{arn}: {why}");
        }
        let none = check_instance_arn(ok, &expected(&[])).unwrap_err();
        assert!(none.contains("role"), "{none}");
    }

    #[test]
    fn every_region_maps_to_its_partition() {
        for (region, expected) in [
            ("us-east-1", "aws"),
            ("eu-west-3", "aws"),
            ("cn-north-1", "aws-cn"),
            ("us-gov-west-1", "aws-us-gov"),
            ("eusc-de-east-1", "aws-eusc"),
            ("us-iso-east-1", "aws-iso"),
            ("us-isob-east-1", "aws-iso-b"),
        ] {
            assert_eq!(partition(region), expected, "{region}");
        }
    }

    #[test]
    fn answers_are_read_strictly() {
        let ok = "<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>arn:aws:sts::1:assumed-role/r/i-1</Arn><UserId>x</UserId></GetCallerIdentityResult></GetCallerIdentityResponse>";
        assert_eq!(caller_arn(ok).unwrap(), "arn:aws:sts::1:assumed-role/r/i-1");
        let twice = ok.replace("<UserId>", "<Arn>arn:aws:sts::2:assumed-role/r/i-2</Arn><UserId>");
        assert!(caller_arn(&twice).is_err());
        assert!(caller_arn("<Error><Code>x</Code></Error>").is_err());
        assert_eq!(
            error_summary(
                "<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code><Message>bad</Message></Error></ErrorResponse>"
            ),
            "SignatureDoesNotMatch: bad"
        );
    }
}
