//! RHEL-family grub's boot path (RHEL, Rocky, Alma, CentOS Stream, Fedora): the firmware starts
//! shim (`/boot/efi/EFI/<vendor>/shimx64.efi`, vendor `redhat`, `centos`, `rocky`, `almalinux`
//! or `fedora`), shim starts `grubx64.efi` beside it, and grub's `blscfg` command turns each
//! BLS entry of `/boot/loader/entries` ([`bls`](super::bls)) into a menu entry whose script is
//! `linux <linux> <options>` and `initrd <initrd>`.
//!
//! That script runs at boot, so its `$name`s are grub's variables then: `grubenv` (loaded by
//! `/boot/grub2/grub.cfg` before `blscfg`) sets `kernelopts` on RHEL 8 (RHEL 9 writes the
//! options into the entries), and grub.cfg itself sets the rest (`tuned_params`, and
//! `kernelopts` where grubenv lacks it). A variable set by neither expands to nothing, as in
//! grub. grub measures the expanded words as the upstream grub does ([`grub_cfg`](super::grub_cfg)):
//! `grub_kernel_cmdline (hd0,gpt2)/vmlinuz-VER root=... ro` in the real RHEL 8 log
//! (`go_tpm_tools_rhel8_gce_eventlog`). The policy's command line names the kernel as the entry
//! does (`/vmlinuz-VER`): the judge compares the arguments only, since the device grub prefixes
//! is grub's name for where it read the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::bls::{self, Choice, Entry};
use super::grub_cfg::{self, GrubCfgError};
use super::{BootApplication, BootFiles, BootPolicyArgs, command_line_or, files, initrd_or, reads_configuration};

/// What replaces reading the entries.
const GIVE: &str = "give --kernel PATH, --initrd PATH or --no-initrd, and --command-line TEXT or --no-command-line";

/// The files of RHEL-family grub's boot path under `args.root`, the flags' where given.
pub fn read(args: &BootPolicyArgs) -> Result<BootFiles> {
    let root = &args.root;
    let (shim, grub) = files::shim_and_grub(args)?;
    let mut notes = Vec::new();
    let chosen = if args.kernel.is_none() || reads_configuration(args) {
        let entries = bls::read_dir(&root.join("boot/loader/entries"), GIVE)?;
        let choice = Choice::from_args(args, true);
        let (file, entry) = bls::choose(&entries, choice)?;
        notes.push(format!("BLS entry {}", file.display()));
        Some((file.clone(), entry.clone()))
    } else {
        None
    };
    let kernel = match (&args.kernel, &chosen) {
        (Some(path), _) => path.clone(),
        (None, Some((file, entry))) => boot_file(root, entry.linux(file)?),
        (None, None) => bail!("no BLS entry was read: give --kernel PATH"),
    };
    // Read once, for the initrd and the command line alike (and their notes given once).
    let mut variables = if chosen.is_some() && reads_configuration(args) {
        variables(root, args, &shim)?
    } else {
        BTreeMap::new()
    };
    let initrd = initrd_or(args, || {
        let (file, entry) = chosen.as_ref().context("no BLS entry was read: give --initrd PATH")?;
        let paths = expand(&entry.initrds.join(" "), &mut variables, &mut notes)
            .with_context(|| format!("{}'s initrd line: give --initrd PATH or --no-initrd", file.display()))?;
        match paths.as_slice() {
            [] => {
                notes.push(format!("{} loads no initrd: the policy lists none", file.display()));
                Ok(None)
            }
            [path] => Ok(Some(boot_file(root, path))),
            more => bail!(
                "{} loads {} initrds ({}), and the policy's initrd is one file: give --initrd PATH or --no-initrd",
                file.display(),
                more.len(),
                more.join(" ")
            ),
        }
    })?;
    let command_line = command_line_or(args, || {
        let (file, entry) = chosen
            .as_ref()
            .context("no BLS entry was read: give --command-line TEXT")?;
        command_line(file, entry, &mut variables, &mut notes).map(Some)
    })?;
    Ok(BootFiles {
        bootloaders: vec![BootApplication::shim(shim), BootApplication::loader("grub", grub)],
        kernel,
        kernel_file: true,
        initrd,
        command_line,
        notes,
    })
}

/// The command line grub measures for `entry`: its `linux` path and `options`, expanded.
fn command_line(
    file: &Path,
    entry: &Entry,
    variables: &mut BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> Result<String> {
    let line = format!("{} {}", entry.linux(file)?, entry.options());
    let words = expand(&line, variables, notes)
        .with_context(|| format!("{}: give --command-line TEXT, or --no-command-line", file.display()))?;
    Ok(grub_cfg::loader_command_line(&words))
}

/// grub's words of `text`, a variable set nowhere expanding to nothing (noted).
fn expand(
    text: &str,
    variables: &mut BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> Result<Vec<String>, GrubCfgError> {
    loop {
        match grub_cfg::expand_words(text, variables) {
            Err(GrubCfgError::Variable { name, times: 0 }) if !variables.contains_key(&name) => {
                notes.push(format!(
                    "${name} is set neither in grubenv nor in grub.cfg: read as empty, as grub expands it"
                ));
                variables.insert(name, String::new());
            }
            other => return other,
        }
    }
}

/// grub's variables when `blscfg` runs: grubenv's, then those grub.cfg sets once that grubenv
/// does not.
fn variables(root: &Path, args: &BootPolicyArgs, shim: &Path) -> Result<BTreeMap<String, String>> {
    // RHEL 8 links /boot/grub2/grubenv to the ESP's copy beside shim (which grub.cfg loads);
    // a link that leaves --root is read there directly.
    let grubenv = [root.join("boot/grub2/grubenv"), shim.with_file_name("grubenv")]
        .into_iter()
        .find(|p| p.is_file());
    let mut variables = match &grubenv {
        Some(path) => parse_grubenv(&files::read_text(path, "grubenv", "--command-line TEXT")?),
        None => BTreeMap::new(),
    };
    let cfg = args
        .grub_cfg
        .clone()
        .unwrap_or_else(|| root.join("boot/grub2/grub.cfg"));
    if args.grub_cfg.is_some() || cfg.is_file() {
        let text = files::read_text(&cfg, "grub.cfg", "--grub-cfg PATH, or --command-line TEXT")?;
        for (name, value) in grub_cfg::set_once(&text) {
            variables.entry(name).or_insert(value);
        }
    }
    Ok(variables)
}

/// A grub environment block: `name=value` lines after the `# GRUB Environment Block` header,
/// padded with `#` (`grub-editenv`; a value's `\` and newline are escaped with `\`).
fn parse_grubenv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(name, value)| {
            let mut out = String::with_capacity(value.len());
            let mut chars = value.chars();
            while let Some(c) = chars.next() {
                match (c, chars.clone().next()) {
                    ('\\', Some('n')) => {
                        out.push('\n');
                        chars.next();
                    }
                    ('\\', Some(next)) => {
                        out.push(next);
                        chars.next();
                    }
                    _ => out.push(c),
                }
            }
            (name.to_owned(), out)
        })
        .collect()
}

/// A file an entry names: entries are relative to the partition holding them, which is `/boot`
/// when it is its own (`/vmlinuz-VER`) and `/` otherwise (`/boot/vmlinuz-VER`).
fn boot_file(root: &Path, path: &str) -> PathBuf {
    let on_boot = bls::under(&root.join("boot"), path);
    let on_root = bls::under(root, path);
    if !on_boot.exists() && on_root.is_file() {
        on_root
    } else {
        on_boot
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn args(root: &Path) -> BootPolicyArgs {
        BootPolicyArgs::defaults(root)
    }

    const ID: &str = "40dbec753972719b80322b2d180ca1c2";

    /// A RHEL 8 image root as the installer leaves it (the values of the real RHEL 8 log's
    /// boot), with an older kernel and the rescue entry beside the newest.
    fn rhel8() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        for dir in [
            "boot/efi/EFI/redhat",
            "boot/efi/EFI/BOOT",
            "boot/grub2",
            "boot/loader/entries",
        ] {
            std::fs::create_dir_all(r.join(dir)).expect("mkdir");
        }
        for file in ["boot/efi/EFI/redhat/shimx64.efi", "boot/efi/EFI/redhat/grubx64.efi"] {
            std::fs::write(r.join(file), b"pe").expect("write");
        }
        for version in ["4.18.0-240.22.1.el8_3.x86_64", "4.18.0-240.el8.x86_64"] {
            std::fs::write(r.join(format!("boot/vmlinuz-{version}")), b"kernel").expect("write");
            std::fs::write(r.join(format!("boot/initramfs-{version}.img")), b"initrd").expect("write");
            std::fs::write(
                r.join(format!("boot/loader/entries/{ID}-{version}.conf")),
                format!(
                    "title Red Hat Enterprise Linux ({version}) 8.3 (Ootpa)\nversion {version}\n\
                     linux /vmlinuz-{version}\ninitrd /initramfs-{version}.img $tuned_initrd\n\
                     options $kernelopts $tuned_params\nid rhel-{version}\ngrub_users $grub_users\n\
                     grub_arg --unrestricted\ngrub_class kernel\n"
                ),
            )
            .expect("write");
        }
        std::fs::write(
            r.join(format!("boot/loader/entries/{ID}-0-rescue.conf")),
            format!(
                "title Red Hat Enterprise Linux (0-rescue-{ID}) 8.3 (Ootpa)\nversion 4.18.0-999.el8.x86_64\n\
                 linux /vmlinuz-0-rescue-{ID}\ninitrd /initramfs-0-rescue-{ID}.img\noptions $kernelopts\n"
            ),
        )
        .expect("write");
        // grub-editenv's block: the header, the variables, `#` padding to 1024 bytes.
        let mut env = "# GRUB Environment Block\n\
                       saved_entry=40dbec753972719b80322b2d180ca1c2-4.18.0-240.22.1.el8_3.x86_64\n\
                       kernelopts=root=UUID=f3948fb4-cce7-4193-940a-c50052e93bf3 ro net.ifnames=0 biosdevname=0 \
                       scsi_mod.use_blk_mq=Y crashkernel=auto console=ttyS0,38400n8  \n\
                       boot_success=0\n"
            .to_owned();
        env.push_str(&"#".repeat(1024 - env.len()));
        std::fs::write(r.join("boot/grub2/grubenv"), env).expect("write");
        std::fs::write(
            r.join("boot/grub2/grub.cfg"),
            "load_env -f ${config_directory}/grubenv\nset tuned_params=\"\"\nset tuned_initrd=\"\"\n\
             if [ -z \"${kernelopts}\" ]; then\n  set kernelopts=\"root=/dev/mapper/rhel-root ro \"\nfi\n\
             insmod blscfg\nblscfg\n",
        )
        .expect("write");
        root
    }

    /// The real RHEL 8 log's `grub_kernel_cmdline`, without its `(hd0,gpt2)/boot` device and
    /// folder.
    const MEASURED: &str = "/vmlinuz-4.18.0-240.22.1.el8_3.x86_64 root=UUID=f3948fb4-cce7-4193-940a-c50052e93bf3 ro \
                            net.ifnames=0 biosdevname=0 scsi_mod.use_blk_mq=Y crashkernel=auto console=ttyS0,38400n8";

    #[test]
    fn the_newest_entry_s_files_and_its_expanded_command_line_are_read() {
        let root = rhel8();
        let r = root.path();
        let files = read(&args(r)).expect("rhel-grub");
        assert_eq!(
            files.bootloaders.iter().map(|a| a.path.clone()).collect::<Vec<_>>(),
            vec![
                r.join("boot/efi/EFI/redhat/shimx64.efi"),
                r.join("boot/efi/EFI/redhat/grubx64.efi")
            ]
        );
        assert_eq!(files.kernel, r.join("boot/vmlinuz-4.18.0-240.22.1.el8_3.x86_64"));
        assert!(files.kernel_file);
        assert_eq!(
            files.initrd,
            Some(r.join("boot/initramfs-4.18.0-240.22.1.el8_3.x86_64.img"))
        );
        assert_eq!(files.command_line.as_deref(), Some(MEASURED));

        let mut older = args(r);
        older.kernel_version = Some("4.18.0-240.el8.x86_64".into());
        let files = read(&older).expect("rhel-grub");
        assert_eq!(files.kernel, r.join("boot/vmlinuz-4.18.0-240.el8.x86_64"));
        assert!(
            files
                .command_line
                .as_deref()
                .is_some_and(|c| c.starts_with("/vmlinuz-4.18.0-240.el8.x86_64 root=UUID="))
        );
    }

    #[test]
    fn kernelopts_comes_from_grubenv_else_grub_cfg_else_nothing() {
        let root = rhel8();
        let r = root.path();
        // Without grubenv, grub.cfg's fallback `set kernelopts=...` (set once) is what boots.
        std::fs::remove_file(r.join("boot/grub2/grubenv")).expect("rm");
        let files = read(&args(r)).expect("rhel-grub");
        assert_eq!(
            files.command_line.as_deref(),
            Some("/vmlinuz-4.18.0-240.22.1.el8_3.x86_64 root=/dev/mapper/rhel-root ro")
        );
        // Without either, the options are empty and the bake's log says so.
        std::fs::write(r.join("boot/grub2/grub.cfg"), "blscfg\n").expect("write");
        let files = read(&args(r)).expect("rhel-grub");
        assert_eq!(
            files.command_line.as_deref(),
            Some("/vmlinuz-4.18.0-240.22.1.el8_3.x86_64")
        );
        assert!(
            files.notes.iter().any(|n| n.contains("$kernelopts is set neither")),
            "{:?}",
            files.notes
        );
    }

    #[test]
    fn grubenv_values_are_unescaped_and_padding_skipped() {
        let env = parse_grubenv("# GRUB Environment Block\na=b c\\\\d\\nx\nempty=\n######\n");
        assert_eq!(env.get("a").map(String::as_str), Some("b c\\d\nx"));
        assert_eq!(env.get("empty").map(String::as_str), Some(""));
        assert_eq!(env.len(), 2);
    }

    #[test]
    fn flags_replace_what_the_entry_gives_and_entries_of_boot_on_root_are_found() {
        let root = rhel8();
        let r = root.path();
        let mut given = args(r);
        given.kernel = Some(PathBuf::from("/k"));
        given.no_initrd = true;
        given.command_line = Some("ro".into());
        given.shim = Some(PathBuf::from("/s"));
        // Nothing is read: the entries may be gone.
        std::fs::remove_dir_all(r.join("boot/loader")).expect("rm");
        let files = read(&given).expect("rhel-grub");
        assert_eq!(files.kernel, PathBuf::from("/k"));
        assert_eq!(files.bootloaders[1].path, PathBuf::from("/grubx64.efi"));
        assert_eq!((files.initrd, files.command_line.as_deref()), (None, Some("ro")));
        given.command_line = None;
        let error = format!("{:#}", read(&given).expect_err("no entries"));
        assert!(error.contains("--command-line TEXT"), "{error}");

        // /boot on the root file system: the entry names /boot/vmlinuz-VER.
        let boot = root.path().join("boot");
        assert_eq!(
            boot_file(r, "/vmlinuz-4.18.0-240.el8.x86_64"),
            boot.join("vmlinuz-4.18.0-240.el8.x86_64")
        );
        assert_eq!(
            boot_file(r, "/boot/vmlinuz-4.18.0-240.el8.x86_64"),
            boot.join("vmlinuz-4.18.0-240.el8.x86_64")
        );
    }
}
