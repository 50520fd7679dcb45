//! The boot policy's reference values on Debian's real signed boot chain: shim
//! (`shim-signed`'s `shimx64.efi.signed`), grub (`grub-efi-amd64-signed`'s
//! `grubx64.efi.signed`) and an EFI-stub kernel (`linux-image-*-cloud-amd64`'s `vmlinuz`).
//!
//! - Their Authenticode digests ([`attestation::tpm::authenticode`]), SHA-256 and SHA-1,
//!   equal pesign's (`pesign -h`, a third-party implementation, Debian `pesign`), and the
//!   SHA-256 ones equal the digest Debian's and Microsoft's signatures carry
//!   (`SpcIndirectDataContent`, which pesign checks nothing against: it is what the signer
//!   computed when signing).
//!
//! scripts/deps fetches the packages (`apt-get download`, never committed) into
//! `$KUBELET_AUTHENTICATOR_BOOT_PACKAGES` (default
//! `~/.cache/kubelet-authenticator/boot-packages`) and extracts them under its `root/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use attestation::tpm::authenticode;

/// Where scripts/deps extracted the packages.
fn packages_root() -> PathBuf {
    let dir = std::env::var_os("KUBELET_AUTHENTICATOR_BOOT_PACKAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME");
            Path::new(&home).join(".cache/kubelet-authenticator/boot-packages")
        });
    dir.join("root")
}

/// (what, path) of shim, grub and the kernel in the extracted packages.
fn boot_chain() -> Vec<(&'static str, PathBuf)> {
    let root = packages_root();
    let kernel = std::fs::read_dir(root.join("boot"))
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run scripts/deps (it fetches Debian's boot packages there)",
                root.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .expect("a vmlinuz in the kernel package");
    vec![
        ("shim", root.join("usr/lib/shim/shimx64.efi.signed")),
        ("grub", root.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed")),
        ("kernel", kernel),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// pesign's Authenticode digest of `path` in `algorithm` (`sha256`, `sha1`).
fn pesign(path: &Path, algorithm: &str) -> String {
    let out = Command::new("pesign")
        .args(["-h", "-d", algorithm, "-i"])
        .arg(path)
        .output()
        .expect("pesign (Debian pesign; scripts/deps installs it as root)");
    assert!(
        out.status.success(),
        "pesign {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim()
        .strip_prefix("hash: ")
        .unwrap_or_else(|| panic!("pesign said {text:?}"))
        .to_owned()
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (shim-signed, grub-efi-amd64-signed, a linux-image-*-cloud-amd64), which scripts/deps installs and fetches as root"]
fn authenticode_digests_of_debian_shim_grub_and_kernel_equal_pesigns() {
    for (what, path) in boot_chain() {
        let image = std::fs::read(&path).unwrap();
        let sha256 = hex(&authenticode::sha256(&image).unwrap());
        let sha1 = hex(&authenticode::sha1(&image).unwrap());
        assert_eq!(sha256, pesign(&path, "sha256"), "{what} ({}), SHA-256", path.display());
        assert_eq!(sha1, pesign(&path, "sha1"), "{what} ({}), SHA-1", path.display());
        eprintln!("{what}: {} sha256 {sha256} sha1 {sha1}", path.display());
    }
}

/// The SHA-256 digests the image's signatures sign: in each `WIN_CERTIFICATE` of its
/// attribute certificate table, the `DigestInfo` of the `SpcIndirectDataContent`, the first
/// DER `{ sha256, NULL } OCTET STRING (32)` in the PKCS#7 (the content comes before the
/// certificates and signer infos; a timestamp's message imprint, of the same DER, comes later).
fn signed_digests(image: &[u8]) -> Vec<String> {
    const DIGEST_INFO: [u8; 15] = [
        0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20,
    ];
    let u32_at = |at: usize| u32::from_le_bytes(image[at..at + 4].try_into().unwrap()) as usize;
    let entry = u32_at(0x3c) + 24 + 112 + 32; // PE32+
    let (mut at, end) = (u32_at(entry), u32_at(entry) + u32_at(entry + 4));
    let mut digests = Vec::new();
    while at + 8 <= end {
        let length = u32_at(at);
        let certificate = &image[at + 8..at + length];
        let found = certificate
            .windows(DIGEST_INFO.len() + 32)
            .find(|w| w.starts_with(&DIGEST_INFO))
            .map(|w| hex(&w[DIGEST_INFO.len()..]));
        digests.extend(found);
        at += length.div_ceil(8) * 8;
    }
    digests
}

#[test]
#[ignore = "needs pesign and Debian's boot packages (the same parts as above)"]
fn authenticode_digests_of_debian_shim_grub_and_kernel_are_what_their_signers_signed() {
    for (what, path) in boot_chain() {
        let image = std::fs::read(&path).unwrap();
        let sha256 = hex(&authenticode::sha256(&image).unwrap());
        let signed = signed_digests(&image);
        assert!(!signed.is_empty(), "{what}: no SHA-256 signature found");
        // shim carries two signatures (two WIN_CERTIFICATEs): both sign this digest.
        assert!(
            signed.iter().all(|d| *d == sha256),
            "{what}: signed {signed:?}, computed {sha256}"
        );
        eprintln!("{what}: {} signature(s) sign {sha256}", signed.len());
    }
}

/// The real Ubuntu 21.04 log (google/go-attestation's, in `testdata/event_logs/`) has the shape
/// the reference values predict: after PCR 4's separator the boot applications are shim then
/// grub (by their device paths), each measured by its Authenticode digest; grub's PCR 8
/// `kernel_cmdline:` is its `linux` command's words, the kernel's path first, as `boot-policy`
/// reads them from grub.cfg; the kernel file grub read into PCR 9 is that path. With Secure
/// Boot off (this machine's), grub has no kernel verified and PCR 4 holds no kernel.
#[test]
fn the_real_ubuntu_log_has_the_shape_the_reference_values_predict() {
    use attestation::tpm::event_log::events::{image_path, ipl_label};
    use attestation::tpm::event_log::{HashAlg, event_type, ipl_text, parse};

    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/event_logs/ubuntu_2104_shielded_vm_no_secure_boot_eventlog");
    let log = parse(&std::fs::read(path).unwrap()).unwrap();
    let pcr4: Vec<_> = log
        .events
        .iter()
        .filter(|e| e.pcr == 4)
        .skip_while(|e| e.event_type != event_type::SEPARATOR)
        .skip(1)
        .collect();
    let applications: Vec<String> = pcr4
        .iter()
        .map(|e| {
            assert_eq!(
                e.event_type,
                event_type::EFI_BOOT_SERVICES_APPLICATION,
                "{}",
                e.describe()
            );
            image_path(e).unwrap()
        })
        .collect();
    assert_eq!(
        applications,
        ["\\EFI\\ubuntu\\shimx64.efi", "\\EFI\\ubuntu\\grubx64.efi"]
    );

    let texts: Vec<(usize, String)> = log
        .events
        .iter()
        .filter(|e| e.pcr == 8)
        .filter_map(|e| ipl_text(e, HashAlg::Sha256).unwrap().map(|t| (e.index, t)))
        .collect();
    let (linux_at, linux) = texts
        .iter()
        .find_map(|(i, t)| t.strip_prefix("grub_cmd: linux ").map(|t| (*i, t)))
        .unwrap();
    let command_line = texts
        .iter()
        .find_map(|(_, t)| t.strip_prefix("kernel_cmdline: "))
        .unwrap();
    assert_eq!(command_line, linux);
    let kernel_path = command_line.split(' ').next().unwrap();
    assert_eq!(kernel_path, "/boot/vmlinuz-5.11.0-1006-gcp");
    let kernel_file = log
        .events
        .iter()
        .find(|e| e.pcr == 9 && e.index > linux_at)
        .and_then(ipl_label)
        .unwrap();
    assert_eq!(kernel_file, kernel_path);
}
