//! `node-attestation-signer explain`: why a node was, or would be, approved, denied or kept
//! waiting, asked of the live clusters and safe on production: it only reads.
//!
//! - [`gather`]: the reads, through clients that can send nothing but `GET`s: the Cluster and
//!   its Cluster API objects and Events in the management cluster, and (through the Cluster's
//!   kubeconfig Secret, or `--workload-kubeconfig`) the workload cluster's CSRs and Nodes.
//! - [`report`]: the pure part: which CSR a question is about, what is recorded on it, what it
//!   was judged against, for people or as JSON.
//! - [`rbac`]: `explain-rbac`, the least privilege explain needs for a namespace's kubeconfig
//!   Secrets.
//!
//! The decision is the rule engine's, on the same views and verifiers the controller uses, with
//! the CSR's creation as its first sight. The challenge key of `tpm/v1` and `azure/v1` is never
//! read (whoever holds it can answer a challenge without the TPM, or the VM): explain checks all
//! a challenge can be checked for without it, and says what only the signer can check.

pub mod gather;
pub mod outside;
pub mod rbac;
pub mod report;
pub mod revoked;
pub mod tokens;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use attestation::attestor::Verifiers;
use attestation::decision::Decision;
use attestation::tpm::challenge_key::ChallengeKey;
use attestation::{Clock, Inputs};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use time::OffsetDateTime;

use crate::check::OutputFormat;
use crate::csr_object::csr_object;
use gather::{ClusterFacts, ManagementReader, WorkloadFacts, WorkloadReader};
use report::{Explanation, ListedCsr};

/// Arguments of `explain`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("question").required(true).args(["csr", "node", "pending"])))]
pub struct ExplainArgs {
    /// The CSR (its name in the workload cluster).
    pub csr: Option<String>,
    /// The node instead: its newest CSR (a request for `system:node:<node>`, or filed by it).
    #[arg(long)]
    pub node: Option<String>,
    /// Every CSR of the Cluster still pending, or denied or failed, with its reason.
    #[arg(long)]
    pub pending: bool,
    /// The Cluster, `<namespace>/<name>`.
    #[arg(long, required_unless_present = "provider_id")]
    pub cluster: Option<String>,
    /// Find the Cluster by the Machine or MachinePool carrying this provider ID (as
    /// `kubelet-authenticator status` prints it).
    #[arg(long, conflicts_with = "cluster")]
    pub provider_id: Option<String>,
    /// With `--provider-id`: search this namespace only.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Kubeconfig of the management cluster (default: in-cluster, then `~/.kube/config`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// A kubeconfig for the workload cluster, instead of reading the Cluster's
    /// `<cluster>-kubeconfig` Secret (explain then reads no Secret at all).
    #[arg(long)]
    pub workload_kubeconfig: Option<PathBuf>,
    /// Output: for people, or JSON. For a CSR (or a node's newest): `cluster`, `csr`,
    /// `recorded`, `now` (the decision with every rule), `machine`, `node`, `events`,
    /// `otherCSRs`, `notes`. For a node that filed no CSR: `cluster`, `node`,
    /// `outsideAttestation`, `remedy`, `notes`. With --pending: `cluster`, `csrs`,
    /// `outsideAttestation`, `joinTokens`, `revoked`, `notes`.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Make no call to Google, STS or Azure Resource Manager: a decision that needs one stays
    /// `Retry` and says which.
    #[arg(long)]
    pub offline: bool,
    /// Timeout of each request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: std::time::Duration,
    /// The signer's `--csr-max-age` (pass what it runs with).
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub csr_max_age: std::time::Duration,
    /// The signer's `tpm/v1` flags.
    #[command(flatten)]
    pub tpm: crate::verifiers::TpmFlags,
    /// The signer's `--tpm-boot-policy` (`<namespace>/<name>`): the boot policy of a Cluster
    /// without the `cluster.x-k8s.io/kubelet-tpm-boot-policy` annotation.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub tpm_boot_policy: Option<String>,
    /// The signer's boot-policy floor (`--tpm-require-boot-policy`, `--tpm-require-secure-boot`).
    #[command(flatten)]
    pub tpm_boot_policy_floor: crate::controller::boot_policy::Floor,
    /// The signer's cloud flags.
    #[command(flatten)]
    pub cloud: crate::cloud::CloudArgs,
}

/// Runs `explain`. Ok whatever the decision; an Err when a cluster cannot be read or the CSR
/// or node is not there.
pub fn run(args: &ExplainArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(explain(args))
}

/// What every decision of one run shares.
struct Judge {
    verifiers: Verifiers,
    cloud: crate::cloud::Cloud,
    offline: bool,
    max_age: time::Duration,
    now: OffsetDateTime,
}

impl Judge {
    /// The rule engine's decision on `csr` now, with the cloud calls it asks for made (unless
    /// `--offline`).
    async fn decide(
        &self,
        csr: &CertificateSigningRequest,
        facts: &ClusterFacts,
        workload: &WorkloadFacts,
    ) -> Result<Decision> {
        let object = csr_object(csr);
        let inputs = Inputs {
            csr: &object,
            cluster: &facts.cluster,
            inventory: &facts.inventory,
            nodes: &workload.nodes,
            csrs: &workload.objects,
            verifiers: &self.verifiers,
            clock: Clock {
                now: self.now,
                first_seen: object.created.unwrap_or(self.now),
                max_age: self.max_age,
            },
        };
        let decision = attestation::decide(&inputs).with_context(|| {
            format!(
                "CSR {} is not for a signer node-attestation-signer handles",
                object.name
            )
        })?;
        if decision.cloud_calls.is_empty() || self.offline {
            return Ok(decision);
        }
        self.cloud.make(&decision.cloud_calls).await;
        Ok(attestation::decide(&inputs)?)
    }
}

/// `--cluster <namespace>/<name>`.
fn cluster_argument(cluster: &str) -> Result<(String, String)> {
    cluster
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
        .with_context(|| format!("--cluster {cluster:?}: expected <namespace>/<name>"))
}

/// The arguments' formats, checked before any file or cluster is read: `--cluster`'s
/// `<namespace>/<name>`, `--node`'s node name, `--provider-id`'s length.
fn check_arguments(args: &ExplainArgs) -> Result<Option<(String, String)>> {
    let named = args.cluster.as_deref().map(cluster_argument).transpose()?;
    if let Some(node) = &args.node {
        attestation::identity::NodeName::new(node).context("--node")?;
    }
    if let Some(provider_id) = &args.provider_id {
        attestation::identity::ProviderId::new(provider_id).context("--provider-id")?;
    }
    Ok(named)
}

/// The verifiers and the cloud of `args`, as the signer's, without the challenge key.
fn judge(args: &ExplainArgs) -> Result<Judge> {
    let cloud = crate::cloud::Cloud::new(&args.cloud, args.request_timeout)?;
    Ok(Judge {
        verifiers: crate::verifiers::all(
            ChallengeKey::withheld(),
            &args.tpm.settings(),
            &args.cloud,
            cloud.google.clone(),
            cloud.sts.clone(),
            cloud.arm.clone(),
        )?,
        cloud,
        offline: args.offline,
        max_age: time::Duration::try_from(args.csr_max_age).context("--csr-max-age is too large")?,
        now: OffsetDateTime::now_utc(),
    })
}

async fn explain(args: &ExplainArgs) -> Result<()> {
    let named = check_arguments(args)?;
    // The local flags (files, durations) next, so that a bad one is said before any cluster is
    // asked anything.
    let judge = judge(args)?;
    let management = ManagementReader::connect(args.kubeconfig.as_deref(), args.request_timeout).await?;
    let (namespace, name) = match (named, &args.provider_id) {
        (Some(named), _) => named,
        (None, Some(provider_id)) => {
            management
                .cluster_of_provider_id(provider_id, args.namespace.as_deref())
                .await?
        }
        (None, None) => bail!("name the Cluster: --cluster <namespace>/<name> or --provider-id <id>"),
    };
    let mut facts = management.cluster(&namespace, &name).await?;
    let default_policy = args
        .tpm_boot_policy
        .as_deref()
        .map(crate::controller::boot_policy::parse_default)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    facts.cluster = management.boot_policy(&facts.cluster, default_policy.as_ref()).await;
    facts.cluster.boot_policy = args.tpm_boot_policy_floor.apply(facts.cluster.boot_policy);
    let mut notes: Vec<String> = facts
        .unreadable
        .iter()
        .map(|why| format!("ignored, as the signer does: {why}"))
        .collect();
    if !facts.cluster.opted_in {
        notes.push(crate::render::not_opted_in(&facts.cluster));
    }
    // Paused: the running signer decides and writes nothing for it (SPEC section 7).
    notes.extend(crate::render::paused(&facts.cluster));
    // An opt-out in progress: kubeadm's bindings are kept (SPEC section 7, revision 5).
    notes.extend(crate::render::opting_out(&facts.cluster));
    // tpm/v1 (revision 5): the boot policy the CSRs are judged against, or why they are held.
    notes.extend(crate::render::boot_policy(&facts.cluster));
    let workload = match &args.workload_kubeconfig {
        Some(path) => {
            let bytes = zeroize::Zeroizing::new(
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
            );
            WorkloadReader::connect(&bytes, &path.display().to_string(), args.request_timeout).await?
        }
        None => {
            let bytes = management.workload_kubeconfig(&facts.cluster).await?;
            let what = format!("Secret {namespace}/{name}-kubeconfig");
            WorkloadReader::connect(&bytes, &what, args.request_timeout).await?
        }
    };
    let reader = workload;
    // The minor decides what a node identity reads and what revocation refuses.
    match reader.version().await {
        Ok(version) => notes.extend(crate::render::workload_minor(&version)),
        Err(e) => notes.push(format!("the workload apiserver's Kubernetes minor cannot be told: {e}")),
    }
    let workload = reader.facts().await?;
    let cluster_key = format!("{namespace}/{name}");

    if args.pending {
        let listed = pending(&judge, &facts, &workload).await?;
        let join_tokens = join_tokens(&reader, &facts, &workload, judge.now).await;
        let outside = outside::report(&facts.cluster, &facts.inventory, &workload.nodes, &workload.csrs);
        let revoked = reader.revoked().await;
        match args.output {
            OutputFormat::Json => println!(
                "{}",
                serde_json::to_string_pretty(&pending_json(
                    &cluster_key,
                    &listed,
                    &outside,
                    &join_tokens,
                    &revoked,
                    &notes
                ))?
            ),
            OutputFormat::Text => {
                print!("{}", report::render_pending(&cluster_key, &listed));
                print!("{}", outside::render(&outside));
                print!("{}", tokens::render(&join_tokens));
                print!("{}", revoked::render(&revoked));
                for note in &notes {
                    println!("note: {note}");
                }
            }
        }
        return Ok(());
    }

    let csr = match (&args.csr, &args.node) {
        (Some(csr_name), _) => workload
            .csrs
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(csr_name.as_str()))
            .with_context(|| format!("there is no CSR {csr_name:?} in the workload cluster of {cluster_key}"))?,
        (None, Some(node)) => match report::newest_for_node(&workload.csrs, node) {
            Some(csr) => csr,
            None => {
                // No CSR: a node outside attestation (it never asked the signer) is still explained.
                let outside = outside::report(&facts.cluster, &facts.inventory, &workload.nodes, &workload.csrs);
                let Some(text) = outside::for_node(&outside, node) else {
                    bail!("no CSR of the workload cluster of {cluster_key} asks for node {node:?} or was filed by it");
                };
                match args.output {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::to_string_pretty(&outside_node_json(&cluster_key, node, &outside, &notes))?
                    ),
                    OutputFormat::Text => {
                        print!("Cluster {cluster_key}, node {node}: no CSR of it\n{text}");
                        for note in &notes {
                            println!("note: {note}");
                        }
                    }
                }
                return Ok(());
            }
        },
        (None, None) => bail!("name a CSR, or give --node or --pending"),
    };
    let decision = judge.decide(csr, &facts, &workload).await?;
    if !decision.cloud_calls.is_empty() {
        notes.push(
            "--offline: the decision waits for a call to Google, STS or Azure Resource Manager that was not made"
                .into(),
        );
    }
    if let Some(note) = challenge_key_note(&csr.spec.signer_name) {
        notes.push(note.into());
    }
    let summary = report::summary(csr, judge.now);
    let machine = report::judged_machine(&decision, &summary.requested, &facts.inventory, csr, &workload.csrs);
    let node = report::node_line(&summary.requested, &workload.nodes);
    let events = report::events_about(&facts.events, &summary.name, machine.as_ref());
    let mut other_csrs = Vec::new();
    if let Some(node_name) = &summary.requested.node {
        for other in workload.csrs.iter().filter(|c| c.metadata.uid != csr.metadata.uid) {
            let other_summary = report::summary(other, judge.now);
            if other_summary.requested.node.as_deref() == Some(node_name.as_str()) {
                other_csrs.push(ListedCsr {
                    csr: other_summary,
                    recorded: report::recorded(other),
                    now: None,
                    now_reason: None,
                    now_message: None,
                });
            }
        }
        other_csrs.sort_by(|a, b| a.csr.filed.cmp(&b.csr.filed));
    }
    let explanation = Explanation {
        cluster: cluster_key,
        recorded: report::recorded(csr),
        csr: summary,
        now: &decision,
        machine,
        node,
        events,
        other_csrs,
        notes,
    };
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
        OutputFormat::Text => print!("{}", report::render_explanation(&explanation)),
    }
    Ok(())
}

/// What explain, holding no challenge key, leaves to the signer for a CSR of `signer_name`.
fn challenge_key_note(signer_name: &str) -> Option<&'static str> {
    match signer_name {
        attestation::names::SIGNER_TPM => Some(
            "explain never reads the tpm/v1 challenge key: whether a challenge annotation is the signer's, and CSR #2's answer, are the signer's to check",
        ),
        attestation::names::SIGNER_AZURE => Some(
            "explain never reads the azure/v1 challenge key: whether a challenge annotation is the signer's is the signer's to check; CSR #2's attested document, its nonce and Azure Resource Manager's vmId are checked here as the signer checks them",
        ),
        _ => None,
    }
}

/// `--pending` as JSON (its fields are listed in `--output`'s help).
fn pending_json(
    cluster: &str,
    csrs: &[ListedCsr],
    outside: &outside::OutsideReport,
    join_tokens: &tokens::TokenReport,
    revoked: &revoked::RevokedReport,
    notes: &[String],
) -> serde_json::Value {
    serde_json::json!({
        "cluster": cluster, "csrs": csrs, "outsideAttestation": outside,
        "joinTokens": join_tokens, "revoked": revoked, "notes": notes
    })
}

/// `--node` for a node that filed no CSR (outside attestation), as JSON (its fields are listed
/// in `--output`'s help).
fn outside_node_json(
    cluster: &str,
    node: &str,
    outside: &outside::OutsideReport,
    notes: &[String],
) -> serde_json::Value {
    serde_json::json!({
        "cluster": cluster, "node": node,
        "outsideAttestation": outside.nodes.iter().find(|n| n.node == node),
        "remedy": outside::REMEDY, "notes": notes
    })
}

/// The Cluster's join tokens and what the signer does with them (SPEC section 7), as a signer
/// without `--leave-join-tokens` would.
async fn join_tokens(
    reader: &WorkloadReader,
    facts: &ClusterFacts,
    workload: &WorkloadFacts,
    now: OffsetDateTime,
) -> tokens::TokenReport {
    let left = attestation::join_tokens::managed(&facts.cluster, false).err();
    let plans = tokens::plans(&facts.cluster, &facts.inventory, &workload.nodes, now);
    let mut secrets = std::collections::HashMap::new();
    for (id, _) in &plans {
        secrets.insert(id.clone(), reader.token_secret(id).await);
    }
    tokens::report(left, &plans, |id| secrets.get(id).cloned().unwrap_or(Ok(None)), now)
}

/// Every CSR `--pending` lists, oldest first; those still waiting decided now.
async fn pending(judge: &Judge, facts: &ClusterFacts, workload: &WorkloadFacts) -> Result<Vec<ListedCsr>> {
    let mut listed = Vec::new();
    for csr in workload.csrs.iter().filter(|c| report::is_listed(c)) {
        let recorded = report::recorded(csr);
        let (now, now_reason, now_message) = if matches!(recorded.state.as_str(), "Pending" | "Approved") {
            let decision = judge.decide(csr, facts, workload).await?;
            let (outcome, reason, message) = report::outcome_parts(&decision);
            (Some(outcome), reason, Some(message))
        } else {
            (None, None, None)
        };
        listed.push(ListedCsr {
            csr: report::summary(csr, judge.now),
            recorded,
            now,
            now_reason,
            now_message,
        });
    }
    listed.sort_by(|a, b| (&a.csr.filed, &a.csr.name).cmp(&(&b.csr.filed, &b.csr.name)));
    Ok(listed)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use std::sync::Arc;

    use attestation::decision::{CsrKind, Outcome};
    use attestation::machine::ClusterView;

    use super::*;

    /// The words `--output`'s help puts in backticks.
    fn output_help_fields() -> BTreeSet<String> {
        use clap::Args;
        let command = ExplainArgs::augment_args(clap::Command::new("explain"));
        let output = command.get_arguments().find(|a| a.get_id() == "output").unwrap();
        let help = output.get_long_help().or(output.get_help()).unwrap().to_string();
        help.split('`').skip(1).step_by(2).map(str::to_owned).collect()
    }

    fn keys(value: &serde_json::Value) -> BTreeSet<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn the_output_help_names_every_json_field_and_no_other() {
        let decision = Decision {
            kind: CsrKind::KubeletClient,
            outcome: Outcome::Retry { message: "m".into() },
            rules: Vec::new(),
            claim: None,
            annotations: BTreeMap::new(),
            target: None,
            supersedes: None,
            issuance: None,
            cloud_calls: Vec::new(),
            settled_by_request: false,
        };
        let summary = report::CsrSummary {
            name: "csr-1".into(),
            signer_name: attestation::names::SIGNER_INSECURE.into(),
            requester: "system:bootstrap:abcdef".into(),
            filed: None,
            age_seconds: None,
            requested: report::Requested::default(),
        };
        let recorded = report::Recorded {
            state: "Pending".into(),
            reason: None,
            message: None,
            at: None,
        };
        // Every optional field filled, so that every field is serialized.
        let explanation = Explanation {
            cluster: "team-a/prod".into(),
            csr: summary.clone(),
            recorded: recorded.clone(),
            now: &decision,
            machine: Some(report::JudgedMachine {
                kind: "Machine".into(),
                name: "team-a/worker-0".into(),
                uid: "uid".into(),
                provider_id: None,
                node_ref: None,
                bootstrap_ready: true,
                deleting: false,
                ek_pins: Vec::new(),
                claim: report::ClaimView::Unclaimed,
            }),
            node: Some(report::NodeLine {
                name: "worker-0".into(),
                provider_id: None,
            }),
            events: Vec::new(),
            other_csrs: vec![ListedCsr {
                csr: summary,
                recorded,
                now: None,
                now_reason: None,
                now_message: None,
            }],
            notes: vec!["a note".into()],
        };
        let cluster = ClusterView::named("prod", "team-a", &["tpm"]);
        let outside = outside::report(&cluster, &attestation::machine::Inventory::default(), &[], &[]);
        let join_tokens = tokens::report(None, &[], |_| Ok(None), OffsetDateTime::UNIX_EPOCH);
        let notes = vec!["a note".to_owned()];
        let mut printed = BTreeSet::new();
        for json in [
            serde_json::to_value(&explanation).unwrap(),
            pending_json(
                "team-a/prod",
                &[],
                &outside,
                &join_tokens,
                &revoked::RevokedReport::default(),
                &notes,
            ),
            outside_node_json("team-a/prod", "worker-0", &outside, &notes),
        ] {
            printed.extend(keys(&json));
        }
        let promised = output_help_fields();
        assert_eq!(promised, printed, "--output's help and explain's JSON differ");
        assert!(!promised.contains("certificate"), "explain prints no certificate");
    }

    fn args(extra: &[&str]) -> ExplainArgs {
        use clap::FromArgMatches;
        let command = <ExplainArgs as clap::Args>::augment_args(clap::Command::new("explain"));
        let matches = command.try_get_matches_from(["explain"].iter().chain(extra)).unwrap();
        ExplainArgs::from_arg_matches(&matches).unwrap()
    }

    /// A CSR object as the workload cluster holds it.
    fn manifest(csr: &attestation::CsrObject) -> CertificateSigningRequest {
        use base64::Engine as _;
        serde_json::from_value(serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {
                "name": csr.name, "uid": csr.uid, "annotations": csr.annotations,
                "creationTimestamp": csr.created.unwrap().format(&time::format_description::well_known::Rfc3339).unwrap(),
            },
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(&csr.request),
                "signerName": csr.signer_name, "usages": csr.usages, "username": csr.username, "groups": csr.groups,
            },
        }))
        .unwrap()
    }

    fn retry_message(decision: &Decision) -> &str {
        match &decision.outcome {
            Outcome::Retry { message } => message,
            other => panic!("not Retry: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_pending_azure_challenge_is_explained_without_the_challenge_key() {
        use ::tests::azure;
        let mut world = azure::World::new();
        let key = azure::key();
        let first = world.challenged(&key);
        let imds = world.imds();
        let (second, _) = world.answer(&key, &first, imds);
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("azure");
        std::fs::create_dir(&bundle).unwrap();
        std::fs::write(bundle.join("synthetic.pem"), world.pki.bundle_pem()).unwrap();
        let bundle = bundle.to_str().unwrap();
        let mut judge = judge(&args(&[
            "--pending",
            "--cluster",
            "team-a/prod",
            "--offline",
            "--azure-ca-bundle",
            bundle,
        ]))
        .unwrap();
        judge.now = world.now;
        let facts = ClusterFacts {
            cluster: ClusterView::from_object(&world.cluster).unwrap(),
            inventory: attestation::machine::Inventory {
                index: Default::default(),
                machines: world
                    .machines
                    .iter()
                    .map(|m| attestation::machine::MachineView::from_object(m).unwrap().into())
                    .collect(),
                kubeadm_configs: vec![
                    attestation::machine::KubeadmConfigView::from_object(&::tests::capi::kubeadm_config(
                        "worker-0-kc",
                        "abcdef",
                        "v1beta2",
                    ))
                    .unwrap()
                    .into(),
                ],
                ..Default::default()
            },
            unreadable: Vec::new(),
            events: Vec::new(),
        };
        let csrs = vec![manifest(&first), manifest(&second)];
        let workload = WorkloadFacts {
            objects: csrs.iter().map(csr_object).collect(),
            csrs,
            nodes: Vec::new(),
        };

        // Phase 1: challenged, waiting for CSR #2; no new challenge written, the mac unchecked.
        let decision = judge.decide(&workload.csrs[0], &facts, &workload).await.unwrap();
        let message = retry_message(&decision);
        assert!(
            message.contains("waiting for CSR #2 with an attested document"),
            "{message}"
        );
        assert!(message.contains("explain holds no challenge key"), "{message}");
        assert!(
            decision.annotations.is_empty(),
            "explain writes no challenge: {decision:#?}"
        );

        // Phase 2, offline: the document verifies as far as it can; ARM was not asked.
        let decision = judge.decide(&workload.csrs[1], &facts, &workload).await.unwrap();
        assert!(
            retry_message(&decision).contains("asking Azure Resource Manager for the vmId"),
            "{decision:#?}"
        );
        assert!(matches!(
            decision.cloud_calls.as_slice(),
            [attestation::cloud::CloudCall::AzureVm(_)]
        ));

        // ARM answered (as the signer's cache holds it): only the challenge's mac is left.
        let arm = Arc::new(azure::Arm::default());
        arm.set(
            &azure::provider_id(azure::NODE),
            attestation::azure::VmAnswer::Found {
                vm_id: azure::VM_ID.into(),
            },
        );
        judge.verifiers = crate::verifiers::all(
            ChallengeKey::withheld(),
            &tpm_settings(),
            &args(&["--pending", "--cluster", "a/b", "--azure-ca-bundle", bundle]).cloud,
            judge.cloud.google.clone(),
            judge.cloud.sts.clone(),
            arm,
        )
        .unwrap();
        let decision = judge.decide(&workload.csrs[1], &facts, &workload).await.unwrap();
        let message = retry_message(&decision);
        assert!(message.contains(&format!("vmId {}", azure::VM_ID)), "{message}");
        assert!(message.contains("explain holds no challenge key"), "{message}");
        assert!(challenge_key_note(attestation::names::SIGNER_AZURE).is_some());
        assert!(challenge_key_note(attestation::names::SIGNER_TPM).is_some());
        assert!(challenge_key_note(attestation::names::SIGNER_AWS).is_none());
    }

    fn tpm_settings() -> crate::verifiers::TpmSettings<'static> {
        crate::verifiers::TpmSettings {
            ek_ca_bundle: None,
            trust_on_first_use: false,
            challenge_ttl: std::time::Duration::from_secs(600),
        }
    }

    #[test]
    fn malformed_arguments_are_refused_before_anything_is_read() {
        let refused = |extra: &[&str]| format!("{:#}", check_arguments(&args(extra)).unwrap_err());
        for cluster in ["prod", "/prod", "team-a/", "team-a/prod/x"] {
            let said = refused(&["--cluster", cluster, "csr-1"]);
            assert_eq!(said, format!("--cluster {cluster:?}: expected <namespace>/<name>"));
        }
        let said = refused(&["--cluster", "team-a/prod", "--node", "Worker_0"]);
        assert!(
            said.starts_with("--node: \"Worker_0\" is not a DNS-1123 subdomain"),
            "{said}"
        );
        let long = "x".repeat(4096);
        let said = refused(&["--provider-id", &long, "--pending"]);
        assert!(said.starts_with("--provider-id: provider ID is 4096 bytes"), "{said}");
        assert_eq!(
            check_arguments(&args(&["--cluster", "team-a/prod", "--node", "worker-0"])).unwrap(),
            Some(("team-a".to_owned(), "prod".to_owned()))
        );
    }
}
