//! The `tpm/v1` challenge key: 32 random bytes in a Secret of the signer's namespace. Challenge
//! secrets are derived under it (SPEC section 5), so a challenge issued by one replica is
//! checked by any other, after any restart, and readers of CSRs cannot compute it.

use anyhow::{Context, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// The Secret's data key.
pub const KEY: &str = "key";

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
