//! Every Cluster API object the suites and the bundled examples use validates against the real
//! CRDs (`testdata/crds`), version by version. Unknown fields fail too, as the apiserver would
//! prune them: a fixture the signer reads a field from must hold that field for real.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tests::capi;

/// `(group, kind, version)` -> openAPIV3Schema with `additionalProperties: false` added.
fn schemas() -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    let dir = tests::repo_root().join("testdata/crds");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let group = crd["spec"]["group"].as_str().unwrap().to_owned();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_owned();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let mut schema = version["schema"]["openAPIV3Schema"].clone();
            close_objects(&mut schema);
            out.insert(
                (
                    group.clone(),
                    kind.clone(),
                    version["name"].as_str().unwrap().to_owned(),
                ),
                schema,
            );
        }
    }
    out
}

fn close_objects(schema: &mut Value) {
    if let Value::Object(map) = schema {
        let preserve = map.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
        if map.contains_key("properties") && !map.contains_key("additionalProperties") && !preserve {
            map.insert("additionalProperties".into(), json!(false));
        }
        for value in map.values_mut() {
            close_objects(value);
        }
    } else if let Value::Array(items) = schema {
        items.iter_mut().for_each(close_objects);
    }
}

fn validate(schemas: &BTreeMap<(String, String, String), Value>, object: &Value) -> Result<(), String> {
    let api_version = object["apiVersion"].as_str().ok_or("no apiVersion")?;
    let (group, version) = api_version.split_once('/').ok_or("core objects have no CRD")?;
    let kind = object["kind"].as_str().ok_or("no kind")?;
    let schema = schemas
        .get(&(group.to_owned(), kind.to_owned(), version.to_owned()))
        .ok_or_else(|| format!("no CRD for {api_version} {kind}"))?;
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator
        .iter_errors(object)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[test]
fn fixtures_validate_against_the_real_crds() {
    let schemas = schemas();
    let mut machine_with_condition = capi::machine("m", Some("aws:///x"));
    machine_with_condition["status"] = json!({"conditions": [{"type": "BootstrapConfigReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-22T07:00:00Z"}],
        "nodeRef": {"name": "m"}, "addresses": [{"type": "Hostname", "address": "m"}]});
    let fixtures = [
        capi::cluster("tpm,insecure"),
        capi::machine("worker-0", Some("aws:///us-east-1a/i-0abc")),
        capi::machine("worker-1", None),
        machine_with_condition,
        capi::machine_v1beta1("worker-0", "aws:///us-east-1a/i-0abc"),
        capi::machine_pool("pool-a", &["aws:///a", "aws:///b"]),
        capi::machine_pool_v1beta1("pool-a", &["aws:///a"]),
        capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2"),
        capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta1"),
    ];
    for fixture in &fixtures {
        validate(&schemas, fixture).unwrap_or_else(|e| panic!("{} {}: {e}", fixture["apiVersion"], fixture["kind"]));
    }
}

#[test]
fn bundled_examples_validate_against_the_real_crds() {
    let schemas = schemas();
    let dir = tests::repo_root().join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document).unwrap();
            let items = if object["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
                object["items"].as_array().unwrap().clone()
            } else {
                vec![object]
            };
            for item in items {
                if item["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.contains("cluster.x-k8s.io"))
                {
                    validate(&schemas, &item).unwrap_or_else(|e| {
                        panic!("{}: {} {}: {e}", path.display(), item["kind"], item["metadata"]["name"])
                    });
                    checked += 1;
                }
            }
        }
    }
    assert!(
        checked >= 4,
        "examples hold the Cluster, Machines and KubeadmConfigs ({checked} checked)"
    );
}

#[test]
fn the_validator_catches_a_misspelt_field() {
    let schemas = schemas();
    let mut machine = capi::machine("m", Some("aws:///x"));
    machine["spec"]["providerId"] = json!("aws:///x");
    assert!(validate(&schemas, &machine).is_err());
    let mut v1beta2_with_v1beta1_ref = capi::machine("m", None);
    v1beta2_with_v1beta1_ref["spec"]["bootstrap"]["configRef"] =
        json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig", "name": "x"});
    assert!(validate(&schemas, &v1beta2_with_v1beta1_ref).is_err());
}
