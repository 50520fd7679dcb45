//! Boot Loader Specification Type #1 entries (`loader/entries/*.conf`): the menu both
//! RHEL-family grub (its `blscfg` command) and systemd-boot build at boot, one file per kernel.
//!
//! An entry is `key value` lines (`#` starts a comment): `linux` the kernel, `initrd` an initrd
//! (one line each; RHEL's grub also reads several paths on one line), `options` the kernel's
//! arguments (several lines are joined by spaces), `version` the kernel's version. Paths are
//! relative to the partition holding the entries. Which entry boots is chosen here the way the
//! loaders' default does when nothing else says: the newest kernel version.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::files;

/// One entry, as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    /// The file's name without `.conf` (systemd-boot's and grub's id of the entry).
    pub id: String,
    /// `version`, when written.
    pub version: Option<String>,
    /// `linux`.
    pub linux: Option<String>,
    /// Each `initrd` line's value, in order.
    pub initrds: Vec<String>,
    /// Each `options` line's value, in order.
    pub options: Vec<String>,
}

impl Entry {
    /// Reads an entry's text; `id` names it.
    pub fn parse(id: &str, text: &str) -> Self {
        let mut entry = Entry {
            id: id.to_owned(),
            ..Entry::default()
        };
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once(|c: char| c.is_ascii_whitespace())
                .map_or((line, ""), |(k, v)| (k, v.trim()));
            match key {
                "version" => entry.version = Some(value.to_owned()),
                "linux" => entry.linux = Some(value.to_owned()),
                "initrd" => entry.initrds.push(value.to_owned()),
                "options" => entry.options.push(value.to_owned()),
                _ => {}
            }
        }
        entry
    }

    /// The kernel's version: `version`, else what follows `vmlinuz-` in the `linux` file's
    /// name, else the entry's id (kernel-install names entries `<machine-id>-<version>`).
    pub fn kernel_version(&self) -> &str {
        if let Some(version) = &self.version {
            return version;
        }
        self.linux
            .as_deref()
            .and_then(|l| l.rsplit('/').next())
            .and_then(|name| name.strip_prefix("vmlinuz-"))
            .unwrap_or(&self.id)
    }

    /// The `linux` value, which an entry that boots a kernel must have.
    pub fn linux(&self, file: &Path) -> Result<&str> {
        self.linux.as_deref().filter(|l| !l.is_empty()).with_context(|| {
            format!(
                "{} has no linux line (an entry starting an EFI program: give --boot-path uki --kernel PATH, \
                 or --kernel PATH)",
                file.display()
            )
        })
    }

    /// All `options` lines joined by spaces, as both loaders join them.
    pub fn options(&self) -> String {
        self.options.join(" ")
    }
}

/// The entries of `dir`, each with its file, in file-name order; `give` says which flags
/// replace what they would have been read for.
pub fn read_dir(dir: &Path, give: &str) -> Result<Vec<(PathBuf, Entry)>> {
    let listing = std::fs::read_dir(dir).with_context(|| format!("reading {} ({give})", dir.display()))?;
    let mut paths: Vec<PathBuf> = listing
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
        .collect();
    paths.sort();
    if paths.is_empty() {
        bail!("no {}/*.conf ({give})", dir.display());
    }
    paths
        .into_iter()
        .map(|path| {
            let text = files::read_text(&path, "a boot loader entry", give)?;
            let id = path
                .file_stem()
                .and_then(|s| s.to_str())
                .with_context(|| format!("{}: the file name is not UTF-8 ({give})", path.display()))?
                .to_owned();
            let entry = Entry::parse(&id, &text);
            Ok((path, entry))
        })
        .collect()
}

/// What chooses the entry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Choice<'a> {
    /// `--kernel-version`: the entry of that kernel version.
    pub version: Option<&'a str>,
    /// `--kernel` (without `--kernel-version`): the entry whose `linux` file has that name.
    pub kernel_name: Option<&'a str>,
    /// Leave out rescue entries (RHEL's `<machine-id>-0-rescue.conf`, which boots a generic
    /// kernel and initrd and is never the default).
    pub skip_rescue: bool,
}

impl<'a> Choice<'a> {
    /// What the flags ask for: `--kernel-version`, else `--kernel`'s file name.
    pub fn from_args(args: &'a super::BootPolicyArgs, skip_rescue: bool) -> Self {
        let kernel_name = args
            .kernel
            .as_deref()
            .and_then(std::path::Path::file_name)
            .and_then(|n| n.to_str());
        Self {
            version: args.kernel_version.as_deref(),
            kernel_name: kernel_name.filter(|_| args.kernel_version.is_none()),
            skip_rescue,
        }
    }
}

/// The entry that boots: the one `choice` names, else the newest kernel version's.
pub fn choose<'e>(entries: &'e [(PathBuf, Entry)], choice: Choice<'_>) -> Result<&'e (PathBuf, Entry)> {
    let candidates: Vec<&(PathBuf, Entry)> = entries
        .iter()
        .filter(|(_, e)| !(choice.skip_rescue && e.id.contains("rescue")))
        .collect();
    let versions = || {
        candidates
            .iter()
            .map(|(_, e)| e.kernel_version())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found = if let Some(version) = choice.version {
        candidates
            .iter()
            .rev()
            .find(|(_, e)| e.kernel_version() == version)
            .with_context(|| {
                format!(
                    "no boot loader entry of kernel version {version} (the entries have {}: give --kernel-version one of them)",
                    versions()
                )
            })?
    } else if let Some(name) = choice.kernel_name {
        candidates
            .iter()
            .rev()
            .find(|(_, e)| e.linux.as_deref().and_then(|l| l.rsplit('/').next()) == Some(name))
            .with_context(|| {
                format!(
                    "no boot loader entry boots a kernel named {name} (the entries have {}: give --kernel-version VER)",
                    versions()
                )
            })?
    } else {
        candidates
            .iter()
            .rev()
            .max_by(|(_, a), (_, b)| files::version_order(a.kernel_version(), b.kernel_version()))
            .context("only rescue entries (give --kernel-version VER)")?
    };
    Ok(found)
}

/// `path` of an entry (`/vmlinuz-6.1`) under the directory it is relative to.
pub fn under(base: &Path, path: &str) -> PathBuf {
    base.join(path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RHEL 8's entry as kernel-install writes it: the options are grubenv's `$kernelopts`.
    const RHEL8: &str = "title Red Hat Enterprise Linux (4.18.0-240.22.1.el8_3.x86_64) 8.3 (Ootpa)
version 4.18.0-240.22.1.el8_3.x86_64
linux /vmlinuz-4.18.0-240.22.1.el8_3.x86_64
initrd /initramfs-4.18.0-240.22.1.el8_3.x86_64.img $tuned_initrd
options $kernelopts $tuned_params
id rhel-20210311160000-4.18.0-240.22.1.el8_3.x86_64
grub_users $grub_users
grub_arg --unrestricted
grub_class kernel
";

    #[test]
    fn an_entry_reads_its_keys_and_joins_its_options() {
        let entry = Entry::parse("abc-4.18.0-240.22.1.el8_3.x86_64", RHEL8);
        assert_eq!(entry.kernel_version(), "4.18.0-240.22.1.el8_3.x86_64");
        assert_eq!(entry.linux.as_deref(), Some("/vmlinuz-4.18.0-240.22.1.el8_3.x86_64"));
        assert_eq!(
            entry.initrds,
            vec!["/initramfs-4.18.0-240.22.1.el8_3.x86_64.img $tuned_initrd"]
        );
        assert_eq!(entry.options(), "$kernelopts $tuned_params");

        let arch = Entry::parse(
            "arch",
            "# comment\ntitle Arch\nlinux   /vmlinuz-linux-lts\ninitrd /intel-ucode.img\n\tinitrd\t/initramfs-linux-lts.img\noptions a=b\noptions  rw\n",
        );
        assert_eq!(arch.kernel_version(), "linux-lts");
        assert_eq!(arch.initrds, vec!["/intel-ucode.img", "/initramfs-linux-lts.img"]);
        assert_eq!(arch.options(), "a=b rw");
        assert_eq!(Entry::parse("m-6.8.0", "title x\n").kernel_version(), "m-6.8.0");
        assert!(
            Entry::parse("x", "efi /EFI/Linux/x.efi\n")
                .linux(Path::new("x.conf"))
                .is_err()
        );
    }

    fn entries(list: &[(&str, &str)]) -> Vec<(PathBuf, Entry)> {
        list.iter()
            .map(|(id, text)| (PathBuf::from(format!("{id}.conf")), Entry::parse(id, text)))
            .collect()
    }

    #[test]
    fn the_newest_version_is_chosen_and_rescue_entries_are_skipped() {
        let list = entries(&[
            // A rescue entry of a version above the others: never the one that boots.
            ("m-0-rescue", "version 5.14.0-999.el9\nlinux /vmlinuz-0-rescue-m\n"),
            ("m-5.14.0-9.el9", "version 5.14.0-9.el9\nlinux /vmlinuz-5.14.0-9.el9\n"),
            (
                "m-5.14.0-70.el9",
                "version 5.14.0-70.el9\nlinux /vmlinuz-5.14.0-70.el9\n",
            ),
            (
                "m-5.14.0-162.el9",
                "version 5.14.0-162.el9\nlinux /vmlinuz-5.14.0-162.el9\n",
            ),
        ]);
        let skip = Choice {
            skip_rescue: true,
            ..Choice::default()
        };
        assert_eq!(choose(&list, skip).expect("entry").1.id, "m-5.14.0-162.el9");
        assert_eq!(choose(&list, Choice::default()).expect("entry").1.id, "m-0-rescue");
        let version = Choice {
            version: Some("5.14.0-70.el9"),
            ..skip
        };
        assert_eq!(choose(&list, version).expect("entry").1.id, "m-5.14.0-70.el9");
        let named = Choice {
            kernel_name: Some("vmlinuz-5.14.0-9.el9"),
            ..skip
        };
        assert_eq!(choose(&list, named).expect("entry").1.id, "m-5.14.0-9.el9");
        let missing = Choice {
            version: Some("6.0"),
            ..skip
        };
        let error = choose(&list, missing).expect_err("no such version").to_string();
        assert!(
            error.contains("5.14.0-162.el9") && error.contains("--kernel-version"),
            "{error}"
        );
        let only_rescue = entries(&[("m-0-rescue", "linux /vmlinuz-0-rescue-m\n")]);
        assert!(choose(&only_rescue, skip).is_err());
    }
}
