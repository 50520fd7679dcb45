//! PCRs 8 and 9, as wholes: every event read as a step of the boot path that measured it, then
//! the kernel command line and the initrd each taken from the one step that measured them.
//!
//! The boot paths and what they measure:
//!
//! | path | PCR 8 | PCR 9 |
//! |---|---|---|
//! | grub (Debian, Ubuntu, RHEL 9, Fedora) | `grub_cmd: <command>`, `kernel_cmdline: <line>`; the digest covers the text after the prefix | every file grub read (`EV_IPL` naming it; the digest is the file's) |
//! | RHEL-family grub (RHEL, Rocky, Alma 8, RHCOS 8) | `grub_cmd <command>` (the digest covers the command and its NUL), `grub_kernel_cmdline <line>` | `grub_linuxefi Kernel`, `grub_linuxefi Initrd` (the files' digests) |
//! | systemd-boot (before 251; later ones measure into PCR 12, not read) | its load options, UTF-16LE with their NUL, covered by the digest | nothing of its own |
//! | the Linux EFI stub (kernels from 5.19, UKIs) | nothing | `EV_EVENT_TAG` load options and initrd, after any grub file |
//!
//! Refused: any other event in PCR 8 or 9; a grub string whose digest does not cover its text
//! (a rewritten command); a second kernel (`linux`), command line or initrd command; a
//! `kernel_cmdline` that does not follow its `linux` command; grub's and systemd-boot's forms in
//! one PCR 8; a file grub read after the Linux stub ran; a stub event measured twice; and, where
//! the image gives the kernel file, any PCR 9 file after the kernel file but the initrd.

use super::{BootRefusal, names, refuse, separators};
use crate::identity::truncate;
use crate::tpm::boot_policy::{Image, short_hex};
use crate::tpm::event_log::events::ipl_label;
use crate::tpm::event_log::{Event, EventLog, HashAlg, LinuxStubEvent, event_type, linux_stub_event};

/// What a grub string is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrubKind {
    /// A command of grub's script.
    Command,
    /// The kernel command line grub's `linux` loader built.
    KernelCmdline,
}

/// The prefixes grub writes before the string it measures: upstream grub (`commands/tpm.c`)
/// and RHEL-family grub's own TPM patches (`grub_tpm_measure`'s `"%s %s"` of kind and text).
const GRUB_FORMS: [(&str, GrubKind); 4] = [
    ("grub_cmd: ", GrubKind::Command),
    ("kernel_cmdline: ", GrubKind::KernelCmdline),
    ("grub_cmd ", GrubKind::Command),
    ("grub_kernel_cmdline ", GrubKind::KernelCmdline),
];

/// grub's commands that load a kernel, and an initrd.
const LINUX_COMMANDS: [&str; 3] = ["linux", "linuxefi", "linux16"];
const INITRD_COMMANDS: [&str; 3] = ["initrd", "initrdefi", "initrd16"];

/// One PCR 8 event, read.
#[derive(Debug)]
enum Pcr8Step<'l> {
    Grub {
        event: &'l Event,
        kind: GrubKind,
        text: String,
    },
    /// systemd-boot's load options (without the NUL).
    LoadOptions { event: &'l Event, text: String },
}

/// What the boot measured of the kernel's command line and initrd.
#[derive(Debug, Default)]
struct Measured<'l> {
    /// grub's `kernel_cmdline` (either form), or systemd-boot's load options: the text.
    command_lines: Vec<(&'l Event, String)>,
    /// The Linux stub's load options: the digest of the UTF-16 bytes.
    stub_load_options: Option<&'l Event>,
    /// The Linux stub's initrd.
    stub_initrd: Option<&'l Event>,
    /// grub's `initrd` command and the paths it names.
    initrd_command: Option<(&'l Event, Vec<String>)>,
    /// The files grub read (PCR 9), in order.
    grub_files: Vec<&'l Event>,
}

/// Whether the policy reads PCRs 8 and 9.
pub(super) fn reads(images: &[Image]) -> bool {
    images
        .iter()
        .any(|i| i.command_line.is_some() || i.initrd.is_some() || i.kernel_file.is_some())
}

/// Judges PCRs 8 and 9: the images whose command line and initrd the boot measured.
pub(super) fn judge<'p>(
    log: &EventLog,
    alg: HashAlg,
    candidates: Vec<&'p Image>,
) -> Result<(Vec<&'p Image>, Vec<&'static str>), BootRefusal> {
    let measured = read(log, alg)?;
    let mut what = Vec::new();
    let candidates = command_line(&measured, alg, candidates, &mut what)?;
    let candidates = initrd(&measured, alg, candidates, &mut what)?;
    Ok((candidates, what))
}

fn read(log: &EventLog, alg: HashAlg) -> Result<Measured<'_>, BootRefusal> {
    let mut measured = Measured::default();
    let steps = super::of_pcr(log, 8)
        .map(|event| pcr8_step(event, alg))
        .collect::<Result<Vec<_>, _>>()?;
    let grub = steps.iter().any(|s| matches!(s, Pcr8Step::Grub { .. }));
    let mut linux: Option<usize> = None;
    for (i, step) in steps.iter().enumerate() {
        match step {
            Pcr8Step::LoadOptions { event, text } => {
                if grub {
                    return Err(refuse(format!(
                        "{}: systemd-boot's load options in a PCR 8 that grub measured: two boot paths in one boot",
                        event.describe()
                    )));
                }
                if let Some((first, _)) = measured.command_lines.first() {
                    return Err(twice(event, "systemd-boot's load options", first));
                }
                measured.command_lines.push((event, text.clone()));
            }
            Pcr8Step::Grub {
                event,
                kind: GrubKind::Command,
                text,
            } => {
                let mut words = text.split_whitespace();
                let command = words.next().unwrap_or_default();
                if LINUX_COMMANDS.contains(&command) {
                    if let Some(first) = linux {
                        return Err(twice(
                            event,
                            "a kernel (grub's linux command)",
                            pcr8_event(&steps[first]),
                        ));
                    }
                    linux = Some(i);
                } else if INITRD_COMMANDS.contains(&command) {
                    if linux.is_none() {
                        return Err(refuse(format!(
                            "{}: grub's initrd command before any linux command",
                            event.describe()
                        )));
                    }
                    if let Some((first, _)) = &measured.initrd_command {
                        return Err(twice(event, "an initrd (grub's initrd command)", first));
                    }
                    let paths = words.filter(|w| !w.starts_with("--")).map(str::to_owned).collect();
                    measured.initrd_command = Some((event, paths));
                }
            }
            Pcr8Step::Grub {
                event,
                kind: GrubKind::KernelCmdline,
                text,
            } => {
                if let Some((first, _)) = measured.command_lines.first() {
                    return Err(twice(event, "the kernel command line", first));
                }
                if linux.is_none_or(|l| l + 1 != i) {
                    return Err(refuse(format!(
                        "{}: grub measures the kernel command line right after its linux command, and this one {}",
                        event.describe(),
                        if linux.is_none() {
                            "has none before it"
                        } else {
                            "does not follow it"
                        }
                    )));
                }
                measured.command_lines.push((event, text.clone()));
            }
        }
    }
    // grub's linux loader measures the command line it built right after its command: a
    // `linux` followed by anything else hides its command line (relabelled, or rewritten).
    if let Some(l) = linux {
        let command = pcr8_event(&steps[l]);
        match steps.get(l + 1) {
            Some(Pcr8Step::Grub {
                kind: GrubKind::KernelCmdline,
                ..
            }) => {}
            Some(other) => {
                return Err(refuse(format!(
                    "{}: follows grub's linux command ({}), where grub measures the kernel command line it built",
                    pcr8_event(other).describe(),
                    command.describe()
                )));
            }
            None => {
                return Err(refuse(format!(
                    "{}: grub's linux command, and no kernel command line is measured after it",
                    command.describe()
                )));
            }
        }
    }
    for event in super::of_pcr(log, 9) {
        match event.event_type {
            event_type::IPL => {
                if !grub {
                    return Err(refuse(format!(
                        "{}: a file read in PCR 9 ({:?}) without grub's commands in PCR 8: no boot path here reads files",
                        event.describe(),
                        ipl_label(event)
                            .map(|l| truncate(&l, 120).to_owned())
                            .unwrap_or_default()
                    )));
                }
                if let Some(stub) = measured.stub_load_options.or(measured.stub_initrd) {
                    return Err(refuse(format!(
                        "{}: a file read in PCR 9 after the Linux EFI stub ran ({}): nothing in the boot reads it",
                        event.describe(),
                        stub.describe()
                    )));
                }
                measured.grub_files.push(event);
            }
            event_type::EVENT_TAG => match linux_stub_event(event)? {
                Some(LinuxStubEvent::LoadOptions) => {
                    if let Some(first) = measured.stub_load_options {
                        return Err(twice(event, "the Linux EFI stub's load options", first));
                    }
                    measured.stub_load_options = Some(event);
                }
                Some(LinuxStubEvent::Initrd) => {
                    if let Some(first) = measured.stub_initrd {
                        return Err(twice(event, "the Linux EFI stub's initrd", first));
                    }
                    measured.stub_initrd = Some(event);
                }
                _ => {
                    return Err(refuse(format!(
                        "{}: a tagged event of no boot path the policy judges (the Linux EFI stub tags 0x8F3B22EC and 0x8F3B22ED)",
                        event.describe()
                    )));
                }
            },
            _ => {
                return Err(refuse(format!(
                    "{}: not an event of a boot path in PCR 9 (grub's files, the Linux EFI stub's tagged events)",
                    event.describe()
                )));
            }
        }
    }
    Ok(measured)
}

fn pcr8_event<'l>(step: &Pcr8Step<'l>) -> &'l Event {
    match step {
        Pcr8Step::Grub { event, .. } | Pcr8Step::LoadOptions { event, .. } => event,
    }
}

fn twice(event: &Event, what: &str, first: &Event) -> BootRefusal {
    refuse(format!(
        "{}: {what} measured a second time (first at event {}): each is measured once by the boot that ran it",
        event.describe(),
        first.index
    ))
}

/// Reads one PCR 8 event as grub's string or systemd-boot's load options.
fn pcr8_step(event: &Event, alg: HashAlg) -> Result<Pcr8Step<'_>, BootRefusal> {
    if event.event_type != event_type::IPL {
        return Err(refuse(format!(
            "{}: not an event of a boot path in PCR 8 (grub's EV_IPL strings, systemd-boot's load options)",
            event.describe()
        )));
    }
    let digest = event
        .digest(alg)
        .ok_or_else(|| refuse(format!("{}: no {alg} digest", event.describe())))?;
    let text = event.data.strip_suffix(&[0]).unwrap_or(&event.data);
    for (prefix, kind) in GRUB_FORMS {
        let Some(string) = text.strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        // Upstream grub hashes the string alone; RHEL-family grub's `grub_cmd ` the string and
        // its NUL (every command of `go_tpm_tools_rhel8_gce_eventlog`); a digest of the whole
        // text covers it too.
        let with_nul = [string, &[0]].concat();
        let covered = digest == alg.digest(string).as_slice()
            || (prefix == "grub_cmd " && digest == alg.digest(&with_nul).as_slice())
            || separators::covers(event, alg);
        if !covered {
            return Err(refuse(format!(
                "{}: its digest does not cover its text {:?}: not the string grub measured",
                event.describe(),
                truncate(&String::from_utf8_lossy(text), 120)
            )));
        }
        let string = std::str::from_utf8(string)
            .map_err(|_| refuse(format!("{}: the {prefix:?} text is not UTF-8", event.describe())))?;
        return Ok(Pcr8Step::Grub {
            event,
            kind,
            text: string.to_owned(),
        });
    }
    if let Some(options) = utf16_load_options(&event.data)
        && separators::covers(event, alg)
    {
        return Ok(Pcr8Step::LoadOptions { event, text: options });
    }
    // Older systemd-boot logs its options one byte short of the NUL it measured
    // (`go_tpm_tools_arch_linux_workstation_systemd_boot_eventlog`): the digest covers the data
    // and one more zero byte.
    if event.data.len() % 2 == 1 && event.data.last() == Some(&0) {
        let measured = [event.data.as_slice(), &[0]].concat();
        if let Some(options) = utf16_load_options(&measured)
            && digest == alg.digest(&measured).as_slice()
        {
            return Ok(Pcr8Step::LoadOptions { event, text: options });
        }
    }
    Err(refuse(format!(
        "{}: neither a grub string (grub_cmd, kernel_cmdline) nor systemd-boot's load options whose digest covers them",
        event.describe()
    )))
}

/// systemd-boot's load options: UTF-16LE text ending in its NUL, nothing but text before it.
fn utf16_load_options(data: &[u8]) -> Option<String> {
    if data.len() < 2 || !data.len().is_multiple_of(2) {
        return None;
    }
    let units: Vec<u16> = data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    let (last, text) = units.split_last()?;
    if *last != 0 || text.contains(&0) {
        return None;
    }
    let text = String::from_utf16(text).ok()?;
    text.chars().all(|c| !c.is_control() || c == '\t').then_some(text)
}

/// The command line without grub's `BOOT_IMAGE=` (what `/proc/cmdline` shows and the load
/// options carry; grub's `kernel_cmdline:` leaves it out).
fn bare(command_line: &str) -> &str {
    command_line
        .strip_prefix("BOOT_IMAGE=")
        .unwrap_or(command_line)
        .trim_end()
}

/// The kernel's arguments: the command line without `BOOT_IMAGE=` and the kernel's path grub
/// writes first (`/boot/vmlinuz-6.1.0-28-amd64`, `(hd0,gpt2)/vmlinuz-...`). The path names the
/// file grub read, and which device grub called it by, not what booted: the kernel is its
/// Authenticode digest in PCR 4 (and its file digest in PCR 9), so a policy's command line
/// matches whatever grub named the device.
fn arguments(command_line: &str) -> Vec<&str> {
    let mut words: Vec<&str> = bare(command_line).split_whitespace().collect();
    if words.first().is_some_and(|w| w.starts_with('/') || w.starts_with('(')) {
        words.remove(0);
    }
    words
}

/// The load options a stub started with `command_line` measures: UTF-16LE, with or without
/// the terminating NUL and the `BOOT_IMAGE=` grub adds.
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

fn command_line<'p>(
    measured: &Measured<'_>,
    alg: HashAlg,
    mut candidates: Vec<&'p Image>,
    what: &mut Vec<&'static str>,
) -> Result<Vec<&'p Image>, BootRefusal> {
    if candidates.iter().all(|i| i.command_line.is_none()) {
        return Ok(candidates);
    }
    for (event, text) in &measured.command_lines {
        let matching: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|i| {
                i.command_line
                    .as_deref()
                    .is_none_or(|c| arguments(c) == arguments(text))
            })
            .collect();
        if matching.is_empty() {
            return Err(refuse(format!(
                "{}: command line {:?} is not the one of {}",
                event.describe(),
                truncate(text, 200),
                names(&candidates)
            )));
        }
        candidates = matching;
    }
    if let Some(event) = measured.stub_load_options {
        let digest = event
            .digest(alg)
            .ok_or_else(|| refuse(format!("{}: no {alg} digest", event.describe())))?;
        // Behind a loader that measured the command line it passed, the stub's options must be
        // that text (already held to the policy above).
        if let Some((loader, text)) = measured.command_lines.first() {
            if !load_options_digests(alg, text).iter().any(|d| d == digest) {
                return Err(refuse(format!(
                    "{}: the kernel's load options ({alg} {}) are not the command line the loader measured at event {}",
                    event.describe(),
                    short_hex(digest),
                    loader.index
                )));
            }
        } else {
            candidates = stub_options_match(event, digest, alg, candidates)?;
        }
    }
    if measured.command_lines.is_empty() && measured.stub_load_options.is_none() {
        let expecting: Vec<&Image> = candidates
            .iter()
            .copied()
            .filter(|i| i.command_line.is_some())
            .collect();
        candidates.retain(|i| i.command_line.is_none());
        if candidates.is_empty() {
            return Err(refuse(format!(
                "no kernel command line is measured (grub's PCR 8 kernel_cmdline, systemd-boot's PCR 8 load options, the EFI stub's PCR 9 load options), and {} gives one",
                names(&expecting)
            )));
        }
    } else {
        what.push("command line");
    }
    Ok(candidates)
}

/// The stub's options without a loader that measured them: the policy's command line as the
/// stub measures it.
fn stub_options_match<'p>(
    event: &Event,
    digest: &[u8],
    alg: HashAlg,
    candidates: Vec<&'p Image>,
) -> Result<Vec<&'p Image>, BootRefusal> {
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
    Ok(matching)
}

fn initrd<'p>(
    measured: &Measured<'_>,
    alg: HashAlg,
    mut candidates: Vec<&'p Image>,
    what: &mut Vec<&'static str>,
) -> Result<Vec<&'p Image>, BootRefusal> {
    let mut checked = false;
    if let Some(event) = measured.stub_initrd {
        candidates = initrd_is(event, alg, candidates)?;
        checked = true;
    }
    // grub's: the files read after the kernel file (where the image names it), else the last
    // file read, must be the one file of grub's one initrd command.
    // Each image read with its own kernel file: one that does not fit (a rollout's other
    // image) leaves the candidates, and its refusal is said only when none is left.
    let mut kept = Vec::new();
    let mut refusal = None;
    for image in candidates {
        match grub_initrd(measured, image) {
            Ok(GrubInitrd::NotLoaded) => kept.push((image, None)),
            Ok(GrubInitrd::File(event)) => kept.push((image, Some(event))),
            Err(r) => refusal = refusal.or(Some(r)),
        }
    }
    let mut candidates = Vec::new();
    for (image, file) in kept {
        let Some(event) = file else {
            candidates.push(image);
            continue;
        };
        checked = true;
        match initrd_is(event, alg, vec![image]) {
            Ok(_) => candidates.push(image),
            Err(r) => refusal = refusal.or(Some(r)),
        }
    }
    if candidates.is_empty() {
        return Err(refusal.unwrap_or_else(|| refuse("no image of the policy matches")));
    }
    if !checked {
        let expecting: Vec<&Image> = candidates.iter().copied().filter(|i| i.initrd.is_some()).collect();
        candidates.retain(|i| i.initrd.is_none());
        if candidates.is_empty() {
            return Err(refuse(format!(
                "no initrd is measured (grub's PCR 9 file of its initrd command, the EFI stub's PCR 9 initrd), and {} gives one",
                names(&expecting)
            )));
        }
    } else if candidates.iter().any(|i| i.initrd.is_some()) {
        what.push("initrd");
    }
    Ok(candidates)
}

enum GrubInitrd<'l> {
    /// grub loaded no initrd the image's rules read.
    NotLoaded,
    /// The PCR 9 event of the initrd file grub read.
    File(&'l Event),
}

/// grub's initrd for `image`: the structure of PCR 9's end, read with the image's kernel file.
fn grub_initrd<'l>(measured: &Measured<'l>, image: &Image) -> Result<GrubInitrd<'l>, BootRefusal> {
    let files = &measured.grub_files;
    let paths = measured.initrd_command.as_ref().map_or(0, |(_, p)| p.len());
    if let Some(kernel_file) = &image.kernel_file {
        let Some(at) = files
            .iter()
            .rposition(|e| e.digest(HashAlg::Sha256).is_some_and(|d| kernel_file.is(d)))
        else {
            if files.is_empty() && measured.initrd_command.is_none() {
                // Not a grub boot: the stub's events are judged instead.
                return Ok(GrubInitrd::NotLoaded);
            }
            return Err(refuse(format!(
                "PCR 9 holds no file of the kernel file's digest {} (image {}): grub did not read the image's kernel",
                kernel_file.short(),
                image.name
            )));
        };
        let after = &files[at + 1..];
        if after.len() != paths {
            let extra = after.get(paths).or(after.last()).copied().unwrap_or(files[at]);
            return Err(refuse(format!(
                "{}: PCR 9 holds {} file(s) after the kernel file (event {}), and grub's initrd command loaded {paths}: a file the boot does not explain",
                extra.describe(),
                after.len(),
                files[at].index
            )));
        }
    }
    let Some((command, paths)) = &measured.initrd_command else {
        return Ok(GrubInitrd::NotLoaded);
    };
    if image.initrd.is_none() {
        return Ok(GrubInitrd::NotLoaded);
    }
    if paths.len() != 1 {
        return Err(refuse(format!(
            "{}: grub's initrd command loads {} files, and the image's initrd is one file (image {})",
            command.describe(),
            paths.len(),
            image.name
        )));
    }
    let last = files.last().ok_or_else(|| {
        refuse(format!(
            "{}: grub's initrd command, and PCR 9 holds no file it read",
            command.describe()
        ))
    })?;
    Ok(GrubInitrd::File(last))
}

fn initrd_is<'p>(event: &Event, alg: HashAlg, candidates: Vec<&'p Image>) -> Result<Vec<&'p Image>, BootRefusal> {
    let digest = event
        .digest(alg)
        .ok_or_else(|| refuse(format!("{}: no {alg} digest", event.describe())))?;
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
    Ok(matching)
}
