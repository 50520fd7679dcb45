//! Forged logs built from a real boot: each is the log an attacker's boot would leave once it
//! relabels or rewrites what its digests do not pin, with exactly the extends that boot makes
//! (so its replay is what the TPM would quote). The judge must refuse each, naming the event.
//! Then a property over three real boots: no event of a judged PCR may be relabelled,
//! rewritten, or inserted without a refusal.

use super::{QUOTED, REAL_LOGS, own_policy, policy_of, real_log};
use crate::tpm::boot_policy::testlog::sha256;
use crate::tpm::boot_policy::{BootPolicy, judge};
use crate::tpm::event_log::events::encode::variable_data;
use crate::tpm::event_log::events::{EFI_GLOBAL_VARIABLE, LINUX_LOAD_OPTIONS_TAG};
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

/// grub's string: `prefix + text + NUL`, the digest of `measured` (the text grub really ran).
fn grub(prefix: &str, shown: &str, measured: &str) -> Event {
    event(
        8,
        event_type::IPL,
        sha256(measured.as_bytes()),
        format!("{prefix}{shown}\0").into_bytes(),
    )
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

/// The index of the event of `pcr` whose data starts with `prefix`.
fn find(log: &EventLog, pcr: u32, prefix: &[u8]) -> usize {
    log.events
        .iter()
        .position(|e| e.pcr == pcr && e.data.starts_with(prefix))
        .unwrap_or_else(|| panic!("no PCR {pcr} event starts with {:?}", String::from_utf8_lossy(prefix)))
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

#[test]
fn the_real_boot_is_accepted_under_its_own_policy() {
    let log = real_log(RHEL9);
    let summary = verdict(&policy_of(&log, "required"), &log).unwrap();
    assert_eq!(
        summary,
        "Secure Boot on, image real (3 boot applications, command line, initrd)"
    );
}

/// 1. Secure Boot off while the policy requires it: the firmware's `SecureBoot` = 0 typed
///    `EV_POST_CODE`, and after boot PCR 7 extended with `SecureBoot` = 1.
#[test]
fn forgery_1_secure_boot_off_relabelled_and_a_later_variable() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let at = real
        .events
        .iter()
        .position(|e| e.pcr == 7 && e.data.ends_with(&[1]) && e.data.len() == secure_boot_variable(1).len())
        .unwrap();
    let mut log = real.clone();
    log.events[at] = Event {
        index: at,
        ..event(
            7,
            event_type::POST_CODE,
            sha256(&secure_boot_variable(0)),
            secure_boot_variable(0),
        )
    };
    let on = secure_boot_variable(1);
    let forged = reindexed(EventLog {
        events: [
            log.events,
            vec![event(7, event_type::EFI_VARIABLE_DRIVER_CONFIG, sha256(&on), on)],
        ]
        .concat(),
        ..real.clone()
    });
    refused(
        &policy,
        &forged,
        &[&format!(
            "event {at} (PCR 7, EV_POST_CODE): not an event the firmware's Secure Boot configuration explains"
        )],
    );
    // Labelled honestly, the firmware's word is the first SecureBoot variable.
    let mut honest = forged.clone();
    honest.events[at].event_type = event_type::EFI_VARIABLE_DRIVER_CONFIG;
    let last = honest.events.len() - 1;
    refused(
        &policy,
        &honest,
        &[&format!(
            "event {last} (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): not an event the firmware's Secure Boot configuration explains in PCR 7 after its separator"
        )],
    );
    honest.events.pop();
    refused(
        &policy,
        &honest,
        &[&format!(
            "event {at} (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG): SecureBoot is [0], not 1"
        )],
    );
}

/// 2. An unlisted application runs first and extends PCR 4 with the approved chain; the log
///    types the real separator `EV_POST_CODE` and the application `EV_SEPARATOR`.
#[test]
fn forgery_2_an_application_before_the_chain_passed_off_as_the_separator() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let separator = real
        .events
        .iter()
        .position(|e| e.pcr == 4 && e.event_type == event_type::SEPARATOR)
        .unwrap();
    let mut log = inserted(
        &real,
        separator + 1,
        event(4, event_type::SEPARATOR, sha256(b"evil.efi"), vec![0, 0, 0, 0]),
    );
    log.events[separator].event_type = event_type::POST_CODE;
    refused(
        &policy,
        &log,
        &[&format!(
            "event {separator} (PCR 4, EV_POST_CODE): carries the separator value's digest, so it is PCR 4's separator, but the log types it EV_POST_CODE"
        )],
    );
    // Typed honestly, the application is refused as the chain's first.
    let log = inserted(
        &real,
        separator + 1,
        event(
            4,
            event_type::EFI_BOOT_SERVICES_APPLICATION,
            sha256(b"evil.efi"),
            vec![0; 32],
        ),
    );
    refused(
        &policy,
        &log,
        &[
            &format!("event {} (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)", separator + 1),
            "none of the policy's bootloaders at position 1",
        ],
    );
    // A second separator extended after boot to start the chain again.
    let end = real.events.len();
    let log = inserted(
        &real,
        end,
        event(4, event_type::SEPARATOR, sha256(&[0, 0, 0, 0]), vec![0, 0, 0, 0]),
    );
    refused(
        &policy,
        &log,
        &[&format!(
            "event {end} (PCR 4, EV_SEPARATOR): a second separator in PCR 4"
        )],
    );
}

/// 3. A second `initrd /evil.img` command whose text the log rewrites so that it no longer
///    reads as grub's initrd command.
#[test]
fn forgery_3_a_second_initrd_command_rewritten() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let end = real.events.len();
    for shown in ["grub_cmd: echo Loading initial ramdisk ...", "Loading initial ramdisk"] {
        let log = inserted(&real, end, grub("", shown, "initrd (hd0,gpt2)/evil.img"));
        let log = inserted(
            &log,
            end + 1,
            event(9, event_type::IPL, sha256(b"evil"), b"(hd0,gpt2)/evil.img\0".to_vec()),
        );
        let message = verdict(&policy, &log).unwrap_err();
        assert!(
            message.starts_with(&format!("event {end} (PCR 8, EV_IPL): ")),
            "{message}"
        );
        assert!(
            message.contains("its digest does not cover its text") || message.contains("neither a grub string"),
            "{message}"
        );
    }
    // Shown as it ran, it is an initrd measured twice.
    let log = inserted(
        &real,
        end,
        grub("grub_cmd: ", "initrd (hd0,gpt2)/evil.img", "initrd (hd0,gpt2)/evil.img"),
    );
    refused(
        &policy,
        &log,
        &[&format!(
            "event {end} (PCR 8, EV_IPL): an initrd (grub's initrd command) measured a second time"
        )],
    );
}

/// 4. `initrd /initrd.img /evil.cpio`: the evil file's PCR 9 event typed `EV_POST_CODE`.
#[test]
fn forgery_4_a_second_initrd_file_relabelled() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let command = find(&real, 8, b"grub_cmd: initrd ");
    let text = String::from_utf8(real.events[command].data.clone()).unwrap();
    let both = format!(
        "{} (hd0,gpt2)/evil.cpio",
        text.trim_end_matches('\0').trim_start_matches("grub_cmd: ")
    );
    let mut log = real.clone();
    log.events[command] = Event {
        index: command,
        ..grub("grub_cmd: ", &both, &both)
    };
    let end = log.events.len();
    let relabelled = inserted(&log, end, event(9, event_type::POST_CODE, sha256(b"evil cpio"), vec![]));
    refused(
        &policy,
        &relabelled,
        &[&format!(
            "event {end} (PCR 9, EV_POST_CODE): not an event of a boot path in PCR 9"
        )],
    );
    let honest = inserted(
        &log,
        end,
        event(
            9,
            event_type::IPL,
            sha256(b"evil cpio"),
            b"(hd0,gpt2)/evil.cpio\0".to_vec(),
        ),
    );
    refused(
        &policy,
        &honest,
        &[&format!(
            "event {command} (PCR 8, EV_IPL): grub's initrd command loads 2 files"
        )],
    );
}

/// 5. `init=/bin/evil` on the command line: the log rewrites the `kernel_cmdline:` text, or
///    relabels it a command, and after boot root extends PCR 9 with the approved load options
///    labelled as the EFI stub's.
#[test]
fn forgery_5_an_evil_command_line_rewritten_and_the_stubs_options_added() {
    let real = real_log(RHEL9);
    let policy = policy_of(&real, "required");
    let at = find(&real, 8, b"kernel_cmdline: ");
    let approved = String::from_utf8(real.events[at].data.clone()).unwrap();
    let approved = approved
        .trim_end_matches('\0')
        .trim_start_matches("kernel_cmdline: ")
        .to_owned();
    let evil = format!("{approved} init=/bin/evil");
    let options: Vec<u8> = format!("BOOT_IMAGE={approved}")
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .chain([0, 0])
        .collect();
    let mut stub_data = LINUX_LOAD_OPTIONS_TAG.to_le_bytes().to_vec();
    stub_data.extend(26u32.to_le_bytes());
    stub_data.extend(b"LOADED_IMAGE::LoadOptions\0");
    let stub = event(9, event_type::EVENT_TAG, sha256(&options), stub_data);
    for (prefix, shown) in [("kernel_cmdline: ", approved.as_str()), ("grub_cmd: ", evil.as_str())] {
        let mut log = real.clone();
        log.events[at] = Event {
            index: at,
            ..grub(prefix, shown, &evil)
        };
        let end = log.events.len();
        let log = inserted(&log, end, stub.clone());
        let message = verdict(&policy, &log).unwrap_err();
        assert!(
            message.starts_with(&format!("event {at} (PCR 8, EV_IPL): ")),
            "{message}"
        );
        assert!(
            message.contains("its digest does not cover its text") || message.contains("follows grub's linux command"),
            "{message}"
        );
    }
    // Shown as it ran: the command line is not the policy's.
    let mut log = real.clone();
    log.events[at] = Event {
        index: at,
        ..grub("kernel_cmdline: ", &evil, &evil)
    };
    refused(
        &policy,
        &log,
        &[
            &format!("event {at} (PCR 8, EV_IPL): command line"),
            "is not the one of image real",
        ],
    );
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
