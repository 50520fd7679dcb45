//! A `tpm/v1` DATA block as the signer meets it: the whole rule engine with the TPM verifier,
//! on a well-formed CSR for a bootstrapped Machine, whose DATA block is the input. Whatever the
//! bytes, the decision is made (never a panic), and it is never an approval: no input forges a
//! TPM's answer to a challenge the signer never issued.
#![no_main]

use std::sync::OnceLock;

use attestation::attestor::Verifiers;
use attestation::decision::Outcome;
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::identity::{NodeName, ProviderId};
use attestation::machine::{ClusterView, Inventory, MachineView};
use attestation::request::{KeyAlgorithm, NodeKey, kubelet_client_params};
use attestation::tpm::TpmVerifier;
use attestation::{Clock, CsrObject, Inputs, decide};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    csr_der: Vec<u8>,
    cluster: ClusterView,
    inventory: Inventory,
    verifiers: Verifiers,
    first: Vec<CsrObject>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).expect("key");
        let params = kubelet_client_params(
            &NodeName::new("worker-0").expect("name"),
            &ProviderId::new("aws:///us-east-1a/i-0abc").expect("provider ID"),
        );
        let csr_der = params.serialize_request(key.key_pair()).expect("CSR").der().to_vec();
        let mut cluster = ClusterView::named("prod", "team-a", &["tpm"]);
        cluster.uid = "c1a55e00-0000-4000-8000-00000000c1a5".into();
        let machine = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "worker-0", "namespace": "team-a", "uid": "m-1", "resourceVersion": "1",
                         "annotations": {"cluster.x-k8s.io/tpm-ek-sha256": "00".repeat(32)}},
            "spec": {"clusterName": "prod", "providerID": "aws:///us-east-1a/i-0abc"},
            "status": {"initialization": {"bootstrapDataSecretCreated": true}}
        });
        let inventory = Inventory {
            machines: vec![MachineView::from_object(&machine).expect("Machine").into()],
            ..Inventory::default()
        };
        let verifiers = Verifiers::new().with(TpmVerifier::new(vec![7; 32]).expect("key"));
        // A CSR #1 a phase-2 input may name, carrying a challenge.
        let first = CsrObject {
            name: "node-csr-1".into(),
            uid: "u-1".into(),
            request: RequestEnvelope {
                csr_der: csr_der.clone(),
                provider: Some(ProviderVersion::new("tpm", "v1")),
                data: Some(br#"{"phase":1,"ekPublic":"","akPublic":"","quote":"","signature":""}"#.to_vec()),
            }
            .encode()
            .into_bytes(),
            signer_name: attestation::names::SIGNER_TPM.into(),
            username: "system:bootstrap:abcdef".into(),
            annotations: [(
                attestation::names::ANNOTATION_TPM_CHALLENGE.to_owned(),
                r#"{"issuedAt":"2026-11-23T08:00:00Z","credentialBlob":"","encryptedSecret":""}"#.to_owned(),
            )]
            .into(),
            ..CsrObject::default()
        };
        Fixture {
            csr_der,
            cluster,
            inventory,
            verifiers,
            first: vec![first],
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let request = RequestEnvelope {
        csr_der: f.csr_der.clone(),
        provider: Some(ProviderVersion::new("tpm", "v1")),
        data: Some(data.to_vec()),
    };
    let csr = CsrObject {
        name: "node-csr-2".into(),
        uid: "u-2".into(),
        request: request.encode().into_bytes(),
        signer_name: attestation::names::SIGNER_TPM.into(),
        usages: vec!["digital signature".into(), "client auth".into()],
        username: "system:bootstrap:abcdef".into(),
        groups: vec!["system:bootstrappers".into()],
        ..CsrObject::default()
    };
    let now = time::macros::datetime!(2026-11-23 08:01 UTC);
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
    .expect("a tpm signer CSR");
    assert!(
        !matches!(decision.outcome, Outcome::Approved { .. }),
        "approved without a TPM: {decision:?}"
    );
});
