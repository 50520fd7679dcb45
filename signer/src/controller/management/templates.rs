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

/// A template (or control plane) of a Cluster whose nodes would run kubelet-authenticator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginTemplate {
    /// The Cluster's name (in the template's namespace).
    pub cluster: String,
    /// `<Kind> <name>`, for the Event.
    pub what: String,
}

/// Whether a bootstrap template's spec runs the plugin: its name anywhere in the spec (the
/// shipped node configuration writes a kubelet kubeconfig whose exec command is
/// `kubelet-authenticator`, and installs it).
pub fn carries_plugin(object: &Value) -> bool {
    object
        .get("spec")
        .is_some_and(|spec| spec.to_string().contains("kubelet-authenticator"))
}

/// The templates among `control_planes` (KubeadmControlPlanes), `config_templates`
/// (KubeadmConfigTemplates) and `deployments` (MachineDeployments) of one namespace that run the
/// plugin, each with its Cluster: a control plane's by its owner reference to the Cluster (set by
/// Cluster API's Cluster controller) or its `cluster.x-k8s.io/cluster-name` label; a config
/// template's by the MachineDeployments whose bootstrap `configRef` names it (`spec.clusterName`).
/// Pure.
pub fn plugin_templates_of(
    control_planes: &[Value],
    config_templates: &[Value],
    deployments: &[Value],
) -> Vec<PluginTemplate> {
    let name = |o: &Value| {
        o.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut found = Vec::new();
    for kcp in control_planes.iter().filter(|o| carries_plugin(o)) {
        let owner = kcp
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|owners| {
                owners
                    .iter()
                    .find(|o| o.get("kind").and_then(Value::as_str) == Some("Cluster"))
            })
            .and_then(|o| o.get("name").and_then(Value::as_str));
        let label = kcp
            .pointer("/metadata/labels")
            .and_then(|l| l.get("cluster.x-k8s.io/cluster-name"))
            .and_then(Value::as_str);
        if let Some(cluster) = owner.or(label) {
            found.push(PluginTemplate {
                cluster: cluster.to_owned(),
                what: format!("KubeadmControlPlane {}", name(kcp)),
            });
        }
    }
    for template in config_templates.iter().filter(|o| carries_plugin(o)) {
        let template_name = name(template);
        for md in deployments {
            let reference = md.pointer("/spec/template/spec/bootstrap/configRef");
            let names_it = reference.is_some_and(|r| {
                r.get("kind").and_then(Value::as_str) == Some("KubeadmConfigTemplate")
                    && r.get("name").and_then(Value::as_str) == Some(template_name.as_str())
            });
            if let (true, Some(cluster)) = (names_it, md.pointer("/spec/clusterName").and_then(Value::as_str)) {
                let entry = PluginTemplate {
                    cluster: cluster.to_owned(),
                    what: format!("KubeadmConfigTemplate {template_name}"),
                };
                if !found.contains(&entry) {
                    found.push(entry);
                }
            }
        }
    }
    found
}

/// [`plugin_templates_of`] `namespace`, listed now. A kind whose CRD is not installed has none.
pub(super) async fn plugin_templates(client: &Client, namespace: &str) -> Result<Vec<PluginTemplate>, kube::Error> {
    let values = |objects: Option<Vec<DynamicObject>>| -> Vec<Value> {
        objects
            .unwrap_or_default()
            .iter()
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
            .collect()
    };
    let control_planes = values(
        list_served(
            client,
            namespace,
            "controlplane.cluster.x-k8s.io",
            "KubeadmControlPlane",
            "kubeadmcontrolplanes",
        )
        .await?,
    );
    let config_templates = values(
        list_served(
            client,
            namespace,
            "bootstrap.cluster.x-k8s.io",
            "KubeadmConfigTemplate",
            "kubeadmconfigtemplates",
        )
        .await?,
    );
    let deployments = if config_templates.iter().any(carries_plugin) {
        values(
            list_served(
                client,
                namespace,
                "cluster.x-k8s.io",
                "MachineDeployment",
                "machinedeployments",
            )
            .await?,
        )
    } else {
        Vec::new()
    };
    Ok(plugin_templates_of(&control_planes, &config_templates, &deployments))
}

#[cfg(test)]
mod plugin_template_tests {
    use serde_json::json;

    use super::*;

    const PLUGIN_KUBECONFIG: &str =
        "users:\n- name: default-auth\n  user:\n    exec:\n      command: /usr/local/bin/kubelet-authenticator\n";

    #[test]
    fn templates_running_the_plugin_are_found_with_their_clusters() {
        let kcp = json!({"metadata": {"name": "prod-cp", "ownerReferences": [{"kind": "Cluster", "name": "prod"}]},
            "spec": {"kubeadmConfigSpec": {"files": [{"path": "/etc/kubernetes/kubelet-authenticator.conf", "content": PLUGIN_KUBECONFIG}]}}});
        let labelled = json!({"metadata": {"name": "dev-cp", "labels": {"cluster.x-k8s.io/cluster-name": "dev"}},
            "spec": {"kubeadmConfigSpec": {"files": [{"content": PLUGIN_KUBECONFIG}]}}});
        let stock = json!({"metadata": {"name": "old-cp", "ownerReferences": [{"kind": "Cluster", "name": "old"}]},
            "spec": {"kubeadmConfigSpec": {"files": []}}});
        let workers = json!({"metadata": {"name": "workers"}, "spec": {"template": {"spec": {"files": [{"content": PLUGIN_KUBECONFIG}]}}}});
        let md = |cluster: &str, template: &str| {
            json!({"spec": {"clusterName": cluster,
            "template": {"spec": {"bootstrap": {"configRef": {"kind": "KubeadmConfigTemplate", "name": template}}}}}})
        };
        let found = plugin_templates_of(
            &[kcp, labelled, stock],
            &[workers],
            &[
                md("prod", "workers"),
                md("prod", "workers"),
                md("qa", "workers"),
                md("qa", "other"),
            ],
        );
        let pairs: Vec<(&str, &str)> = found.iter().map(|t| (t.cluster.as_str(), t.what.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("prod", "KubeadmControlPlane prod-cp"),
                ("dev", "KubeadmControlPlane dev-cp"),
                ("prod", "KubeadmConfigTemplate workers"),
                ("qa", "KubeadmConfigTemplate workers"),
            ]
        );
        assert!(
            !carries_plugin(&json!({"metadata": {"name": "kubelet-authenticator"}})),
            "the spec, not the name"
        );
    }
}
