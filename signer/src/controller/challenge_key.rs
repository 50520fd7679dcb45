//! The `tpm/v1` challenge key: 32 random bytes in a Secret of the signer's namespace. Challenge
//! secrets and challenge annotation macs are derived under it (SPEC section 5), so a challenge
//! issued by one replica is checked by any other, after any restart, and readers of CSRs can
//! neither compute a secret nor forge a challenge.
//!
//! The key is loaded when a `tpm/v1` CSR first needs it, not at start: a signer whose namespace
//! does not exist (run with a kubeconfig outside the cluster) or that may not create Secrets
//! still serves its `insecure/v1` clusters, and holds `tpm/v1` CSRs with a Warning Event and a
//! log line saying what to do.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use attestation::tpm::verifier::ChallengeKey;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// The Secret's data key.
pub const KEY: &str = "key";

/// Least time between two attempts to load the key after one failed.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Loads the challenge key into the [`ChallengeKey`] the `tpm/v1` verifier holds, on demand.
pub struct ChallengeKeyLoader {
    client: Client,
    namespace: String,
    name: String,
    key: ChallengeKey,
    last_failure: tokio::sync::Mutex<Option<(Instant, String)>>,
}

/// The key could not be loaded (now, or at the last attempt: the apiserver is asked at most
/// once per [`RETRY_AFTER`], not on every CSR).
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
            last_failure: tokio::sync::Mutex::new(None),
        }
    }

    /// The slot the verifier reads.
    pub fn key(&self) -> ChallengeKey {
        self.key.clone()
    }

    /// Loads the key unless it is loaded; at most one attempt per [`RETRY_AFTER`] after a failure.
    pub async fn ensure(&self) -> Result<(), LoadFailure> {
        if self.key.is_loaded() {
            return Ok(());
        }
        let mut last = self.last_failure.lock().await;
        if self.key.is_loaded() {
            return Ok(());
        }
        if let Some((at, message)) = last.as_ref()
            && at.elapsed() < RETRY_AFTER
        {
            return Err(LoadFailure {
                message: message.clone(),
            });
        }
        let loaded = load_or_create(self.client.clone(), &self.namespace, &self.name)
            .await
            .and_then(|bytes| self.key.load(bytes).map_err(anyhow::Error::from));
        match loaded {
            Ok(()) => {
                *last = None;
                Ok(())
            }
            Err(e) => {
                let message = format!(
                    "tpm/v1 CSRs are held: {e:#}. Create namespace {ns} (or point POD_NAMESPACE / \
                     --leader-election-namespace at the signer's namespace) and let the signer get and \
                     create Secrets there (config/rbac); it retries on its own",
                    ns = self.namespace
                );
                tracing::warn!(secret = %format!("{}/{}", self.namespace, self.name), "{message}");
                *last = Some((Instant::now(), message.clone()));
                Err(LoadFailure { message })
            }
        }
    }
}

/// Reads the key, creating the Secret first when it does not exist. Two replicas racing to
/// create it both end up with the one that landed.
pub async fn load_or_create(client: Client, namespace: &str, name: &str) -> Result<Vec<u8>> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        if let Some(secret) = api
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read Secret {namespace}/{name} (the tpm/v1 challenge key)"))?
        {
            return key_of(&secret).with_context(|| format!("Secret {namespace}/{name}"));
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
                return Ok(key);
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

fn key_of(secret: &Secret) -> Result<Vec<u8>> {
    let Some(key) = secret.data.as_ref().and_then(|d| d.get(KEY)) else {
        bail!("has no data key {KEY:?}: delete it to let the signer create a new one (pending challenges then fail)");
    };
    if key.0.len() < attestation::tpm::verifier::MIN_CHALLENGE_KEY {
        bail!(
            "key {KEY:?} has {} bytes; it needs at least {}",
            key.0.len(),
            attestation::tpm::verifier::MIN_CHALLENGE_KEY
        );
    }
    Ok(key.0.clone())
}
