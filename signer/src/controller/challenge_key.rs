//! The `tpm/v1` challenge key: 32 random bytes in a Secret of the signer's namespace. Challenge
//! secrets and challenge annotation macs are derived under it (SPEC section 5), so a challenge
//! issued by one replica is checked by any other, after any restart, and readers of CSRs can
//! neither compute a secret nor forge a challenge.
//!
//! Every replica follows the Secret: it reads it every [`FOLLOW_PERIOD`] (creating it when it is
//! missing, so deleting it rotates the key), and at once (at most once a second) when a
//! challenge verifies under no key it holds. A replaced key keeps verifying the challenges
//! issued under it until they expire ([`attestation::tpm::challenge_key`]), so a rotation fails
//! no pending challenge, on any replica. A signer whose namespace does not exist (run with a
//! kubeconfig outside the cluster) or that may not create Secrets still serves its `insecure/v1`
//! clusters: it holds `tpm/v1` CSRs with a Warning Event and a log line saying what to do, and
//! takes the key within a period of the fix.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attestation::tpm::challenge_key::{ChallengeKey, KeyRead};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// The Secret's data key.
pub const KEY: &str = "key";

/// The key the current one replaced, recorded by the first replica that saw the rotation while
/// holding it, so replicas started after a rotation verify its pending challenges too.
pub const PREVIOUS: &str = "previous";

/// When [`PREVIOUS`] was replaced (RFC 3339): it verifies only challenges issued before.
pub const PREVIOUS_REPLACED_AT: &str = "previousReplacedAt";

/// How often every replica reads the Secret.
pub const FOLLOW_PERIOD: Duration = Duration::from_secs(10);

/// Least time between two reads asked for by CSRs (a first key, a challenge of an unknown key).
const REREAD_AFTER: Duration = Duration::from_secs(1);

/// Reads the challenge key into the [`ChallengeKey`] the `tpm/v1` verifier holds, and keeps
/// reading it.
pub struct ChallengeKeyLoader {
    client: Client,
    namespace: String,
    name: String,
    key: ChallengeKey,
    /// One read at a time; when the last one was made and, if it failed, why.
    reads: tokio::sync::Mutex<LastRead>,
}

#[derive(Default)]
struct LastRead {
    at: Option<Instant>,
    failure: Option<String>,
}

/// The key could not be read (now, or at the last attempt).
#[derive(Debug, Clone)]
pub struct LoadFailure {
    /// What failed and what to do.
    pub message: String,
}

impl ChallengeKeyLoader {
    /// A loader for Secret `namespace/name`.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: ChallengeKey::default(),
            reads: tokio::sync::Mutex::default(),
        }
    }

    /// The slot the verifier reads.
    pub fn key(&self) -> ChallengeKey {
        self.key.clone()
    }

    /// Reads the Secret every [`FOLLOW_PERIOD`] for as long as the process runs.
    pub async fn follow(self: std::sync::Arc<Self>) {
        loop {
            let _ = self.read(Duration::ZERO).await;
            tokio::time::sleep(FOLLOW_PERIOD).await;
        }
    }

    /// Ok once a key is held; otherwise reads it (at most once a second) and says why not.
    pub async fn ensure(&self) -> Result<(), LoadFailure> {
        if self.key.is_loaded() {
            return Ok(());
        }
        self.read(REREAD_AFTER).await
    }

    /// Reads the Secret again, unless it was read in the last second: a challenge verified under
    /// no key held, and the key may have rotated since.
    pub async fn reread(&self) {
        let _ = self.read(REREAD_AFTER).await;
    }

    /// Reads the Secret unless a read was made less than `unless_within` ago (then answers as
    /// that one did).
    async fn read(&self, unless_within: Duration) -> Result<(), LoadFailure> {
        let mut last = self.reads.lock().await;
        if let Some(at) = last.at
            && at.elapsed() < unless_within
        {
            return match &last.failure {
                Some(message) if !self.key.is_loaded() => Err(LoadFailure {
                    message: message.clone(),
                }),
                _ => Ok(()),
            };
        }
        let secret = format!("{}/{}", self.namespace, self.name);
        let read = match load_or_create(self.client.clone(), &self.namespace, &self.name).await {
            Ok(stored) => self.take(stored).await,
            Err(e) => Err(e),
        };
        last.at = Some(Instant::now());
        match read {
            Ok(read) => {
                match read {
                    KeyRead::Loaded => tracing::info!(%secret, "loaded the tpm/v1 challenge key"),
                    KeyRead::Rotated => tracing::warn!(
                        %secret,
                        "the tpm/v1 challenge key changed (its Secret was replaced): new challenges use the new key, \
                         those issued under the previous one are still verified until they expire"
                    ),
                    KeyRead::Unchanged => {}
                }
                if last.failure.take().is_some() && read == KeyRead::Unchanged {
                    tracing::info!(%secret, "the tpm/v1 challenge key can be read again");
                }
                Ok(())
            }
            Err(e) => {
                let held = if self.key.is_loaded() {
                    "the key read before is kept"
                } else {
                    "tpm/v1 CSRs are held"
                };
                let message = format!(
                    "{held}: {e:#}. Create namespace {ns} (or point POD_NAMESPACE / \
                     --leader-election-namespace at the signer's namespace) and let the signer get and \
                     create Secrets there (config/rbac); it retries on its own every {}s",
                    FOLLOW_PERIOD.as_secs(),
                    ns = self.namespace
                );
                // Said once per change, not every period.
                if last.failure.as_deref() != Some(message.as_str()) {
                    tracing::warn!(%secret, "{message}");
                }
                last.failure = Some(message.clone());
                if self.key.is_loaded() {
                    Ok(())
                } else {
                    Err(LoadFailure { message })
                }
            }
        }
    }
}

impl ChallengeKeyLoader {
    /// Takes what the Secret holds into the slot; after a rotation seen while holding the key it
    /// replaced, records that key in the Secret when it records none.
    async fn take(&self, stored: StoredKey) -> Result<KeyRead> {
        let read = self
            .key
            .follow(stored.current.to_vec(), time::OffsetDateTime::now_utc())?;
        if let Some((previous, at)) = &stored.previous {
            self.key.remember(previous.to_vec(), *at)?;
        }
        if read == KeyRead::Rotated
            && stored.previous.is_none()
            && let Some((replaced, at)) = self.key.last_replaced()
        {
            self.record_previous(&stored, &replaced, at).await;
        }
        Ok(read)
    }

    /// Writes `replaced` into the Secret as [`PREVIOUS`], on the version read (a Secret changed
    /// since is left alone: the next read looks again). A failure only means replicas started
    /// later do not verify the challenges issued under it.
    async fn record_previous(&self, stored: &StoredKey, replaced: &[u8], at: time::OffsetDateTime) {
        let when = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": stored.resource_version},
            "data": {
                PREVIOUS: ByteString(replaced.to_vec()),
                PREVIOUS_REPLACED_AT: ByteString(when.into_bytes()),
            },
        });
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        match api
            .patch(
                &self.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => tracing::info!(
                secret = %format!("{}/{}", self.namespace, self.name),
                "recorded the replaced tpm/v1 challenge key beside the new one, for replicas started since"
            ),
            Err(e) => tracing::debug!(error = %e, "did not record the replaced tpm/v1 challenge key"),
        }
    }
}

/// What the key's Secret holds.
pub struct StoredKey {
    /// The key.
    pub current: zeroize::Zeroizing<Vec<u8>>,
    /// The key it replaced, and when.
    pub previous: Option<(zeroize::Zeroizing<Vec<u8>>, time::OffsetDateTime)>,
    /// The Secret's resourceVersion.
    pub resource_version: Option<String>,
}

/// Reads the key, creating the Secret first when it does not exist. Two replicas racing to
/// create it both end up with the one that landed.
pub async fn load_or_create(client: Client, namespace: &str, name: &str) -> Result<StoredKey> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        if let Some(secret) = api
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read Secret {namespace}/{name} (the tpm/v1 challenge key)"))?
        {
            return stored_key(&secret).with_context(|| format!("Secret {namespace}/{name}"));
        }
        let mut key = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut key).map_err(|_| anyhow::anyhow!("no randomness for the challenge key"))?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(
                    [(
                        "app.kubernetes.io/name".to_owned(),
                        "node-attestation-signer".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some([(KEY.to_owned(), ByteString(key.clone()))].into()),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "created the tpm/v1 challenge key");
                return Ok(StoredKey {
                    current: zeroize::Zeroizing::new(key),
                    previous: None,
                    resource_version: None,
                });
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create Secret {namespace}/{name} (the tpm/v1 challenge key)"));
            }
        }
    }
    bail!("Secret {namespace}/{name} keeps appearing and disappearing")
}

fn stored_key(secret: &Secret) -> Result<StoredKey> {
    let previous = secret.data.as_ref().and_then(|d| {
        let key = d.get(PREVIOUS)?;
        let at = std::str::from_utf8(&d.get(PREVIOUS_REPLACED_AT)?.0).ok()?;
        let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
        (key.0.len() >= attestation::tpm::challenge_key::MIN_CHALLENGE_KEY)
            .then(|| (zeroize::Zeroizing::new(key.0.clone()), at))
    });
    Ok(StoredKey {
        current: zeroize::Zeroizing::new(key_of(secret)?),
        previous,
        resource_version: secret.metadata.resource_version.clone(),
    })
}

fn key_of(secret: &Secret) -> Result<Vec<u8>> {
    let Some(key) = secret.data.as_ref().and_then(|d| d.get(KEY)) else {
        bail!("has no data key {KEY:?}: delete it to let the signer create a new one (pending challenges then fail)");
    };
    if key.0.len() < attestation::tpm::challenge_key::MIN_CHALLENGE_KEY {
        bail!(
            "key {KEY:?} has {} bytes; it needs at least {}",
            key.0.len(),
            attestation::tpm::challenge_key::MIN_CHALLENGE_KEY
        );
    }
    Ok(key.0.clone())
}
