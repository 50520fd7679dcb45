//! A synthetic Azure for `azure/v1`: a Microsoft-like PKI (a root, an intermediate, a leaf for
//! `<region>.metadata.azure.com` with an RSA key), attested documents laid out as Azure's
//! (SignedData with the leaf embedded, `sha256WithRSAEncryption` in the digest fields, no signed
//! attributes, the signature over the statement), and a world that runs the node's attestor and
//! the signer's rule engine through both phases without a cluster. The signer is given the
//! synthetic root in place of Microsoft's; everything else is the real code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::new_without_default, missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use attestation::CsrObject;
use attestation::attestor::{AttestError, ChallengeAnswer, Verifiers};
use attestation::azure::attestor::{AzureAttestor, AzureImds};
use attestation::azure::{AzureVerifier, AzureVm, MicrosoftTrust, VirtualMachines, VmAnswer};
use attestation::decision::{Decision, Outcome};
use attestation::envelope::RequestEnvelope;
use attestation::identity::{NodeName, ProviderId};
use attestation::names::{ANNOTATION_AZURE_CHALLENGE, GROUP_BOOTSTRAPPERS, SIGNER_AZURE, usage};
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
use attestation::tpm::challenge_key::ChallengeKey;
use aws_lc_rs::encoding::AsDer as _;
use base64::Engine as _;
use rasn::types::{Any, OctetString, SetOf};
use rasn_cms::pkcs7_compat::{EncapsulatedContentInfo, SignedData};
use rasn_cms::{
    AlgorithmIdentifier, CONTENT_DATA, CONTENT_SIGNED_DATA, CertificateChoices, ContentInfo, IssuerAndSerialNumber,
    SignerIdentifier, SignerInfo,
};
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

use crate::capi;

pub const SUBSCRIPTION: &str = "8a205152-b25a-417f-a676-80465535a6c9";
pub const VM_ID: &str = "b1310a36-d400-46f6-82cb-6217df846586";
pub const NODE: &str = "worker-0";

/// worker-0's CAPZ provider ID.
pub fn provider_id(name: &str) -> String {
    format!(
        "azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachines/{name}"
    )
}

fn der<T: rasn::Encode>(what: &str, value: &T) -> Vec<u8> {
    rasn::der::encode(value).unwrap_or_else(|e| panic!("{what} does not encode: {e}"))
}

/// `sha256WithRSAEncryption`, NULL parameters: what Azure writes even where a digest goes.
fn sha256_with_rsa() -> AlgorithmIdentifier {
    AlgorithmIdentifier {
        algorithm: rasn::types::Oid::new(&[1, 2, 840, 113549, 1, 1, 11])
            .unwrap()
            .to_owned(),
        parameters: Some(Any::new(vec![0x05, 0x00])),
    }
}

/// `rsaEncryption`, NULL parameters.
fn rsa_encryption() -> AlgorithmIdentifier {
    AlgorithmIdentifier {
        algorithm: rasn::types::Oid::ISO_MEMBER_BODY_US_RSADSI_PKCS1_RSA.to_owned(),
        parameters: Some(Any::new(vec![0x05, 0x00])),
    }
}

fn ca_params(common_name: &str) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Synthetic Microsoft");
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    params
}

/// A Microsoft-like PKI that signs attested documents.
pub struct AzurePki {
    pub root_pem: String,
    pub intermediate_pem: String,
    pub leaf_der: Vec<u8>,
    leaf_key: aws_lc_rs::rsa::KeyPair,
    issuer_and_serial: IssuerAndSerialNumber,
}

impl AzurePki {
    /// A root, an intermediate, and a leaf naming `dns_names` (valid 2020 to 2100).
    pub fn new(dns_names: &[&str]) -> Self {
        let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let root_params = ca_params("Synthetic Microsoft TLS RSA Root G2");
        let root = root_params.clone().self_signed(&root_key).unwrap();
        let root_issuer = rcgen::Issuer::from_params(&root_params, &root_key);
        let intermediate_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut intermediate_params = ca_params("Synthetic Microsoft TLS G2 RSA CA OCSP 02");
        intermediate_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        let intermediate = intermediate_params
            .clone()
            .signed_by(&intermediate_key, &root_issuer)
            .unwrap();
        let intermediate_issuer = rcgen::Issuer::from_params(&intermediate_params, &intermediate_key);

        let leaf_key = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        let pkcs8 = leaf_key.as_der().unwrap();
        let rcgen_leaf_key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &rustls::pki_types::PrivatePkcs8KeyDer::from(pkcs8.as_ref()),
            &rcgen::PKCS_RSA_SHA256,
        )
        .unwrap();
        let mut leaf_params =
            rcgen::CertificateParams::new(dns_names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        leaf_params.distinguished_name = rcgen::DistinguishedName::new();
        leaf_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            dns_names.first().copied().unwrap_or("metadata.azure.com"),
        );
        leaf_params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        leaf_params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        leaf_params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let mut serial = [0u8; 16];
        aws_lc_rs::rand::fill(&mut serial).unwrap();
        serial[0] = (serial[0] & 0x7f) | 0x01;
        leaf_params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let leaf = leaf_params.signed_by(&rcgen_leaf_key, &intermediate_issuer).unwrap();
        let leaf_der = leaf.der().to_vec();
        let decoded: rasn_cms::Certificate = rasn::der::decode(&leaf_der).unwrap();
        Self {
            root_pem: root.pem(),
            intermediate_pem: intermediate.pem(),
            issuer_and_serial: IssuerAndSerialNumber {
                issuer: decoded.tbs_certificate.issuer.clone(),
                serial_number: decoded.tbs_certificate.serial_number.clone(),
            },
            leaf_der,
            leaf_key,
        }
    }

    /// The `--azure-ca-bundle` a signer trusting this PKI is given.
    pub fn bundle_pem(&self) -> String {
        format!("{}{}", self.root_pem, self.intermediate_pem)
    }

    pub fn trust(&self) -> MicrosoftTrust {
        MicrosoftTrust::from_pem(self.bundle_pem().as_bytes()).unwrap()
    }

    /// The attested document (PKCS#7, DER) of `statement`, laid out as Azure's.
    pub fn sign(&self, statement: &[u8]) -> Vec<u8> {
        let mut signature = vec![0; self.leaf_key.public_modulus_len()];
        self.leaf_key
            .sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                statement,
                &mut signature,
            )
            .unwrap();
        let signer = SignerInfo {
            version: 1.into(),
            sid: SignerIdentifier::IssuerAndSerialNumber(self.issuer_and_serial.clone()),
            digest_algorithm: sha256_with_rsa(),
            signed_attrs: None,
            signature_algorithm: rsa_encryption(),
            signature: OctetString::from(signature),
            unsigned_attrs: None,
        };
        let leaf: rasn_cms::Certificate = rasn::der::decode(&self.leaf_der).unwrap();
        let signed_data = SignedData {
            version: 1.into(),
            digest_algorithms: SetOf::from_vec(vec![sha256_with_rsa()]),
            encap_content_info: EncapsulatedContentInfo {
                content_type: CONTENT_DATA.to_owned(),
                content: Some(Any::new(der("the statement", &OctetString::from(statement.to_vec())))),
            },
            certificates: Some(SetOf::from_vec(vec![CertificateChoices::Certificate(Box::new(leaf))])),
            crls: None,
            signer_infos: SetOf::from_vec(vec![signer]),
        };
        der(
            "the ContentInfo",
            &ContentInfo {
                content_type: CONTENT_SIGNED_DATA.to_owned(),
                content: Any::new(der("the SignedData", &signed_data)),
            },
        )
    }

    /// [`AzurePki::sign`], base64 as IMDS serves it.
    pub fn sign_base64(&self, statement: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.sign(statement))
    }
}

/// Azure's time form, `MM/DD/YY HH:MM:SS -0000`.
pub fn azure_time(at: OffsetDateTime) -> String {
    format!(
        "{:02}/{:02}/{:02} {:02}:{:02}:{:02} -0000",
        u8::from(at.month()),
        at.day(),
        at.year().rem_euclid(100),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// A statement as IMDS writes it, valid six hours from `created`.
pub fn statement(nonce: &str, vm_id: &str, subscription: &str, created: OffsetDateTime) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "licenseType": "", "nonce": nonce, "plan": {"name": "", "product": "", "publisher": ""},
        "sku": "22_04-lts-gen2", "subscriptionId": subscription,
        "timeStamp": {"createdOn": azure_time(created), "expiresOn": azure_time(created + Duration::hours(6))},
        "vmId": vm_id
    }))
    .unwrap()
}

/// What the IMDS stand-in signs: this VM's statement with the nonce asked, or what a test bends.
#[derive(Clone)]
pub struct Imds {
    pub pki: Arc<AzurePki>,
    pub vm_id: String,
    pub subscription: String,
    pub created: OffsetDateTime,
    /// When set, the nonce signed instead of the one asked.
    pub nonce_override: Option<String>,
    pub asked: Arc<Mutex<Vec<String>>>,
}

impl AzureImds for Imds {
    fn attested_document(&mut self, nonce: &str) -> Result<String, AttestError> {
        self.asked.lock().unwrap().push(nonce.to_owned());
        let nonce = self.nonce_override.clone().unwrap_or_else(|| nonce.to_owned());
        Ok(self
            .pki
            .sign_base64(&statement(&nonce, &self.vm_id, &self.subscription, self.created)))
    }
}

/// ARM, as a table: each answer with when it was given (`None`: unknown).
#[derive(Default)]
pub struct Arm(pub Mutex<HashMap<String, (VmAnswer, Option<OffsetDateTime>)>>);

impl Arm {
    pub fn set(&self, provider_id: &str, answer: VmAnswer) {
        self.set_at(provider_id, answer, None);
    }

    pub fn set_at(&self, provider_id: &str, answer: VmAnswer, asked_at: Option<OffsetDateTime>) {
        let vm = AzureVm::parse(provider_id).unwrap();
        self.0.lock().unwrap().insert(vm.cache_key(), (answer, asked_at));
    }
}

impl VirtualMachines for Arm {
    fn answer(&self, vm: &AzureVm) -> VmAnswer {
        self.0
            .lock()
            .unwrap()
            .get(&vm.cache_key())
            .map(|(answer, _)| answer.clone())
            .unwrap_or(VmAnswer::NotAsked)
    }

    fn asked_at(&self, vm: &AzureVm) -> Option<OffsetDateTime> {
        self.0.lock().unwrap().get(&vm.cache_key()).and_then(|(_, at)| *at)
    }
}

/// worker-0 and worker-1 of an `azure` Cluster, the signer's `azure/v1` verifier trusting
/// `pki`, ARM's answers, and the CSRs filed so far.
pub struct World {
    pub pki: Arc<AzurePki>,
    pub arm: Arc<Arm>,
    pub cluster: Value,
    pub machines: Vec<Value>,
    pub challenge_key: Vec<u8>,
    pub csrs: Vec<CsrObject>,
    pub now: OffsetDateTime,
    pub serial: u32,
    /// Who files the CSRs: worker-0's join token, or (renewal) the node itself.
    pub as_node: bool,
}

impl World {
    pub fn new() -> Self {
        let pki = Arc::new(AzurePki::new(&["eastus.metadata.azure.com", "metadata.azure.com"]));
        let arm = Arc::new(Arm::default());
        arm.set(&provider_id(NODE), VmAnswer::Found { vm_id: VM_ID.into() });
        Self {
            pki,
            arm,
            cluster: capi::cluster("azure"),
            machines: vec![
                capi::machine(NODE, Some(&provider_id(NODE))),
                capi::machine("worker-1", Some(&provider_id("worker-1"))),
            ],
            challenge_key: vec![7; 32],
            csrs: Vec::new(),
            now: OffsetDateTime::now_utc().replace_nanosecond(0).unwrap(),
            serial: 0,
            as_node: false,
        }
    }

    pub fn verifier_with(&self, key: ChallengeKey) -> AzureVerifier {
        AzureVerifier::new(key, Arc::clone(&self.arm) as Arc<dyn VirtualMachines>).with_trust(self.pki.trust())
    }

    pub fn verifier(&self) -> AzureVerifier {
        self.verifier_with(ChallengeKey::loaded(self.challenge_key.clone()).unwrap())
    }

    /// The IMDS of worker-0's VM.
    pub fn imds(&self) -> Imds {
        Imds {
            pki: Arc::clone(&self.pki),
            vm_id: VM_ID.into(),
            subscription: SUBSCRIPTION.into(),
            created: self.now - Duration::seconds(5),
            nonce_override: None,
            asked: Arc::default(),
        }
    }

    /// A CSR object filed by worker-0's join token (or by the node, [`World::as_node`]).
    pub fn object(&mut self, envelope: &RequestEnvelope) -> CsrObject {
        self.serial += 1;
        let (username, groups) = if self.as_node {
            (
                format!("system:node:{NODE}"),
                vec![
                    attestation::names::GROUP_NODES.to_owned(),
                    "system:authenticated".to_owned(),
                ],
            )
        } else {
            (
                "system:bootstrap:abcdef".to_owned(),
                vec![GROUP_BOOTSTRAPPERS.to_owned()],
            )
        };
        CsrObject {
            name: format!("node-csr-{}", self.serial),
            uid: format!("00000000-0000-4000-8000-{:012}", self.serial),
            request: envelope.encode().into_bytes(),
            signer_name: SIGNER_AZURE.into(),
            usages: vec![usage::DIGITAL_SIGNATURE.into(), usage::CLIENT_AUTH.into()],
            username,
            groups,
            created: Some(self.now),
            ..CsrObject::default()
        }
    }

    pub fn decide(&self, csr: &CsrObject) -> Decision {
        self.decide_with(csr, self.verifier())
    }

    pub fn decide_with(&self, csr: &CsrObject, verifier: AzureVerifier) -> Decision {
        capi::decide_among(
            csr,
            &self.cluster,
            &self.machines,
            &self.csrs,
            Verifiers::new().with(verifier),
            self.now,
        )
    }

    /// CSR #1 for `key` and worker-0's provider ID, challenged; it is now in the cluster with
    /// its challenge.
    pub fn challenged(&mut self, key: &NodeKey) -> CsrObject {
        self.challenged_for(key, &provider_id(NODE))
    }

    /// [`World::challenged`] for provider ID `pid`.
    pub fn challenged_for(&mut self, key: &NodeKey, pid: &str) -> CsrObject {
        let mut attestor = AzureAttestor::new(self.imds());
        let envelope = build_envelope(&params(pid), key, &mut attestor, None).unwrap();
        let mut csr = self.object(&envelope);
        let decision = self.decide(&csr);
        assert!(
            matches!(decision.outcome, Outcome::Retry { .. }),
            "phase 1 leaves CSR #1 pending: {decision:#?}"
        );
        assert!(
            decision.annotations.contains_key(ANNOTATION_AZURE_CHALLENGE),
            "{decision:#?}"
        );
        csr.annotations = decision.annotations;
        self.csrs.push(csr.clone());
        csr
    }

    /// CSR #2: `imds` answers CSR #1's challenge for `key`.
    pub fn answer(&mut self, key: &NodeKey, first: &CsrObject, imds: Imds) -> (CsrObject, Decision) {
        self.answer_for(key, first, imds, &provider_id(NODE))
    }

    /// [`World::answer`] for provider ID `pid`.
    pub fn answer_for(&mut self, key: &NodeKey, first: &CsrObject, imds: Imds, pid: &str) -> (CsrObject, Decision) {
        let annotation = first.annotations[ANNOTATION_AZURE_CHALLENGE].clone();
        let answer = ChallengeAnswer {
            csr_name: &first.name,
            csr_uid: &first.uid,
            annotation: &annotation,
        };
        let mut attestor = AzureAttestor::new(imds);
        let envelope = build_envelope(&params(pid), key, &mut attestor, Some(answer)).unwrap();
        let csr = self.object(&envelope);
        let decision = self.decide(&csr);
        (csr, decision)
    }
}

pub fn params(provider_id: &str) -> rcgen::CertificateParams {
    kubelet_client_params(&NodeName::new(NODE).unwrap(), &ProviderId::new(provider_id).unwrap())
}

pub fn key() -> NodeKey {
    NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap()
}

/// A loopback Azure Instance Metadata Service for one VM: `GET /metadata/attested/document`
/// (`?api-version=..&nonce=..`, header `Metadata: true`, else 400) signs the VM's statement
/// with the nonce asked, created now; `GET /metadata/instance/compute/resourceId` (`format=text`)
/// answers the VM's resource ID; `GET /metadata/instance?api-version=..` (what cloud-init's
/// Azure datasource reads) answers the instance document: `compute` with the VM's `name`, its
/// `osProfile.computerName` (the same name: CAPZ creates a VM with its computer name set to the
/// VM's name), `resourceId`, `vmId`, `subscriptionId`, `resourceGroupName`, `location`. The
/// plugin reaches it through `AZURE_METADATA_ENDPOINT`.
pub struct ImdsStandIn {
    server: crate::cloud::Loop,
    documents: Arc<std::sync::atomic::AtomicUsize>,
    vm_id: Arc<Mutex<String>>,
    created_offset: Arc<std::sync::atomic::AtomicI64>,
}

impl ImdsStandIn {
    /// Starts it for the VM `resource_id` (as IMDS writes it) with `vm_id`, signing with `pki`.
    pub fn start(pki: Arc<AzurePki>, resource_id: &str, vm_id: &str, subscription: &str) -> Self {
        use std::sync::atomic::Ordering;
        let documents = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let vm = Arc::new(Mutex::new(vm_id.to_owned()));
        let created_offset = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let (d, v, c) = (documents.clone(), vm.clone(), created_offset.clone());
        let (resource_id, subscription) = (resource_id.to_owned(), subscription.to_owned());
        let server = crate::cloud::http_loop("azure-imds", move |request| {
            use crate::cloud::Response;
            if request.header("Metadata") != Some("true") {
                return Response::text(400, "Required metadata header not specified");
            }
            match request.path.as_str() {
                "/metadata/attested/document" => {
                    let Some(nonce) = request.query("nonce") else {
                        return Response::text(400, "nonce");
                    };
                    d.fetch_add(1, Ordering::SeqCst);
                    let created = OffsetDateTime::now_utc() + Duration::seconds(c.load(Ordering::SeqCst));
                    let vm_id = v.lock().unwrap().clone();
                    let signature = pki.sign_base64(&statement(nonce, &vm_id, &subscription, created));
                    Response::new(
                        200,
                        "application/json; charset=utf-8",
                        json!({"encoding": "pkcs7", "signature": signature}).to_string(),
                    )
                }
                "/metadata/instance/compute/resourceId" => Response::text(200, &resource_id),
                "/metadata/instance" => {
                    if request.query("api-version").is_none() {
                        return Response::new(
                            400,
                            "application/json; charset=utf-8",
                            json!({"error": "Bad request. api-version was not specified in the request"}).to_string(),
                        );
                    }
                    let part = |name: &str| {
                        let mut parts = resource_id.split('/');
                        parts.by_ref().find(|p| p.eq_ignore_ascii_case(name));
                        parts.next().unwrap_or_default().to_owned()
                    };
                    let name = resource_id.rsplit('/').next().unwrap_or_default();
                    let vm_id = v.lock().unwrap().clone();
                    Response::new(
                        200,
                        "application/json; charset=utf-8",
                        json!({"compute": {
                            "azEnvironment": "AzurePublicCloud", "location": "eastus", "name": name,
                            "osProfile": {"adminUsername": "capi", "computerName": name, "disablePasswordAuthentication": "true"},
                            "osType": "Linux", "platformFaultDomain": "0", "platformUpdateDomain": "0",
                            "resourceGroupName": part("resourceGroups"), "resourceId": resource_id,
                            "subscriptionId": subscription, "vmId": vm_id, "vmSize": "Standard_D2s_v3", "zone": ""},
                            "network": {"interface": [{"ipv4": {"ipAddress": [{"privateIpAddress": "10.1.0.4", "publicIpAddress": ""}],
                                "subnet": [{"address": "10.1.0.0", "prefix": "16"}]}, "ipv6": {"ipAddress": []},
                                "macAddress": "000D3A0F2B1C"}]}})
                        .to_string(),
                    )
                }
                _ => Response::text(404, "Not Found"),
            }
        });
        Self {
            server,
            documents,
            vm_id: vm,
            created_offset,
        }
    }

    /// `http://127.0.0.1:<port>`: the value for `AZURE_METADATA_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.address)
    }

    /// Attested documents served so far.
    pub fn documents(&self) -> usize {
        self.documents.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Signs statements of another `vmId` from now on.
    pub fn set_vm_id(&self, vm_id: &str) {
        *self.vm_id.lock().unwrap() = vm_id.to_owned();
    }

    /// Signs statements created `seconds` from now (negative: in the past).
    pub fn set_created_offset(&self, seconds: i64) {
        self.created_offset.store(seconds, std::sync::atomic::Ordering::SeqCst);
    }
}

/// ARM's state in [`ArmStandIn`].
struct ArmState {
    vms: HashMap<String, String>,
    down: bool,
    lookups: usize,
    tokens: usize,
    refused: usize,
}

/// A loopback Entra ID token endpoint and Azure Resource Manager on one HTTPS server (its CA
/// for the signer's `--cloud-ca-bundle`): `POST /<tenant>/oauth2/v2.0/token` grants
/// [`ArmStandIn::TOKEN`] to the client-credentials grant of [`ArmStandIn::CLIENT_ID`] with
/// [`ArmStandIn::CLIENT_SECRET`] (else 401 `invalid_client`); `GET <VM resource ID>` answers
/// `properties.vmId` only with that bearer token (else 401), ARM's 404 error for an unknown VM,
/// and 503 while down.
pub struct ArmStandIn {
    server: crate::cloud::Loop,
    ca_pem: String,
    state: Arc<Mutex<ArmState>>,
}

impl ArmStandIn {
    pub const TENANT: &'static str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    pub const CLIENT_ID: &'static str = "0d1f3e6c-5d4e-4c2b-9a8f-1e2d3c4b5a69";
    pub const CLIENT_SECRET: &'static str = "synthetic-client-secret";
    pub const TOKEN: &'static str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJub25lIn0.synthetic-arm-token";

    pub fn start() -> Self {
        let (config, ca_pem) = crate::cloud::tls_config();
        let state = Arc::new(Mutex::new(ArmState {
            vms: HashMap::new(),
            down: false,
            lookups: 0,
            tokens: 0,
            refused: 0,
        }));
        let shared = state.clone();
        let mut handler = move |request: &crate::cloud::Request| {
            use crate::cloud::Response;
            let mut state = shared.lock().unwrap();
            if request.method == "POST" && request.path == format!("/{}/oauth2/v2.0/token", Self::TENANT) {
                let form: HashMap<String, String> = String::from_utf8_lossy(&request.body)
                    .split('&')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| {
                        (
                            k.to_owned(),
                            crate::cloud::percent_decode(&v.replace('+', " ")).unwrap_or_default(),
                        )
                    })
                    .collect();
                let ok = form.get("grant_type").map(String::as_str) == Some("client_credentials")
                    && form.get("client_id").map(String::as_str) == Some(Self::CLIENT_ID)
                    && form.get("client_secret").map(String::as_str) == Some(Self::CLIENT_SECRET);
                if !ok {
                    state.refused += 1;
                    return Response::new(
                        401,
                        "application/json",
                        json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}).to_string(),
                    );
                }
                state.tokens += 1;
                return Response::new(
                    200,
                    "application/json",
                    json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": Self::TOKEN}).to_string(),
                );
            }
            if request.method != "GET" || !request.path.starts_with("/subscriptions/") {
                return Response::text(404, "Not Found");
            }
            if request.header("Authorization") != Some(&format!("Bearer {}", Self::TOKEN)) {
                state.refused += 1;
                return Response::new(
                    401,
                    "application/json",
                    json!({"error": {"code": "InvalidAuthenticationToken", "message": "The access token is invalid."}})
                        .to_string(),
                );
            }
            state.lookups += 1;
            if state.down {
                return Response::text(503, "Service Unavailable");
            }
            match state.vms.get(&request.path.to_ascii_lowercase()) {
                Some(vm_id) => Response::new(
                    200,
                    "application/json; charset=utf-8",
                    json!({"name": request.path.rsplit('/').next(), "id": request.path,
                           "properties": {"vmId": vm_id, "provisioningState": "Succeeded"}})
                    .to_string(),
                ),
                None => Response::new(
                    404,
                    "application/json; charset=utf-8",
                    json!({"error": {"code": "ResourceNotFound", "message": format!("The Resource '{}' was not found.", request.path)}})
                        .to_string(),
                ),
            }
        };
        let server = crate::cloud::Loop::start("azure-arm-https", move |tcp| {
            use std::io::Write as _;
            let Ok(connection) = rustls::ServerConnection::new(config.clone()) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(connection, tcp);
            crate::cloud::serve_one(&mut tls, &mut handler);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        Self { server, ca_pem, state }
    }

    /// `https://127.0.0.1:<port>`: `--azure-arm-endpoint` and `AZURE_AUTHORITY_HOST` both.
    pub fn url(&self) -> String {
        format!("https://{}", self.server.address)
    }

    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// The address it listens on (an egress proxy's route to Azure's host names).
    pub fn address(&self) -> std::net::SocketAddr {
        self.server.address
    }

    /// The VM a provider ID names exists with `vm_id`.
    pub fn add_vm(&self, provider_id: &str, vm_id: &str) {
        let vm = AzureVm::parse(provider_id).unwrap();
        self.state.lock().unwrap().vms.insert(vm.cache_key(), vm_id.to_owned());
    }

    /// ARM answers 503 while `down`.
    pub fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    /// VM reads that carried the token.
    pub fn lookups(&self) -> usize {
        self.state.lock().unwrap().lookups
    }

    /// Tokens granted.
    pub fn tokens(&self) -> usize {
        self.state.lock().unwrap().tokens
    }

    /// Requests refused for their credentials.
    pub fn refused(&self) -> usize {
        self.state.lock().unwrap().refused
    }

    /// The signer's environment for the client-secret credential against this stand-in.
    pub fn signer_env(&self) -> Vec<(String, String)> {
        vec![
            ("AZURE_TENANT_ID".into(), Self::TENANT.into()),
            ("AZURE_CLIENT_ID".into(), Self::CLIENT_ID.into()),
            ("AZURE_CLIENT_SECRET".into(), Self::CLIENT_SECRET.into()),
            ("AZURE_AUTHORITY_HOST".into(), self.url()),
        ]
    }
}
