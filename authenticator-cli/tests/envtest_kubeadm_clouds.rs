//! Every cloud flavour joins under the name its provider gives the node, and the plugin asks
//! for exactly that name (SPEC section 6): an unmodified `kubeadm join` v1.32 (from
//! `KUBEBUILDER_ASSETS`) runs each shipped flavour of `images/kubeadm/` on a node whose cloud's
//! metadata service is stood in for on loopback as the provider's nodes see it, against one
//! real kube-apiserver, the real signer (every cloud's verifier at once) and a real
//! kube-controller-manager, with a real kubelet on containerd:
//!
//! - `kubeadm-config-template-aws.yaml` (a worker) and `kubeadm-control-plane-aws.yaml` (a
//!   control-plane node joining with `kubeadm join --control-plane`): EC2's IMDSv2
//!   ([`tests::cloud::ImdsV2StandIn`]) whose `local-hostname` is the private DNS name
//!   (`ip-10-250-0-1.us-west-2.compute.internal`; the control-plane instance's is resource-based,
//!   `i-0c0ffee0123456789.us-west-2.compute.internal`) while the kernel hostname is the short
//!   name cloud-init sets; `aws/v1` with an identity document of a test CA and the instance
//!   role's session from moto's STS (PyPI `moto[server]`).
//! - `kubeadm-config-template-gcp.yaml` and `kubeadm-control-plane-gcp.yaml` (the same, with
//!   `--control-plane`): the GCE metadata server ([`tests::cloud::GceMetadataStandIn`]:
//!   `instance/hostname` the zonal DNS name, identity tokens of a test Google key whose JWKS the
//!   signer fetches over loopback HTTPS).
//! - `kubeadm-config-template-azure.yaml` and `kubeadm-control-plane-azure.yaml` (the same, with
//!   `--control-plane`): Azure IMDS ([`tests::azure::ImdsStandIn`]: the instance document with
//!   the VM's computer name, attested documents of a synthetic Microsoft PKI) and Entra ID and
//!   ARM for the signer ([`tests::azure::ArmStandIn`]).
//!
//! cloud-init's part is [`tests::cloud_init`]: its datasource reads the stand-in as cloud-init's
//! does, the node's kernel hostname is the short name cloud-init sets, and the flavour's
//! `files` and `joinConfiguration` are rendered by its Jinja as Cluster API's kubeadm bootstrap
//! provider hands them over (`## template: jinja` user data) after clusterctl's
//! `${GCP_PROJECT}`; a value cloud-init could not render fails the suite. The node runs as in
//! `envtest_kubeadm` ([`tests::kubeadm_node`]: a private mount and UTS namespace, a stub
//! `systemctl`, the suite playing systemd): the image's drop-ins are the role's, rendered with
//! the cloud's attestor, and what the flavour writes into `/etc/systemd/system/kubelet.service.d`,
//! read as systemd reads them after the `daemon-reload` kubeadm asks for before it starts
//! kubelet. The suite's one addition is a drop-in giving the plugin the stand-ins' loopback
//! addresses through its documented variables (`AWS_EC2_METADATA_SERVICE_ENDPOINT`,
//! `AWS_ENDPOINT_URL_STS`, `GCE_METADATA_HOST`, `AZURE_METADATA_ENDPOINT`), where a real node uses
//! the link-local defaults.
//!
//! The cluster is what `kubeadm init` leaves (its `upload-config kubeadm|kubelet` and
//! `bootstrap-token` phases, one join token per Machine as Cluster API makes them; etcd
//! external, so a joining control plane has no member to add), as in `envtest_kubeadm`. The
//! nodes join one after another and each is stopped once checked: they share the cluster's
//! kubelet configuration, whose ports kubeadm's health check asks. Worker joins skip
//! `envtest_kubeadm`'s environment preflight checks only; the control-plane joins skip the phases
//! `envtest_kubeadm_init` skips (static pods whose images this machine cannot pull, the
//! certificates of the control plane it would run).
//!
//! For each flavour: `kubeadm join` exits 0; the Node kubelet registered, the CN of the CSR the
//! plugin filed (with the Machine's join token) and the claim on the Machine are the provider's
//! name for the instance; the CSR's signer is the cloud's (`aws/v1`, `gcp/v1`, `azure/v1`) and
//! it was approved by the signer; kubelet's kubeconfig runs the plugin with `--node-name` that
//! name; no Node has the kernel hostname where it differs; a joining control plane is marked
//! so by kubeadm. The cloud-init example of `images/image-builder/cloud-init` is rendered from
//! EC2's metadata as cloud-init renders it (its own test, no real part needed).

#![allow(clippy::unwrap_used)]

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::names::{SIGNER_AWS, SIGNER_AZURE, SIGNER_GCP};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use serde_json::{Value, json};
use tests::azure::{ArmStandIn, AzurePki, ImdsStandIn, SUBSCRIPTION};
use tests::capi;
use tests::cloud::{AwsIdentityCa, GceInstance, GceMetadataStandIn, GoogleSigner, ImdsV2StandIn, JwksServer};
use tests::cloud_init;
use tests::kubeadm_node::{
    AUTO_APPROVE_BINDINGS, CONTROL_PLANE, CONTROL_PLANE_JOIN_SKIPPED_PHASES, ControlPlane, ETC_KUBERNETES,
    KUBELET_DROPINS, Kubeadm, KubeadmJoin, LEGACY_SIGNER, NodeNamespace, bind_kubeadm_cluster_admins, bootstrap_token,
    cluster_kubelet_config, join_diagnostics, kubeadm_controller_manager, opted_in_cluster, require, role_variables,
    skip_control_plane_join_phases, wait_cluster_info_signed,
};
use tests::kubelet::{Containerd, ControllerManager, CsrRecorder, Host, Kubelet, NODE_IP, node, secs, validity};
use tests::live::{self, Signer, Workload, apply};
use tests::moto::{ACCOUNT, Moto, Session};

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubelet-authenticator");
/// Every join token's secret (`<id>.<secret>`).
const TOKEN_SECRET: &str = "0123456789abcdef";
/// The EC2 region and zone of the AWS instances.
const AWS_REGION: &str = "us-west-2";
const AWS_ZONE: &str = "us-west-2a";
/// clusterctl's `${GCP_PROJECT}` and the GCE instance's project.
const GCP_PROJECT: &str = "team-a-prod";
const GCP_ZONE: &str = "europe-west1-b";
const WAIT: Duration = Duration::from_secs(180);

fn signer_bin() -> PathBuf {
    live::sibling_binary(PLUGIN, "node-attestation-signer")
}

/// A shipped flavour this suite joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    AwsWorker,
    AwsControlPlane,
    GcpWorker,
    GcpControlPlane,
    AzureWorker,
    AzureControlPlane,
}

impl Flavour {
    fn file(self) -> &'static str {
        match self {
            Self::AwsWorker => "images/kubeadm/kubeadm-config-template-aws.yaml",
            Self::AwsControlPlane => "images/kubeadm/kubeadm-control-plane-aws.yaml",
            Self::GcpWorker => "images/kubeadm/kubeadm-config-template-gcp.yaml",
            Self::GcpControlPlane => "images/kubeadm/kubeadm-control-plane-gcp.yaml",
            Self::AzureWorker => "images/kubeadm/kubeadm-config-template-azure.yaml",
            Self::AzureControlPlane => "images/kubeadm/kubeadm-control-plane-azure.yaml",
        }
    }

    /// A KubeadmControlPlane's flavour: its Machine joins with `kubeadm join --control-plane`.
    fn control_plane(self) -> bool {
        matches!(
            self,
            Self::AwsControlPlane | Self::GcpControlPlane | Self::AzureControlPlane
        )
    }

    /// The KubeadmConfig spec its Machines get: a template's, or the control plane's
    /// `kubeadmConfigSpec`, with clusterctl's variables filled in.
    fn spec(self) -> Value {
        let text = std::fs::read_to_string(tests::repo_root().join(self.file())).unwrap();
        let document: Value = serde_yaml::from_str(&clusterctl(&text, &[("GCP_PROJECT", GCP_PROJECT)])).unwrap();
        if self.control_plane() {
            document["spec"]["kubeadmConfigSpec"].clone()
        } else {
            document["spec"]["template"]["spec"].clone()
        }
    }

    fn attestor(self) -> &'static str {
        match self {
            Self::AwsWorker | Self::AwsControlPlane => "aws",
            Self::GcpWorker | Self::GcpControlPlane => "gcp",
            Self::AzureWorker | Self::AzureControlPlane => "azure",
        }
    }

    fn signer(self) -> &'static str {
        match self {
            Self::AwsWorker | Self::AwsControlPlane => SIGNER_AWS,
            Self::GcpWorker | Self::GcpControlPlane => SIGNER_GCP,
            Self::AzureWorker | Self::AzureControlPlane => SIGNER_AZURE,
        }
    }
}

/// clusterctl's variable substitution (`${NAME}`); any variable left is an error.
fn clusterctl(text: &str, variables: &[(&str, &str)]) -> String {
    let mut out = text.to_owned();
    for (name, value) in variables {
        out = out.replace(&format!("${{{name}}}"), value);
    }
    assert!(
        !out.contains("${"),
        "a clusterctl variable the suite does not set:\n{out}"
    );
    out
}

/// One node: its flavour, Machine and instance.
struct NodeSpec {
    flavour: Flavour,
    machine: &'static str,
    token_id: &'static str,
    provider_id: String,
    /// The provider's name for the instance: CAPA's private DNS name, CAPG's instance name,
    /// CAPZ's VM name.
    provider_name: String,
}

/// What one join came to.
struct Joined {
    flavour: Flavour,
    hostname: String,
    registered: String,
    csr_name: String,
    csr_cn: String,
    signer: String,
    took: Duration,
}

/// What every join shares.
struct Cluster<'a> {
    assets: &'a Path,
    w: &'a Workload,
    admin: &'a kube::Client,
    csrs: &'a CsrRecorder,
    containerd: &'a Containerd,
    signer: &'a Signer,
    kcm: &'a ControllerManager,
    control_plane: ControlPlane,
    kubeadm: Kubeadm,
}

/// Joins `spec`'s node with its flavour, the cloud's metadata service seen through `data`
/// (cloud-init's instance data) and given to the plugin through `metadata_env`.
async fn join(
    c: &Cluster<'_>,
    host: &mut Host,
    spec: &NodeSpec,
    data: &Value,
    metadata_env: &[(&str, String)],
) -> Joined {
    let flavour = spec.flavour;
    let file = flavour.file();
    let variables = cloud_init::jinja_variables(data);
    let hostname = cloud_init::hostname(data);
    let recorder = host.recorder();

    // The image: the role's drop-in for the cloud's attestor, the cert dir, /etc/kubernetes/pki.
    let role = role_variables(&[("kubelet_authenticator_attestor", flavour.attestor())]);
    let ns = NodeNamespace::start_baked(host, &recorder, &role, Path::new(PLUGIN), &hostname);
    ns.install_role_dropin(&role);
    // The suite's addition: the stand-ins' loopback addresses for the plugin.
    let endpoints: String = metadata_env
        .iter()
        .map(|(name, value)| format!("Environment={name}={value}\n"))
        .collect();
    std::fs::write(
        ns.path(&format!("{KUBELET_DROPINS}/90-suite-metadata-endpoints.conf")),
        format!("# The suite's: where the cloud's metadata service is here.\n[Service]\n{endpoints}"),
    )
    .unwrap();
    if flavour.control_plane() {
        // The control plane's CA, as Cluster API hands it to a joining control-plane Machine.
        ns.install_cluster_ca(&c.w.env.client_ca);
    }

    // Cluster API's part, rendered by cloud-init: the flavour's files and join configuration.
    let kubeadm_config = flavour.spec();
    let rendered = |what: &str| {
        let value = cloud_init::render_strings(&kubeadm_config[what], &variables)
            .unwrap_or_else(|e| panic!("{file}: {what}: cloud-init would not render it: {e}"));
        let text = value.to_string();
        assert!(
            !text.contains(cloud_init::MISSING_JINJA_PREFIX) && !text.contains("{{"),
            "{file}: {what}: a value cloud-init cannot fill from its datasource: {text}"
        );
        value
    };
    let files = rendered("files");
    ns.write_files_as(&files, ToOwned::to_owned);
    let bootstrap = rendered("joinConfiguration");
    let name = bootstrap["nodeRegistration"]["name"].as_str().unwrap().to_owned();
    assert_eq!(
        name, spec.provider_name,
        "{file}: the node name is the provider's for the instance"
    );
    let join = c.control_plane.join_configuration(
        &bootstrap,
        &format!("{}.{TOKEN_SECRET}", spec.token_id),
        None,
        &c.containerd.endpoint(),
        flavour.control_plane(),
    );
    let flags = if flavour.control_plane() {
        skip_control_plane_join_phases()
    } else {
        c.kubeadm.ignore_preflight_errors()
    };

    // kubeadm join, unmodified, in the node's namespace.
    let mut kubeadm_join = c.kubeadm.join(&ns, &recorder, &join, &[flags]);
    let bootstrap_file = format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf");
    kubeadm_join
        .wait_for_kubelet_start(&ns, WAIT, &format!("{file}: kubeadm join"))
        .await;

    // systemd's part, after kubeadm's daemon-reload: the unit's drop-ins as they are now, its
    // ExecStartPre, then kubelet.
    let unit = ns.unit();
    assert_eq!(unit.exec_start_pre.len(), 1, "{unit:?}");
    let service = ns.kubelet_service(&unit);
    assert!(
        service
            .environment
            .iter()
            .any(|(k, v)| k == "KUBELET_AUTHENTICATOR_NODE_NAME" && *v == name),
        "{file}: kubelet's unit tells the plugin {name}: {:?}",
        service.environment
    );
    ns.run_exec_start_pre(&service);
    // kubelet registers --hostname-override, which kubeadm passes when the name is not the
    // hostname, or the hostname.
    let kubelet_name = service
        .exec_start
        .iter()
        .find_map(|a| a.strip_prefix("--hostname-override="))
        .unwrap_or(&hostname);
    assert_eq!(
        kubelet_name, name,
        "{file}: kubelet's node name: {:?}",
        service.exec_start
    );
    let mut kubelet = Kubelet::new(c.assets, host, c.containerd, &name, &spec.provider_id);
    ns.start_kubelet(&service, &mut kubelet, c.assets);
    let diagnostics = |join: &KubeadmJoin, kubelet: &Kubelet| join_diagnostics(join, kubelet, c.signer, 40, c.kcm);
    kubeadm_join
        .wait_joined(&format!("{file}: kubeadm join"), WAIT, |join| {
            diagnostics(join, &kubelet)
        })
        .await;
    let took = kubeadm_join.started.elapsed();
    let calls = ns.systemctl_calls();
    let reload = calls.iter().position(|call| call == "daemon-reload");
    let start = calls
        .iter()
        .position(|call| call == "start kubelet" || call == "restart kubelet");
    assert!(
        reload.is_some() && reload < start,
        "{file}: kubeadm reloads systemd before it starts kubelet: {calls:?}"
    );

    // The Node kubelet registered, the CSR the plugin filed, the claim: one name.
    let registered = node(&c.w.admin, &name)
        .await
        .unwrap_or_else(|| panic!("{file}: no Node {name}\n{}", diagnostics(&kubeadm_join, &kubelet)));
    if flavour.attestor() != "azure" {
        assert_eq!(
            registered.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(spec.provider_id.as_str()),
            "{file}"
        );
    }
    if hostname != name {
        assert!(
            node(&c.w.admin, &hostname).await.is_none(),
            "{file}: a Node named after the kernel hostname"
        );
    }
    if flavour.control_plane() {
        assert!(
            registered
                .metadata
                .labels
                .clone()
                .unwrap_or_default()
                .contains_key("node-role.kubernetes.io/control-plane"),
            "{file}: kubeadm's mark-control-plane"
        );
    }
    let requester = format!("system:bootstrap:{}", spec.token_id);
    let filed: Vec<_> = c.csrs.all().into_iter().filter(|s| s.username == requester).collect();
    // azure/v1's first CSR carries the challenge and is superseded by the answer.
    let superseded = |s: &tests::kubelet::Seen| {
        flavour.attestor() == "azure" && s.refused.as_ref().is_some_and(|(_, r)| r == "Denied Superseded")
    };
    assert!(
        filed
            .iter()
            .all(|s| s.signer == flavour.signer() && (s.refused.is_none() || superseded(s))),
        "{file}: {filed:?}"
    );
    let issued: Vec<_> = filed.iter().filter(|s| s.issued.is_some()).collect();
    assert_eq!(issued.len(), 1, "{file}: one certificate for the join: {filed:?}");
    let issued = issued[0];
    assert!(
        issued
            .approved_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("Attested")),
        "{file}: approved by the signer: {issued:?}"
    );
    let object = Api::<CertificateSigningRequest>::all(c.w.admin.clone())
        .get(&issued.name)
        .await
        .unwrap();
    let envelope = RequestEnvelope::parse(&object.spec.request.0).unwrap();
    assert_eq!(
        envelope.provider.as_ref().map(ToString::to_string).as_deref(),
        Some(format!("{}/v1", flavour.attestor()).as_str()),
        "{file}"
    );
    let request = ParsedCsr::from_der(&envelope.csr_der).unwrap();
    let csr_cn = request.common_names().next().and_then(|cn| cn.value.clone()).unwrap();
    assert_eq!(
        csr_cn,
        format!("system:node:{name}"),
        "{file}: the plugin asked for {name}"
    );
    let (_, _, subject) = validity(&issued.issued.clone().unwrap().1);
    assert!(subject.contains(&csr_cn), "{file}: {subject}");
    let machine = live::get(c.admin, &c.w.own(capi::machine(spec.machine, None))).await;
    let claim: Value = serde_json::from_str(
        machine["metadata"]["annotations"][attestation::names::ANNOTATION_CLAIM]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: {} is not claimed", spec.machine)),
    )
    .unwrap();
    assert_eq!(claim["nodeName"], json!(name), "{file}");
    assert_eq!(claim["providerID"], json!(spec.provider_id), "{file}");

    // kubelet's kubeconfig runs the plugin with that name.
    let conf: Value = serde_yaml::from_str(&ns.read(&role["kubelet_authenticator_kubeconfig"]).unwrap()).unwrap();
    let plugin_args: Vec<&str> = conf["users"][0]["user"]["exec"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        plugin_args.windows(2).any(|w| w == ["--node-name", name.as_str()]),
        "{file}: kubelet.conf: {plugin_args:?}"
    );
    assert!(!ns.path(&bootstrap_file).exists(), "{file}: kubeadm deleted it");

    kubelet.stop();
    drop(ns);
    Joined {
        flavour,
        hostname,
        registered: registered.metadata.name.unwrap_or_default(),
        csr_name: issued.name.clone(),
        csr_cn,
        signer: issued.signer.clone(),
        took,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubelet, kubeadm and moto_server: root, kubelet, kube-controller-manager and kubeadm beside kube-apiserver in KUBEBUILDER_ASSETS, containerd, runc, unshare, nsenter, and moto's STS"]
async fn every_cloud_flavour_joins_under_its_providers_node_name_and_the_plugin_asks_for_it() {
    let assets = require("envtest_kubeadm_clouds");
    assert!(
        tests::moto::binary().is_some(),
        "moto_server is not installed: scripts/deps installs PyPI moto[server] into /opt/moto (as root), or set MOTO_SERVER"
    );
    let began = Instant::now();
    let mut host = Host::claim();
    let (w, admin) = opted_in_cluster("envtest_kubeadm_clouds", &host, "aws,gcp,azure").await;
    let recorder = host.recorder();

    // The instances, their Machines as the providers write them (names, provider IDs,
    // addresses) and the KubeadmConfigs naming each one's join token.
    let aws_worker = ("i-0a1b2c3d4e5f60718", "ip-10-250-0-1.us-west-2.compute.internal");
    let aws_control_plane = ("i-0c0ffee0123456789", "i-0c0ffee0123456789.us-west-2.compute.internal");
    let gce_worker = GceInstance::new(GCP_PROJECT, GCP_ZONE, "4473882541632117237", "prod-md-gcp-7xk2p");
    let gce_control_plane = GceInstance::new(GCP_PROJECT, GCP_ZONE, "8162734950128837461", "prod-cp-gcp-m4d8t");
    // CAPZ's VMs: name and vmId; IMDS writes the resource group as created, CAPZ's provider ID
    // lower-cases it.
    let azure_worker = ("prod-md-azure-9fz4c", "5d6b0b0e-7f0a-4a43-9d0e-1c1e2b3a4f50");
    let azure_control_plane = ("prod-cp-azure-q2w7h", "a3c1e8f2-46b9-4d0c-8e75-2f9d1b6c0e34");
    let azure_resource_id = |vm: &str| {
        format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/CAPZ-RG/providers/Microsoft.Compute/virtualMachines/{vm}")
    };
    let azure_provider_id = |vm: &str| format!("azure://{}", azure_resource_id(vm).replace("/CAPZ-RG/", "/capz-rg/"));
    let nodes = [
        NodeSpec {
            flavour: Flavour::AwsWorker,
            machine: "prod-md-aws-x7k2p",
            token_id: "awswk0",
            provider_id: format!("aws:///{AWS_ZONE}/{}", aws_worker.0),
            provider_name: aws_worker.1.to_owned(),
        },
        NodeSpec {
            flavour: Flavour::GcpWorker,
            machine: "prod-md-gcp-7xk2p",
            token_id: "gcpwk0",
            provider_id: gce_worker.provider_id(),
            provider_name: gce_worker.instance_name.clone(),
        },
        NodeSpec {
            flavour: Flavour::AzureWorker,
            machine: azure_worker.0,
            token_id: "azrwk0",
            provider_id: azure_provider_id(azure_worker.0),
            provider_name: azure_worker.0.to_owned(),
        },
        NodeSpec {
            flavour: Flavour::AwsControlPlane,
            machine: "prod-cp-aws-b9q4w",
            token_id: "awscp0",
            provider_id: format!("aws:///{AWS_ZONE}/{}", aws_control_plane.0),
            provider_name: aws_control_plane.1.to_owned(),
        },
        NodeSpec {
            flavour: Flavour::GcpControlPlane,
            machine: "prod-cp-gcp-m4d8t",
            token_id: "gcpcp0",
            provider_id: gce_control_plane.provider_id(),
            provider_name: gce_control_plane.instance_name.clone(),
        },
        NodeSpec {
            flavour: Flavour::AzureControlPlane,
            machine: azure_control_plane.0,
            token_id: "azrcp0",
            provider_id: azure_provider_id(azure_control_plane.0),
            provider_name: azure_control_plane.0.to_owned(),
        },
    ];
    for spec in &nodes {
        apply(
            &admin,
            &w.own(capi::kubeadm_config(
                &format!("{}-kc", spec.machine),
                spec.token_id,
                "v1beta2",
            )),
        )
        .await;
        let mut machine = w.own(capi::machine(spec.machine, Some(&spec.provider_id)));
        // CAPG's and CAPZ's instance is named as its infrastructure Machine; CAPA's Machine
        // carries the private DNS name as an InternalDNS address.
        machine["spec"]["infrastructureRef"]["name"] = json!(spec.machine);
        machine["status"]["addresses"] = match spec.flavour {
            Flavour::AwsWorker | Flavour::AwsControlPlane => json!([
                {"type": "InternalIP", "address": NODE_IP.to_string()},
                {"type": "InternalDNS", "address": spec.provider_name}
            ]),
            _ => json!([{"type": "InternalIP", "address": NODE_IP.to_string()}]),
        };
        if spec.flavour.control_plane() {
            machine["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
        }
        apply(&admin, &machine).await;
    }

    // The clouds: moto's STS (the instance role and each instance's session), an identity
    // document CA; Google's keys and their JWKS; a Microsoft PKI, Entra ID and ARM.
    let dir = tempfile::tempdir().unwrap();
    recorder.folder(dir.path());
    let mut moto = Moto::start(3, &w.env.dir().join("moto.log"));
    moto.create_role(capi::AWS_NODE_ROLE);
    let sessions: Vec<Session> = [aws_worker.0, aws_control_plane.0]
        .iter()
        .map(|id| moto.assume_role(capi::AWS_NODE_ROLE, id))
        .collect();
    let aws_ca = AwsIdentityCa::new();
    let iid_certificates = dir.path().join("aws-iid.pem");
    std::fs::write(&iid_certificates, aws_ca.regions_pem(&[AWS_REGION])).unwrap();
    let google = Arc::new(Mutex::new(GoogleSigner::new()));
    let jwks = JwksServer::start(google.clone());
    let azure_pki = Arc::new(AzurePki::new(&["eastus.metadata.azure.com", "metadata.azure.com"]));
    let arm = ArmStandIn::start();
    for (vm, vm_id) in [azure_worker, azure_control_plane] {
        arm.add_vm(&azure_provider_id(vm), vm_id);
    }
    let cloud_ca = dir.path().join("cloud-ca.pem");
    std::fs::write(&cloud_ca, format!("{}{}", jwks.ca_pem(), arm.ca_pem())).unwrap();
    let azure_ca = dir.path().join("azure-ca.pem");
    std::fs::write(&azure_ca, azure_pki.bundle_pem()).unwrap();

    let csrs = CsrRecorder::start(w.admin.clone()).await;
    let kcm = kubeadm_controller_manager(&assets, &w.env, &host, &[]);
    let containerd = Containerd::start(&host);
    let signer = Signer::start_with_env(
        &signer_bin(),
        &w.env,
        &[
            "--leader-elect",
            "false",
            "--aws-iid-certificates",
            iid_certificates.to_str().unwrap(),
            "--aws-sts-endpoint",
            &moto.endpoint(),
            "--gcp-jwks-url",
            &jwks.url(),
            "--azure-ca-bundle",
            azure_ca.to_str().unwrap(),
            "--azure-arm-endpoint",
            &arm.url(),
            "--cloud-ca-bundle",
            cloud_ca.to_str().unwrap(),
        ],
        arm.signer_env(),
    )
    .await;
    recorder.pid(signer.pid().unwrap());

    // What `kubeadm init` leaves behind, by kubeadm's own phases (in a namespace of their own):
    // the cluster's kubeadm and kubelet configuration (one kubelet configuration for every
    // node: the nodes run one at a time on its ports), a join token per Machine, cluster-info.
    let kubeadm = Kubeadm::new(&assets);
    let control_plane = ControlPlane::of(&w).await;
    let kubelet_dir = tempfile::tempdir().unwrap();
    recorder.folder(kubelet_dir.path());
    let tokens: Vec<Value> = nodes
        .iter()
        .map(|n| bootstrap_token(&format!("{}.{TOKEN_SECRET}", n.token_id), None))
        .collect();
    let install_path = role_variables(&[])["kubelet_authenticator_install_path"].clone();
    let init_ns = NodeNamespace::start(&mut host, &recorder, &install_path, Path::new(PLUGIN), CONTROL_PLANE);
    kubeadm
        .init_cluster(
            &init_ns,
            &w,
            &control_plane.init_documents(&containerd.endpoint(), tokens, Some(w.env.etcd_url())),
            &cluster_kubelet_config(
                &containerd.endpoint(),
                tests::envtest::free_port(),
                tests::envtest::free_port(),
                kubelet_dir.path(),
            ),
        )
        .await;
    drop(init_ns);
    // What kubeadm init binds for the admin.conf it writes (a joining control plane writes its
    // own, and marks its Node with it).
    bind_kubeadm_cluster_admins(&w.admin).await;
    // bootstrapsigner signs cluster-info for every join token; the signer has taken kubeadm's
    // bootstrap binding away.
    let token_ids: Vec<&str> = nodes.iter().map(|n| n.token_id).collect();
    wait_cluster_info_signed(&w.admin, &token_ids, WAIT, &kcm).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(w.admin.clone());
    let deadline = Instant::now() + WAIT;
    while bindings.get_opt(AUTO_APPROVE_BINDINGS[0]).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the bootstrap binding is still there\n{}",
            signer.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let setup = began.elapsed();

    let c = Cluster {
        assets: &assets,
        w: &w,
        admin: &admin,
        csrs: &csrs,
        containerd: &containerd,
        signer: &signer,
        kcm: &kcm,
        control_plane,
        kubeadm,
    };
    let mut results = Vec::new();
    for spec in &nodes {
        // The cloud's metadata service as the instance sees it, and cloud-init's reading of it.
        let (stand_in, data, env): (Box<dyn Any>, Value, Vec<(&str, String)>) = match spec.flavour {
            Flavour::AwsWorker | Flavour::AwsControlPlane => {
                let (id, local_hostname, session) = if spec.flavour == Flavour::AwsWorker {
                    (aws_worker.0, aws_worker.1, &sessions[0])
                } else {
                    (aws_control_plane.0, aws_control_plane.1, &sessions[1])
                };
                let document = aws_ca.sign_document(&tests::cloud::document(ACCOUNT, id, AWS_REGION, AWS_ZONE));
                let imds = ImdsV2StandIn::start(
                    tests::cloud::rsa2048_body(&document),
                    capi::AWS_NODE_ROLE,
                    (
                        session.access_key_id.as_str(),
                        session.secret_access_key.as_str(),
                        session.session_token.as_str(),
                    ),
                );
                imds.set_meta_data(&[
                    ("ami-id", "ami-0a1b2c3d4e5f60718"),
                    ("hostname", local_hostname),
                    ("instance-id", id),
                    ("instance-type", "m5.large"),
                    ("local-hostname", local_hostname),
                    ("local-ipv4", &NODE_IP.to_string()),
                    ("placement/availability-zone", AWS_ZONE),
                    ("placement/region", AWS_REGION),
                ]);
                let data = cloud_init::ec2(&imds.endpoint());
                let env = vec![
                    ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint()),
                    ("AWS_ENDPOINT_URL_STS", moto.endpoint()),
                ];
                (Box::new(imds), data, env)
            }
            Flavour::GcpWorker | Flavour::GcpControlPlane => {
                let instance = if spec.flavour == Flavour::GcpWorker {
                    &gce_worker
                } else {
                    &gce_control_plane
                };
                let metadata = GceMetadataStandIn::start(google.clone(), instance.clone());
                let data = cloud_init::gce(&metadata.host());
                let env = vec![("GCE_METADATA_HOST", metadata.host())];
                (Box::new(metadata), data, env)
            }
            Flavour::AzureWorker | Flavour::AzureControlPlane => {
                let (vm, vm_id) = if spec.flavour == Flavour::AzureWorker {
                    azure_worker
                } else {
                    azure_control_plane
                };
                let imds = ImdsStandIn::start(azure_pki.clone(), &azure_resource_id(vm), vm_id, SUBSCRIPTION);
                let data = cloud_init::azure(&imds.endpoint());
                let env = vec![("AZURE_METADATA_ENDPOINT", imds.endpoint())];
                (Box::new(imds), data, env)
            }
        };
        results.push(join(&c, &mut host, spec, &data, &env).await);
        drop(stand_in);
    }
    assert!(
        csrs.of(LEGACY_SIGNER).is_empty(),
        "no legacy kubelet CSR: {:?}",
        csrs.of(LEGACY_SIGNER)
    );

    for (phase, why) in CONTROL_PLANE_JOIN_SKIPPED_PHASES {
        eprintln!("kubeadm join --control-plane skipped {phase}: {why}");
    }
    eprintln!(
        "envtest_kubeadm_clouds: setup (apiserver, CRDs, clouds, signer, kube-controller-manager, containerd, kubeadm init phases) {}",
        secs(setup)
    );
    for r in &results {
        eprintln!(
            "{}: kernel hostname {}, Node {}, CSR {} CN {} signer {}, kubeadm join {}",
            r.flavour.file(),
            r.hostname,
            r.registered,
            r.csr_name,
            r.csr_cn,
            r.signer,
            secs(r.took)
        );
    }
    eprintln!("envtest_kubeadm_clouds: total {}", secs(began.elapsed()));
}

#[test]
fn the_cloud_init_example_is_rendered_from_ec2_metadata_as_cloud_init_renders_it() {
    let imds = ImdsV2StandIn::start("unused".to_owned(), "node-role", ("ASIAEXAMPLE", "secret", "token"));
    imds.set_meta_data(&[
        ("instance-id", "i-0a1b2c3d4e5f60718"),
        ("local-hostname", "ip-10-0-1-2.us-west-2.compute.internal"),
        ("placement/availability-zone", "us-west-2a"),
        ("placement/region", "us-west-2"),
    ]);
    let variables = cloud_init::jinja_variables(&cloud_init::ec2(&imds.endpoint()));
    let path = "images/image-builder/cloud-init/kubelet-authenticator.yaml";
    let text = std::fs::read_to_string(tests::repo_root().join(path)).unwrap();
    let rendered = cloud_init::render_user_data(&text, &variables)
        .unwrap_or_else(|e| panic!("{path}: cloud-init would not render it: {e}"));
    assert!(
        rendered.starts_with("#cloud-config\n"),
        "{path}: rendered, it is cloud-config:\n{rendered}"
    );
    assert!(
        !rendered.contains("{{") && !rendered.contains(cloud_init::MISSING_JINJA_PREFIX),
        "{path}: every value filled:\n{rendered}"
    );
    let config: Value = serde_yaml::from_str(&rendered).unwrap();
    let provider_id = "aws:///us-west-2a/i-0a1b2c3d4e5f60718";
    let file = |name: &str| {
        config["write_files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == name)
            .unwrap_or_else(|| panic!("{path}: writes {name}"))["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(file("/etc/kubernetes/provider-id"), provider_id);
    let kubelet: Value = serde_yaml::from_str(&file("/var/lib/kubelet/config.yaml")).unwrap();
    assert_eq!(kubelet["providerID"], json!(provider_id));
    // Without its first line cloud-init takes it as it is: the values stay Jinja.
    let (_, unrendered) = text.split_once('\n').unwrap();
    assert!(
        cloud_init::render_user_data(unrendered, &variables)
            .unwrap()
            .contains("{{ ds.meta_data.instance_id }}")
    );
}
