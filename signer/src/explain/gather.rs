//! What `explain` reads, and only reads: every request goes through a client that sends
//! nothing but `GET`s ([`crate::controller::client::build_read_only`]).
//!
//! - management cluster: the Cluster, its Machines, MachinePools and KubeadmConfigs (as the
//!   controller's views), its `<cluster>-kubeconfig` Secret (unless the operator gives a
//!   workload kubeconfig), and the Events in its namespace. Never the `<cluster>-ca` Secret or
//!   the `tpm/v1` challenge key: either would let their reader issue node identities.
//! - workload cluster: its CSRs and Nodes.

use std::path::Path;

use anyhow::{Context, Result, bail};
use attestation::machine::{
    ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView, NodeView, ObjectError,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::Value;
use zeroize::Zeroizing;

use crate::controller::client::build_read_only;
use crate::controller::management::CapiResources;

/// An Event, as `explain` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventLine {
    /// When it last happened (RFC 3339).
    pub at: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// CamelCase reason.
    pub reason: String,
    /// `Kind/name` of the object it is about.
    pub regarding: String,
    /// UID of that object.
    #[serde(skip)]
    pub regarding_uid: String,
    /// How many times (folded repeats).
    pub count: i32,
    /// The text.
    pub note: String,
}

impl EventLine {
    fn from_event(event: &Event) -> Self {
        let regarding = event.regarding.as_ref();
        let at = event
            .series
            .as_ref()
            .map(|s| s.last_observed_time.0.to_string())
            .or_else(|| event.event_time.as_ref().map(|t| t.0.to_string()))
            .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0.to_string()))
            .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_default();
        Self {
            at,
            type_: event.type_.clone().unwrap_or_default(),
            reason: event.reason.clone().unwrap_or_default(),
            regarding: format!(
                "{}/{}",
                regarding.and_then(|r| r.kind.as_deref()).unwrap_or("?"),
                regarding.and_then(|r| r.name.as_deref()).unwrap_or("?")
            ),
            regarding_uid: regarding.and_then(|r| r.uid.clone()).unwrap_or_default(),
            count: event
                .series
                .as_ref()
                .map(|s| s.count)
                .or(event.deprecated_count)
                .unwrap_or(1),
            note: event.note.clone().unwrap_or_default(),
        }
    }
}

/// The management cluster, read-only.
pub struct ManagementReader {
    client: Client,
    clusters: ApiResource,
    machines: ApiResource,
    pools: Option<ApiResource>,
    configs: Option<ApiResource>,
}

/// One Cluster's side of the management cluster, as the controller would see it.
pub struct ClusterFacts {
    /// The Cluster.
    pub cluster: ClusterView,
    /// Its Machines, MachinePools and the KubeadmConfigs of its namespace.
    pub inventory: Inventory,
    /// Objects that do not read as views (the controller ignores them too), and why.
    pub unreadable: Vec<String>,
    /// The Events of its namespace about it, its Machines and MachinePools.
    pub events: Vec<EventLine>,
}

fn views<V>(
    objects: &[DynamicObject],
    view: fn(&Value) -> Result<V, ObjectError>,
    unreadable: &mut Vec<String>,
) -> Vec<V> {
    objects
        .iter()
        .filter_map(|object| {
            let value = serde_json::to_value(object).ok()?;
            view(&value)
                .map_err(|e| {
                    unreadable.push(format!(
                        "{}/{}: {e}",
                        object.metadata.namespace.as_deref().unwrap_or_default(),
                        object.metadata.name.as_deref().unwrap_or_default()
                    ));
                })
                .ok()
        })
        .collect()
}

impl ManagementReader {
    /// Connects with `kubeconfig` (else in-cluster, else `~/.kube/config`) and finds which
    /// Cluster API versions are served.
    pub async fn connect(kubeconfig: Option<&Path>, timeout: std::time::Duration) -> Result<Self> {
        let mut config = crate::controller::management_config(kubeconfig).await?;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        let client = build_read_only(config).context("cannot build the management client")?;
        let CapiResources {
            clusters,
            machines,
            pools,
            configs,
        } = CapiResources::discover(&client).await?;
        Ok(Self {
            client,
            clusters,
            machines,
            pools,
            configs,
        })
    }

    fn api(&self, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        }
    }

    /// `(namespace, name)` of the Cluster whose Machine (or MachinePool instance) carries
    /// `provider_id`, searched in `namespace` or everywhere.
    pub async fn cluster_of_provider_id(&self, provider_id: &str, namespace: Option<&str>) -> Result<(String, String)> {
        let mut unreadable = Vec::new();
        let machines = self
            .api(&self.machines, namespace)
            .list(&ListParams::default())
            .await
            .context("cannot list Machines")?;
        let found = views(&machines.items, MachineView::from_object, &mut unreadable)
            .into_iter()
            .find(|m| m.provider_id() == Some(provider_id))
            .map(|m| (m.namespace.to_string(), m.cluster_name.to_string()));
        if let Some(found) = found {
            return Ok(found);
        }
        if let Some(pools) = &self.pools {
            let pools = self
                .api(pools, namespace)
                .list(&ListParams::default())
                .await
                .context("cannot list MachinePools")?;
            if let Some(p) = views(&pools.items, MachinePoolView::from_object, &mut unreadable)
                .into_iter()
                .find(|p| p.provider_ids.iter().any(|id| id == provider_id))
            {
                return Ok((p.namespace.to_string(), p.cluster_name.to_string()));
            }
        }
        bail!(
            "no Machine or MachinePool {}carries provider ID {provider_id:?}: name the Cluster with --cluster <namespace>/<name>",
            namespace.map(|ns| format!("in namespace {ns} ")).unwrap_or_default()
        )
    }

    /// The Cluster `namespace/name` with its Machines, MachinePools, KubeadmConfigs and Events.
    pub async fn cluster(&self, namespace: &str, name: &str) -> Result<ClusterFacts> {
        let object = self
            .api(&self.clusters, Some(namespace))
            .get_opt(name)
            .await
            .with_context(|| format!("cannot read Cluster {namespace}/{name}"))?
            .with_context(|| format!("there is no Cluster {namespace}/{name}"))?;
        let cluster = ClusterView::from_object(&serde_json::to_value(&object)?)
            .with_context(|| format!("Cluster {namespace}/{name} does not read"))?;
        let mut unreadable = Vec::new();
        let list = |resource: Option<&ApiResource>| {
            let api = resource.map(|r| self.api(r, Some(namespace)));
            async move {
                match api {
                    Some(api) => api.list(&ListParams::default()).await.map(|l| l.items),
                    None => Ok(Vec::new()),
                }
            }
        };
        let (machines, pools, configs) = tokio::try_join!(
            list(Some(&self.machines)),
            list(self.pools.as_ref()),
            list(self.configs.as_ref())
        )
        .with_context(|| format!("cannot list the Cluster API objects of namespace {namespace}"))?;
        let ours =
            |m_namespace: &str, cluster_name: &str| m_namespace == cluster.namespace && cluster_name == cluster.name;
        let inventory = Inventory {
            index: Default::default(),
            machines: views(&machines, MachineView::from_object, &mut unreadable)
                .into_iter()
                .filter(|m| ours(&m.namespace, &m.cluster_name))
                .map(std::sync::Arc::new)
                .collect(),
            pools: views(&pools, MachinePoolView::from_object, &mut unreadable)
                .into_iter()
                .filter(|p| ours(&p.namespace, &p.cluster_name))
                .map(std::sync::Arc::new)
                .collect(),
            kubeadm_configs: views(&configs, KubeadmConfigView::from_object, &mut unreadable)
                .into_iter()
                .map(std::sync::Arc::new)
                .collect(),
        };
        let events = self.events(namespace, &cluster, &inventory).await;
        Ok(ClusterFacts {
            cluster,
            inventory,
            unreadable,
            events,
        })
    }

    /// The Events of `namespace` about the Cluster, its Machines and MachinePools, oldest
    /// first. Events are a report: when they cannot be listed, there are none to show.
    async fn events(&self, namespace: &str, cluster: &ClusterView, inventory: &Inventory) -> Vec<EventLine> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let items = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the Events of namespace {namespace}");
                return Vec::new();
            }
        };
        let mut uids: std::collections::HashSet<&str> = inventory.machines.iter().map(|m| m.uid()).collect();
        uids.extend(inventory.pools.iter().map(|p| p.uid.as_str()));
        uids.insert(cluster.uid.as_str());
        let mut lines: Vec<EventLine> = items
            .iter()
            .map(EventLine::from_event)
            .filter(|e| uids.contains(e.regarding_uid.as_str()))
            .collect();
        lines.sort_by(|a, b| a.at.cmp(&b.at));
        lines
    }

    /// `cluster` with its `tpm/v1` boot policy read as the signer reads it (its annotation's
    /// ConfigMap, else `default`, the signer's `--tpm-boot-policy`).
    pub async fn boot_policy(&self, cluster: &ClusterView, default: Option<&(String, String)>) -> ClusterView {
        use crate::controller::boot_policy::{source_of, state_of};
        let mut resolved = cluster.clone();
        let Some((namespace, name)) = source_of(cluster, default) else {
            return resolved;
        };
        let source = format!("{namespace}/{name}");
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        resolved.boot_policy = match api.get_opt(&name).await {
            Ok(config_map) => state_of(&source, config_map.as_ref()),
            Err(e) => attestation::tpm::boot_policy::PolicyState::Invalid {
                source,
                message: format!("explain cannot read the ConfigMap ({e}; it needs get on configmaps, config/explain)"),
            },
        };
        resolved
    }

    /// The workload cluster's kubeconfig, as the signer picks it: an operator's
    /// `<cluster>-node-attestation-kubeconfig` when there is one, else Cluster API's
    /// `<cluster>-kubeconfig` (explain only reads with it, whatever identity it holds).
    pub async fn workload_kubeconfig(&self, cluster: &ClusterView) -> Result<Zeroizing<Vec<u8>>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &cluster.namespace);
        let operator = crate::controller::workload_access::operator_kubeconfig_secret(&cluster.name);
        let cluster_api = format!("{}-kubeconfig", cluster.name);
        let mut found = None;
        for name in [&operator, &cluster_api] {
            let secret = match api.get_opt(name).await {
                // A Role of explain-rbac before the operator's Secret existed names only Cluster
                // API's: not being allowed the other one is not being given one.
                Err(kube::Error::Api(status)) if name == &operator && status.code == 403 => None,
                read => read.with_context(|| {
                    format!(
                        "cannot read Secret {}/{name} (explain needs get on it, or --workload-kubeconfig)",
                        cluster.namespace
                    )
                })?,
            };
            if let Some(secret) = secret {
                found = Some((name, secret));
                break;
            }
        }
        let (name, secret) = found.with_context(|| {
            format!(
                "Secrets {0}/{cluster_api} and {0}/{operator} are both missing: the signer cannot serve this Cluster either",
                cluster.namespace
            )
        })?;
        let value = secret
            .data
            .and_then(|mut d| d.remove("value"))
            .with_context(|| format!("Secret {}/{name} has no key value", cluster.namespace))?;
        Ok(Zeroizing::new(value.0))
    }
}

/// The workload cluster, read-only.
pub struct WorkloadReader {
    client: Client,
}

/// The workload cluster's side.
pub struct WorkloadFacts {
    /// Every CSR.
    pub csrs: Vec<CertificateSigningRequest>,
    /// The same as the rule engine reads them (a `tpm/v1` CSR #2 looks up its CSR #1), made once
    /// for every decision of the run.
    pub objects: Vec<attestation::CsrObject>,
    /// Every Node, as the rules read them.
    pub nodes: Vec<NodeView>,
}

impl WorkloadReader {
    /// A client from kubeconfig bytes (`what` names where they came from, for errors).
    pub async fn connect(kubeconfig: &[u8], what: &str, timeout: std::time::Duration) -> Result<Self> {
        let text = std::str::from_utf8(kubeconfig).map_err(|_| anyhow::anyhow!("{what}: not UTF-8"))?;
        let parsed = Kubeconfig::from_yaml(text).with_context(|| format!("{what} does not parse"))?;
        let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("{what} is not a usable kubeconfig"))?;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        Ok(Self {
            client: build_read_only(config).with_context(|| format!("{what}: cannot build a client"))?,
        })
    }

    /// Join token `id`'s Secret in `kube-system` (`None`: gone); an error says why it could not
    /// be read (the shipped least-privilege role for `explain` reads no Secrets).
    pub async fn token_secret(&self, id: &str) -> Result<Option<attestation::join_tokens::TokenSecret>, String> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), attestation::join_tokens::TOKEN_NAMESPACE);
        match secrets.get_opt(&attestation::join_tokens::secret_name(id)).await {
            Ok(found) => Ok(found.as_ref().map(crate::controller::kubeadm::token_secret)),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                Err("this identity may not read Secrets in kube-system".to_owned())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The workload apiserver's version (`/version`), or why it cannot be told.
    pub async fn version(&self) -> Result<attestation::kubernetes_minor::ApiserverVersion, String> {
        let info = self.client.apiserver_version().await.map_err(|e| e.to_string())?;
        attestation::kubernetes_minor::ApiserverVersion::parse(&info.major, &info.minor, &info.git_version)
            .map_err(|e| e.to_string())
    }

    /// The revoked list and the signer's record, joined; what could not be read is said.
    pub async fn revoked(&self) -> super::revoked::RevokedReport {
        use crate::controller::workload_access::config_map_data;
        let list = match config_map_data::read(&self.client, attestation::revocation::revoked_list::NAME).await {
            Ok(list) => list,
            Err(e) => {
                return super::revoked::RevokedReport {
                    entries: Vec::new(),
                    unreadable: Some(format!(
                        "cannot read ConfigMap kube-system/{}: {e} (explain needs get on it: config/explain/workload-cluster.yaml)",
                        attestation::revocation::revoked_list::NAME
                    )),
                };
            }
        };
        let mut shards = Vec::new();
        for name in attestation::revocation::record::shard_names() {
            match config_map_data::read(&self.client, &name).await {
                Ok(data) => shards.push(data.map(|(data, _)| data).unwrap_or_default()),
                // Without the record the entries are still listed, unnamed.
                Err(e) => tracing::debug!(error = %e, "cannot read the record's {name}"),
            }
        }
        super::revoked::report(list.as_ref().map(|(data, _)| data), &super::revoked::issued(&shards))
    }

    /// Every CSR and Node.
    pub async fn facts(&self) -> Result<WorkloadFacts> {
        let csrs: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let nodes: Api<Node> = Api::all(self.client.clone());
        let everything = ListParams::default();
        let (csrs, nodes) = tokio::try_join!(csrs.list(&everything), nodes.list(&everything))
            .context("cannot list the workload cluster's CSRs and Nodes")?;
        let nodes = nodes
            .items
            .iter()
            .filter_map(|n| NodeView::from_object(&serde_json::to_value(n).ok()?).ok())
            .collect();
        let objects = csrs.items.iter().map(crate::csr_object::csr_object).collect();
        Ok(WorkloadFacts {
            csrs: csrs.items,
            objects,
            nodes,
        })
    }
}
