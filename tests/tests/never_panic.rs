//! Hostile bytes: every parser answers arbitrary input with a value or an error, never a panic;
//! a whole decision on a mutated request is a decision; and a parse of what the node side
//! builds always succeeds.

#![allow(clippy::unwrap_used)]

use attestation::Outcome;
use attestation::claim::{ClaimState, PoolClaims};
use attestation::csr::ParsedCsr;
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::identity::{NodeName, ProviderId};
use attestation::machine::{ClusterView, KubeadmConfigView, MachinePoolView, MachineView, NodeView};
use proptest::prelude::*;
use tests::csr::{RequestSpec, client_csr_object};
use tests::worker0::Worker0;
use time::macros::datetime;

use tests::worker0::PID;

fn valid_request() -> Vec<u8> {
    RequestSpec::kubelet("worker-0", PID).build()
}

/// Decides `request` as worker-0's CSR in a cluster where the unmutated request is approved.
fn decide(request: Vec<u8>) -> Outcome {
    let mut csr = client_csr_object(request, "abcdef");
    csr.created = Some(datetime!(2026-11-22 08:00 UTC));
    Worker0::new("tpm,insecure")
        .decide(&csr, datetime!(2026-11-22 08:01 UTC))
        .outcome
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match *m {
            Mutation::Flip(i, mask) => bytes[i % len] ^= mask.max(1),
            Mutation::Insert(i, b) => bytes.insert(i % len, b),
            Mutation::Delete(i) => {
                bytes.remove(i % len);
            }
            Mutation::Truncate(i) => bytes.truncate(i % len),
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// DER of the request with mutations applied, re-wrapped so the envelope still parses.
fn mutated_der(mutations: &[Mutation]) -> Vec<u8> {
    let envelope = RequestEnvelope::parse(&valid_request()).unwrap();
    apply(envelope.csr_der, mutations)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn envelope_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = RequestEnvelope::parse(&bytes);
    }

    #[test]
    fn envelope_parser_never_panics_on_pem_shaped_text(text in "(-----(BEGIN|END) (CERTIFICATE REQUEST|KUBELET AUTHENTICATOR ATTESTATION (PROVIDER|DATA)|X)-----\n|[A-Za-z0-9+/=]{0,80}\n| |\r\n|[a-z:]{0,12}\n){0,12}") {
        let _ = RequestEnvelope::parse(text.as_bytes());
    }

    #[test]
    fn pkcs10_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(csr) = ParsedCsr::from_der(&bytes) {
            let _ = csr.verify_signature();
        }
    }

    #[test]
    fn mutated_pkcs10_never_panics(mutations in proptest::collection::vec(mutation(), 1..6)) {
        if let Ok(csr) = ParsedCsr::from_der(&mutated_der(&mutations)) {
            let _ = csr.verify_signature();
        }
    }

    #[test]
    fn mutated_tpm_structures_never_panic(which in 0usize..4, mutations in proptest::collection::vec(mutation(), 1..6)) {
        use attestation::tpm::public::TpmPublic;
        use attestation::tpm::quote::{Quote, Signature};
        let vector = |name: &str| std::fs::read(tests::repo_root().join("attestation/testdata/tpm").join(name)).unwrap();
        let ak = TpmPublic::from_tpm2b(&vector("ak.pub")).unwrap();
        let original = vector(["ak.pub", "ek.pub", "quote.msg", "quote.sig"][which]);
        let bytes = apply(original, &mutations);
        if let Ok(public) = TpmPublic::from_tpm2b(&bytes) {
            let _ = (public.name(), public.check_attestation_key(), public.canonical_spki());
        }
        if let Ok(quote) = Quote::from_attest(&bytes) {
            let _ = quote.pcr_digest_matches(&[(0, vec![0; 32])]);
            let _ = Signature::parse(&vector("quote.sig")).map(|s| s.verify(&ak, &quote.signed));
        }
        if let Ok(signature) = Signature::parse(&bytes) {
            // A mutated signature over the original quote verifies only if unchanged in meaning.
            let _ = signature.verify(&ak, &vector("quote.msg"));
        }
    }

    #[test]
    fn a_decision_on_a_mutated_request_is_a_decision(mutations in proptest::collection::vec(mutation(), 1..6), rewrap in any::<bool>()) {
        let request = if rewrap {
            RequestEnvelope { csr_der: mutated_der(&mutations), provider: Some(ProviderVersion::new("insecure", "v1")), data: None }.encode().into_bytes()
        } else {
            apply(valid_request(), &mutations)
        };
        let outcome = decide(request.clone());
        // A mutation may leave the request intact in meaning (PEM whitespace, say); anything
        // approved must still be the original key and identity.
        if let Outcome::Approved { .. } = outcome {
            let original = RequestEnvelope::parse(&valid_request()).unwrap();
            let mutated = RequestEnvelope::parse(&request).unwrap();
            let (a, b) = (ParsedCsr::from_der(&original.csr_der).unwrap(), ParsedCsr::from_der(&mutated.csr_der).unwrap());
            prop_assert_eq!(a.spki_der, b.spki_der);
            prop_assert_eq!(a.subject, b.subject);
        }
    }

    #[test]
    fn small_value_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), text in ".{0,300}") {
        let _ = ProviderId::from_extension_value(&bytes);
        let _ = NodeName::new(&text);
        let _ = ProviderVersion::parse(&text);
        let _ = ClaimState::of_machine(Some(&text), Some(PID));
        let _ = PoolClaims::parse(Some(&text)).instance(PID);
    }

    #[test]
    fn object_views_never_panic(json in arbitrary_json()) {
        let _ = MachineView::from_object(&json);
        let _ = MachinePoolView::from_object(&json);
        let _ = KubeadmConfigView::from_object(&json);
        let _ = ClusterView::from_object(&json);
        let _ = NodeView::from_object(&json);
    }

    #[test]
    fn what_the_node_builds_the_signer_parses(name in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]{1,10}){0,3}", pid in "[ -~]{1,200}") {
        let request = RequestSpec::kubelet(&name, &pid).build();
        let envelope = RequestEnvelope::parse(&request).unwrap();
        let csr = ParsedCsr::from_der(&envelope.csr_der).unwrap();
        csr.verify_signature().unwrap();
        let extension = csr.provider_id_extensions().next().unwrap();
        let decoded = ProviderId::from_extension_value(&extension.value).unwrap();
        prop_assert_eq!(decoded.as_str(), pid.as_str());
    }
}

/// JSON shaped like Kubernetes objects, with the kinds and fields the views read, of any type.
fn arbitrary_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zA-Z0-9./:-]{0,20}".prop_map(Value::String),
        Just(json!("cluster.x-k8s.io/v1beta2")),
        Just(json!("Machine")),
        Just(json!("MachinePool")),
    ];
    let tree = leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("metadata".to_owned()),
                    Just("spec".to_owned()),
                    Just("status".to_owned()),
                    Just("name".to_owned()),
                    Just("providerID".to_owned()),
                    Just("annotations".to_owned()),
                    Just("addresses".to_owned()),
                    Just("providerIDList".to_owned()),
                    Just("bootstrap".to_owned()),
                    Just("configRef".to_owned()),
                    "[a-z]{1,8}"
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    (
        tree,
        prop_oneof![
            Just("Machine"),
            Just("MachinePool"),
            Just("KubeadmConfig"),
            Just("Cluster"),
            Just("Node")
        ],
        prop_oneof![
            Just("cluster.x-k8s.io/v1beta2"),
            Just("cluster.x-k8s.io/v1beta1"),
            Just("bootstrap.cluster.x-k8s.io/v1beta2"),
            Just("v1")
        ],
    )
        .prop_map(|(mut tree, kind, version)| {
            if let Value::Object(map) = &mut tree {
                map.insert("kind".into(), json!(kind));
                map.insert("apiVersion".into(), json!(version));
            }
            tree
        })
}
