//! systemd-boot's boot path: the firmware starts systemd-boot (`EFI/systemd/systemd-bootx64.efi`
//! on the ESP), or shim starts it where the image has shim in `EFI/<vendor>`; systemd-boot
//! starts the kernel of a Type #1 entry (`<esp>/loader/entries/*.conf`,
//! [`bls`](super::bls)) through the firmware's `LoadImage`, which measures it into PCR 4, and
//! hands it its load options.
//!
//! The load options are the entry's `initrd=<path>` for each `initrd` line (the path with
//! backslashes) and then its `options`, joined by single spaces: systemd-boot before 251
//! measures them into PCR 8 (UTF-16LE), the Linux EFI stub (5.19 and later) into PCR 9, and the
//! real Arch log (`go_tpm_tools_arch_linux_workstation_systemd_boot_eventlog`) shows exactly
//! `initrd=\intel-ucode.img initrd=\initramfs-linux-lts.img cryptdevice=... rw ...`. A later
//! systemd-boot that serves the initrds itself may leave the `initrd=` words out: check a
//! booted node's log, or give `--command-line`.
//!
//! No grub reads the kernel file, so the policy lists no `kernelFile`; the initrd is the one
//! file the stub measures, which is the entry's file only when it has one `initrd` line.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::bls::{self, Choice, Entry};
use super::{BootApplication, BootFiles, BootPolicyArgs, command_line_or, esp, files, initrd_or, reads_configuration};

/// What replaces reading the entries.
const GIVE: &str = "give --kernel PATH, --initrd PATH or --no-initrd, and --command-line TEXT or --no-command-line";

/// The files of systemd-boot's boot path under `args.root`, the flags' where given.
pub fn read(args: &BootPolicyArgs) -> Result<BootFiles> {
    let root = &args.root;
    let mut notes = Vec::new();
    let found = esp::first(root, esp::systemd_boot);
    let systemd_boot = match (&args.grub, &found) {
        (Some(path), _) => path.clone(),
        (None, Some((_, path))) => path.clone(),
        (None, None) => bail!(
            "no {} on an ESP under {} (looked in {}; give --grub PATH with systemd-boot's file, or another --boot-path)",
            esp::SYSTEMD_BOOT,
            root.display(),
            esp::looked_in()
        ),
    };
    // The ESP holding the entries: systemd-boot's, else (systemd-boot given) the first with
    // entries.
    let esp_dir = found
        .map(|(esp, _)| esp)
        .or_else(|| esp::first(root, |e| esp::has_entries(e).then_some(())).map(|(esp, ())| esp));
    let need_esp = || {
        esp_dir.as_deref().with_context(|| {
            format!(
                "no ESP with loader/entries/*.conf under {} (looked in {}; {GIVE})",
                root.display(),
                esp::looked_in()
            )
        })
    };
    let shim = match &args.shim {
        Some(path) => Some(path.clone()),
        None => esp_dir.as_deref().map(esp::shim).transpose()?.flatten(),
    };
    if let Some(shim) = &shim
        && args.grub.is_none()
    {
        notes.extend(shim_starts_another(shim, &systemd_boot)?);
    }
    let chosen = if args.kernel.is_none() || reads_configuration(args) {
        let esp = need_esp()?;
        let entries = bls::read_dir(&esp.join(esp::ENTRIES_DIR), GIVE)?;
        let (file, entry) = choose(esp, &entries, args, &mut notes)?;
        notes.push(format!("systemd-boot entry {}", file.display()));
        Some((file.clone(), entry.clone()))
    } else {
        None
    };
    let kernel = match (&args.kernel, &chosen) {
        (Some(path), _) => path.clone(),
        (None, Some((file, entry))) => bls::under(need_esp()?, entry.linux(file)?),
        (None, None) => bail!("no entry was read: give --kernel PATH"),
    };
    let initrd = initrd_or(args, || {
        let (file, entry) = chosen.as_ref().context("no entry was read: give --initrd PATH")?;
        match entry.initrds.as_slice() {
            [one] => Ok(Some(bls::under(need_esp()?, one))),
            none_or_more => {
                notes.push(format!(
                    "{} has {} initrd lines, and the Linux stub measures the one initrd it is served: \
                     the policy lists none (give --initrd PATH to list one)",
                    file.display(),
                    none_or_more.len()
                ));
                Ok(None)
            }
        }
    })?;
    let command_line = command_line_or(args, || {
        let (_, entry) = chosen.as_ref().context("no entry was read: give --command-line TEXT")?;
        Ok(Some(load_options(entry)))
    })?;
    let mut bootloaders: Vec<BootApplication> = shim.into_iter().map(BootApplication::shim).collect();
    bootloaders.push(BootApplication::loader("systemd-boot", systemd_boot));
    Ok(BootFiles {
        bootloaders,
        kernel,
        kernel_file: false,
        initrd,
        command_line,
        notes,
    })
}

/// The load options systemd-boot hands `entry`'s kernel: `initrd=\path` for each `initrd`
/// line, then the `options`, joined by single spaces.
pub fn load_options(entry: &Entry) -> String {
    let options = entry.options();
    entry
        .initrds
        .iter()
        .map(|path| format!("initrd={}", esp::efi_path(path)))
        .chain(Some(options).filter(|o| !o.is_empty()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The entry that boots: `--kernel-version`'s, `--kernel`'s, else loader.conf's `default`
/// (newest of those it matches), else the newest, which is systemd-boot's own default order.
fn choose<'e>(
    esp: &Path,
    entries: &'e [(PathBuf, Entry)],
    args: &BootPolicyArgs,
    notes: &mut Vec<String>,
) -> Result<&'e (PathBuf, Entry)> {
    let choice = Choice::from_args(args, false);
    if choice.version.is_some() || choice.kernel_name.is_some() {
        return bls::choose(entries, choice);
    }
    let conf = esp.join("loader/loader.conf");
    let default = if conf.is_file() {
        files::read_text(&conf, "loader.conf", "--kernel-version VER")?
            .lines()
            .filter_map(|l| l.trim().strip_prefix("default"))
            .filter(|rest| rest.starts_with(|c: char| c.is_ascii_whitespace()))
            .map(|rest| rest.trim().to_owned())
            .next_back()
    } else {
        None
    };
    let Some(pattern) = default else {
        return bls::choose(entries, choice);
    };
    if pattern.starts_with('@') {
        notes.push(format!(
            "loader.conf's default {pattern} is decided at boot: the newest entry is read (give --kernel-version VER)"
        ));
        return bls::choose(entries, choice);
    }
    let matching: Vec<(PathBuf, Entry)> = entries
        .iter()
        .filter(|(_, e)| glob(&pattern, &format!("{}.conf", e.id)) || glob(&pattern, &e.id))
        .cloned()
        .collect();
    if matching.is_empty() {
        notes.push(format!(
            "loader.conf's default {pattern} matches no entry: the newest entry is read"
        ));
        return bls::choose(entries, choice);
    }
    let (file, _) = bls::choose(&matching, choice)?;
    entries
        .iter()
        .find(|(f, _)| f == file)
        .context("the chosen entry is one of the entries")
}

/// systemd-boot's `default` pattern match: `*` any run, `?` any one character.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic backtracking match: the last `*` seen and where it resumed.
    let (mut pi, mut ti, mut star, mut resume) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            resume = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            resume += 1;
            ti = resume;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// A note when shim, in front of systemd-boot, would start something else: shim starts the
/// `grubx64.efi` of its own folder, so an image booting systemd-boot through shim has
/// systemd-boot copied there.
fn shim_starts_another(shim: &Path, systemd_boot: &Path) -> Result<Option<String>> {
    let beside = shim.with_file_name("grubx64.efi");
    if !beside.is_file() {
        return Ok(None);
    }
    let same = files::read_file(&beside, "grubx64.efi beside shim", "--grub PATH")?
        == files::read_file(systemd_boot, "systemd-boot", "--grub PATH")?;
    Ok((!same).then(|| {
        format!(
            "shim starts {}, which is not {}: the policy lists systemd-boot after shim (give --grub PATH with the \
             file shim starts, or --boot-path grub or rhel-grub if grub boots)",
            beside.display(),
            systemd_boot.display()
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Arch workstation's entry whose load options the real log measured (PCR 8).
    const ARCH: &str = "title   Arch Linux (LTS)\nlinux   /vmlinuz-linux-lts\ninitrd  /intel-ucode.img\n\
                        initrd  /initramfs-linux-lts.img\noptions cryptdevice=UUID=5465369a-996d-42ca-9ad4-91d0082e0b34:cryptroot \
                        root=/dev/mapper/cryptroot rw intel_iommu=on iommu=pt l1tf=off\n";

    /// The load options as the real log holds them (UTF-16LE text of its PCR 8 event).
    const ARCH_MEASURED: &str = "initrd=\\intel-ucode.img initrd=\\initramfs-linux-lts.img \
                                 cryptdevice=UUID=5465369a-996d-42ca-9ad4-91d0082e0b34:cryptroot \
                                 root=/dev/mapper/cryptroot rw intel_iommu=on iommu=pt l1tf=off";

    #[test]
    fn the_load_options_are_the_arch_log_s() {
        assert_eq!(load_options(&Entry::parse("arch-lts", ARCH)), ARCH_MEASURED);
        // The real log's text, read from the log itself.
        let log = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../testdata/event_logs/go_tpm_tools_arch_linux_workstation_systemd_boot_eventlog"),
        )
        .expect("the Arch log");
        let utf16: Vec<u8> = ARCH_MEASURED.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert!(
            log.windows(utf16.len()).any(|w| w == utf16),
            "the Arch log holds the text"
        );
        assert_eq!(load_options(&Entry::parse("x", "linux /vmlinuz\noptions ro\n")), "ro");
        assert_eq!(
            load_options(&Entry::parse("x", "linux /vmlinuz\ninitrd /a//b.img\n")),
            "initrd=\\a\\b.img"
        );
    }

    /// An Arch-like root: systemd-boot on the ESP at /boot, two entries, loader.conf.
    fn arch(shim: bool) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        let esp = root.path().join("boot");
        for dir in ["EFI/systemd", "EFI/BOOT", "loader/entries"] {
            std::fs::create_dir_all(esp.join(dir)).expect("mkdir");
        }
        std::fs::write(esp.join(esp::SYSTEMD_BOOT), b"systemd-boot").expect("write");
        if shim {
            std::fs::create_dir_all(esp.join("EFI/arch")).expect("mkdir");
            std::fs::write(esp.join("EFI/arch/shimx64.efi"), b"shim").expect("write");
            std::fs::write(esp.join("EFI/arch/grubx64.efi"), b"systemd-boot").expect("write");
        }
        std::fs::write(esp.join("loader/entries/arch-lts.conf"), ARCH).expect("write");
        std::fs::write(
            esp.join("loader/entries/arch.conf"),
            "title Arch Linux\nlinux /vmlinuz-linux\ninitrd /initramfs-linux.img\noptions root=/dev/sda2 rw\n",
        )
        .expect("write");
        root
    }

    #[test]
    fn the_entry_s_files_and_load_options_are_read() {
        let root = arch(false);
        let esp = root.path().join("boot");
        std::fs::write(esp.join("loader/loader.conf"), "timeout 3\ndefault  arch-lts.conf\n").expect("write");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("systemd-boot");
        assert_eq!(
            files.bootloaders,
            vec![BootApplication::loader("systemd-boot", esp.join(esp::SYSTEMD_BOOT))]
        );
        assert_eq!(files.kernel, esp.join("vmlinuz-linux-lts"));
        assert!(!files.kernel_file);
        // Two initrd lines: the stub is served one file the entry does not name.
        assert_eq!(files.initrd, None);
        assert!(
            files.notes.iter().any(|n| n.contains("2 initrd lines")),
            "{:?}",
            files.notes
        );
        assert_eq!(files.command_line.as_deref(), Some(ARCH_MEASURED));

        // loader.conf's glob; without it the newest version ("linux-lts" > "linux").
        std::fs::write(esp.join("loader/loader.conf"), "default arch.c*\n").expect("write");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("systemd-boot");
        assert_eq!(files.kernel, esp.join("vmlinuz-linux"));
        assert_eq!(files.initrd, Some(esp.join("initramfs-linux.img")));
        assert_eq!(
            files.command_line.as_deref(),
            Some("initrd=\\initramfs-linux.img root=/dev/sda2 rw")
        );
        std::fs::remove_file(esp.join("loader/loader.conf")).expect("rm");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("systemd-boot");
        assert_eq!(files.kernel, esp.join("vmlinuz-linux-lts"));
    }

    #[test]
    fn shim_in_front_is_listed_first() {
        let root = arch(true);
        let esp = root.path().join("boot");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("systemd-boot");
        assert_eq!(
            files.bootloaders,
            vec![
                BootApplication::shim(esp.join("EFI/arch/shimx64.efi")),
                BootApplication::loader("systemd-boot", esp.join(esp::SYSTEMD_BOOT))
            ]
        );
        assert!(
            !files.notes.iter().any(|n| n.contains("shim starts")),
            "{:?}",
            files.notes
        );
        std::fs::write(esp.join("EFI/arch/grubx64.efi"), b"grub").expect("write");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("systemd-boot");
        assert!(
            files.notes.iter().any(|n| n.contains("shim starts")),
            "{:?}",
            files.notes
        );
    }

    #[test]
    fn without_systemd_boot_the_error_says_what_to_give() {
        let root = tempfile::tempdir().expect("tempdir");
        let error = format!(
            "{:#}",
            read(&BootPolicyArgs::defaults(root.path())).expect_err("nothing")
        );
        assert!(
            error.contains("systemd-bootx64.efi") && error.contains("--grub PATH"),
            "{error}"
        );
    }

    #[test]
    fn default_patterns_glob() {
        assert!(glob("arch-*", "arch-lts.conf"));
        assert!(glob("*.conf", "arch.conf"));
        assert!(glob("a?ch.conf", "arch.conf"));
        assert!(!glob("arch", "arch.conf"));
        assert!(!glob("*lts", "arch.conf"));
    }
}
