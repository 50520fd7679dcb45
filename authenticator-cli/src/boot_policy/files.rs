//! Where the boot chain's files are on a Debian or Ubuntu image (shim in the ESP's vendor
//! folder, the newest installed kernel in `/boot`), and reading an image's files with their
//! size checked first.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Largest boot file read whole (shim, a boot loader, a kernel, an initrd, a unified kernel
/// image): the largest of these is an initrd of a few hundred MiB; anything larger is not the
/// file meant, and reading it would only exhaust the bake's memory.
pub const MAX_BOOT_FILE_BYTES: u64 = 1 << 30;

/// Largest configuration text read (a BLS entry, grubenv, loader.conf, grub.cfg).
pub const MAX_TEXT_BYTES: u64 = 4 << 20;

/// The one `boot/efi/EFI/*/shimx64.efi` under `root` (the vendor's folder; `EFI/BOOT` holds
/// the fallback copy as `BOOTX64.EFI`).
pub fn shim(root: &Path) -> Result<PathBuf> {
    let efi = root.join("boot/efi/EFI");
    std::fs::read_dir(&efi).with_context(|| format!("reading {} (give --shim PATH)", efi.display()))?;
    one_shim(&efi)?.with_context(|| format!("no {}/*/shimx64.efi (give --shim PATH)", efi.display()))
}

/// The `EFI/*/shimx64.efi` of an ESP's `efi` folder, if any: one vendor's shim is what the
/// firmware's boot entry starts, so several (an image carrying two vendors' chains) cannot be
/// told apart from the files and must be given.
pub fn one_shim(efi: &Path) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(efi) else {
        return Ok(None);
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("shimx64.efi"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    match found.len() {
        0 | 1 => Ok(found.pop()),
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

/// A boot file's bytes, its size checked before it is read; `give` says which flag names
/// another file.
pub fn read_file(path: &Path, what: &str, give: &str) -> Result<Vec<u8>> {
    read_bounded(path, MAX_BOOT_FILE_BYTES, what, give)
}

/// A configuration file's text, its size checked before it is read.
pub fn read_text(path: &Path, what: &str, give: &str) -> Result<String> {
    let bytes = read_bounded(path, MAX_TEXT_BYTES, what, give)?;
    String::from_utf8(bytes).with_context(|| format!("{what} ({}) is not UTF-8 text (give {give})", path.display()))
}

fn read_bounded(path: &Path, max: u64, what: &str, give: &str) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {what} ({}; give {give})", path.display()))?
        .len();
    if len > max {
        bail!(
            "{what} ({}) is {len} bytes, more than the {max} read: not the file meant (give {give})",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("reading {what} ({}; give {give})", path.display()))
}

/// shim (`--shim`, else the one `boot/efi/EFI/*/shimx64.efi` under `--root`) and the loader
/// beside it (`--grub`, else its `grubx64.efi`): the two grub boot paths' first applications.
pub fn shim_and_grub(args: &super::BootPolicyArgs) -> Result<(PathBuf, PathBuf)> {
    let shim = match &args.shim {
        Some(path) => path.clone(),
        None => shim(&args.root)?,
    };
    let grub = match &args.grub {
        Some(path) => path.clone(),
        None => shim.with_file_name("grubx64.efi"),
    };
    Ok((shim, grub))
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

/// Version order, as rpm compares versions (`rpmvercmp`, without its `~` and `^`): the runs of
/// digits and the runs of letters compare in turn, separators skipped, numbers by value, letters
/// as text, a number above letters, and a version with runs left over is the newer
/// (`6.1.0-9-amd64` < `6.1.0-28-amd64`, `4.18.0-240.el8` < `4.18.0-240.22.1.el8_3`,
/// `linux` < `linux-lts`). Debian's kernel versions and UKI names order the same way by it.
pub fn version_order(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if !bytes[i].is_ascii_alphanumeric() {
                i += 1;
                continue;
            }
            let digits = bytes[i].is_ascii_digit();
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() && bytes[i].is_ascii_digit() == digits {
                i += 1;
            }
            out.push((digits, &s[start..i]));
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for ((da, xa), (db, xb)) in ra.iter().zip(rb.iter()) {
        let order = match (da, db) {
            (true, true) => {
                let (ta, tb) = (xa.trim_start_matches('0'), xb.trim_start_matches('0'));
                ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
            }
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => xa.cmp(xb),
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
    fn rpm_kernel_versions_compare_as_rpm_does() {
        let mut versions = vec![
            "5.14.0-162.6.1.el9_1.x86_64",
            "4.18.0-240.22.1.el8_3.x86_64",
            "5.14.0-70.el9.x86_64",
            "4.18.0-240.el8.x86_64",
            "5.14.0-162.el9.x86_64",
        ];
        versions.sort_by(|a, b| version_order(a, b));
        assert_eq!(
            versions,
            vec![
                "4.18.0-240.el8.x86_64",
                "4.18.0-240.22.1.el8_3.x86_64",
                "5.14.0-70.el9.x86_64",
                "5.14.0-162.el9.x86_64",
                "5.14.0-162.6.1.el9_1.x86_64",
            ]
        );
        assert_eq!(version_order("linux", "linux-lts"), Ordering::Less);
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
