//! Real measured boots for the boot-policy suites: the logs of `testdata/event_logs/`, the
//! policy a log's own values make (what the image builder would print for that image), and
//! edits of a log's bytes (another kernel, a changed event).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use attestation::tpm::event_log::{EventLog, HashAlg};
use serde_json::{Value, json};

/// `EV_EFI_BOOT_SERVICES_APPLICATION`: PCR 4's boot applications (shim, grub, a kernel shim
/// verified).
pub const BOOT_APPLICATION: u32 = 0x8000_0003;

/// google/go-attestation's Ubuntu 21.04 Shielded VM log: Secure Boot off, shim and grub in
/// PCR 4 (grub loads the kernel itself, so the kernel file is in PCR 9 only), grub's commands
/// and kernel command line in PCR 8, no StartupLocality event.
pub const UBUNTU_2104: &str = "ubuntu_2104_shielded_vm_no_secure_boot_eventlog";

/// A log of `testdata/event_logs/`.
pub fn read(name: &str) -> Vec<u8> {
    let path = crate::repo_root().join("testdata/event_logs").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// PCR 4's boot applications, SHA-256, in order, each with its event's index: the last one is
/// what a policy calls the kernel.
pub fn boot_applications(log: &EventLog) -> Vec<(usize, Vec<u8>)> {
    log.events
        .iter()
        .filter(|e| e.pcr == 4 && e.event_type == BOOT_APPLICATION)
        .map(|e| (e.index, e.digest(HashAlg::Sha256).expect("a SHA-256 digest").to_vec()))
        .collect()
}

/// grub's `kernel_cmdline: ` text (PCR 8), without the prefix and the NUL.
pub fn command_line(log: &EventLog) -> Option<String> {
    log.events
        .iter()
        .filter(|e| e.pcr == 8)
        .find_map(|e| e.data.strip_prefix(b"kernel_cmdline: "))
        .map(|text| String::from_utf8(text.strip_suffix(b"\0").unwrap_or(text).to_vec()).unwrap())
}

/// The policy's image for `log`'s boot: its boot applications before the last, the last as the
/// kernel, and grub's kernel command line when measured.
pub fn image(name: &str, log: &EventLog) -> Value {
    let apps: Vec<String> = boot_applications(log).iter().map(|(_, d)| hex(d)).collect();
    let (kernel, bootloaders) = apps.split_last().expect("PCR 4 has boot applications");
    let mut image = json!({"name": name, "bootloaders": bootloaders, "kernel": kernel});
    if let Some(line) = command_line(log) {
        image["commandLine"] = json!(line);
    }
    image
}

/// `policy.yaml`, format version 1, with `secure_boot` (`required`, `optional`) and `images`.
pub fn policy(secure_boot: &str, images: &[Value]) -> String {
    serde_yaml::to_string(&json!({
        "apiVersion": "node-attestation.cluster.x-k8s.io/v1",
        "kind": "TpmBootPolicy",
        "secureBoot": secure_boot,
        "images": images,
    }))
    .unwrap()
}

/// `bytes` with the one occurrence of `old` replaced by `new`: a digest edited in place, so the
/// log's structure stays and its replay changes.
pub fn replaced(bytes: &[u8], old: &[u8], new: &[u8]) -> Vec<u8> {
    assert_eq!(old.len(), new.len());
    let at: Vec<usize> = bytes
        .windows(old.len())
        .enumerate()
        .filter(|(_, w)| *w == old)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the digest {} occurs once in the log", hex(old));
    let mut out = bytes.to_vec();
    out[at[0]..at[0] + new.len()].copy_from_slice(new);
    out
}

/// keylime's RHEL 9 log: Secure Boot on, shim, grub (upstream forms), the kernel shim verified,
/// SHA-256 only and no `StartupLocality` (so swtpm can play it).
pub const RHEL9: &str = "keylime_binary_bios_measurements-secureboot";

/// A crypto-agile log as firmware writes it: the `Spec ID Event03` header (the parsed log's
/// first event, its data kept), then every event with the digests it has.
pub fn encode(log: &EventLog) -> Vec<u8> {
    let mut out = Vec::new();
    let (header, events) = log.events.split_first().expect("a header event");
    out.extend(header.pcr.to_le_bytes());
    out.extend(header.event_type.to_le_bytes());
    out.extend([0u8; 20]);
    out.extend(u32::try_from(header.data.len()).unwrap().to_le_bytes());
    out.extend(&header.data);
    for event in events {
        out.extend(event.pcr.to_le_bytes());
        out.extend(event.event_type.to_le_bytes());
        out.extend(u32::try_from(event.digests.len()).unwrap().to_le_bytes());
        for (alg, digest) in &event.digests {
            out.extend(alg.tpm_alg_id().to_le_bytes());
            out.extend(digest);
        }
        out.extend(u32::try_from(event.data.len()).unwrap().to_le_bytes());
        out.extend(&event.data);
    }
    out
}

/// The policy `log`'s own boot makes (`attestation::tpm::boot_policy::from_log`), as YAML, with
/// Secure Boot as the firmware measured it.
pub fn own_policy(log: &EventLog, name: &str) -> String {
    let document = attestation::tpm::boot_policy::from_log::policy_from_log(log, name).unwrap();
    serde_yaml::to_string(&document).unwrap()
}

/// The five forged boots of the revision 5 attack review, each built from a real boot as the
/// attacker's boot would leave its log: the events it relabels or rewrites where the digests do
/// not pin them, and exactly the extends it makes (so the log replays to what the TPM quotes).
pub mod forgery {
    use attestation::tpm::event_log::{Event, EventLog, HashAlg, event_type};

    /// A forged log and the start of the refusal it must get, naming its event.
    pub struct Forgery {
        /// What the attacker did.
        pub what: &'static str,
        /// The log it sends (and whose extends the TPM holds).
        pub log: EventLog,
        /// The refusal's message must contain this (`event N (PCR P, TYPE): ...`).
        pub refusal: String,
    }

    fn sha256(bytes: &[u8]) -> Vec<u8> {
        HashAlg::Sha256.digest(bytes)
    }

    fn event(pcr: u32, event_type: u32, digest: Vec<u8>, data: Vec<u8>) -> Event {
        Event {
            index: 0,
            pcr,
            event_type,
            digests: vec![(HashAlg::Sha256, digest)],
            data,
        }
    }

    /// grub's string as the log shows it, the digest of what grub ran.
    fn grub(shown: &str, ran: &str) -> Event {
        event(
            8,
            event_type::IPL,
            sha256(ran.as_bytes()),
            format!("{shown}\0").into_bytes(),
        )
    }

    fn reindexed(mut log: EventLog) -> EventLog {
        for (i, event) in log.events.iter_mut().enumerate() {
            event.index = i;
        }
        log
    }

    fn position(log: &EventLog, what: impl Fn(&Event) -> bool) -> usize {
        log.events.iter().position(what).expect("the real log has that event")
    }

    /// `UEFI_VARIABLE_DATA` of the `SecureBoot` global variable.
    fn secure_boot_variable(value: u8) -> Vec<u8> {
        let mut out = vec![
            0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c,
        ];
        out.extend(10u64.to_le_bytes());
        out.extend(1u64.to_le_bytes());
        out.extend("SecureBoot".encode_utf16().flat_map(u16::to_le_bytes));
        out.push(value);
        out
    }

    /// The grub string of PCR 8 that starts with `prefix`, without it and its NUL.
    fn grub_text(log: &EventLog, prefix: &str) -> (usize, String) {
        let at = position(log, |e| e.pcr == 8 && e.data.starts_with(prefix.as_bytes()));
        let text = String::from_utf8_lossy(&log.events[at].data)
            .trim_end_matches('\0')
            .trim_start_matches(prefix)
            .to_owned();
        (at, text)
    }

    /// 1. Secure Boot off, the policy requiring it: the firmware's `SecureBoot` = 0 typed
    ///    `EV_POST_CODE`; after boot, PCR 7 extended with `SecureBoot` = 1 typed
    ///    `EV_EFI_VARIABLE_DRIVER_CONFIG`.
    pub fn secure_boot_off(real: &EventLog) -> Forgery {
        let mut log = real.clone();
        let at = position(real, |e| e.pcr == 7 && e.data == secure_boot_variable(1));
        let off = secure_boot_variable(0);
        log.events[at] = event(7, event_type::POST_CODE, sha256(&off), off);
        let on = secure_boot_variable(1);
        log.events
            .push(event(7, event_type::EFI_VARIABLE_DRIVER_CONFIG, sha256(&on), on));
        Forgery {
            what: "Secure Boot off: SecureBoot = 0 typed EV_POST_CODE, SecureBoot = 1 extended after boot",
            log: reindexed(log),
            refusal: format!(
                "event {at} (PCR 7, EV_POST_CODE): not an event the firmware's Secure Boot configuration explains"
            ),
        }
    }

    /// 2. An unlisted application runs first and extends PCR 4 with the approved chain; the log
    ///    types the real separator `EV_POST_CODE` and the application `EV_SEPARATOR`.
    pub fn application_before_the_chain(real: &EventLog) -> Forgery {
        let mut log = real.clone();
        let separator = position(real, |e| e.pcr == 4 && e.event_type == event_type::SEPARATOR);
        log.events[separator].event_type = event_type::POST_CODE;
        log.events.insert(
            separator + 1,
            event(
                4,
                event_type::SEPARATOR,
                sha256(b"an unlisted application"),
                vec![0, 0, 0, 0],
            ),
        );
        Forgery {
            what: "an unlisted application first: the separator typed EV_POST_CODE, the application EV_SEPARATOR",
            log: reindexed(log),
            refusal: format!("event {separator} (PCR 4, EV_POST_CODE): carries the separator value's digest"),
        }
    }

    /// 3. grub.cfg runs a second `initrd /evil.img`; the log rewrites that command's text so it
    ///    no longer starts with `grub_cmd: `, and the good initrd would count as the last.
    pub fn second_initrd_rewritten(real: &EventLog) -> Forgery {
        let (command, _) = grub_text(real, "grub_cmd: initrd ");
        let file = command + 1;
        let mut log = real.clone();
        log.events.insert(
            file + 1,
            grub("echo Loading initial ramdisk ...", "initrd (hd0,gpt2)/evil.img"),
        );
        log.events.insert(
            file + 2,
            event(
                9,
                event_type::IPL,
                sha256(b"evil initrd"),
                b"(hd0,gpt2)/evil.img\0".to_vec(),
            ),
        );
        Forgery {
            what: "a second initrd command, its text rewritten",
            log: reindexed(log),
            refusal: format!("event {} (PCR 8, EV_IPL): neither a grub string", file + 1),
        }
    }

    /// 4. `initrd /initrd.img /evil.cpio`: the evil file's PCR 9 event typed `EV_POST_CODE`.
    pub fn second_initrd_file_relabelled(real: &EventLog) -> Forgery {
        let (command, paths) = grub_text(real, "grub_cmd: initrd ");
        let ran = format!("initrd {paths} (hd0,gpt2)/evil.cpio");
        let mut log = real.clone();
        log.events[command] = grub(&format!("grub_cmd: {ran}"), &ran);
        let file = command + 1;
        log.events.insert(
            file + 1,
            event(9, event_type::POST_CODE, sha256(b"evil cpio"), Vec::new()),
        );
        Forgery {
            what: "initrd with a second file, its PCR 9 event typed EV_POST_CODE",
            log: reindexed(log),
            refusal: format!(
                "event {} (PCR 9, EV_POST_CODE): not an event of a boot path in PCR 9",
                file + 1
            ),
        }
    }

    /// 5. `init=/bin/evil` on the command line: the log rewrites the `kernel_cmdline:` text, and
    ///    after boot root extends PCR 9 with the approved load options labelled as the stub's.
    pub fn command_line_rewritten(real: &EventLog) -> Forgery {
        let (at, approved) = grub_text(real, "kernel_cmdline: ");
        let evil = format!("{approved} init=/bin/evil");
        let mut log = real.clone();
        log.events[at] = grub(&format!("kernel_cmdline: {approved}"), &evil);
        let options: Vec<u8> = format!("BOOT_IMAGE={approved}")
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .chain([0, 0])
            .collect();
        let mut tag = 0x8F3B_22EDu32.to_le_bytes().to_vec();
        tag.extend(26u32.to_le_bytes());
        tag.extend(b"LOADED_IMAGE::LoadOptions\0");
        log.events.push(event(9, event_type::EVENT_TAG, sha256(&options), tag));
        Forgery {
            what: "init=/bin/evil: kernel_cmdline rewritten, the approved load options extended after boot",
            log: reindexed(log),
            refusal: format!("event {at} (PCR 8, EV_IPL): its digest does not cover its text"),
        }
    }

    /// All five, from `real`.
    pub fn all(real: &EventLog) -> Vec<Forgery> {
        vec![
            secure_boot_off(real),
            application_before_the_chain(real),
            second_initrd_rewritten(real),
            second_initrd_file_relabelled(real),
            command_line_rewritten(real),
        ]
    }
}

/// Synthetic measured-boot logs for the boot-policy suites: a crypto-agile SHA-256 log built
/// event by event, as the firmware, shim, grub, systemd-boot and the Linux stub write them.
pub mod synthetic {
    use attestation::tpm::event_log::{EventLog, HashAlg, event_type, parse};

    /// `EFI_GLOBAL_VARIABLE`: `SecureBoot`, `PK`, `KEK`.
    pub const EFI_GLOBAL_VARIABLE: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
    /// `EFI_IMAGE_SECURITY_DATABASE_GUID`: `db`, `dbx`.
    pub const EFI_IMAGE_SECURITY_DATABASE: &str = "d719b2cb-3d3a-4596-a3bc-dad00e67656f";

    fn sha256(bytes: &[u8]) -> Vec<u8> {
        HashAlg::Sha256.digest(bytes)
    }

    /// A log being built: `(pcr, type, digest, data)` per event.
    #[derive(Default, Clone)]
    pub struct Log(Vec<(u32, u32, Vec<u8>, Vec<u8>)>);

    impl Log {
        /// An event with this digest.
        pub fn event(mut self, pcr: u32, kind: u32, digest: Vec<u8>, data: Vec<u8>) -> Self {
            self.0.push((pcr, kind, digest, data));
            self
        }

        /// An event whose digest covers its data.
        pub fn measured(self, pcr: u32, kind: u32, data: &[u8]) -> Self {
            self.event(pcr, kind, sha256(data), data.to_vec())
        }

        /// A PCR 7 `EV_EFI_VARIABLE_DRIVER_CONFIG` (`UEFI_VARIABLE_DATA`).
        pub fn variable(self, guid: &str, name: &str, value: &[u8]) -> Self {
            let hex: String = guid.chars().filter(|c| *c != '-').collect();
            let b: Vec<u8> = (0..16)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("a GUID"))
                .collect();
            let mut data = vec![b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6]];
            data.extend(&b[8..]);
            let name: Vec<u16> = name.encode_utf16().collect();
            data.extend((name.len() as u64).to_le_bytes());
            data.extend((value.len() as u64).to_le_bytes());
            data.extend(name.iter().flat_map(|u| u.to_le_bytes()));
            data.extend(value);
            self.measured(7, event_type::EFI_VARIABLE_DRIVER_CONFIG, &data)
        }

        /// What the firmware measures before any boot application: Secure Boot's five
        /// variables (PCR 7), its boot-manager action (PCR 4) and the separators of PCRs 0-7.
        pub fn firmware(self, secure_boot: u8) -> Self {
            let mut log = self
                .variable(EFI_GLOBAL_VARIABLE, "SecureBoot", &[secure_boot])
                .variable(EFI_GLOBAL_VARIABLE, "PK", b"pk")
                .variable(EFI_GLOBAL_VARIABLE, "KEK", b"kek")
                .variable(EFI_IMAGE_SECURITY_DATABASE, "db", b"db")
                .variable(EFI_IMAGE_SECURITY_DATABASE, "dbx", b"dbx")
                .measured(4, event_type::EFI_ACTION, b"Calling EFI Application from Boot Option");
            for pcr in 0..=7 {
                log = log.measured(pcr, event_type::SEPARATOR, &[0, 0, 0, 0]);
            }
            log
        }

        /// An `EV_EFI_BOOT_SERVICES_APPLICATION`: `UEFI_IMAGE_LOAD_EVENT` with a file path node.
        /// No path: shim's `tpm_log_pe` for what grub has it verify (a NULL device path).
        pub fn application(self, authenticode: Vec<u8>, path: &str) -> Self {
            let mut device_path = Vec::new();
            if !path.is_empty() {
                let name: Vec<u8> = path.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect();
                device_path.extend([0x04, 0x04]);
                device_path.extend(u16::try_from(name.len() + 4).expect("a short path").to_le_bytes());
                device_path.extend(name);
                device_path.extend([0x7f, 0xff, 0x04, 0x00]);
            }
            let mut data = vec![0u8; 24];
            data.extend((device_path.len() as u64).to_le_bytes());
            data.extend(device_path);
            self.event(4, event_type::EFI_BOOT_SERVICES_APPLICATION, authenticode, data)
        }

        /// grub's PCR 8 string: `prefix + text + NUL` logged, `text` measured.
        pub fn grub(self, prefix: &str, text: &str) -> Self {
            self.grub_covering(prefix, text, text.as_bytes())
        }

        /// A PCR 8 grub string whose digest covers `digested` (RHEL-family grub's commands
        /// hash their NUL too).
        pub fn grub_covering(self, prefix: &str, text: &str, digested: &[u8]) -> Self {
            self.event(
                8,
                event_type::IPL,
                sha256(digested),
                format!("{prefix}{text}\0").into_bytes(),
            )
        }

        /// A PCR 9 `EV_IPL`: grub's file read (the name logged, the contents measured), or RHEL
        /// grub's `grub_linuxefi` label.
        pub fn file(self, label: &str, digest: Vec<u8>) -> Self {
            self.event(9, event_type::IPL, digest, format!("{label}\0").into_bytes())
        }

        /// The Linux EFI stub's PCR 9 tagged event.
        pub fn stub(self, tag: u32, label: &str, digest: Vec<u8>) -> Self {
            let label = format!("{label}\0");
            let mut data = tag.to_le_bytes().to_vec();
            data.extend(u32::try_from(label.len()).expect("a short label").to_le_bytes());
            data.extend(label.as_bytes());
            self.event(9, event_type::EVENT_TAG, digest, data)
        }

        /// The log's bytes: the `Spec ID Event03` header, then the events.
        pub fn bytes(&self) -> Vec<u8> {
            let mut spec = b"Spec ID Event03\0".to_vec();
            spec.extend(0u32.to_le_bytes());
            spec.extend([0, 2, 0, 2]);
            spec.extend(1u32.to_le_bytes());
            spec.extend(0x000Bu16.to_le_bytes());
            spec.extend(32u16.to_le_bytes());
            spec.push(0);
            let mut out = Vec::new();
            out.extend(0u32.to_le_bytes());
            out.extend(event_type::NO_ACTION.to_le_bytes());
            out.extend([0u8; 20]);
            out.extend(u32::try_from(spec.len()).expect("a short header").to_le_bytes());
            out.extend(spec);
            for (pcr, kind, digest, data) in &self.0 {
                out.extend(pcr.to_le_bytes());
                out.extend(kind.to_le_bytes());
                out.extend(1u32.to_le_bytes());
                out.extend(0x000Bu16.to_le_bytes());
                out.extend(digest);
                out.extend(u32::try_from(data.len()).expect("a short event").to_le_bytes());
                out.extend(data);
            }
            out
        }

        /// The log, parsed.
        pub fn parsed(&self) -> EventLog {
            parse(&self.bytes()).expect("the log parses")
        }
    }
}
