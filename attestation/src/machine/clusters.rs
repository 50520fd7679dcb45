//! What the signer reads of a `cluster.x-k8s.io` Cluster ([`ClusterView`]), in either version:
//! whether it opted in, which attestors it allows, its `cluster.x-k8s.io/kubelet-*` settings,
//! its `tpm/v1` boot policy, and whether it is [`Paused`], read as Cluster API's own controllers
//! read it. Every decision for a Cluster's CSRs starts from these.

use serde_json::Value;

use super::ObjectError;
use super::object::Meta;
use crate::names::{ANNOTATION_ALLOWED_ATTESTORS, ANNOTATION_OPT_IN, ANNOTATION_PAUSED};

/// What the signer reads of a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// metadata.name
    pub name: String,
    /// metadata.namespace
    pub namespace: String,
    /// metadata.uid
    pub uid: String,
    /// The opt-in annotation is `"true"`.
    pub opted_in: bool,
    /// Allowed attestor providers; `["tpm"]` when the annotation is absent.
    pub allowed_attestors: Vec<String>,
    /// The Cluster's `cluster.x-k8s.io/kubelet-*` annotations (a provider's own settings, such
    /// as the cloud allow-lists, read by that provider's verifier); no other annotation is
    /// kept (the pause annotation is read into [`ClusterView::paused`]).
    pub kubelet_annotations: std::collections::BTreeMap<String, String>,
    /// How the Cluster is paused, `None` when it is not: the signer then decides and writes
    /// nothing for it (SPEC section 7, "Paused Clusters").
    pub paused: Option<Paused>,
    /// Since when it is paused, as Cluster API's own controllers recorded it: the
    /// `lastTransitionTime` of its `Paused` condition while that is `True` (Cluster API sets it
    /// on the Cluster: `EnsurePausedCondition` in `util/paused/paused.go`; v1beta1 Clusters keep
    /// it in `status.v1beta2.conditions`). `None` when not paused, or paused before a Cluster
    /// API that writes the condition saw it: the fleet then counts from when it first saw it.
    pub paused_since: Option<time::OffsetDateTime>,
    /// The `tpm/v1` boot policy (SPEC section 5, revision 5): as the annotation names it
    /// (unresolved), until the signer reads the ConfigMap (or its default) for a decision.
    pub boot_policy: crate::tpm::boot_policy::PolicyState,
}

/// How a Cluster is paused, read as Cluster API's own controllers read it
/// (`annotations.IsPaused` in sigs.k8s.io/cluster-api `util/annotations`): `spec.paused` is
/// true (a `bool` in v1beta1, a `*bool` in v1beta2: both `true` in JSON), or the
/// `cluster.x-k8s.io/paused` annotation is present, whatever its value (`clusterctl move` and
/// operators set it empty). Reading it as they do matters: `clusterctl move` pauses the source
/// Cluster and unpauses its copy by these two, and a signer that read them otherwise would
/// write claims or certificates for a Cluster in mid-move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// `spec.paused: true`.
    Spec,
    /// The `cluster.x-k8s.io/paused` annotation is present.
    Annotation,
    /// Both.
    SpecAndAnnotation,
}

impl Paused {
    /// How `object` (a Cluster of either version) is paused, `None` when it is not.
    pub fn of(object: &Value) -> Option<Self> {
        let spec = object.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
        let annotation = object
            .pointer("/metadata/annotations")
            .and_then(|annotations| annotations.get(ANNOTATION_PAUSED))
            .is_some();
        match (spec, annotation) {
            (true, true) => Some(Self::SpecAndAnnotation),
            (true, false) => Some(Self::Spec),
            (false, true) => Some(Self::Annotation),
            (false, false) => None,
        }
    }
}

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Spec => write!(f, "spec.paused is true"),
            Self::Annotation => write!(f, "it carries the {ANNOTATION_PAUSED} annotation"),
            Self::SpecAndAnnotation => write!(
                f,
                "spec.paused is true and it carries the {ANNOTATION_PAUSED} annotation"
            ),
        }
    }
}

impl ClusterView {
    /// `<namespace>/<name>`: how the signer names a Cluster in its caches, logs and metrics.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// A Cluster with only a name and namespace (offline use); opted in, allowing `allowed`.
    pub fn named(name: &str, namespace: &str, allowed: &[&str]) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            uid: String::new(),
            opted_in: true,
            allowed_attestors: allowed.iter().map(|s| (*s).to_owned()).collect(),
            kubelet_annotations: std::collections::BTreeMap::new(),
            boot_policy: crate::tpm::boot_policy::PolicyState::None,
            paused: None,
            paused_since: None,
        }
    }

    /// Whether the Cluster is paused (see [`Paused`]).
    pub fn is_paused(&self) -> bool {
        self.paused.is_some()
    }

    /// The same Cluster with one more `cluster.x-k8s.io/kubelet-*` annotation (offline use and
    /// tests).
    pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
        if key == crate::names::ANNOTATION_TPM_BOOT_POLICY {
            self.boot_policy = crate::tpm::boot_policy::PolicyState::named(&self.namespace, Some(value));
        }
        self.kubelet_annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// A `cluster.x-k8s.io/kubelet-*` annotation of the Cluster.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.kubelet_annotations.get(key).map(String::as_str)
    }

    /// Reads a `cluster.x-k8s.io` Cluster.
    pub fn from_object(object: &Value) -> Result<Self, ObjectError> {
        let meta = Meta::read(
            object,
            "Cluster",
            &["cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1"],
        )?;
        let allowed_attestors = match meta.annotation(ANNOTATION_ALLOWED_ATTESTORS) {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            None => vec!["tpm".to_owned()],
        };
        let kubelet_annotations = object
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|all| {
                all.iter()
                    .filter(|(k, _)| k.starts_with(KUBELET_ANNOTATION_PREFIX))
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            boot_policy: crate::tpm::boot_policy::PolicyState::named(
                &meta.namespace,
                meta.annotation(crate::names::ANNOTATION_TPM_BOOT_POLICY),
            ),
            opted_in: meta.annotation(ANNOTATION_OPT_IN) == Some("true"),
            allowed_attestors,
            kubelet_annotations,
            paused: Paused::of(object),
            paused_since: Paused::of(object).and_then(|_| paused_condition_since(object)),
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
        })
    }

    /// Whether `provider` is allowed for this Cluster.
    pub fn allows(&self, provider: &str) -> bool {
        self.allowed_attestors.iter().any(|a| a == provider)
    }
}

/// The `lastTransitionTime` of a `True` `Paused` condition, in v1beta2's `status.conditions` or
/// v1beta1's `status.v1beta2.conditions`.
fn paused_condition_since(object: &Value) -> Option<time::OffsetDateTime> {
    ["/status/conditions", "/status/v1beta2/conditions"]
        .iter()
        .filter_map(|pointer| object.pointer(pointer)?.as_array())
        .flatten()
        .filter(|c| {
            c.get("type").and_then(Value::as_str) == Some("Paused")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
        .find_map(|c| {
            let at = c.get("lastTransitionTime")?.as_str()?;
            time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
        })
}

/// The prefix of the Cluster annotations a [`ClusterView`] keeps.
const KUBELET_ANNOTATION_PREFIX: &str = "cluster.x-k8s.io/kubelet-";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn cluster_attestors_default_to_tpm_only() {
        let c = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "c",
            "annotations": {"cluster.x-k8s.io/kubelet-authentication": "true"}}});
        let view = ClusterView::from_object(&c).unwrap();
        assert!(view.opted_in && view.allows("tpm") && !view.allows("insecure"));
    }

    #[test]
    fn a_pause_dates_from_cluster_apis_paused_condition_in_either_version() {
        let condition = json!([{"type": "Paused", "status": "True", "reason": "Paused",
            "lastTransitionTime": "2026-12-01T10:00:00Z"}]);
        let since = |version: &str, paused: bool, status: Value| {
            let object = json!({"apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns"}, "spec": {"paused": paused}, "status": status});
            ClusterView::from_object(&object).unwrap().paused_since
        };
        let at = time::macros::datetime!(2026-12-01 10:00:00 UTC);
        assert_eq!(
            since("v1beta2", true, json!({"conditions": condition.clone()})),
            Some(at)
        );
        assert_eq!(
            since("v1beta1", true, json!({"v1beta2": {"conditions": condition.clone()}})),
            Some(at)
        );
        assert_eq!(
            since("v1beta2", true, json!({})),
            None,
            "no condition: the fleet counts"
        );
        assert_eq!(
            since("v1beta2", false, json!({"conditions": condition})),
            None,
            "a stale condition of an unpaused Cluster counts for nothing"
        );
        let not_true = json!([{"type": "Paused", "status": "False", "lastTransitionTime": "2026-12-01T10:00:00Z"}]);
        assert_eq!(since("v1beta2", true, json!({"conditions": not_true})), None);
        let garbage = json!([{"type": "Paused", "status": "True", "lastTransitionTime": "yesterday"}]);
        assert_eq!(since("v1beta2", true, json!({"conditions": garbage})), None);
    }

    #[test]
    fn a_cluster_is_paused_by_spec_paused_or_the_annotation_in_either_version() {
        let cluster = |version: &str, spec: Value, annotations: Value| {
            let object = json!({"apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns", "annotations": annotations}, "spec": spec});
            ClusterView::from_object(&object).unwrap().paused
        };
        let opted_in = json!({"cluster.x-k8s.io/kubelet-authentication": "true"});
        for version in ["v1beta1", "v1beta2"] {
            assert_eq!(cluster(version, json!({}), opted_in.clone()), None, "{version}");
            assert_eq!(
                cluster(version, json!({"paused": false}), opted_in.clone()),
                None,
                "{version}"
            );
            assert_eq!(
                cluster(version, json!({"paused": true}), opted_in.clone()),
                Some(Paused::Spec),
                "{version}"
            );
            // Present is paused, whatever the value: Cluster API reads it so.
            for value in ["", "true", "false"] {
                let annotations =
                    json!({"cluster.x-k8s.io/kubelet-authentication": "true", "cluster.x-k8s.io/paused": value});
                assert_eq!(
                    cluster(version, json!({}), annotations.clone()),
                    Some(Paused::Annotation),
                    "{version} {value:?}"
                );
                assert_eq!(
                    cluster(version, json!({"paused": true}), annotations),
                    Some(Paused::SpecAndAnnotation),
                    "{version} {value:?}"
                );
            }
        }
        // Not a bool, or another annotation: not paused.
        assert_eq!(
            cluster(
                "v1beta2",
                json!({"paused": "true"}),
                json!({"cluster.x-k8s.io/paused-not": ""})
            ),
            None
        );
        let paused = ClusterView::from_object(&json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "annotations": {"cluster.x-k8s.io/paused": ""}}}))
        .unwrap();
        assert!(paused.is_paused() && paused.kubelet_annotations.is_empty());
        assert!(paused.paused.unwrap().to_string().contains("cluster.x-k8s.io/paused"));
        assert!(!ClusterView::named("c", "ns", &["tpm"]).is_paused());
    }
}
