//! The EFI system partition (ESP) of an image: where it is mounted and the boot applications on
//! it that systemd-boot and unified kernel images boot from.
//!
//! Distributions mount it at `/boot/efi` (Debian, RHEL), `/efi` (systemd's preference) or
//! `/boot` (Arch, systemd-boot's classic layout); it is the one of those holding an `EFI`
//! folder, looked at in that order.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::files;

/// Where an ESP is mounted, under the image's root, in the order looked at.
pub const MOUNTS: [&str; 3] = ["boot/efi", "efi", "boot"];

/// systemd-boot on an ESP (`bootctl install` puts it there; `EFI/BOOT/BOOTX64.EFI` is its
/// fallback copy).
pub const SYSTEMD_BOOT: &str = "EFI/systemd/systemd-bootx64.efi";

/// Unified kernel images on an ESP (the Boot Loader Specification's Type #2 entries).
pub const UKI_DIR: &str = "EFI/Linux";

/// Type #1 entries on an ESP.
pub const ENTRIES_DIR: &str = "loader/entries";

/// The mounted ESPs under `root`: each of [`MOUNTS`] holding an `EFI` folder.
pub fn mounts(root: &Path) -> Vec<PathBuf> {
    MOUNTS
        .iter()
        .map(|m| root.join(m))
        .filter(|esp| esp.join("EFI").is_dir())
        .collect()
}

/// `esp`'s systemd-boot, when installed.
pub fn systemd_boot(esp: &Path) -> Option<PathBuf> {
    Some(esp.join(SYSTEMD_BOOT)).filter(|p| p.is_file())
}

/// `esp`'s shim (`EFI/<vendor>/shimx64.efi`), when there is one.
pub fn shim(esp: &Path) -> Result<Option<PathBuf>> {
    files::one_shim(&esp.join("EFI"))
}

/// Whether `esp` holds Type #1 entries (a `loader/entries/*.conf`).
pub fn has_entries(esp: &Path) -> bool {
    std::fs::read_dir(esp.join(ENTRIES_DIR)).is_ok_and(|listing| {
        listing
            .filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "conf"))
    })
}

/// `esp`'s unified kernel images (`EFI/Linux/*.efi`, any case), in version order of their
/// names: the last is the newest.
pub fn ukis(esp: &Path) -> Vec<PathBuf> {
    let Ok(listing) = std::fs::read_dir(esp.join(UKI_DIR)) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = listing
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("efi")) && p.is_file())
        .filter_map(|p| Some((p.file_name()?.to_str()?.to_owned(), p)))
        .collect();
    found.sort_by(|(a, _), (b, _)| files::version_order(a, b));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The first mounted ESP under `root` that `has` holds, with what it found there.
pub fn first<T>(root: &Path, has: impl Fn(&Path) -> Option<T>) -> Option<(PathBuf, T)> {
    mounts(root)
        .into_iter()
        .find_map(|esp| has(&esp).map(|found| (esp, found)))
}

/// `path` (a file an entry names, `/vmlinuz-linux`) as systemd-boot hands it to the kernel:
/// backslashes, no doubled separators (`stra_to_path`).
pub fn efi_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        let c = if c == '/' { '\\' } else { c };
        if c == '\\' && out.ends_with('\\') {
            continue;
        }
        out.push(c);
    }
    out
}

/// Where ESPs are looked for, for messages (`/boot/efi, /efi, /boot`).
pub fn looked_in() -> String {
    MOUNTS.map(|m| format!("/{m}")).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_esp_is_the_first_mount_with_an_efi_folder() {
        let root = tempfile::tempdir().expect("tempdir");
        assert!(mounts(root.path()).is_empty());
        std::fs::create_dir_all(root.path().join("boot/EFI/systemd")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("efi/EFI/Linux")).expect("mkdir");
        assert_eq!(
            mounts(root.path()),
            vec![root.path().join("efi"), root.path().join("boot")]
        );
        std::fs::write(root.path().join("boot").join(SYSTEMD_BOOT), b"x").expect("write");
        let (esp, found) = first(root.path(), systemd_boot).expect("systemd-boot");
        assert_eq!(esp, root.path().join("boot"));
        assert_eq!(found, root.path().join("boot").join(SYSTEMD_BOOT));
        assert_eq!(looked_in(), "/boot/efi, /efi, /boot");
    }

    #[test]
    fn ukis_sort_by_the_versions_in_their_names() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join(UKI_DIR);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for name in ["m-6.9.0-1.efi", "m-6.10.0-1.EFI", "m-6.9.2-1.efi", "notes.txt"] {
            std::fs::write(dir.join(name), b"x").expect("write");
        }
        let names: Vec<String> = ukis(root.path())
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["m-6.9.0-1.efi", "m-6.9.2-1.efi", "m-6.10.0-1.EFI"]);
    }

    #[test]
    fn entry_paths_become_efi_paths() {
        assert_eq!(efi_path("/intel-ucode.img"), "\\intel-ucode.img");
        assert_eq!(efi_path("/arch//initramfs-linux.img"), "\\arch\\initramfs-linux.img");
    }
}
