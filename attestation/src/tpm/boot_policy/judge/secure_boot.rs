//! PCR 7, as a whole: the firmware's Secure Boot configuration up to its separator, then only
//! the authorities that verified each boot application.
//!
//! - Before the separator every event is a variable whose digest covers it (or one of the
//!   firmware's two PCR 7 actions, "DMA Protection Disabled" and "UEFI Debug Mode"):
//!   `EV_EFI_VARIABLE_DRIVER_CONFIG` (`SecureBoot`, `PK`, `KEK`, `db`, `dbx` each exactly once,
//!   as the PC Client profile requires, and any other) or an `EV_EFI_VARIABLE_AUTHORITY` of
//!   `db` (a driver or option ROM the firmware verified first).
//! - Secure Boot's state is the first `SecureBoot` variable before the separator: the
//!   firmware's word. Root on a booted node can extend PCR 7 and log what it likes, but only
//!   after the separator, where a variable is refused.
//! - After the separator, `EV_EFI_VARIABLE_AUTHORITY` events only (the firmware's `db` entry for
//!   shim, shim's vendor certificate, `SbatLevel`, MOK entries), each covered by its digest.

use super::{BootRefusal, refuse, separators};
use crate::tpm::boot_policy::{BootPolicy, SecureBoot, Sha256Digest, short_hex};
use crate::tpm::event_log::events::{EFI_GLOBAL_VARIABLE, EFI_IMAGE_SECURITY_DATABASE};
use crate::tpm::event_log::{Event, EventLog, HashAlg, authority_certificates, efi_variable, event_type};

/// The variables the firmware measures into PCR 7 before its separator, each once, as
/// `EV_EFI_VARIABLE_DRIVER_CONFIG` (PC Client PFP 1.05, 3.3.4.8; every real log here).
const FIRMWARE_VARIABLES: [(&str, &str); 5] = [
    ("SecureBoot", EFI_GLOBAL_VARIABLE),
    ("PK", EFI_GLOBAL_VARIABLE),
    ("KEK", EFI_GLOBAL_VARIABLE),
    ("db", EFI_IMAGE_SECURITY_DATABASE),
    ("dbx", EFI_IMAGE_SECURITY_DATABASE),
];

/// Whether the policy reads PCR 7 at all.
pub(super) fn reads(policy: &BootPolicy) -> bool {
    policy.secure_boot == SecureBoot::Required || !policy.authorities.is_empty() || !policy.dbx.is_empty()
}

/// Judges PCR 7 against `policy`; the words for the verdict's summary.
pub(super) fn judge(policy: &BootPolicy, log: &EventLog, alg: HashAlg) -> Result<Vec<String>, BootRefusal> {
    let split = separators::split(log, alg, 7, separators::Missing::Refused)?;
    let mut secure_boot = None;
    let mut dbx = None;
    let mut measured: Vec<&str> = Vec::new();
    for event in &split.before {
        let variable = match event.event_type {
            event_type::EFI_VARIABLE_DRIVER_CONFIG | event_type::EFI_VARIABLE_AUTHORITY => {
                efi_variable(event, alg)?.ok_or_else(|| unexplained(event, "before its separator"))?
            }
            event_type::EFI_ACTION if separators::covers(event, alg) => {
                firmware_action(policy, event)?;
                continue;
            }
            _ => return Err(unexplained(event, "before its separator")),
        };
        if event.event_type == event_type::EFI_VARIABLE_AUTHORITY {
            // Before the separator the firmware verifies drivers and option ROMs against db.
            if variable.name != "db" || variable.guid != EFI_IMAGE_SECURITY_DATABASE {
                return Err(refuse(format!(
                    "{}: an authority named {:?} before PCR 7's separator, where only the firmware's db verifies",
                    event.describe(),
                    variable.name
                )));
            }
            continue;
        }
        if let Some(name) = FIRMWARE_VARIABLES
            .iter()
            .find(|(name, guid)| variable.name == *name && variable.guid == *guid)
            .map(|(name, _)| *name)
        {
            if measured.contains(&name) {
                return Err(refuse(format!(
                    "{}: the firmware's {name} variable measured a second time before PCR 7's separator",
                    event.describe()
                )));
            }
            measured.push(name);
        }
        if variable.name == "SecureBoot" && variable.guid == EFI_GLOBAL_VARIABLE && secure_boot.is_none() {
            secure_boot = Some((*event, variable.data.clone()));
        }
        if variable.name == "dbx" && variable.guid == EFI_IMAGE_SECURITY_DATABASE && dbx.is_none() {
            dbx = Some((*event, variable.data));
        }
    }
    let missing: Vec<&str> = FIRMWARE_VARIABLES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !measured.contains(name))
        .collect();
    if !missing.is_empty() {
        return Err(refuse(format!(
            "PCR 7 measures no {} variable (EV_EFI_VARIABLE_DRIVER_CONFIG) before its separator: the firmware measures SecureBoot, PK, KEK, db and dbx there, so this log's PCR 7 is not the firmware's",
            missing.join(", ")
        )));
    }
    for event in &split.after {
        if event.event_type != event_type::EFI_VARIABLE_AUTHORITY {
            return Err(unexplained(
                event,
                "after its separator, where only the authorities that verified a boot application may be",
            ));
        }
        efi_variable(event, alg)?;
    }
    let mut checked = Vec::new();
    let requires = if policy.secure_boot_floor {
        "the signer's floor requires it (--tpm-require-secure-boot)"
    } else {
        "the policy requires it (secureBoot: required)"
    };
    if policy.secure_boot == SecureBoot::Required {
        match secure_boot {
            Some((_, data)) if data == [1] => checked.push("Secure Boot on".to_owned()),
            Some((event, data)) => {
                return Err(refuse(format!(
                    "{}: SecureBoot is {data:?}, not 1: Secure Boot is off and {requires}",
                    event.describe()
                )));
            }
            None => {
                return Err(refuse(format!(
                    "PCR 7 measures no SecureBoot variable before its separator: Secure Boot cannot be shown on, and {requires}"
                )));
            }
        }
    }
    if !policy.dbx.is_empty() {
        let Some((event, data)) = dbx else {
            return Err(refuse(
                "PCR 7 measures no dbx variable before its separator, and the policy lists the dbx contents it allows",
            ));
        };
        let digest = HashAlg::Sha256.digest(&data);
        if !policy.dbx.iter().any(|a| a.is(&digest)) {
            return Err(refuse(format!(
                "{}: dbx of {} bytes, sha256 {}, is none of the policy's dbx contents",
                event.describe(),
                data.len(),
                short_hex(&digest)
            )));
        }
        checked.push("dbx allowed".to_owned());
    }
    if !policy.authorities.is_empty() {
        let authorities = split
            .before
            .iter()
            .chain(&split.after)
            .filter(|e| e.event_type == event_type::EFI_VARIABLE_AUTHORITY);
        let count = authorities_allowed(authorities.copied(), alg, &policy.authorities)?;
        checked.push(format!("{count} authorities allowed"));
    }
    Ok(checked)
}

/// The actions the firmware logs in PCR 7 before its separator (PC Client PFP 1.05, 3.3.4.8;
/// EDK2's `Tcg2Dxe`): DMA protection off (`go_tpm_tools_gdc_host_ubuntu_efistub_eventlog`) is
/// the platform's configuration and is allowed; the firmware in debug mode does not enforce what
/// Secure Boot promises, so a policy requiring Secure Boot refuses it.
fn firmware_action(policy: &BootPolicy, event: &Event) -> Result<(), BootRefusal> {
    match event.data.strip_suffix(&[0]).unwrap_or(&event.data) {
        b"DMA Protection Disabled" => Ok(()),
        b"UEFI Debug Mode" if policy.secure_boot != SecureBoot::Required => Ok(()),
        b"UEFI Debug Mode" => Err(refuse(format!(
            "{}: the firmware is in UEFI debug mode, which does not enforce Secure Boot, and Secure Boot is required",
            event.describe()
        ))),
        _ => Err(unexplained(event, "before its separator")),
    }
}

fn unexplained(event: &Event, place: &str) -> BootRefusal {
    refuse(format!(
        "{}: not an event the firmware's Secure Boot configuration explains in PCR 7 {place}",
        event.describe()
    ))
}

fn authorities_allowed<'l>(
    events: impl Iterator<Item = &'l Event>,
    alg: HashAlg,
    allowed: &[Sha256Digest],
) -> Result<usize, BootRefusal> {
    let mut count = 0;
    for event in events {
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
