//! `tpm/v1` per join, on swtpm: the node side (phase 1: EK, AK creation, quote, PCR read;
//! phase 2: ActivateCredential and a quote) and the signer side (the whole rule engine with the
//! `tpm/v1` verifier on CSR #1, including MakeCredential; on CSR #2, including the look-up of
//! CSR #1 and the secret's derivation). Skips without swtpm.
//!
//! `cargo bench -p tests --bench tpm_join`

#![allow(clippy::unwrap_used, missing_docs)]

use attestation::attestor::ChallengeAnswer;
use attestation::decision::Outcome;
use attestation::names::ANNOTATION_TPM_CHALLENGE;
use attestation::request::build_envelope;
use attestation::tpm::attestor::TpmAttestor;
use criterion::{Criterion, criterion_group, criterion_main};
use tests::swtpm::Swtpm;
use tests::tpm_world::{World, key, params};

fn bench(c: &mut Criterion) {
    let Some(tpm) = Swtpm::start_if_installed("tpm_join bench") else {
        return;
    };
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti).unwrap();
    let k = key();
    let first = world.challenged(&mut node, &k);
    let (second, decision) = world.phase_two(&mut node, &k, &first);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }));
    let mut unchallenged = first.clone();
    unchallenged.annotations.clear();

    c.bench_function(
        "tpm/v1 signer: decide CSR #1 (rules, EK chain, quote, MakeCredential)",
        |b| b.iter(|| world.decide(&unchallenged)),
    );
    c.bench_function(
        "tpm/v1 signer: decide CSR #2 (rules, CSR #1 checks, secret, quote)",
        |b| b.iter(|| world.decide(&second)),
    );

    let mut group = c.benchmark_group("tpm/v1 node on swtpm");
    group.sample_size(10);
    group.bench_function("phase 1: EK, new AK, quote, PCRs", |b| {
        b.iter(|| build_envelope(&params(), &k, &mut node, None).unwrap())
    });
    group.bench_function("phase 2: ActivateCredential, quote", |b| {
        b.iter_custom(|iterations| {
            let mut spent = std::time::Duration::ZERO;
            for _ in 0..iterations {
                let k = key();
                let first = world.challenged(&mut node, &k);
                let annotation = first.annotations[ANNOTATION_TPM_CHALLENGE].clone();
                let answer = ChallengeAnswer {
                    csr_name: &first.name,
                    csr_uid: &first.uid,
                    annotation: &annotation,
                };
                let start = std::time::Instant::now();
                build_envelope(&params(), &k, &mut node, Some(answer)).unwrap();
                spent += start.elapsed();
            }
            spent
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
