//! The clouds' instance metadata services, as the `gcp/v1`, `aws/v1` and `azure/v1` attestors
//! reach them: [`GceMetadataHttp`] implements the attestation crate's [`GceMetadata`], [`ImdsV2`]
//! its [`Ec2Metadata`], [`AzureImdsHttp`] its [`AzureImds`] (and finds the VM's CAPZ provider ID,
//! [`AzureImdsHttp::provider_id`]).
//!
//! The services speak plain HTTP/1.1 on a link-local address, a few small requests per
//! attestation, and the attestor traits are synchronous: a blocking client over
//! [`std::net::TcpStream`] is all it takes, so no HTTP stack comes in for it. It connects to the
//! address configured, never through the environment's proxy (`HTTP_PROXY` is not read: Azure
//! does not support reaching IMDS through a proxy, and the services are link-local). One request per
//! connection (`Connection: close`); every wait is bounded ([`CONNECT_TIMEOUT`], then
//! [`READ_TIMEOUT`] for the whole answer) and so is every size (16 KiB of status line and
//! headers, [`MAX_BODY`] of body, read by `Content-Length`, chunked, or until the close).
//! Answers can carry credentials (a session token, the role's secret key), so their bytes are
//! kept in memory that is zeroed when dropped, and no error ever quotes a body: errors name
//! the service, the URL and the status.
//!
//! An unreachable service (no route, refused, no answer in time) is
//! [`AttestError::DeviceUnavailable`]: the node is not on that cloud, or the service is
//! briefly away. An answer that is wrong (an error status, a missing header, a malformed
//! body) is [`AttestError::Failed`]. Azure's IMDS alone is asked again, a bounded number of
//! times ([`AZURE_TRIES`]), when it says so (429, 410, 5xx) or answers a stale document.
//!
//! Where the services are follows the platforms' SDK conventions (SPEC section 5):
//! `GCE_METADATA_HOST` (host\[:port\]) and `AWS_EC2_METADATA_SERVICE_ENDPOINT` (a URL), for a
//! proxy, an emulator or a test's stand-in. The Azure SDKs have no such setting for IMDS as a
//! whole (azure-identity's `AZURE_POD_IDENTITY_AUTHORITY_HOST` and `IMDS_ENDPOINT` move only the
//! managed-identity token endpoint), so `AZURE_METADATA_ENDPOINT` (a URL) is this plugin's, the
//! name other Azure tools (lego) give the metadata service's URL.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attestation::attestor::AttestError;
use attestation::aws::attestor::{Ec2Metadata, RoleCredentials};
use attestation::azure::attestor::{AzureImds, nonce_of};
use attestation::gcp::attestor::GceMetadata;
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

/// The environment variable naming the GCE metadata server (host\[:port\]), as Google's SDKs
/// read it.
pub const GCE_METADATA_HOST_ENV: &str = "GCE_METADATA_HOST";

/// The GCE metadata server's name inside Compute Engine.
const DEFAULT_GCE_METADATA_HOST: &str = "metadata.google.internal";

/// The identity endpoint of the instance's default service account.
const GCE_IDENTITY_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/identity";

/// The environment variable naming the EC2 instance metadata service (a URL), as AWS's SDKs
/// read it.
pub const AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

/// The EC2 instance metadata service's link-local address.
const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/";

/// IMDSv2 session tokens: where they are issued and the header carrying them.
const IMDS_TOKEN_PATH: &str = "/latest/api/token";
const IMDS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const IMDS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
/// Five minutes: one attestation needs a few seconds of it.
const IMDS_TOKEN_TTL_SECONDS: &str = "300";

const IMDS_RSA2048_PATH: &str = "/latest/dynamic/instance-identity/rsa2048";
const IMDS_ROLES_PATH: &str = "/latest/meta-data/iam/security-credentials/";

const GCE_SERVICE: &str = "the GCE metadata server";
const IMDS_SERVICE: &str = "the EC2 instance metadata service";
const NO_ROLE: &str = "the instance has no IAM role: aws/v1 needs an instance profile";

/// The environment variable naming Azure's instance metadata service (a URL,
/// `http://host[:port][/path]`): for Azure Stack Hub, an emulator or a test's stand-in. No Azure
/// SDK reads one for IMDS as a whole (see the module's documentation).
pub const AZURE_METADATA_ENDPOINT_ENV: &str = "AZURE_METADATA_ENDPOINT";

/// Azure's instance metadata service's link-local address (the same in every Azure cloud).
const DEFAULT_AZURE_IMDS_ENDPOINT: &str = "http://169.254.169.254/";

/// The IMDS API version asked for: the attested document carries `subscriptionId` from
/// 2020-09-01 on, which `azure/v1` needs.
const AZURE_API_VERSION: &str = "2021-02-01";

const AZURE_DOCUMENT_PATH: &str = "/metadata/attested/document";
const AZURE_RESOURCE_ID_PATH: &str = "/metadata/instance/compute/resourceId";
const AZURE_SERVICE: &str = "the Azure instance metadata service";

/// How many times one Azure IMDS request is made before giving up, when IMDS asks for it to be
/// made again.
pub const AZURE_TRIES: u32 = 5;

/// The wait before the second try, doubled before each later one: 1 + 2 + 4 + 8 = 15 seconds
/// of waiting at most, besides the requests' own bounded time.
const AZURE_FIRST_DELAY: Duration = Duration::from_secs(1);

/// An environment variable's value when it is set and not empty (how the SDKs treat theirs);
/// a value that is not UTF-8 is an error rather than silently ignored.
pub fn env_value(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(Some(value.trim().to_owned())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{name} is not UTF-8"),
    }
}

/// [`GceMetadata`] over HTTP: the identity token of the instance's default service account,
/// asked of the Compute Engine metadata server with `Metadata-Flavor: Google`. An answer
/// without that header in return is refused: whatever answered is not the metadata server
/// (a captive proxy, a stray listener), and its "token" is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceMetadataHttp {
    server: Server,
}

impl GceMetadataHttp {
    /// The metadata server named by `GCE_METADATA_HOST` when it is set (a proxy or an
    /// emulator, as Google's SDKs allow), else `metadata.google.internal`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(GCE_METADATA_HOST_ENV)?.as_deref())
    }

    /// The metadata server at `host` (host\[:port\], no scheme: the SDK convention), or the
    /// default one.
    pub fn new(host: Option<&str>) -> Result<Self> {
        let authority = host.unwrap_or(DEFAULT_GCE_METADATA_HOST);
        if authority.contains("://") {
            bail!("{GCE_METADATA_HOST_ENV} {authority:?} is host[:port], without a scheme");
        }
        let (host, port) =
            parse_authority(authority).with_context(|| format!("{GCE_METADATA_HOST_ENV} {authority:?}"))?;
        Ok(Self {
            server: Server::new(GCE_SERVICE, host, port, authority, ""),
        })
    }
}

impl GceMetadata for GceMetadataHttp {
    fn identity_token(&mut self, audience: &str) -> Result<String, AttestError> {
        let target = format!("{GCE_IDENTITY_PATH}?audience={}&format=full", percent_encode(audience));
        let response = self.server.send("GET", &target, &[("Metadata-Flavor", "Google")])?;
        if response.header("metadata-flavor") != Some("Google") {
            return Err(AttestError::Failed(format!(
                "the answer from {} has no `Metadata-Flavor: Google` header: it is not the GCE metadata server's, and it is not used",
                self.server.url(&target)
            )));
        }
        let body = self.server.success(&response, &target, "an identity token")?;
        let token = std::str::from_utf8(body)
            .map_err(|_| self.server.bad_body(&target, "the identity token is not UTF-8"))?
            .trim();
        if token.is_empty() {
            return Err(self.server.bad_body(&target, "the identity token is empty"));
        }
        Ok(token.to_owned())
    }
}

/// [`Ec2Metadata`] over HTTP, IMDSv2 only: a session token first (`PUT`), then each `GET`
/// carrying it. IMDSv1 (no token) is what many instances disable, and what a server-side
/// request forgery on the node reaches most easily; IMDSv2 works wherever the service does.
pub struct ImdsV2 {
    server: Server,
    /// The session token, once issued: every request of one attestation shares it.
    token: Option<Zeroizing<String>>,
}

impl std::fmt::Debug for ImdsV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsV2")
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "..."))
            .finish()
    }
}

impl ImdsV2 {
    /// The service named by `AWS_EC2_METADATA_SERVICE_ENDPOINT` when it is set (as AWS's SDKs
    /// allow), else `http://169.254.169.254/`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV)?.as_deref())
    }

    /// The service at `endpoint` (`http://host[:port][/path]`), or the default one.
    pub fn new(endpoint: Option<&str>) -> Result<Self> {
        let endpoint = endpoint.unwrap_or(DEFAULT_IMDS_ENDPOINT);
        Ok(Self {
            server: http_endpoint(IMDS_SERVICE, endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT_ENV)?,
            token: None,
        })
    }

    /// The session token, asked for once and kept.
    fn session_token(&mut self) -> Result<Zeroizing<String>, AttestError> {
        if let Some(token) = &self.token {
            return Ok(token.clone());
        }
        let response = self.server.send(
            "PUT",
            IMDS_TOKEN_PATH,
            &[(IMDS_TOKEN_TTL_HEADER, IMDS_TOKEN_TTL_SECONDS)],
        )?;
        let body = self
            .server
            .success(&response, IMDS_TOKEN_PATH, "a session token (IMDSv2)")?;
        let token = std::str::from_utf8(body).map(str::trim).unwrap_or_default();
        // It goes back in a header: visible ASCII only, so nothing can be smuggled in there.
        if token.is_empty() || token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(self.server.bad_body(IMDS_TOKEN_PATH, "the session token is malformed"));
        }
        let token = Zeroizing::new(token.to_owned());
        self.token = Some(token.clone());
        Ok(token)
    }

    /// `GET target` with the session token. A 401 means the token expired or the service
    /// restarted: a new one is asked for, once.
    fn get(&mut self, target: &str) -> Result<Response, AttestError> {
        let mut retried = false;
        loop {
            let token = self.session_token()?;
            let response = self
                .server
                .send("GET", target, &[(IMDS_TOKEN_HEADER, token.as_str())])?;
            if response.status == 401 && !retried {
                self.token = None;
                retried = true;
                continue;
            }
            return Ok(response);
        }
    }
}

impl Ec2Metadata for ImdsV2 {
    fn identity_rsa2048(&mut self) -> Result<String, AttestError> {
        let response = self.get(IMDS_RSA2048_PATH)?;
        let body = self
            .server
            .success(&response, IMDS_RSA2048_PATH, "the instance identity document")?;
        let text = std::str::from_utf8(body).map_err(|_| {
            self.server
                .bad_body(IMDS_RSA2048_PATH, "the identity document's signature is not text")
        })?;
        if text.trim().is_empty() {
            return Err(self
                .server
                .bad_body(IMDS_RSA2048_PATH, "the identity document's signature is empty"));
        }
        Ok(text.to_owned())
    }

    fn role_credentials(&mut self) -> Result<RoleCredentials, AttestError> {
        let listing = self.get(IMDS_ROLES_PATH)?;
        let no_role = || {
            AttestError::Failed(format!(
                "{NO_ROLE} ({IMDS_SERVICE} lists none at {})",
                self.server.url(IMDS_ROLES_PATH)
            ))
        };
        if listing.status == 404 {
            return Err(no_role());
        }
        let body = self
            .server
            .success(&listing, IMDS_ROLES_PATH, "the instance's IAM role")?;
        let role = std::str::from_utf8(body)
            .map_err(|_| self.server.bad_body(IMDS_ROLES_PATH, "the role listing is not UTF-8"))?
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .ok_or_else(no_role)?
            .to_owned();
        let target = format!("{IMDS_ROLES_PATH}{}", percent_encode(&role));
        let answer = self.get(&target)?;
        let what = format!("the credentials of role {}", shown(&role));
        let body = self.server.success(&answer, &target, &what)?;
        parse_credentials(body, &what).map_err(|why| self.server.bad_body(&target, &why))
    }
}

/// The credential document's three secrets, moved out of the parsed JSON into zeroed
/// memory. Errors never quote the document.
fn parse_credentials(body: &[u8], what: &str) -> Result<RoleCredentials, String> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("{what} are not JSON (line {}, column {})", e.line(), e.column()))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(format!("{what} are not a JSON object"));
    };
    match fields.get("Code").and_then(serde_json::Value::as_str) {
        Some("Success") => {}
        Some(code) => return Err(format!("{what} are not usable: Code is {}", shown(code))),
        None => return Err(format!("{what} have no Code")),
    }
    let mut take = |name: &str| match fields.remove(name) {
        Some(serde_json::Value::String(value)) if !value.is_empty() => Ok(Zeroizing::new(value)),
        _ => Err(format!("{what} have no {name}")),
    };
    let access_key_id = take("AccessKeyId")?;
    let secret_access_key = take("SecretAccessKey")?;
    let session_token = take("Token")?;
    Ok(RoleCredentials {
        access_key_id: access_key_id.to_string(),
        secret_access_key,
        session_token,
    })
}

/// [`AzureImds`] over HTTP: Azure's Instance Metadata Service, every request with
/// `Metadata: true` (IMDS refuses one without it). A request IMDS asks to be made again (429:
/// more than its 5 requests a second; 410 and 5xx: not ready, as while the VM starts) is made
/// again after 1, 2, 4 and 8 seconds, [`AZURE_TRIES`] tries in all; so is one answered with a
/// stale attested document, whose nonce is not the one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureImdsHttp {
    server: Server,
    /// [`AZURE_TRIES`].
    tries: u32,
    /// [`AZURE_FIRST_DELAY`]; shorter in tests.
    first_delay: Duration,
}

/// One answer of Azure's IMDS, read.
enum Answered<T> {
    /// What was asked for.
    Got(T),
    /// Not it, and worth asking again: why, for the message if the tries run out.
    Again(String),
}

impl AzureImdsHttp {
    /// The service named by `AZURE_METADATA_ENDPOINT` when it is set, else
    /// `http://169.254.169.254/`.
    pub fn from_env() -> Result<Self> {
        Self::new(env_value(AZURE_METADATA_ENDPOINT_ENV)?.as_deref())
    }

    /// The service at `endpoint` (`http://host[:port][/path]`), or the default one.
    pub fn new(endpoint: Option<&str>) -> Result<Self> {
        let endpoint = endpoint.unwrap_or(DEFAULT_AZURE_IMDS_ENDPOINT);
        Ok(Self {
            server: http_endpoint(AZURE_SERVICE, endpoint, AZURE_METADATA_ENDPOINT_ENV)?,
            tries: AZURE_TRIES,
            first_delay: AZURE_FIRST_DELAY,
        })
    }

    /// `GET target` until `read` takes an answer, IMDS's retry statuses and `read`'s
    /// [`Answered::Again`] asked again, [`Self::tries`] times at most. An unreachable service
    /// is not asked again: the node is not on Azure, or IMDS is away for longer than this waits.
    fn get<T>(
        &self,
        target: &str,
        what: &str,
        mut read: impl FnMut(&Response) -> Result<Answered<T>, AttestError>,
    ) -> Result<T, AttestError> {
        let started = Instant::now();
        let mut delay = self.first_delay;
        let mut last = String::new();
        for attempt in 1..=self.tries {
            if attempt > 1 {
                std::thread::sleep(delay);
                delay = delay.saturating_mul(2);
            }
            let response = self.server.send("GET", target, &[("Metadata", "true")])?;
            if matches!(response.status, 410 | 429 | 500..=599) {
                last = format!("it answered {} {}", response.status, response.reason)
                    .trim_end()
                    .to_owned();
                continue;
            }
            match read(&response)? {
                Answered::Got(value) => return Ok(value),
                Answered::Again(why) => last = why,
            }
        }
        Err(AttestError::Failed(format!(
            "{} at {} gave no usable answer to the request for {what} in {} tries over {:.1}s (the last: {last}); giving up",
            self.server.service,
            self.server.url(target),
            self.tries,
            started.elapsed().as_secs_f64()
        )))
    }

    /// The VM's provider ID as CAPZ writes it on its Machine ([`capz_provider_id`]), from the
    /// VM's ARM resource ID (`/metadata/instance/compute/resourceId`, as text).
    pub fn provider_id(&self) -> Result<String, AttestError> {
        let target = format!("{AZURE_RESOURCE_ID_PATH}?api-version={AZURE_API_VERSION}&format=text");
        let what = "the VM's resource ID";
        self.get(&target, what, |response| {
            let body = self.server.success(response, &target, what)?;
            let text =
                std::str::from_utf8(body).map_err(|_| self.server.bad_body(&target, "the resource ID is not UTF-8"))?;
            capz_provider_id(text.trim())
                .map(Answered::Got)
                .map_err(|why| self.server.bad_body(&target, &why))
        })
    }
}

impl AzureImds for AzureImdsHttp {
    fn attested_document(&mut self, nonce: &str) -> Result<String, AttestError> {
        let target = format!(
            "{AZURE_DOCUMENT_PATH}?api-version={AZURE_API_VERSION}&nonce={}",
            percent_encode(nonce)
        );
        let what = "the attested document";
        self.get(&target, what, |response| {
            let body = self.server.success(response, &target, what)?;
            let signature = attested_signature(body).map_err(|why| self.server.bad_body(&target, &why))?;
            // IMDS may answer with the document it made for an earlier request: ask again.
            match nonce_of(&signature) {
                Ok(answered) if answered == nonce => Ok(Answered::Got(signature)),
                Ok(answered) => Ok(Answered::Again(format!(
                    "it answered a document of nonce {}, a stale one",
                    shown(&answered)
                ))),
                Err(why) => Err(self
                    .server
                    .bad_body(&target, &format!("the attested document does not read: {why}"))),
            }
        })
    }
}

/// The `signature` of IMDS's `{"encoding": "pkcs7", "signature": "<base64>"}`.
fn attested_signature(body: &[u8]) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the answer is not JSON (line {}, column {})", e.line(), e.column()))?;
    match value.get("encoding").and_then(serde_json::Value::as_str) {
        Some(encoding) if encoding.eq_ignore_ascii_case("pkcs7") => {}
        Some(encoding) => return Err(format!("the document's encoding is {}, not pkcs7", shown(encoding))),
        None => return Err("the answer has no encoding".into()),
    }
    value
        .get("signature")
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|signature| !signature.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "the answer has no signature".into())
}

/// The longest resource ID taken: a provider ID is at most 512 bytes, and ARM's names are short.
const MAX_RESOURCE_ID: usize = 400;

/// The provider ID CAPZ writes on the Machine of the VM whose ARM resource ID is
/// `resource_id`, byte for byte. CAPZ writes `ConvertResourceGroupNameToLower("azure://" + id)`
/// for a VM (`azure/services/virtualmachines/virtualmachines.go`), and `"azure://"` before the
/// same function's result for a scale-set VM (`azure/converters/vmss.go`, `SDKToVMSSVM`; the
/// VMs of a flexible scale set are VM resources, and `azure/types.go` writes theirs in a VM's
/// form). That function, cloud-provider-azure's, finds the resource group with the
/// case-sensitive pattern `.*/subscriptions/(?:.*)/resourceGroups/(.+)/providers/(?:.*)` and
/// lower-cases the first occurrence of that text in the whole ID (Go's `strings.Replace(id, rg,
/// lower(rg), 1)`), which is the resource-group segment unless the same text stands earlier.
/// Both are done here as Go does them, so even that case comes out as CAPZ's. The result must
/// be a VM or scale-set VM ID the signer reads ([`attestation::azure::AzureVm`]).
pub fn capz_provider_id(resource_id: &str) -> Result<String, String> {
    let bad = |why: &str| format!("resource ID {} is not a VM's: {why}", shown(resource_id));
    if resource_id.is_empty()
        || resource_id.len() > MAX_RESOURCE_ID
        || !resource_id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad(&format!(
            "empty, longer than {MAX_RESOURCE_ID} bytes, or not printable ASCII"
        )));
    }
    let provider_id = format!("azure://{resource_id}");
    let group = resource_group_as_capz_finds_it(&provider_id)
        .ok_or_else(|| bad("no /subscriptions/.../resourceGroups/<name>/providers/... in it"))?;
    let provider_id = provider_id.replacen(group, &group.to_ascii_lowercase(), 1);
    attestation::azure::AzureVm::parse(&provider_id).map_err(|e| bad(&e))?;
    Ok(provider_id)
}

/// The group of `.*/subscriptions/(?:.*)/resourceGroups/(.+)/providers/(?:.*)` in `text` as Go's
/// regexp reports it (leftmost-first, each `*` and `+` as long as the rest allows): the last
/// `/subscriptions/` that leads to a match, then the last `/resourceGroups/` after it that does,
/// then the last `/providers/` after that. `text` is printable ASCII (no newline for `.` to miss).
fn resource_group_as_capz_finds_it(text: &str) -> Option<&str> {
    const SUBSCRIPTIONS: &str = "/subscriptions/";
    const RESOURCE_GROUPS: &str = "/resourceGroups/";
    const PROVIDERS: &str = "/providers/";
    // Every position, overlapping ones too (each marker's last `/` can be the next one's first).
    let bytes = text.as_bytes();
    let at = |marker: &str| -> Vec<usize> {
        (0..bytes.len())
            .filter(|i| bytes[*i..].starts_with(marker.as_bytes()))
            .collect()
    };
    let (subscriptions, groups, providers) = (at(SUBSCRIPTIONS), at(RESOURCE_GROUPS), at(PROVIDERS));
    for s in subscriptions.iter().rev() {
        for g in groups.iter().rev().filter(|g| **g >= s + SUBSCRIPTIONS.len()) {
            let start = g + RESOURCE_GROUPS.len();
            if let Some(p) = providers.iter().rev().find(|p| **p > start) {
                return text.get(start..*p);
            }
        }
    }
    None
}

/// A value from the network, fit for an error message: quoted, escaped, at most 64 characters.
fn shown(value: &str) -> String {
    let short: String = value.chars().take(64).collect();
    if short.len() < value.len() {
        format!("{short:?}...")
    } else {
        format!("{short:?}")
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters: a query value or a path
/// segment, whatever it holds.
fn percent_encode(text: &str) -> String {
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
fn http_endpoint(service: &'static str, endpoint: &str, setting: &str) -> Result<Server> {
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
fn parse_authority(authority: &str) -> Result<(String, u16)> {
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
struct Server {
    /// What errors call it.
    service: &'static str,
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
    fn new(service: &'static str, host: String, port: u16, authority: &str, prefix: &str) -> Self {
        Self {
            service,
            host,
            port,
            authority: authority.to_owned(),
            prefix: prefix.to_owned(),
            read_timeout: READ_TIMEOUT,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}{}", self.authority, self.prefix)
    }

    fn url(&self, target: &str) -> String {
        format!("{}{target}", self.base_url())
    }

    /// Sends one request and reads its answer, whatever its status.
    fn send(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Result<Response, AttestError> {
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
    fn success<'r>(&self, response: &'r Response, target: &str, what: &str) -> Result<&'r [u8], AttestError> {
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

    fn bad_body(&self, target: &str, why: &str) -> AttestError {
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
struct Response {
    status: u16,
    reason: String,
    headers: Vec<(String, String)>,
    body: Zeroizing<Vec<u8>>,
}

impl Response {
    /// The first header named `name` (lower case).
    fn header(&self, name: &str) -> Option<&str> {
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
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A loopback stand-in for a metadata service: answers each connection with the next
    /// canned answer, in order, and records each request's head.
    struct StandIn {
        address: String,
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl StandIn {
        fn answering(answers: Vec<Vec<u8>>) -> Self {
            Self::answering_then(answers, Duration::ZERO)
        }

        /// Keeps each connection open `hold` after answering, as a server ignoring
        /// `Connection: close` would.
        fn answering_then(answers: Vec<Vec<u8>>, hold: Duration) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let address = listener.local_addr().unwrap().to_string();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let recorded = Arc::clone(&requests);
            std::thread::spawn(move || {
                for answer in answers {
                    let Ok((mut stream, _)) = listener.accept() else {
                        return;
                    };
                    let request = read_head(&mut stream);
                    recorded.lock().unwrap().push(request);
                    let _ = stream.write_all(&answer);
                    std::thread::sleep(hold);
                }
            });
            Self { address, requests }
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }

        fn gce(&self) -> GceMetadataHttp {
            GceMetadataHttp::new(Some(&self.address)).unwrap()
        }

        fn imds(&self) -> ImdsV2 {
            ImdsV2::new(Some(&format!("http://{}/", self.address))).unwrap()
        }

        /// Azure's IMDS here, waiting 10 ms (doubled each time) instead of 1 s between tries.
        fn azure(&self) -> AzureImdsHttp {
            let mut imds = AzureImdsHttp::new(Some(&format!("http://{}/", self.address))).unwrap();
            imds.first_delay = Duration::from_millis(10);
            imds
        }
    }

    /// The request's head (this client's requests have no body).
    fn read_head(stream: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }

    fn answer(status: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
        let mut text = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (name, value) in headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        text.into_bytes()
    }

    fn ok(body: &str) -> Vec<u8> {
        answer("200 OK", &[], body)
    }

    fn google(body: &str) -> Vec<u8> {
        answer("200 OK", &[("Metadata-Flavor", "Google")], body)
    }

    const RSA2048: &str = "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSABIIB\nbnsKICAiYWNjb3VudElkIiA6ICIxMjM0NTY3ODkwMTIiLAo=";

    const CREDENTIALS: &str = r#"{
  "Code" : "Success",
  "LastUpdated" : "2025-01-01T00:00:00Z",
  "Type" : "AWS-HMAC",
  "AccessKeyId" : "ASIAEXAMPLE",
  "SecretAccessKey" : "secret-key-material",
  "Token" : "session-token-material",
  "Expiration" : "2025-01-01T06:00:00Z"
}"#;

    fn failed(result: Result<impl std::fmt::Debug, AttestError>) -> String {
        match result {
            Err(AttestError::Failed(message)) => message,
            other => panic!("expected AttestError::Failed, got {other:?}"),
        }
    }

    #[test]
    fn the_gce_audience_is_url_encoded_in_the_query_and_metadata_flavor_is_sent() {
        let stand_in = StandIn::answering(vec![google("h.p.s\n")]);
        let token = stand_in
            .gce()
            .identity_token("node-attestation.cluster.x-k8s.io/ab_-c+d e&f")
            .unwrap();
        assert_eq!(token, "h.p.s");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(
            request.starts_with(
                "GET /computeMetadata/v1/instance/service-accounts/default/identity?audience=node-attestation.cluster.x-k8s.io%2Fab_-c%2Bd%20e%26f&format=full HTTP/1.1\r\n"
            ),
            "{request}"
        );
        assert!(request.contains("\r\nMetadata-Flavor: Google\r\n"), "{request}");
        assert!(
            request.contains(&format!("\r\nHost: {}\r\n", stand_in.address)),
            "{request}"
        );
        assert!(request.contains("\r\nConnection: close\r\n"), "{request}");
    }

    #[test]
    fn a_gce_answer_without_metadata_flavor_is_refused_and_its_token_unused() {
        let stand_in = StandIn::answering(vec![ok("not.the.token")]);
        let message = failed(stand_in.gce().identity_token("aud"));
        assert!(message.contains("Metadata-Flavor: Google"), "{message}");
        assert!(!message.contains("not.the.token"), "{message}");
    }

    #[test]
    fn a_gce_error_status_names_the_url_and_the_status() {
        let stand_in = StandIn::answering(vec![answer(
            "400 Bad Request",
            &[("Metadata-Flavor", "Google")],
            "non-empty audience parameter required",
        )]);
        let message = failed(stand_in.gce().identity_token("aud"));
        assert!(message.contains("400 Bad Request"), "{message}");
        assert!(
            message.contains(&format!(
                "http://{}/computeMetadata/v1/instance/service-accounts/default/identity?audience=aud&format=full",
                stand_in.address
            )),
            "{message}"
        );
        assert!(message.contains("an identity token"), "{message}");
    }

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
    fn the_imds_session_token_is_put_before_the_gets_and_sent_with_each() {
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), ok(RSA2048), ok(RSA2048)]);
        let mut imds = stand_in.imds();
        assert_eq!(imds.identity_rsa2048().unwrap(), RSA2048);
        assert_eq!(imds.identity_rsa2048().unwrap(), RSA2048, "the token is kept");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 3, "one PUT, then GETs: {requests:?}");
        assert!(
            requests[0].starts_with("PUT /latest/api/token HTTP/1.1\r\n"),
            "{}",
            requests[0]
        );
        assert!(
            requests[0].contains("\r\nX-aws-ec2-metadata-token-ttl-seconds: 300\r\n"),
            "{}",
            requests[0]
        );
        assert!(requests[0].contains("\r\nContent-Length: 0\r\n"), "{}", requests[0]);
        for get in &requests[1..] {
            assert!(
                get.starts_with("GET /latest/dynamic/instance-identity/rsa2048 HTTP/1.1\r\n"),
                "{get}"
            );
            assert!(get.contains("\r\nX-aws-ec2-metadata-token: TOKEN-1\r\n"), "{get}");
        }
    }

    #[test]
    fn the_role_listing_and_its_credential_document_are_read() {
        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            ok("\nkubelet-node\nanother-role\n"),
            answer("200 OK", &[("Content-Type", "text/plain")], CREDENTIALS),
        ]);
        let credentials = stand_in.imds().role_credentials().unwrap();
        assert_eq!(credentials.access_key_id, "ASIAEXAMPLE");
        assert_eq!(credentials.secret_access_key.as_str(), "secret-key-material");
        assert_eq!(credentials.session_token.as_str(), "session-token-material");
        let requests = stand_in.requests();
        assert!(requests[1].starts_with("GET /latest/meta-data/iam/security-credentials/ HTTP/1.1\r\n"));
        assert!(requests[2].starts_with("GET /latest/meta-data/iam/security-credentials/kubelet-node HTTP/1.1\r\n"));
        assert!(requests[2].contains("\r\nX-aws-ec2-metadata-token: TOKEN-1\r\n"));
    }

    #[test]
    fn credentials_that_are_not_a_success_are_refused_without_quoting_them() {
        let document = CREDENTIALS.replace("\"Success\"", "\"AssumeRoleUnauthorizedAccess\"");
        let stand_in = StandIn::answering(vec![ok("TOKEN-1"), ok("kubelet-node"), ok(&document)]);
        let message = failed(stand_in.imds().role_credentials());
        assert!(message.contains("AssumeRoleUnauthorizedAccess"), "{message}");
        assert!(message.contains("\"kubelet-node\""), "{message}");
        assert!(!message.contains("secret-key-material"), "{message}");
        assert!(!message.contains("session-token-material"), "{message}");
    }

    #[test]
    fn an_instance_without_a_role_is_told_it_needs_an_instance_profile() {
        for listing in [answer("404 Not Found", &[], "Not Found"), ok("\n\n")] {
            let stand_in = StandIn::answering(vec![ok("TOKEN-1"), listing]);
            let message = failed(stand_in.imds().role_credentials());
            assert!(
                message.starts_with("the instance has no IAM role: aws/v1 needs an instance profile"),
                "{message}"
            );
        }
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
    fn a_401_asks_for_a_new_session_token_once() {
        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            answer("401 Unauthorized", &[], ""),
            ok("TOKEN-2"),
            ok(RSA2048),
        ]);
        assert_eq!(stand_in.imds().identity_rsa2048().unwrap(), RSA2048);
        let requests = stand_in.requests();
        assert!(requests[2].starts_with("PUT /latest/api/token "), "{}", requests[2]);
        assert!(
            requests[3].contains("\r\nX-aws-ec2-metadata-token: TOKEN-2\r\n"),
            "{}",
            requests[3]
        );

        let stand_in = StandIn::answering(vec![
            ok("TOKEN-1"),
            answer("401 Unauthorized", &[], ""),
            ok("TOKEN-2"),
            answer("401 Unauthorized", &[], ""),
        ]);
        assert!(failed(stand_in.imds().identity_rsa2048()).contains("401 Unauthorized"));
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

    /// Real attested documents (testdata/azure): this one's nonce is `20260728-192400`...
    const DOCUMENT: &str = include_str!("../../../testdata/azure/taskcluster-public-2026-07-28.p7b.b64");
    const NONCE: &str = "20260728-192400";
    /// ...and this one's `20260626-005645`: a stale answer to a request for [`NONCE`].
    const STALE: &str = include_str!("../../../testdata/azure/coder-public-2026-06-25.p7b.b64");

    /// IMDS's answer to `/metadata/attested/document`.
    fn attested(signature: &str) -> Vec<u8> {
        answer(
            "200 OK",
            &[("Content-Type", "application/json; charset=utf-8")],
            &format!(r#"{{"encoding":"pkcs7","signature":"{}"}}"#, signature.trim()),
        )
    }

    const SUB: &str = "8a205152-b25a-417f-a676-80465535a6c9";

    #[test]
    fn the_attested_document_is_asked_for_with_the_nonce_and_metadata_true_directly() {
        let stand_in = StandIn::answering(vec![attested(DOCUMENT)]);
        let document = stand_in.azure().attested_document(NONCE).unwrap();
        assert_eq!(document, DOCUMENT.trim(), "the signature as served");
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(
            request.starts_with(&format!(
                "GET /metadata/attested/document?api-version=2021-02-01&nonce={NONCE} HTTP/1.1\r\n"
            )),
            "{request}"
        );
        assert!(request.contains("\r\nMetadata: true\r\n"), "{request}");
        assert!(
            request.contains(&format!("\r\nHost: {}\r\n", stand_in.address)),
            "{request}"
        );
        // Straight to the service: nothing a proxy adds, which IMDS would refuse.
        assert!(!request.to_ascii_lowercase().contains("forwarded"), "{request}");

        let imds = AzureImdsHttp::new(None).unwrap();
        assert_eq!(imds.server.base_url(), "http://169.254.169.254");
        assert_eq!((imds.tries, imds.first_delay), (5, Duration::from_secs(1)));
        let imds = AzureImdsHttp::new(Some("http://127.0.0.1:8080/azure-stack/")).unwrap();
        assert_eq!(
            imds.server.url(AZURE_DOCUMENT_PATH),
            "http://127.0.0.1:8080/azure-stack/metadata/attested/document"
        );
        let error = AzureImdsHttp::new(Some("https://169.254.169.254")).unwrap_err();
        assert!(
            format!("{error:#}").starts_with("AZURE_METADATA_ENDPOINT \"https://169.254.169.254\": not an http:// URL"),
            "{error:#}"
        );
    }

    #[test]
    fn what_imds_says_to_retry_is_asked_again_after_a_delay() {
        let stand_in = StandIn::answering(vec![
            answer("429 Too Many Requests", &[], "Too many requests"),
            answer("410 Gone", &[], ""),
            answer("503 Service Unavailable", &[], ""),
            attested(DOCUMENT),
        ]);
        let started = Instant::now();
        assert_eq!(stand_in.azure().attested_document(NONCE).unwrap(), DOCUMENT.trim());
        assert!(
            started.elapsed() >= Duration::from_millis(10 + 20 + 40),
            "waited between tries"
        );
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 4);
        assert!(requests.iter().all(|r| r == &requests[0]), "the same request each time");
    }

    #[test]
    fn a_stale_document_is_asked_for_again() {
        let stand_in = StandIn::answering(vec![attested(STALE), attested(DOCUMENT)]);
        assert_eq!(stand_in.azure().attested_document(NONCE).unwrap(), DOCUMENT.trim());
        assert_eq!(stand_in.requests().len(), 2);
    }

    #[test]
    fn imds_is_given_up_after_five_tries_saying_why() {
        let too_many = answer("429 Too Many Requests", &[], "");
        let stand_in = StandIn::answering(vec![too_many; 6]);
        let started = Instant::now();
        let message = failed(stand_in.azure().attested_document(NONCE));
        assert!(
            started.elapsed() >= Duration::from_millis(10 + 20 + 40 + 80),
            "{message}"
        );
        assert_eq!(stand_in.requests().len(), 5, "five tries, not six");
        assert!(
            message.starts_with(&format!(
                "the Azure instance metadata service at http://{}/metadata/attested/document?api-version=2021-02-01&nonce={NONCE} gave no usable answer to the request for the attested document in 5 tries over ",
                stand_in.address
            )),
            "{message}"
        );
        assert!(
            message.ends_with("(the last: it answered 429 Too Many Requests); giving up"),
            "{message}"
        );

        let stand_in = StandIn::answering(vec![attested(STALE); 5]);
        let message = failed(stand_in.azure().attested_document(NONCE));
        assert!(
            message
                .ends_with("(the last: it answered a document of nonce \"20260626-005645\", a stale one); giving up"),
            "{message}"
        );
    }

    #[test]
    fn an_answer_that_is_no_attested_document_fails_at_once() {
        for (body, expected) in [
            (ok("<html>"), "the answer is not JSON (line 1, column 1)"),
            (
                ok(r#"{"encoding":"base64","signature":"TUlJ"}"#),
                "the document's encoding is \"base64\", not pkcs7",
            ),
            (ok(r#"{"encoding":"pkcs7"}"#), "the answer has no signature"),
            (
                ok(r#"{"encoding":"pkcs7","signature":"TUlJ"}"#),
                "the attested document does not read: ",
            ),
            (
                answer(
                    "400 Bad Request",
                    &[],
                    "Bad request. Required metadata header not specified",
                ),
                "answered 400 Bad Request to the request for the attested document",
            ),
        ] {
            let stand_in = StandIn::answering(vec![body.clone(), body]);
            let message = failed(stand_in.azure().attested_document(NONCE));
            assert!(message.contains(expected), "{message}");
            assert!(
                message.contains(&format!("http://{}/metadata/attested/document?", stand_in.address)),
                "{message}"
            );
            assert!(
                !message.contains("Required metadata header"),
                "no body quoted: {message}"
            );
            assert_eq!(stand_in.requests().len(), 1, "not asked again: {message}");
        }
    }

    #[test]
    fn an_unreachable_imds_is_device_unavailable_at_once() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut imds = AzureImdsHttp::new(Some(&format!("http://127.0.0.1:{port}"))).unwrap();
        let started = Instant::now();
        match imds.attested_document(NONCE) {
            Err(AttestError::DeviceUnavailable(message)) => assert!(
                message.starts_with(&format!(
                    "the Azure instance metadata service at http://127.0.0.1:{port} is unreachable: "
                )),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(900), "no retry, no wait");
        assert!(matches!(imds.provider_id(), Err(AttestError::DeviceUnavailable(_))));
    }

    #[test]
    fn the_provider_id_is_the_vms_resource_id_as_capz_writes_it() {
        let resource_id =
            format!("/subscriptions/{SUB}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/worker-0");
        let stand_in = StandIn::answering(vec![
            answer("429 Too Many Requests", &[], ""),
            answer("200 OK", &[("Content-Type", "text/plain; charset=utf-8")], &resource_id),
        ]);
        assert_eq!(
            stand_in.azure().provider_id().unwrap(),
            format!(
                "azure:///subscriptions/{SUB}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/worker-0"
            )
        );
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 2);
        assert!(
            requests[1].starts_with(
                "GET /metadata/instance/compute/resourceId?api-version=2021-02-01&format=text HTTP/1.1\r\n"
            ),
            "{}",
            requests[1]
        );
        assert!(requests[1].contains("\r\nMetadata: true\r\n"), "{}", requests[1]);

        let stand_in = StandIn::answering(vec![ok(&format!("/subscriptions/{SUB}/resourceGroups/rg"))]);
        let message = failed(stand_in.azure().provider_id());
        assert!(
            message.contains("/metadata/instance/compute/resourceId?api-version=2021-02-01&format=text: resource ID"),
            "{message}"
        );
    }

    #[test]
    fn capz_provider_ids_lower_case_the_resource_group_as_cloud_provider_azures_function_does() {
        let vm = |rg: &str, name: &str| {
            format!("/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
        };
        for (resource_id, expected) in [
            // The resource group lower-cased, the VM's name as it is.
            (vm("My-RG", "Worker-0"), format!("azure://{}", vm("my-rg", "Worker-0"))),
            (
                vm("capz-rg", "worker-0"),
                format!("azure://{}", vm("capz-rg", "worker-0")),
            ),
            (
                format!(
                    "/subscriptions/{SUB}/resourceGroups/MC_Pool/providers/Microsoft.Compute/virtualMachineScaleSets/Pool-0/virtualMachines/12"
                ),
                format!(
                    "azure:///subscriptions/{SUB}/resourceGroups/mc_pool/providers/Microsoft.Compute/virtualMachineScaleSets/Pool-0/virtualMachines/12"
                ),
            ),
            // Go's strings.Replace(id, rg, lower(rg), 1): the first occurrence of the group's
            // text, which for a group named `G` is in `resourceGroups`. CAPZ writes this.
            (
                vm("G", "vm-0"),
                format!(
                    "azure:///subscriptions/{SUB}/resourcegroups/G/providers/Microsoft.Compute/virtualMachines/vm-0"
                ),
            ),
            // Only the first: the same text later (the VM's name) is left as it is.
            (vm("Prod", "Prod-0"), format!("azure://{}", vm("prod", "Prod-0"))),
        ] {
            assert_eq!(capz_provider_id(&resource_id).unwrap(), expected, "{resource_id}");
        }
        for bad in [
            String::new(),
            "/subscriptions/x".to_owned(),
            // The pattern is case-sensitive: CAPZ fails on this ID too.
            format!("/subscriptions/{SUB}/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/vm"),
            format!("/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/vnet"),
            vm("rg", "vm 0"),
            vm("rg", "vm\u{e9}"),
            vm("rg", &"v".repeat(400)),
        ] {
            assert!(capz_provider_id(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            resource_group_as_capz_finds_it(
                "azure:///subscriptions/s/resourceGroups/a/providers/x/resourceGroups/b/providers/y"
            ),
            Some("b"),
            "greedy, as the regexp: the last resourceGroups that leads to a match"
        );
        assert_eq!(
            resource_group_as_capz_finds_it("/subscriptions/\u{e9}/resourceGroups/\u{e9}\u{e9}/providers/x"),
            Some("\u{e9}\u{e9}"),
            "bytes, not characters: no slice inside one"
        );
    }
}
