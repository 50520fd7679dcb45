//! join-floor: the least any signer of attested joins must do per join, with the signer's own
//! client stack (kube-rs over hyper, h2 and rustls, aws-lc, the `attestation` crate's CSR
//! check and CA), and nothing else: no rule engine, no Machine cache, no queue, no fleet.
//!
//! `signer-load --signer-bin <this>` runs it where the signer runs, with the signer's command
//! line (`run --kubeconfig … --metrics-bind-address …`; the rest is ignored), so its CPU per
//! join is measured beside kube-controller-manager's in the same run (docs/capacity.md, "The
//! floor of a join"). Per CSR of `insecure/v1` it does what the SPEC's join cannot do without:
//!
//! - watches the workload cluster's CSRs (one watch, managed fields dropped, as the signer);
//! - checks the CSR's signature (P-256);
//! - writes the claim: a merge patch of one annotation on the Machine (the Machine is named by
//!   the harness's convention, so no Machine is looked up, watched or cached);
//! - reads the Cluster not older than the claim (`clusterctl move`'s pause);
//! - `PUT …/approval`, signs with the Cluster's CA, `PUT …/status`.
//!
//! Each answer is read for its resourceVersion only. It serves `node_attestation_clusters
//! {state="Ready"}` on the metrics address so the harness knows when it is ready. It is a
//! measuring stick, not a signer: it trusts every CSR the harness files.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use attestation::ca::{ClusterCa, Validity};
use attestation::csr::ParsedCsr;
use attestation::identity::ProviderId;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Semaphore;

/// CSRs of one cluster being joined at once (the signer's `--concurrency-per-cluster` default).
const AT_ONCE: usize = 64;

/// The claim's annotation: the one the signer writes.
const CLAIM: &str = attestation::names::ANNOTATION_CLAIM;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| panic!("join-floor needs {flag}"))
    };
    let management = tests::live::client(std::path::Path::new(&value("--kubeconfig"))).await;
    let ready = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let address = value("--metrics-bind-address");
    let gauge = Arc::clone(&ready);
    std::thread::spawn(move || serve_metrics(&address, &gauge));

    let clusters_resource = resource("cluster.x-k8s.io", "v1beta2", "Cluster");
    let clusters: Api<DynamicObject> = Api::all_with(management.clone(), &clusters_resource);
    let mut tasks = Vec::new();
    for cluster in clusters.list(&ListParams::default()).await.expect("list Clusters") {
        let namespace = cluster.namespace().expect("a namespaced Cluster");
        let name = cluster.name_any();
        let secrets: Api<Secret> = Api::namespaced(management.clone(), &namespace);
        let kubeconfig = secret_value(&secrets, &format!("{name}-kubeconfig"), "value").await;
        let ca_secret = format!("{name}-ca");
        let ca = ClusterCa::from_pem(
            &secret_value(&secrets, &ca_secret, "tls.crt").await,
            &secret_value(&secrets, &ca_secret, "tls.key").await,
        )
        .expect("the Cluster's CA");
        let workload = tests::live::client_from_kubeconfig(&String::from_utf8_lossy(&kubeconfig)).await;
        let join = Arc::new(Join {
            management: management.clone(),
            workload,
            ca,
            namespace,
            cluster: name,
            clusters: clusters_resource.clone(),
            machines: resource("cluster.x-k8s.io", "v1beta2", "Machine"),
        });
        tasks.push(tokio::spawn(join.watch(Arc::clone(&ready))));
    }
    futures::future::join_all(tasks).await;
}

/// One workload cluster's joins.
struct Join {
    management: Client,
    workload: Client,
    ca: ClusterCa,
    namespace: String,
    cluster: String,
    clusters: ApiResource,
    machines: ApiResource,
}

impl Join {
    async fn watch(self: Arc<Self>, ready: Arc<std::sync::atomic::AtomicUsize>) {
        let api: Api<CertificateSigningRequest> = Api::all(self.workload.clone());
        let (_store, writer) = reflector::store();
        let mut events = watcher(api, watcher::Config::default())
            .modify(|csr| csr.managed_fields_mut().clear())
            .reflect(writer)
            .boxed();
        let taken: Arc<Mutex<HashSet<String>>> = Arc::default();
        let slots = Arc::new(Semaphore::new(AT_ONCE));
        while let Some(event) = events.next().await {
            let csr = match event {
                Ok(watcher::Event::InitDone) => {
                    ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    continue;
                }
                Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) => csr,
                _ => continue,
            };
            let pending = csr
                .status
                .as_ref()
                .is_none_or(|s| s.conditions.as_ref().is_none_or(Vec::is_empty));
            if !pending
                || csr.spec.signer_name != attestation::names::SIGNER_INSECURE
                || !taken.lock().expect("lock").insert(csr.name_any())
            {
                continue;
            }
            let permit = Arc::clone(&slots).acquire_owned().await.expect("semaphore");
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                if let Err(why) = this.join(csr).await {
                    eprintln!("join-floor: {why}");
                }
                drop(permit);
            });
        }
    }

    async fn join(&self, mut csr: CertificateSigningRequest) -> Result<(), String> {
        let name = csr.name_any();
        let der = pem::parse(&csr.spec.request.0).map_err(|e| format!("{name}: {e}"))?;
        let parsed = ParsedCsr::from_der(der.contents()).map_err(|e| format!("{name}: {e}"))?;
        parsed.verify_signature().map_err(|e| format!("{name}: {e}"))?;
        let provider_id = parsed
            .provider_id_extensions()
            .next()
            .and_then(|e| ProviderId::from_extension_value(&e.value).ok())
            .ok_or_else(|| format!("{name}: no provider ID"))?;
        let node = parsed
            .common_names()
            .next()
            .and_then(|cn| cn.value.as_deref()?.strip_prefix("system:node:"))
            .ok_or_else(|| format!("{name}: not a node"))?
            .to_owned();

        // The claim, and the Cluster not older than it.
        let machines: Api<DynamicObject> =
            Api::namespaced_with(self.management.clone(), &self.namespace, &self.machines);
        let patch = serde_json::json!({"metadata": {"annotations": {CLAIM: csr.metadata.uid}}});
        let request = kube::core::Request::new(machines.resource_url())
            .patch(
                &node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .map_err(|e| e.to_string())?;
        let claimed = version_of(&self.management.request_text(request).await.map_err(|e| e.to_string())?);
        let clusters: Api<DynamicObject> =
            Api::namespaced_with(self.management.clone(), &self.namespace, &self.clusters);
        let request = kube::core::Request::new(clusters.resource_url())
            .get(
                &self.cluster,
                &kube::api::GetParams {
                    resource_version: claimed,
                },
            )
            .map_err(|e| e.to_string())?;
        self.management.request_text(request).await.map_err(|e| e.to_string())?;

        // Approved, signed.
        csr.status.get_or_insert_default().conditions = Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("JoinFloor".into()),
            message: Some(format!("the floor of a join, for Machine {node}")),
            last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            last_transition_time: None,
        }]);
        csr.metadata.resource_version = self.put(&name, "approval", &csr).await?;
        let validity = Validity {
            now: time::OffsetDateTime::now_utc(),
            requested_seconds: csr.spec.expiration_seconds.map(i64::from),
            max: time::Duration::days(365),
        };
        let certificate = self
            .ca
            .issue(&parsed, &provider_id, validity)
            .map_err(|e| format!("{name}: {e}"))?;
        csr.status.get_or_insert_default().certificate = Some(k8s_openapi::ByteString(certificate.pem().into_bytes()));
        self.put(&name, "status", &csr).await?;
        Ok(())
    }

    /// Replaces `subresource`; returns the new resourceVersion.
    async fn put(
        &self,
        name: &str,
        subresource: &str,
        csr: &CertificateSigningRequest,
    ) -> Result<Option<String>, String> {
        let api: Api<CertificateSigningRequest> = Api::all(self.workload.clone());
        let body = serde_json::to_vec(csr).map_err(|e| e.to_string())?;
        let request = kube::core::Request::new(api.resource_url())
            .replace_subresource(subresource, name, &PostParams::default(), body)
            .map_err(|e| e.to_string())?;
        let answer = self.workload.request_text(request).await.map_err(|e| e.to_string())?;
        Ok(version_of(&answer))
    }
}

/// An answer's `metadata.resourceVersion`, nothing else of it parsed into values.
fn version_of(answer: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        resource_version: Option<String>,
    }
    serde_json::from_str::<Answer>(answer).ok()?.metadata.resource_version
}

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

async fn secret_value(secrets: &Api<Secret>, name: &str, key: &str) -> Vec<u8> {
    let secret = secrets.get(name).await.unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    secret
        .data
        .and_then(|mut d| d.remove(key))
        .unwrap_or_else(|| panic!("Secret {name} has no {key}"))
        .0
}

/// Answers every request on `address` with the one gauge the harness waits for (a thread of its
/// own: the harness asks a few times a second until it is ready, then not at all).
fn serve_metrics(address: &str, ready: &std::sync::atomic::AtomicUsize) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(address).expect("metrics address");
    for mut stream in listener.incoming().flatten() {
        let mut buffer = [0u8; 4096];
        let _ = stream.read(&mut buffer);
        let ready = ready.load(std::sync::atomic::Ordering::SeqCst);
        let body = format!("node_attestation_clusters{{state=\"Ready\"}} {ready}\n");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes());
    }
}

#[cfg(test)]
mod answers {
    use super::version_of;

    #[test]
    fn reads_only_the_resource_version_of_an_answer() {
        let answer = r#"{"kind":"CertificateSigningRequest","metadata":{"name":"n-1","resourceVersion":"42",
            "managedFields":[{"manager":"x"}]},"status":{"certificate":"…"}}"#;
        assert_eq!(version_of(answer).as_deref(), Some("42"));
        assert_eq!(version_of(r#"{"metadata":{}}"#), None);
        assert_eq!(version_of("not JSON"), None);
    }
}
