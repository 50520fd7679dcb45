//! A Cluster API object's JSON without `metadata.managedFields`, for the signer's hot reads.
//!
//! Every join writes a claim on a Machine, and the signer then reads that Machine twice: in the
//! `PATCH`'s answer (the re-check) and in its own watch. Read as a `DynamicObject` and turned
//! into JSON for the view, each was two whole trees, the managed fields among them (a third of
//! a Machine as Cluster API writes it, and nothing the rules read). Here the object is parsed
//! once into the one tree the views read, and the managed fields are skipped by the parser
//! without being built.

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The field left out.
const MANAGED_FIELDS: &str = "managedFields";

/// An object's JSON, `metadata.managedFields` left out (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub struct LeanObject(pub Value);

impl LeanObject {
    /// The string at `pointer`, when there is one.
    pub fn str_at(&self, pointer: &str) -> Option<&str> {
        self.0.pointer(pointer).and_then(Value::as_str)
    }

    /// `namespace/name`, for logs.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.str_at("/metadata/namespace").unwrap_or_default(),
            self.str_at("/metadata/name").unwrap_or_default()
        )
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.str_at("/metadata/resourceVersion")
    }
}

impl<'de> Deserialize<'de> for LeanObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `any`: what is not an object is kept as it is (a list's odd item, a watch event's),
        // for the view reading it to say what is wrong.
        deserializer.deserialize_any(Lean::Object).map(LeanObject)
    }
}

/// Where the parser is: the object (whose `metadata` is read lean) or its `metadata` (whose
/// `managedFields` are skipped).
#[derive(Clone, Copy)]
enum Lean {
    Object,
    Metadata,
}

impl<'de> DeserializeSeed<'de> for Lean {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Lean {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Object => "a Kubernetes object",
            Self::Metadata => "an object's metadata",
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match (self, key.as_str()) {
                (Self::Object, "metadata") => map.next_value_seed(Self::Metadata)?,
                (Self::Metadata, MANAGED_FIELDS) => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                _ => map.next_value::<Value>()?,
            };
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn managed_fields_are_left_out_and_the_rest_is_as_parsed() {
        let whole = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns", "resourceVersion": "7",
                "annotations": {"a": "b", "managedFields": "an annotation keeps its name"},
                "managedFields": [{"manager": "capi", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"clusterName": "c", "managedFields": ["not metadata: kept"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
        });
        let lean: LeanObject = serde_json::from_str(&whole.to_string()).unwrap();
        let mut expected = whole.clone();
        expected["metadata"].as_object_mut().unwrap().remove("managedFields");
        assert_eq!(lean.0, expected);
        assert_eq!(lean.key(), "ns/m");
        assert_eq!(lean.resource_version(), Some("7"));
    }

    #[test]
    fn a_lean_cluster_keeps_what_pauses_it() {
        let cluster = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "prod", "namespace": "team-a",
                         "annotations": {"cluster.x-k8s.io/kubelet-authentication": "true", "cluster.x-k8s.io/paused": ""},
                         "managedFields": [{"manager": "clusterctl"}]},
            "spec": {"paused": true},
        });
        let lean: LeanObject = serde_json::from_str(&cluster.to_string()).unwrap();
        let view = attestation::machine::ClusterView::from_object(&lean.0).unwrap();
        assert_eq!(view.paused, Some(attestation::machine::Paused::SpecAndAnnotation));
    }

    #[test]
    fn what_is_not_an_object_is_kept_for_the_view_to_refuse_and_broken_json_is_an_error() {
        for metadata in [
            json!(null),
            json!("x"),
            json!(3),
            json!(-3),
            json!(1.5),
            json!([1]),
            json!(true),
        ] {
            let body = json!({"kind": "Machine", "metadata": metadata}).to_string();
            let lean: LeanObject = serde_json::from_str(&body).unwrap();
            assert_eq!(lean.0["metadata"], metadata, "{body}");
            let lean: LeanObject = serde_json::from_str(&metadata.to_string()).unwrap();
            assert_eq!(lean.0, metadata);
        }
        for body in [
            "",
            "{",
            "{\"metadata\": {\"managedFields\": }}",
            "{\"metadata\": {\"managedFields\": [}}",
        ] {
            assert!(serde_json::from_str::<LeanObject>(body).is_err(), "{body}");
        }
    }

    #[test]
    fn a_watch_event_carries_a_lean_object() {
        let event: kube::api::WatchEvent<LeanObject> = serde_json::from_str(
            r#"{"type": "MODIFIED", "object": {"kind": "Machine",
                "metadata": {"name": "m", "managedFields": [{"manager": "x"}]}}}"#,
        )
        .unwrap();
        let kube::api::WatchEvent::Modified(object) = event else {
            panic!("{event:?}")
        };
        assert_eq!(object.0, json!({"kind": "Machine", "metadata": {"name": "m"}}));
    }
}
