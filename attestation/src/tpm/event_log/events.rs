//! Typed views of the events a boot policy judges.
//!
//! A view returns `Ok(None)` for an event of another type, and checks, where the TCG spec
//! says the digest covers the event data, that the event's digest in the bank being judged
//! equals that bank's hash of the data: replay proves the digests, and only this check carries
//! that proof over to the data. Where the digest covers something else (an image, a file, an
//! initrd), the view says so and the data is a label, not evidence.

use super::{Event, EventLog, EventLogError, HashAlg, event_type};

/// `EFI_GLOBAL_VARIABLE` (UEFI 2.10, 3.3): `SecureBoot`, `PK`, `KEK`, `Boot####`.
pub const EFI_GLOBAL_VARIABLE: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// `EFI_IMAGE_SECURITY_DATABASE_GUID`: `db`, `dbx`.
pub const EFI_IMAGE_SECURITY_DATABASE: &str = "d719b2cb-3d3a-4596-a3bc-dad00e67656f";
/// shim's `SHIM_LOCK_GUID`: the `Shim` (vendor certificate), `MokList`, `SbatLevel` entries.
pub const SHIM_LOCK: &str = "605dab50-e046-4300-abb6-3dd810dd8b23";
/// `EFI_CERT_X509_GUID`: an `EFI_SIGNATURE_LIST` of X.509 certificates.
pub const EFI_CERT_X509: &str = "a5c059a1-94e4-4aa7-87b5-ab155c2bf072";

/// The Linux EFI stub's tag for the initrd it loaded (`INITRD_EVENT_TAG_ID`, Linux 5.19+).
pub const LINUX_INITRD_TAG: u32 = 0x8F3B_22EC;
/// The Linux EFI stub's tag for its load options (`LOAD_OPTIONS_EVENT_TAG_ID`, Linux 6.2+).
pub const LINUX_LOAD_OPTIONS_TAG: u32 = 0x8F3B_22ED;

/// An EFI variable as measured (`UEFI_VARIABLE_DATA`, PC Client PFP 1.05, 10.2.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfiVariable {
    /// `VariableName`, lowercase 8-4-4-4-12.
    pub guid: String,
    /// `UnicodeName`.
    pub name: String,
    /// `VariableData`.
    pub data: Vec<u8>,
}

/// Reads an `EV_EFI_VARIABLE_DRIVER_CONFIG`, `EV_EFI_VARIABLE_BOOT`, `EV_EFI_VARIABLE_BOOT2` or
/// `EV_EFI_VARIABLE_AUTHORITY` event, checking that its digest in `alg` covers it.
///
/// The digest must be `alg(UEFI_VARIABLE_DATA)`, as the spec says, with two tolerated quirks:
///
/// - `EV_EFI_VARIABLE_BOOT`: EDK2-derived firmware (OVMF, and GCE's in every real log here)
///   hashes only `VariableData`. Then the variable's name and GUID are not covered, only its
///   contents.
/// - `EV_EFI_VARIABLE_AUTHORITY`: shim 15 measures its vendor certificate (`Shim`) with up to
///   [`MAX_AUTHORITY_PADDING`] bytes after the `UEFI_VARIABLE_DATA` (its C struct's padding,
///   miscounted), of which the digest covers some (`sb_cert_eventlog`: 6 logged, 5 hashed). The
///   digest must cover the whole `UEFI_VARIABLE_DATA` and zero bytes only after it.
pub fn efi_variable(event: &Event, alg: HashAlg) -> Result<Option<EfiVariable>, EventLogError> {
    if !matches!(
        event.event_type,
        event_type::EFI_VARIABLE_DRIVER_CONFIG
            | event_type::EFI_VARIABLE_BOOT
            | event_type::EFI_VARIABLE_BOOT2
            | event_type::EFI_VARIABLE_AUTHORITY
    ) {
        return Ok(None);
    }
    let (variable, used) = decode_variable(&event.data).map_err(|reason| bad(event, reason))?;
    let authority = event.event_type == event_type::EFI_VARIABLE_AUTHORITY;
    let extra = event.data.len() - used;
    if extra > 0 && !(authority && extra <= MAX_AUTHORITY_PADDING) {
        return Err(bad(event, format!("{extra} bytes after UEFI_VARIABLE_DATA")));
    }
    let digest = digest_in(event, alg)?;
    // The covered prefix: all of the data, or (authority quirk) the variable and zero padding.
    let zeros = event.data[used..].iter().take_while(|b| **b == 0).count();
    let mut covered = (used..=used + zeros)
        .chain(std::iter::once(event.data.len()))
        .any(|end| digest == alg.digest(&event.data[..end]).as_slice());
    if event.event_type == event_type::EFI_VARIABLE_BOOT && !covered {
        covered = digest == alg.digest(&variable.data).as_slice();
    }
    if !covered {
        return Err(mismatch(event, alg));
    }
    Ok(Some(variable))
}

/// At most this many bytes may follow an authority's `UEFI_VARIABLE_DATA` (shim 15 logs 6).
pub const MAX_AUTHORITY_PADDING: usize = 8;

/// Reads the text of an `EV_IPL` event whose digest covers it, without its trailing NUL:
///
/// - grub's PCR 8 `grub_cmd: ...`, `kernel_cmdline: ...` and `module_cmdline: ...`: grub
///   hashes the text after the prefix, without the NUL (every PCR 8 event of
///   `ubuntu_2104_shielded_vm_no_secure_boot_eventlog` and
///   `coreos_36_shielded_vm_no_secure_boot_eventlog`). The text returned keeps the prefix, but
///   the prefix is not covered: a forged log may relabel a `grub_cmd: ` event whose text is a
///   command line as `kernel_cmdline: `. A policy checking the command line should also check
///   that exactly one event carries it, and where.
/// - any other string whose digest covers it, with or without its NUL (systemd-stub).
///
/// grub's PCR 9 and shim's PCR 14 `EV_IPL` events name a file or a variable whose contents the
/// digest covers (the kernel, the initrd, `grub.cfg`; `MokList`): the name is not covered and
/// this view refuses them; [`ipl_label`] reads the name for messages.
pub fn ipl_text(event: &Event, alg: HashAlg) -> Result<Option<String>, EventLogError> {
    if event.event_type != event_type::IPL {
        return Ok(None);
    }
    let digest = digest_in(event, alg)?;
    let text = event.data.strip_suffix(&[0]).unwrap_or(&event.data);
    let after_prefix = GRUB_PREFIXES
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix.as_bytes()));
    let covered = [Some(text), after_prefix, Some(event.data.as_slice())]
        .into_iter()
        .flatten()
        .any(|covered| digest == alg.digest(covered).as_slice());
    if !covered {
        return Err(mismatch(event, alg));
    }
    let text = std::str::from_utf8(text).map_err(|_| bad(event, "the EV_IPL text is not UTF-8".into()))?;
    Ok(Some(text.to_owned()))
}

/// The prefixes grub writes before the string it measures into PCR 8 (grub's `tpm.c`).
pub const GRUB_PREFIXES: [&str; 3] = ["grub_cmd: ", "kernel_cmdline: ", "module_cmdline: "];

/// The text of an `EV_IPL` event, not checked against its digest: for messages only (grub's
/// PCR 9 file names). Lossy UTF-8, without the trailing NUL.
pub fn ipl_label(event: &Event) -> Option<String> {
    if event.event_type != event_type::IPL {
        return None;
    }
    let text = event.data.strip_suffix(&[0]).unwrap_or(&event.data);
    Some(String::from_utf8_lossy(text).into_owned())
}

/// What an `EV_SEPARATOR` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Separator {
    /// `00000000`: the pre-OS measurements of the PCR ended normally.
    Normal,
    /// `00000001` or `FFFFFFFF`: the firmware met an error.
    Error,
    /// Another value whose digest covers it (Windows logs `WBCL` in PCRs 12 to 14).
    Other,
}

/// Reads an `EV_SEPARATOR`, checking that its digest in `alg` covers its data.
pub fn separator(event: &Event, alg: HashAlg) -> Result<Option<Separator>, EventLogError> {
    if event.event_type != event_type::SEPARATOR {
        return Ok(None);
    }
    if digest_in(event, alg)? != alg.digest(&event.data).as_slice() {
        return Err(mismatch(event, alg));
    }
    Ok(Some(match event.data.as_slice() {
        [0, 0, 0, 0] => Separator::Normal,
        [1, 0, 0, 0] | [0xff, 0xff, 0xff, 0xff] => Separator::Error,
        _ => Separator::Other,
    }))
}

/// What the Linux EFI stub measured into PCR 9 as an `EV_EVENT_TAG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinuxStubEvent {
    /// `Linux initrd`: the digest is of the initrd it loaded (as one file, or as the
    /// concatenation the loader served through `LoadFile2`).
    Initrd,
    /// `LOADED_IMAGE::LoadOptions`: the digest is of the load options the stub was started
    /// with, the bytes as the loader passed them (UTF-16LE from shim, systemd-boot and UEFI).
    LoadOptions,
}

/// Reads the Linux EFI stub's `EV_EVENT_TAG` events (`TCG_PCClientTaggedEvent`: tag, size,
/// data). Their digest covers the initrd or the load options, not this data: the tag is a
/// label; what proves the initrd or the command line is the event's digest, in PCR 9.
/// Other tags give `Ok(None)`.
pub fn linux_stub_event(event: &Event) -> Result<Option<LinuxStubEvent>, EventLogError> {
    if event.event_type != event_type::EVENT_TAG {
        return Ok(None);
    }
    let (tag, rest) = split_u32(&event.data).ok_or_else(|| bad(event, "the tagged event is truncated".into()))?;
    let (size, tagged) = split_u32(rest).ok_or_else(|| bad(event, "the tagged event is truncated".into()))?;
    if tagged.len() != size as usize {
        return Err(bad(
            event,
            format!("taggedEventDataSize {size}, {} bytes follow", tagged.len()),
        ));
    }
    Ok(match tag {
        LINUX_INITRD_TAG => Some(LinuxStubEvent::Initrd),
        LINUX_LOAD_OPTIONS_TAG => Some(LinuxStubEvent::LoadOptions),
        _ => None,
    })
}

/// Secure Boot's state as the firmware measured it: the first `SecureBoot` variable's
/// `EV_EFI_VARIABLE_DRIVER_CONFIG` event in PCR 7 before PCR 7's `EV_SEPARATOR` (its digest
/// checked in `alg`; what a boot application measures after the separator is not the
/// firmware's word). `Some(true)` for `01`, `Some(false)` for `00` or empty data (firmware that
/// logs the variable while it does not exist, as in `crypto_agile_eventlog`), `None` when the
/// log has no such event.
pub fn secure_boot(log: &EventLog, alg: HashAlg) -> Result<Option<bool>, EventLogError> {
    for event in &log.events {
        if event.pcr == 7 && event.event_type == event_type::SEPARATOR {
            break;
        }
        if event.pcr != 7 || event.event_type != event_type::EFI_VARIABLE_DRIVER_CONFIG {
            continue;
        }
        let Some(variable) = efi_variable(event, alg)? else {
            continue;
        };
        if variable.guid != EFI_GLOBAL_VARIABLE || variable.name != "SecureBoot" {
            continue;
        }
        return match variable.data.as_slice() {
            [] | [0] => Ok(Some(false)),
            [1] => Ok(Some(true)),
            other => Err(bad(
                event,
                format!("SecureBoot holds {} bytes, not 0 or 1", other.len()),
            )),
        };
    }
    Ok(None)
}

/// One signature that verified an image, from an `EV_EFI_VARIABLE_AUTHORITY` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureData {
    /// `SignatureOwner`, lowercase 8-4-4-4-12; `None` when the event holds a bare certificate
    /// (shim measures its built-in vendor certificate as `Shim` that way).
    pub owner: Option<String>,
    /// `SignatureData`: an X.509 certificate in DER for a `db` or MOK certificate entry (the
    /// bytes a policy's `authorities` hash), or an image hash for a hash entry.
    pub data: Vec<u8>,
}

/// The signatures an `EV_EFI_VARIABLE_AUTHORITY` event holds (its digest checked in `alg` by
/// [`efi_variable`]). Its `VariableData` is, as firmware and shim write it, one of:
///
/// - an `EFI_SIGNATURE_DATA` (owner GUID + certificate): the spec's form, EDK2 and GCE;
/// - an `EFI_SIGNATURE_LIST` of them: some firmware logs the whole list the entry came from;
/// - a bare DER certificate: shim's `Shim` vendor certificate.
///
/// Authority events that hold no certificate give an empty list: shim's `SbatLevel` (text) and
/// `MokListTrusted` (one byte), and a `db` hash entry (owner + image hash) for an image allowed
/// by hash rather than by signature. `Ok(None)` for other event types.
pub fn authority_certificates(event: &Event, alg: HashAlg) -> Result<Option<Vec<SignatureData>>, EventLogError> {
    if event.event_type != event_type::EFI_VARIABLE_AUTHORITY {
        return Ok(None);
    }
    let Some(variable) = efi_variable(event, alg)? else {
        return Ok(None);
    };
    let data = variable.data;
    if der_length(&data) == Some(data.len()) {
        return Ok(Some(vec![SignatureData { owner: None, data }]));
    }
    if let Some(list) = signature_list(&data) {
        return Ok(Some(list));
    }
    match data.split_at_checked(16) {
        Some((owner, certificate)) if der_length(certificate) == Some(certificate.len()) => {
            Ok(Some(vec![SignatureData {
                owner: Some(guid(owner)),
                data: certificate.to_vec(),
            }]))
        }
        _ => Ok(Some(Vec::new())),
    }
}

/// The path of the image an `EV_EFI_BOOT_SERVICES_APPLICATION` (or driver) event loaded, from
/// the media file path nodes of its `UEFI_IMAGE_LOAD_EVENT` device path (`\EFI\BOOT\BOOTX64.EFI`).
/// The digest is the image's Authenticode digest and does not cover this: a label for messages.
/// `None` for other events, or when the device path has no file path.
pub fn image_path(event: &Event) -> Option<String> {
    if !matches!(
        event.event_type,
        event_type::EFI_BOOT_SERVICES_APPLICATION
            | event_type::EFI_BOOT_SERVICES_DRIVER
            | event_type::EFI_RUNTIME_SERVICES_DRIVER
    ) {
        return None;
    }
    let length = event.data.get(24..32)?;
    let length = usize::try_from(u64::from_le_bytes(length.try_into().ok()?)).ok()?;
    let mut path = event.data.get(32..32usize.checked_add(length)?)?;
    let mut parts: Vec<String> = Vec::new();
    while path.len() >= 4 {
        let (kind, subtype) = (path[0], path[1]);
        let node_len = usize::from(u16::from_le_bytes([path[2], path[3]]));
        if node_len < 4 || node_len > path.len() {
            return None;
        }
        if kind == 0x7f {
            break;
        }
        if (kind, subtype) == (0x04, 0x04) {
            let name = utf16(&path[4..node_len])?;
            parts.push(name.trim_end_matches('\0').to_owned());
        }
        path = &path[node_len..];
    }
    (!parts.is_empty()).then(|| parts.concat())
}

/// `UEFI_VARIABLE_DATA`: GUID, name length (characters), data length, name, data, nothing else.
/// Returns the variable and how many bytes it took.
fn decode_variable(data: &[u8]) -> Result<(EfiVariable, usize), String> {
    let truncated = || "UEFI_VARIABLE_DATA is truncated".to_string();
    let (guid_bytes, rest) = split(data, 16).ok_or_else(truncated)?;
    let (name_len, rest) = split_u64(rest).ok_or_else(truncated)?;
    let (data_len, rest) = split_u64(rest).ok_or_else(truncated)?;
    let name_bytes = usize::try_from(name_len)
        .ok()
        .and_then(|n| n.checked_mul(2))
        .ok_or_else(truncated)?;
    let (name, rest) = split(rest, name_bytes).ok_or_else(truncated)?;
    let data_len = usize::try_from(data_len).map_err(|_| truncated())?;
    let (value, rest) = split(rest, data_len).ok_or_else(truncated)?;
    let name = utf16(name).ok_or("the variable name is not UTF-16")?;
    let variable = EfiVariable {
        guid: guid(guid_bytes),
        name: name.trim_end_matches('\0').to_owned(),
        data: value.to_vec(),
    };
    Ok((variable, data.len() - rest.len()))
}

/// An `EFI_SIGNATURE_LIST` of X.509 certificates taking exactly `data`, or `None`.
fn signature_list(data: &[u8]) -> Option<Vec<SignatureData>> {
    let (kind, rest) = split(data, 16)?;
    let (list_size, rest) = split_u32(rest)?;
    let (header_size, rest) = split_u32(rest)?;
    let (signature_size, rest) = split_u32(rest)?;
    if guid(kind) != EFI_CERT_X509 || list_size as usize != data.len() {
        return None;
    }
    let (_, mut rest) = split(rest, header_size as usize)?;
    let signature_size = signature_size as usize;
    if signature_size <= 16 || rest.is_empty() || !rest.len().is_multiple_of(signature_size) {
        return None;
    }
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (entry, next) = split(rest, signature_size)?;
        let (owner, certificate) = entry.split_at(16);
        out.push(SignatureData {
            owner: Some(guid(owner)),
            data: certificate.to_vec(),
        });
        rest = next;
    }
    Some(out)
}

/// The total length of the DER element `data` starts with, if it starts with a SEQUENCE.
fn der_length(data: &[u8]) -> Option<usize> {
    let (&tag, rest) = data.split_first()?;
    if tag != 0x30 {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    if first < 0x80 {
        return Some(2 + usize::from(first));
    }
    let n = usize::from(first & 0x7f);
    if n == 0 || n > 4 {
        return None;
    }
    let len = rest
        .get(..n)?
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
    len.checked_add(2 + n)
}

/// A GUID as text: the first three fields little-endian, the last eight bytes in order.
pub(super) fn guid(bytes: &[u8]) -> String {
    let Some(b) = bytes.get(..16) else {
        return String::new();
    };
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
    )
}

fn utf16(bytes: &[u8]) -> Option<String> {
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    String::from_utf16(&units).ok()
}

fn split(data: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (data.len() >= n).then(|| data.split_at(n))
}

fn split_u32(data: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = split(data, 4)?;
    Some((u32::from_le_bytes(head.try_into().ok()?), rest))
}

fn split_u64(data: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = split(data, 8)?;
    Some((u64::from_le_bytes(head.try_into().ok()?), rest))
}

fn digest_in(event: &Event, alg: HashAlg) -> Result<&[u8], EventLogError> {
    event.digest(alg).ok_or_else(|| EventLogError::MissingDigest {
        event: event.describe(),
        alg,
    })
}

fn mismatch(event: &Event, alg: HashAlg) -> EventLogError {
    EventLogError::DigestMismatch {
        event: event.describe(),
        alg,
    }
}

fn bad(event: &Event, reason: String) -> EventLogError {
    EventLogError::BadEventData {
        event: event.describe(),
        reason,
    }
}

/// Encoders of what firmware writes, for the tests of this module and of the boot policy's.
#[cfg(test)]
pub(crate) mod encode {
    /// A GUID's 16 bytes as UEFI lays them out (the first three fields little-endian).
    pub(crate) fn guid_bytes(text: &str) -> Vec<u8> {
        let hex: String = text.chars().filter(|c| *c != '-').collect();
        let b: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let mut out = vec![b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6]];
        out.extend(&b[8..]);
        out
    }

    /// A `UEFI_VARIABLE_DATA` structure: GUID, name and data lengths, UTF-16LE name, data.
    pub(crate) fn variable_data(guid: &str, name: &str, value: &[u8]) -> Vec<u8> {
        let name: Vec<u16> = name.encode_utf16().collect();
        let mut out = guid_bytes(guid);
        out.extend((name.len() as u64).to_le_bytes());
        out.extend((value.len() as u64).to_le_bytes());
        for unit in name {
            out.extend(unit.to_le_bytes());
        }
        out.extend(value);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{guid_bytes, variable_data};
    use super::*;

    fn event(event_type: u32, pcr: u32, digest: Vec<u8>, data: Vec<u8>) -> Event {
        Event {
            index: 3,
            pcr,
            event_type,
            digests: vec![(HashAlg::Sha256, digest)],
            data,
        }
    }

    fn variable_event(event_type: u32, name: &str, value: &[u8]) -> Event {
        let data = variable_data(EFI_GLOBAL_VARIABLE, name, value);
        event(event_type, 7, HashAlg::Sha256.digest(&data), data)
    }

    #[test]
    fn guids_print_mixed_endian() {
        assert_eq!(guid(&guid_bytes(EFI_GLOBAL_VARIABLE)), EFI_GLOBAL_VARIABLE);
        assert_eq!(&guid_bytes(EFI_GLOBAL_VARIABLE)[..4], &[0x61, 0xdf, 0xe4, 0x8b]);
    }

    #[test]
    fn a_covered_variable_reads() {
        let event = variable_event(event_type::EFI_VARIABLE_DRIVER_CONFIG, "SecureBoot", &[1]);
        let variable = efi_variable(&event, HashAlg::Sha256).unwrap().unwrap();
        assert_eq!(variable.guid, EFI_GLOBAL_VARIABLE);
        assert_eq!(variable.name, "SecureBoot");
        assert_eq!(variable.data, vec![1]);
    }

    #[test]
    fn an_uncovered_variable_is_an_error_naming_the_event() {
        let mut event = variable_event(event_type::EFI_VARIABLE_DRIVER_CONFIG, "SecureBoot", &[1]);
        if let Some(last) = event.data.last_mut() {
            *last = 0;
        }
        assert_eq!(
            efi_variable(&event, HashAlg::Sha256),
            Err(EventLogError::DigestMismatch {
                event: "event 3 (PCR 7, EV_EFI_VARIABLE_DRIVER_CONFIG)".into(),
                alg: HashAlg::Sha256
            })
        );
    }

    #[test]
    fn only_boot_variables_may_hash_their_data_alone() {
        let data = variable_data(EFI_GLOBAL_VARIABLE, "BootOrder", &[1, 0]);
        let digest = HashAlg::Sha256.digest(&[1, 0]);
        let boot = event(event_type::EFI_VARIABLE_BOOT, 1, digest.clone(), data.clone());
        assert!(efi_variable(&boot, HashAlg::Sha256).unwrap().is_some());
        let config = event(event_type::EFI_VARIABLE_DRIVER_CONFIG, 7, digest, data);
        assert!(efi_variable(&config, HashAlg::Sha256).is_err());
    }

    #[test]
    fn malformed_variables_are_errors_not_panics() {
        let good = variable_data(EFI_GLOBAL_VARIABLE, "SecureBoot", &[1]);
        for cut in 0..good.len() {
            let data = good[..cut].to_vec();
            let e = event(
                event_type::EFI_VARIABLE_DRIVER_CONFIG,
                7,
                HashAlg::Sha256.digest(&data),
                data,
            );
            assert!(matches!(
                efi_variable(&e, HashAlg::Sha256),
                Err(EventLogError::BadEventData { .. })
            ));
        }
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = event(event_type::EFI_VARIABLE_DRIVER_CONFIG, 7, vec![0; 32], huge);
        assert!(efi_variable(&e, HashAlg::Sha256).is_err());
    }

    #[test]
    fn secure_boot_reads_pcr7() {
        let on = variable_event(event_type::EFI_VARIABLE_DRIVER_CONFIG, "SecureBoot", &[1]);
        let off = variable_event(event_type::EFI_VARIABLE_DRIVER_CONFIG, "SecureBoot", &[]);
        let log = |events: Vec<Event>| EventLog {
            events,
            format: super::super::LogFormat::CryptoAgile,
            algorithms: Vec::new(),
            startup_locality: None,
            trailing_zeros: 0,
        };
        assert_eq!(secure_boot(&log(vec![on]), HashAlg::Sha256), Ok(Some(true)));
        assert_eq!(secure_boot(&log(vec![off]), HashAlg::Sha256), Ok(Some(false)));
        assert_eq!(secure_boot(&log(vec![]), HashAlg::Sha256), Ok(None));
        // After PCR 7's separator, a SecureBoot event is not the firmware's.
        let separator = event(event_type::SEPARATOR, 7, HashAlg::Sha256.digest(&[0; 4]), vec![0; 4]);
        let late = variable_event(event_type::EFI_VARIABLE_DRIVER_CONFIG, "SecureBoot", &[1]);
        assert_eq!(secure_boot(&log(vec![separator, late]), HashAlg::Sha256), Ok(None));
    }

    #[test]
    fn grub_ipl_text_is_hashed_without_its_prefix_and_nul() {
        let text = b"kernel_cmdline: /vmlinuz root=/dev/sda1 ro";
        let mut data = text.to_vec();
        data.push(0);
        let digest = HashAlg::Sha256.digest(b"/vmlinuz root=/dev/sda1 ro");
        let e = event(event_type::IPL, 8, digest, data.clone());
        assert_eq!(
            ipl_text(&e, HashAlg::Sha256).unwrap().as_deref(),
            Some("kernel_cmdline: /vmlinuz root=/dev/sda1 ro")
        );
        let file = event(event_type::IPL, 9, vec![7; 32], data);
        assert!(matches!(
            ipl_text(&file, HashAlg::Sha256),
            Err(EventLogError::DigestMismatch { .. })
        ));
        assert_eq!(
            ipl_label(&file).as_deref(),
            Some("kernel_cmdline: /vmlinuz root=/dev/sda1 ro")
        );
    }

    #[test]
    fn systemd_style_ipl_text_covers_the_whole_string() {
        let e = event(
            event_type::IPL,
            12,
            HashAlg::Sha256.digest(b"quiet\0"),
            b"quiet\0".to_vec(),
        );
        assert_eq!(ipl_text(&e, HashAlg::Sha256).unwrap().as_deref(), Some("quiet"));
    }

    #[test]
    fn an_authority_may_carry_shims_zero_padding_only() {
        let cert = vec![0x30, 0x03, 0x02, 0x01, 0x05];
        let mut data = variable_data(SHIM_LOCK, "Shim", &cert);
        let used = data.len();
        data.extend([0, 0, 0, 0, 0, 0xaf]);
        let authority = |digest: Vec<u8>, data: Vec<u8>| event(event_type::EFI_VARIABLE_AUTHORITY, 7, digest, data);
        let e = authority(HashAlg::Sha256.digest(&data[..used + 5]), data.clone());
        let got = authority_certificates(&e, HashAlg::Sha256).unwrap().unwrap();
        assert_eq!(
            got,
            vec![SignatureData {
                owner: None,
                data: cert
            }]
        );
        // The digest must cover the whole variable.
        let short = authority(HashAlg::Sha256.digest(&data[..used - 1]), data.clone());
        assert!(efi_variable(&short, HashAlg::Sha256).is_err());
        // Nine bytes after it are too many, and only authorities may have any.
        let mut long = data.clone();
        long.extend([0, 0, 0]);
        let e = authority(HashAlg::Sha256.digest(&long), long);
        assert!(matches!(
            efi_variable(&e, HashAlg::Sha256),
            Err(EventLogError::BadEventData { .. })
        ));
        let config = event(
            event_type::EFI_VARIABLE_DRIVER_CONFIG,
            7,
            HashAlg::Sha256.digest(&data),
            data,
        );
        assert!(matches!(
            efi_variable(&config, HashAlg::Sha256),
            Err(EventLogError::BadEventData { .. })
        ));
    }

    #[test]
    fn authorities_without_a_certificate_list_nothing() {
        let data = variable_data(SHIM_LOCK, "SbatLevel", b"sbat,1,2021030218\n");
        let e = event(
            event_type::EFI_VARIABLE_AUTHORITY,
            7,
            HashAlg::Sha256.digest(&data),
            data,
        );
        assert_eq!(authority_certificates(&e, HashAlg::Sha256), Ok(Some(Vec::new())));
    }

    #[test]
    fn separators_read_and_check() {
        let e = event(event_type::SEPARATOR, 4, HashAlg::Sha256.digest(&[0; 4]), vec![0; 4]);
        assert_eq!(separator(&e, HashAlg::Sha256), Ok(Some(Separator::Normal)));
        let forged = event(event_type::SEPARATOR, 4, vec![0; 32], vec![0; 4]);
        assert!(separator(&forged, HashAlg::Sha256).is_err());
    }

    #[test]
    fn linux_stub_tags_decode() {
        let mut data = LINUX_INITRD_TAG.to_le_bytes().to_vec();
        data.extend(13u32.to_le_bytes());
        data.extend(b"Linux initrd\0");
        let e = event(event_type::EVENT_TAG, 9, vec![0; 32], data.clone());
        assert_eq!(linux_stub_event(&e), Ok(Some(LinuxStubEvent::Initrd)));
        let short = event(event_type::EVENT_TAG, 9, vec![0; 32], data[..12].to_vec());
        assert!(linux_stub_event(&short).is_err());
    }

    #[test]
    fn authorities_read_in_each_form() {
        let cert = {
            let mut c = vec![0x30, 0x03, 0x02, 0x01, 0x05];
            c.truncate(5);
            c
        };
        let owner = guid_bytes(SHIM_LOCK);
        let authority = |value: Vec<u8>| {
            let data = variable_data(EFI_IMAGE_SECURITY_DATABASE, "db", &value);
            event(
                event_type::EFI_VARIABLE_AUTHORITY,
                7,
                HashAlg::Sha256.digest(&data),
                data,
            )
        };
        // EFI_SIGNATURE_DATA.
        let one = authority([owner.clone(), cert.clone()].concat());
        let got = authority_certificates(&one, HashAlg::Sha256).unwrap().unwrap();
        assert_eq!(
            got,
            vec![SignatureData {
                owner: Some(SHIM_LOCK.into()),
                data: cert.clone()
            }]
        );
        // A bare certificate.
        let bare = authority(cert.clone());
        let got = authority_certificates(&bare, HashAlg::Sha256).unwrap().unwrap();
        assert_eq!(
            got,
            vec![SignatureData {
                owner: None,
                data: cert.clone()
            }]
        );
        // An EFI_SIGNATURE_LIST of two.
        let entry = [owner.clone(), cert.clone()].concat();
        let mut list = guid_bytes(EFI_CERT_X509);
        list.extend((28 + 2 * entry.len() as u32).to_le_bytes());
        list.extend(0u32.to_le_bytes());
        list.extend((entry.len() as u32).to_le_bytes());
        list.extend(&entry);
        list.extend(&entry);
        let got = authority_certificates(&authority(list), HashAlg::Sha256)
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].data, cert);
    }

    #[test]
    fn image_paths_read_from_the_device_path() {
        let mut path = vec![0x04, 0x04];
        let name: Vec<u8> = "\\EFI\\BOOT\\BOOTX64.EFI\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        path.extend(((4 + name.len()) as u16).to_le_bytes());
        path.extend(name);
        path.extend([0x7f, 0xff, 4, 0]);
        let mut data = vec![0; 24];
        data.extend((path.len() as u64).to_le_bytes());
        data.extend(path);
        let e = event(event_type::EFI_BOOT_SERVICES_APPLICATION, 4, vec![0; 32], data);
        assert_eq!(image_path(&e).as_deref(), Some("\\EFI\\BOOT\\BOOTX64.EFI"));
    }
}
