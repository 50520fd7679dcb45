//! `azure/v1` as the signer meets it, two ways (the first byte picks):
//! - even: the rest is a DATA block, through the whole rule engine with the Azure verifier
//!   (shipped Microsoft bundle, an ARM that knows every VM), on a well-formed CSR for a
//!   bootstrapped Machine, with a CSR #1 carrying a challenge. Whatever the bytes, a decision is
//!   made (never a panic), and it is never an approval: no input forges Microsoft's signature
//!   over the nonce of a challenge the signer wrote.
//! - odd: the rest is an attested document (PKCS#7), judged at a real document's time and read
//!   for its nonce as the node reads it: never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use attestation::attestor::Verifiers;
use attestation::azure::{AzureVerifier, AzureVm, MicrosoftTrust, VirtualMachines, VmAnswer};
use attestation::decision::Outcome;
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::identity::{NodeName, ProviderId};
use attestation::machine::{ClusterView, Inventory, MachineView};
use attestation::request::{KeyAlgorithm, NodeKey, kubelet_client_params};
use attestation::tpm::challenge_key::ChallengeKey;
use attestation::{Clock, CsrObject, Inputs, decide};
use libfuzzer_sys::fuzz_target;

const PID: &str = "azure:///subscriptions/8a205152-b25a-417f-a676-80465535a6c9/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/worker-0";

struct EveryVm;

impl VirtualMachines for EveryVm {
    fn answer(&self, _vm: &AzureVm) -> VmAnswer {
        VmAnswer::Found {
            vm_id: "b1310a36-d400-46f6-82cb-6217df846586".into(),
        }
    }
}

struct Fixture {
    csr_der: Vec<u8>,
    cluster: ClusterView,
    inventory: Inventory,
    verifiers: Verifiers,
    verifier: AzureVerifier,
    first: Vec<CsrObject>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).expect("key");
        let params = kubelet_client_params(
            &NodeName::new("worker-0").expect("name"),
            &ProviderId::new(PID).expect("provider ID"),
        );
        let csr_der = params.serialize_request(key.key_pair()).expect("CSR").der().to_vec();
        let mut cluster = ClusterView::named("prod", "team-a", &["azure"]);
        cluster.uid = "c1a55e00-0000-4000-8000-00000000c1a5".into();
        let machine = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "worker-0", "namespace": "team-a", "uid": "m-1", "resourceVersion": "1"},
            "spec": {"clusterName": "prod", "providerID": PID},
            "status": {"initialization": {"bootstrapDataSecretCreated": true}}
        });
        let inventory = Inventory {
            machines: vec![MachineView::from_object(&machine).expect("Machine").into()],
            ..Inventory::default()
        };
        let key = ChallengeKey::loaded(vec![7; 32]).expect("key");
        let verifier = || AzureVerifier::new(key.clone(), Arc::new(EveryVm)).with_trust(MicrosoftTrust::shipped());
        let verifiers = Verifiers::new().with(verifier());
        // A CSR #1 a phase-2 input may name, carrying a challenge (its mac is not the signer's:
        // the input cannot know the key either way).
        let first = CsrObject {
            name: "node-csr-1".into(),
            uid: "u-1".into(),
            request: RequestEnvelope {
                csr_der: csr_der.clone(),
                provider: Some(ProviderVersion::new("azure", "v1")),
                data: Some(br#"{"phase":1}"#.to_vec()),
            }
            .encode()
            .into_bytes(),
            signer_name: attestation::names::SIGNER_AZURE.into(),
            username: "system:bootstrap:abcdef".into(),
            annotations: [(
                attestation::names::ANNOTATION_AZURE_CHALLENGE.to_owned(),
                r#"{"issuedAt":"2026-07-28T13:24:00Z","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","mac":"AAAA"}"#.to_owned(),
            )]
            .into(),
            ..CsrObject::default()
        };
        Fixture {
            csr_der,
            cluster,
            inventory,
            verifiers,
            verifier: verifier(),
            first: vec![first],
        }
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((mode, data)) = input.split_first() else {
        return;
    };
    let f = fixture();
    let now = time::macros::datetime!(2026-07-28 13:25 UTC);
    if mode % 2 == 1 {
        let _ = f.verifier.verified_document(data, now);
        let text = String::from_utf8_lossy(data);
        let _ = attestation::azure::attestor::nonce_of(&text);
        return;
    }
    let request = RequestEnvelope {
        csr_der: f.csr_der.clone(),
        provider: Some(ProviderVersion::new("azure", "v1")),
        data: Some(data.to_vec()),
    };
    let csr = CsrObject {
        name: "node-csr-2".into(),
        uid: "u-2".into(),
        request: request.encode().into_bytes(),
        signer_name: attestation::names::SIGNER_AZURE.into(),
        usages: vec!["digital signature".into(), "client auth".into()],
        username: "system:bootstrap:abcdef".into(),
        groups: vec!["system:bootstrappers".into()],
        ..CsrObject::default()
    };
    let nodes: Vec<attestation::machine::NodeView> = Vec::new();
    let decision = decide(&Inputs {
        csr: &csr,
        cluster: &f.cluster,
        inventory: &f.inventory,
        nodes: &nodes,
        csrs: &f.first,
        verifiers: &f.verifiers,
        clock: Clock {
            now,
            first_seen: now,
            max_age: time::Duration::minutes(15),
        },
    })
    .expect("an azure signer CSR");
    assert!(
        !matches!(decision.outcome, Outcome::Approved { .. }),
        "approved without Microsoft's signature: {decision:?}"
    );
});
