//! `azure/v1` through the rule engine, both phases, with real cryptography: the node's attestor
//! builds the CSRs and answers the challenge with a document a synthetic Microsoft PKI signs as
//! Azure lays it out (the signer trusts that PKI's root in place of Microsoft's), and ARM is a
//! table. Each case bends one thing an attacker or the cloud controls: the rule table of
//! `docs/decisions.md`'s `azure/v1` section.

#![allow(clippy::unwrap_used)]

use attestation::azure::VmAnswer;
use attestation::azure::attestor::AzureImds;
use attestation::decision::{DenyReason, Outcome};
use attestation::names::{ANNOTATION_AZURE_CHALLENGE, ANNOTATION_AZURE_SUBSCRIPTIONS, ANNOTATION_CLAIM};
use attestation::tpm::challenge_key::ChallengeKey;
use serde_json::json;
use tests::azure::{AzurePki, NODE, SUBSCRIPTION, VM_ID, World, key, provider_id, statement};
use tests::capi;
use time::Duration;

fn denied(outcome: &Outcome) -> (DenyReason, String) {
    match outcome {
        Outcome::Denied { reason, message } => (*reason, message.clone()),
        other => panic!("not denied: {other:?}"),
    }
}

#[test]
fn a_vm_joins_through_both_phases_and_its_claim_names_its_vm_id() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let imds = world.imds();
    let asked = imds.asked.clone();
    let (_, decision) = world.answer(&key, &first, imds);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:#?}");
    let challenge: serde_json::Value = serde_json::from_str(&first.annotations[ANNOTATION_AZURE_CHALLENGE]).unwrap();
    assert_eq!(asked.lock().unwrap().as_slice(), [challenge["nonce"].as_str().unwrap()]);
    let claim = decision.claim.as_ref().expect("a claim");
    assert_eq!(
        claim.record.instance.as_deref(),
        Some(format!("azure:{SUBSCRIPTION}/{VM_ID}").as_str())
    );
    assert_eq!(
        decision.supersedes.as_ref().map(|s| s.uid.as_str()),
        Some(first.uid.as_str())
    );
}

#[test]
fn a_scale_set_instance_joins_too() {
    let mut world = World::new();
    let pid = format!(
        "azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/capz-rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool-0/virtualMachines/3"
    );
    world.machines[0] = capi::machine(NODE, Some(&pid));
    world.arm.set(&pid, VmAnswer::Found { vm_id: VM_ID.into() });
    let key = key();
    let first = world.challenged_for(&key, &pid);
    let (_, decision) = world.answer_for(&key, &first, world.imds(), &pid);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:#?}");
}

#[test]
fn an_arm_answer_older_than_the_csr_is_asked_again_before_a_refusal() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    // ARM said, before this CSR, that the name was another VM's (or none): asked again.
    for stale in [
        VmAnswer::Found {
            vm_id: "11111111-2222-3333-4444-555555555555".into(),
        },
        VmAnswer::Missing,
    ] {
        world
            .arm
            .set_at(&provider_id(NODE), stale, Some(world.now - Duration::minutes(5)));
        let (_, decision) = world.answer(&key, &first, world.imds());
        assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:#?}");
        assert!(
            matches!(
                decision.cloud_calls.as_slice(),
                [attestation::cloud::CloudCall::AzureVm(_)]
            ),
            "{decision:#?}"
        );
    }
    // ARM's answer of now says the VM is this one: issued.
    world.arm.set_at(
        &provider_id(NODE),
        VmAnswer::Found { vm_id: VM_ID.into() },
        Some(world.now),
    );
    let (_, issued) = world.answer(&key, &first, world.imds());
    assert!(matches!(issued.outcome, Outcome::Approved { .. }), "{issued:#?}");
}

#[test]
fn a_document_of_another_vm_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let mut imds = world.imds();
    imds.vm_id = "11111111-2222-3333-4444-555555555555".into();
    let (_, decision) = world.answer(&key, &first, imds);
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("another VM's"), "{message}");
}

#[test]
fn a_stale_document_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let mut imds = world.imds();
    imds.created = world.now - Duration::hours(7);
    let (_, decision) = world.answer(&key, &first, imds);
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("expired"), "{message}");
}

#[test]
fn a_document_fetched_with_another_nonce_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let mut imds = world.imds();
    imds.nonce_override = Some("A".repeat(32));
    let (_, decision) = world.answer(&key, &first, imds);
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::ChallengeFailed);
    assert!(message.contains("nonce"), "{message}");
}

#[test]
fn a_replayed_challenge_answers_once() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let (_, decision) = world.answer(&key, &first, world.imds());
    assert!(matches!(decision.outcome, Outcome::Approved { .. }));
    // The signer denies CSR #1 Superseded once CSR #2 is signed: it is finished.
    world.csrs.iter_mut().for_each(|c| c.finished = true);
    let (_, again) = world.answer(&key, &first, world.imds());
    let (reason, message) = denied(&again.outcome);
    assert_eq!(reason, DenyReason::ChallengeFailed);
    assert!(message.contains("already finished"), "{message}");
}

#[test]
fn a_challenge_for_another_key_is_refused() {
    let mut world = World::new();
    let first = world.challenged(&key());
    let (_, decision) = world.answer(&key(), &first, world.imds());
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::ChallengeFailed);
    assert!(message.contains("key differs"), "{message}");
}

#[test]
fn a_challenge_the_requester_wrote_itself_is_refused() {
    let mut world = World::new();
    let key = key();
    let mut first = world.challenged(&key);
    // The requester replaces the signer's challenge with one under a key of its own choosing.
    let forged = attestation::azure::challenge::AzureChallenge::issue(
        &[9; 32],
        &first.uid,
        world
            .now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap(),
        &[0; 32],
    );
    first.annotations.insert(
        ANNOTATION_AZURE_CHALLENGE.into(),
        serde_json::to_string(&forged).unwrap(),
    );
    world.csrs = vec![first.clone()];
    let (_, decision) = world.answer(&key, &first, world.imds());
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::ChallengeFailed);
    assert!(message.contains("did not write it"), "{message}");
}

#[test]
fn a_document_signed_by_another_pki_or_for_another_domain_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let mut imds = world.imds();
    imds.pki = std::sync::Arc::new(AzurePki::new(&["eastus.metadata.azure.com"]));
    let (_, decision) = world.answer(&key, &first, imds);
    let (_, message) = denied(&decision.outcome);
    assert!(message.contains("does not chain"), "{message}");

    let mut world = World::new();
    world.pki = std::sync::Arc::new(AzurePki::new(&["metadata.azure.com.evil.example", "evil.example"]));
    let key = tests::azure::key();
    let first = world.challenged(&key);
    let (_, decision) = world.answer(&key, &first, world.imds());
    let (_, message) = denied(&decision.outcome);
    assert!(message.contains("metadata domains"), "{message}");
}

/// SPEC section 5 (revision 5): a leaf's names come from its SAN alone. A leaf with no SAN whose
/// CN is a metadata domain names no host (Go, rustls-webpki and the CA/Browser Forum ignore the
/// CN), so its document is refused.
#[test]
fn a_leaf_naming_the_metadata_domain_only_in_its_cn_is_refused() {
    let mut world = World::new();
    world.pki = std::sync::Arc::new(AzurePki::new(&[]));
    let key = tests::azure::key();
    let first = world.challenged(&key);
    let (_, decision) = world.answer(&key, &first, world.imds());
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid, "{message}");
    assert!(
        message.contains("names [] in its SAN (its CN is not read)"),
        "{message}"
    );
    assert!(decision.claim.is_none());
}

#[test]
fn a_document_of_another_subscription_or_one_the_cluster_does_not_allow_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let mut imds = world.imds();
    imds.subscription = "99999999-2222-3333-4444-555555555555".into();
    let (_, decision) = world.answer(&key, &first, imds);
    let (reason, message) = denied(&decision.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("subscription"), "{message}");

    let mut world = World::new();
    capi::annotate(
        &mut world.cluster,
        ANNOTATION_AZURE_SUBSCRIPTIONS,
        "00000000-0000-0000-0000-000000000000",
    );
    let key = tests::azure::key();
    let envelope = attestation::request::build_envelope(
        &tests::azure::params(&provider_id(NODE)),
        &key,
        &mut attestation::azure::AzureAttestor::new(world.imds()),
        None,
    )
    .unwrap();
    let csr = world.object(&envelope);
    let (reason, _) = denied(&world.decide(&csr).outcome);
    assert_eq!(reason, DenyReason::AttestationNotAllowed, "phase 1 already");
}

#[test]
fn arm_unreachable_waits_then_issues_and_a_vm_arm_does_not_know_is_refused() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    world.arm.set(&provider_id(NODE), VmAnswer::NotAsked);
    let (_, asks) = world.answer(&key, &first, world.imds());
    assert!(matches!(asks.outcome, Outcome::Retry { .. }), "{asks:#?}");
    assert!(
        matches!(asks.cloud_calls.as_slice(), [attestation::cloud::CloudCall::AzureVm(_)]),
        "{asks:#?}"
    );
    world
        .arm
        .set(&provider_id(NODE), VmAnswer::Unavailable("connection refused".into()));
    let (_, waits) = world.answer(&key, &first, world.imds());
    assert!(matches!(waits.outcome, Outcome::Retry { .. }), "transient: {waits:#?}");
    world
        .arm
        .set(&provider_id(NODE), VmAnswer::Found { vm_id: VM_ID.into() });
    let (_, issued) = world.answer(&key, &first, world.imds());
    assert!(matches!(issued.outcome, Outcome::Approved { .. }), "{issued:#?}");
    world.arm.set(&provider_id(NODE), VmAnswer::Missing);
    let (_, missing) = world.answer(&key, &first, world.imds());
    let (reason, message) = denied(&missing.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("does not exist"), "{message}");
}

#[test]
fn a_claimed_vm_renews_through_both_phases_only_as_its_own_instance() {
    let claim = |instance_vm: &str| {
        json!({"nodeName": NODE, "providerID": provider_id(NODE), "csrUID": "earlier",
               "instance": format!("azure:{SUBSCRIPTION}/{instance_vm}"), "claimedAt": "2026-11-01T00:00:00Z"})
        .to_string()
    };
    // The node renews: both phases again, and the document is its own VM's.
    let mut world = World::new();
    world.as_node = true;
    capi::annotate(&mut world.machines[0], ANNOTATION_CLAIM, &claim(VM_ID));
    let key = key();
    let first = world.challenged(&key);
    let (_, renewed) = world.answer(&key, &first, world.imds());
    assert!(matches!(renewed.outcome, Outcome::Approved { .. }), "{renewed:#?}");

    // The claim names another VM (the Machine's VM was replaced under the same name, or the
    // document is a neighbour's): refused, whatever ARM says today.
    let mut world = World::new();
    world.as_node = true;
    capi::annotate(
        &mut world.machines[0],
        ANNOTATION_CLAIM,
        &claim("11111111-2222-3333-4444-555555555555"),
    );
    let key = tests::azure::key();
    let first = world.challenged(&key);
    let (_, refused) = world.answer(&key, &first, world.imds());
    let (reason, message) = denied(&refused.outcome);
    assert_eq!(reason, DenyReason::AttestationInvalid, "{message}");
    assert!(message.contains("bound to cloud instance"), "{message}");

    // A join token may not claim a claimed Machine again.
    let mut world = World::new();
    capi::annotate(&mut world.machines[0], ANNOTATION_CLAIM, &claim(VM_ID));
    let key = tests::azure::key();
    let envelope = attestation::request::build_envelope(
        &tests::azure::params(&provider_id(NODE)),
        &key,
        &mut attestation::azure::AzureAttestor::new(world.imds()),
        None,
    )
    .unwrap();
    let csr = world.object(&envelope);
    let (reason, _) = denied(&world.decide(&csr).outcome);
    assert_eq!(reason, DenyReason::MachineAlreadyClaimed);
}

#[test]
fn without_the_challenge_key_explain_checks_everything_but_the_mac() {
    let mut world = World::new();
    let key = key();
    let first = world.challenged(&key);
    let imds = world.imds();
    let mut attestor = attestation::azure::AzureAttestor::new(imds);
    let annotation = first.annotations[ANNOTATION_AZURE_CHALLENGE].clone();
    let envelope = attestation::request::build_envelope(
        &tests::azure::params(&provider_id(NODE)),
        &key,
        &mut attestor,
        Some(attestation::attestor::ChallengeAnswer {
            csr_name: &first.name,
            csr_uid: &first.uid,
            annotation: &annotation,
        }),
    )
    .unwrap();
    let csr = world.object(&envelope);
    let decision = world.decide_with(&csr, world.verifier_with(ChallengeKey::withheld()));
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:#?}");
    let note = format!("{decision:?}");
    assert!(note.contains("for the signer to check"), "{note}");
}

#[test]
fn the_synthetic_imds_signs_what_a_real_one_would() {
    let world = World::new();
    let mut imds = world.imds();
    let document = imds.attested_document("abc").unwrap();
    assert_eq!(attestation::azure::attestor::nonce_of(&document).unwrap(), "abc");
    let parsed = attestation::azure::AttestedDocument::parse(&statement("n", VM_ID, SUBSCRIPTION, world.now)).unwrap();
    assert_eq!(parsed.expires_on - parsed.created_on, Duration::hours(6));
}
