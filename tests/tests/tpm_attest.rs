//! `tpm/v1` end to end without a cluster: the node's [`TpmAttestor`] on a real TPM (swtpm,
//! provisioned with an EK certificate by `swtpm_setup --create-ek-cert` and `swtpm_localca`)
//! against the signer's rule engine and [`TpmVerifier`]. Both phases succeed, and every attack
//! the SPEC names ends in its reason. Skips loudly without swtpm.

#![allow(clippy::unwrap_used)]

use attestation::CsrObject;
use attestation::attestor::{AttestationRequest, Attestor, ChallengeAnswer};
use attestation::decision::{Decision, DenyReason, Outcome};
use attestation::envelope::{ProviderVersion, RequestEnvelope};
use attestation::names::{
    ANNOTATION_EK_PIN, ANNOTATION_SUPPORTED_VERSIONS, ANNOTATION_TPM_CHALLENGE, SIGNER_INSECURE, SIGNER_TPM,
};
use attestation::request::build_envelope;
use attestation::tpm::attestor::{AkAttributes, TpmAttestor};
use attestation::tpm::data::{ChallengeAnnotation, TpmData};
use attestation::tpm::public::TpmPublic;
use tests::capi;
use tests::swtpm::{Swtpm, localca_bundle};
use tests::tpm_world::{NODE, PID, World, key, params, spki};
use time::Duration;

#[track_caller]
fn denied(decision: &Decision, reason: DenyReason, case: &str) {
    match &decision.outcome {
        Outcome::Denied { reason: got, message } => {
            assert_eq!(*got, reason, "{case}: {message}");
            eprintln!("{case}: {reason}: {message}");
        }
        other => panic!("{case}: expected Denied {reason}, got {other:?}\n{decision:#?}"),
    }
}

/// The DATA block of a request, for tampering.
fn data_of(csr: &CsrObject) -> (RequestEnvelope, TpmData) {
    let envelope = RequestEnvelope::parse(&csr.request).unwrap();
    let data = TpmData::parse(envelope.data.as_deref().unwrap()).unwrap();
    (envelope, data)
}

fn with_data(mut envelope: RequestEnvelope, data: &TpmData) -> RequestEnvelope {
    envelope.data = Some(data.encode());
    envelope
}

fn ek_hash(csr: &CsrObject) -> String {
    let (_, data) = data_of(csr);
    TpmPublic::from_tpm2b(&data.ek_public)
        .unwrap()
        .spki_sha256_hex()
        .unwrap()
}

#[test]
#[ignore = "needs swtpm"]
fn a_real_tpm_joins_in_two_phases_and_every_attack_ends_in_its_reason() {
    let tpm = Swtpm::start("tpm_attest");
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti).unwrap();
    assert_eq!(node.challenge_annotation(), Some(ANNOTATION_TPM_CHALLENGE));

    // The join: CSR #1 is challenged, CSR #2 (same key) answers it, is approved, claims the
    // Machine with the EK, and supersedes CSR #1.
    let k = key();
    let first = world.challenged(&mut node, &k);
    let ek = ek_hash(&first);
    let (_, data) = data_of(&first);
    assert!(
        data.ek_certificate.is_some(),
        "swtpm_setup wrote an EK certificate to NV"
    );
    assert_eq!(
        data.pcrs["sha256"].keys().map(String::as_str).collect::<Vec<_>>(),
        ["0", "1", "11", "4", "7", "8", "9"],
        "PCRs 0, 1, 4, 7, 8, 9, 11 quoted (swtpm allocates SHA-256)"
    );
    let (second, decision) = world.phase_two(&mut node, &k, &first);
    // `TPM_FUZZ_SEEDS=<dir>` keeps these real DATA blocks as fuzz seeds.
    if let Some(dir) = std::env::var_os("TPM_FUZZ_SEEDS") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("swtpm-phase1.json"), data_of(&first).0.data.unwrap()).unwrap();
        std::fs::write(dir.join("swtpm-phase2.json"), data_of(&second).0.data.unwrap()).unwrap();
    }
    assert!(
        matches!(decision.outcome, Outcome::Approved { ref reason, .. } if reason == "AttestedTpmV1"),
        "{decision:#?}"
    );
    assert_eq!(
        decision.supersedes.as_ref().map(|s| s.uid.as_str()),
        Some(first.uid.as_str())
    );
    let claim = decision.claim.as_ref().expect("the join claims the Machine");
    assert_eq!(claim.record.ek_sha256.as_deref(), Some(ek.as_str()));
    assert_eq!(claim.record.csr_uid, second.uid);

    // CSR #1 seen again before CSR #2: still waiting, no second challenge written.
    let again = world.decide(&world.csrs[0].clone());
    assert!(
        matches!(again.outcome, Outcome::Retry { .. }) && again.annotations.is_empty(),
        "{again:#?}"
    );

    // Expired: CSR #2 after the challenge's 10 minutes, and CSR #1 itself.
    let saved = world.now;
    world.now = saved + Duration::minutes(11);
    denied(
        &world.phase_two(&mut node, &k, &first).1,
        DenyReason::ChallengeFailed,
        "expired challenge (CSR #2)",
    );
    denied(
        &world.decide(&first),
        DenyReason::ChallengeFailed,
        "expired challenge (CSR #1)",
    );
    world.now = saved;

    // Wrong secret: the signer's key changed between the phases (the node proves a secret the
    // signer no longer derives).
    let k = key();
    world.finish_all();
    let first = world.challenged(&mut node, &k);
    world.challenge_key = vec![8; 32];
    denied(
        &world.phase_two(&mut node, &k, &first).1,
        DenyReason::ChallengeFailed,
        "wrong secret in phase 2",
    );
    world.challenge_key = vec![7; 32];

    // A challenge annotation forged by the requester: a credential the TPM does open, for a
    // secret the requester chose, sealed under a key that is not the signer's. CSR #1 arriving
    // with it is denied at once, and a phase 2 naming it fails too.
    world.finish_all();
    let k = key();
    let envelope = build_envelope(&params(), &k, &mut node, None).unwrap();
    let mut forged = world.object(&envelope);
    let (_, data) = data_of(&forged);
    let ek_public = TpmPublic::from_tpm2b(&data.ek_public).unwrap();
    let ak_name = TpmPublic::from_tpm2b(&data.ak_public).unwrap().name();
    let credential = attestation::tpm::credential::make_credential(&ek_public, &ak_name, &[0x42; 32]).unwrap();
    let annotation = ChallengeAnnotation::sealed(
        &[0x66; 32],
        &forged.uid,
        world
            .now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap(),
        credential.credential_blob,
        credential.encrypted_secret,
    );
    forged.annotations.insert(
        ANNOTATION_TPM_CHALLENGE.into(),
        serde_json::to_string(&annotation).unwrap(),
    );
    denied(
        &world.decide(&forged),
        DenyReason::ChallengeFailed,
        "CSR #1 arriving with a forged challenge annotation",
    );
    world.csrs.push(forged.clone());
    denied(
        &world.phase_two(&mut node, &k, &forged).1,
        DenyReason::ChallengeFailed,
        "phase 2 answering a forged challenge",
    );

    // The signer's own challenge copied onto another CSR: its mac is bound to CSR #1's UID.
    world.finish_all();
    let k = key();
    let genuine = world.challenged(&mut node, &k);
    let mut copied = world.object(&RequestEnvelope::parse(&genuine.request).unwrap());
    copied.annotations = genuine.annotations.clone();
    denied(
        &world.decide(&copied),
        DenyReason::ChallengeFailed,
        "a genuine challenge copied onto another CSR",
    );

    // CSR #2 with another key than CSR #1 (the TPM answers for the new key).
    let k = key();
    world.finish_all();
    let first = world.challenged(&mut node, &k);
    denied(
        &world.phase_two(&mut node, &key(), &first).1,
        DenyReason::ChallengeFailed,
        "CSR #2 with another key",
    );

    // CSR #2 with another AK: a second attestation's AK named in a phase-2 DATA for CSR #1.
    let k = key();
    world.finish_all();
    let first = world.challenged(&mut node, &k);
    let mut other = TpmAttestor::new(&tpm.tcti).unwrap();
    let mut data: TpmData =
        serde_json::from_slice(&other.attest(&AttestationRequest::new(&spki(&k))).unwrap().unwrap()).unwrap();
    data.phase = 2;
    data.challenge = Some(attestation::tpm::data::ChallengeRef {
        csr_name: first.name.clone(),
        csr_uid: first.uid.clone(),
    });
    let (envelope, _) = data_of(&first);
    let csr = world.object(&with_data(envelope, &data));
    denied(
        &world.decide(&csr),
        DenyReason::ChallengeFailed,
        "CSR #2 with another AK",
    );

    // Phase-1 attacks.
    let k = key();
    let (good, _) = world.phase_one(&mut node, &k);
    let (envelope, data) = data_of(&good);

    // CSR #1's DATA replayed with a new key.
    let replay = build_envelope(&params(), &key(), &mut attestation::insecure::InsecureAttestor, None).unwrap();
    let replay = RequestEnvelope {
        provider: Some(ProviderVersion::new("tpm", "v1")),
        data: envelope.data.clone(),
        ..replay
    };
    let csr = world.object(&replay);
    denied(
        &world.decide(&csr),
        DenyReason::AttestationInvalid,
        "CSR #1 data replayed with a new key",
    );

    // A quote bound to another key: the TPM quoted key A, the CSR carries key B.
    let quoted_for_a = node.attest(&AttestationRequest::new(&spki(&key()))).unwrap();
    let b = build_envelope(&params(), &key(), &mut attestation::insecure::InsecureAttestor, None).unwrap();
    let csr = world.object(&RequestEnvelope {
        provider: Some(ProviderVersion::new("tpm", "v1")),
        data: quoted_for_a,
        ..b
    });
    denied(
        &world.decide(&csr),
        DenyReason::AttestationInvalid,
        "quote bound to another key",
    );

    // Tampered PCR values.
    let mut tampered = data.clone();
    if let Some(pcr0) = tampered.pcrs.get_mut("sha256").and_then(|b| b.get_mut("0")) {
        *pcr0 = "ff".repeat(32);
    }
    let csr = world.object(&with_data(envelope.clone(), &tampered));
    denied(
        &world.decide(&csr),
        DenyReason::AttestationInvalid,
        "tampered PCR values",
    );

    // The signature checked under another AK.
    let mut swapped = data.clone();
    let other_data: TpmData =
        serde_json::from_slice(&other.attest(&AttestationRequest::new(&spki(&k))).unwrap().unwrap()).unwrap();
    swapped.ak_public = other_data.ak_public;
    let csr = world.object(&with_data(envelope.clone(), &swapped));
    denied(
        &world.decide(&csr),
        DenyReason::AttestationInvalid,
        "signature by another AK",
    );

    // An AK the TPM made without fixedTPM.
    let mut loose = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_ak_attributes(AkAttributes(|b| b.with_fixed_tpm(false).with_fixed_parent(false)));
    denied(
        &world.phase_one(&mut loose, &key()).1,
        DenyReason::AttestationInvalid,
        "AK without fixedTPM",
    );

    // Unknown version.
    let csr = world.object(&RequestEnvelope {
        provider: Some(ProviderVersion::new("tpm", "v9")),
        ..envelope.clone()
    });
    let decision = world.decide(&csr);
    denied(&decision, DenyReason::UnsupportedAttestationVersion, "unknown version");
    assert_eq!(decision.annotations[ANNOTATION_SUPPORTED_VERSIONS], "tpm/v1");

    // EK trust.
    let untrusted_ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap()
        .pem();
    world.bundle = untrusted_ca.into_bytes();
    denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::EndorsementKeyUntrusted,
        "EK certificate from an untrusted CA",
    );
    // The pin is trusted without a chain; trust on first use trusts an unclaimed Machine.
    capi::annotate(&mut world.machines[0], ANNOTATION_EK_PIN, &ek);
    let (_, pinned) = world.phase_one(&mut node, &key());
    assert!(
        matches!(pinned.outcome, Outcome::Retry { .. }),
        "pinned EK: {pinned:#?}"
    );
    capi::annotate(&mut world.machines[0], ANNOTATION_EK_PIN, &"ab".repeat(32));
    denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::EndorsementKeyMismatch,
        "EK pin mismatch",
    );
    world.machines[0] = capi::machine(NODE, Some(PID));
    world.trust_on_first_use = true;
    let (_, tofu) = world.phase_one(&mut node, &key());
    assert!(
        matches!(tofu.outcome, Outcome::Retry { .. }),
        "trust on first use: {tofu:#?}"
    );
    world.trust_on_first_use = false;
    world.bundle = localca_bundle();

    // One EK serves one Machine: pinned to worker-1, it cannot join worker-0.
    capi::annotate(&mut world.machines[1], ANNOTATION_EK_PIN, &ek);
    denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::EndorsementKeyMismatch,
        "EK pinned to another Machine",
    );
    world.machines[1] = capi::machine("worker-1", Some("aws:///us-east-1a/i-0def"));

    // Re-bootstrap of a claimed Machine: another EK is refused; the claimed EK, after losing
    // its disk (a new key, a new join), re-joins through both phases.
    world.claim_with_ek(&"cd".repeat(32));
    denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::MachineAlreadyClaimed,
        "re-bootstrap with another EK",
    );
    world.claim_with_ek(&ek);
    let k = key();
    world.finish_all();
    let first = world.challenged(&mut node, &k);
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    assert!(
        matches!(decision.outcome, Outcome::Approved { .. }),
        "re-bootstrap with the claimed EK: {decision:#?}"
    );

    // Renewal by the node re-attests through both phases too.
    world.finish_all();
    let k = key();
    let envelope = build_envelope(&params(), &k, &mut node, None).unwrap();
    let mut renewal = world.object(&envelope);
    renewal.username = format!("system:node:{NODE}");
    renewal.groups = vec!["system:nodes".into()];
    let decision = world.decide(&renewal);
    assert!(
        matches!(decision.outcome, Outcome::Retry { .. }),
        "renewal phase 1: {decision:#?}"
    );
    renewal.annotations = decision.annotations;
    world.csrs.push(renewal.clone());
    let annotation = renewal.annotations[ANNOTATION_TPM_CHALLENGE].clone();
    let answer = ChallengeAnswer {
        csr_name: &renewal.name,
        csr_uid: &renewal.uid,
        annotation: &annotation,
    };
    let envelope = build_envelope(&params(), &k, &mut node, Some(answer)).unwrap();
    let mut second = world.object(&envelope);
    second.username = renewal.username.clone();
    second.groups = renewal.groups.clone();
    let decision = world.decide(&second);
    assert!(
        matches!(decision.outcome, Outcome::Approved { .. }),
        "renewal phase 2: {decision:#?}"
    );
    assert!(decision.claim.is_none(), "a renewal keeps the claim");

    // Nobody but the signer can use up a node's challenges: pending CSRs for worker-0's
    // provider ID carrying a copied genuine challenge, a forged one, or a genuine one under
    // another signer name do not count.
    world.finish_all();
    world.machines[0] = capi::machine(NODE, Some(PID));
    let genuine = world.challenged(&mut node, &key());
    let request = RequestEnvelope::parse(&genuine.request).unwrap();
    let mut squatters = Vec::new();
    for signer in [SIGNER_TPM, SIGNER_TPM, SIGNER_INSECURE, "example.com/any-signer"] {
        let mut squatter = world.object(&request);
        squatter.signer_name = signer.into();
        squatter.annotations = genuine.annotations.clone();
        squatters.push(squatter);
    }
    let forged_uid = squatters[1].uid.clone();
    squatters[1].annotations.insert(
        ANNOTATION_TPM_CHALLENGE.into(),
        serde_json::to_string(&ChallengeAnnotation::sealed(
            &[0x66; 32],
            &forged_uid,
            world
                .now
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
            vec![1],
            vec![2],
        ))
        .unwrap(),
    );
    // The genuine CSR itself is answered (finished); only the squatters stay pending.
    world.finish_all();
    world.csrs.extend(squatters);
    for _ in 0..3 {
        world.challenged(&mut node, &key());
    }

    // At most three live challenges per provider ID: a fourth CSR #1 waits, unchallenged,
    // until one is answered or expires.
    let (_, waiting) = world.phase_one(&mut node, &key());
    assert!(
        matches!(waiting.outcome, Outcome::Retry { ref message } if message.contains("already pending"))
            && waiting.annotations.is_empty(),
        "{waiting:#?}"
    );
    world.now += Duration::minutes(11);
    let (_, later) = world.phase_one(&mut node, &key());
    assert!(
        later.annotations.contains_key(ANNOTATION_TPM_CHALLENGE),
        "expired challenges free the slots"
    );
}

#[test]
#[ignore = "needs swtpm"]
fn an_ecc_ek_joins_through_ecdh_secret_sharing() {
    let tpm = Swtpm::start("tpm_attest (ECC EK)");
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_ek_algorithm(attestation::tpm::attestor::EkAlgorithm::EccP256);
    let k = key();
    let (probe, _) = world.phase_one(&mut node, &k);
    let (_, data) = data_of(&probe);
    assert_eq!(&data.ek_public[2..4], &[0x00, 0x23], "an ECC EK (TPM_ALG_ECC)");
    if data.ek_certificate.is_none() {
        // swtpm_setup certifies the ECC EK only in some versions: the pin trusts it then.
        capi::annotate(&mut world.machines[0], ANNOTATION_EK_PIN, &ek_hash(&probe));
    }
    world.finish_all();
    let first = world.challenged(&mut node, &k);
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    assert!(
        matches!(decision.outcome, Outcome::Approved { .. }),
        "the TPM activated the ECDH credential: {decision:#?}"
    );
}

#[test]
#[ignore = "needs swtpm"]
fn without_the_challenge_key_explain_checks_all_else_and_leaves_the_answer_to_the_signer() {
    let tpm = Swtpm::start("tpm_attest_withheld");
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti).unwrap();
    let k = key();
    let note = |decision: &Decision| format!("{:?}", decision.rules.last().unwrap().verdict);

    // CSR #1 not yet challenged: it would be, and nothing is written.
    let (fresh, _) = world.phase_one(&mut node, &k);
    let decision = world.decide_with(&fresh, world.verifier_without_key());
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:#?}");
    assert!(
        decision.annotations.is_empty(),
        "explain writes no challenge: {decision:#?}"
    );
    assert!(
        note(&decision).contains("no challenge on it yet"),
        "{}",
        note(&decision)
    );

    // Challenged by the signer: waiting for CSR #2, the mac left to the signer.
    let first = world.challenged(&mut node, &k);
    let decision = world.decide_with(&first, world.verifier_without_key());
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:#?}");
    assert!(decision.annotations.is_empty());
    assert!(
        note(&decision).contains("waiting for CSR #2 until"),
        "{}",
        note(&decision)
    );
    assert!(
        note(&decision).contains("explain holds no challenge key"),
        "{}",
        note(&decision)
    );

    // An expired challenge is refused without the key, as with it.
    let mut later = World::new();
    later.csrs = world.csrs.clone();
    later.now = world.now + Duration::minutes(11);
    denied(
        &later.decide_with(&first, later.verifier_without_key()),
        DenyReason::ChallengeFailed,
        "expired challenge, key withheld",
    );

    // CSR #2: everything but the answer is checked; the answer is the signer's.
    let (second, with_key) = world.phase_two(&mut node, &k, &first);
    assert!(matches!(with_key.outcome, Outcome::Approved { .. }), "{with_key:#?}");
    let decision = world.decide_with(&second, world.verifier_without_key());
    match &decision.outcome {
        Outcome::Retry { message } => assert!(message.contains("only the signer"), "{message}"),
        other => panic!("CSR #2 without the key: {other:?}"),
    }
    assert!(decision.claim.is_none() && decision.issuance.is_none());

    // A CSR #2 for another key is refused without the key too (it is not CSR #1 again).
    let (other_key_second, _) = world.phase_two(&mut node, &key(), &first);
    assert!(matches!(
        world
            .decide_with(&other_key_second, world.verifier_without_key())
            .outcome,
        Outcome::Denied { .. }
    ));
}

#[test]
#[ignore = "needs swtpm"]
fn a_rotated_challenge_key_keeps_pending_challenges_and_an_unknown_one_is_read_again_before_it_is_refused() {
    use attestation::cloud::CloudCall;
    use attestation::tpm::challenge_key::ChallengeKey;
    let tpm = Swtpm::start("tpm_attest_rotation");
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti).unwrap();
    let (old, new) = (vec![1u8; 32], vec![2u8; 32]);
    let now = world.now;
    let read = |key: &[u8], seconds: i64| {
        let slot = ChallengeKey::default();
        slot.follow(key.to_vec(), now + Duration::seconds(seconds)).unwrap();
        slot
    };
    // Held for a minute, read again after the CSR was first seen: nothing left to learn.
    let settled = |key: &[u8]| {
        let slot = read(key, -60);
        slot.follow(key.to_vec(), now + Duration::seconds(1)).unwrap();
        slot
    };

    // Replica A challenges CSR #1 under the old key; then the Secret is replaced and A reads it.
    let a = read(&old, -60);
    world.key_slot = Some(a.clone());
    let k = key();
    let first = world.challenged(&mut node, &k);
    a.follow(new.clone(), world.now - Duration::seconds(30)).unwrap();
    // A still verifies the answer: the challenge was issued before the rotation.
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:#?}");

    // Replica B, started after the rotation, never held the old key: it learns it from the
    // Secret's record of the replaced key, and verifies the same answer.
    let b = read(&new, -10);
    b.remember(old.clone(), world.now - Duration::seconds(30)).unwrap();
    world.key_slot = Some(b);
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:#?}");

    // Replica C still holds only the old key, read before the CSR was seen, and meets a challenge
    // of the new key: not a forgery yet, it asks for the key to be read again.
    world.finish_all();
    world.key_slot = Some(read(&new, -5));
    let k2 = key();
    let second_first = world.challenged(&mut node, &k2);
    let c = read(&old, -60);
    world.key_slot = Some(c.clone());
    let (_, decision) = world.phase_two(&mut node, &k2, &second_first);
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:#?}");
    assert_eq!(decision.cloud_calls, [CloudCall::ReloadChallengeKey]);
    // Read again, C verifies it.
    c.follow(new.clone(), world.now + Duration::seconds(1)).unwrap();
    // (A key that just changed also holds an unknown challenge back, for the replaced key to be
    // recorded: shown in the unit tests of attestation::tpm::challenge_key.)
    let (_, decision) = world.phase_two(&mut node, &k2, &second_first);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:#?}");

    // A challenge no key verifies, with the key read after the CSR was seen: a forgery, refused.
    world.key_slot = Some(settled(&[3u8; 32]));
    let (_, decision) = world.phase_two(&mut node, &k2, &second_first);
    denied(
        &decision,
        DenyReason::ChallengeFailed,
        "a challenge of a key the Secret never held",
    );
    // And an old key cannot vouch for a challenge issued after it was replaced.
    let late = settled(&new);
    late.remember(old.clone(), world.now - Duration::seconds(200)).unwrap();
    world.key_slot = Some(read(&old, -300));
    world.finish_all();
    let k3 = key();
    let forged_late = world.challenged(&mut node, &k3);
    world.key_slot = Some(late);
    let (_, decision) = world.phase_two(&mut node, &k3, &forged_late);
    denied(
        &decision,
        DenyReason::ChallengeFailed,
        "an old key's challenge issued after its replacement",
    );
}

#[test]
#[ignore = "needs swtpm"]
fn the_event_log_goes_with_phase_one_only_and_a_named_log_must_be_read() {
    use attestation::tpm::attestor::{EventLogSource, MAX_EVENT_LOG};
    let tpm = Swtpm::start("tpm_attest_event_log");
    let mut world = World::new();
    let log = tpm.path("binary_bios_measurements");
    std::fs::write(&log, b"a log's bytes, sent as they are").unwrap();
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::File(log.clone()));
    let k = key();
    let first = world.challenged(&mut node, &k);
    let (_, one) = data_of(&first);
    assert_eq!(one.event_log.as_deref(), Some(&b"a log's bytes, sent as they are"[..]));
    let (second, decision) = world.phase_two(&mut node, &k, &first);
    let (_, two) = data_of(&second);
    assert_eq!(two.event_log, None, "phase 2 sends no log");
    assert!(
        matches!(decision.outcome, Outcome::Approved { .. }),
        "without a policy a log changes nothing: {decision:#?}"
    );

    // A named log that cannot be sent stops phase 1, naming the file; no TPM work is done.
    let request = AttestationRequest::new(&[1, 2, 3]);
    let mut absent = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::File(tpm.path("absent")));
    let error = absent.attest(&request).unwrap_err().to_string();
    assert!(error.contains(&tpm.path("absent").display().to_string()), "{error}");
    std::fs::write(&log, vec![0u8; MAX_EVENT_LOG + 1]).unwrap();
    let error = node.attest(&request).unwrap_err().to_string();
    assert!(error.contains(&format!("{} bytes", MAX_EVENT_LOG + 1)), "{error}");
    // None: nothing sent.
    let mut quiet = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::None);
    let (none, _) = world.phase_one(&mut quiet, &key());
    assert_eq!(data_of(&none).1.event_log, None);
}

#[test]
#[ignore = "needs swtpm"]
fn a_tpm_without_a_sha256_bank_quotes_sha1() {
    let tpm = Swtpm::start_with_banks("tpm_attest_sha1", &["sha1"]);
    assert_eq!(tpm.allocated_banks(), ["sha1"]);
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(attestation::tpm::attestor::EventLogSource::None);
    let k = key();
    let first = world.challenged(&mut node, &k);
    let (_, data) = data_of(&first);
    let quote = attestation::tpm::quote::Quote::from_tpm2b(&data.quote).unwrap();
    let banks: Vec<(u16, Vec<u32>)> = quote.selection.iter().map(|s| (s.hash, s.pcrs.clone())).collect();
    assert_eq!(
        banks,
        [(0x0004, vec![0, 1, 4, 7, 8, 9, 11])],
        "SHA-1 PCRs 0, 1, 4, 7, 8, 9, 11"
    );
    assert!(data.pcrs.is_empty(), "DATA's pcrs names sha256 only: none sent");
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    assert!(
        matches!(decision.outcome, Outcome::Approved { .. }),
        "without a policy any bank is accepted: {decision:#?}"
    );
}
