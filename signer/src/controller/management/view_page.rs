//! Cluster API `LIST`s of a namespace, a page at a time ([`for_each_page`]), each page read
//! straight into the rule engine's views.
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

use kube::Client;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject, ListParams};

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

/// Objects per page of a namespace LIST: a large namespace is never held as one answer.
const PAGE: u32 = 250;

/// Every object of `resource` in `namespace` as views with their resourceVersion, a page at a
/// time to `each`, until it returns false (a large namespace is never held whole, and each page
/// is read straight into views); unreadable ones are left out, as the watch leaves them out.
///
/// A list whose pages outlast etcd's compaction (5 minutes: a namespace of tens of thousands
/// of objects on a loaded apiserver) is refused its next page (410), with a token that goes on
/// at the latest version (kube-apiserver's `handleCompactedErrorForPaging`); it goes on with
/// that token rather than starting over, which under the same load would be refused again. Its
/// later pages are then newer than its first: every reader here takes each object at its own
/// resourceVersion (the shard store keeps the newer of the watch's and the list's, and a
/// deletion's tombstone), and an object created meanwhile among the pages already read is the
/// watch's to deliver (a fill) or newer than the read's start (a fresh read).
pub async fn for_each_page<V: ReadView>(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    each: impl FnMut(Vec<Listed<V>>) -> bool,
) -> Result<(), kube::Error> {
    for_each_selected_page(client, resource, namespace, None, each).await
}

/// [`for_each_page`] of the objects `selector` (a label selector) selects.
pub async fn for_each_selected_page<V: ReadView>(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    selector: Option<&str>,
    mut each: impl FnMut(Vec<Listed<V>>) -> bool,
) -> Result<(), kube::Error> {
    let path = DynamicObject::url_path(resource, Some(namespace));
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let request = kube::core::Request::new(path.as_str())
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let page: ViewPage<V> = match client.request(request).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if token.is_some() && status.code == 410 => {
                match expired_continuation(&status) {
                    Some(next) => {
                        tracing::info!(
                            namespace,
                            resource = %resource.plural,
                            "a paged list outlasted etcd's compaction; going on at the latest version"
                        );
                        token = Some(next);
                        continue;
                    }
                    None => return Err(kube::Error::Api(status)),
                }
            }
            Err(e) => return Err(e),
        };
        for why in &page.unreadable {
            tracing::warn!(object = %why, "ignoring unreadable object");
        }
        token = page.next;
        if !each(page.views) || token.is_none() {
            return Ok(());
        }
    }
}

/// The token a 410 answer to a continued list offers for going on at the latest version.
fn expired_continuation(status: &kube::core::Status) -> Option<String> {
    status
        .metadata
        .as_ref()
        .and_then(|meta| meta.continue_.clone())
        .filter(|token| !token.is_empty())
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

    /// A kube client whose apiserver answers each LIST by its `continue` parameter: the first
    /// page (m-0, token "first"), a 410 past compaction offering "latest" (or no token when
    /// `offer` is false), then the rest (m-1). The queries it was sent go to `sent`.
    fn compacting_apiserver(offer: bool, sent: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Client {
        let machine = |name: &str| {
            format!(
                r#"{{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "metadata": {{"name": "{name}", "namespace": "ns", "uid": "u-{name}", "resourceVersion": "7"}},
                    "spec": {{"clusterName": "c", "providerID": "aws:///z/i-{name}"}}}}"#
            )
        };
        let service = tower::service_fn(move |request: hyper::http::Request<kube::client::Body>| {
            let query = request.uri().query().unwrap_or_default().to_owned();
            sent.lock().unwrap().push(query.clone());
            let (code, body) = if !query.contains("continue=") {
                (
                    200,
                    format!(
                        r#"{{"metadata": {{"continue": "first"}}, "items": [{}]}}"#,
                        machine("m-0")
                    ),
                )
            } else if query.contains("continue=first") {
                // As kube-apiserver's handleCompactedErrorForPaging answers (envtest_paged_list).
                let token = if offer { r#""continue": "latest""# } else { "" };
                (
                    410,
                    format!(
                        r#"{{"kind": "Status", "apiVersion": "v1", "metadata": {{{token}}}, "status": "Failure",
                            "message": "The provided continue parameter is too old to display a consistent list result.",
                            "reason": "Expired", "code": 410}}"#
                    ),
                )
            } else {
                (200, format!(r#"{{"metadata": {{}}, "items": [{}]}}"#, machine("m-1")))
            };
            let answer = hyper::http::Response::builder()
                .status(code)
                .body(kube::client::Body::from(body.into_bytes()))
                .unwrap();
            async move { Ok::<_, std::convert::Infallible>(answer) }
        });
        Client::new(service, "default")
    }

    fn machines() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
            "machines",
        )
    }

    #[tokio::test]
    async fn a_list_refused_past_compaction_goes_on_with_the_token_the_refusal_offers() {
        let sent = std::sync::Arc::default();
        let client = compacting_apiserver(true, std::sync::Arc::clone(&sent));
        let mut names = Vec::new();
        for_each_page(&client, &machines(), "ns", |page: Vec<Listed<MachineView>>| {
            names.extend(page.into_iter().map(|(_, m)| m.name().to_owned()));
            true
        })
        .await
        .unwrap();
        assert_eq!(names, ["m-0", "m-1"], "each page once, not started over");
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(sent[2].contains("continue=latest"), "{sent:?}");
    }

    #[tokio::test]
    async fn a_refusal_without_a_token_and_a_reader_that_stops_end_the_list() {
        let sent = std::sync::Arc::default();
        let client = compacting_apiserver(false, std::sync::Arc::clone(&sent));
        let refused = for_each_page(&client, &machines(), "ns", |_: Vec<Listed<MachineView>>| true).await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(status)) if status.code == 410),
            "{refused:?}"
        );
        // A reader that wants no more after the first page: nothing more is asked.
        let sent = std::sync::Arc::default();
        let client = compacting_apiserver(true, std::sync::Arc::clone(&sent));
        for_each_page(&client, &machines(), "ns", |_: Vec<Listed<MachineView>>| false)
            .await
            .unwrap();
        assert_eq!(sent.lock().unwrap().len(), 1);
    }
}
