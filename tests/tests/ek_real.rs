//! Real EK certificates, as vendors' TPMs and Google's vTPMs carry them, against the vendors'
//! EK CA bundle the project ships (`config/components/tpm-ek-ca-bundle`): each chains, with
//! the signer's own chain check (`EkTrust`), including an ST33 NV dump with its padding, a
//! Nuvoton EK whose issuer is an unsorted multi-valued RDN (not DER), and an Infineon EK with
//! an `id-RSAES-OAEP` key under the legacy (SHA-1, cross-signed) Infineon chain. The swtpm
//! part shows phase 1 of `tpm/v1` with such an EK ends in a challenge, not a denial.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use attestation::tpm::ek::EkTrust;
use attestation::tpm::public::TpmPublic;
use tests::real_ek::{ek_public_of, real_ek, shipped_bundle};

/// (file, vendor, chain as published)
const CHAINING: [(&str, &str); 11] = [
    ("google-3.der", "Google Cloud EK/AK CA (ECC)"),
    ("google-4.der", "Google Cloud EK/AK CA (RSA)"),
    ("google-5.der", "Google tpm_ek_v1_cloud_host 2021 signer (ECC)"),
    ("google-6.der", "Google tpm_ek_v1_cloud_host 2021 signer (RSA)"),
    ("google-7.der", "Google Cloud EK/AK CA, RSA-4096 intermediate"),
    (
        "infineon-1.der",
        "IFX TPM EK Intermediate CA 20 -> IFX TPM EK Root CA (legacy, SHA-1, RSAES-OAEP key)",
    ),
    (
        "infineon-2.der",
        "Infineon OPTIGA RSA Manufacturing CA 035 -> OPTIGA RSA Root CA",
    ),
    (
        "infineon-3.der",
        "Infineon OPTIGA ECC Manufacturing CA 035 -> OPTIGA ECC Root CA",
    ),
    ("nuvoton-1.der", "Nuvoton TPM Root CA 2111 (unsorted multi-valued RDN)"),
    (
        "stmicro-1.der",
        "STM TPM EK Intermediate CA 05 -> STM TPM EK Root CA -> GlobalSign TPM Root CA",
    ),
    (
        "stmicro-2.der",
        "STM TPM ECC Intermediate CA 01 -> STM TPM ECC Root CA 01 -> GlobalSign TPM ECC Root CA",
    ),
];

fn trust() -> EkTrust {
    EkTrust::from_pem(&shipped_bundle()).unwrap()
}

#[test]
fn the_shipped_bundle_loads_every_certificate() {
    let trust = trust();
    let blocks = pem::parse_many(shipped_bundle()).unwrap();
    assert_eq!(trust.len(), blocks.len());
    assert!(trust.len() >= 400, "{}", trust.len());
}

#[test]
fn every_real_ek_certificate_chains_to_the_shipped_bundle() {
    let trust = trust();
    let mut failures = Vec::new();
    for (file, chain) in CHAINING {
        let cert = real_ek(file);
        let ek = TpmPublic::from_tpm2b(&ek_public_of(&cert)).unwrap();
        if let Err(why) = trust.verify(&ek, &cert, &[]) {
            failures.push(format!("{file} ({chain}): {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn an_st33_nv_dump_with_its_padding_chains_as_read_from_the_tpm() {
    let nv = real_ek("stmicro-1.nv.bin");
    let cert = real_ek("stmicro-1.der");
    assert!(nv.len() > cert.len() && nv.starts_with(&cert));
    assert!(nv[cert.len()..].iter().all(|b| *b == 0xFF));
    let ek = TpmPublic::from_tpm2b(&ek_public_of(&cert)).unwrap();
    assert_eq!(trust().verify(&ek, &nv, &[]), Ok(()));
}

#[test]
fn a_real_ek_certificate_for_another_key_or_an_unknown_issuer_is_refused() {
    let trust = trust();
    let ek_of_another = TpmPublic::from_tpm2b(&ek_public_of(&real_ek("infineon-2.der"))).unwrap();
    let why = trust
        .verify(&ek_of_another, &real_ek("stmicro-1.der"), &[])
        .unwrap_err();
    assert!(why.contains("another key"), "{why}");
    // Issued by Google's 2018 signer, which is not in the bundle.
    let cert = real_ek("google-1.der");
    let ek = TpmPublic::from_tpm2b(&ek_public_of(&cert)).unwrap();
    let why = trust.verify(&ek, &cert, &[]).unwrap_err();
    assert!(why.contains("does not chain"), "{why}");
}

#[test]
fn the_unsorted_rdn_is_read_as_sent_and_still_chains() {
    // The issuer's SET is not in DER order: a strict DER parser (Python cryptography) refuses
    // the certificate; the chain still holds because the signature covers the bytes as sent.
    let cert = real_ek("nuvoton-1.der");
    let ek = TpmPublic::from_tpm2b(&ek_public_of(&cert)).unwrap();
    assert_eq!(trust().verify(&ek, &cert, &[]), Ok(()));
    let mut flipped = cert.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert!(trust().verify(&ek, &flipped, &[]).is_err());
}

/// Phase 1 of `tpm/v1` as a node with a real vendor's EK would file it: swtpm makes the AK and
/// the quote (the signer cannot tell an AK's TPM before the challenge, which is what the
/// challenge is for), and the DATA block presents a real EK and its certificate. With the
/// shipped bundle the signer trusts the EK and answers with a credential for it: challenged,
/// not denied. (Only that TPM could open the credential, so phase 2 is not run.)
#[test]
#[ignore = "needs swtpm"]
fn phase_one_with_a_real_ek_is_challenged_not_denied() {
    use attestation::decision::Outcome;
    use attestation::envelope::RequestEnvelope;
    use attestation::names::ANNOTATION_TPM_CHALLENGE;
    use attestation::request::build_envelope;
    use attestation::tpm::attestor::TpmAttestor;
    use attestation::tpm::data::TpmData;
    use tests::swtpm::Swtpm;
    use tests::tpm_world::{World, key, params};

    let tpm = Swtpm::start("ek_real (phase 1 with real EKs)");
    let mut node = TpmAttestor::new(&tpm.tcti).unwrap();
    for (file, chain) in CHAINING {
        let mut world = World::new();
        world.bundle = shipped_bundle();
        let k = key();
        let envelope = build_envelope(&params(), &k, &mut node, None).unwrap();
        let mut data = TpmData::parse(envelope.data.as_deref().unwrap()).unwrap();
        let cert = if file == "stmicro-1.der" {
            real_ek("stmicro-1.nv.bin")
        } else {
            real_ek(file)
        };
        data.ek_public = ek_public_of(&real_ek(file));
        data.ek_certificate = Some(cert);
        data.ek_intermediates = Vec::new();
        let envelope = RequestEnvelope {
            data: Some(data.encode()),
            ..envelope
        };
        let csr = world.object(&envelope);
        let decision = world.decide(&csr);
        assert!(
            matches!(decision.outcome, Outcome::Retry { .. })
                && decision.annotations.contains_key(ANNOTATION_TPM_CHALLENGE),
            "{file} ({chain}): {decision:#?}"
        );
    }
}
