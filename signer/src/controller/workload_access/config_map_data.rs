//! Keys of a workload cluster's `kube-system` ConfigMap set and removed in one merge patch,
//! the ConfigMap created when missing: how the revocation record and list are written, by the
//! running signer and by `node-attestation-signer revoke` alike. A merge patch touches only the
//! keys it names, so writers under different field managers (the signer's duty, an operator's
//! command, the RBAC file's own apply of nothing in `data`) never remove each other's entries.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// The namespace of the ConfigMaps written here.
pub const NAMESPACE: &str = "kube-system";

/// Sets `add` and removes `remove` in ConfigMap `kube-system/name`'s data under
/// `field_manager`, creating the ConfigMap (with `add`) when it is missing; its new
/// resourceVersion. With
/// `resource_version`, only if the ConfigMap is still at that version (409 otherwise): for a
/// value rewritten from what was read.
pub async fn merge(
    client: &Client,
    name: &str,
    add: &BTreeMap<String, String>,
    remove: &[String],
    field_manager: &str,
    resource_version: Option<&str>,
) -> Result<Option<String>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let mut data = serde_json::Map::new();
    for (k, v) in add {
        data.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    for k in remove {
        data.insert(k.clone(), serde_json::Value::Null);
    }
    let mut patch = serde_json::json!({ "data": data });
    if let Some(version) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    let params = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    let version = |c: ConfigMap| c.metadata.resource_version;
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(written) => Ok(version(written)),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let created = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(NAMESPACE.to_owned()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/managed-by".to_owned(),
                        "node-attestation-signer".to_owned(),
                    )])),
                    ..ObjectMeta::default()
                },
                data: Some(add.clone()),
                ..ConfigMap::default()
            };
            let post = PostParams {
                field_manager: Some(field_manager.to_owned()),
                ..PostParams::default()
            };
            match api.create(&post, &created).await {
                Ok(written) => Ok(version(written)),
                // Created meanwhile (another pass, another replica): patch it.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.patch(name, &params, &Patch::Merge(&patch)).await.map(version)
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// ConfigMap `kube-system/name`'s data and resourceVersion (`None`: there is no such ConfigMap).
pub async fn read(client: &Client, name: &str) -> Result<Option<(BTreeMap<String, String>, String)>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(api.get_opt(name).await?.map(|c| {
        let version = c.metadata.resource_version.unwrap_or_default();
        (c.data.unwrap_or_default(), version)
    }))
}
