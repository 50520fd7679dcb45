//! The signer's workload-side RBAC, put in place with the Cluster API admin kubeconfig: the
//! objects of `config/workload/workload-cluster.yaml`, built into the binary so that what the
//! signer applies is what the repository ships, server-side applied under the signer's own
//! field manager (SPEC section 7, no per-cluster setup).
//!
//! Applied with `force`: these objects are the signer's, and an earlier `kubectl apply` of the
//! same file (before the signer did it itself) must not leave a conflict. An object a later
//! release no longer ships is left in place (the apply cannot know it was ours): the release
//! notes name it.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};

/// The file, as the repository ships it (`kubectl apply -k config/workload` applies the same).
const WORKLOAD_RBAC: &str = include_str!("../../../../config/workload/workload-cluster.yaml");

/// The field manager of every object the signer applies.
pub const FIELD_MANAGER: &str = "node-attestation-signer";

/// The kinds of `admissionregistration.k8s.io/v1` an older apiserver (before Kubernetes 1.30)
/// does not serve: without them the join-token write guard is missing, not the signer's rights.
const OPTIONAL_GROUP: &str = "admissionregistration.k8s.io";

/// One object to apply.
#[derive(Debug, Clone)]
pub struct RbacObject {
    resource: ApiResource,
    object: DynamicObject,
}

impl RbacObject {
    /// `Kind/name` (with the namespace when it has one), for messages.
    pub fn describe(&self) -> String {
        let name = self.object.metadata.name.as_deref().unwrap_or_default();
        match &self.object.metadata.namespace {
            Some(ns) => format!("{} {ns}/{name}", self.resource.kind),
            None => format!("{} {name}", self.resource.kind),
        }
    }
}

/// Why the RBAC file does not parse: a build of the signer with a broken file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config/workload/workload-cluster.yaml as built into the signer is broken: {0}")]
pub struct BrokenRbacFile(String);

/// The objects to apply, in the file's order (roles before their bindings).
pub fn objects() -> Result<Vec<RbacObject>, BrokenRbacFile> {
    use serde::Deserialize;
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(WORKLOAD_RBAC) {
        let value = serde_json::Value::deserialize(document).map_err(|e| BrokenRbacFile(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(value).map_err(|e| BrokenRbacFile(e.to_string()))?;
        let types = object
            .types
            .clone()
            .ok_or_else(|| BrokenRbacFile("an object without apiVersion and kind".into()))?;
        let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
        if object.metadata.name.is_none() {
            return Err(BrokenRbacFile(format!("a {} without a name", types.kind)));
        }
        objects.push(RbacObject { resource, object });
    }
    Ok(objects)
}

/// What one apply of the whole set came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Every object is in place.
    All,
    /// Every object but those of an API the apiserver does not serve (named).
    AllServed { missing: Vec<String> },
}

/// Why the RBAC is not in place.
#[derive(Debug, thiserror::Error)]
pub enum ApplyRbacError {
    /// The apiserver refused the admin kubeconfig (401, 403) or the object (4xx): trying again
    /// changes nothing until the Secret does.
    #[error("{object}: the workload apiserver refused it ({code}): {message}")]
    Refused {
        /// The object.
        object: String,
        /// HTTP status.
        code: u16,
        /// The apiserver's message.
        message: String,
    },
    /// The apiserver did not answer, or answered 429/5xx: worth trying again.
    #[error("{object}: {error}")]
    Unreachable {
        /// The object.
        object: String,
        /// What went wrong.
        error: kube::Error,
    },
}

/// Server-side applies `objects` with `admin`, in order; stops at the first failure.
pub async fn apply(admin: &Client, objects: &[RbacObject]) -> Result<Applied, ApplyRbacError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut missing = Vec::new();
    for item in objects {
        let name = item.object.metadata.name.as_deref().unwrap_or_default();
        let api: Api<DynamicObject> = match &item.object.metadata.namespace {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &item.resource),
            None => Api::all_with(admin.clone(), &item.resource),
        };
        match api.patch(name, &params, &Patch::Apply(&item.object)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 && item.resource.group == OPTIONAL_GROUP => {
                missing.push(item.describe());
            }
            Err(kube::Error::Api(status)) if (400..500).contains(&status.code) && status.code != 429 => {
                return Err(ApplyRbacError::Refused {
                    object: item.describe(),
                    code: status.code,
                    message: status.message.clone(),
                });
            }
            Err(error) => {
                return Err(ApplyRbacError::Unreachable {
                    object: item.describe(),
                    error,
                });
            }
        }
    }
    Ok(if missing.is_empty() {
        Applied::All
    } else {
        Applied::AllServed { missing }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_file_is_the_signers_least_privilege_for_its_own_user() {
        let objects = objects().unwrap();
        let described: Vec<String> = objects.iter().map(RbacObject::describe).collect();
        assert_eq!(
            described,
            [
                "ClusterRole node-attestation-signer-workload",
                "ClusterRoleBinding node-attestation-signer-workload",
                "Role kube-system/node-attestation-signer-join-tokens",
                "RoleBinding kube-system/node-attestation-signer-join-tokens",
                "ValidatingAdmissionPolicy node-attestation-signer-join-tokens",
                "ValidatingAdmissionPolicyBinding node-attestation-signer-join-tokens",
                "Role kube-system/node-attestation-signer-revocation",
                "RoleBinding kube-system/node-attestation-signer-revocation",
                "ValidatingAdmissionPolicy node-attestation-signer-configmaps",
                "ValidatingAdmissionPolicyBinding node-attestation-signer-configmaps",
                "ValidatingAdmissionPolicy node-attestation-revoked-certificates",
                "ValidatingAdmissionPolicyBinding node-attestation-revoked-certificates",
            ]
        );
        assert_eq!(objects[4].resource.plural, "validatingadmissionpolicies");
        for binding in objects.iter().filter(|o| o.resource.kind.ends_with("RoleBinding")) {
            let subjects = &binding.object.data["subjects"];
            assert_eq!(
                subjects,
                &serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": super::super::own_identity::USER}]),
                "{}: bound to the signer's own user, nobody else",
                binding.describe()
            );
        }
    }
}
