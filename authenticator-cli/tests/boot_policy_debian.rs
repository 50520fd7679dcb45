//! `kubelet-authenticator boot-policy` on an image root holding Debian's real signed boot
//! chain (`shim-signed`, `grub-efi-amd64-signed`, a `linux-image-*-cloud-amd64`, which
//! scripts/deps fetches), and the policy it prints judged on the log a boot of those files
//! would write.
//!
//! The log stands in for the firmware, shim and grub: its PCR 4 boot applications carry
//! pesign's Authenticode digests of the files (a third-party implementation; the firmware's
//! own hashing is EDK2's `MeasurePeImageAndExtend`, which nothing here runs), its PCR 9 files
//! coreutils' `sha256sum` of the files grub reads, its PCR 8 `kernel_cmdline:` the text grub
//! builds from the `linux` line of the grub.cfg written below, in the order and form a real
//! grub writes them (`testdata/event_logs/ubuntu_2104_shielded_vm_no_secure_boot_eventlog`).
//! What this cannot show without booting: that this firmware, shim and grub measure exactly
//! so on a given machine (the digests are the specification's and pesign's, not a TPM's).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use attestation::tpm::boot_policy::{BootPolicy, PolicyDocument, judge};
use attestation::tpm::event_log::HashAlg;

const KERNEL_VERSION_PREFIX: &str = "vmlinuz-";

fn packages_root() -> PathBuf {
    let dir = std::env::var_os("KUBELET_AUTHENTICATOR_BOOT_PACKAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache/kubelet-authenticator/boot-packages")
        });
    dir.join("root")
}

/// An image root as a Debian 12 bake leaves it: shim and grub in the ESP's `EFI/debian`, the
/// kernel, an initrd and grub.cfg in `/boot`. Returns the root and the kernel version.
fn image_root() -> (tempfile::TempDir, String) {
    let packages = packages_root();
    let kernel = std::fs::read_dir(packages.join("boot"))
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/deps", packages.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .find(|n| n.starts_with(KERNEL_VERSION_PREFIX))
        .expect("a vmlinuz in the kernel package");
    let version = kernel.trim_start_matches(KERNEL_VERSION_PREFIX).to_owned();
    let root = tempfile::tempdir().unwrap();
    let esp = root.path().join("boot/efi/EFI/debian");
    std::fs::create_dir_all(&esp).unwrap();
    std::fs::create_dir_all(root.path().join("boot/grub")).unwrap();
    std::fs::copy(
        packages.join("usr/lib/shim/shimx64.efi.signed"),
        esp.join("shimx64.efi"),
    )
    .unwrap();
    std::fs::copy(
        packages.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"),
        esp.join("grubx64.efi"),
    )
    .unwrap();
    std::fs::copy(
        packages.join("boot").join(&kernel),
        root.path().join("boot").join(&kernel),
    )
    .unwrap();
    // initramfs-tools writes the initrd at install; any bytes stand for it here.
    let initrd: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(root.path().join(format!("boot/initrd.img-{version}")), initrd).unwrap();
    // The first entry as Debian 12's grub-mkconfig (10_linux) writes it.
    let cfg = format!(
        "set default=\"0\"\n\
         menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-0a1b' {{\n\
         \tload_video\n\tinsmod gzio\n\tinsmod part_gpt\n\tinsmod ext2\n\
         \tsearch --no-floppy --fs-uuid --set=root 0a1b\n\
         \techo\t'Loading Linux {version} ...'\n\
         \tlinux\t/boot/vmlinuz-{version} root=UUID=0a1b ro  console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0\n\
         \techo\t'Loading initial ramdisk ...'\n\
         \tinitrd\t/boot/initrd.img-{version}\n}}\n"
    );
    std::fs::write(root.path().join("boot/grub/grub.cfg"), cfg).unwrap();
    (root, version)
}

fn boot_policy(root: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"))
        .args(["boot-policy", "--image-name", "debian-12-cloud", "--root"])
        .arg(root)
        .args(extra)
        .output()
        .expect("run kubelet-authenticator");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// pesign's SHA-256 Authenticode digest: the firmware's measurement, as a third party computes it.
fn pesign(path: &Path) -> Vec<u8> {
    let out = Command::new("pesign")
        .args(["-h", "-i"])
        .arg(path)
        .output()
        .expect("pesign");
    assert!(out.status.success(), "pesign {}", path.display());
    let text = String::from_utf8(out.stdout).unwrap();
    unhex(text.trim().strip_prefix("hash: ").expect("pesign's hash"))
}

/// coreutils' SHA-256 of a file: grub's PCR 9 measurement of what it reads.
fn sha256sum(path: &Path) -> Vec<u8> {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum");
    unhex(
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap(),
    )
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    HashAlg::Sha256.digest(bytes)
}

use tests::boot_log::synthetic::Log;

/// What a Secure Boot of `root`'s files through shim and grub logs (the order of the real
/// Ubuntu log: grub reads the kernel into PCR 9, has shim verify it, which measures it into
/// PCR 4, measures the command line into PCR 8, then reads the initrd).
fn boot_log(root: &Path, version: &str, kernel: &Path, secure_boot: u8, command_line: &str) -> Log {
    let esp = root.join("boot/efi/EFI/debian");
    let initrd = root.join(format!("boot/initrd.img-{version}"));
    let grub_cfg = root.join("boot/grub/grub.cfg");
    Log::default()
        .firmware(secure_boot)
        .application(pesign(&esp.join("shimx64.efi")), "\\EFI\\debian\\shimx64.efi")
        .application(pesign(&esp.join("grubx64.efi")), "\\EFI\\debian\\grubx64.efi")
        .file("(hd0,gpt1)/boot/grub/grub.cfg", sha256sum(&grub_cfg))
        .grub("grub_cmd: ", &format!("linux {command_line}"))
        .file(&format!("/boot/vmlinuz-{version}"), sha256sum(kernel))
        .application(pesign(kernel), "")
        .grub("kernel_cmdline: ", command_line)
        .grub("grub_cmd: ", &format!("initrd /boot/initrd.img-{version}"))
        .file(&format!("/boot/initrd.img-{version}"), sha256sum(&initrd))
}

/// The command line grub measures for the grub.cfg of [`image_root`] (its `linux` words, the
/// double blank after `ro` gone).
fn expected_command_line(version: &str) -> String {
    format!(
        "/boot/vmlinuz-{version} root=UUID=0a1b ro console=tty0 console=ttyS0,115200 \
         earlyprintk=ttyS0,115200 consoleblank=0"
    )
}

/// Every PCR the node quotes.
const QUOTED: [u32; 7] = [0, 1, 4, 7, 8, 9, 11];

#[test]
#[ignore = "needs pesign and Debian's boot packages (shim-signed, grub-efi-amd64-signed, a linux-image-*-cloud-amd64), which scripts/deps installs and fetches as root"]
fn the_printed_policy_allows_a_boot_of_debians_files_and_refuses_another_kernel() {
    let (root, version) = image_root();
    let root = root.path();
    let text = boot_policy(root, &[]);
    let document: PolicyDocument = serde_yaml::from_str(&text).unwrap();
    assert_eq!(document.images.len(), 1);
    let image = &document.images[0];
    assert_eq!(
        image.command_line.as_deref(),
        Some(expected_command_line(&version).as_str())
    );
    let policy = BootPolicy::parse(&text).unwrap();

    let kernel = root.join(format!("boot/vmlinuz-{version}"));
    let command_line = expected_command_line(&version);
    let log = boot_log(root, &version, &kernel, 1, &command_line).parsed();
    // The replayed PCR 4 is the firmware's action, the separator and the policy's chain, in order.
    let mut pcr4 = vec![0u8; 32];
    let chain = [
        sha256(b"Calling EFI Application from Boot Option"),
        sha256(&[0, 0, 0, 0]),
        unhex(&image.bootloaders[0]),
        unhex(&image.bootloaders[1]),
        unhex(&image.kernel),
    ];
    for digest in chain {
        pcr4 = sha256(&[pcr4, digest].concat());
    }
    assert_eq!(log.replay(HashAlg::Sha256).unwrap().get(&4), Some(&pcr4));
    let verdict = judge(&policy, &log, HashAlg::Sha256, &QUOTED).expect("the boot of the image's own files");
    assert_eq!(verdict.image, "debian-12-cloud");
    eprintln!("allowed: {}", verdict.summary);

    // Another kernel: one byte of its code changed (its Authenticode digest with it).
    let mut other = std::fs::read(&kernel).unwrap();
    let at = other.len() / 2;
    other[at] ^= 0xff;
    let other_kernel = root.join("other-vmlinuz");
    std::fs::write(&other_kernel, other).unwrap();
    let log = boot_log(root, &version, &other_kernel, 1, &command_line).parsed();
    let refusal = judge(&policy, &log, HashAlg::Sha256, &QUOTED).expect_err("another kernel");
    assert!(
        refusal.message.contains("EV_EFI_BOOT_SERVICES_APPLICATION") && refusal.message.contains("kernels"),
        "{}",
        refusal.message
    );
    eprintln!("another kernel: {}", refusal.message);

    // Another command line, and Secure Boot off.
    let log = boot_log(root, &version, &kernel, 1, &format!("{command_line} init=/bin/sh")).parsed();
    let refusal = judge(&policy, &log, HashAlg::Sha256, &QUOTED).expect_err("another command line");
    assert!(
        refusal.message.contains("kernel_cmdline") || refusal.message.contains("command line"),
        "{}",
        refusal.message
    );
    eprintln!("another command line: {}", refusal.message);
    let log = boot_log(root, &version, &kernel, 0, &command_line).parsed();
    let refusal = judge(&policy, &log, HashAlg::Sha256, &QUOTED).expect_err("Secure Boot off");
    assert!(refusal.message.contains("SecureBoot"), "{}", refusal.message);
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (the same parts as above)"]
fn the_printed_policy_names_every_file_given_and_refuses_what_is_not_a_pe_image() {
    let (root, version) = image_root();
    let root = root.path();
    let text = boot_policy(
        root,
        &[
            "--kernel-version",
            &version,
            "--no-initrd",
            "--command-line",
            "/vmlinuz ro",
            "--secure-boot",
            "optional",
        ],
    );
    let document: PolicyDocument = serde_yaml::from_str(&text).unwrap();
    assert_eq!(document.images[0].initrd, None);
    assert_eq!(document.images[0].command_line.as_deref(), Some("/vmlinuz ro"));
    assert!(text.contains("secureBoot: optional"), "{text}");

    let out = Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"))
        .args(["boot-policy", "--image-name", "x", "--root"])
        .arg(root)
        .arg("--kernel")
        .arg(root.join("boot/grub/grub.cfg"))
        .args(["--no-initrd", "--no-command-line"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the kernel") && stderr.contains("not a PE/COFF image"),
        "{stderr}"
    );
}
