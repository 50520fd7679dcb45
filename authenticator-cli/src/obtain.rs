//! Getting a certificate: a key, the attested envelope, a CSR filed with the bootstrap
//! kubeconfig (first time) or the current certificate (renewal), and a watch until the signer
//! issues, denies or fails it, or the timeout passes. The two-phase providers (`tpm/v1`,
//! `azure/v1`: those with an [`Attestor::challenge_annotation`]) file twice: CSR #1 is
//! answered with a challenge in that annotation, CSR #2 (same key) with the certificate.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use attestation::attestor::{Attestor, ChallengeAnswer};
use attestation::envelope::RequestEnvelope;
use attestation::identity::{NodeName, ProviderId};
use attestation::names::ANNOTATION_SUPPORTED_VERSIONS;
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig, KubeconfigError, LoadDataError};
use kube::runtime::watcher;
use kube::{Api, Client};
use zeroize::Zeroizing;

use crate::exec_credential::ExecCluster;

/// What to ask for.
pub struct Request<'a> {
    /// The node.
    pub node: &'a NodeName,
    /// Its provider ID.
    pub provider_id: &'a ProviderId,
    /// The signer name.
    pub signer_name: &'a str,
    /// `spec.expirationSeconds`.
    pub expiration_seconds: Option<i32>,
    /// How long to wait for the certificate.
    pub timeout: Duration,
}

/// A new certificate and its key.
pub struct Issued {
    /// Certificate PEM, as the signer wrote it.
    pub cert_pem: String,
    /// PKCS#8 key PEM.
    pub key_pem: Zeroizing<String>,
    /// The CSR's name, for messages.
    pub csr_name: String,
}

/// How the client authenticates.
pub enum Identity<'a> {
    /// The bootstrap kubeconfig's own user (a bootstrap token).
    Bootstrap,
    /// The node's current certificate and key (a renewal).
    Node {
        /// Certificate PEM.
        cert_pem: &'a str,
        /// Key PEM.
        key_pem: &'a str,
    },
}

/// A client of the workload apiserver, and the apiserver's URL for messages (kube's own errors
/// do not name it, and "unreachable" alone does not say which apiserver the node was sent to).
pub struct Workload {
    /// The client.
    pub client: Client,
    /// The apiserver's URL.
    pub url: String,
}

/// Reads the kubeconfig at `path`; `what` names it in messages (e.g. "the bootstrap kubeconfig
/// /etc/kubernetes/bootstrap-kubelet.conf (--bootstrap-kubeconfig)"). kube's read error quotes
/// the path as Rust debug text and prints the OS error both in its text and as its source:
/// here the path is named once, by `what`, and the OS error is the only cause.
pub fn read_kubeconfig(path: &Path, what: impl FnOnce() -> String) -> Result<Kubeconfig> {
    Kubeconfig::read_from(path).map_err(|error| match error {
        KubeconfigError::ReadConfig(io, _) => anyhow::Error::new(io).context(format!("cannot read {}", what())),
        other => anyhow::Error::new(other).context(format!("{} is not a usable kubeconfig", what())),
    })
}

/// kube's error for a kubeconfig it could not load, with a file it names (a CA, a client
/// certificate or key) said once and unquoted, as [`read_kubeconfig`] does for the kubeconfig.
fn config_error(error: KubeconfigError) -> anyhow::Error {
    let file = |what: &str, data: LoadDataError| match data {
        LoadDataError::ReadFile(io, path) => {
            anyhow::Error::new(io).context(format!("cannot read the {what} {}", path.display()))
        }
        other => anyhow::Error::new(other).context(format!("the {what}")),
    };
    match error {
        KubeconfigError::LoadCertificateAuthority(data) => file("certificate authority", data),
        KubeconfigError::LoadClientCertificate(data) => file("client certificate", data),
        KubeconfigError::LoadClientKey(data) => file("client key", data),
        other => anyhow::Error::new(other),
    }
}

/// A client of the workload apiserver as `identity`. A bootstrap uses the bootstrap kubeconfig
/// whole (its token is the identity). A renewal authenticates with the node's certificate and
/// finds the apiserver in `cluster` (kubelet's own kubeconfig's cluster, from
/// `KUBERNETES_EXEC_INFO`) when client-go provided it, else in the bootstrap kubeconfig: after
/// `kubeadm join` that file is gone, and renewals must not need it.
pub async fn client(
    bootstrap_kubeconfig: &Path,
    cluster: Option<&ExecCluster>,
    identity: Identity<'_>,
) -> Result<Workload> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut kubeconfig, source) = match (&identity, cluster) {
        (Identity::Node { .. }, Some(cluster)) => {
            (node_kubeconfig(cluster)?, "KUBERNETES_EXEC_INFO's cluster".to_owned())
        }
        _ => (
            read_kubeconfig(bootstrap_kubeconfig, || {
                format!(
                    "the bootstrap kubeconfig {} (--bootstrap-kubeconfig){}",
                    bootstrap_kubeconfig.display(),
                    if cluster.is_none() && matches!(identity, Identity::Node { .. }) {
                        "; a renewal finds the apiserver there unless kubelet's kubeconfig sets provideClusterInfo: true"
                    } else {
                        ""
                    }
                )
            })?,
            format!("bootstrap kubeconfig {}", bootstrap_kubeconfig.display()),
        ),
    };
    if let Identity::Node { cert_pem, key_pem } = identity {
        let user = AuthInfo {
            client_certificate_data: Some(b64.encode(cert_pem)),
            client_key_data: Some(b64.encode(key_pem).into()),
            ..AuthInfo::default()
        };
        for named in &mut kubeconfig.auth_infos {
            named.auth_info = Some(user.clone());
        }
    }
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(config_error)
        .with_context(|| source.clone())?;
    config.proxy_url = apiserver_proxy(
        config.proxy_url.take(),
        environment_proxy(),
        &hyper_util::client::proxy::matcher::Matcher::from_env(),
        &config.cluster_url,
    );
    // As the kubeconfig spells it (`Uri` adds a `/` to a bare authority).
    let url = config.cluster_url.to_string().trim_end_matches('/').to_owned();
    let client =
        Client::try_from(config).with_context(|| format!("cannot build a client for the workload apiserver {url}"))?;
    Ok(Workload { client, url })
}

/// `HTTPS_PROXY` (or `https_proxy`) as kube's loader reads it.
fn environment_proxy() -> Option<http::Uri> {
    ["HTTPS_PROXY", "https_proxy"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .and_then(|value| value.parse().ok())
}

/// The proxy to reach the apiserver `cluster` through, as kubelet (client-go) chooses it: the
/// kubeconfig's own `proxy-url` when it names one; otherwise the environment's proxy unless
/// `NO_PROXY` exempts the apiserver (`proxies`). kube's loader puts `HTTPS_PROXY` in
/// `loaded` and matches `NO_PROXY` against the proxy's own address, so a node whose `NO_PROXY`
/// exempts its apiserver, as kubelet honours it, would have the plugin go through the proxy.
fn apiserver_proxy(
    loaded: Option<http::Uri>,
    from_environment: Option<http::Uri>,
    proxies: &hyper_util::client::proxy::matcher::Matcher,
    cluster: &http::Uri,
) -> Option<http::Uri> {
    match loaded {
        Some(own) if Some(&own) != from_environment.as_ref() => Some(own),
        _ => proxies.intercept(cluster).map(|intercept| intercept.uri().clone()),
    }
}

/// A kubeconfig for `cluster` with one (empty) user, filled in by [`client`].
fn node_kubeconfig(cluster: &ExecCluster) -> Result<Kubeconfig> {
    use base64::Engine;
    let mut entry = serde_json::json!({"server": cluster.server});
    if let Some(pem) = &cluster.certificate_authority {
        entry["certificate-authority-data"] = base64::engine::general_purpose::STANDARD.encode(pem).into();
    }
    if let Some(name) = &cluster.tls_server_name {
        entry["tls-server-name"] = name.clone().into();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "workload", "cluster": entry}],
        "users": [{"name": "node", "user": {}}],
        "contexts": [{"name": "node", "context": {"cluster": "workload", "user": "node"}}],
        "current-context": "node",
    }))
    .context("KUBERNETES_EXEC_INFO's cluster does not make a kubeconfig")
}

/// Files the CSR and waits for its certificate. A two-phase attestor's first CSR is answered
/// by a challenge annotation: the attestor answers it and the same key is filed again, once.
pub async fn obtain(workload: &Workload, request: &Request<'_>, attestor: &mut dyn Attestor) -> Result<Issued> {
    let key = NodeKey::generate(KeyAlgorithm::EcdsaP256)?;
    let params = kubelet_client_params(request.node, request.provider_id);
    let api: Api<CertificateSigningRequest> = Api::all(workload.client.clone());
    let url = workload.url.as_str();
    let envelope = build_envelope(&params, &key, attestor, None)?;
    let work = async {
        let first = file(&api, url, request, &envelope).await?;
        match wait(&api, &first, attestor.challenge_annotation()).await? {
            Step::Issued(pem) => Ok((pem, first)),
            Step::Challenged { uid, annotation } => {
                let answer = ChallengeAnswer {
                    csr_name: &first,
                    csr_uid: &uid,
                    annotation: &annotation,
                };
                let envelope = build_envelope(&params, &key, attestor, Some(answer))
                    .with_context(|| format!("answering the challenge on CSR {first}"))?;
                let second = file(&api, url, request, &envelope).await?;
                match wait(&api, &second, None).await? {
                    Step::Issued(pem) => Ok((pem, second)),
                    Step::Challenged { .. } => bail!("CSR {second} was challenged again"),
                }
            }
        }
    };
    let (cert_pem, csr_name) = tokio::time::timeout(request.timeout, work).await.map_err(|_| {
        anyhow!(
            "timed out after {} waiting for the certificate: no node-attestation-signer answered. Its Cluster must be opted in (annotation cluster.x-k8s.io/kubelet-authentication: \"true\") before nodes with this plugin join, and not paused; in the management cluster, `node-attestation-signer explain --node <this node> --provider-id <its provider ID>` says why",
            humantime::format_duration(request.timeout)
        )
    })??;
    Ok(Issued {
        cert_pem,
        key_pem: key.private_key_pem(),
        csr_name,
    })
}

/// Files one CSR; returns its name.
async fn file(
    api: &Api<CertificateSigningRequest>,
    url: &str,
    request: &Request<'_>,
    envelope: &RequestEnvelope,
) -> Result<String> {
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".to_owned()),
            ..ObjectMeta::default()
        },
        spec: k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(envelope.encode().into_bytes()),
            signer_name: request.signer_name.to_owned(),
            usages: Some(vec!["digital signature".to_owned(), "client auth".to_owned()]),
            expiration_seconds: request.expiration_seconds,
            ..Default::default()
        },
        status: None,
    };
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|e| explain_api_error(e, url, "filing the CSR"))?;
    Ok(created.metadata.name.unwrap_or_default())
}

/// Where a filed CSR went.
enum Step {
    /// Its certificate.
    Issued(String),
    /// The signer's challenge (the annotation's value) and the CSR's UID.
    Challenged { uid: String, annotation: String },
}

/// Watches CSR `name` until it is issued, challenged (when `challenge` names the attestor's
/// annotation), denied or failed.
async fn wait(api: &Api<CertificateSigningRequest>, name: &str, challenge: Option<&str>) -> Result<Step> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api.clone(), config).boxed();
    while let Some(event) = events.next().await {
        let csr = match event {
            Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) => csr,
            Ok(watcher::Event::Delete(_)) => bail!("CSR {name} was deleted before it was issued"),
            Ok(_) => continue,
            // Transient watch errors: the watcher relists on its own; keep waiting.
            Err(_) => continue,
        };
        if let Some(done) = outcome(&csr) {
            return done.map(Step::Issued);
        }
        let annotation = challenge.and_then(|key| csr.metadata.annotations.as_ref()?.get(key).cloned());
        if let Some(annotation) = annotation {
            return Ok(Step::Challenged {
                uid: csr.metadata.uid.clone().unwrap_or_default(),
                annotation,
            });
        }
    }
    Err(anyhow!("the watch of CSR {name} ended"))
}

/// A CSR the signer refused for good: `Denied`, or `Failed` (approved, then found not to
/// hold). Exec mode backs off after one ([`crate::backoff`]); other errors (network, timeout)
/// are not refusals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CSR {csr} was {}: {reason}: {message}{}", .condition.verb(), .supported.as_ref().map(|v| format!(" (the signer supports {v}: choose one with --attestor)")).unwrap_or_default())]
pub struct Refused {
    /// The CSR's name.
    pub csr: String,
    /// Which condition ended it.
    pub condition: Refusal,
    /// The condition's reason (`MachineAlreadyClaimed`, ...).
    pub reason: String,
    /// The condition's message.
    pub message: String,
    /// The versions the signer supports, when it answered an unsupported one.
    pub supported: Option<String>,
}

/// The condition of a refused CSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Denied`: the signer's checks failed.
    Denied,
    /// `Failed`: approved, then not signed.
    Failed,
}

impl Refusal {
    /// The condition type, as the CSR spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Denied => "Denied",
            Self::Failed => "Failed",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::Failed => "marked Failed",
        }
    }
}

/// The CSR's end: the certificate, or the denial / failure with its reason and message (and,
/// for an unsupported attestation version, the versions the signer supports) as [`Refused`].
fn outcome(csr: &CertificateSigningRequest) -> Option<Result<String>> {
    let status = csr.status.as_ref()?;
    let name = csr.metadata.name.as_deref().unwrap_or_default();
    if let Some(conditions) = &status.conditions {
        for c in conditions {
            let condition = match c.type_.as_str() {
                "Denied" => Refusal::Denied,
                "Failed" => Refusal::Failed,
                _ => continue,
            };
            if c.status == "True" {
                return Some(Err(Refused {
                    csr: name.to_owned(),
                    condition,
                    reason: c.reason.clone().unwrap_or_else(|| "no reason".to_owned()),
                    message: c.message.clone().unwrap_or_else(|| "no message".to_owned()),
                    supported: csr
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(ANNOTATION_SUPPORTED_VERSIONS))
                        .cloned(),
                }
                .into()));
            }
        }
    }
    let cert = status.certificate.as_ref().filter(|c| !c.0.is_empty())?;
    Some(String::from_utf8(cert.0.clone()).map_err(|_| anyhow!("CSR {name}: the certificate is not PEM text")))
}

/// `error` from the apiserver at `url` while `doing`, for a person: the URL always (kube's
/// errors do not name it). A refusal (401, 403, ...) is the apiserver's answer, said in full.
/// Anything else keeps kube's error as its source, so the cause (connection refused, DNS, TLS,
/// an answer that does not parse, ...) is printed after the URL; a transport failure
/// (hyper, or the client's service stack, where connect and TLS errors surface) is called
/// unreachable.
pub fn explain_api_error(error: kube::Error, url: &str, doing: &str) -> anyhow::Error {
    match error {
        kube::Error::Api(status) if status.code == 401 => anyhow!(
            "{doing}: the workload apiserver {url} refused our credentials (401): the bootstrap token may have expired"
        ),
        kube::Error::Api(status) if status.code == 403 => {
            anyhow!(
                "{doing}: forbidden (403) by the workload apiserver {url}: {}",
                status.message
            )
        }
        kube::Error::Api(status) => anyhow!(
            "{doing}: the workload apiserver {url} answered {} ({})",
            status.message,
            status.code
        ),
        other @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
            anyhow::Error::new(other).context(format!("{doing}: the workload apiserver {url} is unreachable"))
        }
        other => anyhow::Error::new(other).context(format!("{doing} with the workload apiserver {url}")),
    }
}

#[cfg(test)]
mod proxy_tests {
    use hyper_util::client::proxy::matcher::Matcher;

    use super::*;

    #[test]
    fn the_apiserver_is_reached_as_kubelet_reaches_it() {
        let proxy: http::Uri = "http://proxy.corp:3128".parse().unwrap();
        let apiserver: http::Uri = "https://10.0.0.1:6443".parse().unwrap();
        let exempt = Matcher::builder()
            .https("http://proxy.corp:3128")
            .no("10.0.0.0/8")
            .build();
        let not_exempt = Matcher::builder()
            .https("http://proxy.corp:3128")
            .no("internal.corp")
            .build();
        // HTTPS_PROXY with NO_PROXY naming the apiserver: directly, as kubelet goes.
        assert_eq!(
            apiserver_proxy(Some(proxy.clone()), Some(proxy.clone()), &exempt, &apiserver),
            None
        );
        // NO_PROXY naming something else: through the proxy.
        assert_eq!(
            apiserver_proxy(Some(proxy.clone()), Some(proxy.clone()), &not_exempt, &apiserver),
            Some(proxy.clone())
        );
        // The kubeconfig's own proxy-url wins.
        let own: http::Uri = "http://other:8080".parse().unwrap();
        assert_eq!(
            apiserver_proxy(Some(own.clone()), Some(proxy), &exempt, &apiserver),
            Some(own)
        );
        // No proxy anywhere.
        assert_eq!(
            apiserver_proxy(None, None, &Matcher::builder().build(), &apiserver),
            None
        );
    }
}
