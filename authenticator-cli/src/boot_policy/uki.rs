//! A unified kernel image's boot path: one signed PE file (`<esp>/EFI/Linux/*.efi`, the Boot
//! Loader Specification's Type #2 entry) holding the Linux stub, the kernel, the initrd and the
//! command line, started by systemd-boot, by shim, by both, or by the firmware directly.
//!
//! Its Authenticode digest, which the firmware measures into PCR 4 when it is loaded, covers
//! the embedded `.linux`, `.initrd` and `.cmdline` sections, so the policy's `kernel` is the
//! UKI's digest and it lists no `kernelFile`, `initrd` or `commandLine` (the stub's own PCR 9
//! events then go unread) unless the flags give them. The boot applications before it are
//! those the ESP holds: shim (`EFI/<vendor>/shimx64.efi`) and systemd-boot
//! (`EFI/systemd/systemd-bootx64.efi`), each when present.
//!
//! What this cannot see: whether a given stub loads the embedded kernel through the firmware's
//! `LoadImage` (a further PCR 4 application after the UKI); no real UKI log is at hand here, so
//! check a booted node's PCR 4 against the printed policy before enforcing it.

use std::path::PathBuf;

use anyhow::{Result, bail};

use super::{BootApplication, BootFiles, BootPolicyArgs, command_line_or, esp, initrd_or};

/// The files of the unified kernel image's boot path under `args.root`, the flags' where given.
pub fn read(args: &BootPolicyArgs) -> Result<BootFiles> {
    let root = &args.root;
    let mut notes = Vec::new();
    let wanted = |p: &PathBuf| {
        args.kernel_version.as_deref().is_none_or(|version| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(version))
        })
    };
    let found = esp::first(root, |esp| esp::ukis(esp).into_iter().rfind(wanted));
    let (esp_dir, kernel) = match (&args.kernel, found) {
        // A given UKI: the loaders are those of the ESP holding UKIs, else of the first ESP.
        (Some(path), found) => (
            found
                .map(|(esp, _)| esp)
                .or_else(|| esp::mounts(root).into_iter().next()),
            path.clone(),
        ),
        (None, Some((esp, uki))) => (Some(esp), uki),
        (None, None) => {
            let holding = args
                .kernel_version
                .as_deref()
                .map(|version| format!(" whose name holds {version}"))
                .unwrap_or_default();
            bail!(
                "no {}/*.efi{holding} on an ESP under {} (looked in {}; give --kernel PATH, or another --boot-path)",
                esp::UKI_DIR,
                root.display(),
                esp::looked_in()
            )
        }
    };
    if args.kernel.is_none() {
        notes.push(format!("unified kernel image {}", kernel.display()));
    }
    let shim = match &args.shim {
        Some(path) => Some(path.clone()),
        None => esp_dir.as_deref().map(esp::shim).transpose()?.flatten(),
    };
    let loader = match &args.grub {
        Some(path) => Some(path.clone()),
        None => esp_dir.as_deref().and_then(esp::systemd_boot),
    };
    let mut bootloaders: Vec<BootApplication> = shim.into_iter().map(BootApplication::shim).collect();
    bootloaders.extend(loader.map(|path| BootApplication::loader("systemd-boot", path)));
    let initrd = initrd_or(args, || Ok(None))?;
    let command_line = command_line_or(args, || Ok(None))?;
    Ok(BootFiles {
        bootloaders,
        kernel,
        kernel_file: false,
        initrd,
        command_line,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esp_with(files: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for file in files {
            let path = root.path().join("boot/efi").join(file);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, b"pe").expect("write");
        }
        root
    }

    fn loaders(files: &BootFiles) -> Vec<&'static str> {
        files.bootloaders.iter().map(|a| a.what).collect()
    }

    #[test]
    fn the_newest_uki_and_the_loaders_present_are_read() {
        let root = esp_with(&[
            "EFI/Linux/m-6.9.0-1.efi",
            "EFI/Linux/m-6.10.0-1.efi",
            "EFI/fedora/shimx64.efi",
            esp::SYSTEMD_BOOT,
        ]);
        let esp = root.path().join("boot/efi");
        let files = read(&BootPolicyArgs::defaults(root.path())).expect("uki");
        assert_eq!(files.kernel, esp.join("EFI/Linux/m-6.10.0-1.efi"));
        assert_eq!(loaders(&files), vec!["shim", "systemd-boot"]);
        assert_eq!(files.bootloaders[0].path, esp.join("EFI/fedora/shimx64.efi"));
        assert_eq!(
            (files.kernel_file, &files.initrd, &files.command_line),
            (false, &None, &None)
        );

        let mut older = BootPolicyArgs::defaults(root.path());
        older.kernel_version = Some("6.9.0".into());
        assert_eq!(read(&older).expect("uki").kernel, esp.join("EFI/Linux/m-6.9.0-1.efi"));
        older.kernel_version = Some("5.0".into());
        let error = format!("{:#}", read(&older).expect_err("no such UKI"));
        assert!(
            error.contains("holds 5.0") && error.contains("--kernel PATH"),
            "{error}"
        );
    }

    #[test]
    fn each_loader_is_listed_only_when_present() {
        let root = esp_with(&["EFI/Linux/a.efi", "EFI/redhat/shimx64.efi"]);
        assert_eq!(
            loaders(&read(&BootPolicyArgs::defaults(root.path())).expect("uki")),
            vec!["shim"]
        );
        let root = esp_with(&["EFI/Linux/a.efi", esp::SYSTEMD_BOOT]);
        assert_eq!(
            loaders(&read(&BootPolicyArgs::defaults(root.path())).expect("uki")),
            vec!["systemd-boot"]
        );
        let root = esp_with(&["EFI/Linux/a.efi"]);
        let mut given = BootPolicyArgs::defaults(root.path());
        given.command_line = Some("ro".into());
        given.initrd = Some("/i".into());
        let files = read(&given).expect("uki");
        assert!(files.bootloaders.is_empty());
        assert_eq!(
            (files.initrd, files.command_line.as_deref()),
            (Some("/i".into()), Some("ro"))
        );
    }
}
