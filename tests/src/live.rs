//! A live signer against real apiservers: the fixtures of the controller suites and the load
//! harness.
//!
//! [`Workload`] turns an [`Envtest`] into an opted-in workload cluster of a management cluster
//! (possibly itself) as Cluster API leaves it: the Cluster object, `<cluster>-kubeconfig` with
//! the apiserver's admin identity, `<cluster>-ca` (the apiserver's client CA, RSA PKCS#1), and
//! kubeadm's bootstrap token. Nothing else: the signer puts its own RBAC in place and acts as
//! user `node-attestation-signer` with a certificate it issues from `<cluster>-ca`. Siblings
//! ([`Workload::add_sibling`]) take the other way, an operator's kubeconfig in
//! `<cluster>-node-attestation-kubeconfig`.
//! [`Signer`] runs `node-attestation-signer run` as a process under the management ServiceAccount's
//! identity, bound by `config/rbac/management-cluster.yaml`: the suites exercise least privilege.

use crate::envtest::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::envtest::Envtest;
use crate::strict_der::assert_strict_der_pem;

/// The management ServiceAccount's user name.
pub const SIGNER_SERVICE_ACCOUNT: &str = "system:serviceaccount:node-attestation-system:node-attestation-signer";
/// The user of the admin kubeconfig Cluster API writes in `<cluster>-kubeconfig`.
pub const CLUSTER_API_ADMIN: &str = "kubernetes-admin";
/// The bootstrap token every fixture Machine's KubeadmConfig names.
pub const TOKEN: &str = "abcdef.0123456789abcdef";

/// A kube client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Client {
    client_from_kubeconfig(&std::fs::read_to_string(kubeconfig).expect("kubeconfig")).await
}

/// A client for a kubeconfig's text (a `<cluster>-kubeconfig` Secret's `value`).
pub async fn client_from_kubeconfig(text: &str) -> Client {
    let parsed = kube::config::Kubeconfig::from_yaml(text).expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig config");
    Client::try_from(config).expect("client")
}

fn resource(object: &Value) -> ApiResource {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// The namespaced or cluster-wide API of `object`'s kind.
fn dynamic_api(client: &Client, object: &Value) -> (Api<DynamicObject>, String) {
    let resource = resource(object);
    let name = object["metadata"]["name"].as_str().expect("name").to_owned();
    let api = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    (api, name)
}

/// The sum of the samples of a metric whose line starts with `prefix` (name and labels) in a
/// Prometheus text exposition.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Server-side applies `object` (JSON, any kind) and then merges its `status`, as controllers
/// would write it.
pub async fn apply(client: &Client, object: &Value) -> Value {
    write(client, object, false).await
}

/// Creates `object` (JSON, any kind) with a `POST` and then merges its `status`: cheaper for
/// the apiserver than [`apply`] (no field-ownership merge), for fleets of new objects.
pub async fn create(client: &Client, object: &Value) -> Value {
    write(client, object, true).await
}

async fn write(client: &Client, object: &Value, post: bool) -> Value {
    let (api, name) = dynamic_api(client, object);
    let name = name.as_str();
    let mut body = object.clone();
    if let Some(meta) = body["metadata"].as_object_mut() {
        for owned in ["uid", "resourceVersion", "creationTimestamp"] {
            meta.remove(owned);
        }
    }
    let status = body.as_object_mut().and_then(|o| o.remove("status"));
    let mut applied = if post {
        let body: DynamicObject = serde_json::from_value(body).expect("an object");
        api.create(&PostParams::default(), &body).await
    } else {
        let params = PatchParams::apply("tests").force();
        api.patch(name, &params, &Patch::Apply(&body)).await
    }
    .unwrap_or_else(|e| panic!("write {name}: {e}"));
    if let Some(status) = status {
        applied = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
            .await
            .unwrap_or_else(|e| panic!("status of {name}: {e}"));
    }
    serde_json::to_value(applied).expect("JSON")
}

/// Deletes `object` if present.
pub async fn delete(client: &Client, object: &Value) {
    let (api, name) = dynamic_api(client, object);
    let name = name.as_str();
    let _ = api.delete(name, &Default::default()).await;
}

/// Reads an object back.
pub async fn get(client: &Client, object: &Value) -> Value {
    let (api, name) = dynamic_api(client, object);
    let name = name.as_str();
    serde_json::to_value(api.get(name).await.unwrap_or_else(|e| panic!("get {name}: {e}"))).expect("JSON")
}

/// Applies every document of a YAML file in the repository.
pub async fn apply_file(client: &Client, path: &str) {
    let text = std::fs::read_to_string(crate::repo_root().join(path)).expect("manifest");
    apply_yaml(client, &text).await;
}

/// Server-side applies every object of a YAML stream.
pub async fn apply_yaml(client: &Client, text: &str) {
    for document in serde_yaml::Deserializer::from_str(text) {
        let object: Value = serde::Deserialize::deserialize(document).expect("YAML");
        if !object.is_null() {
            apply(client, &object).await;
        }
    }
}

/// One workload cluster (an [`Envtest`]) and its Cluster object in a management cluster.
pub struct Workload {
    /// The apiserver.
    pub env: Envtest,
    /// Admin of the workload apiserver.
    pub admin: Client,
    /// Cluster name.
    pub cluster: String,
    /// Cluster namespace (in the management cluster).
    pub namespace: String,
    /// kubeadm's bootstrap token user, as a client of the workload apiserver.
    pub bootstrap: Client,
    /// The operator's kubeconfig siblings use, made once.
    operator_kubeconfig: tokio::sync::OnceCell<String>,
}

impl Workload {
    /// Prepares `env` as workload cluster `namespace/cluster` of `management` (which may be
    /// `env`'s own admin client): CRDs and RBAC where needed, the Cluster (allowing
    /// `attestors`), its Secrets and the bootstrap token.
    pub async fn register(env: Envtest, management: &Client, namespace: &str, cluster: &str, attestors: &str) -> Self {
        let admin = client(&env.admin_kubeconfig).await;
        apply(
            management,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await;
        let mut cluster_object = crate::capi::cluster(attestors);
        cluster_object["metadata"]["name"] = json!(cluster);
        cluster_object["metadata"]["namespace"] = json!(namespace);
        apply(management, &cluster_object).await;
        // What Cluster API writes: a client certificate for kubernetes-admin in system:masters.
        let (admin_cert, admin_key) = env.client_certificate(CLUSTER_API_ADMIN, &["system:masters"]);
        let cluster_api_kubeconfig =
            env.kubeconfig_for_certificate(&format!("{cluster}-cluster-api-admin"), &admin_cert, &admin_key);
        let kubeconfig_text = std::fs::read_to_string(&cluster_api_kubeconfig).expect("kubeconfig");
        apply(
            management,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{cluster}-kubeconfig"), "namespace": namespace},
                    "stringData": {"value": kubeconfig_text}}),
        )
        .await;
        apply(
            management,
            &json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": format!("{cluster}-ca"), "namespace": namespace},
                    "stringData": {"tls.crt": String::from_utf8_lossy(&env.client_ca.cert_pem),
                                   "tls.key": String::from_utf8_lossy(&env.client_ca.key_pem)}}),
        )
        .await;
        let (id, secret) = TOKEN.split_once('.').expect("token");
        add_bootstrap_token(&admin, id, secret).await;
        apply(
            &admin,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:kubelet-bootstrap"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-bootstrapper"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}),
        )
        .await;
        let bootstrap = client(&env.bootstrap_kubeconfig(TOKEN)).await;
        Self {
            env,
            admin,
            cluster: cluster.to_owned(),
            namespace: namespace.to_owned(),
            bootstrap,
            operator_kubeconfig: tokio::sync::OnceCell::new(),
        }
    }

    /// The Events on this Cluster (in its management namespace) with `reason`, as (type, note).
    pub fn cluster_events(&self, reason: &str) -> Vec<(String, String)> {
        let events = self
            .env
            .kubectl(&["get", "events.events.k8s.io", "-n", &self.namespace, "-o", "json"]);
        let events: Value = serde_json::from_slice(&events.stdout).expect("kubectl's Event list");
        events["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|e| e["regarding"]["kind"] == "Cluster" && e["reason"] == reason)
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// A client of the workload apiserver as bootstrap token `<id>.<secret>` (added first).
    pub async fn bootstrap_client(&self, token: &str) -> Client {
        let (id, secret) = token.split_once('.').expect("token");
        add_bootstrap_token(&self.admin, id, secret).await;
        client(&self.env.bootstrap_kubeconfig(token)).await
    }

    /// A client of the workload apiserver with a certificate the signer issued (the node key
    /// of `key_pem`).
    pub async fn node_client(&self, node: &str, cert_pem: &str, key_pem: &str) -> Client {
        client(&self.env.kubeconfig_for_certificate(node, cert_pem, key_pem)).await
    }

    /// Adds a bootstrapped Machine `name` of this Cluster with `provider_id` to `management`,
    /// with its KubeadmConfig `<name>-kc` naming the fixture token.
    pub async fn add_machine(&self, management: &Client, name: &str, provider_id: &str) {
        apply(
            management,
            &self.own(crate::capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2")),
        )
        .await;
        apply(management, &self.own(crate::capi::machine(name, Some(provider_id)))).await;
    }

    /// Adds bootstrapped Machines `(name, provider ID)` of this Cluster to `management`, all
    /// naming one KubeadmConfig `shared-kc` (the fixture token), `parallel` writes at a time:
    /// thousands of Machines for the price of one config.
    pub async fn add_machines(&self, management: &Client, machines: &[(String, String)], parallel: usize) {
        use futures::StreamExt;
        apply(
            management,
            &self.own(crate::capi::kubeadm_config("shared-kc", "abcdef", "v1beta2")),
        )
        .await;
        let writes = machines.iter().map(|(name, provider_id)| {
            let mut machine = self.own(crate::capi::machine(name, Some(provider_id)));
            machine["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(self.cluster);
            machine["spec"]["bootstrap"]["configRef"]["name"] = json!("shared-kc");
            async move {
                apply(management, &machine).await;
            }
        });
        futures::stream::iter(writes)
            .buffer_unordered(parallel.max(1))
            .collect::<Vec<_>>()
            .await;
    }

    /// Adds another opted-in Cluster `name` in this Cluster's namespace of `management` that
    /// watches the same apiserver with a CA of its own (a shared one is refused): a quiet Cluster
    /// that widens the fleet. Its CA is not the apiserver's, so the signer cannot act there
    /// with a certificate of its own: the sibling takes the operator's way,
    /// `<name>-node-attestation-kubeconfig` for user `node-attestation-signer` (RBAC applied
    /// by the fixture, as the operator would), and no `<name>-kubeconfig` at all.
    pub async fn add_sibling(&self, management: &Client, name: &str) {
        self.add_sibling_in(management, &self.namespace, name).await;
    }

    /// [`Workload::add_sibling`] in `namespace` of `management` (which must exist) instead of
    /// this Cluster's: a fleet spread over namespaces, as teams keep theirs.
    pub async fn add_sibling_in(&self, management: &Client, namespace: &str, name: &str) {
        let kubeconfig = self
            .operator_kubeconfig
            .get_or_init(|| async {
                apply_file(&self.admin, "config/workload/workload-cluster.yaml").await;
                let (cert, key) = self.env.client_certificate("node-attestation-signer", &[]);
                let path = self
                    .env
                    .kubeconfig_for_certificate(&format!("signer-in-{}", self.cluster), &cert, &key);
                std::fs::read_to_string(path).expect("kubeconfig")
            })
            .await;
        let ca = crate::ca::openssl_ca(crate::ca::CaKeyFormat::RsaPkcs1, 30);
        let mut cluster = crate::capi::cluster("insecure");
        cluster["metadata"]["name"] = json!(name);
        cluster["metadata"]["namespace"] = json!(namespace);
        apply(management, &cluster).await;
        apply(
            management,
            &json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": format!("{name}-node-attestation-kubeconfig"), "namespace": namespace},
                    "stringData": {"value": kubeconfig}}),
        )
        .await;
        apply(
            management,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-ca"), "namespace": namespace},
                    "stringData": {"tls.crt": String::from_utf8_lossy(&ca.cert_pem), "tls.key": String::from_utf8_lossy(&ca.key_pem)}}),
        )
        .await;
    }

    /// Sets this Cluster's object in `management` to fixture form for `object`: name and
    /// namespace of this Cluster.
    pub fn own(&self, mut object: Value) -> Value {
        object["metadata"]["namespace"] = json!(self.namespace);
        // Cluster API's defaulting webhooks keep the label equal to spec.clusterName
        // (`internal/webhooks/machine.go`, `Default`); a fixture's stays so too.
        if let Some(label) = object.pointer_mut("/metadata/labels/cluster.x-k8s.io~1cluster-name") {
            *label = json!(self.cluster);
        }
        if let Some(spec) = object.get_mut("spec") {
            if spec.get("clusterName").is_some() {
                spec["clusterName"] = json!(self.cluster);
            }
            if let Some(template) = spec.pointer_mut("/template/spec/clusterName") {
                *template = json!(self.cluster);
            }
        }
        object
    }
}

/// `count` quiet opted-in Clusters `<namespace>/<namespace>-<i>` of `management`, all watching
/// `env` (an apiserver that carries no load), each with a CA of its own: a wide fleet for the
/// price of one apiserver. Returns the first, whose [`Workload::add_sibling`] made the others.
pub async fn quiet_clusters(env: Envtest, management: &Client, namespace: &str, count: usize) -> Workload {
    let clusters: Vec<(String, String)> = (0..count.max(1))
        .map(|i| (namespace.to_owned(), format!("{namespace}-{i}")))
        .collect();
    quiet_clusters_in(env, management, &clusters).await
}

/// [`quiet_clusters`] named one by one: `clusters` (`namespace`, `name`), at least one, the
/// first registered (its namespace created), the others its siblings in their own namespaces
/// ([`Workload::add_sibling_in`]; those namespaces must exist).
pub async fn quiet_clusters_in(env: Envtest, management: &Client, clusters: &[(String, String)]) -> Workload {
    let ((namespace, name), siblings) = clusters.split_first().expect("at least one quiet Cluster");
    let w = Workload::register(env, management, namespace, name, "insecure").await;
    for (namespace, name) in siblings {
        w.add_sibling_in(management, namespace, name).await;
    }
    w
}

/// Creates bootstrap token `<id>.<secret>` in kube-system.
pub async fn add_bootstrap_token(admin: &Client, id: &str, secret: &str) {
    apply(
        admin,
        &json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
                "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
                "stringData": {"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true"}}),
    )
    .await;
}

/// CSR `name` once the signer has written `annotation` on it (a two-phase provider's
/// challenge): its UID and the annotation's value. Panics with `signer`'s log after 30 s.
pub async fn wait_annotation(admin: &Client, name: &str, annotation: &str, signer: &Signer) -> (String, String) {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    for _ in 0..300 {
        let csr = api.get(name).await.expect("the CSR");
        if let Some(value) = csr.metadata.annotations.as_ref().and_then(|a| a.get(annotation)) {
            return (csr.metadata.uid.clone().unwrap_or_default(), value.clone());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never carried {annotation}\n{}", signer.log());
}

/// How a CSR ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// Signed: the certificate PEM.
    Issued(String),
    /// Approved, not signed (serving CSRs: kube-controller-manager signs).
    Approved,
    /// Denied with this reason and message.
    Denied(String, String),
    /// Failed with this reason and message.
    Failed(String, String),
    /// Nothing within the timeout.
    Pending,
}

impl Final {
    /// The reason of a denial or failure.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Denied(r, _) | Self::Failed(r, _) => Some(r),
            _ => None,
        }
    }
}

/// Where a CSR stands now.
pub fn state_of(csr: &CertificateSigningRequest) -> Final {
    let status = csr.status.clone().unwrap_or_default();
    if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
        return Final::Issued(String::from_utf8_lossy(&cert.0).into_owned());
    }
    let conditions = status.conditions.unwrap_or_default();
    for terminal in ["Denied", "Failed"] {
        if let Some(c) = conditions.iter().find(|c| c.type_ == terminal) {
            let (reason, message) = (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            );
            return if terminal == "Denied" {
                Final::Denied(reason, message)
            } else {
                Final::Failed(reason, message)
            };
        }
    }
    if conditions.iter().any(|c| c.type_ == "Approved") {
        return Final::Approved;
    }
    Final::Pending
}

/// Files a CSR named `name` with `client`, retrying briefly while a new bootstrap token
/// propagates to the apiserver's authenticator cache.
pub async fn file_csr(client: &Client, name: &str, signer: &str, request: &[u8], usages: &[&str]) {
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
        "spec": {"signerName": signer, "request": base64(request), "usages": usages}
    }))
    .expect("CSR");
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match api.create(&PostParams::default(), &csr).await {
            Ok(_) => return,
            Err(e) if Instant::now() > deadline => panic!("file CSR {name}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits until CSR `name` ends (issued, denied, failed; `approved_is_final` for serving CSRs),
/// or `timeout` passes. An issued certificate must be strict DER
/// ([`crate::strict_der::assert_strict_der_pem`]).
pub async fn wait_final(admin: &Client, name: &str, approved_is_final: bool, timeout: Duration) -> Final {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(csr) = api.get(name).await {
            let state = state_of(&csr);
            match state {
                Final::Pending => {}
                Final::Approved if !approved_is_final => {}
                Final::Issued(pem) => {
                    assert_strict_der_pem(&format!("CSR {name}'s status.certificate"), pem.as_bytes());
                    return Final::Issued(pem);
                }
                done => return done,
            }
        }
        if Instant::now() > deadline {
            return Final::Pending;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `node-attestation-signer run` as a child process.
pub struct Signer {
    binary: PathBuf,
    args: Vec<String>,
    /// Added to the process's environment.
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
    /// `http://127.0.0.1:<port>/metrics`
    pub metrics_url: String,
}

impl Signer {
    /// Starts the signer against `management` (an [`Envtest`] with the Cluster API CRDs) as
    /// the management ServiceAccount, after applying the management RBAC. `extra` flags are
    /// appended.
    pub async fn start(binary: &Path, management: &Envtest, extra: &[&str]) -> Self {
        let kubeconfig = Self::management_identity(management).await;
        Self::run_as(binary, management, &kubeconfig, extra)
    }

    /// [`Signer::start`] without the suites' `--resync-period 2s --secret-resync-period 2s`: every flag at the signer's
    /// default unless `extra` sets it, as the load harness compares it.
    pub async fn start_with_defaults(binary: &Path, management: &Envtest, extra: &[&str]) -> Self {
        let kubeconfig = Self::management_identity(management).await;
        Self::spawn_with(binary, management, &kubeconfig, &[], extra)
    }

    /// Applies the management RBAC and returns a kubeconfig of the management ServiceAccount.
    pub async fn management_identity(management: &Envtest) -> PathBuf {
        let admin = client(&management.admin_kubeconfig).await;
        apply(
            &admin,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "node-attestation-system"}}),
        )
        .await;
        apply_file(&admin, "config/rbac/management-cluster.yaml").await;
        let (cert, key) = management.client_certificate(SIGNER_SERVICE_ACCOUNT, &["system:serviceaccounts"]);
        management.kubeconfig_for_certificate("signer-management", &cert, &key)
    }

    /// Starts the signer with `kubeconfig` as its management identity, nothing applied first.
    pub fn run_as(binary: &Path, management: &Envtest, kubeconfig: &Path, extra: &[&str]) -> Self {
        Self::spawn_with(
            binary,
            management,
            kubeconfig,
            &["--resync-period", "2s", "--secret-resync-period", "2s"],
            extra,
        )
    }

    /// Starts the signer with `kubeconfig` as its management identity and `tuning` then `extra`
    /// as flags (`tuning` empty: every flag at its default unless `extra` sets it).
    pub fn spawn_with(binary: &Path, management: &Envtest, kubeconfig: &Path, tuning: &[&str], extra: &[&str]) -> Self {
        let mut signer = Self::prepared(binary, management, kubeconfig, tuning, extra);
        signer.restart();
        signer
    }

    /// [`Signer::start`] with `env` added to the process's environment (a cloud's credentials).
    pub async fn start_with_env(
        binary: &Path,
        management: &Envtest,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Self {
        let kubeconfig = Self::management_identity(management).await;
        let tuning = ["--resync-period", "2s", "--secret-resync-period", "2s"];
        let mut signer = Self::prepared(binary, management, &kubeconfig, &tuning, extra);
        signer.env = env;
        signer.restart();
        signer
    }

    /// The process's command line, not started.
    fn prepared(binary: &Path, management: &Envtest, kubeconfig: &Path, tuning: &[&str], extra: &[&str]) -> Self {
        let (metrics, health) = (free_port(), free_port());
        let mut args: Vec<String> = vec![
            "run".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--metrics-bind-address".into(),
            format!("127.0.0.1:{metrics}"),
            "--health-probe-bind-address".into(),
            format!("127.0.0.1:{health}"),
        ];
        args.extend(tuning.iter().chain(extra).map(ToString::to_string));
        Self {
            binary: binary.to_owned(),
            args,
            env: Vec::new(),
            child: None,
            log: management.dir().join("signer.log"),
            metrics_url: format!("http://127.0.0.1:{metrics}/metrics"),
        }
    }

    /// (Re)starts the process; its log is appended to.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("signer log");
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var("SIGNER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start node-attestation-signer");
        self.child = Some(child);
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, what the kubelet sends, and waits for the process to exit.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// The file the process logs to (appended to across restarts; every [`Signer`] of one
    /// management [`Envtest`] shares it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `127.0.0.1:<port>` of `/metrics`, as a Prometheus scrape target.
    pub fn metrics_target(&self) -> String {
        self.metrics_url
            .trim_start_matches("http://")
            .trim_end_matches("/metrics")
            .to_owned()
    }

    /// The `/metrics` text, or an empty string when not serving.
    pub fn metrics(&self) -> String {
        http_get(&self.metrics_url)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        self.kill();
        // The log lives in the apiserver's temporary folder; keep a copy when asked.
        if let Some(dir) = std::env::var_os("SIGNER_LOG_DIR") {
            let name = format!("signer-{}.log", std::process::id());
            let _ = std::fs::copy(&self.log, Path::new(&dir).join(name));
        }
    }
}

/// Every Event (`events.k8s.io`) of `namespace`, as `(regarding name, reason, note)`.
pub fn events(env: &Envtest, namespace: &str) -> Vec<(String, String, String)> {
    let out = env.kubectl(&["get", "events.events.k8s.io", "-n", namespace, "-o", "json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|e| {
                    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                    (text(&e["regarding"]["name"]), text(&e["reason"]), text(&e["note"]))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The body of a plain-HTTP `GET` of `url` (`http://host:port/path`; a signer's or etcd's
/// `/metrics`), or an empty string when nothing answers.
pub fn http_get(url: &str) -> String {
    let Some(rest) = url.strip_prefix("http://") else {
        return String::new();
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return String::new();
    };
    use std::io::{Read, Write};
    let _ = write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// Standard base64.
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `name`, built by a sibling crate into the same target directory as `beside` (a test's own
/// `CARGO_BIN_EXE_*`): `cargo build -p signer` (scripts/test builds the workspace first).
pub fn sibling_binary(beside: &str, name: &str) -> PathBuf {
    let path = Path::new(beside).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build --workspace)",
        path.display()
    );
    path
}

/// `kubectl auth whoami` through `kubeconfig` (a kubelet kubeconfig whose user is the plugin):
/// the username the apiserver saw. Panics with kubectl's error and the signer's log.
pub fn whoami(env: &Envtest, kubeconfig: &Path, signer: &Signer) -> String {
    let out = env.kubectl_as(kubeconfig, &["auth", "whoami", "-o", "json"], None);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        signer.log()
    );
    let who: Value = serde_json::from_slice(&out.stdout).expect("whoami JSON");
    who["status"]["userInfo"]["username"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The kubelet kubeconfig the plugin at `plugin` renders with its own `kubeconfig` command for
/// `node_flags` (as an image bakes it), pointed at `env`, written to `dir/kubelet.conf`.
pub fn kubelet_kubeconfig(plugin: &str, env: &Envtest, node_flags: &[String], dir: &Path) -> PathBuf {
    let out = Command::new(plugin)
        .args(node_flags)
        .args(["kubeconfig", "--server", &env.server, "--ca-file"])
        .arg(&env.client_ca.cert_path)
        .args(["--command", plugin])
        .env_remove("KUBERNETES_EXEC_INFO")
        .output()
        .expect("run the plugin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = dir.join("kubelet.conf");
    std::fs::write(&path, &out.stdout).expect("write the kubelet kubeconfig");
    path
}
