//! The boot policy's rules, judged on a parsed event log whose replay in `alg` the caller has
//! already checked against the quote (a log that does not match the quote proves nothing).
//!
//! Each rule reads the events of one PCR the quote covers, and a refusal names the first event
//! that fails (`event 23 (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION): ...`):
//!
//! - Secure Boot (`secureBoot: required`): PCR 7's `EV_EFI_VARIABLE_DRIVER_CONFIG` `SecureBoot`
//!   variable is 1.
//! - `dbx` (when listed): PCR 7's `dbx` variable's SHA-256 is one of them.
//! - `authorities` (when listed): every PCR 7 `EV_EFI_VARIABLE_AUTHORITY` certificate's SHA-256
//!   is one of them (shim's `SbatLevel`, measured as an authority, is not a certificate and is
//!   left to shim).
//! - The image: PCR 4's `EV_EFI_BOOT_SERVICES_APPLICATION` digests after PCR 4's separator are
//!   one image's bootloaders then its kernel, nothing else in PCR 4 after the separator but the
//!   firmware's boot-attempt actions; then that image's command line (grub's PCR 8
//!   `kernel_cmdline: ` or the Linux EFI stub's PCR 9 load options) and initrd (the PCR 9 files
//!   grub's last `initrd` command read, or the stub's PCR 9 initrd), where the image gives them.

use super::{BootPolicy, Image, SecureBoot, Sha256Digest, short_hex};
use crate::tpm::event_log::events::{EFI_GLOBAL_VARIABLE, EFI_IMAGE_SECURITY_DATABASE, image_path, ipl_label};
use crate::tpm::event_log::{
    Event, EventLog, EventLogError, HashAlg, LinuxStubEvent, authority_certificates, efi_variable, event_type,
    ipl_text, linux_stub_event,
};

/// PCRs a policy reads; the quote must cover them all.
pub const POLICY_PCRS: [u32; 4] = [4, 7, 8, 9];

/// The actions EDK2 logs in PCR 4 around each boot attempt (`Tcg2Dxe` `OnReadyToBoot`).
const BOOT_ATTEMPT_ACTIONS: [&[u8]; 2] = [
    b"Calling EFI Application from Boot Option",
    b"Returning from EFI Application from Boot Option",
];

/// The boot matched the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootVerdict {
    /// The image it matched.
    pub image: String,
    /// What was checked, for the rule's note.
    pub summary: String,
}

/// The boot did not match the policy: the message names the first event that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BootRefusal {
    /// Why, naming the event.
    pub message: String,
}

fn refuse(message: impl Into<String>) -> BootRefusal {
    BootRefusal {
        message: message.into(),
    }
}

impl From<EventLogError> for BootRefusal {
    fn from(e: EventLogError) -> Self {
        refuse(e.to_string())
    }
}

/// Judges `policy` on `log`, whose replay in `alg` gave the quoted values of `selection` (the
/// quote's PCR indices in that bank).
pub fn judge(policy: &BootPolicy, log: &EventLog, alg: HashAlg, selection: &[u32]) -> Result<BootVerdict, BootRefusal> {
    let missing: Vec<u32> = POLICY_PCRS.into_iter().filter(|p| !selection.contains(p)).collect();
    if !missing.is_empty() {
        return Err(refuse(format!(
            "the quote does not cover PCRs {missing:?}: a boot policy reads PCRs 4, 7, 8 and 9 (quoted {selection:?})"
        )));
    }
    if alg != HashAlg::Sha256 {
        return Err(refuse(format!(
            "the quote is of the {alg} bank: the policy's digests are SHA-256 (allocate the TPM's SHA-256 PCR bank)"
        )));
    }
    let mut checked = Vec::new();
    if policy.secure_boot == SecureBoot::Required {
        secure_boot_enabled(log, alg)?;
        checked.push("Secure Boot on".to_owned());
    }
    if !policy.dbx.is_empty() {
        dbx_allowed(log, alg, &policy.dbx)?;
        checked.push("dbx allowed".to_owned());
    }
    if !policy.authorities.is_empty() {
        let count = authorities_allowed(log, alg, &policy.authorities)?;
        checked.push(format!("{count} authorities allowed"));
    }
    let candidates: Vec<&Image> = policy.images.iter().collect();
    let (candidates, apps) = boot_applications(log, alg, candidates)?;
    let candidates = command_line(log, alg, candidates)?;
    let image = initrd(log, alg, candidates)?;
    let mut what = format!("{apps} boot applications");
    if image.command_line.is_some() {
        what.push_str(", command line");
    }
    if image.initrd.is_some() {
        what.push_str(", initrd");
    }
    checked.push(format!("image {} ({what})", image.name));
    Ok(BootVerdict {
        image: image.name.clone(),
        summary: checked.join(", "),
    })
}

/// Events of `pcr`, in log order, that extend it (`EV_NO_ACTION` never does).
fn of_pcr(log: &EventLog, pcr: u32) -> impl Iterator<Item = &Event> {
    log.events
        .iter()
        .filter(move |e| e.pcr == pcr && e.event_type != event_type::NO_ACTION)
}

fn secure_boot_enabled(log: &EventLog, alg: HashAlg) -> Result<(), BootRefusal> {
    let mut seen = false;
    for event in of_pcr(log, 7).filter(|e| e.event_type == event_type::EFI_VARIABLE_DRIVER_CONFIG) {
        let Some(variable) = efi_variable(event, alg)? else {
            continue;
        };
        if variable.name != "SecureBoot" || variable.guid != EFI_GLOBAL_VARIABLE {
            continue;
        }
        if variable.data != [1] {
            return Err(refuse(format!(
                "{}: SecureBoot is {:?}, not 1: Secure Boot is off and the policy requires it (secureBoot: required)",
                event.describe(),
                variable.data
            )));
        }
        seen = true;
    }
    if seen {
        Ok(())
    } else {
        Err(refuse(
            "PCR 7 measures no SecureBoot variable: Secure Boot cannot be shown on, and the policy requires it (secureBoot: required)",
        ))
    }
}

fn dbx_allowed(log: &EventLog, alg: HashAlg, allowed: &[Sha256Digest]) -> Result<(), BootRefusal> {
    let mut seen = false;
    for event in of_pcr(log, 7).filter(|e| e.event_type == event_type::EFI_VARIABLE_DRIVER_CONFIG) {
        let Some(variable) = efi_variable(event, alg)? else {
            continue;
        };
        if variable.name != "dbx" || variable.guid != EFI_IMAGE_SECURITY_DATABASE {
            continue;
        }
        let digest = HashAlg::Sha256.digest(&variable.data);
        if !allowed.iter().any(|a| a.is(&digest)) {
            return Err(refuse(format!(
                "{}: dbx of {} bytes, sha256 {}, is none of the policy's dbx contents",
                event.describe(),
                variable.data.len(),
                short_hex(&digest)
            )));
        }
        seen = true;
    }
    if seen {
        Ok(())
    } else {
        Err(refuse(
            "PCR 7 measures no dbx variable, and the policy lists the dbx contents it allows",
        ))
    }
}

fn authorities_allowed(log: &EventLog, alg: HashAlg, allowed: &[Sha256Digest]) -> Result<usize, BootRefusal> {
    let mut count = 0;
    for event in of_pcr(log, 7).filter(|e| e.event_type == event_type::EFI_VARIABLE_AUTHORITY) {
        let Some(variable) = efi_variable(event, alg)? else {
            continue;
        };
        // shim's SBAT generation, measured as an authority: text, not a certificate.
        if variable.name == "SbatLevel" {
            continue;
        }
        for signature in authority_certificates(event, alg)?.unwrap_or_default() {
            let digest = HashAlg::Sha256.digest(&signature.data);
            if !allowed.iter().any(|a| a.is(&digest)) {
                return Err(refuse(format!(
                    "{}: {} authority sha256 {} is none of the policy's authorities",
                    event.describe(),
                    variable.name,
                    short_hex(&digest)
                )));
            }
            count += 1;
        }
    }
    Ok(count)
}

fn names(images: &[&Image]) -> String {
    let mut names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    if names.len() > 3 {
        let more = names.len() - 3;
        names.truncate(3);
        return format!("images {} and {more} more", names.join(", "));
    }
    match names.as_slice() {
        [one] => format!("image {one}"),
        _ => format!("images {}", names.join(", ")),
    }
}

/// PCR 4 after its separator: the images whose chain the boot applications are, and how many.
fn boot_applications<'p>(
    log: &EventLog,
    alg: HashAlg,
    mut candidates: Vec<&'p Image>,
) -> Result<(Vec<&'p Image>, usize), BootRefusal> {
    let mut pcr4 = of_pcr(log, 4).skip_while(|e| e.event_type != event_type::SEPARATOR);
    let Some(separator) = pcr4.next() else {
        return Err(refuse(
            "PCR 4 has no separator: the firmware never handed over to a boot loader in this log",
        ));
    };
    let mut position = 0;
    let mut last = separator;
    for event in pcr4 {
        if event.event_type == event_type::EFI_ACTION
            && BOOT_ATTEMPT_ACTIONS.contains(&event.data.as_slice())
            && event.digest(alg) == Some(alg.digest(&event.data).as_slice())
        {
            continue;
        }
        if event.event_type != event_type::EFI_BOOT_SERVICES_APPLICATION {
            return Err(refuse(format!(
                "{}: unexpected in PCR 4 after its separator, where only the image's boot applications may be",
                event.describe()
            )));
        }
        let digest = event
            .digest(alg)
            .ok_or_else(|| refuse(format!("{}: no {alg} digest", event.describe())))?;
        let matching: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|image| image.chain().nth(position).is_some_and(|d| d.is(digest)))
            .collect();
        if matching.is_empty() {
            let kernels = candidates.iter().filter(|i| i.bootloaders.len() == position).count();
            let role = match (kernels, candidates.len()) {
                (0, _) if candidates.iter().all(|i| i.bootloaders.len() < position) => {
                    "expected after the kernel: the policy's images end with their kernel".to_owned()
                }
                (k, n) if k == n => "none of the policy's kernels".to_owned(),
                (0, _) => format!("none of the policy's bootloaders at position {}", position + 1),
                _ => format!(
                    "none of the policy's bootloaders at position {} or kernels",
                    position + 1
                ),
            };
            let role = if role.starts_with("expected") {
                format!("is not {role}")
            } else {
                format!("is {role}")
            };
            let path = image_path(event).map(|p| format!(" {p}")).unwrap_or_default();
            return Err(refuse(format!(
                "{}: Authenticode {alg} {}{path} {role} ({})",
                event.describe(),
                short_hex(digest),
                names(&candidates)
            )));
        }
        candidates = matching;
        position += 1;
        last = event;
    }
    let complete: Vec<&Image> = candidates
        .iter()
        .copied()
        .filter(|image| image.chain().count() == position)
        .collect();
    if complete.is_empty() {
        return Err(refuse(format!(
            "{}: the last PCR 4 boot application, after {position}; {} expects more (its kernel {})",
            last.describe(),
            names(&candidates),
            candidates.first().map_or_else(String::new, |i| i.kernel.short())
        )));
    }
    Ok((complete, position))
}

/// The command line without grub's `BOOT_IMAGE=` (what `/proc/cmdline` shows and the load
/// options carry; grub's `kernel_cmdline:` leaves it out).
fn bare(command_line: &str) -> &str {
    command_line.strip_prefix("BOOT_IMAGE=").unwrap_or(command_line)
}

/// The load options as the stub measures them, UTF-16LE, with or without the terminating NUL
/// and the `BOOT_IMAGE=` grub adds.
fn load_options_digests(alg: HashAlg, command_line: &str) -> Vec<Vec<u8>> {
    let bare = bare(command_line);
    let mut out = Vec::new();
    for text in [bare.to_owned(), format!("BOOT_IMAGE={bare}")] {
        let utf16: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        out.push(alg.digest(&utf16));
        let mut terminated = utf16;
        terminated.extend_from_slice(&[0, 0]);
        out.push(alg.digest(&terminated));
    }
    out
}

/// The string of one of grub's PCR 8 `EV_IPL` events starting with `prefix` (`kernel_cmdline: `,
/// `grub_cmd: `), without the prefix, when its digest covers it. grub (`commands/tpm.c`,
/// `grub_tpm_verify_string`) logs `prefix + string + NUL` but measures the string alone; a
/// digest of the whole text is accepted too ([`ipl_text`]'s reading).
fn grub_string(event: &Event, alg: HashAlg, prefix: &str) -> Result<Option<String>, BootRefusal> {
    let text = event.data.strip_suffix(&[0]).unwrap_or(&event.data);
    let Some(string) = text.strip_prefix(prefix.as_bytes()) else {
        return Ok(None);
    };
    let digest = event.digest(alg);
    if digest != Some(alg.digest(string).as_slice()) {
        // Not grub's form: whatever the generic view says.
        let whole = ipl_text(event, alg)?.unwrap_or_default();
        return Ok(whole.strip_prefix(prefix).map(str::to_owned));
    }
    let string = std::str::from_utf8(string)
        .map_err(|_| refuse(format!("{}: the {prefix:?} text is not UTF-8", event.describe())))?;
    Ok(Some(string.to_owned()))
}

/// The PCR 9 events the Linux EFI stub tagged `what`.
fn stub_events(log: &EventLog, what: LinuxStubEvent) -> Result<Vec<&Event>, BootRefusal> {
    let mut out = Vec::new();
    for event in of_pcr(log, 9) {
        if linux_stub_event(event)? == Some(what) {
            out.push(event);
        }
    }
    Ok(out)
}

fn command_line<'p>(log: &EventLog, alg: HashAlg, candidates: Vec<&'p Image>) -> Result<Vec<&'p Image>, BootRefusal> {
    if candidates.iter().all(|i| i.command_line.is_none()) {
        return Ok(candidates);
    }
    let mut candidates = candidates;
    let mut measured = false;
    for event in of_pcr(log, 8).filter(|e| e.event_type == event_type::IPL) {
        let Some(text) = grub_string(event, alg, "kernel_cmdline: ")? else {
            continue;
        };
        let text = text.as_str();
        let matching: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|i| i.command_line.as_deref().is_none_or(|c| bare(c) == bare(text)))
            .collect();
        if matching.is_empty() {
            return Err(refuse(format!(
                "{}: command line {:?} is not the one of {}",
                event.describe(),
                crate::identity::truncate(text, 200),
                names(&candidates)
            )));
        }
        candidates = matching;
        measured = true;
    }
    for event in stub_events(log, LinuxStubEvent::LoadOptions)? {
        let Some(digest) = event.digest(alg) else {
            return Err(refuse(format!("{}: no {alg} digest", event.describe())));
        };
        let matching: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|i| {
                i.command_line
                    .as_deref()
                    .is_none_or(|c| load_options_digests(alg, c).iter().any(|d| d == digest))
            })
            .collect();
        if matching.is_empty() {
            return Err(refuse(format!(
                "{}: the kernel's load options ({alg} {}) are not the command line of {}",
                event.describe(),
                short_hex(digest),
                names(&candidates)
            )));
        }
        candidates = matching;
        measured = true;
    }
    if !measured {
        let expecting: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|i| i.command_line.is_some())
            .collect();
        candidates.retain(|i| i.command_line.is_none());
        if candidates.is_empty() {
            return Err(refuse(format!(
                "no kernel command line is measured (grub's PCR 8 kernel_cmdline, the EFI stub's PCR 9 load options), and {} gives one",
                names(&expecting)
            )));
        }
    }
    Ok(candidates)
}

/// The events that measured the initrd: the stub's tagged ones, and the PCR 9 files read after
/// grub's last `initrd` command (PCR 8) until its next command.
fn initrd_events(log: &EventLog, alg: HashAlg) -> Result<Vec<&Event>, BootRefusal> {
    let mut events = stub_events(log, LinuxStubEvent::Initrd)?;
    let mut last_command = None;
    for event in of_pcr(log, 8).filter(|e| e.event_type == event_type::IPL) {
        if let Some(command) = grub_string(event, alg, "grub_cmd: ")?
            && matches!(command.split_whitespace().next(), Some("initrd" | "initrdefi"))
        {
            last_command = Some(event.index);
        }
    }
    if let Some(start) = last_command {
        let end = of_pcr(log, 8)
            .map(|e| e.index)
            .find(|i| *i > start)
            .unwrap_or(usize::MAX);
        events.extend(of_pcr(log, 9).filter(|e| e.index > start && e.index < end && e.event_type == event_type::IPL));
    }
    events.sort_by_key(|e| e.index);
    Ok(events)
}

fn initrd<'p>(log: &EventLog, alg: HashAlg, candidates: Vec<&'p Image>) -> Result<&'p Image, BootRefusal> {
    let mut candidates = candidates;
    if candidates.iter().any(|i| i.initrd.is_some()) {
        let events = initrd_events(log, alg)?;
        for event in &events {
            let Some(digest) = event.digest(alg) else {
                return Err(refuse(format!("{}: no {alg} digest", event.describe())));
            };
            let matching: Vec<&Image> = candidates
                .iter()
                .copied()
                .filter(|i| i.initrd.is_none_or(|d| d.is(digest)))
                .collect();
            if matching.is_empty() {
                let file = ipl_label(event).map(|f| format!(" {f:?}")).unwrap_or_default();
                return Err(refuse(format!(
                    "{}: initrd{file} {alg} {} is not the initrd of {}",
                    event.describe(),
                    short_hex(digest),
                    names(&candidates)
                )));
            }
            candidates = matching;
        }
        if events.is_empty() {
            let expecting: Vec<&Image> = candidates.iter().copied().filter(|i| i.initrd.is_some()).collect();
            candidates.retain(|i| i.initrd.is_none());
            if candidates.is_empty() {
                return Err(refuse(format!(
                    "no initrd is measured (grub's PCR 9 files after its initrd command, the EFI stub's PCR 9 initrd), and {} gives one",
                    names(&expecting)
                )));
            }
        }
    }
    candidates
        .first()
        .copied()
        .ok_or_else(|| refuse("no image of the policy matches"))
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
