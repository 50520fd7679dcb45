//! Signer-side cost of the `tpm/v1` pieces built so far, on structures swtpm produced: parsing
//! the EK and AK public areas, checking the AK, parsing and verifying an RSA quote, the EK
//! certificate chain, and MakeCredential for an RSA-2048 EK.
//!
//! `cargo bench -p tests --bench tpm_verify`; criterion runs on one thread.

#![allow(clippy::unwrap_used, missing_docs)]

use attestation::tpm::credential::make_credential;
use attestation::tpm::ek::EkTrust;
use attestation::tpm::public::TpmPublic;
use attestation::tpm::quote::{Quote, Signature};
use criterion::{Criterion, criterion_group, criterion_main};

fn vector(name: &str) -> Vec<u8> {
    std::fs::read(tests::repo_root().join("attestation/testdata/tpm").join(name)).unwrap()
}

fn bench(c: &mut Criterion) {
    let (ek_pub, ak_pub, msg, sig) = (
        vector("ek.pub"),
        vector("ak.pub"),
        vector("quote.msg"),
        vector("quote.sig"),
    );
    let (ek_cert, intermediate) = (
        vector("ekcert.der"),
        pem::parse(vector("ek-intermediate.pem")).unwrap().into_contents(),
    );
    let trust = EkTrust::from_pem(&vector("ek-root.pem")).unwrap();
    let ek = TpmPublic::from_tpm2b(&ek_pub).unwrap();
    let ak = TpmPublic::from_tpm2b(&ak_pub).unwrap();

    c.bench_function("tpm: parse EK + AK public areas, AK checks, Name", |b| {
        b.iter(|| {
            let ek = TpmPublic::from_tpm2b(&ek_pub).unwrap();
            let ak = TpmPublic::from_tpm2b(&ak_pub).unwrap();
            ak.check_attestation_key().unwrap();
            (ek.spki_sha256_hex().unwrap(), ak.name())
        })
    });
    c.bench_function("tpm: parse + verify an RSA-2048 quote", |b| {
        b.iter(|| {
            let quote = Quote::from_attest(&msg).unwrap();
            Signature::parse(&sig).unwrap().verify(&ak, &quote.signed).unwrap();
        })
    });
    c.bench_function("tpm: EK certificate chain (leaf + intermediate + root)", |b| {
        b.iter(|| {
            trust
                .verify(&ek, &ek_cert, std::slice::from_ref(&intermediate))
                .unwrap()
        })
    });
    c.bench_function("tpm: MakeCredential (RSA-2048 EK)", |b| {
        b.iter(|| make_credential(&ek, &ak.name(), b"0123456789abcdef0123456789abcdef").unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
