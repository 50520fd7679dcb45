//! Where the boot chain's files are on a Debian or Ubuntu image: shim in the ESP's vendor
//! folder, the newest installed kernel in `/boot`.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The one `boot/efi/EFI/*/shimx64.efi` under `root` (the vendor's folder; `EFI/BOOT` holds
/// the fallback copy as `BOOTX64.EFI`).
pub fn shim(root: &Path) -> Result<PathBuf> {
    let efi = root.join("boot/efi/EFI");
    let entries = std::fs::read_dir(&efi).with_context(|| format!("reading {} (give --shim PATH)", efi.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("shimx64.efi"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!("no {}/*/shimx64.efi (give --shim PATH)", efi.display()),
        _ => bail!(
            "several shims: {} (give --shim PATH)",
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The newest `VER` of `root/boot/vmlinuz-VER`, by version order.
pub fn newest_kernel_version(root: &Path) -> Result<String> {
    let boot = root.join("boot");
    let entries =
        std::fs::read_dir(&boot).with_context(|| format!("reading {} (give --kernel-version VER)", boot.display()))?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("vmlinuz-"))
                .map(str::to_owned)
        })
        .max_by(|a, b| version_order(a, b))
        .with_context(|| format!("no {}/vmlinuz-* (give --kernel-version VER)", boot.display()))
}

/// Version order: runs of digits compare as numbers, the rest as text
/// (`6.1.0-9-amd64` < `6.1.0-28-amd64`).
pub fn version_order(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for ((da, xa), (db, xb)) in ra.iter().zip(rb.iter()) {
        let order = if *da && *db {
            let (ta, tb) = (xa.trim_start_matches('0'), xb.trim_start_matches('0'));
            ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
        } else {
            xa.cmp(xb)
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    ra.len().cmp(&rb.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare_by_their_numbers() {
        let mut versions = vec![
            "6.1.0-28-amd64",
            "6.1.0-9-amd64",
            "6.12.1-1-amd64",
            "6.1.0-28-cloud-amd64",
        ];
        versions.sort_by(|a, b| version_order(a, b));
        assert_eq!(
            versions,
            vec![
                "6.1.0-9-amd64",
                "6.1.0-28-amd64",
                "6.1.0-28-cloud-amd64",
                "6.12.1-1-amd64"
            ]
        );
    }

    #[test]
    fn the_newest_kernel_and_the_one_shim_are_found() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("boot/efi/EFI/debian")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("boot/efi/EFI/BOOT")).expect("mkdir");
        for name in [
            "vmlinuz-6.1.0-9-amd64",
            "vmlinuz-6.1.0-28-amd64",
            "initrd.img-6.1.0-99-amd64",
        ] {
            std::fs::write(root.path().join("boot").join(name), b"x").expect("write");
        }
        std::fs::write(root.path().join("boot/efi/EFI/debian/shimx64.efi"), b"x").expect("write");
        std::fs::write(root.path().join("boot/efi/EFI/BOOT/BOOTX64.EFI"), b"x").expect("write");
        assert_eq!(newest_kernel_version(root.path()).expect("kernel"), "6.1.0-28-amd64");
        assert_eq!(
            shim(root.path()).expect("shim"),
            root.path().join("boot/efi/EFI/debian/shimx64.efi")
        );
        std::fs::create_dir_all(root.path().join("boot/efi/EFI/ubuntu")).expect("mkdir");
        std::fs::write(root.path().join("boot/efi/EFI/ubuntu/shimx64.efi"), b"x").expect("write");
        assert!(shim(root.path()).is_err());
    }
}
