//! The templates of a Cluster's namespace that name a join token (SPEC section 7, "Join
//! tokens"): a token a KubeadmConfigTemplate, KubeadmControlPlane or KubeadmControlPlaneTemplate
//! names is one Machines created later would join with, so it is never retired. Read only to
//! confirm a retirement (rare: once per token), never cached.

use attestation::join_tokens::TemplateToken;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;

/// Where each kind keeps its join token.
const TEMPLATE_KINDS: [(&str, &str, &str, &str); 3] = [
    (
        "bootstrap.cluster.x-k8s.io",
        "KubeadmConfigTemplate",
        "kubeadmconfigtemplates",
        "/spec/template/spec/joinConfiguration/discovery/bootstrapToken/token",
    ),
    (
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
        "/spec/kubeadmConfigSpec/joinConfiguration/discovery/bootstrapToken/token",
    ),
    (
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlaneTemplate",
        "kubeadmcontrolplanetemplates",
        "/spec/template/spec/kubeadmConfigSpec/joinConfiguration/discovery/bootstrapToken/token",
    ),
];

/// Every template of `namespace` that names a join token, with its token ID (the secret half
/// is never kept). A kind whose CRD is not installed has none; any other error is returned
/// (the retirement waits).
pub(super) async fn token_templates(client: &Client, namespace: &str) -> Result<Vec<TemplateToken>, kube::Error> {
    let mut found = Vec::new();
    for (group, kind, plural, pointer) in TEMPLATE_KINDS {
        let Some(objects) = list_served(client, namespace, group, kind, plural).await? else {
            continue;
        };
        for object in objects {
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            let token_id = value
                .pointer(pointer)
                .and_then(Value::as_str)
                .and_then(|token| token.split_once('.'))
                .map(|(id, _secret)| id.to_owned());
            if let Some(token_id) = token_id {
                let name = object.metadata.name.as_deref().unwrap_or_default();
                found.push(TemplateToken {
                    what: format!("{kind} {name}"),
                    token_id,
                });
            }
        }
    }
    Ok(found)
}

/// The objects of the newest served version of `kind` in `namespace`; `None` when no version
/// is served.
async fn list_served(
    client: &Client,
    namespace: &str,
    group: &str,
    kind: &str,
    plural: &str,
) -> Result<Option<Vec<DynamicObject>>, kube::Error> {
    for version in ["v1beta2", "v1beta1"] {
        let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => return Ok(Some(list.items)),
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}
