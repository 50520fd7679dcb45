//! The `tpm/v1` boot policy (SPEC section 5, revision 5) on a real TPM without a cluster: swtpm's
//! PCRs extended as firmware would from a real measured-boot log (`tests::boot_log`), the node's
//! [`TpmAttestor`] sending that log, and the signer's rule engine and [`TpmVerifier`] with the
//! Cluster's policy as the signer would have read it. The cluster suite is
//! `authenticator-cli/tests/envtest_boot_policy`. Skips loudly without swtpm.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::decision::{Decision, DenyReason, Outcome};
use attestation::tpm::attestor::{EventLogSource, TpmAttestor};
use attestation::tpm::boot_policy::{BootPolicy, PolicyState};
use attestation::tpm::event_log::{self, HashAlg};
use tests::boot_log::{self, boot_applications, hex, image, policy, replaced};
use tests::swtpm::Swtpm;
use tests::tpm_world::{World, key};

#[track_caller]
fn denied(decision: &Decision, reason: DenyReason, case: &str) -> String {
    match &decision.outcome {
        Outcome::Denied { reason: got, message } => {
            assert_eq!(*got, reason, "{case}: {message}");
            eprintln!("{case}: {reason}: {message}");
            message.clone()
        }
        other => panic!("{case}: expected Denied {reason}, got {other:?}\n{decision:#?}"),
    }
}

#[track_caller]
fn approved(decision: &Decision, case: &str) {
    match &decision.outcome {
        Outcome::Approved { reason, message } => {
            assert_eq!(reason, "AttestedTpmV1", "{case}");
            eprintln!("{case}: approved: {message}");
        }
        other => panic!("{case}: expected approval, got {other:?}\n{decision:#?}"),
    }
}

fn loaded(text: &str) -> PolicyState {
    PolicyState::Loaded {
        source: "team-a/boot-policy".into(),
        policy: Arc::new(BootPolicy::parse(text).unwrap()),
    }
}

/// swtpm rebooted with `measured` played into its PCRs (checked against the log's replay),
/// and `reported` where the node reads its log.
fn boot(tpm: &mut Swtpm, log_file: &std::path::Path, measured: &[u8], reported: &[u8]) {
    tpm.reboot();
    let log = event_log::parse(measured).unwrap();
    assert_eq!(tpm.measure_boot(&log), ["sha256"]);
    let replay = log.replay(HashAlg::Sha256).unwrap();
    for pcr in [0, 1, 4, 7, 8, 9, 11] {
        let expected = replay.get(&pcr).cloned().unwrap_or_else(|| vec![0; 32]);
        assert_eq!(hex(&tpm.pcr("sha256", pcr)), hex(&expected), "PCR {pcr}");
    }
    std::fs::write(log_file, reported).unwrap();
}

#[test]
#[ignore = "needs swtpm"]
fn a_real_boot_is_judged_on_its_replayed_log_and_phase_two_must_be_the_same_boot() {
    let mut tpm = Swtpm::start("tpm_boot_policy");
    let log_file = tpm.path("binary_bios_measurements");
    let original = boot_log::read(boot_log::UBUNTU_2104);
    let log = event_log::parse(&original).unwrap();
    let apps = boot_applications(&log);
    let (kernel_index, kernel) = apps.last().cloned().unwrap();
    let kernel_event = log.events[kernel_index].describe();
    let allowed = image("ubuntu-2104", &log);
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::File(log_file.clone()));

    // Allowed: the log's own boot, Secure Boot off and not required; both phases.
    boot(&mut tpm, &log_file, &original, &original);
    world.boot_policy = loaded(&policy("optional", std::slice::from_ref(&allowed)));
    let k = key();
    let first = world.challenged(&mut node, &k);
    let (_, decision) = world.phase_two(&mut node, &k, &first);
    approved(&decision, "the log's own boot");
    let rules = format!("{:?}", decision.rules);
    assert!(
        rules.contains("boot policy team-a/boot-policy"),
        "the attestation rule's note names the policy: {rules}"
    );
    world.finish_all();

    // Secure Boot required: PCR 7's SecureBoot variable is named.
    world.boot_policy = loaded(&policy("required", std::slice::from_ref(&allowed)));
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "Secure Boot required",
    );
    assert!(message.contains("PCR 7") && message.contains("SecureBoot"), "{message}");

    // A kernel the policy does not list: the last boot application's event is named.
    let mut other = allowed.clone();
    other["kernel"] = serde_json::json!("ab".repeat(32));
    world.boot_policy = loaded(&policy("optional", &[other]));
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "a kernel not listed",
    );
    assert!(message.contains(&kernel_event), "names {kernel_event}: {message}");

    // Another command line.
    let mut other = allowed.clone();
    other["commandLine"] = serde_json::json!("/boot/vmlinuz root=/dev/sda1 ro init=/bin/sh");
    world.boot_policy = loaded(&policy("optional", &[other]));
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "another command line",
    );
    assert!(
        message.contains("PCR 8"),
        "names grub's kernel_cmdline event: {message}"
    );

    // No log under a policy.
    world.boot_policy = loaded(&policy("optional", std::slice::from_ref(&allowed)));
    let mut silent = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::None);
    let message = denied(
        &world.phase_one(&mut silent, &key()).1,
        DenyReason::AttestationInvalid,
        "no log",
    );
    assert!(message.contains("eventLog"), "{message}");

    // A reboot between the phases: the same boot measured again gives the same PCRs, but the
    // TPM's resetCount says it is another boot.
    let k = key();
    let first = world.challenged(&mut node, &k);
    boot(&mut tpm, &log_file, &original, &original);
    denied(
        &world.phase_two(&mut node, &k, &first).1,
        DenyReason::ChallengeFailed,
        "a reboot between the phases",
    );
    world.finish_all();

    // One extend after the log.
    tpm.extend(&[(4, vec![("sha256", vec![0x42; 32])])]);
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "an extend after the log",
    );
    assert!(message.contains("does not match the quote"), "{message}");

    // A log with an event changed (shim's digest), the TPM measured with the real one.
    let lying = replaced(&original, &apps[0].1, &[0x17; 32]);
    boot(&mut tpm, &log_file, &original, &lying);
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "a log with an event changed",
    );
    assert!(message.contains("does not match the quote"), "{message}");

    // A kernel update: refused until the policy lists the new image beside the old.
    let updated = replaced(&original, &kernel, &[0x61; 32]);
    boot(&mut tpm, &log_file, &updated, &updated);
    let message = denied(
        &world.phase_one(&mut node, &key()).1,
        DenyReason::AttestationInvalid,
        "the updated kernel before the policy lists it",
    );
    assert!(message.contains(&kernel_event), "{message}");
    let new_image = image("ubuntu-2104-new-kernel", &event_log::parse(&updated).unwrap());
    world.boot_policy = loaded(&policy("optional", &[allowed, new_image]));
    let k = key();
    let first = world.challenged(&mut node, &k);
    approved(
        &world.phase_two(&mut node, &k, &first).1,
        "the updated kernel once the policy lists it",
    );
}

/// The five forged boots of the attack review (`tests::boot_log::forgery`, from keylime's real
/// RHEL 9 log), each played into swtpm with exactly the extends the attacker's boot makes and
/// sent by the node's attestor: the real boot is approved under its own policy (an unlogged PCR 0
/// extend too), and each forgery is denied `AttestationInvalid` naming the event it falsified.
#[test]
#[ignore = "needs swtpm"]
fn the_five_forged_boots_are_refused_on_a_real_tpm() {
    use tests::boot_log::{RHEL9, encode, forgery, own_policy};
    let mut tpm = Swtpm::start("tpm_boot_forgeries");
    let log_file = tpm.path("binary_bios_measurements");
    let original = boot_log::read(RHEL9);
    let real = event_log::parse(&original).unwrap();
    let mut world = World::new();
    world.boot_policy = loaded(&own_policy(&real, "rhel-9"));
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::File(log_file.clone()));

    boot(&mut tpm, &log_file, &original, &original);
    let k = key();
    let first = world.challenged(&mut node, &k);
    approved(&world.phase_two(&mut node, &k, &first).1, "the real RHEL 9 boot");
    world.finish_all();

    // The DL160 shape: a measurement of PCR 0 the log does not hold (a server's firmware
    // measures before its log begins) refuses no node, since no policy judges PCR 0.
    tpm.extend(&[(0, vec![("sha256", vec![0x42; 32])])]);
    let k = key();
    let first = world.challenged(&mut node, &k);
    approved(&world.phase_two(&mut node, &k, &first).1, "an unlogged PCR 0 extend");
    world.finish_all();

    for forged in forgery::all(&real) {
        let bytes = encode(&forged.log);
        boot(&mut tpm, &log_file, &bytes, &bytes);
        let message = denied(
            &world.phase_one(&mut node, &key()).1,
            DenyReason::AttestationInvalid,
            forged.what,
        );
        assert!(message.contains(&forged.refusal), "{}: {message}", forged.what);
    }
}

/// Every real boot of `testdata/event_logs` that swtpm can play (a SHA-256 bank, PCR 0 started
/// at locality 0) and that ran a boot application, played into swtpm as its firmware measured
/// it and sent by the node's attestor: approved through both phases under the policy its own
/// measurements make (`attestation::tpm::boot_policy::from_log`).
#[test]
#[ignore = "needs swtpm"]
fn every_real_boot_swtpm_can_play_is_approved_under_its_own_policy() {
    use tests::boot_log::own_policy;
    let mut tpm = Swtpm::start("tpm_boot_real_logs");
    let log_file = tpm.path("binary_bios_measurements");
    let mut world = World::new();
    let mut node = TpmAttestor::new(&tpm.tcti)
        .unwrap()
        .with_event_log(EventLogSource::File(log_file.clone()));
    let mut played = Vec::new();
    for name in [
        "keylime_binary_bios_measurements-secureboot",
        "coreos_36_shielded_vm_no_secure_boot_eventlog",
        "ubuntu_2104_shielded_vm_no_secure_boot_eventlog",
        "sb_cert_eventlog",
        "crypto_agile_eventlog",
        "go_tpm_tools_arch_linux_workstation_systemd_boot_eventlog",
        "go_tpm_tools_ubuntu_2404_amd_sevsnp_eventlog",
        "go_tpm_tools_rhel8_gce_eventlog",
        "keylime_uefi_eventlog_rhcos_eventlog",
        "keylime_uefi_eventlog_rhel84_netboot_eventlog",
        "tpm2_tools_rhel9_moklisttrusted_eventlog",
    ] {
        let bytes = boot_log::read(name);
        let log = event_log::parse(&bytes).unwrap();
        assert_eq!(log.startup_locality, None, "{name}: swtpm starts PCR 0 at locality 0");
        boot(&mut tpm, &log_file, &bytes, &bytes);
        world.boot_policy = loaded(&own_policy(&log, name));
        let k = key();
        let first = world.challenged(&mut node, &k);
        approved(&world.phase_two(&mut node, &k, &first).1, name);
        world.finish_all();
        played.push(name);
    }
    assert_eq!(played.len(), 11);
}
