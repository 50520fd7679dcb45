//! The clusterctl add-on provider release (`scripts/release`, docs/release.md), read as clusterctl
//! reads it and installed for real (`KUBEBUILDER_ASSETS`: its kubectl renders, its kube-apiserver
//! and etcd take the install; skipped loudly without). The release renders the same bytes twice;
//! metadata.yaml maps this version's series to the v1beta2 contract; every variable of
//! addon-components.yaml has a default and a line in docs/release.md, and substituted as
//! clusterctl substitutes leaves no `${`; every object carries the provider label and lives in the
//! one Namespace or is cluster-scoped (as clusterctl sees it); the Deployment's container is
//! `manager`. Applied, the objects are all there and the ServiceAccount can do its job; with the
//! variables set and the namespace moved as `clusterctl init --target-namespace` moves it, the
//! image and replicas follow and nothing names the old namespace.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
use tests::envtest::Envtest;

const SUITE: &str = "envtest_release";
const PROVIDER_LABEL: &str = "addon-node-attestation";
const NAMESPACE: &str = "node-attestation-system";
const SERVICE_ACCOUNT: &str = "node-attestation-signer";
const VARIABLES: [&str; 2] = ["NODE_ATTESTATION_SIGNER_IMAGE", "NODE_ATTESTATION_SIGNER_REPLICAS"];
const FILES: [&str; 4] = [
    "addon-components.yaml",
    "metadata.yaml",
    "prometheus.yaml",
    "workload-rbac.yaml",
];
/// The kinds clusterctl treats as cluster-scoped (cmd/clusterctl/internal/util/objs.go,
/// `IsResourceNamespaced`): it sets the target namespace on every other object.
const CLUSTERCTL_CLUSTER_SCOPED: [&str; 16] = [
    "Namespace",
    "Node",
    "PersistentVolume",
    "PodSecurityPolicy",
    "CertificateSigningRequest",
    "ClusterRoleBinding",
    "ClusterRole",
    "VolumeAttachment",
    "StorageClass",
    "CSIDriver",
    "CSINode",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "CustomResourceDefinition",
    "PriorityClass",
    "RuntimeClass",
];

/// Where the rendered runbook links point (`scripts/release --docs-url`).
const DOCS_URL: &str = "https://docs.example.org/node-attestation/v0.1.0";

/// Runs `scripts/release --out <out> --docs-url DOCS_URL` and reads the folder it wrote.
fn release(out: &Path) -> BTreeMap<String, String> {
    let run = Command::new(tests::repo_root().join("scripts/release"))
        .arg("--out")
        .arg(out)
        .args(["--docs-url", DOCS_URL])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "scripts/release: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read_dir(out)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().into_string().unwrap(),
                std::fs::read_to_string(entry.path()).unwrap(),
            )
        })
        .collect()
}

/// A `${…}` of a components YAML: its variable and its default, if any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Reference {
    name: String,
    default: Option<String>,
}

/// clusterctl's variable substitution (drone/envsubst, as cmd/clusterctl/client/yamlprocessor
/// runs it) for the forms a components YAML uses: `${VAR}`; `${VAR:=default}`, `${VAR=default}`,
/// `${VAR:-default}`, `${VAR-default}` (clusterctl reads an unset variable as empty, so each takes
/// the default when VAR is unset or empty); `$$` for a `$`; any other `$` is itself. As in
/// clusterctl, a variable with neither a value nor a default is an error; here so is any other
/// form (drone/envsubst's string functions), which the release does not use.
fn envsubst(text: &str, values: &BTreeMap<&str, &str>) -> Result<(String, Vec<Reference>), String> {
    let mut out = String::with_capacity(text.len());
    let mut references = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let end = body.find('}').ok_or("missing closing brace")?;
        let (inner, tail) = (&body[..end], &body[end + 1..]);
        let name_len = inner
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(inner.len());
        let (name, operation) = inner.split_at(name_len);
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("no variable name in ${{{inner}}}"));
        }
        let default = if operation.is_empty() {
            None
        } else {
            let default = [":=", ":-", "=", "-"]
                .iter()
                .find_map(|form| operation.strip_prefix(form))
                .ok_or_else(|| format!("${{{inner}}}: not a form the release may use"))?;
            if default.contains(['$', '{']) {
                return Err(format!("${{{inner}}}: a default holding a variable"));
            }
            Some(default.to_owned())
        };
        let value = values
            .get(name)
            .filter(|v| !v.is_empty())
            .map(|v| (*v).to_owned())
            .or_else(|| default.clone().filter(|d| !d.is_empty()))
            .ok_or_else(|| format!("value for variable {name} is not set and it has no default"))?;
        out.push_str(&value);
        references.push(Reference {
            name: name.to_owned(),
            default,
        });
        rest = tail;
    }
    out.push_str(rest);
    Ok((out, references))
}

#[test]
fn the_substitution_reads_what_clusterctl_reads() {
    let values = BTreeMap::from([("SET", "v"), ("EMPTY", "")]);
    let (text, references) = envsubst(
        "a: ${SET}\nb: ${UNSET:=d1}\nc: ${EMPTY:-d2}\nd: ${SET=x}\ne: $$ $HOME $ {}",
        &values,
    )
    .unwrap();
    assert_eq!(text, "a: v\nb: d1\nc: d2\nd: v\ne: $ $HOME $ {}");
    assert_eq!(references.len(), 4);
    assert_eq!(references[1].default.as_deref(), Some("d1"));
    assert!(envsubst("${UNSET}", &values).unwrap_err().contains("UNSET"));
    assert!(envsubst("${SET/a/b}", &values).is_err());
    assert!(envsubst("${SET", &values).is_err());
}

/// Every object of a multi-document YAML.
fn objects(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|object| !object.is_null())
        .collect()
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The components with `values`, as objects; panics if anything is left unresolved.
fn components(release: &BTreeMap<String, String>, values: &BTreeMap<&str, &str>) -> Vec<Value> {
    let (text, _) = envsubst(&release["addon-components.yaml"], values).unwrap();
    assert!(!text.contains("${"), "unresolved after substitution:\n{text}");
    objects(&text)
}

fn deployment(objects: &[Value]) -> &Value {
    let mut deployments = objects.iter().filter(|o| o["kind"] == "Deployment");
    let deployment = deployments.next().expect("a Deployment");
    assert!(deployments.next().is_none(), "one Deployment");
    deployment
}

/// What `clusterctl init --target-namespace` does to the objects (fixTargetNamespace in
/// cmd/clusterctl/client/repository/components.go).
fn move_to_namespace(objects: &[Value], target: &str) -> Vec<Value> {
    objects
        .iter()
        .cloned()
        .map(|mut object| {
            let kind = object["kind"].as_str().unwrap().to_owned();
            if kind == "Namespace" {
                object["metadata"]["name"] = target.into();
            }
            if !CLUSTERCTL_CLUSTER_SCOPED.contains(&kind.as_str()) {
                object["metadata"]["namespace"] = target.into();
            }
            if kind == "ClusterRoleBinding" || kind == "RoleBinding" {
                for subject in object["subjects"].as_array_mut().unwrap() {
                    if subject.get("namespace").is_some_and(|n| n != "") {
                        subject["namespace"] = target.into();
                    }
                }
            }
            object
        })
        .collect()
}

fn kubectl_ok(env: &Envtest, args: &[&str], stdin: Option<&str>) -> String {
    let out = env.kubectl_as(&env.admin_kubeconfig, args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?}: {stderr}");
    assert!(!stderr.contains("Warning"), "kubectl {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// `kubectl apply --server-side` of `objects`.
fn apply(env: &Envtest, objects: &[Value]) {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
    kubectl_ok(env, &["apply", "--server-side", "-f", "-"], Some(&list.to_string()));
}

fn get(env: &Envtest, object: &Value) -> Value {
    let (kind, name) = (
        object["kind"].as_str().unwrap(),
        object["metadata"]["name"].as_str().unwrap(),
    );
    let mut args = vec!["get", kind, name, "-o", "json"];
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        args.extend(["-n", namespace]);
    }
    serde_json::from_str(&kubectl_ok(env, &args, None)).unwrap()
}

/// Whether the signer's ServiceAccount in `namespace` may do `verb resource` (in `scope`, a
/// namespace, or cluster-wide).
fn can(env: &Envtest, namespace: &str, verb: &str, resource: &str, scope: Option<&str>) -> bool {
    let user = format!("system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}");
    let mut args = vec!["auth", "can-i", verb, resource, "--as", &user];
    if let Some(scope) = scope {
        args.extend(["-n", scope]);
    }
    let out = env.kubectl(&args);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// The signer's own permissions, in its namespace and cluster-wide.
fn assert_service_account_works(env: &Envtest, namespace: &str) {
    for (verb, resource, scope) in [
        ("create", "leases.coordination.k8s.io", Some(namespace)),
        ("delete", "leases.coordination.k8s.io", Some(namespace)),
        ("create", "secrets", Some(namespace)),
        ("list", "clusters.cluster.x-k8s.io", None),
        ("patch", "machines.cluster.x-k8s.io", Some("default")),
        ("get", "secrets", Some("default")),
    ] {
        assert!(
            can(env, namespace, verb, resource, scope),
            "{namespace}/{SERVICE_ACCOUNT} may {verb} {resource} in {scope:?}"
        );
    }
    assert!(
        !can(env, namespace, "create", "leases.coordination.k8s.io", Some("default")),
        "Leases in its own namespace only"
    );
}

#[test]
#[ignore = "needs KUBEBUILDER_ASSETS: its kubectl renders the release"]
fn the_release_renders_the_same_and_follows_the_clusterctl_contract() {
    tests::envtest::assets(SUITE);
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rendered = release(first.path());
    assert_eq!(
        rendered.keys().map(String::as_str).collect::<Vec<_>>(),
        FILES,
        "the release's files"
    );
    assert!(rendered == release(second.path()), "two renders differ");
    let release = rendered;

    // metadata.yaml: this version's release series implements the v1beta2 contract.
    let metadata: Value = serde_yaml::from_str(&release["metadata.yaml"]).unwrap();
    assert_eq!(metadata["apiVersion"], "clusterctl.cluster.x-k8s.io/v1alpha3");
    assert_eq!(metadata["kind"], "Metadata");
    let version: Vec<u64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|n| n.parse().unwrap())
        .collect();
    let series: Vec<&Value> = metadata["releaseSeries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["major"] == version[0] && s["minor"] == version[1])
        .collect();
    assert_eq!(
        series.len(),
        1,
        "one series for {}: {metadata}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(series[0]["contract"], "v1beta2");

    // The variables: each has a default (clusterctl init needs none set) and is documented.
    let (_, references) = envsubst(&release["addon-components.yaml"], &BTreeMap::new()).unwrap();
    let names: BTreeSet<&str> = references.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(VARIABLES));
    let docs = std::fs::read_to_string(tests::repo_root().join("docs/release.md")).unwrap();
    for reference in &references {
        assert!(reference.default.is_some(), "{reference:?} has no default");
        assert!(
            docs.contains(&format!("`{}`", reference.name)),
            "docs/release.md lists {}",
            reference.name
        );
    }
    // Nothing else in the other files looks like a variable of ours.
    for file in ["metadata.yaml", "workload-rbac.yaml", "prometheus.yaml"] {
        assert!(!release[file].contains("${NODE_ATTESTATION"), "{file}");
    }

    let defaults = components(&release, &BTreeMap::new());
    let namespaces: Vec<&Value> = defaults.iter().filter(|o| o["kind"] == "Namespace").collect();
    assert_eq!(namespaces.len(), 1, "exactly one Namespace");
    assert_eq!(namespaces[0]["metadata"]["name"], NAMESPACE);
    for object in &defaults {
        assert_eq!(
            object["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            PROVIDER_LABEL,
            "{}",
            describe(object)
        );
        let kind = object["kind"].as_str().unwrap();
        let namespace = &object["metadata"]["namespace"];
        if CLUSTERCTL_CLUSTER_SCOPED.contains(&kind) {
            assert!(namespace.is_null(), "{}", describe(object));
        } else {
            assert_eq!(namespace, NAMESPACE, "{}", describe(object));
        }
    }
    let pod = &deployment(&defaults)["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(
        containers[0]["name"], "manager",
        "the clusterctl contract's container name"
    );
    assert_eq!(
        containers[0]["image"],
        format!("node-attestation-signer:{}", env!("CARGO_PKG_VERSION")),
        "the image images/signer/build names"
    );
    assert_eq!(deployment(&defaults)["spec"]["replicas"], 3);
    // The selectors are config/default's own: an install made with kubectl apply -k can be
    // taken over (a Deployment's selector is immutable).
    assert_eq!(
        deployment(&defaults)["spec"]["selector"],
        serde_json::json!({"matchLabels": {"app.kubernetes.io/name": "node-attestation-signer"}})
    );

    // The extra files: config/workload, and config/prometheus in the same namespace.
    let workload = objects(&release["workload-rbac.yaml"]);
    assert!(workload.iter().any(|o| o["kind"] == "ClusterRole"), "workload RBAC");
    let prometheus = objects(&release["prometheus.yaml"]);
    let kinds: BTreeSet<&str> = prometheus.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, BTreeSet::from(["ConfigMap", "PodMonitor", "PrometheusRule"]));
    // Every alert's runbook is an absolute link to its section of the published runbooks.
    let runbooks = std::fs::read_to_string(tests::repo_root().join("docs/runbooks.md")).unwrap();
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::to_lowercase)
        .collect();
    let rule = prometheus.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let name = alert["alert"].as_str().unwrap();
            let url = alert["annotations"]["runbook_url"].as_str().unwrap();
            assert_eq!(url, format!("{DOCS_URL}/runbooks.md#{}", name.to_lowercase()), "{name}");
            assert!(
                sections.contains(&name.to_lowercase()),
                "docs/runbooks.md has no section {name}"
            );
            alerts += 1;
        }
    }
    assert_eq!(
        alerts,
        sections.len(),
        "one runbook section per alert, and one alert per section"
    );
    for object in &prometheus {
        assert_eq!(object["metadata"]["namespace"], NAMESPACE, "{}", describe(object));
        assert_eq!(
            object["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            PROVIDER_LABEL,
            "{}",
            describe(object)
        );
    }
}

#[test]
#[ignore = "needs KUBEBUILDER_ASSETS: a real kube-apiserver and etcd"]
fn the_release_installs_and_its_variables_and_target_namespace_take_effect() {
    let env = Envtest::start(SUITE);
    env.install_capi_crds();
    let out = tempfile::tempdir().unwrap();
    let release = release(out.path());

    // As `clusterctl init --addon node-attestation` with no variable set would install it.
    let defaults = components(&release, &BTreeMap::new());
    apply(&env, &defaults);
    let cluster_scoped: BTreeSet<String> =
        kubectl_ok(&env, &["api-resources", "--namespaced=false", "--no-headers"], None)
            .lines()
            .filter_map(|line| line.split_whitespace().last().map(str::to_owned))
            .collect();
    for object in &defaults {
        let kind = object["kind"].as_str().unwrap();
        assert_eq!(
            cluster_scoped.contains(kind),
            CLUSTERCTL_CLUSTER_SCOPED.contains(&kind),
            "clusterctl must see {kind}'s scope as the apiserver does"
        );
        let live = get(&env, object);
        assert_eq!(
            live["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            PROVIDER_LABEL,
            "{}",
            describe(object)
        );
    }
    let kinds: BTreeSet<&str> = defaults.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    for kind in [
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        assert!(kinds.contains(kind), "the components hold a {kind}");
    }
    let live = get(&env, deployment(&defaults));
    assert_eq!(live["spec"]["replicas"], 3);
    assert_eq!(live["spec"]["template"]["spec"]["serviceAccountName"], SERVICE_ACCOUNT);
    assert_service_account_works(&env, NAMESPACE);
    // The workload clusters' RBAC applies too (here, to the same apiserver).
    let workload = objects(&release["workload-rbac.yaml"]);
    apply(&env, &workload);
    for object in &workload {
        get(&env, object);
    }

    // The variables set, and another target namespace: what clusterctl would install.
    let image = "registry.example.com/security/node-attestation-signer:9.9.9";
    let values = BTreeMap::from([
        ("NODE_ATTESTATION_SIGNER_IMAGE", image),
        ("NODE_ATTESTATION_SIGNER_REPLICAS", "5"),
    ]);
    let target = "capi-node-attestation";
    let moved = move_to_namespace(&components(&release, &values), target);
    let text = serde_json::to_string(&moved).unwrap();
    assert!(
        !text.contains(NAMESPACE),
        "an object still names {NAMESPACE} where clusterctl would not change it: {text}"
    );
    apply(&env, &moved);
    let live = get(&env, deployment(&moved));
    assert_eq!(live["metadata"]["namespace"], target);
    assert_eq!(live["spec"]["replicas"], 5);
    assert_eq!(live["spec"]["template"]["spec"]["containers"][0]["image"], image);
    let ns = get(
        &env,
        &serde_json::json!({"kind": "Namespace", "metadata": {"name": target}}),
    );
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    assert_service_account_works(&env, target);
}

/// The monitoring objects as the Prometheus Operator's own CRDs (v0.93, from its repository's
/// `example/prometheus-operator-crd`, in `$PROMETHEUS_OPERATOR_CRDS`) define them: applied with
/// strict field validation, nothing unknown, nothing pruned, and their selectors match the
/// Deployment's pods.
#[test]
#[ignore = "needs KUBEBUILDER_ASSETS and PROMETHEUS_OPERATOR_CRDS: a real kube-apiserver and the Prometheus Operator's CRDs"]
fn the_monitoring_objects_are_valid_under_the_prometheus_operators_own_crds() {
    let crds = std::env::var("PROMETHEUS_OPERATOR_CRDS").unwrap_or_else(|_| "/opt/prometheus-operator-crds".to_owned());
    let env = Envtest::start(SUITE);
    for crd in [
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        let path = Path::new(&crds).join(crd);
        assert!(
            path.exists(),
            "{} is missing (PROMETHEUS_OPERATOR_CRDS)",
            path.display()
        );
        kubectl_ok(&env, &["apply", "--server-side", "-f", path.to_str().unwrap()], None);
    }
    kubectl_ok(
        &env,
        &[
            "wait",
            "--for=condition=Established",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "--timeout=60s",
        ],
        None,
    );
    let out = tempfile::tempdir().unwrap();
    let release = release(out.path());
    kubectl_ok(&env, &["create", "namespace", NAMESPACE], None);
    let monitoring = objects(&release["prometheus.yaml"]);
    let text =
        serde_json::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": monitoring})).unwrap();
    kubectl_ok(
        &env,
        &["apply", "--server-side", "--validate=strict", "-f", "-"],
        Some(&text),
    );
    for object in &monitoring {
        let live = get(&env, object);
        // Nothing the schema does not know was dropped: the stored spec is the one applied.
        if object.get("spec").is_some() {
            assert_eq!(live["spec"], object["spec"], "{}", describe(object));
        }
    }
    let pod_monitor = monitoring.iter().find(|o| o["kind"] == "PodMonitor").unwrap();
    let defaults = components(&release, &BTreeMap::new());
    let pod_labels = &deployment(&defaults)["spec"]["template"]["metadata"]["labels"];
    for (key, value) in pod_monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[key], value,
            "the PodMonitor selects the signer's pods by {key}"
        );
    }
    let container = &deployment(&defaults)["spec"]["template"]["spec"]["containers"][0];
    let port = pod_monitor["spec"]["podMetricsEndpoints"][0]["port"].as_str().unwrap();
    assert!(
        container["ports"].as_array().unwrap().iter().any(|p| p["name"] == port),
        "the container names its port {port}"
    );
}
