//! The policy a boot's own measurements make: read from a known-good node's event log, the
//! image entry that boot matches (PCR 4's applications after the separator, the last one the
//! kernel; grub's, RHEL-family grub's or systemd-boot's command line; the kernel file grub read;
//! grub's initrd file or the Linux stub's). What `kubelet-authenticator boot-policy` computes
//! from an image's files, computed from a boot instead, so the two can be compared, and the
//! judge's tests can hold every real log to its own boot.
//!
//! The log is not trusted here: a policy made from it allows what that node booted, so take the
//! log from a node you trust (or check it against `boot-policy`'s output).

use super::{API_VERSION, ImageDocument, KIND, PolicyDocument, SecureBoot};
use crate::tpm::event_log::events::LINUX_INITRD_TAG;
use crate::tpm::event_log::{Event, EventLog, HashAlg, event_type, secure_boot};

/// The image entry `log`'s boot matches, named `name`.
pub fn image_from_log(log: &EventLog, name: &str) -> Result<ImageDocument, String> {
    let separated = log
        .events
        .iter()
        .any(|e| e.pcr == 4 && e.event_type == event_type::SEPARATOR);
    let apps = log
        .events
        .iter()
        .filter(|e| e.pcr == 4)
        .skip_while(|e| separated && e.event_type != event_type::SEPARATOR)
        .filter(|e| e.event_type == event_type::EFI_BOOT_SERVICES_APPLICATION)
        .map(sha256)
        .collect::<Result<Vec<_>, _>>()?;
    let (kernel, bootloaders) = apps
        .split_last()
        .ok_or("PCR 4 ran no boot application after its separator: the log names no kernel")?;
    let pcr8: Vec<String> = log.events.iter().filter(|e| e.pcr == 8).map(text).collect();
    let after = |prefixes: &[&str]| {
        pcr8.iter()
            .find_map(|t| prefixes.iter().find_map(|p| t.strip_prefix(p)).map(str::to_owned))
    };
    let command_line = after(&["kernel_cmdline: ", "grub_kernel_cmdline "]).or_else(|| {
        log.events
            .iter()
            .filter(|e| e.pcr == 8 && e.event_type == event_type::IPL)
            .find_map(systemd_boot_options)
    });
    let kernel_path = after(&["grub_cmd: linux ", "grub_cmd linux ", "grub_cmd linuxefi "])
        .and_then(|t| t.split_whitespace().next().map(str::to_owned));
    let files: Vec<&Event> = log
        .events
        .iter()
        .filter(|e| e.pcr == 9 && e.event_type == event_type::IPL)
        .collect();
    let kernel_file = match kernel_path {
        Some(path) => files
            .iter()
            .rfind(|e| text(e) == path || text(e) == "grub_linuxefi Kernel")
            .map(|e| sha256(e))
            .transpose()?,
        None => None,
    };
    let grub_initrd = pcr8
        .iter()
        .any(|t| t.starts_with("grub_cmd: initrd ") || t.starts_with("grub_cmd initrd"));
    let initrd = if grub_initrd {
        files.last().map(|e| sha256(e)).transpose()?
    } else {
        log.events
            .iter()
            .find(|e| {
                e.pcr == 9
                    && e.event_type == event_type::EVENT_TAG
                    && e.data.starts_with(&LINUX_INITRD_TAG.to_le_bytes())
            })
            .map(sha256)
            .transpose()?
    };
    Ok(ImageDocument {
        name: name.to_owned(),
        bootloaders: bootloaders.to_vec(),
        kernel: kernel.clone(),
        kernel_file,
        initrd,
        command_line,
    })
}

/// The policy of `log`'s boot alone: its image, and Secure Boot required when the firmware
/// measured it on.
pub fn policy_from_log(log: &EventLog, name: &str) -> Result<PolicyDocument, String> {
    let on = secure_boot(log, HashAlg::Sha256).map_err(|e| e.to_string())? == Some(true);
    Ok(PolicyDocument {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        secure_boot: if on { SecureBoot::Required } else { SecureBoot::Optional },
        authorities: Vec::new(),
        dbx: Vec::new(),
        images: vec![image_from_log(log, name)?],
    })
}

fn sha256(event: &Event) -> Result<String, String> {
    event.digest(HashAlg::Sha256).map(crate::digest::hex).ok_or_else(|| {
        format!(
            "{}: no sha256 digest (the policy's digests are SHA-256)",
            event.describe()
        )
    })
}

/// An event's data as text, without its NUL (lossy: for matching grub's strings).
fn text(event: &Event) -> String {
    String::from_utf8_lossy(event.data.strip_suffix(&[0]).unwrap_or(&event.data)).into_owned()
}

/// systemd-boot's UTF-16LE load options, without the NUL (old ones log the NUL a byte short).
fn systemd_boot_options(event: &Event) -> Option<String> {
    if event.data.get(1) != Some(&0) {
        return None;
    }
    let units: Vec<u16> = event
        .data
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c.get(1).copied().unwrap_or(0)]))
        .collect();
    String::from_utf16(&units)
        .ok()
        .map(|t| t.trim_end_matches('\0').to_owned())
}
