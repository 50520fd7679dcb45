//! Forged logs built from real boots: each is the log an attacker's boot would leave once it
//! relabels or rewrites what its digests do not pin, with exactly the extends that boot makes
//! (so its replay is what the TPM would quote). A property over every real boot: no event of a
//! judged PCR may be relabelled, rewritten, or inserted without a refusal. The five forgeries of
//! the attack review are `tests/tests/boot_forgeries.rs` and, on swtpm, `tpm_boot_policy`.

use super::{QUOTED, REAL_LOGS, own_policy, policy_of, real_log};
use crate::tpm::boot_policy::testlog::sha256;
use crate::tpm::boot_policy::{BootPolicy, judge};
use crate::tpm::event_log::events::EFI_GLOBAL_VARIABLE;
use crate::tpm::event_log::events::encode::variable_data;
use crate::tpm::event_log::{Event, EventLog, HashAlg, event_type};

/// keylime's RHEL 9 log: Secure Boot on, shim, grub (upstream forms), the kernel shim verified.
const RHEL9: &str = "keylime_binary_bios_measurements-secureboot";

fn event(pcr: u32, event_type: u32, digest: Vec<u8>, data: Vec<u8>) -> Event {
    Event {
        index: 0,
        pcr,
        event_type,
        digests: vec![(HashAlg::Sha256, digest)],
        data,
    }
}

fn reindexed(mut log: EventLog) -> EventLog {
    for (i, event) in log.events.iter_mut().enumerate() {
        event.index = i;
    }
    log
}

fn inserted(log: &EventLog, at: usize, new: Event) -> EventLog {
    let mut log = log.clone();
    log.events.insert(at, new);
    reindexed(log)
}

fn verdict(policy: &str, log: &EventLog) -> Result<String, String> {
    let policy = BootPolicy::parse(policy).unwrap();
    judge(&policy, log, HashAlg::Sha256, &QUOTED)
        .map(|v| v.summary)
        .map_err(|r| r.message)
}

#[track_caller]
fn refused(policy: &str, log: &EventLog, expected: &[&str]) {
    let message = verdict(policy, log).expect_err("the forged log is refused");
    for part in expected {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}

fn secure_boot_variable(value: u8) -> Vec<u8> {
    variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", &[value])
}

/// With the image's kernel file, an evil initrd cannot hide before an approved one extended
/// after boot.
#[test]
fn a_file_read_between_the_kernel_file_and_the_initrd_is_refused() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let initrd = real
        .events
        .iter()
        .rposition(|e| e.pcr == 9 && e.event_type == event_type::IPL)
        .unwrap();
    let good = real.events[initrd].clone();
    let mut log = real.clone();
    log.events[initrd] = Event {
        index: initrd,
        ..event(
            9,
            event_type::IPL,
            sha256(b"evil initrd"),
            b"(hd0,gpt2)/grub2/grubenv\0".to_vec(),
        )
    };
    let end = log.events.len();
    let log = inserted(&log, end, Event { index: end, ..good });
    refused(
        &policy,
        &log,
        &[
            "PCR 9 holds 2 file(s) after the kernel file",
            "grub's initrd command loaded 1",
        ],
    );
    // Without the kernel file the last file is taken: the documented gap the field closes.
    let without: String = policy
        .lines()
        .filter(|l| !l.contains("kernelFile"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(verdict(&without, &log).is_ok());
}

/// The types a relabel may give an event: every type the judge knows for some PCR, and one
/// no PCR has (`EV_NO_ACTION` would leave the replay, so it is not a relabel that replays).
const TYPES: [u32; 13] = [
    event_type::POST_CODE,
    event_type::SEPARATOR,
    event_type::ACTION,
    event_type::EVENT_TAG,
    event_type::IPL,
    event_type::EFI_VARIABLE_DRIVER_CONFIG,
    event_type::EFI_VARIABLE_BOOT,
    event_type::EFI_BOOT_SERVICES_APPLICATION,
    event_type::EFI_ACTION,
    event_type::EFI_VARIABLE_AUTHORITY,
    event_type::OMIT_BOOT_DEVICE_EVENTS,
    event_type::COMPACT_HASH,
    0x0000_DEAD,
];

/// Whether the judge reads `event`'s meaning from its type (the firmware's events before PCR
/// 4's separator are one set: relabelling one as another of the set changes nothing judged).
fn before_pcr4_separator(log: &EventLog, event: &Event) -> bool {
    event.pcr == 4
        && log
            .events
            .iter()
            .any(|e| e.pcr == 4 && e.event_type == event_type::SEPARATOR && e.index > event.index)
}

/// Any event of a judged PCR relabelled, rewritten or inserted is refused, for every real boot
/// (the replay stays the same: only the log's words change, or an extend is added).
#[test]
fn no_event_of_a_judged_pcr_can_be_relabelled_rewritten_or_inserted() {
    let firmware_pcr4 = [
        event_type::EFI_ACTION,
        event_type::EFI_BOOT_SERVICES_APPLICATION,
        event_type::OMIT_BOOT_DEVICE_EVENTS,
    ];
    let mut tried = 0;
    for name in REAL_LOGS {
        let real = real_log(name);
        let Some(policy) = own_policy(&real) else {
            continue;
        };
        assert!(verdict(&policy, &real).is_ok(), "{name}");
        let judged = crate::tpm::boot_policy::judged_pcrs(&BootPolicy::parse(&policy).unwrap());
        for i in 0..real.events.len() {
            let original = &real.events[i];
            if !judged.contains(&original.pcr) || original.event_type == event_type::NO_ACTION {
                continue;
            }
            // Relabelled.
            for kind in TYPES.into_iter().filter(|t| *t != original.event_type) {
                if before_pcr4_separator(&real, original)
                    && firmware_pcr4.contains(&kind)
                    && firmware_pcr4.contains(&original.event_type)
                {
                    continue;
                }
                let mut log = real.clone();
                log.events[i].event_type = kind;
                tried += 1;
                assert!(
                    verdict(&policy, &log).is_err(),
                    "{name}: event {i} (PCR {}) {:#x} relabelled {kind:#x} was accepted",
                    original.pcr,
                    original.event_type
                );
            }
            // Rewritten: a byte of data its digest covers changed.
            let covered = original.digest(HashAlg::Sha256) == Some(sha256(&original.data).as_slice())
                || original.digest(HashAlg::Sha256) == original.data.strip_suffix(&[0]).map(sha256).as_deref()
                || (original.pcr == 8 && !original.data.is_empty());
            if covered && !original.data.is_empty() {
                let mut log = real.clone();
                let data = &mut log.events[i].data;
                let middle = data.len() / 2;
                data[middle] ^= 0x01;
                tried += 1;
                assert!(
                    verdict(&policy, &log).is_err(),
                    "{name}: event {i} (PCR {}) rewritten was accepted",
                    original.pcr
                );
            }
        }
        // Inserted: after every position of every judged PCR from its separator or kernel on,
        // an extend of each judged PCR the boot does not explain.
        for pcr in judged.iter().copied() {
            let candidates = [
                event(pcr, event_type::POST_CODE, sha256(b"x"), b"x".to_vec()),
                event(
                    pcr,
                    event_type::EFI_BOOT_SERVICES_APPLICATION,
                    sha256(b"evil.efi"),
                    vec![0; 8],
                ),
                event(pcr, event_type::IPL, sha256(b"evil"), b"(hd0)/evil\0".to_vec()),
                event(
                    pcr,
                    event_type::EFI_VARIABLE_DRIVER_CONFIG,
                    sha256(&secure_boot_variable(1)),
                    secure_boot_variable(1),
                ),
            ];
            let last = real
                .events
                .iter()
                .rposition(|e| e.pcr == pcr)
                .unwrap_or(real.events.len() - 1);
            for at in [last + 1, real.events.len()] {
                for new in &candidates {
                    let log = inserted(&real, at, new.clone());
                    tried += 1;
                    assert!(
                        verdict(&policy, &log).is_err(),
                        "{name}: a {:#x} extend of PCR {pcr} at {at} was accepted",
                        new.event_type
                    );
                }
            }
        }
    }
    assert!(tried > 10_000, "{tried} mutations");
}

/// The PCR 9 tagged events of a stub-only boot: the stub's, each once, nothing else.
#[test]
fn a_tagged_event_of_another_kind_or_a_stub_event_twice_is_refused() {
    let log = real_log(RHEL9);
    let policy = policy_of(&log, "required");
    let end = log.events.len();
    let mut data = 0x1234_5678u32.to_le_bytes().to_vec();
    data.extend(0u32.to_le_bytes());
    let other = inserted(&log, end, event(9, event_type::EVENT_TAG, sha256(b"x"), data));
    refused(
        &policy,
        &other,
        &[&format!(
            "event {end} (PCR 9, EV_EVENT_TAG): a tagged event of no boot path"
        )],
    );
}
