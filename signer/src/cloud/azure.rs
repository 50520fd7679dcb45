//! `azure/v1`'s calls to Azure Resource Manager: the `vmId` of the VM a Machine's provider ID
//! names (SPEC section 5), asked with read-only credentials of the signer's own and kept a
//! while ([`ArmAnswers`], the verifier's [`VirtualMachines`]).
//!
//! - The call: `GET {--azure-arm-endpoint}{resource ID}?api-version=2024-07-01` with a bearer
//!   token. 200 names the `vmId`; 404 with ARM's error says the VM does not exist; 401 and 403
//!   say which role the signer's identity lacks; anything else, or no answer, is a gap the CSR
//!   waits out. Answers are kept: a `vmId` for 10 minutes, "no such VM" for a minute, "could not
//!   ask" for 30 seconds, so the CSR's next retry asks again.
//! - The token: the official Azure SDK's credentials (`azure_identity`), chosen from the
//!   environment as its conventions have it ([`CredentialKind`]): workload identity, a client
//!   secret, or the managed identity. The SDK is built without its own HTTP stack: its requests
//!   go through the signer's client ([`SdkTransport`]), so rustls with aws-lc-rs stays the one
//!   TLS and crypto library. The SDK keeps each token until five minutes before it expires.
//!   Tokens and secrets are never logged; the bearer header is zeroized after use and marked
//!   sensitive.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::azure::{AzureVm, VirtualMachines, VmAnswer, vms::vm_id_of};
use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::headers::{HeaderName, HeaderValue, Headers};
use azure_core::http::{AsyncRawResponse, Body, ClientOptions, StatusCode, Transport, Url};
use azure_identity::{
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use http_body_util::Full;
use hyper::body::Bytes;
use zeroize::Zeroizing;

use super::http::{HttpClient, remember, send};
use crate::locks::lock;

/// Azure Resource Manager of the public cloud (`--azure-arm-endpoint`'s default).
pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";
/// The Compute API version of the VM reads.
pub const API_VERSION: &str = "2024-07-01";
/// The actions the signer's identity needs, on the clusters' resource groups.
pub const ROLE_ACTIONS: [&str; 2] = [
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
];
/// How long ARM's `vmId` of a VM is kept.
const FOUND_MEMORY: Duration = Duration::from_secs(600);
/// How long "ARM knows no such VM" is kept.
const MISSING_MEMORY: Duration = Duration::from_secs(60);
/// How long "ARM could not be asked" is the answer before the next retry asks again.
const UNAVAILABLE_MEMORY: Duration = Duration::from_secs(30);
/// Most ARM answers kept.
const MAX_ANSWERS: usize = 10_000;
/// Longest piece of ARM's or Entra ID's error message repeated.
const MESSAGE_CHARS: usize = 300;

/// A flag or the environment does not say how to reach ARM.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArmError {
    /// `--azure-arm-endpoint` is not a URL.
    #[error("--azure-arm-endpoint {0:?} is not a URL: {1}")]
    Unparsable(String, String),
    /// `--azure-arm-endpoint` is plain HTTP to a remote host, or not HTTP at all.
    #[error(
        "--azure-arm-endpoint {0:?} is not https: the signer sends ARM a bearer token (plain http is taken only to a loopback address, for a test)"
    )]
    PlainHttp(String),
    /// `--azure-arm-endpoint` carries more than an endpoint.
    #[error("--azure-arm-endpoint {0:?} has credentials, a query or a fragment: give the endpoint alone")]
    MoreThanEndpoint(String),
}

/// How ARM's credentials are to be had, and why not.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// A flow is named by one variable and lacks another.
    #[error("{set} is set ({flow}), but {missing} is not")]
    Incomplete {
        /// The flow.
        flow: &'static str,
        /// The variable that names it.
        set: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// A client certificate: the Azure SDK's needs OpenSSL, a second crypto library.
    #[error(
        "AZURE_CLIENT_CERTIFICATE_PATH is set, but the signer takes no client certificate (the Azure SDK's certificate credential needs OpenSSL): use workload identity (AZURE_FEDERATED_TOKEN_FILE) or a client secret (AZURE_CLIENT_SECRET)"
    )]
    Certificate,
    /// The SDK refused the settings.
    #[error("{flow}: {message}")]
    Sdk {
        /// The flow.
        flow: &'static str,
        /// Its error, on one line.
        message: String,
    },
}

/// `--azure-arm-endpoint`, checked: where VMs are read, and the audience their tokens are for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmEndpoint {
    base: String,
    scope: String,
}

impl ArmEndpoint {
    /// Reads `text`: an `https://` URL (plain `http://` to a loopback address only), its path
    /// kept as a prefix (a proxy's), nothing else.
    pub fn parse(text: &str) -> Result<Self, ArmError> {
        let url = Url::parse(text).map_err(|e| ArmError::Unparsable(text.to_owned(), e.to_string()))?;
        if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
            return Err(ArmError::MoreThanEndpoint(text.to_owned()));
        }
        let host = url.host_str().unwrap_or_default();
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        match url.scheme() {
            "https" if !host.is_empty() => {}
            "http" if loopback => {}
            _ => return Err(ArmError::PlainHttp(text.to_owned())),
        }
        let origin = url.origin().ascii_serialization();
        Ok(Self {
            base: format!("{origin}{}", url.path().trim_end_matches('/')),
            scope: format!("{origin}/.default"),
        })
    }

    /// The URL of `vm`'s read.
    pub fn url(&self, vm: &AzureVm) -> String {
        format!("{}{}?api-version={API_VERSION}", self.base, vm.resource_id())
    }

    /// The scope its tokens are asked for: ARM's audience, `<origin>/.default`.
    pub fn scope(&self) -> &str {
        &self.scope
    }
}

/// Which of the Azure SDK's credentials the environment names, in this order (the Azure SDK's
/// conventions, and what the Azure workload identity webhook injects):
/// 1. `AZURE_FEDERATED_TOKEN_FILE`: workload identity, a client assertion read from that file,
///    for `AZURE_CLIENT_ID` in `AZURE_TENANT_ID`;
/// 2. `AZURE_CLIENT_SECRET`: that secret, for `AZURE_CLIENT_ID` in `AZURE_TENANT_ID`;
/// 3. otherwise the managed identity of the VM the signer runs on (IMDS, or App Service's
///    `IDENTITY_ENDPOINT`), the user-assigned one `AZURE_CLIENT_ID` names if set.
///
/// `AZURE_AUTHORITY_HOST` names Entra ID's host for the first two (default
/// `https://login.microsoftonline.com`; `https://login.microsoftonline.us`,
/// `https://login.chinacloudapi.cn`).
#[derive(Clone, PartialEq, Eq)]
pub enum CredentialKind {
    /// Workload identity.
    WorkloadIdentity {
        /// `AZURE_CLIENT_ID`.
        client_id: String,
        /// `AZURE_TENANT_ID`.
        tenant_id: String,
        /// `AZURE_FEDERATED_TOKEN_FILE`.
        token_file: PathBuf,
        /// `AZURE_AUTHORITY_HOST`.
        authority_host: Option<String>,
    },
    /// A client secret.
    ClientSecret {
        /// `AZURE_CLIENT_ID`.
        client_id: String,
        /// `AZURE_TENANT_ID`.
        tenant_id: String,
        /// `AZURE_CLIENT_SECRET`.
        secret: Zeroizing<String>,
        /// `AZURE_AUTHORITY_HOST`.
        authority_host: Option<String>,
    },
    /// The managed identity.
    ManagedIdentity {
        /// `AZURE_CLIENT_ID`: a user-assigned identity's client ID.
        client_id: Option<String>,
    },
}

impl std::fmt::Display for CredentialKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WorkloadIdentity {
                client_id,
                tenant_id,
                token_file,
                ..
            } => write!(
                f,
                "workload identity (client {client_id}, tenant {tenant_id}, token file {})",
                token_file.display()
            ),
            Self::ClientSecret {
                client_id, tenant_id, ..
            } => write!(f, "a client secret (client {client_id}, tenant {tenant_id})"),
            Self::ManagedIdentity { client_id: None } => f.write_str("the system-assigned managed identity"),
            Self::ManagedIdentity {
                client_id: Some(client_id),
            } => write!(f, "the user-assigned managed identity {client_id}"),
        }
    }
}

impl std::fmt::Debug for CredentialKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Display names no secret.
        write!(f, "CredentialKind({self})")
    }
}

/// The credential `env` (a variable's value, `None` when unset or empty) names.
pub fn credential_kind(env: &dyn Fn(&str) -> Option<String>) -> Result<CredentialKind, CredentialError> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let required = |flow: &'static str, set: &'static str, missing: &'static str| {
        var(missing).ok_or(CredentialError::Incomplete { flow, set, missing })
    };
    if let Some(token_file) = var("AZURE_FEDERATED_TOKEN_FILE") {
        let flow = "workload identity";
        return Ok(CredentialKind::WorkloadIdentity {
            client_id: required(flow, "AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID")?,
            tenant_id: required(flow, "AZURE_FEDERATED_TOKEN_FILE", "AZURE_TENANT_ID")?,
            token_file: PathBuf::from(token_file),
            authority_host: var("AZURE_AUTHORITY_HOST"),
        });
    }
    if let Some(secret) = var("AZURE_CLIENT_SECRET") {
        let secret = Zeroizing::new(secret);
        let flow = "client secret";
        return Ok(CredentialKind::ClientSecret {
            client_id: required(flow, "AZURE_CLIENT_SECRET", "AZURE_CLIENT_ID")?,
            tenant_id: required(flow, "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID")?,
            secret,
            authority_host: var("AZURE_AUTHORITY_HOST"),
        });
    }
    if var("AZURE_CLIENT_CERTIFICATE_PATH").is_some() {
        return Err(CredentialError::Certificate);
    }
    Ok(CredentialKind::ManagedIdentity {
        client_id: var("AZURE_CLIENT_ID"),
    })
}

/// An error message of ARM, Entra ID or the SDK on one line, at most [`MESSAGE_CHARS`].
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    attestation::identity::truncate(&joined, MESSAGE_CHARS)
}

/// The SDK's options: the signer's transport, and `authority_host` when the environment names
/// one (else the SDK reads `AZURE_AUTHORITY_HOST` itself, and defaults to the public cloud).
fn client_options(transport: &Transport, authority_host: Option<&str>) -> ClientOptions {
    let cloud = authority_host.map(|host| {
        let mut custom = azure_core::cloud::CustomConfiguration::default();
        custom.authority_host = host.to_owned();
        Arc::new(azure_core::cloud::CloudConfiguration::from(custom))
    });
    ClientOptions {
        transport: Some(transport.clone()),
        cloud,
        ..ClientOptions::default()
    }
}

/// The SDK credential `kind` names, sending through `transport`.
pub fn make_credential(
    kind: &CredentialKind,
    transport: &Transport,
) -> Result<Arc<dyn TokenCredential>, CredentialError> {
    let sdk = |flow: &'static str| {
        move |e: azure_core::Error| CredentialError::Sdk {
            flow,
            message: one_line(&e.to_string()),
        }
    };
    Ok(match kind {
        CredentialKind::WorkloadIdentity {
            client_id,
            tenant_id,
            token_file,
            authority_host,
        } => WorkloadIdentityCredential::new(Some(WorkloadIdentityCredentialOptions {
            credential_options: ClientAssertionCredentialOptions {
                client_options: client_options(transport, authority_host.as_deref()),
            },
            client_id: Some(client_id.clone()),
            tenant_id: Some(tenant_id.clone()),
            token_file_path: Some(token_file.clone()),
        }))
        .map_err(sdk("workload identity"))?,
        CredentialKind::ClientSecret {
            client_id,
            tenant_id,
            secret,
            authority_host,
        } => ClientSecretCredential::new(
            tenant_id,
            client_id.clone(),
            Secret::new(secret.as_str().to_owned()),
            Some(ClientSecretCredentialOptions {
                client_options: client_options(transport, authority_host.as_deref()),
            }),
        )
        .map_err(sdk("client secret"))?,
        CredentialKind::ManagedIdentity { client_id } => {
            ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
                user_assigned_id: client_id.clone().map(UserAssignedId::ClientId),
                client_options: client_options(transport, None),
            }))
            .map_err(sdk("managed identity"))?
        }
    })
}

/// The Azure SDK's HTTP transport, over the signer's client: its token requests take the same
/// rustls (aws-lc-rs), roots and `--cloud-ca-bundle` as every other cloud call.
pub struct SdkTransport {
    client: HttpClient,
    timeout: Duration,
}

impl std::fmt::Debug for SdkTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdkTransport")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SdkTransport {
    /// A transport sending through `client`, each exchange within `timeout`.
    pub fn new(client: HttpClient, timeout: Duration) -> Self {
        Self { client, timeout }
    }
}

#[async_trait::async_trait]
impl azure_core::http::HttpClient for SdkTransport {
    async fn execute_request(&self, request: &azure_core::http::Request) -> azure_core::Result<AsyncRawResponse> {
        use azure_core::error::{Error, ErrorKind};
        let url = request.url();
        // For messages: no query (IMDS's names the identity), no credentials.
        let shown = format!("{}{}", url.origin().ascii_serialization(), url.path());
        let body = match request.body() {
            Body::Bytes(bytes) => bytes.clone(),
            Body::SeekableStream(_) => {
                return Err(Error::with_message(
                    ErrorKind::Other,
                    format!("{shown}: a streamed request body, which the signer does not send"),
                ));
            }
        };
        let mut builder = hyper::Request::builder()
            .method(request.method().as_str())
            .uri(url.as_str());
        for (name, value) in request.headers().iter() {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let outgoing = builder
            .body(Full::new(body))
            .map_err(|e| Error::with_message(ErrorKind::Other, format!("{shown}: the request cannot be built: {e}")))?;
        let answer = send(&self.client, outgoing, self.timeout)
            .await
            .map_err(|e| Error::with_message(ErrorKind::Io, format!("{shown}: {e}")))?;
        let mut headers = Headers::new();
        for (name, value) in &answer.headers {
            if let Ok(value) = value.to_str() {
                headers.insert(
                    HeaderName::from(name.as_str().to_owned()),
                    HeaderValue::from(value.to_owned()),
                );
            }
        }
        Ok(AsyncRawResponse::from_bytes(
            StatusCode::from(answer.status),
            headers,
            answer.body,
        ))
    }
}

/// The environment's variables: a variable's value, `None` when unset.
pub type Env = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where ARM's tokens come from: the credential the environment names, made on first need (a
/// signer with no `azure/v1` Cluster never reads the variables nor calls out), or one given.
pub struct Credentials {
    env: Env,
    transport: Transport,
    made: Mutex<Option<Arc<dyn TokenCredential>>>,
}

impl Credentials {
    /// The credential the process's environment names.
    pub fn from_environment(transport: Transport) -> Self {
        Self::from_env(Box::new(|name| std::env::var(name).ok()), transport)
    }

    /// The credential `env` names.
    pub fn from_env(env: Env, transport: Transport) -> Self {
        Self {
            env,
            transport,
            made: Mutex::new(None),
        }
    }

    /// Exactly `credential`.
    #[cfg(test)]
    pub fn given(credential: Arc<dyn TokenCredential>, transport: Transport) -> Self {
        Self {
            env: Box::new(|_| None),
            transport,
            made: Mutex::new(Some(credential)),
        }
    }

    /// The credential, made now if it was not yet. A failure is said and tried again next time
    /// (a token file may appear).
    fn get(&self) -> Result<Arc<dyn TokenCredential>, CredentialError> {
        let mut made = lock(&self.made);
        if let Some(credential) = made.as_ref() {
            return Ok(Arc::clone(credential));
        }
        let kind = credential_kind(&*self.env)?;
        let credential = make_credential(&kind, &self.transport)?;
        tracing::info!(credential = %kind, "azure/v1: reading VMs from Azure Resource Manager with these credentials");
        *made = Some(Arc::clone(&credential));
        Ok(credential)
    }
}

/// ARM's answers, kept per VM ([`VirtualMachines`] for the verifier).
pub struct ArmAnswers {
    answers: Mutex<HashMap<String, (VmAnswer, Instant)>>,
    endpoint: ArmEndpoint,
    credentials: Credentials,
}

fn lifetime(answer: &VmAnswer) -> Duration {
    match answer {
        VmAnswer::Found { .. } => FOUND_MEMORY,
        VmAnswer::Missing => MISSING_MEMORY,
        VmAnswer::Unavailable(_) | VmAnswer::NotAsked => UNAVAILABLE_MEMORY,
    }
}

/// ARM's error, `{"error": {"code", "message"}}`.
fn arm_error(body: &[u8]) -> Option<(String, String)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    let code = error.get("code")?.as_str()?.to_owned();
    let message = error.get("message").and_then(serde_json::Value::as_str).unwrap_or("");
    Some((code, one_line(message)))
}

/// What ARM's answer (`status`, `body`) to the read of `vm` says.
fn judge_answer(vm: &AzureVm, status: u16, body: &[u8]) -> VmAnswer {
    let said = || match arm_error(body) {
        Some((code, message)) if message.is_empty() => code,
        Some((code, message)) => format!("{code}: {message}"),
        None => one_line(&String::from_utf8_lossy(body)),
    };
    match status {
        200 => match vm_id_of(body) {
            Ok(vm_id) => VmAnswer::Found { vm_id },
            Err(e) => VmAnswer::Unavailable(format!("ARM answered 200, but {e}")),
        },
        // ARM's own 404 (ResourceNotFound, ResourceGroupNotFound, ...): no such VM. A 404 that
        // is not ARM's (a proxy's, a wrong endpoint's) proves nothing.
        404 if arm_error(body).is_some() => VmAnswer::Missing,
        404 => VmAnswer::Unavailable(format!(
            "answered 404 without ARM's error ({}): is --azure-arm-endpoint Azure Resource Manager?",
            said()
        )),
        401 | 403 => VmAnswer::Unavailable(format!(
            "ARM refused the signer's identity ({status}, {}): grant it {} and {} on resource group {} (config/components/azure-workload-identity/README.md)",
            said(),
            ROLE_ACTIONS[0],
            ROLE_ACTIONS[1],
            vm.resource_group
        )),
        status => VmAnswer::Unavailable(format!("ARM answered {status}: {}", said())),
    }
}

impl ArmAnswers {
    /// Answers read from `endpoint` with `credentials`.
    pub fn new(endpoint: ArmEndpoint, credentials: Credentials) -> Self {
        Self {
            answers: Mutex::default(),
            endpoint,
            credentials,
        }
    }

    /// Reads `vm` from ARM through `client` (the token and the read each within `timeout`) and
    /// keeps the answer.
    pub async fn ask(&self, client: &HttpClient, vm: &AzureVm, timeout: Duration) {
        let answer = match self.read(client, vm, timeout).await {
            Ok(answer) | Err(answer) => answer,
        };
        match &answer {
            VmAnswer::Found { vm_id } => tracing::info!(%vm, %vm_id, "Azure Resource Manager named the VM's vmId"),
            VmAnswer::Missing => tracing::info!(%vm, "Azure Resource Manager knows no such VM"),
            VmAnswer::Unavailable(why) => {
                tracing::warn!(%vm, %why, "Azure Resource Manager could not be asked")
            }
            VmAnswer::NotAsked => {}
        }
        remember(&mut lock(&self.answers), vm.cache_key(), answer, MAX_ANSWERS, lifetime);
    }

    async fn read(&self, client: &HttpClient, vm: &AzureVm, timeout: Duration) -> Result<VmAnswer, VmAnswer> {
        let unavailable = |why: String| VmAnswer::Unavailable(why);
        let credential = self
            .credentials
            .get()
            .map_err(|e| unavailable(format!("no credentials for Azure Resource Manager: {e}")))?;
        let token = tokio::time::timeout(timeout, credential.get_token(&[self.endpoint.scope()], None))
            .await
            .map_err(|_| {
                unavailable(format!(
                    "no token for Azure Resource Manager within {}s",
                    timeout.as_secs()
                ))
            })?
            .map_err(|e| {
                unavailable(format!(
                    "no token for Azure Resource Manager: {}",
                    one_line(&e.to_string())
                ))
            })?;
        let bearer = Zeroizing::new(format!("Bearer {}", token.token.secret()));
        drop(token);
        let mut authorization = hyper::header::HeaderValue::from_str(&bearer)
            .map_err(|_| unavailable("the token is not a header value".into()))?;
        authorization.set_sensitive(true);
        let request = hyper::Request::get(self.endpoint.url(vm))
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::AUTHORIZATION, authorization)
            .body(Full::new(Bytes::new()))
            .map_err(|e| unavailable(format!("the request cannot be built: {e}")))?;
        let answer = send(client, request, timeout)
            .await
            .map_err(|e| unavailable(format!("Azure Resource Manager: {e}")))?;
        Ok(judge_answer(vm, answer.status, &answer.body))
    }
}

impl VirtualMachines for ArmAnswers {
    fn answer(&self, vm: &AzureVm) -> VmAnswer {
        let answers = lock(&self.answers);
        match answers.get(&vm.cache_key()) {
            Some((answer, at)) if at.elapsed() < lifetime(answer) => answer.clone(),
            _ => VmAnswer::NotAsked,
        }
    }

    fn asked_at(&self, vm: &AzureVm) -> Option<time::OffsetDateTime> {
        let answers = lock(&self.answers);
        let (_, at) = answers.get(&vm.cache_key())?;
        let age = time::Duration::try_from(at.elapsed()).ok()?;
        Some(time::OffsetDateTime::now_utc() - age)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;

    use azure_core::credentials::{AccessToken, TokenRequestOptions};
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;

    use super::*;
    use crate::cloud::http::http_client;

    const SUB: &str = "8a205152-b25a-417f-a676-80465535a6c9";
    const VM_ID: &str = "b1310a36-d400-46f6-82cb-6217df846586";
    const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    const CLIENT: &str = "0d5a4a4c-0000-4000-8000-00000000c11e";
    const ARM_SCOPE: &str = "https://management.azure.com/.default";

    fn vm(name: &str) -> AzureVm {
        AzureVm::parse(&format!(
            "azure:///subscriptions/{SUB}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/{name}"
        ))
        .unwrap()
    }

    fn arm_vm_json(vm: &AzureVm, vm_id: &str) -> String {
        serde_json::json!({
            "name": "worker-0", "id": vm.resource_id(), "location": "eastus",
            "properties": {"vmId": vm_id, "provisioningState": "Succeeded"}
        })
        .to_string()
    }

    fn arm_error_json(code: &str, message: &str) -> String {
        serde_json::json!({"error": {"code": code, "message": message}}).to_string()
    }

    /// One request as the stand-in saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        path: String,
        query: HashMap<String, String>,
        headers: HashMap<String, String>,
        body: String,
    }

    /// `application/x-www-form-urlencoded` (a body or a query) as a map.
    fn form(text: &str) -> HashMap<String, String> {
        fn decode(text: &str) -> String {
            let bytes = text.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                match bytes[i] {
                    b'+' => out.push(b' '),
                    b'%' if i + 2 < bytes.len() => {
                        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                        out.push(u8::from_str_radix(hex, 16).unwrap());
                        i += 2;
                    }
                    b => out.push(b),
                }
                i += 1;
            }
            String::from_utf8(out).unwrap()
        }
        text.split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                (decode(name), decode(value))
            })
            .collect()
    }

    /// A loopback HTTP/1 server answering each request with `answer(request)`: a status and a
    /// body, or (status 0) no answer at all for a while.
    struct StandIn {
        address: SocketAddr,
        seen: Arc<Mutex<Vec<Seen>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for StandIn {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl StandIn {
        async fn start(answer: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let answer = Arc::new(answer);
            let log = Arc::clone(&seen);
            let task = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (answer, log) = (Arc::clone(&answer), Arc::clone(&log));
                    tokio::spawn(async move {
                        let service =
                            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                                let (answer, log) = (Arc::clone(&answer), Arc::clone(&log));
                                async move {
                                    let (parts, body) = request.into_parts();
                                    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                                    let seen = Seen {
                                        method: parts.method.to_string(),
                                        path: parts.uri.path().to_owned(),
                                        query: form(parts.uri.query().unwrap_or_default()),
                                        headers: parts
                                            .headers
                                            .iter()
                                            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                                            .collect(),
                                        body: String::from_utf8_lossy(&body).into_owned(),
                                    };
                                    lock(&log).push(seen.clone());
                                    let (status, text) = answer(&seen);
                                    if status == 0 {
                                        tokio::time::sleep(Duration::from_secs(30)).await;
                                    }
                                    let mut response = hyper::Response::new(Full::new(Bytes::from(text)));
                                    *response.status_mut() = hyper::StatusCode::from_u16(status.max(200)).unwrap();
                                    response.headers_mut().insert(
                                        hyper::header::CONTENT_TYPE,
                                        hyper::header::HeaderValue::from_static("application/json"),
                                    );
                                    Ok::<_, Infallible>(response)
                                }
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
            Self { address, seen, task }
        }

        fn url(&self) -> String {
            format!("http://{}", self.address)
        }

        fn seen(&self) -> Vec<Seen> {
            lock(&self.seen).clone()
        }
    }

    fn client() -> HttpClient {
        http_client(None, Duration::from_secs(5)).unwrap()
    }

    /// The SDK's requests, sent to `to` instead of the host they name (Entra ID's, IMDS's):
    /// the stand-in sees the path, query, headers and body the SDK built.
    #[derive(Debug)]
    struct Redirect {
        to: String,
        inner: SdkTransport,
        hosts: Arc<Mutex<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl azure_core::http::HttpClient for Redirect {
        async fn execute_request(&self, request: &azure_core::http::Request) -> azure_core::Result<AsyncRawResponse> {
            let mut redirected = request.clone();
            lock(&self.hosts).push(request.url().origin().ascii_serialization());
            *redirected.url_mut() = Url::parse(&format!("{}{}", self.to, request.path_and_query())).unwrap();
            self.inner.execute_request(&redirected).await
        }
    }

    fn redirect(to: &StandIn) -> (Transport, Arc<Mutex<Vec<String>>>) {
        let hosts = Arc::new(Mutex::new(Vec::new()));
        let transport = Transport::new(Arc::new(Redirect {
            to: to.url(),
            inner: SdkTransport::new(client(), Duration::from_secs(5)),
            hosts: Arc::clone(&hosts),
        }));
        (transport, hosts)
    }

    fn env(vars: &[(&str, &str)]) -> Env {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Box::new(move |name| vars.get(name).cloned())
    }

    fn entra_token(token: &str) -> String {
        serde_json::json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token})
            .to_string()
    }

    async fn token_of(credential: &Arc<dyn TokenCredential>) -> String {
        credential
            .get_token(&[ARM_SCOPE], None::<TokenRequestOptions<'_>>)
            .await
            .unwrap()
            .token
            .secret()
            .to_owned()
    }

    /// A credential that hands out a fixed token.
    #[derive(Debug)]
    struct Fixed(&'static str);

    #[async_trait::async_trait]
    impl TokenCredential for Fixed {
        async fn get_token(
            &self,
            scopes: &[&str],
            _options: Option<TokenRequestOptions<'_>>,
        ) -> azure_core::Result<AccessToken> {
            assert_eq!(scopes.len(), 1);
            Ok(AccessToken::new(
                Secret::new(self.0),
                time::OffsetDateTime::now_utc() + time::Duration::hours(1),
            ))
        }
    }

    fn answers_at(arm: &StandIn, token: &'static str) -> ArmAnswers {
        let (transport, _) = redirect(arm);
        ArmAnswers::new(
            ArmEndpoint::parse(&arm.url()).unwrap(),
            Credentials::given(Arc::new(Fixed(token)), transport),
        )
    }

    #[test]
    fn the_arm_endpoint_is_https_or_loopback_and_names_the_scope() {
        let public = ArmEndpoint::parse("https://management.azure.com/").unwrap();
        assert_eq!(public.scope(), ARM_SCOPE);
        let worker = vm("worker-0");
        assert_eq!(
            public.url(&worker),
            format!(
                "https://management.azure.com/subscriptions/{SUB}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/worker-0?api-version=2024-07-01"
            )
        );
        let gov = ArmEndpoint::parse("https://management.usgovcloudapi.net").unwrap();
        assert_eq!(gov.scope(), "https://management.usgovcloudapi.net/.default");
        let proxied = ArmEndpoint::parse("https://proxy.example:8443/arm/").unwrap();
        assert_eq!(proxied.scope(), "https://proxy.example:8443/.default");
        assert!(
            proxied
                .url(&worker)
                .starts_with("https://proxy.example:8443/arm/subscriptions/")
        );
        for loopback in ["http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:2"] {
            assert!(ArmEndpoint::parse(loopback).is_ok(), "{loopback}");
        }
        assert!(matches!(
            ArmEndpoint::parse("http://management.azure.com"),
            Err(ArmError::PlainHttp(_))
        ));
        assert!(matches!(ArmEndpoint::parse("ftp://x"), Err(ArmError::PlainHttp(_))));
        assert!(matches!(
            ArmEndpoint::parse("management.azure.com"),
            Err(ArmError::Unparsable(..))
        ));
        for extra in [
            "https://user:pw@management.azure.com",
            "https://management.azure.com/?x=1",
            "https://management.azure.com/#f",
        ] {
            assert!(
                matches!(ArmEndpoint::parse(extra), Err(ArmError::MoreThanEndpoint(_))),
                "{extra}"
            );
        }
    }

    #[test]
    fn the_environment_names_workload_identity_then_a_secret_then_the_managed_identity() {
        let all = [
            ("AZURE_CLIENT_ID", CLIENT),
            ("AZURE_TENANT_ID", TENANT),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                "/var/run/secrets/azure/tokens/azure-identity-token",
            ),
            ("AZURE_CLIENT_SECRET", "s3cr3t-value"),
            ("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us/"),
        ];
        let kind = credential_kind(&env(&all)).unwrap();
        assert!(
            matches!(&kind, CredentialKind::WorkloadIdentity { authority_host: Some(h), .. } if h == "https://login.microsoftonline.us/"),
            "{kind}"
        );
        let kind = credential_kind(&env(&all[..2].iter().chain(&all[3..4]).copied().collect::<Vec<_>>())).unwrap();
        assert!(matches!(&kind, CredentialKind::ClientSecret { secret, .. } if secret.as_str() == "s3cr3t-value"));
        let shown = format!("{kind} {kind:?}");
        assert!(!shown.contains("s3cr3t"), "a secret is never shown: {shown}");
        assert_eq!(
            credential_kind(&env(&[("AZURE_CLIENT_ID", CLIENT)])).unwrap(),
            CredentialKind::ManagedIdentity {
                client_id: Some(CLIENT.into())
            }
        );
        assert_eq!(
            credential_kind(&env(&[("AZURE_CLIENT_ID", " ")])).unwrap(),
            CredentialKind::ManagedIdentity { client_id: None },
            "an empty variable is an unset one"
        );
        assert_eq!(
            credential_kind(&env(&[
                ("AZURE_FEDERATED_TOKEN_FILE", "/t"),
                ("AZURE_CLIENT_ID", CLIENT)
            ]))
            .unwrap_err(),
            CredentialError::Incomplete {
                flow: "workload identity",
                set: "AZURE_FEDERATED_TOKEN_FILE",
                missing: "AZURE_TENANT_ID"
            }
        );
        assert!(matches!(
            credential_kind(&env(&[("AZURE_CLIENT_SECRET", "x"), ("AZURE_TENANT_ID", TENANT)])),
            Err(CredentialError::Incomplete {
                missing: "AZURE_CLIENT_ID",
                ..
            })
        ));
        assert_eq!(
            credential_kind(&env(&[("AZURE_CLIENT_CERTIFICATE_PATH", "/c.pem")])).unwrap_err(),
            CredentialError::Certificate
        );
    }

    #[test]
    fn arms_answers_are_judged() {
        let worker = vm("worker-0");
        assert_eq!(
            judge_answer(&worker, 200, arm_vm_json(&worker, &VM_ID.to_uppercase()).as_bytes()),
            VmAnswer::Found { vm_id: VM_ID.into() }
        );
        assert!(matches!(
            judge_answer(&worker, 200, b"{\"properties\":{}}"),
            VmAnswer::Unavailable(why) if why.contains("no properties.vmId")
        ));
        for code in ["ResourceNotFound", "ResourceGroupNotFound", "NotFound"] {
            assert_eq!(
                judge_answer(&worker, 404, arm_error_json(code, "not found").as_bytes()),
                VmAnswer::Missing
            );
        }
        assert!(matches!(
            judge_answer(&worker, 404, b"<html>404 page not found</html>"),
            VmAnswer::Unavailable(why) if why.contains("without ARM's error")
        ));
        for status in [401, 403] {
            let answer = judge_answer(
                &worker,
                status,
                arm_error_json(
                    "AuthorizationFailed",
                    "The client 'x' with object id 'y' does not have authorization to perform action\n'Microsoft.Compute/virtualMachines/read'",
                )
                .as_bytes(),
            );
            let VmAnswer::Unavailable(why) = answer else {
                panic!("{answer:?}")
            };
            assert!(why.contains("AuthorizationFailed"), "{why}");
            assert!(why.contains(ROLE_ACTIONS[0]) && why.contains(ROLE_ACTIONS[1]), "{why}");
            assert!(why.contains("capz-rg") && !why.contains('\n'), "{why}");
        }
        assert!(matches!(
            judge_answer(&worker, 500, arm_error_json("InternalServerError", "oops").as_bytes()),
            VmAnswer::Unavailable(why) if why == "ARM answered 500: InternalServerError: oops"
        ));
        let long = "x".repeat(4000);
        let VmAnswer::Unavailable(why) = judge_answer(&worker, 429, long.as_bytes()) else {
            panic!()
        };
        assert!(why.len() < 400, "ARM's message is cut: {}", why.len());
    }

    #[test]
    fn answers_are_kept_found_longest_and_unavailable_shortest() {
        assert_eq!(lifetime(&VmAnswer::Found { vm_id: VM_ID.into() }), FOUND_MEMORY);
        assert_eq!(lifetime(&VmAnswer::Missing), MISSING_MEMORY);
        assert_eq!(lifetime(&VmAnswer::Unavailable("x".into())), UNAVAILABLE_MEMORY);
        assert!(UNAVAILABLE_MEMORY < MISSING_MEMORY && MISSING_MEMORY < FOUND_MEMORY);

        let answers = ArmAnswers::new(
            ArmEndpoint::parse(DEFAULT_ARM_ENDPOINT).unwrap(),
            Credentials::given(
                Arc::new(Fixed("t")),
                Transport::new(Arc::new(SdkTransport::new(client(), Duration::from_secs(1)))),
            ),
        );
        let (found, missing, gap) = (vm("a"), vm("b"), vm("c"));
        assert_eq!(answers.answer(&found), VmAnswer::NotAsked);
        let ago = |seconds: u64| Instant::now().checked_sub(Duration::from_secs(seconds)).unwrap();
        {
            let mut map = lock(&answers.answers);
            map.insert(found.cache_key(), (VmAnswer::Found { vm_id: VM_ID.into() }, ago(599)));
            map.insert(missing.cache_key(), (VmAnswer::Missing, ago(59)));
            map.insert(gap.cache_key(), (VmAnswer::Unavailable("x".into()), ago(29)));
        }
        assert_eq!(answers.answer(&found), VmAnswer::Found { vm_id: VM_ID.into() });
        assert_eq!(answers.answer(&missing), VmAnswer::Missing);
        assert!(matches!(answers.answer(&gap), VmAnswer::Unavailable(_)));
        // The same VM whatever the case of its resource group.
        let upper = AzureVm::parse(&format!(
            "azure:///subscriptions/{SUB}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/a"
        ))
        .unwrap();
        assert_eq!(answers.answer(&upper), VmAnswer::Found { vm_id: VM_ID.into() });
        {
            let mut map = lock(&answers.answers);
            map.insert(found.cache_key(), (VmAnswer::Found { vm_id: VM_ID.into() }, ago(601)));
            map.insert(missing.cache_key(), (VmAnswer::Missing, ago(61)));
            map.insert(gap.cache_key(), (VmAnswer::Unavailable("x".into()), ago(31)));
        }
        for vm in [&found, &missing, &gap] {
            assert_eq!(answers.answer(vm), VmAnswer::NotAsked, "{vm}: expired, asked again");
        }
    }

    #[test]
    fn a_full_answer_map_forgets_expired_answers_then_the_oldest() {
        let mut map: HashMap<String, (VmAnswer, Instant)> = HashMap::new();
        let old = Instant::now().checked_sub(Duration::from_secs(120)).unwrap();
        map.insert("missing-long-ago".into(), (VmAnswer::Missing, old));
        map.insert("found-long-ago".into(), (VmAnswer::Found { vm_id: VM_ID.into() }, old));
        remember(&mut map, "new".to_owned(), VmAnswer::Missing, 2, lifetime);
        assert!(!map.contains_key("missing-long-ago"), "expired: forgotten first");
        assert!(
            map.contains_key("found-long-ago"),
            "a vmId is still good after two minutes"
        );
        remember(&mut map, "newest".to_owned(), VmAnswer::Missing, 2, lifetime);
        assert_eq!(map.len(), 2);
        assert!(!map.contains_key("found-long-ago"), "then the oldest");
        assert!(map.contains_key("newest"), "the newest is always kept");
    }

    #[tokio::test]
    async fn arm_is_asked_for_the_vm_with_the_bearer_token_and_api_version() {
        let worker = vm("worker-0");
        let json = arm_vm_json(&worker, VM_ID);
        let arm = StandIn::start(move |_| (200, json.clone())).await;
        let answers = answers_at(&arm, "arm-token-1");
        answers.ask(&client(), &worker, Duration::from_secs(5)).await;
        assert_eq!(answers.answer(&worker), VmAnswer::Found { vm_id: VM_ID.into() });
        let seen = arm.seen();
        assert_eq!(seen.len(), 1);
        let request = &seen[0];
        assert_eq!(request.method, "GET");
        assert_eq!(request.path, worker.resource_id());
        assert_eq!(request.query.get("api-version").map(String::as_str), Some(API_VERSION));
        assert_eq!(
            request.headers.get("authorization").map(String::as_str),
            Some("Bearer arm-token-1")
        );
        assert_eq!(
            request.headers.get("accept").map(String::as_str),
            Some("application/json")
        );
    }

    #[tokio::test]
    async fn arms_statuses_become_missing_or_a_gap_and_silence_a_timeout() {
        let worker = vm("worker-0");
        type Expected = fn(&VmAnswer) -> bool;
        let cases: [(u16, String, Expected); 4] = [
            (
                404,
                arm_error_json("ResourceNotFound", "The Resource ... was not found."),
                |a| *a == VmAnswer::Missing,
            ),
            (
                403,
                arm_error_json("AuthorizationFailed", "no"),
                |a| matches!(a, VmAnswer::Unavailable(why) if why.contains("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read")),
            ),
            (
                500,
                arm_error_json("InternalServerError", "try later"),
                |a| matches!(a, VmAnswer::Unavailable(why) if why.contains("500") && why.contains("try later")),
            ),
            (
                0,
                String::new(),
                |a| matches!(a, VmAnswer::Unavailable(why) if why.contains("no answer within")),
            ),
        ];
        for (status, body, expected) in cases {
            let arm = StandIn::start(move |_| (status, body.clone())).await;
            let answers = answers_at(&arm, "t");
            answers.ask(&client(), &worker, Duration::from_millis(500)).await;
            let answer = answers.answer(&worker);
            assert!(expected(&answer), "{status}: {answer:?}");
        }
    }

    #[tokio::test]
    async fn workload_identity_sends_the_federated_token_as_the_client_assertion() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("azure-identity-token");
        std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.federated.sig").unwrap();
        let entra = StandIn::start(|_| (200, entra_token("wi-token"))).await;
        let (transport, hosts) = redirect(&entra);
        let kind = credential_kind(&env(&[
            ("AZURE_CLIENT_ID", CLIENT),
            ("AZURE_TENANT_ID", TENANT),
            ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us"),
        ]))
        .unwrap();
        let credential = make_credential(&kind, &transport).unwrap();
        assert_eq!(token_of(&credential).await, "wi-token");
        assert_eq!(
            token_of(&credential).await,
            "wi-token",
            "kept until it nears its expiry"
        );
        let seen = entra.seen();
        assert_eq!(seen.len(), 1, "one token request: {seen:#?}");
        assert_eq!(lock(&hosts).as_slice(), ["https://login.microsoftonline.us"]);
        assert_eq!(seen[0].method, "POST");
        assert_eq!(seen[0].path, format!("/{TENANT}/oauth2/v2.0/token"));
        let fields = form(&seen[0].body);
        assert_eq!(fields["grant_type"], "client_credentials");
        assert_eq!(fields["client_id"], CLIENT);
        assert_eq!(
            fields["client_assertion_type"],
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
        );
        assert_eq!(fields["client_assertion"], "eyJhbGciOiJSUzI1NiJ9.federated.sig");
        assert_eq!(fields["scope"], ARM_SCOPE);
        assert!(!fields.contains_key("client_secret"));
    }

    #[tokio::test]
    async fn a_client_secret_is_sent_to_entra_and_never_said() {
        let entra = StandIn::start(|seen| {
            if form(&seen.body).get("client_secret").map(String::as_str) == Some("s3cr3t-value") {
                (200, entra_token("secret-token"))
            } else {
                (
                    401,
                    serde_json::json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided.", "error_codes": [7000215]}).to_string(),
                )
            }
        })
        .await;
        let (transport, hosts) = redirect(&entra);
        let kind = credential_kind(&env(&[
            ("AZURE_CLIENT_ID", CLIENT),
            ("AZURE_TENANT_ID", TENANT),
            ("AZURE_CLIENT_SECRET", "s3cr3t-value"),
        ]))
        .unwrap();
        let credential = make_credential(&kind, &transport).unwrap();
        assert_eq!(token_of(&credential).await, "secret-token");
        assert_eq!(lock(&hosts).as_slice(), ["https://login.microsoftonline.com"]);
        let seen = entra.seen();
        assert_eq!(seen[0].path, format!("/{TENANT}/oauth2/v2.0/token"));
        let fields = form(&seen[0].body);
        assert_eq!(fields["grant_type"], "client_credentials");
        assert_eq!(fields["client_id"], CLIENT);
        assert_eq!(fields["client_secret"], "s3cr3t-value");
        assert_eq!(fields["scope"], ARM_SCOPE);
        assert!(!fields.contains_key("client_assertion"));

        // A wrong secret: the CSR waits, and the message names Entra's error, not the secret.
        let worker = vm("worker-0");
        let arm = StandIn::start(|_| (500, String::new())).await;
        let answers = ArmAnswers::new(
            ArmEndpoint::parse(&arm.url()).unwrap(),
            Credentials::from_env(
                env(&[
                    ("AZURE_CLIENT_ID", CLIENT),
                    ("AZURE_TENANT_ID", TENANT),
                    ("AZURE_CLIENT_SECRET", "wrong-s3cr3t"),
                ]),
                redirect(&entra).0,
            ),
        );
        answers.ask(&client(), &worker, Duration::from_secs(5)).await;
        let VmAnswer::Unavailable(why) = answers.answer(&worker) else {
            panic!("{:?}", answers.answer(&worker))
        };
        assert!(why.contains("AADSTS7000215"), "{why}");
        assert!(!why.contains("s3cr3t"), "{why}");
        assert!(arm.seen().is_empty(), "no token, no read");
    }

    #[tokio::test]
    async fn the_managed_identity_asks_imds_for_arms_resource() {
        let expires = (time::OffsetDateTime::now_utc() + time::Duration::hours(1)).unix_timestamp();
        let imds = StandIn::start(move |_| {
            (
                200,
                serde_json::json!({"access_token": "mi-token", "expires_on": expires.to_string(), "token_type": "Bearer", "resource": "https://management.azure.com"}).to_string(),
            )
        })
        .await;
        for (vars, client_id) in [(vec![], None), (vec![("AZURE_CLIENT_ID", CLIENT)], Some(CLIENT))] {
            let (transport, hosts) = redirect(&imds);
            let kind = credential_kind(&env(&vars)).unwrap();
            let credential = make_credential(&kind, &transport).unwrap();
            assert_eq!(token_of(&credential).await, "mi-token");
            assert_eq!(lock(&hosts).as_slice(), ["http://169.254.169.254"]);
            let seen = imds.seen().pop().unwrap();
            assert_eq!(seen.method, "GET");
            assert_eq!(seen.path, "/metadata/identity/oauth2/token");
            assert_eq!(seen.headers.get("metadata").map(String::as_str), Some("true"));
            assert_eq!(seen.query["resource"], "https://management.azure.com");
            assert!(seen.query.contains_key("api-version"));
            assert_eq!(seen.query.get("client_id").map(String::as_str), client_id);
        }
    }

    #[tokio::test]
    async fn arm_is_read_with_the_token_the_environments_credential_got() {
        let worker = vm("worker-0");
        let json = arm_vm_json(&worker, VM_ID);
        // One stand-in plays Entra ID (the token, through the SDK's transport) and ARM.
        let both = StandIn::start(move |seen| {
            if seen.path.ends_with("/oauth2/v2.0/token") {
                (200, entra_token("env-token"))
            } else if seen.headers.get("authorization").map(String::as_str) == Some("Bearer env-token") {
                (200, json.clone())
            } else {
                (401, arm_error_json("InvalidAuthenticationToken", "bad token"))
            }
        })
        .await;
        let answers = ArmAnswers::new(
            ArmEndpoint::parse(&both.url()).unwrap(),
            Credentials::from_env(
                env(&[
                    ("AZURE_CLIENT_ID", CLIENT),
                    ("AZURE_TENANT_ID", TENANT),
                    ("AZURE_CLIENT_SECRET", "s3cr3t-value"),
                ]),
                redirect(&both).0,
            ),
        );
        answers.ask(&client(), &worker, Duration::from_secs(5)).await;
        assert_eq!(answers.answer(&worker), VmAnswer::Found { vm_id: VM_ID.into() });
        let other = vm("worker-1");
        answers.ask(&client(), &other, Duration::from_secs(5)).await;
        let token_requests = both.seen().iter().filter(|s| s.method == "POST").count();
        assert_eq!(token_requests, 1, "the token is kept between reads");
        let scope = form(&both.seen()[0].body)["scope"].clone();
        assert_eq!(scope, format!("{}/.default", both.url()));
    }

    #[tokio::test]
    async fn without_usable_credentials_arm_is_not_asked_and_the_csr_waits() {
        let worker = vm("worker-0");
        let arm = StandIn::start(|_| (200, String::new())).await;
        let answers = ArmAnswers::new(
            ArmEndpoint::parse(&arm.url()).unwrap(),
            Credentials::from_env(
                env(&[
                    ("AZURE_FEDERATED_TOKEN_FILE", "/nonexistent/token"),
                    ("AZURE_CLIENT_ID", CLIENT),
                    ("AZURE_TENANT_ID", TENANT),
                ]),
                redirect(&arm).0,
            ),
        );
        answers.ask(&client(), &worker, Duration::from_secs(5)).await;
        let VmAnswer::Unavailable(why) = answers.answer(&worker) else {
            panic!()
        };
        assert!(
            why.starts_with("no credentials for Azure Resource Manager: workload identity:"),
            "{why}"
        );
        assert!(why.contains("/nonexistent/token"), "{why}");
        assert!(arm.seen().is_empty());
    }
}
