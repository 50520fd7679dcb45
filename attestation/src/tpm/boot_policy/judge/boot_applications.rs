//! PCR 4, as a whole: the firmware's events up to its separator, then exactly one image's chain
//! of boot applications, in order.
//!
//! - Before the separator: the firmware's boot-manager events, of the types the PC Client
//!   profile gives PCR 4 (an action whose digest covers its text, a boot application the
//!   firmware ran before handing over, as the Lenovo laptop of
//!   `keylime_binary_bios_measurements` does).
//! - Without any separator (GCE's 2019 firmware, `sb_cert_eventlog`) the whole PCR is judged as
//!   what follows one.
//! - After it: `EV_EFI_BOOT_SERVICES_APPLICATION` digests that are one image's bootloaders then
//!   its kernel, no more and no fewer, and the firmware's boot-attempt actions. One tolerated
//!   quirk: the same application measured twice in a row (RHEL-family grub has shim verify the
//!   kernel and the firmware load it: `keylime_mb_log.b64`, events 95 and 96), counted once.

use super::{BootRefusal, names, refuse, separators};
use crate::tpm::boot_policy::{Image, short_hex};
use crate::tpm::event_log::events::image_path;
use crate::tpm::event_log::{Event, EventLog, HashAlg, event_type};

/// The actions EDK2 logs in PCR 4 around each boot attempt (`Tcg2Dxe` `OnReadyToBoot`).
const BOOT_ATTEMPT_ACTIONS: [&[u8]; 2] = [
    b"Calling EFI Application from Boot Option",
    b"Returning from EFI Application from Boot Option",
];

/// The types the firmware may log in PCR 4 before its separator (PC Client PFP 1.05, table 10:
/// boot manager code and boot attempts).
const FIRMWARE_TYPES: [u32; 3] = [
    event_type::EFI_ACTION,
    event_type::EFI_BOOT_SERVICES_APPLICATION,
    event_type::OMIT_BOOT_DEVICE_EVENTS,
];

/// The images whose chain PCR 4 holds, and how many applications it ran.
pub(super) fn judge<'p>(
    log: &EventLog,
    alg: HashAlg,
    mut candidates: Vec<&'p Image>,
) -> Result<(Vec<&'p Image>, usize), BootRefusal> {
    let split = separators::split(log, alg, 4, separators::Missing::JudgedWhole)?;
    for event in &split.before {
        if !FIRMWARE_TYPES.contains(&event.event_type) {
            return Err(refuse(format!(
                "{}: not an event the firmware's boot manager logs in PCR 4 before its separator",
                event.describe()
            )));
        }
        if event.event_type == event_type::EFI_ACTION && !separators::covers(event, alg) {
            return Err(refuse(format!(
                "{}: an action whose digest does not cover its text",
                event.describe()
            )));
        }
    }
    // Each candidate with how far into its chain the boot has come.
    let mut progress: Vec<(&Image, usize)> = candidates.drain(..).map(|image| (image, 0)).collect();
    let mut ran = 0;
    let mut last: Option<&Event> = None;
    for event in &split.after {
        if event.event_type == event_type::EFI_ACTION
            && BOOT_ATTEMPT_ACTIONS.contains(&event.data.as_slice())
            && separators::covers(event, alg)
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
        let repeated = last.is_some_and(|previous| previous.digest(alg) == Some(digest));
        let next: Vec<(&Image, usize)> = progress
            .iter()
            .filter_map(|&(image, at)| {
                if image.chain().nth(at).is_some_and(|d| d.is(digest)) {
                    Some((image, at + 1))
                } else if repeated {
                    // The quirk: the application just measured, measured again.
                    Some((image, at))
                } else {
                    None
                }
            })
            .collect();
        if next.is_empty() {
            let position = progress.iter().map(|(_, at)| *at).max().unwrap_or(0);
            let candidates: Vec<&Image> = progress.iter().map(|(image, _)| *image).collect();
            return Err(refuse(format!(
                "{}: Authenticode {alg} {}{} {} ({})",
                event.describe(),
                short_hex(digest),
                image_path(event).map(|p| format!(" {p}")).unwrap_or_default(),
                role(&candidates, position),
                names(&candidates)
            )));
        }
        progress = next;
        ran += 1;
        last = Some(event);
    }
    let complete: Vec<&Image> = progress
        .iter()
        .filter(|(image, at)| image.chain().count() == *at)
        .map(|(image, _)| *image)
        .collect();
    if complete.is_empty() {
        let candidates: Vec<&Image> = progress.iter().map(|(image, _)| *image).collect();
        let Some(event) = last else {
            return Err(refuse(format!(
                "PCR 4 holds no boot application after its separator; {} expects {}",
                names(&candidates),
                candidates.first().map_or(0, |i| i.chain().count())
            )));
        };
        return Err(refuse(format!(
            "{}: the last PCR 4 boot application, after {ran}; {} expects more (its kernel {})",
            event.describe(),
            names(&candidates),
            candidates.first().map_or_else(String::new, |i| i.kernel.short())
        )));
    }
    Ok((complete, ran))
}

/// What the application at `position` failed to be, for the message.
fn role(candidates: &[&Image], position: usize) -> String {
    if candidates.iter().all(|i| i.bootloaders.len() < position) {
        return "is not expected after the kernel: the policy's images end with their kernel".to_owned();
    }
    let kernels = candidates.iter().filter(|i| i.bootloaders.len() == position).count();
    match (kernels, candidates.len()) {
        (k, n) if k == n => "is none of the policy's kernels".to_owned(),
        (0, _) => format!("is none of the policy's bootloaders at position {}", position + 1),
        _ => format!(
            "is none of the policy's bootloaders at position {} or kernels",
            position + 1
        ),
    }
}
