//! A served Cluster's Secrets: `<cluster>-kubeconfig`, `<cluster>-ca` and, when an operator
//! wrote one, `<cluster>-node-attestation-kubeconfig`, read when they may have changed (see the
//! fleet's documentation), compared by digest before anything is parsed, and turned into the
//! worker's way into its workload cluster ([`WorkloadAccess`]) and CA ([`Credentials`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::ca::ClusterCa;
use attestation::machine::ClusterView;
use zeroize::Zeroizing;

use crate::controller::management::ApplyError;
use crate::controller::workload::Shared;
use crate::controller::workload_access::{self, WorkloadAccess, own_identity};

/// What a Cluster's Secrets gave.
pub(super) struct Credentials {
    /// `None`: the running worker's client is kept (its own identity through a CA gap, see
    /// [`SecretReads::read_own`]).
    pub(super) access: Option<WorkloadAccess>,
    /// The CA, or why it is unusable. With an operator's kubeconfig a missing CA is a transient
    /// gap (SPEC section 3): the worker runs, leaves approvable CSRs pending, and denies them
    /// `Expired` after `--csr-max-age`. The signer's own identity needs the CA, so without an
    /// operator's kubeconfig a missing CA leaves the Cluster unserved (`SecretsInvalid`).
    pub(super) ca: Result<Arc<ClusterCa>, String>,
    /// SHA-256 over which kubeconfig is used, its bytes and the CA pair: a change restarts the
    /// worker.
    pub(super) digest: [u8; 32],
}

/// Secrets read at once during one pass.
const SECRET_READS_AT_ONCE: usize = 16;

/// What was last read of an opted-in Cluster's Secrets.
pub(super) struct Known {
    /// The Cluster as it was then: a change reads again at once.
    pub(super) view: ClusterView,
    /// When to read again.
    pub(super) due: Instant,
    /// SHA-256 of its CA certificate, for the shared-CA refusal.
    pub(super) ca_fingerprint: Option<[u8; 32]>,
    /// Read as this replica's own: the digest of the Secrets its worker runs on, or why they are
    /// unusable. `None` when read only for the CA comparison.
    pub(super) own: Option<Result<[u8; 32], String>>,
}

/// One read of a served Cluster's Secrets.
enum OwnRead {
    /// The same bytes as the running worker's.
    Unchanged { digest: [u8; 32] },
    /// New or changed: a worker to start on them.
    Fresh {
        credentials: Box<Credentials>,
        ca_fingerprint: Option<[u8; 32]>,
    },
    /// Unusable (`SecretsInvalid`).
    Invalid {
        why: String,
        ca_fingerprint: Option<[u8; 32]>,
    },
    /// The management apiserver did not answer: nothing is known of the Secrets now, so a
    /// running worker keeps the ones it runs on (its approvals need the management cluster
    /// anyway, and its denials are confirmed there: `management::fresh`).
    Unreachable { why: String },
}

/// A CA fingerprint read for the shared-CA comparison.
type CaRead = Result<Option<[u8; 32]>, SecretError>;

/// Why a Secret could not be had.
enum SecretError {
    /// It is not there, or not readable by the signer: the Secrets are unusable.
    Unusable(String),
    /// The apiserver did not answer (connection, timeout, 429, 5xx): try again soon.
    Unreachable(String),
}

/// When a Cluster read now is read again: `period` after now, less up to a quarter chosen by its
/// UID, so that Clusters read together at start drift apart.
fn next_read(now: Instant, period: Duration, uid: &str) -> Instant {
    let spread = super::shard::weight("secret-resync", uid) as f64 / u64::MAX as f64;
    now + period.mul_f64(0.75 + 0.25 * spread)
}

/// What was last read of each opted-in Cluster's Secrets, and the reads.
pub(super) struct SecretReads {
    shared: Arc<Shared>,
    /// By Cluster key.
    pub(super) known: HashMap<String, Known>,
}

impl SecretReads {
    /// Nothing read yet.
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            known: HashMap::new(),
        }
    }

    /// Reads the Secrets that are due (see the module's documentation) and records what they
    /// gave; returns the served Clusters (`mine`) to start a worker for (new, or Secrets
    /// changed). Of `theirs` (other replicas' Clusters, and this replica's paused ones) only the
    /// CA is read, for the shared-CA comparison.
    pub(super) async fn read_due(
        &mut self,
        mine: &[ClusterView],
        theirs: &[ClusterView],
        now: Instant,
        running: impl Fn(&str) -> Option<[u8; 32]> + Sync,
    ) -> BTreeMap<String, (ClusterView, Credentials)> {
        use futures::StreamExt;
        let due = |cluster: &ClusterView, own: bool| {
            let k = cluster.key();
            match self.known.get(&k) {
                None => true,
                Some(known) => {
                    known.view != *cluster
                        || known.own.is_some() != own
                        || now >= known.due
                        || (own && running(&k).is_none())
                }
            }
        };
        let own_due: Vec<ClusterView> = mine.iter().filter(|c| due(c, true)).cloned().collect();
        // CAs of Clusters another replica serves matter only while this one serves some.
        let others_due: Vec<ClusterView> = if mine.is_empty() {
            Vec::new()
        } else {
            theirs.iter().filter(|c| due(c, false)).cloned().collect()
        };
        let (this, running) = (&*self, &running);
        let own_reads: Vec<(ClusterView, OwnRead)> = futures::stream::iter(own_due)
            .map(|cluster| async move {
                let running = running(&cluster.key());
                let read = this.read_own(&cluster, running).await;
                (cluster, read)
            })
            .buffer_unordered(SECRET_READS_AT_ONCE)
            .collect()
            .await;
        let other_reads: Vec<(ClusterView, CaRead)> = futures::stream::iter(others_due)
            .map(|cluster| async move {
                let fingerprint = this.read_ca_fingerprint(&cluster).await;
                (cluster, fingerprint)
            })
            .buffer_unordered(SECRET_READS_AT_ONCE)
            .collect()
            .await;

        let settings = &self.shared.settings;
        let mut fresh = BTreeMap::new();
        for (cluster, read) in own_reads {
            let k = cluster.key();
            let previous = self.known.get(&k).and_then(|known| known.ca_fingerprint);
            let (ca_fingerprint, own, due) = match read {
                OwnRead::Unchanged { digest } => (
                    previous,
                    Ok(digest),
                    next_read(now, settings.secret_resync, &cluster.uid),
                ),
                OwnRead::Fresh {
                    credentials,
                    ca_fingerprint,
                } => {
                    let digest = credentials.digest;
                    fresh.insert(k.clone(), (cluster.clone(), *credentials));
                    (
                        ca_fingerprint,
                        Ok(digest),
                        next_read(now, settings.secret_resync, &cluster.uid),
                    )
                }
                OwnRead::Invalid { why, ca_fingerprint } => (ca_fingerprint, Err(why), now + settings.resync),
                OwnRead::Unreachable { why } => match running(&k) {
                    Some(digest) => {
                        tracing::warn!(cluster = %k, "{why}; its worker keeps the Secrets it runs on");
                        (previous, Ok(digest), now + settings.resync)
                    }
                    None => (previous, Err(why), now + settings.resync),
                },
            };
            self.known.insert(
                k,
                Known {
                    view: cluster,
                    due,
                    ca_fingerprint,
                    own: Some(own),
                },
            );
        }
        for (cluster, ca_fingerprint) in other_reads {
            let (ca_fingerprint, due) = match ca_fingerprint {
                Ok(fingerprint) => (fingerprint, next_read(now, settings.secret_resync, &cluster.uid)),
                // Not answered: what was known stands until the next read.
                Err(_) => (
                    self.known.get(&cluster.key()).and_then(|known| known.ca_fingerprint),
                    now + settings.resync,
                ),
            };
            self.known.insert(
                cluster.key(),
                Known {
                    view: cluster,
                    due,
                    ca_fingerprint,
                    own: None,
                },
            );
        }
        fresh
    }

    /// A Secret's data, or why it cannot be had.
    async fn secret(
        &self,
        cluster: &ClusterView,
        name: &str,
    ) -> Result<std::collections::BTreeMap<String, k8s_openapi::ByteString>, SecretError> {
        self.secret_if_any(cluster, name)
            .await?
            .ok_or_else(|| SecretError::Unusable(format!("Secret {name} is missing")))
    }

    /// A Secret's data, `None` when it does not exist (a Secret that is optional).
    async fn secret_if_any(
        &self,
        cluster: &ClusterView,
        name: &str,
    ) -> Result<Option<std::collections::BTreeMap<String, k8s_openapi::ByteString>>, SecretError> {
        self.shared
            .management
            .secret(&cluster.namespace, name)
            .await
            .map_err(|e| {
                let why = format!("cannot read Secret {name}: {e}");
                match ApplyError::from_kube(e) {
                    ApplyError::Overloaded(_) => SecretError::Unreachable(why),
                    _ => SecretError::Unusable(why),
                }
            })
    }

    /// The fingerprint of the CA certificate in `<cluster>-ca`, `None` when there is none.
    async fn read_ca_fingerprint(&self, cluster: &ClusterView) -> Result<Option<[u8; 32]>, SecretError> {
        let data = match self.secret(cluster, &format!("{}-ca", cluster.name)).await {
            Ok(data) => data,
            Err(SecretError::Unusable(_)) => return Ok(None),
            Err(unreachable) => return Err(unreachable),
        };
        Ok(data
            .get("tls.crt")
            .and_then(|c| ClusterCa::certificate_fingerprint(&c.0).ok()))
    }

    /// Reads a served Cluster's Secrets (`<cluster>-node-attestation-kubeconfig` if any,
    /// `<cluster>-kubeconfig`, `<cluster>-ca`); parses them and builds the clients only when
    /// they differ from what the running worker (`running`, its digest) was started on.
    async fn read_own(&self, cluster: &ClusterView, running: Option<[u8; 32]>) -> OwnRead {
        let operator_name = workload_access::operator_kubeconfig_secret(&cluster.name);
        let kubeconfig_name = format!("{}-kubeconfig", cluster.name);
        let ca_name = format!("{}-ca", cluster.name);
        let (operator, kubeconfig, ca_data) = tokio::join!(
            self.secret_if_any(cluster, &operator_name),
            self.secret(cluster, &kubeconfig_name),
            self.secret(cluster, &ca_name)
        );
        let unreachable = |read: Option<&SecretError>| match read {
            Some(SecretError::Unreachable(why)) => Some(why.clone()),
            _ => None,
        };
        if let Some(why) = unreachable(operator.as_ref().err())
            .or_else(|| unreachable(kubeconfig.as_ref().err()))
            .or_else(|| unreachable(ca_data.as_ref().err()))
        {
            return OwnRead::Unreachable { why };
        }
        let field = |data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>, name: &str| {
            Zeroizing::new(data.get(name).map(|b| b.0.clone()).unwrap_or_default())
        };
        let ca_data = ca_data.unwrap_or_default();
        let (ca_cert, ca_key) = (field(&ca_data, "tls.crt"), field(&ca_data, "tls.key"));
        let ca_fingerprint = ClusterCa::certificate_fingerprint(&ca_cert).ok();
        let invalid = |why: String| OwnRead::Invalid { why, ca_fingerprint };
        // The operator's kubeconfig wins; without one, Cluster API's.
        let (issued_identity, used_name, data) = match operator {
            Ok(Some(data)) => (false, operator_name.clone(), data),
            Ok(None) => match kubeconfig {
                Ok(data) => (true, kubeconfig_name, data),
                Err(SecretError::Unusable(why) | SecretError::Unreachable(why)) => return invalid(why),
            },
            Err(SecretError::Unusable(why) | SecretError::Unreachable(why)) => return invalid(why),
        };
        let Some(kubeconfig) = data.get("value").map(|value| Zeroizing::new(value.0.clone())) else {
            return invalid(format!("Secret {used_name} (key value) is missing"));
        };
        let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        hasher.update(&[u8::from(issued_identity)]);
        for part in [kubeconfig.as_slice(), &ca_cert, &ca_key] {
            hasher.update(&(part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let mut digest = [0u8; 32];
        digest.copy_from_slice(hasher.finish().as_ref());
        if running == Some(digest) {
            return OwnRead::Unchanged { digest };
        }
        let ca = match (ca_cert.is_empty(), ca_key.is_empty()) {
            (true, _) | (_, true) => Err(format!(
                "Secret {ca_name} (keys tls.crt, tls.key) is missing or incomplete"
            )),
            _ => ClusterCa::from_pem(&ca_cert, &ca_key)
                .map(Arc::new)
                .map_err(|e| format!("Secret {ca_name}: {e}")),
        };
        let settings = &self.shared.settings;
        let config = match workload_access::kubeconfig(&used_name, &kubeconfig, settings.request_timeout).await {
            Ok(config) => config,
            Err(why) => return invalid(why),
        };
        let access = if issued_identity {
            let ca = match &ca {
                Ok(ca) => Arc::clone(ca),
                // A CA gap (SPEC section 3) with a worker running: it keeps the identity it has
                // (its transport renews it from the CA it loaded), so CSRs still wait and are
                // denied `Expired` after `--csr-max-age`, as with an operator's kubeconfig.
                Err(_) if running.is_some() => {
                    return OwnRead::Fresh {
                        credentials: Box::new(Credentials {
                            access: None,
                            ca,
                            digest,
                        }),
                        ca_fingerprint,
                    };
                }
                Err(why) => {
                    return invalid(format!(
                        "{why}: the signer issues its own identity in the workload cluster from it (or give it a kubeconfig of your own in Secret {operator_name})"
                    ));
                }
            };
            let admin = match crate::controller::client::build(config.clone()) {
                Ok(admin) => admin,
                Err(e) => return invalid(format!("Secret {used_name}: {e}")),
            };
            let lifetime = settings.workload_certificate_duration;
            match own_identity::client(&config, ca, lifetime, self.shared.metrics.clone()) {
                Ok(client) => WorkloadAccess::OwnIdentity { client, admin },
                Err(e) => return invalid(format!("Secret {used_name}: {e}")),
            }
        } else {
            match crate::controller::client::build(config) {
                Ok(client) => WorkloadAccess::Given { client },
                Err(e) => return invalid(format!("Secret {used_name}: {e}")),
            }
        };
        let access = Some(access);
        OwnRead::Fresh {
            credentials: Box::new(Credentials { access, ca, digest }),
            ca_fingerprint,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_reads_spread_over_the_last_quarter_of_the_period() {
        let now = Instant::now();
        let period = Duration::from_secs(300);
        let delays: Vec<Duration> = (0..1000)
            .map(|i| next_read(now, period, &format!("uid-{i}")) - now)
            .collect();
        assert!(delays.iter().all(|d| *d >= period.mul_f64(0.75) && *d <= period));
        let early = delays.iter().filter(|d| **d < period.mul_f64(0.875)).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 in the first half of the spread"
        );
        assert_eq!(
            next_read(now, period, "a"),
            next_read(now, period, "a"),
            "the same on every pass"
        );
    }
}
