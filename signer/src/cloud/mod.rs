//! The signer's side of the cloud identity providers' I/O: Google's keys, STS's answers and
//! Azure Resource Manager's.
//!
//! The verifiers are pure: they look keys and answers up through
//! [`attestation::gcp::GoogleKeys`], [`attestation::aws::CallerIdentity`] and
//! [`attestation::azure::VirtualMachines`], implemented here over caches, and say which
//! [`CloudCall`] they need when a cache cannot answer. The controller (and `check`) makes those
//! calls through [`Cloud::make`] and decides again. All of them go through one client
//! ([`http`]).
//!
//! - Google's keys: fetched from `--gcp-jwks-url` on first need, refreshed when their
//!   `Cache-Control` lifetime ends and when a token names a key the set lacks (at most once a
//!   minute; a failed fetch is tried again after 10 s), or read from `--gcp-jwks-file` (re-read
//!   when it changes), for air-gapped management clusters.
//! - STS: each call is the node's signed request replayed to the signer's own endpoint for
//!   the document's region, never to a URL the requester names. Answers are kept for
//!   `--cloud-attestation-max-age` (a CSR decided twice asks once); "could not ask" only for a
//!   few seconds, so the CSR's next retry asks again. Headers are never logged: they carry a
//!   session token and a signature.
//! - Azure Resource Manager: the `vmId` of the VM a provider ID names, read with the signer's
//!   own read-only Azure credentials ([`azure`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use attestation::aws::{CallerIdentity, RegionCertificates, StsAnswer, StsCall, StsEndpoints};
use attestation::cloud::CloudCall;
use attestation::gcp::{GoogleKeys, Jwks, KeyLookup};
use http_body_util::Full;
use hyper::body::Bytes;
use time::OffsetDateTime;

use crate::locks::{lock, read, write};
use http::{HttpClient, http_client, send};

pub mod azure;
pub mod http;
pub mod proxy;

/// Least time between two fetches of Google's keys after a success.
const KEYS_MIN_INTERVAL: Duration = Duration::from_secs(60);
/// Least time between two fetches after a failure.
const KEYS_RETRY_INTERVAL: Duration = Duration::from_secs(10);
/// Keys whose answer names no lifetime are refreshed after this.
const KEYS_DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// How long "STS could not be asked" is the answer before the next retry asks again.
const STS_UNAVAILABLE_MEMORY: Duration = Duration::from_secs(5);
/// Most STS answers kept.
const STS_MAX_ANSWERS: usize = 10_000;

/// The cloud flags, the same for `run` and `check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudArgs {
    /// `gcp/v1`: where Google's identity-token signing keys (JWKS) are fetched from.
    #[arg(long, env = "SIGNER_GCP_JWKS_URL", default_value = attestation::gcp::GOOGLE_JWKS_URL)]
    pub gcp_jwks_url: String,
    /// `gcp/v1`: a JWKS file the operator keeps current instead (air-gapped management
    /// clusters); re-read when it changes. Overrides `--gcp-jwks-url`.
    #[arg(long, env = "SIGNER_GCP_JWKS_FILE")]
    pub gcp_jwks_file: Option<PathBuf>,
    /// `aws/v1`: PEM file of AWS's RSA-2048 identity-document certificates, each after a
    /// `# regions: a, b` line; default: the set shipped with the signer.
    #[arg(long, env = "SIGNER_AWS_IID_CERTIFICATES")]
    pub aws_iid_certificates: Option<PathBuf>,
    /// `aws/v1`: the STS endpoint requests are replayed to, `{region}` replaced by the
    /// document's region; default: `https://sts.{region}.amazonaws.com` (`.com.cn` in China,
    /// `.amazonaws.eu` in the European Sovereign Cloud).
    #[arg(long, env = "SIGNER_AWS_STS_ENDPOINT")]
    pub aws_sts_endpoint: Option<String>,
    /// How old a cloud statement (a GCE token's `iat`, an STS request's `x-amz-date`) may be.
    #[arg(long, env = "SIGNER_CLOUD_ATTESTATION_MAX_AGE", default_value = "10m", value_parser = humantime::parse_duration)]
    pub cloud_attestation_max_age: Duration,
    /// PEM certificates trusted for the cloud endpoints besides the public roots compiled in
    /// (an egress proxy's CA, a private STS or ARM endpoint).
    #[arg(long, env = "SIGNER_CLOUD_CA_BUNDLE")]
    pub cloud_ca_bundle: Option<PathBuf>,
    /// `azure/v1`: the Microsoft and DigiCert CA certificates an attested document's leaf must
    /// chain to (a PEM file, or a folder of `*.pem` files such as
    /// config/components/azure-ca-bundle's); replaces the bundle built into the signer.
    #[arg(long, env = "SIGNER_AZURE_CA_BUNDLE")]
    pub azure_ca_bundle: Option<PathBuf>,
    /// `azure/v1`: Azure Resource Manager, read for the vmId of the VM a provider ID names
    /// (US Government: `https://management.usgovcloudapi.net`, China:
    /// `https://management.chinacloudapi.cn`); its tokens are asked for `<endpoint>/.default`
    /// with the credentials the Azure SDK's variables name: AZURE_FEDERATED_TOKEN_FILE
    /// (workload identity), else AZURE_CLIENT_SECRET, each with AZURE_CLIENT_ID and
    /// AZURE_TENANT_ID (and AZURE_AUTHORITY_HOST outside the public cloud), else the managed
    /// identity (AZURE_CLIENT_ID: a user-assigned one).
    #[arg(long, env = "SIGNER_AZURE_ARM_ENDPOINT", default_value = azure::DEFAULT_ARM_ENDPOINT)]
    pub azure_arm_endpoint: String,
}

impl CloudArgs {
    /// `--cloud-attestation-max-age` as the verifiers take it.
    pub fn max_age(&self) -> Result<time::Duration> {
        time::Duration::try_from(self.cloud_attestation_max_age).context("--cloud-attestation-max-age is too large")
    }

    /// `--aws-sts-endpoint`, or AWS's regional endpoints.
    pub fn sts_endpoints(&self) -> Result<StsEndpoints> {
        match &self.aws_sts_endpoint {
            Some(template) => StsEndpoints::from_template(template).map_err(anyhow::Error::msg),
            None => Ok(StsEndpoints::regional()),
        }
    }

    /// `--azure-arm-endpoint`, checked.
    pub fn arm_endpoint(&self) -> Result<azure::ArmEndpoint> {
        Ok(azure::ArmEndpoint::parse(&self.azure_arm_endpoint)?)
    }

    /// `--aws-iid-certificates`, or the shipped set.
    pub fn region_certificates(&self) -> Result<RegionCertificates> {
        match &self.aws_iid_certificates {
            None => Ok(RegionCertificates::shipped()),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --aws-iid-certificates {}", path.display()))?;
                RegionCertificates::from_pem(&text)
                    .map_err(|e| anyhow::anyhow!("--aws-iid-certificates {}: {e}", path.display()))
            }
        }
    }
}

/// Where Google's keys come from.
#[derive(Debug, Clone)]
enum KeySource {
    Url(String),
    File(PathBuf),
}

#[derive(Default)]
struct KeyState {
    keys: Option<Jwks>,
    fetched_at: Option<OffsetDateTime>,
    attempted: Option<Instant>,
    last_error: Option<String>,
    stale_at: Option<Instant>,
    file_modified: Option<SystemTime>,
}

/// Google's keys, cached ([`GoogleKeys`] for the verifier).
pub struct GoogleKeyCache {
    source: KeySource,
    state: RwLock<KeyState>,
    refreshing: tokio::sync::Mutex<()>,
}

impl GoogleKeyCache {
    fn new(source: KeySource) -> Result<Self> {
        let cache = Self {
            source,
            state: RwLock::new(KeyState::default()),
            refreshing: tokio::sync::Mutex::new(()),
        };
        if let KeySource::File(path) = &cache.source {
            // An unusable file is a configuration error: say so at start.
            cache
                .read_file(path)
                .map_err(|e| anyhow::anyhow!("--gcp-jwks-file {}: {e}", path.display()))?;
        }
        Ok(cache)
    }

    fn read_file(&self, path: &Path) -> Result<(), String> {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && read(&self.state).file_modified == modified {
            return Ok(());
        }
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        let keys = Jwks::parse(&bytes)?;
        tracing::info!(path = %path.display(), kids = ?keys.kids(), "read Google's keys from --gcp-jwks-file");
        let mut state = write(&self.state);
        state.keys = Some(keys);
        state.file_modified = modified;
        Ok(())
    }

    /// Fetches the keys again unless that happened too recently.
    async fn refresh(&self, client: &HttpClient, timeout: Duration) {
        let url = match &self.source {
            KeySource::File(path) => {
                if let Err(e) = self.read_file(path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot re-read --gcp-jwks-file; keeping the keys read before");
                }
                return;
            }
            KeySource::Url(url) => url.clone(),
        };
        let _one_at_a_time = self.refreshing.lock().await;
        {
            let state = read(&self.state);
            let wait = if state.last_error.is_some() {
                KEYS_RETRY_INTERVAL
            } else {
                KEYS_MIN_INTERVAL
            };
            if state.attempted.is_some_and(|at| at.elapsed() < wait) {
                return;
            }
        }
        write(&self.state).attempted = Some(Instant::now());
        let request = hyper::Request::get(url.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()));
        let outcome = match request {
            Err(e) => Err(format!("--gcp-jwks-url {url:?}: {e}")),
            Ok(request) => match send(client, request, timeout).await {
                Ok(answer) if answer.status == 200 => Jwks::parse(&answer.body)
                    .map(|keys| (keys, answer.max_age))
                    .map_err(|e| format!("{url}: {e}")),
                Ok(answer) => Err(format!("{url} answered {}", answer.status)),
                Err(e) => Err(format!("{url}: {e}")),
            },
        };
        let mut state = write(&self.state);
        match outcome {
            Ok((keys, max_age)) => {
                tracing::info!(kids = ?keys.kids(), "fetched Google's keys");
                state.keys = Some(keys);
                state.fetched_at = Some(OffsetDateTime::now_utc());
                state.stale_at = Some(Instant::now() + max_age.unwrap_or(KEYS_DEFAULT_LIFETIME).max(KEYS_MIN_INTERVAL));
                state.last_error = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fetch Google's keys");
                state.last_error = Some(e);
            }
        }
    }

    /// When the keys should be fetched again on their own (their lifetime ended).
    fn stale(&self) -> bool {
        read(&self.state).stale_at.is_some_and(|at| Instant::now() >= at)
    }
}

impl GoogleKeys for GoogleKeyCache {
    fn key(&self, kid: &str) -> KeyLookup {
        let state = read(&self.state);
        let Some(keys) = &state.keys else {
            return KeyLookup::NotLoaded {
                why: state.last_error.clone(),
            };
        };
        match keys.get(kid) {
            Some(key) => KeyLookup::Found(key.clone()),
            None => KeyLookup::Unknown {
                fetched_at: match self.source {
                    KeySource::File(_) => None,
                    KeySource::Url(_) => state.fetched_at,
                },
            },
        }
    }
}

/// STS's answers, kept per exact request ([`CallerIdentity`] for the verifier).
#[derive(Default)]
pub struct StsAnswers {
    answers: Mutex<HashMap<[u8; 32], (StsAnswer, Instant)>>,
    keep: Duration,
}

impl StsAnswers {
    async fn ask(&self, client: &HttpClient, call: &StsCall, timeout: Duration) {
        let mut request = hyper::Request::post(call.url.as_str());
        for (name, value) in &call.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let answer = match request.body(Full::new(Bytes::from(call.body.clone()))) {
            Err(e) => StsAnswer::Refused {
                status: 0,
                error: format!("the request cannot be sent: {e}"),
            },
            Ok(request) => match send(client, request, timeout).await {
                Ok(answer) => {
                    let text = String::from_utf8_lossy(&answer.body);
                    match answer.status {
                        200 => match attestation::aws::sts::caller_arn(&text) {
                            Ok(arn) => StsAnswer::Caller { arn },
                            Err(e) => StsAnswer::Unavailable(format!("an unreadable answer: {e}")),
                        },
                        429 | 500..=599 => StsAnswer::Unavailable(format!(
                            "answered {}: {}",
                            answer.status,
                            attestation::aws::sts::error_summary(&text)
                        )),
                        400..=499 if text.contains("<Code>Throttling</Code>") => {
                            StsAnswer::Unavailable("throttled".into())
                        }
                        status => StsAnswer::Refused {
                            status,
                            error: attestation::aws::sts::error_summary(&text),
                        },
                    }
                }
                Err(e) => StsAnswer::Unavailable(e),
            },
        };
        match &answer {
            StsAnswer::Caller { arn } => tracing::info!(region = %call.region, %arn, "STS named the caller"),
            StsAnswer::Refused { status, error } => {
                tracing::info!(region = %call.region, status, %error, "STS refused a node's signed request")
            }
            StsAnswer::Unavailable(why) => tracing::warn!(url = %call.url, %why, "STS could not be asked"),
            StsAnswer::NotAsked => {}
        }
        remember(&mut lock(&self.answers), call.cache_key(), answer, self.keep);
    }
}

/// Keeps `answer` for `key` ([`http::remember`]: a full map forgets expired answers, then the
/// oldest, and always keeps the newest).
fn remember(answers: &mut HashMap<[u8; 32], (StsAnswer, Instant)>, key: [u8; 32], answer: StsAnswer, keep: Duration) {
    http::remember(answers, key, answer, STS_MAX_ANSWERS, |answer| lifetime(answer, keep));
}

fn lifetime(answer: &StsAnswer, keep: Duration) -> Duration {
    match answer {
        StsAnswer::Unavailable(_) => STS_UNAVAILABLE_MEMORY,
        _ => keep,
    }
}

impl CallerIdentity for StsAnswers {
    fn answer(&self, call: &StsCall) -> StsAnswer {
        let answers = lock(&self.answers);
        match answers.get(&call.cache_key()) {
            Some((answer, at)) if at.elapsed() < lifetime(answer, self.keep) => answer.clone(),
            _ => StsAnswer::NotAsked,
        }
    }
}

/// The cloud I/O of one signer process.
pub struct Cloud {
    /// Google's keys.
    pub google: Arc<GoogleKeyCache>,
    /// STS's answers.
    pub sts: Arc<StsAnswers>,
    /// Azure Resource Manager's answers.
    pub arm: Arc<azure::ArmAnswers>,
    client: HttpClient,
    timeout: Duration,
}

impl Cloud {
    /// From the flags; `timeout` bounds each cloud request.
    pub fn new(args: &CloudArgs, timeout: Duration) -> Result<Self> {
        let source = match &args.gcp_jwks_file {
            Some(path) => KeySource::File(path.clone()),
            None => KeySource::Url(args.gcp_jwks_url.clone()),
        };
        let client = http_client(args.cloud_ca_bundle.as_deref(), timeout)?;
        let transport = azure_core::http::Transport::new(Arc::new(azure::SdkTransport::new(client.clone(), timeout)));
        Ok(Self {
            google: Arc::new(GoogleKeyCache::new(source)?),
            sts: Arc::new(StsAnswers {
                answers: Mutex::default(),
                keep: args.cloud_attestation_max_age + Duration::from_secs(60),
            }),
            arm: Arc::new(azure::ArmAnswers::new(
                args.arm_endpoint()?,
                azure::Credentials::from_environment(transport),
            )),
            client,
            timeout,
        })
    }

    /// Makes the calls a decision asked for (at once, each bounded by the timeout).
    pub async fn make(&self, calls: &[CloudCall]) {
        let work = calls.iter().map(|call| async move {
            match call {
                CloudCall::RefreshGoogleKeys => self.google.refresh(&self.client, self.timeout).await,
                CloudCall::CallerIdentity(sts) => self.sts.ask(&self.client, sts, self.timeout).await,
                CloudCall::AzureVm(vm) => self.arm.ask(&self.client, vm, self.timeout).await,
                // The controller's: it reads its challenge key Secret (workload::csr).
                CloudCall::ReloadChallengeKey => {}
                _ => {}
            }
        });
        futures::future::join_all(work).await;
    }

    /// Refreshes Google's keys when their lifetime ends, for as long as the process runs
    /// (only once they were first needed: a signer without `gcp/v1` clusters never calls out).
    pub async fn keep_keys_current(self: Arc<Self>) {
        loop {
            tokio::time::sleep(KEYS_MIN_INTERVAL).await;
            let loaded = read(&self.google.state).keys.is_some();
            let file = matches!(self.google.source, KeySource::File(_));
            if file || (loaded && self.google.stale()) {
                self.google.refresh(&self.client, self.timeout).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_answer_map_forgets_its_oldest_and_keeps_the_newest() {
        let mut answers = HashMap::new();
        let keep = Duration::from_secs(660);
        let key = |n: usize| {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(n as u64).to_be_bytes());
            k
        };
        for n in 0..STS_MAX_ANSWERS {
            remember(&mut answers, key(n), StsAnswer::Caller { arn: n.to_string() }, keep);
        }
        // Make one strictly the oldest (inserts in a row can share an Instant).
        if let (Some(entry), Some(earlier)) = (
            answers.get_mut(&key(0)),
            Instant::now().checked_sub(Duration::from_secs(1)),
        ) {
            entry.1 = earlier;
        }
        remember(
            &mut answers,
            key(STS_MAX_ANSWERS),
            StsAnswer::Caller { arn: "newest".into() },
            keep,
        );
        assert_eq!(answers.len(), STS_MAX_ANSWERS);
        assert!(matches!(&answers[&key(STS_MAX_ANSWERS)].0, StsAnswer::Caller { arn } if arn == "newest"));
        assert!(!answers.contains_key(&key(0)), "the oldest was forgotten");
    }

    #[test]
    fn an_unavailable_sts_answer_is_forgotten_soon_and_a_real_one_is_kept() {
        let keep = Duration::from_secs(660);
        assert_eq!(
            lifetime(&StsAnswer::Unavailable("x".into()), keep),
            STS_UNAVAILABLE_MEMORY
        );
        assert_eq!(lifetime(&StsAnswer::Caller { arn: "a".into() }, keep), keep);
    }
}
