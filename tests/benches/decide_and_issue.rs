//! Signer cost per kubelet client CSR: parse, verify the self-signature, decide (every rule)
//! and issue, for a P-256 CSR, with an RSA-2048 cluster CA and with a P-256 one.
//!
//! `cargo bench -p tests --bench decide_and_issue`; criterion runs on one thread.

#![allow(clippy::unwrap_used, missing_docs)]

use attestation::attestor::Verifiers;
use attestation::ca::{ClusterCa, Validity};
use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;
use attestation::insecure::InsecureVerifier;
use attestation::machine::{ClusterView, Inventory, KubeadmConfigView, MachineView, NodeView};
use attestation::{Clock, Inputs};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tests::capi;
use tests::csr::{RequestSpec, client_csr_object};
use time::{Duration, OffsetDateTime};

const PID: &str = "aws:///us-east-1a/i-0abc";

fn bench(c: &mut Criterion) {
    let mut csr = client_csr_object(RequestSpec::kubelet("worker-0", PID).build(), "abcdef");
    csr.created = Some(OffsetDateTime::now_utc());
    let cluster = ClusterView::from_object(&capi::cluster("tpm,insecure")).unwrap();
    let mut inventory = Inventory::default();
    // A cluster of 100 Machines: the lookup is part of the cost.
    for i in 0..100 {
        let pid = if i == 42 {
            PID.to_owned()
        } else {
            format!("aws:///us-east-1a/i-{i:04}")
        };
        let name = if i == 42 {
            "worker-0".to_owned()
        } else {
            format!("worker-{i}x")
        };
        inventory.machines.push(
            MachineView::from_object(&capi::machine(&name, Some(&pid)))
                .unwrap()
                .into(),
        );
        inventory.kubeadm_configs.push(
            KubeadmConfigView::from_object(&capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"))
                .unwrap()
                .into(),
        );
    }
    let nodes: Vec<NodeView> = Vec::new();
    let verifiers = Verifiers::new().with(InsecureVerifier);
    // Every rule on a CSR, now, against `inventory`.
    let decide_csr = |csr: &attestation::CsrObject, inventory: &Inventory| {
        let now = OffsetDateTime::now_utc();
        let clock = Clock {
            now,
            first_seen: now,
            max_age: Duration::minutes(15),
        };
        let inputs = Inputs {
            csr,
            cluster: &cluster,
            inventory,
            nodes: &nodes,
            csrs: &attestation::NoCsrs,
            verifiers: &verifiers,
            clock,
        };
        (now, attestation::decide(&inputs).unwrap())
    };
    let decide = |inventory: &Inventory| decide_csr(&csr, inventory);

    let mut group = c.benchmark_group("parse+verify+decide+issue P-256 CSR");
    group.throughput(Throughput::Elements(1));
    for (name, algorithm) in [
        ("RSA-2048 CA", &rcgen::PKCS_RSA_SHA256),
        ("P-256 CA", &rcgen::PKCS_ECDSA_P256_SHA256),
    ] {
        let (cert_pem, key_pem) = tests::ca::rcgen_ca(algorithm);
        let ca = ClusterCa::from_pem(cert_pem.as_bytes(), key_pem.as_bytes()).unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                let (now, decision) = decide(&inventory);
                let approved = decision.issuance.unwrap();
                let validity = Validity {
                    now,
                    requested_seconds: None,
                    max: Duration::hours(168),
                };
                ca.issue(&approved.csr, &approved.provider_id, validity).unwrap()
            })
        });
    }
    group.finish();

    // The split storm's shape: 500 Machines in one Cluster, half of them already claimed, so
    // rules 10 and 11 walk every Machine and read its claim.
    let storm = claimed_cluster(500);
    let hundred = claimed_cluster(100);
    let large = claimed_cluster(10_000);
    let mut decide_only = c.benchmark_group("decide only (no issuance)");
    decide_only.throughput(Throughput::Elements(1));
    for (name, inventory) in [
        ("P-256 CSR, 100 Machines", &inventory),
        ("P-256 CSR, 500 Machines, 250 claimed", &storm),
        ("P-256 CSR, 100 Machines, 50 claimed", &hundred),
        ("P-256 CSR, 10000 Machines, 5000 claimed", &large),
    ] {
        decide_only.bench_function(name, |b| b.iter(|| decide(inventory).1));
    }
    // A hostile workload cluster's junk: a well-formed CSR for a provider ID no Machine has
    // (denied MachineNotFound), at 100 and at 10,000 Machines (SPEC section 7, revision 6).
    let mut junk = client_csr_object(
        RequestSpec::kubelet("worker-0", "aws:///us-east-1a/i-unknown").build(),
        "abcdef",
    );
    junk.created = Some(OffsetDateTime::now_utc());
    for (name, inventory) in [
        ("junk CSR, 100 Machines, 50 claimed", &hundred),
        ("junk CSR, 10000 Machines, 5000 claimed", &large),
    ] {
        decide_only.bench_function(name, |b| b.iter(|| decide_csr(&junk, inventory).1));
    }
    decide_only.finish();

    // Where the time goes.
    let mut pieces = c.benchmark_group("pieces");
    let envelope = RequestEnvelope::parse(&csr.request).unwrap();
    let parsed = ParsedCsr::from_der(&envelope.csr_der).unwrap();
    let pid = ProviderId::new(PID).unwrap();
    pieces.bench_function("envelope parse", |b| {
        b.iter(|| RequestEnvelope::parse(&csr.request).unwrap())
    });
    pieces.bench_function("PKCS#10 parse", |b| {
        b.iter(|| ParsedCsr::from_der(&envelope.csr_der).unwrap())
    });
    pieces.bench_function("self-signature verify (P-256)", |b| {
        b.iter(|| parsed.verify_signature().unwrap())
    });
    for (name, algorithm) in [
        ("issue, RSA-2048 CA", &rcgen::PKCS_RSA_SHA256),
        ("issue, P-256 CA", &rcgen::PKCS_ECDSA_P256_SHA256),
    ] {
        let (cert_pem, key_pem) = tests::ca::rcgen_ca(algorithm);
        let ca = ClusterCa::from_pem(cert_pem.as_bytes(), key_pem.as_bytes()).unwrap();
        pieces.bench_function(name, |b| {
            b.iter(|| {
                ca.issue(
                    &parsed,
                    &pid,
                    Validity {
                        now: OffsetDateTime::now_utc(),
                        requested_seconds: None,
                        max: Duration::hours(168),
                    },
                )
                .unwrap()
            })
        });
    }
    pieces.finish();
}

/// `machines` Machines with KubeadmConfigs; the target (`worker-0`, [`PID`]) unclaimed, every
/// other odd one claimed by its node.
fn claimed_cluster(machines: usize) -> Inventory {
    let mut inventory = Inventory::default();
    for i in 0..machines {
        let (name, pid) = if i == 42 {
            ("worker-0".to_owned(), PID.to_owned())
        } else {
            (format!("worker-{i}x"), format!("aws:///us-east-1a/i-{i:04}"))
        };
        let mut machine = capi::machine(&name, Some(&pid));
        if i % 2 == 1 {
            let claim = serde_json::json!({
                "nodeName": name, "providerID": pid, "csrUID": format!("uid-{i}"),
                "claimedAt": "2026-11-26T00:00:00Z",
            });
            capi::annotate(&mut machine, attestation::names::ANNOTATION_CLAIM, &claim.to_string());
        }
        let machine = MachineView::from_object(&machine).unwrap();
        assert_eq!(machine.valid_claim().is_some(), i % 2 == 1, "{name}'s claim reads");
        inventory.machines.push(machine.into());
        inventory.kubeadm_configs.push(
            KubeadmConfigView::from_object(&capi::kubeadm_config(&format!("{name}-kc"), "abcdef", "v1beta2"))
                .unwrap()
                .into(),
        );
    }
    inventory
}

criterion_group!(benches, bench);
criterion_main!(benches);
