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
