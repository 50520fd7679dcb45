//! One page of a Cluster API `LIST`, read straight into the rule engine's views.
//!
//! A fill lists a namespace's Machines a page at a time. Parsed as a whole (a typed list, or one
//! JSON tree), a page of 250 Machines is about 2.5 MB of small allocations for 600 KB of JSON,
//! freed once the views are built; glibc keeps most of that heap, interleaved with the views
//! that stay, so a replica's resident memory grew by the page trees it had parsed, not only by
//! what it keeps. Here each object becomes its view as the parser reaches it: a page costs its
//! bytes and one object's tree at a time.

use std::fmt;
use std::marker::PhantomData;

use attestation::machine::{KubeadmConfigView, MachinePoolView, MachineView, ObjectError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::lean::LeanObject;
use super::store::Listed;

/// A view read from an object's JSON.
pub trait ReadView: Sized {
    /// The view, or why the object does not read as one.
    fn read(object: &Value) -> Result<Self, ObjectError>;
}

impl ReadView for MachineView {
    fn read(object: &Value) -> Result<Self, ObjectError> {
        Self::from_object(object)
    }
}

impl ReadView for MachinePoolView {
    fn read(object: &Value) -> Result<Self, ObjectError> {
        Self::from_object(object)
    }
}

impl ReadView for KubeadmConfigView {
    fn read(object: &Value) -> Result<Self, ObjectError> {
        Self::from_object(object)
    }
}

/// A page: its objects' views with their resourceVersions, the objects that did not read (their
/// `namespace/name` and why; the signer ignores them, as the watch does), and the continue
/// token of the next page.
#[derive(Debug)]
pub struct ViewPage<V> {
    /// The views, in the list's order.
    pub views: Vec<Listed<V>>,
    /// `namespace/name: why` of each object left out.
    pub unreadable: Vec<String>,
    /// `metadata.continue`, when there is a next page.
    pub next: Option<String>,
}

impl<'de, V: ReadView> Deserialize<'de> for ViewPage<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PageVisitor(PhantomData))
    }
}

struct PageVisitor<V>(PhantomData<V>);

impl<'de, V: ReadView> Visitor<'de> for PageVisitor<V> {
    type Value = ViewPage<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ViewPage<V>, A::Error> {
        let mut page = ViewPage {
            views: Vec::new(),
            unreadable: Vec::new(),
            next: None,
        };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "metadata" => {
                    let meta: ListMeta = map.next_value()?;
                    page.next = meta.continue_.filter(|token| !token.is_empty());
                }
                "items" => map.next_value_seed(Items(&mut page))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(page)
    }
}

/// The `items` array, each object read into its view as soon as it is parsed.
struct Items<'a, V>(&'a mut ViewPage<V>);

impl<'de, V: ReadView> DeserializeSeed<'de> for Items<'_, V> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        // `any`: an empty list may come as `null`.
        deserializer.deserialize_any(self)
    }
}

impl<'de, V: ReadView> Visitor<'de> for Items<'_, V> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list's items")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // Lean: the managed fields of a page's objects are skipped by the parser, not built.
        while let Some(LeanObject(object)) = seq.next_element::<LeanObject>()? {
            let version = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|rv| rv.parse().ok());
            match V::read(&object) {
                Ok(view) => self.0.views.push((version, view)),
                Err(e) => {
                    let field = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).unwrap_or("");
                    self.0.unreadable.push(format!(
                        "{}/{}: {e}",
                        field("/metadata/namespace"),
                        field("/metadata/name")
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_into_views_and_leaves_out_what_does_not_read() {
        let page: ViewPage<MachineView> = serde_json::from_str(
            r#"{"kind": "MachineList", "apiVersion": "cluster.x-k8s.io/v1beta2",
                "metadata": {"resourceVersion": "90", "continue": "next-page"},
                "items": [
                  {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                   "metadata": {"name": "m-0", "namespace": "ns", "uid": "u0", "resourceVersion": "7"},
                   "spec": {"clusterName": "c", "providerID": "aws:///z/i-0"}},
                  {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                   "metadata": {"name": "broken", "namespace": "ns", "uid": "u1"}, "spec": {}}
                ]}"#,
        )
        .unwrap();
        assert_eq!(page.next.as_deref(), Some("next-page"));
        assert_eq!(page.views.len(), 1);
        assert_eq!(page.views[0].0, Some(7));
        assert_eq!(page.views[0].1.provider_id(), Some("aws:///z/i-0"));
        assert_eq!(page.unreadable.len(), 1);
        assert!(page.unreadable[0].starts_with("ns/broken: "), "{:?}", page.unreadable);
    }

    #[test]
    fn an_empty_last_page_has_no_views_and_no_next() {
        for body in [
            r#"{"metadata": {"continue": ""}, "items": null}"#,
            r#"{"metadata": {}, "items": []}"#,
        ] {
            let page: ViewPage<KubeadmConfigView> = serde_json::from_str(body).unwrap();
            assert!(page.views.is_empty() && page.unreadable.is_empty() && page.next.is_none());
        }
    }

    #[test]
    fn what_is_not_a_list_is_an_error_not_a_panic() {
        for body in ["[]", "null", r#"{"items": {"a": 1}}"#, r#"{"items": 3}"#] {
            assert!(serde_json::from_str::<ViewPage<MachineView>>(body).is_err(), "{body}");
        }
        // Items that are not objects are left out, as unreadable.
        let page: ViewPage<MachineView> = serde_json::from_str(r#"{"items": [1, "x", null]}"#).unwrap();
        assert_eq!((page.views.len(), page.unreadable.len()), (0, 3));
    }
}
