//! `--boot-path auto`: the boot path an image's files show, looked for in this order.
//!
//! 1. `uki`: a unified kernel image, `EFI/Linux/*.efi` on an ESP. It comes before systemd-boot's
//!    Type #1 entries because kernel-install writes one or the other for a kernel, by its
//!    layout: an ESP holding both has changed layout, and the UKIs are the layout it has now
//!    (`--boot-path systemd-boot` reads the entries instead).
//! 2. `systemd-boot`: `EFI/systemd/systemd-bootx64.efi` and a `loader/entries/*.conf` on one ESP.
//! 3. `rhel-grub`: `/boot/grub2/grub.cfg` or `/boot/loader/entries`, and no
//!    `/boot/grub/grub.cfg` (RHEL-family grub keeps its configuration in `grub2`).
//! 4. `grub`: Debian's `/boot/grub/grub.cfg`, or, without it, a shim in
//!    `/boot/efi/EFI/<vendor>` (the layout `grub` reads, its command line then given by flags).
//!
//! ESPs are looked for at `/boot/efi`, `/efi` and `/boot` ([`esp`](super::esp)).

use std::path::Path;

use anyhow::{Result, bail};

use super::{BootPath, esp, files};

/// The boot path of the image at `root`, and what showed it (for the bake's log).
pub fn detect(root: &Path) -> Result<(BootPath, String)> {
    if let Some((_, uki)) = esp::first(root, |esp| esp::ukis(esp).pop()) {
        return Ok((BootPath::Uki, format!("found {}", uki.display())));
    }
    let systemd_boot = |esp: &Path| esp::systemd_boot(esp).filter(|_| esp::has_entries(esp));
    if let Some((esp, found)) = esp::first(root, systemd_boot) {
        return Ok((
            BootPath::SystemdBoot,
            format!("found {} and {}", found.display(), esp.join(esp::ENTRIES_DIR).display()),
        ));
    }
    let debian_cfg = root.join("boot/grub/grub.cfg");
    if !debian_cfg.exists() {
        for rhel in ["boot/grub2/grub.cfg", "boot/loader/entries"] {
            let path = root.join(rhel);
            if path.exists() {
                return Ok((
                    BootPath::RhelGrub,
                    format!("found {}, and no {}", path.display(), debian_cfg.display()),
                ));
            }
        }
    }
    if debian_cfg.is_file() {
        return Ok((BootPath::Grub, format!("found {}", debian_cfg.display())));
    }
    if let Ok(Some(shim)) = files::one_shim(&root.join("boot/efi/EFI")) {
        return Ok((
            BootPath::Grub,
            format!("found {}, and no other boot path's files", shim.display()),
        ));
    }
    bail!(
        "no boot path found under {}: looked for a unified kernel image ({uki}/*.efi) and systemd-boot \
         ({sd} with {entries}/*.conf) on an ESP at {esps}, RHEL-family grub (/boot/grub2/grub.cfg or \
         /boot/loader/entries) and Debian's grub (/boot/grub/grub.cfg, or /boot/efi/EFI/*/shimx64.efi): \
         give --boot-path grub, rhel-grub, systemd-boot or uki, and the files' flags",
        root.display(),
        uki = esp::UKI_DIR,
        sd = esp::SYSTEMD_BOOT,
        entries = esp::ENTRIES_DIR,
        esps = esp::looked_in()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, file: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, b"x").expect("write");
    }

    fn detected(root: &Path) -> &'static str {
        detect(root).expect("a boot path").0.name()
    }

    #[test]
    fn each_layout_is_detected_in_order_uki_systemd_boot_rhel_grub_grub() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        let error = detect(r).expect_err("nothing").to_string();
        for looked_for in [
            "EFI/Linux",
            "systemd-bootx64.efi",
            "/boot/grub2/grub.cfg",
            "/boot/grub/grub.cfg",
            "--boot-path",
        ] {
            assert!(error.contains(looked_for), "{error}");
        }

        // Debian's layout without grub.cfg (the command line given), then with it.
        touch(r, "boot/efi/EFI/debian/shimx64.efi");
        assert_eq!(detected(r), "grub");
        touch(r, "boot/grub/grub.cfg");
        assert_eq!(detected(r), "grub");
        // grub2 beside Debian's grub.cfg is still Debian's; alone, RHEL's.
        touch(r, "boot/grub2/grub.cfg");
        assert_eq!(detected(r), "grub");
        std::fs::remove_file(r.join("boot/grub/grub.cfg")).expect("rm");
        assert_eq!(detected(r), "rhel-grub");
        std::fs::remove_file(r.join("boot/grub2/grub.cfg")).expect("rm");
        std::fs::create_dir_all(r.join("boot/loader/entries")).expect("mkdir");
        assert_eq!(detected(r), "rhel-grub");

        // systemd-boot needs its entries on its own ESP.
        touch(r, &format!("boot/efi/{}", esp::SYSTEMD_BOOT));
        assert_eq!(detected(r), "rhel-grub");
        touch(r, "boot/efi/loader/entries/m-6.8.0.conf");
        assert_eq!(detected(r), "systemd-boot");

        // A UKI on any ESP comes first.
        touch(r, "efi/EFI/Linux/m-6.8.0.efi");
        let (path, why) = detect(r).expect("uki");
        assert_eq!(path, BootPath::Uki);
        assert!(why.contains("m-6.8.0.efi"), "{why}");
    }
}
