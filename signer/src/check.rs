//! `node-attestation-signer check`: the signer's decision on one CSR, offline.
//!
//! The same rule engine and verifiers the controller runs, fed from files instead of watches.
//! Without `--cluster` the Cluster is taken as opted in with the default attestors (`tpm`);
//! the CSR's first sight is its creationTimestamp. A paused Cluster's CSR is decided all the
//! same, with a note that the signer takes no decision for it until it is unpaused.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use attestation::ca::{ClusterCa, Validity};
use attestation::decision::{Decision, Outcome};
use attestation::envelope::RequestEnvelope;
use attestation::machine::{CapiObject, ClusterView, Inventory, KubeadmConfigView, NodeView};
use attestation::names::{GROUP_BOOTSTRAPPERS, usage};
use attestation::{Clock, CsrObject, Inputs};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use zeroize::Zeroizing;

use crate::csr_object::csr_object;
use crate::manifests::{read_objects, read_one};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// For programs: one JSON document, whose fields `--output` names.
    Json,
}

/// Arguments of `check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// A CertificateSigningRequest (YAML or JSON), or a bare `spec.request` PEM.
    #[arg(long)]
    pub csr: PathBuf,
    /// Machines and MachinePools of the Cluster (YAML/JSON, Lists and multi-document files too).
    #[arg(long = "machine", required = true)]
    pub machines: Vec<PathBuf>,
    /// Workload-cluster Nodes to check the node name against.
    #[arg(long = "node")]
    pub nodes: Vec<PathBuf>,
    /// The Cluster, for its opt-in and allowed attestors.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// KubeadmConfigs the Machines' bootstrap refers to.
    #[arg(long = "bootstrap-config")]
    pub bootstrap_configs: Vec<PathBuf>,
    /// CA certificate (`tls.crt`) to sign with when approved.
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// CA key (`tls.key`): RSA PKCS#1, PKCS#8 or EC.
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// The signer's clock (RFC 3339); default: now.
    #[arg(long)]
    pub now: Option<String>,
    /// How long transient gaps are retried before `Expired`.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub csr_max_age: std::time::Duration,
    /// Longest client certificate lifetime.
    #[arg(long, default_value = "168h", value_parser = humantime::parse_duration)]
    pub client_cert_duration: std::time::Duration,
    /// Output format; `json` has `decision`, `reason`, `message`, `rules` and, when signed,
    /// `certificate`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// With a bare PEM: the requester (default: the KubeadmConfig's join-token user, or
    /// `system:bootstrap:offline`).
    #[arg(long)]
    pub username: Option<String>,
    /// With a bare PEM: the requester's groups (default: system:bootstrappers).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// With a bare PEM: the signer name (default: from the PROVIDER block).
    #[arg(long)]
    pub signer_name: Option<String>,
    /// With a bare PEM: the usages (default: digital signature, client auth).
    #[arg(long = "usage")]
    pub usages: Vec<String>,
    /// Other CSR objects of the workload cluster (a `tpm/v1` CSR #2 names its CSR #1).
    #[arg(long = "related-csr")]
    pub related_csrs: Vec<PathBuf>,
    /// The `tpm/v1` flags, as the controller's.
    #[command(flatten)]
    pub tpm: crate::verifiers::TpmFlags,
    /// `tpm/v1`: the Cluster's boot policy (revision 5), a `policy.yaml` or its ConfigMap
    /// manifest, used whatever the Cluster's annotation names.
    #[arg(long, value_name = "FILE")]
    pub tpm_boot_policy: Option<PathBuf>,
    /// `tpm/v1` and `azure/v1`: file holding the challenge key (the `key` of the signer's
    /// Secret). Without it a random key is used: phase 1 shows the challenge it would issue,
    /// and phase 2 cannot verify.
    #[arg(long)]
    pub tpm_challenge_key: Option<PathBuf>,
    /// The cloud identity providers, as the controller's flags. Without `--gcp-jwks-file`
    /// Google's keys are fetched from `--gcp-jwks-url`; without `--aws-sts-response` the
    /// node's STS request is replayed to `--aws-sts-endpoint` (STS refuses a request older
    /// than 15 minutes: judge an old one with a recorded answer); without `--azure-vm` the VM
    /// is read from `--azure-arm-endpoint` with the Azure credentials of the environment (the
    /// signer's variables).
    #[command(flatten)]
    pub cloud: crate::cloud::CloudArgs,
    /// `aws/v1`: a recorded STS `GetCallerIdentity` answer (its XML body) to judge the request
    /// with, instead of asking STS.
    #[arg(long)]
    pub aws_sts_response: Option<PathBuf>,
    /// `azure/v1`: Azure Resource Manager's answer for the VM, instead of asking ARM: the JSON
    /// a GET of its resource ID returns (`az rest --method get --url
    /// '<resource ID>?api-version=2024-07-01'`), whose `properties.vmId` the attested document
    /// must carry, or what `az vm show` / `az vmss vm show` print (`vmId` at the top).
    #[arg(long)]
    pub azure_vm: Option<PathBuf>,
    /// Make no call to Google, STS or Azure Resource Manager: a decision that needs one stays
    /// pending and says which.
    #[arg(long)]
    pub offline: bool,
}

/// `cluster` with the boot policy of `--tpm-boot-policy`, read from `path` (a `policy.yaml`, or
/// a ConfigMap manifest holding one).
fn with_boot_policy(
    mut cluster: ClusterView,
    path: Option<&Path>,
    assumptions: &mut Vec<String>,
) -> Result<ClusterView> {
    use attestation::tpm::boot_policy::{BootPolicy, CONFIG_MAP_KEY, PolicyState};
    let Some(path) = path else {
        if let Some(source) = cluster.boot_policy.source() {
            assumptions.push(format!(
                "the Cluster names tpm/v1 boot policy ConfigMap {source}: pass its policy with --tpm-boot-policy FILE, or its tpm/v1 CSRs are held as the signer holds them without it"
            ));
        }
        return Ok(cluster);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config_map: Option<k8s_openapi::api::core::v1::ConfigMap> = serde_yaml::from_str::<serde_json::Value>(&text)
        .ok()
        .filter(|v| v.get("kind").and_then(serde_json::Value::as_str) == Some("ConfigMap"))
        .and_then(|v| serde_json::from_value(v).ok());
    let policy_text = match &config_map {
        Some(config_map) => config_map
            .data
            .as_ref()
            .and_then(|d| d.get(CONFIG_MAP_KEY))
            .with_context(|| format!("{}: the ConfigMap has no data key {CONFIG_MAP_KEY}", path.display()))?
            .as_str(),
        None => text.as_str(),
    };
    let policy =
        BootPolicy::parse(policy_text).with_context(|| format!("{}: not a tpm/v1 boot policy", path.display()))?;
    cluster.boot_policy = PolicyState::Loaded {
        source: path.display().to_string(),
        policy: std::sync::Arc::new(policy),
    };
    assumptions.extend(crate::render::boot_policy(&cluster));
    Ok(cluster)
}

/// STS's answer from a file (`--aws-sts-response`), for every request.
struct RecordedSts(attestation::aws::StsAnswer);

impl attestation::aws::CallerIdentity for RecordedSts {
    fn answer(&self, _call: &attestation::aws::StsCall) -> attestation::aws::StsAnswer {
        self.0.clone()
    }
}

/// ARM's answer for a VM from a file (`--azure-vm`): its `vmId`, for the VM its `id` names (any
/// VM when the file has no `id`).
#[derive(Debug, PartialEq, Eq)]
struct RecordedVm {
    /// `id`, lower-cased (what [`attestation::azure::AzureVm::cache_key`] compares with).
    id: Option<String>,
    /// `properties.vmId`.
    vm_id: String,
}

impl RecordedVm {
    /// Reads `--azure-vm`: ARM's JSON (`properties.vmId`), or the Azure CLI's, which lifts
    /// `vmId` to the top.
    fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read --azure-vm {}", path.display()))?;
        let json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
        let cli_form = json
            .as_ref()
            .filter(|v| v.pointer("/properties/vmId").is_none())
            .and_then(|v| v.get("vmId"))
            .map(|vm_id| {
                serde_json::json!({"properties": {"vmId": vm_id}})
                    .to_string()
                    .into_bytes()
            });
        let vm_id = attestation::azure::vms::vm_id_of(cli_form.as_deref().unwrap_or(&bytes))
            .map_err(|e| anyhow::anyhow!("--azure-vm {}: {e}", path.display()))?;
        let id = json.as_ref().and_then(|v| {
            v.get("id")
                .and_then(serde_json::Value::as_str)
                .map(str::to_ascii_lowercase)
        });
        Ok(Self { id, vm_id })
    }
}

impl attestation::azure::VirtualMachines for RecordedVm {
    fn answer(&self, vm: &attestation::azure::AzureVm) -> attestation::azure::VmAnswer {
        match &self.id {
            Some(id) if *id != vm.cache_key() => attestation::azure::VmAnswer::Unavailable(format!(
                "--azure-vm is ARM's answer for {id}, not for {vm}: give the VM the provider ID names"
            )),
            _ => attestation::azure::VmAnswer::Found {
                vm_id: self.vm_id.clone(),
            },
        }
    }
}

/// What `--output json` prints.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    decision: &'a Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    assumptions: Vec<String>,
}

/// What `--csr` accepts.
const CSR_ACCEPTED: &str = "a CertificateSigningRequest manifest or a PEM request";

/// Runs `check`; `Ok(true)` when approved. Unusable input is an `Err`.
pub fn run(args: &CheckArgs) -> Result<bool> {
    // The flags' own formats first, before any file is read.
    let now = match &args.now {
        Some(text) => now_argument(text)?,
        None => OffsetDateTime::now_utc(),
    };
    let max_age = time::Duration::try_from(args.csr_max_age).context("--csr-max-age is too large")?;
    let max_lifetime =
        time::Duration::try_from(args.client_cert_duration).context("--client-cert-duration is too large")?;

    let mut assumptions = Vec::new();
    let mut inventory = Inventory::default();
    for path in &args.machines {
        for object in read_objects(path, "Machine or MachinePool")? {
            match CapiObject::from_object(&object).with_context(|| format!("in {}", path.display()))? {
                CapiObject::Machine(m) => inventory.machines.push(m.into()),
                CapiObject::MachinePool(p) => inventory.pools.push((*p).into()),
            }
        }
    }
    for path in &args.bootstrap_configs {
        for object in read_objects(path, "KubeadmConfig")? {
            inventory.kubeadm_configs.push(
                KubeadmConfigView::from_object(&object)
                    .with_context(|| format!("in {}", path.display()))?
                    .into(),
            );
        }
    }
    let mut nodes = Vec::new();
    for path in &args.nodes {
        for object in read_objects(path, "Node")? {
            nodes.push(NodeView::from_object(&object).with_context(|| format!("in {}", path.display()))?);
        }
    }
    let cluster = match &args.cluster {
        Some(path) => {
            let cluster = ClusterView::from_object(&read_one(path, "a Cluster")?)
                .with_context(|| format!("in {}", path.display()))?;
            if !cluster.opted_in {
                bail!("{}", crate::render::not_opted_in(&cluster));
            }
            // Paused, the signer decides nothing for it now: the decision is still shown (what
            // it will be once unpaused), and said to wait.
            assumptions.extend(crate::render::paused(&cluster));
            cluster
        }
        None => {
            let (name, namespace) = inventory
                .machines
                .first()
                .map(|m| (m.cluster_name.clone(), m.namespace.clone()))
                .or_else(|| {
                    inventory
                        .pools
                        .first()
                        .map(|p| (p.cluster_name.clone(), p.namespace.clone()))
                })
                .unwrap_or_default();
            assumptions.push(format!(
                "no --cluster: Cluster {name} taken as opted in, allowing the default attestors [tpm]"
            ));
            ClusterView::named(&name, &namespace, &["tpm"])
        }
    };
    let cluster = with_boot_policy(cluster, args.tpm_boot_policy.as_deref(), &mut assumptions)?;

    // A broken CA is unusable input whatever the decision: load it first.
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => Some(load_ca(cert, key)?),
        _ => None,
    };
    let challenge_key = match &args.tpm_challenge_key {
        Some(path) => Zeroizing::new(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?),
        None => {
            let mut key = Zeroizing::new(vec![0u8; 32]);
            aws_lc_rs::rand::fill(&mut key).map_err(|_| anyhow::anyhow!("no randomness"))?;
            key
        }
    };
    let cloud = crate::cloud::Cloud::new(&args.cloud, std::time::Duration::from_secs(10))?;
    let sts: std::sync::Arc<dyn attestation::aws::CallerIdentity> = match &args.aws_sts_response {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let arn = attestation::aws::sts::caller_arn(&text)
                .map_err(|e| anyhow::anyhow!("--aws-sts-response {}: {e}", path.display()))?;
            std::sync::Arc::new(RecordedSts(attestation::aws::StsAnswer::Caller { arn }))
        }
        None => cloud.sts.clone(),
    };
    let vms: std::sync::Arc<dyn attestation::azure::VirtualMachines> = match &args.azure_vm {
        Some(path) => std::sync::Arc::new(RecordedVm::read(path)?),
        None => cloud.arm.clone(),
    };
    let verifiers = crate::verifiers::all(
        attestation::tpm::challenge_key::ChallengeKey::loaded(challenge_key.to_vec())?,
        &args.tpm.settings(),
        &args.cloud,
        cloud.google.clone(),
        sts,
        vms,
    )?;
    let csr = load_csr(args, &inventory, &verifiers, &mut assumptions)?;
    let clock = Clock {
        now,
        first_seen: csr.created.unwrap_or(now),
        max_age,
    };

    let related = args
        .related_csrs
        .iter()
        .map(|path| csr_file(path, "a CertificateSigningRequest manifest"))
        .collect::<Result<Vec<CsrObject>>>()?;
    let inputs = Inputs {
        csr: &csr,
        cluster: &cluster,
        inventory: &inventory,
        nodes: &nodes,
        csrs: &related,
        verifiers: &verifiers,
        clock,
    };
    let mut decision = attestation::decide(&inputs)?;
    if !decision.cloud_calls.is_empty() {
        if args.offline {
            assumptions.push("--offline: no call to Google, STS or Azure Resource Manager was made".into());
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?
                .block_on(cloud.make(&decision.cloud_calls));
            decision = attestation::decide(&inputs)?;
        }
    }

    let certificate = match (&decision.issuance, &ca) {
        (Some(issuance), Some(ca)) => {
            let validity = Validity {
                now,
                requested_seconds: csr.expiration_seconds,
                max: max_lifetime,
            };
            Some(ca.issue(&issuance.csr, &issuance.provider_id, validity)?.pem())
        }
        _ => None,
    };
    let report = Report {
        decision: &decision,
        certificate,
        assumptions,
    };
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Text => print!("{}", render_text(&report)),
    }
    Ok(matches!(decision.outcome, Outcome::Approved { .. }))
}

/// `--now`: RFC 3339. The parse error is said once, in this message (it has no source: `time`'s
/// error would repeat its own words as its cause).
fn now_argument(text: &str) -> Result<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| anyhow::anyhow!("--now {text:?} is not RFC 3339 ({e}): give e.g. 2026-11-22T08:00:00Z"))
}

/// A CertificateSigningRequest manifest (`accepted`: what the flag takes, for the error).
fn csr_file(path: &Path, accepted: &str) -> Result<CsrObject> {
    let object = read_one(path, accepted)?;
    let kind = crate::manifests::kind(&object).unwrap_or_default();
    if kind != "CertificateSigningRequest" {
        bail!("{} is a {kind:?}, not {accepted}", path.display());
    }
    let csr: CertificateSigningRequest = serde_json::from_value(object)
        .with_context(|| format!("{} is not a valid certificates.k8s.io/v1 CSR", path.display()))?;
    Ok(csr_object(&csr))
}

fn load_csr(
    args: &CheckArgs,
    inventory: &Inventory,
    verifiers: &attestation::attestor::Verifiers,
    assumptions: &mut Vec<String>,
) -> Result<CsrObject> {
    let text = std::fs::read_to_string(&args.csr).with_context(|| format!("cannot read {}", args.csr.display()))?;
    if !text.trim_start().starts_with("-----BEGIN") {
        return csr_file(&args.csr, CSR_ACCEPTED);
    }
    // A bare spec.request: fill in what a CSR object would carry.
    let provider = RequestEnvelope::parse(text.as_bytes()).ok().and_then(|e| e.provider);
    // The signer name of the PROVIDER block's verifier (insecure's when there is none).
    let signer_name = match (&args.signer_name, provider.as_ref().map(|p| p.provider())) {
        (Some(name), _) => name.clone(),
        (None, provider) => provider
            .and_then(|p| verifiers.for_provider(p))
            .map_or(attestation::names::SIGNER_INSECURE, |v| v.signer_name())
            .to_owned(),
    };
    let username = args.username.clone().unwrap_or_else(|| {
        inventory
            .kubeadm_configs
            .iter()
            .find_map(|c| c.join_username())
            .unwrap_or_else(|| "system:bootstrap:offline".to_owned())
    });
    let groups = if args.groups.is_empty() {
        vec![GROUP_BOOTSTRAPPERS.to_owned()]
    } else {
        args.groups.clone()
    };
    let usages = if args.usages.is_empty() {
        vec![usage::DIGITAL_SIGNATURE.to_owned(), usage::CLIENT_AUTH.to_owned()]
    } else {
        args.usages.clone()
    };
    assumptions.push(format!(
        "bare PEM: signer {signer_name}, requester {username} in {groups:?}, usages {usages:?}"
    ));
    Ok(CsrObject {
        name: args
            .csr
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        uid: String::new(),
        request: text.into_bytes(),
        signer_name,
        usages,
        username,
        groups,
        expiration_seconds: None,
        created: None,
        ..CsrObject::default()
    })
}

fn load_ca(cert: &Path, key: &Path) -> Result<ClusterCa> {
    let cert_pem = std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
    let key_pem = Zeroizing::new(std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?);
    ClusterCa::from_pem(&cert_pem, &key_pem).with_context(|| format!("CA {} / {}", cert.display(), key.display()))
}

fn render_text(report: &Report<'_>) -> String {
    let decision = report.decision;
    let mut out = String::new();
    for assumption in &report.assumptions {
        out.push_str(&format!("note: {assumption}\n"));
    }
    out.push_str(&crate::render::decision(decision, "claim to write"));
    if let Some(pem) = &report.certificate {
        out.push_str(pem);
    }
    out
}

#[cfg(test)]
mod tests {
    use attestation::azure::{AzureVm, VirtualMachines, VmAnswer};

    use super::*;

    const VM_ID: &str = "b1310a36-d400-46f6-82cb-6217df846586";

    fn vm(name: &str) -> AzureVm {
        AzureVm::parse(&format!(
            "azure:///subscriptions/8a205152-b25a-417f-a676-80465535a6c9/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/{name}"
        ))
        .unwrap()
    }

    #[test]
    fn azure_vm_reads_arms_answer_or_the_clis_and_answers_for_its_vm_only() {
        let dir = tempfile::tempdir().unwrap();
        let worker = vm("worker-0");
        // ARM's form, the resource group in ARM's case.
        let arm = dir.path().join("arm.json");
        let id = worker.resource_id().replace("capz-rg", "CAPZ-RG");
        std::fs::write(
            &arm,
            serde_json::json!({"id": id, "name": "worker-0", "properties": {"vmId": VM_ID.to_uppercase()}}).to_string(),
        )
        .unwrap();
        let recorded = RecordedVm::read(&arm).unwrap();
        assert_eq!(recorded.vm_id, VM_ID);
        assert_eq!(recorded.answer(&worker), VmAnswer::Found { vm_id: VM_ID.into() });
        let VmAnswer::Unavailable(why) = recorded.answer(&vm("worker-1")) else {
            panic!("another VM's answer is not taken")
        };
        assert!(why.contains("--azure-vm is ARM's answer for"), "{why}");
        // The Azure CLI's form (`az vm show`), and an answer naming no VM.
        let cli = dir.path().join("cli.json");
        std::fs::write(
            &cli,
            serde_json::json!({"id": worker.resource_id(), "vmId": VM_ID, "provisioningState": "Succeeded"})
                .to_string(),
        )
        .unwrap();
        assert_eq!(
            RecordedVm::read(&cli).unwrap().answer(&worker),
            VmAnswer::Found { vm_id: VM_ID.into() }
        );
        let bare = dir.path().join("bare.json");
        std::fs::write(&bare, serde_json::json!({"properties": {"vmId": VM_ID}}).to_string()).unwrap();
        assert_eq!(
            RecordedVm::read(&bare).unwrap().answer(&vm("any")),
            VmAnswer::Found { vm_id: VM_ID.into() }
        );
        // Unusable files say which flag and why.
        for (name, text, said) in [
            ("not-json.json", "<html>", "ARM's answer is not JSON"),
            ("no-vm-id.json", "{\"properties\": {}}", "no properties.vmId"),
            ("not-guid.json", "{\"vmId\": \"../x\"}", "is not a GUID"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let error = format!("{:#}", RecordedVm::read(&path).unwrap_err());
            assert!(error.starts_with("--azure-vm ") && error.contains(said), "{error}");
        }
        let error = format!("{:#}", RecordedVm::read(&dir.path().join("missing.json")).unwrap_err());
        assert!(error.starts_with("cannot read --azure-vm"), "{error}");
    }
}
