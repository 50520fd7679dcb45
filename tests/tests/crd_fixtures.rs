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

/// Every document of a YAML file in the repository.
fn yaml_documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(tests::repo_root().join(path)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// The kubelet drop-in of a KubeadmConfig's `files` that tells the plugin its node name.
const NODE_NAME_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/21-kubelet-authenticator-node-name.conf";

/// The node name a KubeadmConfig spec's `files` tell the plugin (`KUBELET_AUTHENTICATOR_NODE_NAME`
/// in [`NODE_NAME_DROPIN`], its only setting), as written before cloud-init renders it.
fn told_node_name(spec: &Value) -> Option<String> {
    let file = spec["files"]
        .as_array()?
        .iter()
        .find(|f| f["path"] == NODE_NAME_DROPIN)?;
    let content = file["content"].as_str().unwrap();
    let settings: Vec<&str> = content
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(settings.len(), 2, "[Service] and one Environment=: {content}");
    assert_eq!(settings[0], "[Service]", "{content}");
    Some(
        settings[1]
            .strip_prefix("Environment=KUBELET_AUTHENTICATOR_NODE_NAME=")
            .unwrap_or_else(|| panic!("{content}"))
            .to_owned(),
    )
}

#[test]
fn the_per_cloud_templates_validate_and_name_nodes_as_their_providers_do() {
    let schemas = schemas();
    for (file, scheme, name) in [
        (
            "images/kubeadm/kubeadm-config-template-aws.yaml",
            "aws:///",
            "{{ ds.meta_data.local_hostname }}",
        ),
        (
            "images/kubeadm/kubeadm-config-template-gcp.yaml",
            "gce://${GCP_PROJECT}/",
            "{{ ds.meta_data.local_hostname.split(\".\")[0] }}",
        ),
    ] {
        let template = yaml_documents(file).remove(0);
        let config = as_kubeadm_config(&template);
        validate(&schemas, &config).unwrap_or_else(|e| panic!("{file}: {e}"));
        let spec = &config["spec"];
        let registration = &spec["joinConfiguration"]["nodeRegistration"];
        assert_eq!(registration["name"], name, "{file}");
        assert_eq!(
            told_node_name(spec).as_deref(),
            Some(name),
            "{file}: the plugin is told the name"
        );
        let provider_id = spec["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/etc/kubernetes/provider-id")
            .unwrap_or_else(|| panic!("{file}: the provider-ID file"));
        assert!(provider_id["content"].as_str().unwrap().starts_with(scheme), "{file}");
        let flag = registration["kubeletExtraArgs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "provider-id")
            .unwrap_or_else(|| panic!("{file}: kubelet --provider-id"));
        assert_eq!(flag["value"], provider_id["content"], "{file}: one provider ID");
        // The same kubelet configuration as the tested template.
        let reference = as_kubeadm_config(&yaml_documents("images/kubeadm/kubeadm-config-template.yaml").remove(0));
        let patch = |c: &Value| {
            c["spec"]["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["path"].as_str().unwrap().contains("kubeletconfiguration"))
                .cloned()
        };
        assert_eq!(patch(&config), patch(&reference), "{file}");
    }
}

/// A KubeadmConfigTemplate's template as the KubeadmConfig its Machines get: what the CRD of
/// the config validates (the template's own CRD wraps the same schema).
fn as_kubeadm_config(template: &Value) -> Value {
    json!({"apiVersion": template["apiVersion"], "kind": "KubeadmConfig",
           "metadata": {"name": "m-1", "namespace": "team-a"}, "spec": template["spec"]["template"]["spec"]})
}

#[test]
fn the_shipped_kubeadm_node_configuration_validates_and_says_what_kubeadm_needs() {
    let schemas = schemas();
    let template = yaml_documents("images/kubeadm/kubeadm-config-template.yaml").remove(0);
    assert_eq!(template["kind"], "KubeadmConfigTemplate");
    let config = as_kubeadm_config(&template);
    validate(&schemas, &config).unwrap_or_else(|e| panic!("kubeadm-config-template.yaml: {e}"));

    // kubeadm applies `<dir>/kubeletconfiguration*.yaml` to kubelet's config at join.
    let spec = &config["spec"];
    let directory = spec["joinConfiguration"]["patches"]["directory"].as_str().unwrap();
    let patch = spec["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["path"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{directory}/kubeletconfiguration"))
        })
        .expect("a kubeletconfiguration patch in the patches directory");
    let kubelet: Value = serde_yaml::from_str(patch["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        kubelet,
        json!({"serverTLSBootstrap": true, "rotateCertificates": false})
    );
    let provider_id_file = spec["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/etc/kubernetes/provider-id")
        .expect("the provider-ID file the plugin reads");
    let flag = spec["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "provider-id")
        .expect("kubelet --provider-id");
    assert_eq!(
        flag["value"], provider_id_file["content"],
        "the Node and the CSR carry one provider ID"
    );
    assert!(
        spec["joinConfiguration"]["nodeRegistration"]
            .get("ignorePreflightErrors")
            .is_none(),
        "an unmodified kubeadm join: no preflight check skipped"
    );
    // No node name: kubeadm's and the plugin's are both the hostname.
    assert!(spec["joinConfiguration"]["nodeRegistration"].get("name").is_none());
    assert_eq!(told_node_name(spec), None);

    // The ClusterClass patch turns a stock worker template, whatever name it gives, into the
    // AWS flavour: CAPA's files and node name, told to the plugin.
    let aws = as_kubeadm_config(&yaml_documents("images/kubeadm/kubeadm-config-template-aws.yaml").remove(0));
    let aws = &aws["spec"];
    let patch = yaml_documents("images/kubeadm/clusterclass-patch.yaml").remove(0);
    let mut stock = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate",
        "metadata": {"name": "default-worker"},
        "spec": {"template": {"spec": {"files": [], "joinConfiguration": {"nodeRegistration": {
            "name": "{{ v1.local_hostname }}",
            "kubeletExtraArgs": [{"name": "eviction-hard", "value": "nodefs.available<0%"}]}}}}}});
    for definition in patch["definitions"].as_array().unwrap() {
        if definition["selector"]["kind"] != "KubeadmConfigTemplate" {
            continue; // the control plane's: the_control_plane_configuration_...
        }
        let ops: json_patch::Patch = serde_json::from_value(definition["jsonPatches"].clone()).unwrap();
        json_patch::patch(&mut stock, &ops).unwrap();
    }
    let patched = as_kubeadm_config(&stock);
    validate(&schemas, &patched).unwrap_or_else(|e| panic!("clusterclass-patch.yaml applied: {e}"));
    assert_eq!(patched["spec"]["files"], aws["files"]);
    assert_eq!(
        patched["spec"]["joinConfiguration"]["patches"],
        aws["joinConfiguration"]["patches"]
    );
    assert_eq!(
        patched["spec"]["joinConfiguration"]["nodeRegistration"]["name"],
        aws["joinConfiguration"]["nodeRegistration"]["name"]
    );
    assert!(
        patched["spec"]["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
            .as_array()
            .unwrap()
            .contains(flag)
    );
}

/// A KubeadmControlPlane's `kubeadmConfigSpec` as the KubeadmConfig each of its Machines gets
/// (the control plane controller copies it; the KubeadmControlPlane's own CRD is not among the
/// CRDs the project carries, the config's is).
fn as_control_plane_config(kubeadm_config_spec: &Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
           "metadata": {"name": "prod-cp-1", "namespace": "team-a"}, "spec": kubeadm_config_spec})
}

#[test]
fn the_control_plane_configuration_validates_and_matches_the_workers() {
    let schemas = schemas();
    let worker = as_kubeadm_config(&yaml_documents("images/kubeadm/kubeadm-config-template.yaml").remove(0));
    let kubelet_patch = |spec: &Value| {
        spec["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"].as_str().unwrap().contains("kubeletconfiguration"))
            .cloned()
    };
    for (file, scheme) in [
        ("images/kubeadm/kubeadm-control-plane.yaml", "aws:///"),
        ("images/kubeadm/kubeadm-control-plane-aws.yaml", "aws:///"),
        ("images/kubeadm/kubeadm-control-plane-gcp.yaml", "gce://${GCP_PROJECT}/"),
    ] {
        let kcp = yaml_documents(file).remove(0);
        assert_eq!(kcp["kind"], "KubeadmControlPlane", "{file}");
        let spec = &kcp["spec"]["kubeadmConfigSpec"];
        validate(&schemas, &as_control_plane_config(spec)).unwrap_or_else(|e| panic!("{file}: {e}"));
        // The first node (its adoption) and the joining ones ask for the name they register.
        let told = told_node_name(spec);
        for phase in ["initConfiguration", "joinConfiguration"] {
            assert_eq!(
                spec[phase]["nodeRegistration"]["name"].as_str(),
                told.as_deref(),
                "{file}: {phase}: the name the plugin is told (none: the hostname both)"
            );
        }
        assert_eq!(
            kubelet_patch(spec),
            kubelet_patch(&worker["spec"]),
            "{file}: the workers' kubelet configuration"
        );
        let provider_id = spec["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/etc/kubernetes/provider-id")
            .unwrap_or_else(|| panic!("{file}: the provider-ID file"));
        assert!(provider_id["content"].as_str().unwrap().starts_with(scheme), "{file}");
        // Both the first node (init: adopted) and the others (join) carry the provider ID on
        // the Node and apply the kubelet patch.
        for phase in ["initConfiguration", "joinConfiguration"] {
            let flag = spec[phase]["nodeRegistration"]["kubeletExtraArgs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == "provider-id")
                .unwrap_or_else(|| panic!("{file}: {phase}: kubelet --provider-id"));
            assert_eq!(
                flag["value"], provider_id["content"],
                "{file}: {phase}: one provider ID"
            );
            assert_eq!(
                spec[phase]["patches"]["directory"], "/etc/kubernetes/patches",
                "{file}: {phase}"
            );
            assert!(spec[phase]["nodeRegistration"].get("ignorePreflightErrors").is_none());
        }
    }

    // The ClusterClass patch turns a stock KubeadmControlPlaneTemplate into the AWS flavour.
    let shipped = yaml_documents("images/kubeadm/kubeadm-control-plane-aws.yaml").remove(0);
    let shipped = &shipped["spec"]["kubeadmConfigSpec"];
    let patch = yaml_documents("images/kubeadm/clusterclass-patch.yaml").remove(0);
    let definition = patch["definitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["selector"]["kind"] == "KubeadmControlPlaneTemplate")
        .expect("a definition for the KubeadmControlPlaneTemplate");
    assert_eq!(definition["selector"]["matchResources"]["controlPlane"], true);
    let mut stock = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlaneTemplate",
        "metadata": {"name": "default-control-plane"},
        "spec": {"template": {"spec": {"kubeadmConfigSpec": {"files": [],
            "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": []}},
            "joinConfiguration": {"nodeRegistration": {"name": "{{ v1.local_hostname }}", "kubeletExtraArgs": []}}}}}}});
    let ops: json_patch::Patch = serde_json::from_value(definition["jsonPatches"].clone()).unwrap();
    json_patch::patch(&mut stock, &ops).unwrap();
    let patched = &stock["spec"]["template"]["spec"]["kubeadmConfigSpec"];
    validate(&schemas, &as_control_plane_config(patched))
        .unwrap_or_else(|e| panic!("clusterclass-patch.yaml applied: {e}"));
    assert_eq!(patched["files"], shipped["files"]);
    for phase in ["initConfiguration", "joinConfiguration"] {
        assert_eq!(patched[phase]["patches"], shipped[phase]["patches"], "{phase}");
        assert_eq!(
            patched[phase]["nodeRegistration"]["name"], shipped[phase]["nodeRegistration"]["name"],
            "{phase}"
        );
        assert_eq!(
            patched[phase]["nodeRegistration"]["kubeletExtraArgs"],
            shipped[phase]["nodeRegistration"]["kubeletExtraArgs"],
            "{phase}"
        );
    }
}

#[test]
fn the_azure_templates_validate_name_nodes_as_capz_does_and_leave_the_provider_id_to_the_plugin() {
    let schemas = schemas();
    let reference = as_kubeadm_config(&yaml_documents("images/kubeadm/kubeadm-config-template.yaml").remove(0));
    let kubelet_patch = |spec: &Value| {
        spec["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"].as_str().unwrap().contains("kubeletconfiguration"))
            .cloned()
    };
    let capz_name = "{{ ds.meta_data[\"local_hostname\"] }}";
    let no_provider_id = |file: &str, spec: &Value, registration: &Value| {
        assert!(
            spec["files"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["path"] != "/etc/kubernetes/provider-id"),
            "{file}: the plugin reads the provider ID from IMDS (the image's drop-in passes no file)"
        );
        let args = registration["kubeletExtraArgs"].as_array().unwrap();
        assert!(
            args.iter().all(|a| a["name"] != "provider-id"),
            "{file}: the cloud node manager sets it"
        );
        assert!(
            args.iter()
                .any(|a| a["name"] == "cloud-provider" && a["value"] == "external"),
            "{file}: CAPZ's external cloud provider"
        );
    };
    let file = "images/kubeadm/kubeadm-config-template-azure.yaml";
    let config = as_kubeadm_config(&yaml_documents(file).remove(0));
    validate(&schemas, &config).unwrap_or_else(|e| panic!("{file}: {e}"));
    let registration = &config["spec"]["joinConfiguration"]["nodeRegistration"];
    assert_eq!(registration["name"], capz_name, "{file}");
    assert_eq!(told_node_name(&config["spec"]).as_deref(), Some(capz_name), "{file}");
    no_provider_id(file, &config["spec"], registration);
    assert_eq!(
        kubelet_patch(&config["spec"]),
        kubelet_patch(&reference["spec"]),
        "{file}"
    );

    let file = "images/kubeadm/kubeadm-control-plane-azure.yaml";
    let kcp = yaml_documents(file).remove(0);
    assert_eq!(kcp["kind"], "KubeadmControlPlane", "{file}");
    let spec = &kcp["spec"]["kubeadmConfigSpec"];
    validate(&schemas, &as_control_plane_config(spec)).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(kubelet_patch(spec), kubelet_patch(&reference["spec"]), "{file}");
    assert_eq!(told_node_name(spec).as_deref(), Some(capz_name), "{file}");
    for phase in ["initConfiguration", "joinConfiguration"] {
        let registration = &spec[phase]["nodeRegistration"];
        assert_eq!(registration["name"], capz_name, "{file}: {phase}");
        no_provider_id(file, spec, registration);
        assert_eq!(
            spec[phase]["patches"]["directory"], "/etc/kubernetes/patches",
            "{file}: {phase}"
        );
    }
}

/// Every provider's ClusterClass patch (CAPA's `clusterclass-patch.yaml`, CAPG's and CAPZ's
/// `clusterclass-patch-<provider>.yaml`) turns a stock class's worker template and control plane
/// template into that provider's shipped templates: the same files, node name (told to the
/// plugin), kubeadm patches directory and provider-ID flag; the provider's own kubelet flags
/// (the stock class's `cloud-provider: external`, which every provider's class sets) stay the
/// class's.
#[test]
fn every_providers_clusterclass_patch_gives_its_shipped_templates() {
    let schemas = schemas();
    let ours = |args: &Value| -> Vec<Value> {
        args.as_array()
            .map(|a| a.iter().filter(|x| x["name"] == "provider-id").cloned().collect())
            .unwrap_or_default()
    };
    for (provider, patch_file) in [
        ("aws", "images/kubeadm/clusterclass-patch.yaml"),
        ("gcp", "images/kubeadm/clusterclass-patch-gcp.yaml"),
        ("azure", "images/kubeadm/clusterclass-patch-azure.yaml"),
    ] {
        let patch = yaml_documents(patch_file).remove(0);
        let definition = |kind: &str| {
            let found = patch["definitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["selector"]["kind"] == kind)
                .unwrap_or_else(|| panic!("{patch_file}: no definition for {kind}"));
            serde_json::from_value::<json_patch::Patch>(found["jsonPatches"].clone()).unwrap()
        };

        let shipped = as_kubeadm_config(
            &yaml_documents(&format!("images/kubeadm/kubeadm-config-template-{provider}.yaml")).remove(0),
        );
        let shipped = &shipped["spec"];
        let mut stock = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate",
            "metadata": {"name": "default-worker"},
            "spec": {"template": {"spec": {"files": [], "joinConfiguration": {"nodeRegistration": {
                "name": "{{ v1.local_hostname }}", "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}}}}}});
        json_patch::patch(&mut stock, &definition("KubeadmConfigTemplate")).unwrap();
        let patched = as_kubeadm_config(&stock);
        validate(&schemas, &patched).unwrap_or_else(|e| panic!("{patch_file} applied: {e}"));
        let patched = &patched["spec"];
        assert_eq!(patched["files"], shipped["files"], "{provider}: worker files");
        let join = |spec: &Value, key: &str| spec["joinConfiguration"][key].clone();
        assert_eq!(join(patched, "patches"), join(shipped, "patches"), "{provider}");
        assert_eq!(
            patched["joinConfiguration"]["nodeRegistration"]["name"],
            shipped["joinConfiguration"]["nodeRegistration"]["name"],
            "{provider}: the worker's node name"
        );
        assert_eq!(
            json!(ours(
                &patched["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
            )),
            json!(ours(
                &shipped["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
            )),
            "{provider}: the worker's provider-ID flag"
        );
        assert_eq!(
            told_node_name(patched).as_deref(),
            patched["joinConfiguration"]["nodeRegistration"]["name"].as_str(),
            "{provider}: the plugin is told the worker's node name"
        );

        let shipped_cp = yaml_documents(&format!("images/kubeadm/kubeadm-control-plane-{provider}.yaml")).remove(0);
        let shipped_cp = &shipped_cp["spec"]["kubeadmConfigSpec"];
        let mut stock_cp = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlaneTemplate",
            "metadata": {"name": "default-control-plane"},
            "spec": {"template": {"spec": {"kubeadmConfigSpec": {"files": [],
                "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}},
                "joinConfiguration": {"nodeRegistration": {"name": "{{ v1.local_hostname }}",
                    "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}}}}}}});
        json_patch::patch(&mut stock_cp, &definition("KubeadmControlPlaneTemplate")).unwrap();
        let patched_cp = &stock_cp["spec"]["template"]["spec"]["kubeadmConfigSpec"];
        validate(&schemas, &as_control_plane_config(patched_cp))
            .unwrap_or_else(|e| panic!("{patch_file} applied to the control plane: {e}"));
        assert_eq!(
            patched_cp["files"], shipped_cp["files"],
            "{provider}: control plane files"
        );
        for phase in ["initConfiguration", "joinConfiguration"] {
            assert_eq!(
                patched_cp[phase]["patches"], shipped_cp[phase]["patches"],
                "{provider} {phase}"
            );
            assert_eq!(
                patched_cp[phase]["nodeRegistration"]["name"], shipped_cp[phase]["nodeRegistration"]["name"],
                "{provider} {phase}"
            );
            assert_eq!(
                json!(ours(&patched_cp[phase]["nodeRegistration"]["kubeletExtraArgs"])),
                json!(ours(&shipped_cp[phase]["nodeRegistration"]["kubeletExtraArgs"])),
                "{provider} {phase}: the provider-ID flag"
            );
        }
    }
}
