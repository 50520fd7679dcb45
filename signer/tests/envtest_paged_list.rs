//! What the signer's paged LISTs of a namespace (its fills and fresh reads:
//! `management::view_page::for_each_page`) rely on when a list outlasts etcd's compaction, on a
//! real kube-apiserver and etcd (`KUBEBUILDER_ASSETS`; skipped without it).
//!
//! A fleet of a thousand Clusters in one namespace on a loaded apiserver took longer to list
//! than etcd's 5-minute compaction window, and every restarted list was refused again
//! (docs/capacity.md, "Measured at 1,000 Clusters"). The signer goes on instead with the token
//! the 410 offers. Here: the first page is read, objects are written on both sides of it, etcd
//! is compacted (through its HTTP gateway, as kube-apiserver's compactor does every 5 minutes),
//! and the next page is refused 410 with `metadata.continue` set; going on with that token
//! gives the rest of the namespace at the latest version: the new object among the pages still
//! to come is there, the one among the pages already read is not (it is the watch's to
//! deliver), and every object is listed once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::{Value, json};
use tests::capi;
use tests::envtest::Envtest;
use tests::live;

const NS: &str = capi::NAMESPACE;
const PAGE: u32 = 10;

/// POSTs `body` to etcd's HTTP gateway (`/v3/...`) and returns the JSON answer.
fn etcd_post(etcd_url: &str, path: &str, body: &Value) -> Value {
    let address = etcd_url.trim_start_matches("http://").trim_end_matches('/');
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(address).expect("etcd");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, rest) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}\n{rest}");
    // Chunked or not: the JSON object is between the first '{' and the last '}'.
    let json = &rest[rest.find('{').expect("JSON")..=rest.rfind('}').expect("JSON")];
    serde_json::from_str(json).unwrap()
}

fn machine(name: &str) -> Value {
    let mut object = capi::machine(name, Some(&format!("aws:///z/i-{name}")));
    object["metadata"] =
        json!({"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": capi::CLUSTER}});
    object.as_object_mut().unwrap().remove("status");
    object
}

#[tokio::test]
#[ignore = "needs KUBEBUILDER_ASSETS (kube-apiserver, etcd)"]
async fn a_list_outlasting_compaction_is_refused_with_a_token_that_goes_on_at_the_latest_version() {
    let env = Envtest::start("envtest_paged_list");
    env.install_capi_crds();
    let client = live::client(&env.admin_kubeconfig).await;
    live::apply(
        &client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
        "machines",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    // m-10 … m-39: three pages.
    let first_names: Vec<String> = (10..40).map(|i| format!("m-{i}")).collect();
    for name in &first_names {
        live::apply(&client, &machine(name)).await;
    }

    let first = api.list(&ListParams::default().limit(PAGE)).await.unwrap();
    let listed: Vec<String> = first.items.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
    assert_eq!(listed, first_names[..10]);
    let token = first.metadata.continue_.clone().expect("a next page");

    // Written after the first page: one among the pages read (m-100 sorts before m-11), one
    // among those to come; and one deleted among those to come.
    live::apply(&client, &machine("m-100")).await;
    live::apply(&client, &machine("m-99")).await;
    api.delete("m-25", &Default::default()).await.unwrap();
    // etcd compacted up to its latest revision, as kube-apiserver's compactor does.
    let revision = etcd_post(env.etcd_url(), "/v3/kv/range", &json!({"key": "AA=="}))["header"]["revision"]
        .as_str()
        .expect("etcd's revision")
        .to_owned();
    etcd_post(
        env.etcd_url(),
        "/v3/kv/compaction",
        &json!({"revision": revision, "physical": true}),
    );

    let refused = api
        .list(&ListParams::default().limit(PAGE).continue_token(&token))
        .await
        .expect_err("the list's version is compacted");
    let kube::Error::Api(status) = refused else {
        panic!("not an API answer: {refused}");
    };
    assert_eq!(status.code, 410, "{status:?}");
    assert_eq!(status.reason, "Expired", "{status:?}");
    let mut next = status
        .metadata
        .as_ref()
        .and_then(|m| m.continue_.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| panic!("a 410 without a token to go on: {status:?}"));

    let mut rest = Vec::new();
    loop {
        let page = api
            .list(&ListParams::default().limit(PAGE).continue_token(&next))
            .await
            .unwrap();
        rest.extend(page.items.iter().map(|m| m.metadata.name.clone().unwrap()));
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => next = token,
            None => break,
        }
    }
    let expected: Vec<String> = first_names[10..]
        .iter()
        .filter(|n| *n != "m-25")
        .cloned()
        .chain(["m-99".to_owned()])
        .collect();
    assert_eq!(
        rest, expected,
        "the rest at the latest version, after the last name read"
    );
    let all: BTreeSet<&String> = listed.iter().chain(&rest).collect();
    assert_eq!(all.len(), listed.len() + rest.len(), "each object listed once");
    assert!(
        !all.contains(&"m-100".to_owned()),
        "among the pages already read: the watch's"
    );
    eprintln!(
        "refused {} {}: {:?}; went on with {} more objects",
        status.code,
        status.reason,
        status.message,
        rest.len()
    );
}
