//! `kubelet-authenticator boot-policy`: run at the end of an image bake, it prints the `tpm/v1`
//! boot policy (SPEC section 5; format `attestation::tpm::boot_policy::PolicyDocument`) with
//! one image: the reference values a node booted from this image will show.
//!
//! - `bootloaders`: the SHA-256 Authenticode digests ([`attestation::tpm::authenticode`]) of the
//!   boot applications before the kernel, in the order they load (shim, then grub or
//!   systemd-boot), which the firmware and then shim measure into PCR 4;
//! - `kernel`: the kernel's Authenticode digest, the last PCR 4 application (a unified kernel
//!   image's own);
//! - `kernelFile`: where grub reads the kernel, the SHA-256 of the kernel file it measures into
//!   PCR 9 (revision 6: the initrd is the file grub reads after it, so nothing read or extended
//!   later passes for it);
//! - `initrd`: the SHA-256 of the initrd file, as grub measures the files it reads into PCR 9,
//!   or the Linux EFI stub the initrd it was served;
//! - `commandLine`: the kernel command line the boot path measures, read from its
//!   configuration, or given.
//!
//! Which files those are depends on the image's boot path ([`BootPath`]); `--boot-path auto`
//! detects it ([`detect`]), and each path's module reads its files: [`grub`] (Debian, Ubuntu),
//! [`rhel`] (RHEL-family grub with BLS entries), [`systemd_boot`], [`uki`]. This module only
//! dispatches and computes the digests.
//!
//! The initrd is regenerated whenever kernels or modules change, so this runs last, after
//! everything else the bake installs. Every path can be given; `--root` reads an image mounted
//! elsewhere (the defaults are then taken under it).

mod bls;
mod detect;
mod esp;
mod files;
mod grub;
mod grub_cfg;
mod rhel;
mod systemd_boot;
mod uki;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use attestation::tpm::authenticode;
use attestation::tpm::boot_policy::{API_VERSION, ImageDocument, KIND, PolicyDocument, SecureBoot};

/// `boot-policy`'s flags.
#[derive(Debug, clap::Args)]
pub struct BootPolicyArgs {
    /// The image's name in the policy (the image builder's image name).
    #[arg(long)]
    pub image_name: String,
    /// Read the image mounted at DIR: every default path below is taken under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// How the image boots: auto detects a unified kernel image (`EFI/Linux/*.efi` on the ESP),
    /// systemd-boot with `loader/entries`, RHEL-family grub (`/boot/grub2`, BLS entries) or
    /// Debian's grub (`/boot/grub/grub.cfg`), in that order.
    #[arg(long, value_enum, default_value = "auto")]
    pub boot_path: BootPathArg,
    /// shim (default: the one `EFI/*/shimx64.efi` on the ESP; for systemd-boot and unified
    /// kernel images only when present).
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// The boot loader after shim (default: `grubx64.efi` beside shim; systemd-boot and unified
    /// kernel images: the ESP's `EFI/systemd/systemd-bootx64.efi`).
    #[arg(long, value_name = "PATH")]
    pub grub: Option<PathBuf>,
    /// The kernel version to read: grub's `/boot/vmlinuz-VER` and `/boot/initrd.img-VER`, the
    /// BLS entry of that version (rhel-grub, systemd-boot), the `EFI/Linux/*.efi` whose name
    /// holds it (uki) (default: the newest).
    #[arg(long, value_name = "VER")]
    pub kernel_version: Option<String>,
    /// The kernel (an EFI-stub PE image, or a unified kernel image).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// The initrd.
    #[arg(long, value_name = "PATH", conflicts_with = "no_initrd")]
    pub initrd: Option<PathBuf>,
    /// List no initrd (a kernel booted without one).
    #[arg(long)]
    pub no_initrd: bool,
    /// The kernel command line as the boot path measures it (grub: `/boot/vmlinuz-VER root=...
    /// ro`, the path optional; systemd-boot: `initrd=\initrd.img root=... ro`; default: read
    /// from grub.cfg's first menuentry or the BLS entry).
    #[arg(long, value_name = "TEXT", conflicts_with = "no_command_line")]
    pub command_line: Option<String>,
    /// List no command line (the policy then does not check it).
    #[arg(long)]
    pub no_command_line: bool,
    /// grub.cfg (default: `/boot/grub/grub.cfg`; rhel-grub: `/boot/grub2/grub.cfg`, whose `set`
    /// lines give the variables grubenv does not).
    #[arg(long, value_name = "PATH")]
    pub grub_cfg: Option<PathBuf>,
    /// Whether the policy requires Secure Boot.
    #[arg(long, value_enum, default_value = "required")]
    pub secure_boot: SecureBootArg,
}

/// `--secure-boot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SecureBootArg {
    /// PCR 7 must show Secure Boot enabled.
    Required,
    /// Not checked.
    Optional,
}

/// `--boot-path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BootPathArg {
    /// Detect it from the image's files.
    Auto,
    /// Debian's and Ubuntu's: shim, grub, `/boot/grub/grub.cfg`'s first entry.
    Grub,
    /// RHEL, Rocky, Alma, CentOS Stream, Fedora: shim, grub, BLS entries in `/boot/loader`.
    RhelGrub,
    /// [shim,] systemd-boot, an ESP's `loader/entries`.
    SystemdBoot,
    /// [shim,] [systemd-boot,] a unified kernel image in the ESP's `EFI/Linux`.
    Uki,
}

/// A boot path: which programs boot the kernel, and so which files the policy lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootPath {
    /// [`grub`].
    Grub,
    /// [`rhel`].
    RhelGrub,
    /// [`systemd_boot`].
    SystemdBoot,
    /// [`uki`].
    Uki,
}

impl BootPath {
    /// Its `--boot-path` name.
    pub fn name(self) -> &'static str {
        match self {
            BootPath::Grub => "grub",
            BootPath::RhelGrub => "rhel-grub",
            BootPath::SystemdBoot => "systemd-boot",
            BootPath::Uki => "uki",
        }
    }
}

/// The files a boot path boots, found: what the policy's digests are computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFiles {
    /// The boot applications before the kernel, in load order.
    pub bootloaders: Vec<BootApplication>,
    /// The kernel, or the unified kernel image.
    pub kernel: PathBuf,
    /// Whether grub reads the kernel file into PCR 9 (its SHA-256 is then `kernelFile`).
    pub kernel_file: bool,
    /// The initrd whose SHA-256 the boot measures, if listed.
    pub initrd: Option<PathBuf>,
    /// The command line, if listed.
    pub command_line: Option<String>,
    /// What reading chose that the bake's log should show (printed to stderr).
    pub notes: Vec<String>,
}

/// A boot application before the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootApplication {
    /// What it is, for messages (`shim`, `grub`, `systemd-boot`).
    pub what: &'static str,
    /// The flag that names another file (`--shim PATH`).
    pub give: &'static str,
    /// The file.
    pub path: PathBuf,
}

impl BootApplication {
    /// shim at `path`.
    pub fn shim(path: PathBuf) -> Self {
        Self {
            what: "shim",
            give: "--shim PATH",
            path,
        }
    }

    /// The loader after shim (`what`: grub, systemd-boot), which `--grub` names.
    pub fn loader(what: &'static str, path: PathBuf) -> Self {
        Self {
            what,
            give: "--grub PATH",
            path,
        }
    }
}

/// Prints the policy for the image's files, and to stderr the boot path and any notes.
pub fn run(args: &BootPolicyArgs) -> Result<String> {
    let (path, why) = boot_path(args)?;
    eprintln!("kubelet-authenticator boot-policy: boot path {} ({why})", path.name());
    let files = read(path, args)?;
    for note in &files.notes {
        eprintln!("kubelet-authenticator boot-policy: {note}");
    }
    let policy = policy(args, &files)?;
    serde_yaml::to_string(&policy).context("writing the policy as YAML")
}

/// The boot path `--boot-path` names or the image's files show, and why.
fn boot_path(args: &BootPolicyArgs) -> Result<(BootPath, String)> {
    Ok(match args.boot_path {
        BootPathArg::Auto => return detect::detect(&args.root),
        BootPathArg::Grub => (BootPath::Grub, "--boot-path".to_owned()),
        BootPathArg::RhelGrub => (BootPath::RhelGrub, "--boot-path".to_owned()),
        BootPathArg::SystemdBoot => (BootPath::SystemdBoot, "--boot-path".to_owned()),
        BootPathArg::Uki => (BootPath::Uki, "--boot-path".to_owned()),
    })
}

/// The files `path` boots on the image, the flags' where given.
pub fn read(path: BootPath, args: &BootPolicyArgs) -> Result<BootFiles> {
    match path {
        BootPath::Grub => grub::read(args),
        BootPath::RhelGrub => rhel::read(args),
        BootPath::SystemdBoot => systemd_boot::read(args),
        BootPath::Uki => uki::read(args),
    }
}

/// The policy document for `files`.
pub fn policy(args: &BootPolicyArgs, files: &BootFiles) -> Result<PolicyDocument> {
    let image = ImageDocument {
        name: args.image_name.clone(),
        bootloaders: files
            .bootloaders
            .iter()
            .map(|app| pe_digest(&app.path, app.what, app.give))
            .collect::<Result<_>>()?,
        kernel: pe_digest(&files.kernel, "the kernel", "--kernel PATH")?,
        kernel_file: files
            .kernel_file
            .then(|| file_digest(&files.kernel, "the kernel", "--kernel PATH"))
            .transpose()?,
        initrd: files
            .initrd
            .as_deref()
            .map(|path| file_digest(path, "the initrd", "--initrd PATH, or --no-initrd"))
            .transpose()?,
        command_line: files.command_line.clone(),
    };
    Ok(PolicyDocument {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        secure_boot: match args.secure_boot {
            SecureBootArg::Required => SecureBoot::Required,
            SecureBootArg::Optional => SecureBoot::Optional,
        },
        authorities: Vec::new(),
        dbx: Vec::new(),
        images: vec![image],
    })
}

/// The initrd: none with `--no-initrd`, `--initrd`'s, else what `found` reads.
fn initrd_or(args: &BootPolicyArgs, found: impl FnOnce() -> Result<Option<PathBuf>>) -> Result<Option<PathBuf>> {
    match &args.initrd {
        _ if args.no_initrd => Ok(None),
        Some(path) => Ok(Some(path.clone())),
        None => found(),
    }
}

/// The command line: none with `--no-command-line`, `--command-line`'s, else what `found`
/// reads.
fn command_line_or(args: &BootPolicyArgs, found: impl FnOnce() -> Result<Option<String>>) -> Result<Option<String>> {
    match &args.command_line {
        _ if args.no_command_line => Ok(None),
        Some(text) => Ok(Some(text.clone())),
        None => found(),
    }
}

/// Whether the flags leave the initrd or the command line to be read from the configuration.
fn reads_configuration(args: &BootPolicyArgs) -> bool {
    (args.initrd.is_none() && !args.no_initrd) || (args.command_line.is_none() && !args.no_command_line)
}

fn pe_digest(path: &Path, what: &str, give: &str) -> Result<String> {
    let image = files::read_file(path, what, give)?;
    let digest = authenticode::sha256(&image)
        .with_context(|| format!("{what} ({}) has no Authenticode digest", path.display()))?;
    Ok(hex(&digest))
}

/// The SHA-256 of a file as grub reads it into PCR 9 (the kernel file, the initrd), or as the
/// Linux stub measures the initrd it was served.
fn file_digest(path: &Path, what: &str, give: &str) -> Result<String> {
    let bytes = files::read_file(path, what, give)?;
    Ok(hex(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes).as_ref()
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
impl BootPolicyArgs {
    /// Every flag at its default, reading the image at `root`.
    pub(crate) fn defaults(root: &Path) -> Self {
        Self {
            image_name: "x".into(),
            root: root.to_path_buf(),
            boot_path: BootPathArg::Auto,
            shim: None,
            grub: None,
            kernel_version: None,
            kernel: None,
            initrd: None,
            no_initrd: false,
            command_line: None,
            no_command_line: false,
            grub_cfg: None,
            secure_boot: SecureBootArg::Required,
        }
    }
}
