//! What every view reads the same way: an object's kind, API version and metadata ([`Meta`]),
//! a string at a path ([`str_at`]), and the bootstrap readiness Machines and MachinePools both
//! report ([`bootstrap_ready`]). A view checks the object is the kind and version it reads here
//! first, so each fails with the same [`ObjectError`].

use serde_json::Value;

use super::{ApiVersion, ObjectError};
use crate::names::ANNOTATION_EK_PIN;

/// The string at `path` (object keys), if there is one.
pub(super) fn str_at<'a>(object: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(object, |v, key| v.get(key))?.as_str()
}

/// Bootstrap data is ready by any of the signals the versions carry: v1beta2's
/// `status.initialization` and conditions, v1beta1's `status.bootstrapReady` and its
/// `status.v1beta2.conditions` (what Cluster API's conversion fills in for v1beta1 readers).
pub(super) fn bootstrap_ready(object: &Value) -> bool {
    let true_at = |pointer: &str| object.pointer(pointer).and_then(Value::as_bool) == Some(true);
    let condition = |pointer: &str| {
        matches!(object.pointer(pointer), Some(Value::Array(conditions)) if conditions.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("BootstrapConfigReady")
                && c.get("status").and_then(Value::as_str) == Some("True")
        }))
    };
    true_at("/status/initialization/bootstrapDataSecretCreated")
        || true_at("/status/bootstrapReady")
        || condition("/status/conditions")
        || condition("/status/v1beta2/conditions")
}

/// An object's kind-checked metadata, as every view reads it.
pub(super) struct Meta<'a> {
    object: &'a Value,
    api_version: String,
    /// metadata.name
    pub(super) name: String,
    /// metadata.namespace (`default` when absent)
    pub(super) namespace: String,
    /// metadata.uid (empty when absent)
    pub(super) uid: String,
    /// metadata.resourceVersion
    pub(super) resource_version: Option<String>,
    /// metadata.deletionTimestamp is set.
    pub(super) deleting: bool,
}

impl<'a> Meta<'a> {
    pub(super) fn read(object: &'a Value, kind: &'static str, versions: &[&str]) -> Result<Self, ObjectError> {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let object_kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        if object_kind != kind || !versions.contains(&api_version) {
            return Err(ObjectError::WrongKind {
                expected: kind,
                api_version: crate::identity::truncate(api_version, 64),
                kind: crate::identity::truncate(object_kind, 64),
            });
        }
        let name = str_at(object, &["metadata", "name"]).ok_or(ObjectError::Field {
            kind,
            name: String::new(),
            field: "metadata.name",
            expected: "string",
        })?;
        Ok(Self {
            object,
            api_version: api_version.to_owned(),
            name: name.to_owned(),
            namespace: str_at(object, &["metadata", "namespace"])
                .unwrap_or("default")
                .to_owned(),
            uid: str_at(object, &["metadata", "uid"]).unwrap_or_default().to_owned(),
            resource_version: str_at(object, &["metadata", "resourceVersion"]).map(str::to_owned),
            deleting: object
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()),
        })
    }

    pub(super) fn capi_version(&self) -> ApiVersion {
        if self.api_version.ends_with("/v1beta1") {
            ApiVersion::V1beta1
        } else {
            ApiVersion::V1beta2
        }
    }

    pub(super) fn annotation(&self, key: &str) -> Option<&'a str> {
        self.object.pointer("/metadata/annotations")?.get(key)?.as_str()
    }

    pub(super) fn label(&self, key: &str) -> Option<&'a str> {
        self.object.pointer("/metadata/labels")?.get(key)?.as_str()
    }

    pub(super) fn ek_pins(&self) -> Vec<String> {
        self.annotation(ANNOTATION_EK_PIN)
            .map(|list| {
                list.split(',')
                    .map(|p| p.trim().to_ascii_lowercase())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn required_str(
        &self,
        object: &Value,
        kind: &'static str,
        path: &[&str],
        field: &'static str,
    ) -> Result<String, ObjectError> {
        str_at(object, path)
            .map(str::to_owned)
            .ok_or_else(|| ObjectError::Field {
                kind,
                name: self.name.clone(),
                field,
                expected: "string",
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::machine::MachineView;

    #[test]
    fn wrong_kinds_and_missing_fields_are_clear_errors() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        assert!(matches!(
            MachineView::from_object(&node),
            Err(ObjectError::WrongKind { .. })
        ));
        let no_cluster =
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"}, "spec": {}});
        assert!(matches!(
            MachineView::from_object(&no_cluster),
            Err(ObjectError::Field {
                field: "spec.clusterName",
                ..
            })
        ));
        assert!(matches!(
            MachineView::from_object(&json!(null)),
            Err(ObjectError::WrongKind { .. })
        ));
    }
}
