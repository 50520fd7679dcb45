//! `kubelet-authenticator boot-policy` on the other boot paths it detects: a RHEL-style root
//! (grub2, BLS entries, grubenv's `$kernelopts`), a systemd-boot root (a Type #1 entry on the
//! ESP) and a unified kernel image root, each laid out with Debian's real signed shim, grub and
//! kernel (which scripts/deps fetches) copied under the names those paths use: grub's signed PE
//! stands in for systemd-boot and the kernel for a UKI, since only their being real
//! Authenticode-signed PE files matters to the digests.
//!
//! Each test checks the detected path, the printed digests against
//! `attestation::tpm::authenticode::sha256` and SHA-256 of the files, the command line, and that
//! the signer's judge allows the policy on the log such a boot writes, in the forms of the real
//! logs of `testdata/event_logs/` (RHEL 8's `grub_cmd `/`grub_kernel_cmdline ` and
//! `grub_linuxefi` files; the Arch systemd-boot's UTF-16LE load options; the Linux stub's
//! tagged PCR 9 events), and refuses it with one part changed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use attestation::tpm::authenticode;
use attestation::tpm::boot_policy::{BootPolicy, PolicyDocument, judge};
use attestation::tpm::event_log::{HashAlg, event_type};

/// Every PCR the node quotes.
const QUOTED: [u32; 7] = [0, 1, 4, 7, 8, 9, 11];

/// Debian's signed shim, grub and kernel, and the kernel's version.
struct Packages {
    shim: PathBuf,
    grub: PathBuf,
    kernel: PathBuf,
    version: String,
}

fn packages() -> Packages {
    let root = std::env::var_os("KUBELET_AUTHENTICATOR_BOOT_PACKAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").expect("HOME")).join(".cache/kubelet-authenticator/boot-packages")
        })
        .join("root");
    let name = std::fs::read_dir(root.join("boot"))
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/deps", root.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.starts_with("vmlinuz-"))
        .expect("a vmlinuz in the kernel package");
    Packages {
        shim: root.join("usr/lib/shim/shimx64.efi.signed"),
        grub: root.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"),
        kernel: root.join("boot").join(&name),
        version: name.trim_start_matches("vmlinuz-").to_owned(),
    }
}

fn put(root: &Path, file: &str, from: &Path) -> PathBuf {
    let to = root.join(file);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, &to).unwrap();
    to
}

fn write(root: &Path, file: &str, bytes: &[u8]) -> PathBuf {
    let to = root.join(file);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::write(&to, bytes).unwrap();
    to
}

/// Any bytes stand for an initrd.
fn initrd_bytes(seed: u32) -> Vec<u8> {
    (0..200_000u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// Runs `boot-policy --root DIR --image-name x`: the policy, and the boot path stderr names.
fn boot_policy(root: &Path, extra: &[&str]) -> (PolicyDocument, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubelet-authenticator"))
        .args(["boot-policy", "--image-name", "x", "--root"])
        .arg(root)
        .args(extra)
        .output()
        .expect("run kubelet-authenticator");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    (serde_yaml::from_str(&text).unwrap(), text, stderr)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn pe(path: &Path) -> Vec<u8> {
    authenticode::sha256(&std::fs::read(path).unwrap()).unwrap().to_vec()
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    HashAlg::Sha256.digest(bytes)
}

fn file_sha256(path: &Path) -> Vec<u8> {
    sha256(&std::fs::read(path).unwrap())
}

fn utf16(text: &str) -> Vec<u8> {
    text.encode_utf16().chain([0]).flat_map(u16::to_le_bytes).collect()
}

use tests::boot_log::synthetic::Log;

fn allowed(text: &str, log: &Log) {
    let policy = BootPolicy::parse(text).unwrap();
    let verdict = judge(&policy, &log.parsed(), HashAlg::Sha256, &QUOTED).expect("the boot of the image's own files");
    assert_eq!(verdict.image, "x");
    eprintln!("allowed: {}", verdict.summary);
}

/// The judge refuses `log`, saying `names`.
fn refused(text: &str, log: &Log, why: &str, names: &str) {
    let policy = BootPolicy::parse(text).unwrap();
    let refusal = judge(&policy, &log.parsed(), HashAlg::Sha256, &QUOTED).expect_err(why);
    assert!(refusal.message.contains(names), "{why}: {}", refusal.message);
    eprintln!("{why}: {}", refusal.message);
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (scripts/deps)"]
fn a_rhel_grub_root_prints_its_bls_entry_s_policy_and_the_judge_allows_its_boot() {
    let p = packages();
    let v = &p.version;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let shim = put(root, "boot/efi/EFI/redhat/shimx64.efi", &p.shim);
    let grub = put(root, "boot/efi/EFI/redhat/grubx64.efi", &p.grub);
    let kernel = put(root, &format!("boot/vmlinuz-{v}"), &p.kernel);
    let initrd = write(root, &format!("boot/initramfs-{v}.img"), &initrd_bytes(1));
    // RHEL 8's entry (its options grubenv's), and the rescue entry, whose files are not here.
    write(
        root,
        &format!("boot/loader/entries/0a1b-{v}.conf"),
        format!(
            "title Red Hat Enterprise Linux ({v})\nversion {v}\nlinux /vmlinuz-{v}\n\
             initrd /initramfs-{v}.img $tuned_initrd\noptions $kernelopts $tuned_params\ngrub_class kernel\n"
        )
        .as_bytes(),
    );
    write(
        root,
        "boot/loader/entries/0a1b-0-rescue.conf",
        b"version 99.0.0\nlinux /vmlinuz-0-rescue-0a1b\ninitrd /initramfs-0-rescue-0a1b.img\noptions $kernelopts\n",
    );
    write(
        root,
        "boot/grub2/grubenv",
        b"# GRUB Environment Block\nkernelopts=root=UUID=0a1b ro crashkernel=auto  console=ttyS0,115200 \n#####",
    );
    write(
        root,
        "boot/grub2/grub.cfg",
        b"load_env -f ${config_directory}/grubenv\nset tuned_params=\"\"\nset tuned_initrd=\"\"\ninsmod blscfg\nblscfg\n",
    );

    let (document, text, stderr) = boot_policy(root, &[]);
    assert!(stderr.contains("boot path rhel-grub"), "{stderr}");
    let image = &document.images[0];
    assert_eq!(image.bootloaders, vec![hex(&pe(&shim)), hex(&pe(&grub))]);
    assert_eq!(image.kernel, hex(&pe(&kernel)));
    assert_eq!(image.kernel_file, Some(hex(&file_sha256(&kernel))));
    assert_eq!(image.initrd, Some(hex(&file_sha256(&initrd))));
    let args = "root=UUID=0a1b ro crashkernel=auto console=ttyS0,115200";
    assert_eq!(
        image.command_line.as_deref(),
        Some(format!("/vmlinuz-{v} {args}").as_str())
    );

    // RHEL 8's grub (go_tpm_tools_rhel8_gce_eventlog): `grub_cmd ` hashes its NUL, the kernel
    // and initrd are `grub_linuxefi` labels, the device prefixes the kernel's path.
    let boot = |args: &str, initrd: Vec<u8>| {
        let linux = format!("(hd0,gpt2)/vmlinuz-{v} {args}");
        let command = format!("linux {linux}");
        let initrd_command = format!("initrd (hd0,gpt2)/initramfs-{v}.img");
        Log::default()
            .firmware(1)
            .application(pe(&shim), "\\EFI\\redhat\\shimx64.efi")
            .application(pe(&grub), "\\EFI\\redhat\\grubx64.efi")
            .grub_covering("grub_cmd ", &command, format!("{command}\0").as_bytes())
            .file("grub_linuxefi Kernel", file_sha256(&kernel))
            .application(pe(&kernel), "")
            .grub_covering("grub_kernel_cmdline ", &linux, linux.as_bytes())
            .grub_covering("grub_cmd ", &initrd_command, format!("{initrd_command}\0").as_bytes())
            .file("grub_linuxefi Initrd", initrd)
    };
    allowed(&text, &boot(args, file_sha256(&initrd)));
    refused(
        &text,
        &boot(&format!("{args} init=/bin/sh"), file_sha256(&initrd)),
        "another command line",
        "is not the one of image x",
    );
    refused(
        &text,
        &boot(args, sha256(b"another initrd")),
        "another initrd",
        "is not the initrd of image x",
    );
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (scripts/deps)"]
fn a_systemd_boot_root_prints_its_entry_s_policy_and_the_judge_allows_its_boot() {
    let p = packages();
    let v = &p.version;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The ESP at /efi: shim in front of systemd-boot, which is copied beside shim as the
    // grubx64.efi shim starts.
    let shim = put(root, "efi/EFI/debian/shimx64.efi", &p.shim);
    let systemd_boot = put(root, "efi/EFI/systemd/systemd-bootx64.efi", &p.grub);
    put(root, "efi/EFI/debian/grubx64.efi", &p.grub);
    let kernel = put(root, &format!("efi/vmlinuz-{v}"), &p.kernel);
    let initrd = write(root, &format!("efi/initrd.img-{v}"), &initrd_bytes(2));
    write(
        root,
        &format!("efi/loader/entries/debian-{v}.conf"),
        format!("title Debian\nversion {v}\nlinux /vmlinuz-{v}\ninitrd /initrd.img-{v}\noptions root=UUID=0a1b ro\noptions console=ttyS0\n").as_bytes(),
    );

    let (document, text, stderr) = boot_policy(root, &[]);
    assert!(stderr.contains("boot path systemd-boot"), "{stderr}");
    let image = &document.images[0];
    assert_eq!(image.bootloaders, vec![hex(&pe(&shim)), hex(&pe(&systemd_boot))]);
    assert_eq!(image.kernel, hex(&pe(&kernel)));
    assert_eq!(image.kernel_file, None);
    assert_eq!(image.initrd, Some(hex(&file_sha256(&initrd))));
    let options = format!("initrd=\\initrd.img-{v} root=UUID=0a1b ro console=ttyS0");
    assert_eq!(image.command_line.as_deref(), Some(options.as_str()));

    // systemd-boot before 251 measures its load options into PCR 8 (UTF-16LE with the NUL, as
    // the Arch log), the Linux stub its load options and initrd into PCR 9.
    let boot = |options: &str, initrd: Vec<u8>| {
        Log::default()
            .firmware(1)
            .application(pe(&shim), "\\EFI\\debian\\shimx64.efi")
            .application(pe(&systemd_boot), "\\EFI\\debian\\grubx64.efi")
            .application(pe(&kernel), &format!("\\vmlinuz-{v}"))
            .measured(8, event_type::IPL, &utf16(options))
            .stub(0x8F3B_22ED, "LOADED_IMAGE::LoadOptions", sha256(&utf16(options)))
            .stub(0x8F3B_22EC, "Linux initrd", initrd)
    };
    allowed(&text, &boot(&options, file_sha256(&initrd)));
    refused(
        &text,
        &boot(&format!("{options} init=/bin/sh"), file_sha256(&initrd)),
        "another command line",
        "is not the one of image x",
    );
    refused(
        &text,
        &boot(&options, sha256(b"another initrd")),
        "another initrd",
        "is not the initrd of image x",
    );
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (scripts/deps)"]
fn a_uki_root_prints_the_uki_s_policy_and_the_judge_allows_its_boot() {
    let p = packages();
    let v = &p.version;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let systemd_boot = put(root, "boot/efi/EFI/systemd/systemd-bootx64.efi", &p.grub);
    let uki = put(root, &format!("boot/efi/EFI/Linux/debian-{v}.efi"), &p.kernel);
    // Type #1 entries beside the UKI: the UKI is what auto reads.
    write(root, "boot/efi/loader/entries/old.conf", b"linux /vmlinuz-old\n");

    let (document, text, stderr) = boot_policy(root, &[]);
    assert!(stderr.contains("boot path uki"), "{stderr}");
    let image = &document.images[0];
    assert_eq!(image.bootloaders, vec![hex(&pe(&systemd_boot))]);
    assert_eq!(image.kernel, hex(&pe(&uki)));
    assert_eq!(
        (&image.kernel_file, &image.initrd, &image.command_line),
        (&None, &None, &None)
    );

    let boot = |uki: Vec<u8>, secure_boot: u8| {
        Log::default()
            .firmware(secure_boot)
            .application(pe(&systemd_boot), "\\EFI\\systemd\\systemd-bootx64.efi")
            .application(uki, &format!("\\EFI\\Linux\\debian-{v}.efi"))
            .stub(0x8F3B_22EC, "Linux initrd", sha256(b"the embedded initrd"))
    };
    allowed(&text, &boot(pe(&uki), 1));
    refused(
        &text,
        &boot(sha256(b"another UKI"), 1),
        "another UKI",
        "none of the policy's kernels",
    );
    refused(&text, &boot(pe(&uki), 0), "Secure Boot off", "Secure Boot is off");

    // The flags still list what the UKI's sections hold.
    let (document, _, _) = boot_policy(root, &["--command-line", "ro", "--boot-path", "uki"]);
    assert_eq!(document.images[0].command_line.as_deref(), Some("ro"));
}
