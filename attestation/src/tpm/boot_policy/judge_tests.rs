use super::*;
use crate::tpm::boot_policy::BootPolicy;
use crate::tpm::boot_policy::testlog::{Boot, LogBuilder, certificate, sha256};
use crate::tpm::event_log::events::{
    EFI_GLOBAL_VARIABLE, EFI_IMAGE_SECURITY_DATABASE, LINUX_INITRD_TAG, LINUX_LOAD_OPTIONS_TAG,
};

const QUOTED: [u32; 7] = [0, 1, 4, 7, 8, 9, 11];

fn verdict(policy: &str, log: &LogBuilder) -> Result<BootVerdict, BootRefusal> {
    let policy = BootPolicy::parse(policy).unwrap();
    judge(&policy, &log.log(), HashAlg::Sha256, &QUOTED)
}

#[track_caller]
fn refused(policy: &str, log: &LogBuilder, expected: &[&str]) {
    let message = verdict(policy, log).unwrap_err().message;
    for part in expected {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}

#[test]
fn a_secure_boot_through_shim_grub_and_the_kernel_matches_its_image() {
    let boot = Boot::default();
    let verdict = verdict(&boot.policy(), &boot.through_grub()).unwrap();
    assert_eq!(verdict.image, "debian-12");
    assert_eq!(
        verdict.summary,
        "Secure Boot on, dbx allowed, 2 authorities allowed, image debian-12 (3 boot applications, command line, initrd)"
    );
}

#[test]
fn a_rollout_lists_both_images_and_either_boots() {
    let old = Boot::default();
    let new = Boot {
        kernel: sha256(b"vmlinuz 6.1.0-29"),
        ..Boot::default()
    };
    let both = format!(
        "{}  - name: debian-12-new\n    bootloaders: [{}, {}]\n    kernel: {}\n",
        old.policy(),
        crate::digest::hex(&new.shim),
        crate::digest::hex(&new.grub),
        crate::digest::hex(&new.kernel)
    );
    assert_eq!(verdict(&both, &old.through_grub()).unwrap().image, "debian-12");
    assert_eq!(verdict(&both, &new.through_grub()).unwrap().image, "debian-12-new");
    refused(
        &old.policy(),
        &new.through_grub(),
        &[
            "(PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION): Authenticode sha256 ",
            "is none of the policy's kernels (image debian-12)",
        ],
    );
}

#[test]
fn another_bootloader_is_named_by_its_event() {
    let boot = Boot::default();
    let evil = Boot {
        grub: sha256(b"another grub"),
        ..Boot::default()
    };
    let log = evil.through_grub();
    let index = log
        .log()
        .events
        .iter()
        .position(|e| e.digest(HashAlg::Sha256) == Some(&evil.grub[..]))
        .unwrap();
    refused(
        &boot.policy(),
        &log,
        &[
            &format!("event {index} (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)"),
            "none of the policy's bootloaders at position 2",
        ],
    );
}

#[test]
fn secure_boot_off_is_refused_unless_optional() {
    let boot = Boot::default();
    let log = boot
        .firmware(0)
        .application(&boot.shim)
        .application(&boot.grub)
        .grub("grub_cmd: ", "linux /vmlinuz-6.1.0-28-amd64 root=UUID=1234 ro quiet")
        .grub("kernel_cmdline: ", &boot.command_line)
        .grub("grub_cmd: ", "initrd /initrd.img")
        .file("/initrd.img", &boot.initrd)
        .application(&boot.kernel);
    refused(
        &boot.policy(),
        &log,
        &["event 1 (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG)", "Secure Boot is off"],
    );
    let optional = boot
        .policy()
        .replace("kind: TpmBootPolicy\n", "kind: TpmBootPolicy\nsecureBoot: optional\n");
    assert!(verdict(&optional, &log).is_ok());
    let without = LogBuilder::default().separators(0..=7).application(&boot.kernel);
    refused(
        &boot.policy(),
        &without,
        &["PCR 7 measures no SecureBoot, PK, KEK, db, dbx variable"],
    );
}

#[test]
fn an_unlisted_authority_or_dbx_is_refused() {
    let boot = Boot::default();
    let log = boot
        .firmware(1)
        .authority("db", &certificate(9))
        .application(&boot.shim);
    refused(
        &boot.policy(),
        &log,
        &[
            "(PCR 7, EV_EFI_VARIABLE_AUTHORITY): db authority sha256 ",
            "none of the policy's authorities",
        ],
    );
    let old_dbx = Boot {
        dbx: b"an old dbx".to_vec(),
        ..Boot::default()
    };
    refused(
        &boot.policy(),
        &old_dbx.through_grub(),
        &["dbx of 10 bytes", "none of the policy's dbx contents"],
    );
    // Empty lists allow any.
    let any = boot
        .policy()
        .lines()
        .filter(|l| !l.starts_with("authorities") && !l.starts_with("dbx"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(verdict(&any, &old_dbx.through_grub()).is_ok());
    // shim's SbatLevel is an authority event, not a certificate.
    let sbat = boot.through_grub().authority("SbatLevel", b"sbat,1,2022111500\n");
    assert!(verdict(&boot.policy(), &sbat).is_ok());
}

#[test]
fn pcr_4_after_its_separator_holds_the_chain_and_nothing_else() {
    let boot = Boot::default();
    let extra = boot.through_grub().application(&sha256(b"a second kernel"));
    refused(&boot.policy(), &extra, &["is not expected after the kernel"]);
    let action = boot
        .through_grub()
        .measured(4, event_type::EFI_ACTION, b"something else");
    refused(
        &boot.policy(),
        &action,
        &["(PCR 4, EV_EFI_ACTION): unexpected in PCR 4 after its separator"],
    );
    let retried = boot.through_grub().measured(
        4,
        event_type::EFI_ACTION,
        b"Returning from EFI Application from Boot Option",
    );
    assert!(
        verdict(&boot.policy(), &retried).is_ok(),
        "the firmware's boot-attempt actions"
    );
    let short = boot.firmware(1).application(&boot.shim).application(&boot.grub);
    refused(
        &boot.policy(),
        &short,
        &["the last PCR 4 boot application, after 2", "expects more"],
    );
    let none = LogBuilder::default()
        .variable(EFI_GLOBAL_VARIABLE, "SecureBoot", &[1])
        .variable(EFI_GLOBAL_VARIABLE, "PK", b"pk")
        .variable(EFI_GLOBAL_VARIABLE, "KEK", b"kek")
        .variable(EFI_IMAGE_SECURITY_DATABASE, "db", b"db")
        .variable(EFI_IMAGE_SECURITY_DATABASE, "dbx", b"dbx")
        .separators(7..=7);
    let optional = boot.policy().replace("authorities:", "x:").replace("dbx:", "y:");
    let optional: String = optional
        .lines()
        .filter(|l| !l.starts_with("x:") && !l.starts_with("y:"))
        .map(|l| format!("{l}\n"))
        .collect();
    refused(&optional, &none, &["PCR 4 holds no boot application"]);
}

#[test]
fn the_command_line_and_initrd_are_grubs_or_the_stubs() {
    let boot = Boot::default();
    let other_line = Boot {
        command_line: "/vmlinuz-6.1.0-28-amd64 root=UUID=1234 ro init=/bin/sh".into(),
        ..Boot::default()
    };
    refused(
        &boot.policy(),
        &other_line.through_grub(),
        &[
            "(PCR 8, EV_IPL): command line",
            "init=/bin/sh",
            "is not the one of image debian-12",
        ],
    );
    let other_initrd = Boot {
        initrd: sha256(b"another initrd"),
        ..Boot::default()
    };
    refused(
        &boot.policy(),
        &other_initrd.through_grub(),
        &[
            "(PCR 9, EV_IPL): initrd \"/initrd.img-6.1.0-28-amd64\" sha256 ",
            "is not the initrd of image debian-12",
        ],
    );

    // Booted by shim straight into the kernel's EFI stub: PCR 9's tagged events.
    let utf16 = |text: &str| -> Vec<u8> { text.encode_utf16().flat_map(u16::to_le_bytes).chain([0, 0]).collect() };
    let stub = |initrd: &[u8], line: &str| {
        boot.firmware(1)
            .authority("db", &certificate(1))
            .application(&boot.shim)
            .authority("Shim", &certificate(2))
            .application(&boot.grub)
            .application(&boot.kernel)
            .stub(
                LINUX_LOAD_OPTIONS_TAG,
                "LOADED_IMAGE::LoadOptions",
                sha256(&utf16(line)),
            )
            .stub(LINUX_INITRD_TAG, "Linux initrd", initrd.to_vec())
    };
    let with_boot_image = format!("BOOT_IMAGE={}", boot.command_line);
    assert!(verdict(&boot.policy(), &stub(&boot.initrd, &with_boot_image)).is_ok());
    refused(
        &boot.policy(),
        &stub(&boot.initrd, "root=/dev/evil"),
        &["(PCR 9, EV_EVENT_TAG): the kernel's load options"],
    );
    refused(
        &boot.policy(),
        &stub(&sha256(b"x"), &with_boot_image),
        &["(PCR 9, EV_EVENT_TAG): initrd sha256 "],
    );

    // Nothing measured: an image that gives them refuses.
    let bare = boot
        .firmware(1)
        .authority("db", &certificate(1))
        .application(&boot.shim)
        .authority("Shim", &certificate(2))
        .application(&boot.grub)
        .application(&boot.kernel);
    refused(&boot.policy(), &bare, &["no kernel command line is measured"]);
}

#[test]
fn the_quote_must_cover_the_policys_pcrs_in_sha256() {
    let boot = Boot::default();
    let policy = BootPolicy::parse(&boot.policy()).unwrap();
    let log = boot.through_grub().log();
    let missing = judge(&policy, &log, HashAlg::Sha256, &[0, 1, 7]).unwrap_err().message;
    assert!(missing.contains("does not cover PCRs [4, 8, 9]"), "{missing}");
    let sha1 = judge(&policy, &log, HashAlg::Sha1, &QUOTED).unwrap_err().message;
    assert!(sha1.contains("the quote is of the sha1 bank"), "{sha1}");
}

#[test]
fn a_grub_string_whose_digest_covers_nothing_is_refused() {
    let boot = Boot::default();
    let forged = boot.through_grub().raw(
        8,
        event_type::IPL,
        sha256(b"something"),
        b"kernel_cmdline: root=/dev/sda\0".to_vec(),
    );
    let message = verdict(&boot.policy(), &forged).unwrap_err().message;
    assert!(message.contains("(PCR 8, EV_IPL)"), "{message}");
}

/// A real log (testdata/event_logs, from go-attestation and keylime), decoded as the node sends it.
pub(super) fn real_log(name: &str) -> EventLog {
    let path = format!("{}/../testdata/event_logs/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap();
    let bytes = if name.ends_with(".b64") {
        use base64::Engine;
        let text: String = String::from_utf8(bytes).unwrap().split_whitespace().collect();
        base64::engine::general_purpose::STANDARD.decode(text).unwrap()
    } else {
        bytes
    };
    crate::tpm::event_log::parse(&bytes).unwrap()
}

/// The policy a real boot's own measurements make ([`crate::tpm::boot_policy::from_log`]), as
/// YAML; `None` when PCR 4 ran no application.
pub(super) fn own_policy(log: &EventLog) -> Option<String> {
    let document = crate::tpm::boot_policy::from_log::policy_from_log(log, "real").ok()?;
    Some(serde_yaml::to_string(&document).unwrap())
}

/// [`own_policy`] with Secure Boot as given.
pub(super) fn policy_of(log: &EventLog, secure_boot: &str) -> String {
    let mut document = crate::tpm::boot_policy::from_log::policy_from_log(log, "real").unwrap();
    document.secure_boot = serde_yaml::from_str(secure_boot).unwrap();
    serde_yaml::to_string(&document).unwrap()
}

/// `policy` (YAML) with its image's command line changed by `change`.
fn with_command_line(policy: &str, change: impl Fn(&str) -> String) -> String {
    let mut document: crate::tpm::boot_policy::PolicyDocument = serde_yaml::from_str(policy).unwrap();
    let line = document.images[0].command_line.as_deref().unwrap();
    document.images[0].command_line = Some(change(line));
    serde_yaml::to_string(&document).unwrap()
}

/// Every real UEFI log of `testdata/event_logs` with a SHA-256 bank.
pub(super) const REAL_LOGS: [&str; 15] = [
    "keylime_mb_log.b64",
    "keylime_binary_bios_measurements-secureboot",
    "keylime_binary_bios_measurements",
    "coreos_36_shielded_vm_no_secure_boot_eventlog",
    "ubuntu_2104_shielded_vm_no_secure_boot_eventlog",
    "sb_cert_eventlog",
    "crypto_agile_eventlog",
    "go_tpm_tools_arch_linux_workstation_systemd_boot_eventlog",
    "go_tpm_tools_gdc_host_ubuntu_efistub_eventlog",
    "go_tpm_tools_ubuntu_2404_amd_sevsnp_eventlog",
    "go_tpm_tools_rhel8_gce_eventlog",
    "keylime_uefi_eventlog_rhcos_eventlog",
    "keylime_uefi_eventlog_rhel84_netboot_eventlog",
    "tpm2_tools_rhel9_moklisttrusted_eventlog",
    "tpm2_tools_fedora37_sd_boot_eventlog",
];

#[test]
fn every_real_boot_matches_the_policy_its_own_measurements_make() {
    let mut accepted = Vec::new();
    for name in REAL_LOGS {
        let log = real_log(name);
        let Some(text) = own_policy(&log) else {
            // The firmware logged no boot application: no image can be named.
            let message = verdict_on(&policy_of(&real_log(REAL_LOGS[0]), "optional"), &log).unwrap_err();
            assert!(message.contains("PCR 4 holds no boot application"), "{name}: {message}");
            continue;
        };
        let policy = BootPolicy::parse(&text).unwrap();
        let verdict = judge(&policy, &log, HashAlg::Sha256, &QUOTED);
        assert!(verdict.is_ok(), "{name}: {verdict:?}\n{text}");
        accepted.push(name);
        if text.contains("commandLine") {
            let other = BootPolicy::parse(&with_command_line(&text, |l| format!("init=/bin/sh {l}"))).unwrap();
            let message = judge(&other, &log, HashAlg::Sha256, &QUOTED).unwrap_err().message;
            assert!(
                message.contains("command line") || message.contains("load options"),
                "{name}: {message}"
            );
        }
        if text.contains("secureBoot: optional") {
            let required = BootPolicy::parse(&text.replace("secureBoot: optional", "secureBoot: required")).unwrap();
            let message = judge(&required, &log, HashAlg::Sha256, &QUOTED).unwrap_err().message;
            assert!(message.contains("Secure Boot is off"), "{name}: {message}");
        }
    }
    assert_eq!(accepted.len(), REAL_LOGS.len() - 1, "{accepted:?}");
}

fn verdict_on(policy: &str, log: &EventLog) -> Result<BootVerdict, String> {
    judge(&BootPolicy::parse(policy).unwrap(), log, HashAlg::Sha256, &QUOTED).map_err(|r| r.message)
}

#[test]
fn real_shim_and_grub_boots_match_the_policy_their_files_give() {
    for (name, secure_boot) in [
        ("keylime_mb_log.b64", "required"),
        ("keylime_binary_bios_measurements-secureboot", "required"),
        ("coreos_36_shielded_vm_no_secure_boot_eventlog", "optional"),
    ] {
        let log = real_log(name);
        let text = policy_of(&log, secure_boot);
        let policy = BootPolicy::parse(&text).unwrap();
        let verdict = judge(&policy, &log, HashAlg::Sha256, &QUOTED);
        assert!(verdict.is_ok(), "{name}: {verdict:?}\n{text}");
        // Another command line is refused, naming grub's event.
        let other = BootPolicy::parse(&with_command_line(&text, |l| format!("init=/bin/sh {l}"))).unwrap();
        let message = judge(&other, &log, HashAlg::Sha256, &QUOTED).unwrap_err().message;
        assert!(message.contains("(PCR 8, EV_IPL): command line"), "{name}: {message}");
    }
    let refused = judge(
        &BootPolicy::parse(&policy_of(
            &real_log("coreos_36_shielded_vm_no_secure_boot_eventlog"),
            "required",
        ))
        .unwrap(),
        &real_log("coreos_36_shielded_vm_no_secure_boot_eventlog"),
        HashAlg::Sha256,
        &QUOTED,
    )
    .unwrap_err()
    .message;
    assert!(refused.contains("Secure Boot is off"), "{refused}");
}

#[path = "judge_property_tests.rs"]
mod property;

/// UTF-16LE with its NUL: systemd-boot's and the firmware's load options.
fn utf16(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).chain([0, 0]).collect()
}

fn policy_with(boot: &Boot, bootloaders: &[&[u8]], command_line: &str) -> String {
    let hex = |d: &[u8]| crate::digest::hex(d);
    format!(
        "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nimages:\n  - name: image\n    bootloaders: [{}]\n    kernel: {}\n    initrd: {}\n    commandLine: \"{command_line}\"\n",
        bootloaders.iter().map(|d| hex(d)).collect::<Vec<_>>().join(", "),
        hex(&boot.kernel),
        hex(&boot.initrd),
    )
}

#[test]
fn rhel_family_grub_forms_are_read() {
    let boot = Boot::default();
    let line = "BOOT_IMAGE=(hd0,gpt2)/vmlinuz-4.18.0-553.el8_10.x86_64 root=/dev/mapper/rhel-root ro";
    let log = boot
        .firmware(1)
        .application(&boot.shim)
        .application(&boot.grub)
        .grub(
            "grub_cmd ",
            "linuxefi (hd0,gpt2)/vmlinuz-4.18.0-553.el8_10.x86_64 root=/dev/mapper/rhel-root ro",
        )
        .grub("grub_kernel_cmdline ", line)
        .file("(hd0,gpt2)/vmlinuz-4.18.0-553.el8_10.x86_64", &sha256(b"vmlinuz file"))
        .application(&boot.kernel)
        .grub(
            "grub_cmd ",
            "initrdefi (hd0,gpt2)/initramfs-4.18.0-553.el8_10.x86_64.img",
        )
        .file("(hd0,gpt2)/initramfs-4.18.0-553.el8_10.x86_64.img", &boot.initrd);
    let policy = policy_with(&boot, &[&boot.shim, &boot.grub], line);
    let summary = verdict(&policy, &log).unwrap().summary;
    assert!(
        summary.ends_with("(3 boot applications, command line, initrd)"),
        "{summary}"
    );
    let other = policy_with(&boot, &[&boot.shim, &boot.grub], "root=/dev/evil ro");
    refused(
        &other,
        &log,
        &["(PCR 8, EV_IPL): command line", "root=/dev/mapper/rhel-root"],
    );
    // A rewritten legacy string is refused like an upstream one.
    let forged = boot
        .firmware(1)
        .application(&boot.shim)
        .application(&boot.grub)
        .grub("grub_cmd ", "linuxefi /vmlinuz root=/dev/sda")
        .raw(
            8,
            event_type::IPL,
            sha256(b"init=/bin/sh"),
            format!("grub_kernel_cmdline {line}\0").into_bytes(),
        )
        .application(&boot.kernel);
    refused(
        &policy,
        &forged,
        &["(PCR 8, EV_IPL): its digest does not cover its text"],
    );
}

#[test]
fn systemd_boot_and_the_linux_stub_are_read() {
    let boot = Boot::default();
    let sd_boot = sha256(b"systemd-bootx64.efi");
    let line = "root=UUID=1234 ro quiet";
    let tags = |log: LogBuilder, options: &str, initrd: &[u8]| {
        log.stub(
            LINUX_LOAD_OPTIONS_TAG,
            "LOADED_IMAGE::LoadOptions",
            sha256(&utf16(options)),
        )
        .stub(LINUX_INITRD_TAG, "Linux initrd", initrd.to_vec())
    };
    let booted = |options: &str| {
        boot.firmware(1)
            .application(&sd_boot)
            .measured(8, event_type::IPL, &utf16(options))
            .application(&boot.kernel)
    };
    let policy = policy_with(&boot, &[&sd_boot], line);
    let summary = verdict(&policy, &tags(booted(line), line, &boot.initrd))
        .unwrap()
        .summary;
    assert!(
        summary.ends_with("(2 boot applications, command line, initrd)"),
        "{summary}"
    );
    // An older kernel: systemd-boot's PCR 8 options alone.
    let no_initrd = policy
        .lines()
        .filter(|l| !l.contains("initrd"))
        .map(|l| format!("{l}\n"))
        .collect::<String>();
    assert!(verdict(&no_initrd, &booted(line)).is_ok());
    refused(&policy, &booted(line), &["no initrd is measured"]);
    refused(
        &policy,
        &tags(booted("root=UUID=1234 ro init=/bin/sh"), line, &boot.initrd),
        &["(PCR 8, EV_IPL): command line \"root=UUID=1234 ro init=/bin/sh\""],
    );
    refused(
        &policy,
        &tags(booted(line), line, &boot.initrd).measured(8, event_type::IPL, &utf16(line)),
        &["systemd-boot's load options measured a second time"],
    );
    refused(
        &policy,
        &tags(booted(line), line, &boot.initrd).stub(LINUX_INITRD_TAG, "Linux initrd", boot.initrd.clone()),
        &["(PCR 9, EV_EVENT_TAG): the Linux EFI stub's initrd measured a second time"],
    );
    refused(
        &policy,
        &tags(booted(line), line, &boot.initrd).file("/evil", &sha256(b"evil")),
        &[
            "(PCR 9, EV_IPL): a file read in PCR 9",
            "without grub's commands in PCR 8",
        ],
    );
    // grub's strings and systemd-boot's options are two boot paths.
    refused(
        &policy,
        &tags(booted(line).grub("grub_cmd: ", "echo"), line, &boot.initrd),
        &["systemd-boot's load options in a PCR 8 that grub measured"],
    );

    // A unified kernel image started by the firmware: the stub's PCR 9 events alone.
    let uki = sha256(b"uki.efi");
    let log = tags(
        boot.firmware(1).application(&boot.shim).application(&uki),
        line,
        &boot.initrd,
    );
    let policy = policy_with(
        &Boot {
            kernel: uki.clone(),
            ..Boot::default()
        },
        &[&boot.shim],
        line,
    );
    assert!(verdict(&policy, &log).is_ok());

    // grub booting a kernel whose stub measures too: both agree with the image.
    let both = tags(
        boot.through_grub(),
        &format!("BOOT_IMAGE={}", boot.command_line),
        &boot.initrd,
    );
    assert!(verdict(&boot.policy(), &both).is_ok());
    refused(
        &boot.policy(),
        &tags(boot.through_grub(), "BOOT_IMAGE=/vmlinuz root=/dev/evil", &boot.initrd),
        &[
            "(PCR 9, EV_EVENT_TAG): the kernel's load options",
            "are not the command line the loader measured at event",
        ],
    );
    // The kernel's path is grub's name for the file, not the kernel: a policy's command line
    // matches whatever device grub named.
    let elsewhere = boot.policy().replace(
        "commandLine: \"/vmlinuz-6.1.0-28-amd64 ",
        "commandLine: \"(hd0,gpt2)/vmlinuz-6.1.0-28-amd64 ",
    );
    assert_ne!(elsewhere, boot.policy());
    assert!(verdict(&elsewhere, &both).is_ok());
    let evil_stub = tags(
        boot.through_grub(),
        &format!("BOOT_IMAGE={}", boot.command_line),
        &sha256(b"evil"),
    );
    refused(&boot.policy(), &evil_stub, &["(PCR 9, EV_EVENT_TAG): initrd sha256"]);
    // A file grub reads after the stub ran is no step of either.
    refused(
        &boot.policy(),
        &both.file("/late", &sha256(b"late")),
        &["a file read in PCR 9 after the Linux EFI stub ran"],
    );
}

#[test]
fn an_error_separator_or_one_typed_elsewhere_is_refused() {
    let boot = Boot::default();
    let error = boot
        .firmware(1)
        .raw(4, event_type::SEPARATOR, sha256(&[0xff; 4]), vec![0xff; 4]);
    // The firmware's separator in PCR 4 is the first with the value: here the normal one, so
    // the error one is a second separator.
    refused(
        &boot.policy(),
        &error,
        &["(PCR 4, EV_SEPARATOR): a second separator in PCR 4"],
    );
    let only_error = LogBuilder::default()
        .variable(EFI_GLOBAL_VARIABLE, "SecureBoot", &[1])
        .variable(EFI_GLOBAL_VARIABLE, "PK", b"pk")
        .variable(EFI_GLOBAL_VARIABLE, "KEK", b"kek")
        .variable(EFI_IMAGE_SECURITY_DATABASE, "db", b"db")
        .variable(EFI_IMAGE_SECURITY_DATABASE, "dbx", &boot.dbx)
        .raw(7, event_type::SEPARATOR, sha256(&[0xff; 4]), vec![0xff; 4]);
    refused(
        &boot.policy(),
        &only_error,
        &["(PCR 7, EV_SEPARATOR): the firmware logged an error separator"],
    );
    let mislabelled = boot
        .firmware(1)
        .raw(4, event_type::SEPARATOR, sha256(b"not a separator"), vec![0; 4]);
    refused(
        &boot.policy(),
        &mislabelled,
        &["(PCR 4, EV_SEPARATOR): a second separator in PCR 4"],
    );
}

#[test]
fn the_signers_floor_requires_secure_boot_whatever_the_policy_says() {
    let boot = Boot::default();
    let optional = boot
        .policy()
        .replace("kind: TpmBootPolicy\n", "kind: TpmBootPolicy\nsecureBoot: optional\n");
    let off = Boot::default().through_grub();
    let mut log = off.log();
    // Secure Boot off in the firmware's variable.
    let at = log
        .events
        .iter()
        .position(|e| e.pcr == 7 && e.data.ends_with(b"\x01") && e.data.len() == 53)
        .unwrap();
    let off_data = crate::tpm::event_log::events::encode::variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", &[0]);
    log.events[at].digests = vec![(HashAlg::Sha256, sha256(&off_data))];
    log.events[at].data = off_data;
    let policy = BootPolicy::parse(&optional).unwrap();
    assert!(judge(&policy, &log, HashAlg::Sha256, &QUOTED).is_ok());
    let floored = policy.with_secure_boot_floor();
    let message = judge(&floored, &log, HashAlg::Sha256, &QUOTED).unwrap_err().message;
    assert!(
        message.contains("Secure Boot is off and the signer's floor requires it (--tpm-require-secure-boot)"),
        "{message}"
    );
}

#[test]
fn a_rollouts_other_image_does_not_refuse_the_boot_by_its_kernel_file() {
    // Secure Boot off: grub loads the kernel itself, so PCR 4 holds shim and grub only and both
    // images stay candidates until grub's files tell them apart by their kernel files.
    let boot = Boot::default();
    let log = boot
        .firmware(0)
        .application(&boot.shim)
        .application(&boot.grub)
        .grub("grub_cmd: ", "linux /vmlinuz-new root=UUID=1234 ro quiet")
        .file("/vmlinuz-new", &sha256(b"new kernel file"))
        .grub("kernel_cmdline: ", "/vmlinuz-new root=UUID=1234 ro quiet")
        .grub("grub_cmd: ", "initrd /initrd.img-new")
        .file("/initrd.img-new", &sha256(b"new initrd"));
    let hex = |d: &[u8]| crate::digest::hex(d);
    let image = |name: &str, kernel_file: &[u8], initrd: &[u8]| {
        format!(
            "  - name: {name}\n    bootloaders: [{}]\n    kernel: {}\n    kernelFile: {}\n    initrd: {}\n    commandLine: \"/vmlinuz root=UUID=1234 ro quiet\"\n",
            hex(&boot.shim),
            hex(&boot.grub),
            hex(kernel_file),
            hex(initrd)
        )
    };
    let policy = format!(
        "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nsecureBoot: optional\nimages:\n{}{}",
        image("old", &sha256(b"old kernel file"), &sha256(b"old initrd")),
        image("new", &sha256(b"new kernel file"), &sha256(b"new initrd"))
    );
    assert_eq!(verdict(&policy, &log).unwrap().image, "new");
    let only_old = format!(
        "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nsecureBoot: optional\nimages:\n{}",
        image("old", &sha256(b"old kernel file"), &sha256(b"old initrd"))
    );
    refused(&only_old, &log, &["PCR 9 holds no file of the kernel file's digest"]);
}
