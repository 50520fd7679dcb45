//! `node-attestation-signer revoke`: an operator takes back one node's or one Machine's
//! certificates by hand (SPEC section 7, "Taking an identity back"), for a node suspected of
//! compromise whose Machine must stay a while (forensics) or a certificate the triggers do not
//! reach. It reads the signer's record in the workload cluster, lists every unexpired
//! certificate of that node or Machine in the revoked list (the workload admission policy then
//! refuses its writes within seconds), leaves a Warning Event on the Cluster in the management
//! cluster and prints what it did. The running signer keeps the entries until each certificate
//! would have expired, and logs them.
//!
//! The workload cluster is reached through the Cluster's `<cluster>-kubeconfig` Secret (Cluster
//! API's admin kubeconfig), or `--workload-kubeconfig`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use attestation::machine::TargetKind;
use attestation::revocation::record::{self, IssuedCertificate};
use attestation::revocation::{RevokeReason, revoked_list};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{EventType, Recorder, Reporter};
use time::OffsetDateTime;

use crate::controller::workload_access::config_map_data;
use crate::explain::gather::ManagementReader;

/// The field manager of an operator's entries.
pub const FIELD_MANAGER: &str = "node-attestation-signer-revoke";

/// `revoke`'s arguments.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["node", "machine"])))]
pub struct RevokeArgs {
    /// The Cluster, `<namespace>/<name>`.
    #[arg(long)]
    pub cluster: String,
    /// Every certificate the signer issued for this node name.
    #[arg(long)]
    pub node: Option<String>,
    /// Every certificate the signer issued for this Machine (or MachinePool).
    #[arg(long)]
    pub machine: Option<String>,
    /// Why, for the Event.
    #[arg(long, default_value = "revoked by an operator")]
    pub reason: String,
    /// Kubeconfig of the management cluster (default: in-cluster, then `~/.kube/config`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// A kubeconfig for the workload cluster, instead of the Cluster's `<cluster>-kubeconfig`.
    #[arg(long)]
    pub workload_kubeconfig: Option<PathBuf>,
    /// Timeout of each request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: std::time::Duration,
}

/// Runs `revoke`.
pub fn run(args: &RevokeArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(revoke(args))
}

/// The certificates of `entries` that `args` names and that are unexpired at `now`.
fn chosen<'a>(entries: &'a [IssuedCertificate], args: &RevokeArgs, now: i64) -> Vec<&'a IssuedCertificate> {
    entries
        .iter()
        .filter(|e| !e.expired(now))
        .filter(|e| match (&args.node, &args.machine) {
            (Some(node), _) => e.node == *node,
            (None, Some(machine)) => e.target_name == *machine,
            (None, None) => false,
        })
        .collect()
}

async fn revoke(args: &RevokeArgs) -> Result<()> {
    let (namespace, name) = args
        .cluster
        .split_once('/')
        .context("--cluster is <namespace>/<name>")?;
    let management = ManagementReader::connect(args.kubeconfig.as_deref(), args.request_timeout).await?;
    let facts = management.cluster(namespace, name).await?;
    let bytes = match &args.workload_kubeconfig {
        Some(path) => {
            zeroize::Zeroizing::new(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?)
        }
        None => management.workload_kubeconfig(&facts.cluster).await?,
    };
    let workload = workload_client(&bytes, args.request_timeout).await?;
    // Before 1.32 the apiserver names no credential ID: what is written here is not enforced.
    if let Ok(info) = workload.apiserver_version().await
        && let Ok(version) =
            attestation::kubernetes_minor::ApiserverVersion::parse(&info.major, &info.minor, &info.git_version)
        && !version.has_credential_id()
    {
        eprintln!(
            "warning: the workload apiserver is {version}, which names no certificate in credential-id: the certificates listed here are not refused; delete the node's Machine (its node name is then refused while no live Machine uses it), or upgrade the control plane to 1.32"
        );
    }

    let mut entries = Vec::new();
    for shard in record::shard_names() {
        let data = config_map_data::read(&workload, &shard)
            .await
            .with_context(|| format!("cannot read the signer's record (ConfigMap kube-system/{shard})"))?
            .map(|(data, _)| data)
            .unwrap_or_default();
        entries.extend(record::read_shard(&data).0);
    }
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let chosen = chosen(&entries, args, now);
    let what = match (&args.node, &args.machine) {
        (Some(node), _) => format!("node {node}"),
        (_, machine) => format!("Machine {}", machine.as_deref().unwrap_or_default()),
    };
    if chosen.is_empty() {
        bail!(
            "the signer recorded no unexpired certificate of {what} in the workload cluster of {}: nothing to revoke (a certificate issued before revocation existed is not recorded)",
            args.cluster
        );
    }
    let listed: Vec<revoked_list::Listed> = chosen
        .iter()
        .map(|c| revoked_list::Listed {
            id: c.id,
            not_after: c.not_after,
            why: RevokeReason::Operator,
        })
        .collect();
    // The list's values are rewritten from what was read: conditional on its version, read
    // again when the running signer wrote meanwhile.
    let mut attempts = 0;
    loop {
        let current = config_map_data::read(&workload, revoked_list::NAME)
            .await
            .with_context(|| {
                format!(
                    "cannot read the revoked list (ConfigMap kube-system/{})",
                    revoked_list::NAME
                )
            })?;
        let (data, version) = match &current {
            Some((data, version)) => (data.clone(), Some(version.as_str())),
            None => (BTreeMap::new(), None),
        };
        let set = revoked_list::with_certificates(&data, &listed);
        match config_map_data::merge(&workload, revoked_list::NAME, &set, &[], FIELD_MANAGER, version).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 5 => attempts += 1,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot write the revoked list (ConfigMap kube-system/{})",
                        revoked_list::NAME
                    )
                });
            }
        }
    }

    let ids: Vec<String> = chosen.iter().map(|c| c.id.user_extra()).collect();
    let text = format!(
        "{} certificate(s) of {what} revoked by hand ({}): {}",
        chosen.len(),
        args.reason,
        ids.join(", ")
    );
    println!("{text}");
    let config = crate::controller::management_config(args.kubeconfig.as_deref()).await?;
    let client = Client::try_from(config).context("cannot build the management client")?;
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "node-attestation-signer-revoke".into(),
            instance: None,
        },
    );
    let regarding = chosen
        .iter()
        .find(|c| c.kind == TargetKind::Machine)
        .and_then(|c| {
            facts
                .inventory
                .machines
                .iter()
                .find(|m| m.uid() == c.target_uid)
                .map(|m| ObjectReference {
                    api_version: Some(
                        match m.api_version {
                            attestation::machine::ApiVersion::V1beta1 => "cluster.x-k8s.io/v1beta1",
                            attestation::machine::ApiVersion::V1beta2 => "cluster.x-k8s.io/v1beta2",
                        }
                        .to_owned(),
                    ),
                    kind: Some("Machine".into()),
                    name: Some(m.name().to_owned()),
                    namespace: Some(namespace.to_owned()),
                    uid: Some(m.uid().to_owned()),
                    ..ObjectReference::default()
                })
        })
        .unwrap_or_else(|| crate::controller::events::cluster_reference(&facts.cluster));
    crate::controller::events::publish(
        &recorder,
        &regarding,
        EventType::Warning,
        "CertificatesRevokedByOperator",
        "Revoke",
        &text,
    )
    .await;
    if facts.cluster.paused.is_some() {
        eprintln!(
            "note: the Cluster is paused: the list is enforced all the same, but the signer does not prune it until the Cluster is unpaused"
        );
    }
    Ok(())
}

async fn workload_client(kubeconfig: &[u8], timeout: std::time::Duration) -> Result<Client> {
    let text = std::str::from_utf8(kubeconfig).context("the workload kubeconfig is not UTF-8")?;
    let parsed = Kubeconfig::from_yaml(text).context("the workload kubeconfig does not parse")?;
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .context("the workload kubeconfig is not usable")?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    Client::try_from(config).context("cannot build the workload client")
}

#[cfg(test)]
mod tests {
    use super::*;
    use attestation::revocation::CredentialId;

    fn entry(node: &str, machine: &str, not_after: i64) -> IssuedCertificate {
        IssuedCertificate {
            id: CredentialId::of_certificate(format!("{node}{machine}{not_after}").as_bytes()),
            not_after,
            kind: TargetKind::Machine,
            target_uid: "u".into(),
            target_name: machine.into(),
            node: node.into(),
            provider_id: "aws:///a/i-1".into(),
        }
    }

    fn args(node: Option<&str>, machine: Option<&str>) -> RevokeArgs {
        RevokeArgs {
            cluster: "a/b".into(),
            node: node.map(str::to_owned),
            machine: machine.map(str::to_owned),
            reason: String::new(),
            kubeconfig: None,
            workload_kubeconfig: None,
            request_timeout: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn only_the_named_nodes_unexpired_certificates_are_chosen() {
        let entries = [
            entry("worker-1", "m1", 100),
            entry("worker-1", "m1", 200),
            entry("worker-1", "m1", 50),
            entry("worker-2", "m2", 200),
        ];
        assert_eq!(chosen(&entries, &args(Some("worker-1"), None), 60).len(), 2);
        assert_eq!(chosen(&entries, &args(None, Some("m2")), 60).len(), 1);
        assert!(chosen(&entries, &args(Some("worker-9"), None), 60).is_empty());
    }
}
