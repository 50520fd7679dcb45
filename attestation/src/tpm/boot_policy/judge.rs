//! The boot policy's rules, judged on a parsed event log whose replay in `alg` the caller has
//! already checked against the quoted values of the PCRs this module says it reads
//! ([`judged_pcrs`]; a log that does not match the quote proves nothing).
//!
//! The replay proves only the sequence of digests in each PCR: an event's type, and any data
//! its digest does not cover, are the log writer's word, and root on a booted node can extend
//! PCRs 7, 8 and 9 and log what it likes (SPEC section 5, revision 6). So each PCR the policy
//! reads is judged as a whole sequence, never as "a good event somewhere": every event must be
//! one the boot explains, and a refusal names the first that is not
//! (`event 23 (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION): ...`). One room per PCR:
//!
//! - [`separators`]: where a PCR's pre-OS measurements end, found by digest, not by label;
//! - [`secure_boot`]: PCR 7, the firmware's Secure Boot configuration then only authorities;
//! - [`boot_applications`]: PCR 4, the firmware's events then exactly one image's chain;
//! - [`boot_path`]: PCRs 8 and 9, every event a step of grub (either form), systemd-boot or the
//!   Linux EFI stub, the command line and the initrd each measured once.

mod boot_applications;
mod boot_path;
mod secure_boot;
mod separators;

use super::{BootPolicy, Image};
use crate::tpm::event_log::{Event, EventLog, EventLogError, HashAlg, event_type};

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

/// The PCRs `policy` reads, ascending: 4 always (the image's chain), 7 when it requires Secure
/// Boot or lists authorities or dbx, 8 and 9 when an image gives a command line, an initrd or
/// a kernel file. Only these must replay to the quoted values; the quote must cover them.
pub fn judged_pcrs(policy: &BootPolicy) -> Vec<u32> {
    let mut pcrs = vec![4];
    if secure_boot::reads(policy) {
        pcrs.push(7);
    }
    if boot_path::reads(&policy.images) {
        pcrs.extend([8, 9]);
    }
    pcrs
}

/// Judges `policy` on `log`, whose replay in `alg` gave the quoted values of the policy's
/// [`judged_pcrs`]; `selection` is the quote's PCR indices in that bank.
pub fn judge(policy: &BootPolicy, log: &EventLog, alg: HashAlg, selection: &[u32]) -> Result<BootVerdict, BootRefusal> {
    let judged = judged_pcrs(policy);
    let missing: Vec<u32> = judged.iter().copied().filter(|p| !selection.contains(p)).collect();
    if !missing.is_empty() {
        return Err(refuse(format!(
            "the quote does not cover PCRs {missing:?}: this boot policy reads PCRs {judged:?} (quoted {selection:?})"
        )));
    }
    if alg != HashAlg::Sha256 {
        return Err(refuse(format!(
            "the quote is of the {alg} bank: the policy's digests are SHA-256 (allocate the TPM's SHA-256 PCR bank)"
        )));
    }
    let mut checked = if secure_boot::reads(policy) {
        secure_boot::judge(policy, log, alg)?
    } else {
        Vec::new()
    };
    let candidates: Vec<&Image> = policy.images.iter().collect();
    let (candidates, apps) = boot_applications::judge(log, alg, candidates)?;
    let (candidates, measured) = if boot_path::reads(&policy.images) {
        boot_path::judge(log, alg, candidates)?
    } else {
        (candidates, Vec::new())
    };
    let image = candidates
        .first()
        .copied()
        .ok_or_else(|| refuse("no image of the policy matches"))?;
    let mut what = format!("{apps} boot applications");
    for part in measured {
        what.push_str(", ");
        what.push_str(part);
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

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
