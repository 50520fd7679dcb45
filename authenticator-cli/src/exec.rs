//! Exec mode, what kubelet runs: answer from the cache when it holds a certificate before its
//! rotation point; otherwise, under the cert dir's lock, obtain a new one (bootstrap token the
//! first time, the current certificate for renewals) and answer with it. A failure while the
//! old certificate is still valid answers with the old one and says why on stderr; stdout only
//! ever receives one whole `ExecCredential`. After a denial no CSR is filed until the backoff
//! ([`crate::backoff`]) has passed: until then the old certificate is answered (held by
//! client-go until the backoff ends) or, without one, the denial and the time of the next
//! attempt go to stderr. A valid certificate for this node that the plugin did not obtain
//! ([`crate::cert_dir::Cached::Foreign`], typically kubelet's own rotation at work) is reported
//! on every call and renewed with as the node's identity, never replaced through the bootstrap
//! token, which a claimed Machine refuses.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use attestation::identity::{NodeName, ProviderId};
use time::OffsetDateTime;

use crate::backoff::{self, Backoff, Hold};
use crate::cert_dir::{Cached, CertDir, Credential};
use crate::csr::AttestorName;
use crate::error_chain::Chain;
use crate::exec_credential::{ExecApiVersion, ExecCluster, exec_credential, parse_exec_cluster, parse_exec_info};
use crate::obtain::{Identity, Issued, Refused, Request, client, explain_api_error, obtain};

/// Flags of exec mode (and of `status` and `kubeconfig`, which describe it). Every flag also
/// reads an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ExecArgs {
    /// Kubeconfig with the workload apiserver and a bootstrap token.
    #[arg(
        long,
        env = "KUBELET_AUTHENTICATOR_BOOTSTRAP_KUBECONFIG",
        default_value = "/etc/kubernetes/bootstrap-kubelet.conf"
    )]
    pub bootstrap_kubeconfig: PathBuf,
    /// Where certificates are kept (as kubelet keeps them).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_CERT_DIR", default_value = "/var/lib/kubelet/pki")]
    pub cert_dir: PathBuf,
    /// Node name (default: the lower-cased hostname).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_NODE_NAME")]
    pub node_name: Option<String>,
    /// The Machine's provider ID (with --attestor azure and neither this nor --provider-id-file:
    /// the VM's, read from the Azure instance metadata service when a CSR is to be filed).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_PROVIDER_ID", conflicts_with = "provider_id_file")]
    pub provider_id: Option<String>,
    /// A file holding the provider ID (written by the bootstrap provider at boot).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_PROVIDER_ID_FILE")]
    pub provider_id_file: Option<PathBuf>,
    /// Attestor: tpm (TPM 2.0, see --tpm-tcti), gcp (Compute Engine metadata server; env
    /// GCE_METADATA_HOST=host[:port] to use another), aws (EC2 metadata service, IMDSv2, and a
    /// signed STS request; env AWS_EC2_METADATA_SERVICE_ENDPOINT=<url> and AWS_ENDPOINT_URL_STS=<url>
    /// to use others), azure (Azure instance metadata service, two CSRs; env
    /// AZURE_METADATA_ENDPOINT=<url> to use another), or insecure (no evidence).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_ATTESTOR", value_enum, default_value_t = AttestorName::Tpm)]
    pub attestor: AttestorName,
    /// The TPM (for `--attestor tpm`).
    #[command(flatten)]
    pub tpm: crate::csr::TpmOptions,
    /// Signer name (default: the attestor's).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_SIGNER_NAME")]
    pub signer_name: Option<String>,
    /// How long to wait for the certificate.
    #[arg(long, env = "KUBELET_AUTHENTICATOR_TIMEOUT", default_value = "15m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How long a renewal waits for its certificate while the current one is valid (at most
    /// `--timeout`). client-go holds every kubelet request while the plugin runs, so a renewal
    /// the signer does not answer (an outage) must give up before kubelet's Lease lapses (40 s)
    /// and answer the current certificate; it tries again later ([`unanswered_retry`]).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_RENEWAL_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub renewal_timeout: Duration,
    /// Requested certificate lifetime (`spec.expirationSeconds`; at least 10m).
    #[arg(long, env = "KUBELET_AUTHENTICATOR_REQUESTED_DURATION", value_parser = humantime::parse_duration)]
    pub requested_duration: Option<Duration>,
}

impl ExecArgs {
    /// The node name.
    pub fn node(&self) -> Result<NodeName> {
        let raw = match &self.node_name {
            Some(name) => name.clone(),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("cannot read the hostname; pass --node-name")?
                .trim()
                .to_lowercase(),
        };
        NodeName::new(&raw).with_context(|| format!("node name {raw:?}"))
    }

    /// The provider ID the flags give; `None` when neither is given and the attestor finds it
    /// itself ([`AttestorName::finds_provider_id`]).
    pub fn given_provider_id(&self) -> Result<Option<ProviderId>> {
        let raw = match (&self.provider_id, &self.provider_id_file) {
            (Some(id), _) => id.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .with_context(|| {
                    format!(
                        "cannot read the provider ID file {} (--provider-id-file)",
                        file.display()
                    )
                })?
                .trim()
                .to_owned(),
            (None, None) if self.attestor.finds_provider_id() => return Ok(None),
            (None, None) => bail!("no provider ID: pass --provider-id or --provider-id-file"),
        };
        ProviderId::new(&raw)
            .map(Some)
            .with_context(|| format!("provider ID {raw:?}"))
    }

    /// The provider ID: the flags', or the one the attestor finds (a request to the cloud's
    /// metadata service).
    pub fn provider_id(&self) -> Result<ProviderId> {
        if let Some(given) = self.given_provider_id()? {
            return Ok(given);
        }
        let found = crate::metadata::AzureImdsHttp::from_env()?
            .provider_id()
            .map_err(anyhow::Error::new)
            .context("no --provider-id or --provider-id-file: --attestor azure reads the VM's from the Azure instance metadata service")?;
        ProviderId::new(&found).with_context(|| format!("provider ID {found:?} (the VM's, from its resource ID)"))
    }

    /// The signer name.
    pub fn signer(&self) -> String {
        self.signer_name
            .clone()
            .unwrap_or_else(|| self.attestor.signer_name().to_owned())
    }

    /// What a CSR of these flags asks for (attestor, signer, node, provider ID): a backoff
    /// recorded for another request does not hold, since changing them is the fix it waits for.
    pub fn request_key(&self, node: &NodeName, provider_id: &ProviderId) -> String {
        let attestor = clap::ValueEnum::to_possible_value(&self.attestor)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default();
        format!(
            "{attestor} {} {} {}",
            self.signer(),
            node.username(),
            provider_id.as_str()
        )
    }
}

fn answer(version: ExecApiVersion, credential: &Credential) -> String {
    answer_until(version, credential, credential.rotate_at)
}

/// An answer client-go holds until `expires` (then it calls again).
fn answer_until(version: ExecApiVersion, credential: &Credential, expires: OffsetDateTime) -> String {
    exec_credential(version, &credential.cert_pem, &credential.key_pem, expires)
}

/// A uniform draw in [0, 1) for the backoff's jitter (0 if the system's generator fails).
fn jitter() -> f64 {
    let mut bytes = [0u8; 8];
    match aws_lc_rs::rand::fill(&mut bytes) {
        Ok(()) => (u64::from_be_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.0,
    }
}

/// Runs exec mode; returns the `ExecCredential` to print.
pub fn run(args: &ExecArgs) -> Result<String> {
    let exec_info = std::env::var("KUBERNETES_EXEC_INFO").ok();
    let version = parse_exec_info(exec_info.as_deref())?;
    let node = args.node()?;
    let given = args.given_provider_id()?;
    let dir = CertDir::open(&args.cert_dir)?;
    let now = OffsetDateTime::now_utc();
    // The path kubelet pays on every call: no lock, no runtime, no network. A provider ID the
    // attestor finds itself is a request to the metadata service, so it is not looked for
    // here: the certificate stored is answered until its rotation point, whatever its provider
    // ID, and the provider ID is found again for each CSR.
    if let Cached::Usable(credential) = dir.current(&node, given.as_ref(), now)
        && now < credential.rotate_at
    {
        return Ok(answer(version, &credential));
    }

    let _lock = dir.lock()?;
    let provider_id = match given {
        Some(given) => given,
        None => match args.provider_id() {
            Ok(found) => found,
            // As a renewal that failed: the stored certificate while it is valid, else the error.
            Err(error) => {
                let now = OffsetDateTime::now_utc();
                dir.record_error(&Chain(&error).to_string(), now);
                return match dir.current(&node, None, now) {
                    Cached::Usable(old) | Cached::Foreign(old, _) if now < old.not_after => {
                        eprintln!(
                            "kubelet-authenticator: renewal failed, answering with the current certificate (valid until {}): {}",
                            backoff::rfc3339(old.not_after),
                            Chain(&error)
                        );
                        let again = (now + unanswered_retry(now, old.rotate_at, old.not_after)).min(old.not_after);
                        Ok(answer_until(version, &old, again))
                    }
                    _ => Err(error),
                };
            }
        },
    };
    // Another invocation may have renewed while this one waited for the lock.
    let now = OffsetDateTime::now_utc();
    let mut foreign = None;
    let cached = match dir.current(&node, Some(&provider_id), now) {
        Cached::Usable(credential) if now < credential.rotate_at => return Ok(answer(version, &credential)),
        Cached::Usable(credential) => Some(credential),
        // Said on every call while it is there. It is this node's identity (the apiserver takes
        // it as system:node:<name>), so it renews like our own; bootstrapping instead would be
        // refused for a claimed Machine, again and again.
        Cached::Foreign(credential, why) => {
            eprintln!(
                "kubelet-authenticator: WARNING: {} holds a certificate for {} (valid until {}) {}; renewing with it as the node's identity",
                dir.path(crate::cert_dir::CURRENT).display(),
                credential.subject,
                backoff::rfc3339(credential.not_after),
                why.explain()
            );
            foreign = Some(why);
            Some(credential)
        }
        Cached::Unusable(why) => {
            eprintln!("kubelet-authenticator: ignoring the cached certificate: {why}; requesting a new one");
            None
        }
        Cached::Missing => None,
    };

    // After a denial, no new CSR until the backoff's delay has passed (checked under the lock,
    // so of concurrent calls only the first after the delay files one).
    let request = args.request_key(&node, &provider_id);
    let backoff = dir.backoff().unwrap_or_else(|why| {
        eprintln!("kubelet-authenticator: ignoring the backoff record: {why}");
        None
    });
    if let Some(record) = &backoff {
        match record.hold(&request, now) {
            Hold::Until(until) => {
                let why = format!(
                    "backing off: no new CSR before {} after {}",
                    backoff::when(until, now),
                    record.describe()
                );
                return match cached {
                    Some(old) => {
                        eprintln!(
                            "kubelet-authenticator: {why}; answering with the current certificate (valid until {})",
                            backoff::rfc3339(old.not_after)
                        );
                        Ok(answer_until(version, &old, until.min(old.not_after)))
                    }
                    None => bail!("{why} (remove {} to try at once)", dir.path(backoff::FILE).display()),
                };
            }
            Hold::Implausible => eprintln!(
                "kubelet-authenticator: ignoring the backoff record: it asks to wait beyond the {} cap (has the clock moved back?)",
                backoff::CAP
            ),
            Hold::Over | Hold::OtherRequest => {}
        }
    }

    // An adopted certificate (kubeadm's, `kubeconfig --adopt`): the signer adopts only the node
    // its Machine already names, so the request waits until kubelet has registered the Node
    // (on the first control-plane node, kubelet starts with kubeadm's certificate and registers
    // a moment later): kubelet gets the adopted certificate until then, and asks again soon.
    if foreign == Some(crate::cert_dir::NotObtained::Adopted)
        && let Some(adopted) = &cached
        && let Err(why) = node_registered(args, &node, adopted, exec_info.as_deref())
    {
        eprintln!(
            "kubelet-authenticator: the adoption waits: {why}; answering with the adopted certificate (valid until {})",
            backoff::rfc3339(adopted.not_after)
        );
        let again = now + ADOPTION_RECHECK;
        return Ok(answer_until(version, adopted, again.min(adopted.not_after)));
    }

    match renew(args, &node, &provider_id, cached.as_ref(), exec_info.as_deref()) {
        Ok(issued) => {
            let now = OffsetDateTime::now_utc();
            let fresh = crate::cert_dir::check(
                &format!("{}\n{}", issued.cert_pem, issued.key_pem.as_str()),
                &node,
                Some(&provider_id),
                now,
            )
            .map_err(|why| {
                anyhow::anyhow!(
                    "CSR {} was issued a certificate that is unusable: {why}",
                    issued.csr_name
                )
            })?;
            dir.store(&fresh.cert_pem, &fresh.key_pem, now, cached.as_ref().zip(foreign))?;
            dir.clear_error();
            dir.clear_backoff();
            if foreign.is_some() {
                eprintln!(
                    "kubelet-authenticator: replaced the certificate it did not obtain with CSR {}'s; if kubelet's own rotation is still on, it will write another",
                    issued.csr_name
                );
            }
            Ok(answer(version, &fresh))
        }
        Err(error) => {
            let now = OffsetDateTime::now_utc();
            dir.record_error(&Chain(&error).to_string(), now);
            // A denial starts (or lengthens) the backoff; other failures (network, timeout)
            // file nothing more often than the timeout allows and leave it as it is.
            let retry_at = error.downcast_ref::<Refused>().map(|refused| {
                let next = Backoff::after(backoff.as_ref(), &request, refused, now, jitter());
                if let Err(e) = dir.store_backoff(&next).and_then(|()| dir.store_last_denial(&next)) {
                    eprintln!("kubelet-authenticator: cannot record the backoff: {}", Chain(&e));
                }
                next.retry_at
            });
            let then = retry_at
                .map(|at| format!("; no new CSR before {}", backoff::when(at, now)))
                .unwrap_or_default();
            match cached {
                Some(old) if now < old.not_after => {
                    eprintln!(
                        "kubelet-authenticator: renewal failed, answering with the current certificate (valid until {}): {}{then}",
                        backoff::rfc3339(old.not_after),
                        Chain(&error)
                    );
                    // client-go calls again when the backoff ends, or after an unanswered
                    // renewal's retry delay (a foreign certificate's own rotation point may be
                    // months away, so not that).
                    let expires = retry_at
                        .unwrap_or_else(|| now + unanswered_retry(now, old.rotate_at, old.not_after))
                        .min(old.not_after);
                    Ok(answer_until(version, &old, expires))
                }
                _ if retry_at.is_some() => Err(anyhow::anyhow!("{}{then}", Chain(&error))),
                _ => Err(error),
            }
        }
    }
}

/// `--renewal-timeout`'s default (the flag's `default_value`; the rendered-kubeconfig tests fail if
/// the two part).
pub const DEFAULT_RENEWAL_TIMEOUT: Duration = Duration::from_secs(20);

/// How long after a renewal that failed without a denial (the signer or the management cluster
/// away, a network error, a timeout) the next one is tried: a quarter of the time since the
/// rotation point (at least a minute, at most 6 hours), but never more than a quarter of the
/// time the certificate has left (nor less than 5 seconds). Each try files a CSR, an outage may
/// last days (the outage tolerance is 45% of the lifetime), and the signer decides every CSR
/// still pending when it returns: retrying each minute would leave thousands of CSRs per node for
/// it. This way a three-day outage files about 40 per node (those older than a day deleted by
/// kube-controller-manager's cleaner, so a handful pending at its end); a node retries within
/// minutes of a short outage's end, and more often as its certificate nears its end, so the
/// signer's return always finds it trying.
pub fn unanswered_retry(now: OffsetDateTime, rotate_at: OffsetDateTime, not_after: OffsetDateTime) -> time::Duration {
    let since: time::Duration = (now - rotate_at).max(time::Duration::ZERO);
    let left: time::Duration = (not_after - now).max(time::Duration::ZERO);
    let (since, left): (time::Duration, time::Duration) = (since / 4, left / 4);
    let widening = since.clamp(time::Duration::minutes(1), time::Duration::hours(6));
    widening.min(left).max(time::Duration::seconds(5))
}

/// How soon client-go asks again while an adoption waits for the Node to register.
const ADOPTION_RECHECK: time::Duration = time::Duration::seconds(10);

/// Whether kubelet has registered Node `node` (asked as the node, with the adopted
/// certificate: the Node authorizer lets a node read its own Node); `Err` says why not, or why
/// it cannot be told.
fn node_registered(
    args: &ExecArgs,
    node: &NodeName,
    adopted: &Credential,
    exec_info: Option<&str>,
) -> Result<(), String> {
    let cluster: Option<ExecCluster> = parse_exec_cluster(exec_info).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async {
        let identity = Identity::Node {
            cert_pem: &adopted.cert_pem,
            key_pem: &adopted.key_pem,
        };
        let workload = client(&args.bootstrap_kubeconfig, cluster.as_ref(), identity)
            .await
            .map_err(|e| Chain(&e).to_string())?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(workload.client);
        match tokio::time::timeout(args.timeout, nodes.get_opt(node.as_str())).await {
            Ok(Ok(Some(_))) => Ok(()),
            Ok(Ok(None)) => Err(format!("Node {node} is not registered yet")),
            Ok(Err(e)) => {
                let doing = format!("reading Node {node}");
                Err(Chain(&explain_api_error(e, &workload.url, &doing)).to_string())
            }
            Err(_) => Err(format!(
                "no answer about Node {node} from {} within {}",
                workload.url,
                humantime::format_duration(args.timeout)
            )),
        }
    })
}

fn renew(
    args: &ExecArgs,
    node: &NodeName,
    provider_id: &ProviderId,
    current: Option<&Credential>,
    exec_info: Option<&str>,
) -> Result<Issued> {
    let cluster: Option<ExecCluster> = parse_exec_cluster(exec_info)?;
    let mut attestor = args.attestor.attestor(&args.tpm)?;
    let signer = args.signer();
    let expiration_seconds = args
        .requested_duration
        .map(|d| i32::try_from(d.as_secs()).context("--requested-duration is too long"))
        .transpose()?;
    let renewing = current.is_some_and(|c| OffsetDateTime::now_utc() < c.not_after);
    let request = Request {
        node,
        provider_id,
        signer_name: &signer,
        expiration_seconds,
        timeout: if renewing {
            args.timeout.min(args.renewal_timeout)
        } else {
            args.timeout
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let identity = match current {
            Some(c) => Identity::Node {
                cert_pem: &c.cert_pem,
                key_pem: &c.key_pem,
            },
            None => Identity::Bootstrap,
        };
        let workload = client(&args.bootstrap_kubeconfig, cluster.as_ref(), identity).await?;
        obtain(&workload, &request, attestor.as_mut()).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_renewal_is_retried_sooner_in_a_short_outage_and_near_expiry() {
        let rotate_at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let not_after = rotate_at + time::Duration::hours(84);
        let after = |d: time::Duration| unanswered_retry(rotate_at + d, rotate_at, not_after);
        assert_eq!(after(time::Duration::ZERO), time::Duration::minutes(1));
        assert_eq!(
            after(time::Duration::minutes(-5)),
            time::Duration::minutes(1),
            "a clock behind"
        );
        assert_eq!(after(time::Duration::minutes(40)), time::Duration::minutes(10));
        assert_eq!(after(time::Duration::hours(30)), time::Duration::hours(6));
        assert_eq!(after(time::Duration::hours(76)), time::Duration::hours(2), "8 h left");
        assert_eq!(after(time::Duration::hours(84)), time::Duration::seconds(5), "expired");
        // A short certificate (the suites' 3 minutes): a minute's wait would outlast it.
        let short_end = rotate_at + time::Duration::seconds(80);
        assert_eq!(
            unanswered_retry(rotate_at + time::Duration::seconds(20), rotate_at, short_end),
            time::Duration::seconds(15)
        );
    }

    #[test]
    fn a_three_day_outage_costs_a_node_about_forty_csrs_and_never_its_identity() {
        // The default 168h certificate, renewed from 84h: each failed renewal files one CSR,
        // the next is tried after unanswered_retry.
        let rotate_at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let not_after = rotate_at + time::Duration::hours(84);
        let end = rotate_at + time::Duration::days(3);
        let (mut now, mut filed, mut last_day) = (rotate_at, 0, 0);
        while now < end {
            filed += 1;
            if end - now < time::Duration::days(1) {
                last_day += 1;
            }
            let next = now + unanswered_retry(now, rotate_at, not_after);
            // Wherever the outage ends, the next try comes while the certificate is valid.
            assert!(next < not_after, "{now} -> {next}");
            now = next;
        }
        assert!((30..=50).contains(&filed), "{filed} CSRs");
        assert!(last_day <= 8, "{last_day} CSRs in the last day");
    }
}
