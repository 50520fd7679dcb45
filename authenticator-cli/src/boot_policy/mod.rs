//! `kubelet-authenticator boot-policy`: run at the end of an image bake, it prints the `tpm/v1`
//! boot policy (SPEC section 5; format `attestation::tpm::boot_policy::PolicyDocument`) with
//! one image: the reference values a node booted from this image will show.
//!
//! - `bootloaders`: the SHA-256 Authenticode digests of shim and grub
//!   ([`attestation::tpm::authenticode`]), which the firmware and then shim measure into PCR 4;
//! - `kernel`: the kernel's Authenticode digest (shim measures it when grub has it verified);
//! - `kernelFile`: the SHA-256 of the kernel file, as grub measures it into PCR 9 (revision 6:
//!   the initrd is the file grub reads after it, so nothing read or extended later passes for it);
//! - `initrd`: the SHA-256 of the initrd file, as grub measures the files it reads into PCR 9;
//! - `commandLine`: what grub measures into PCR 8 after `kernel_cmdline: `, read from
//!   `grub.cfg`'s first entry ([`grub_cfg`]) or given.
//!
//! The initrd is regenerated whenever kernels or modules change, so this runs last, after
//! everything else the bake installs. Every path can be given; `--root` reads an image mounted
//! elsewhere (the defaults are then taken under it).

mod files;
mod grub_cfg;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
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
    /// shim (default: the one `/boot/efi/EFI/*/shimx64.efi`).
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// grub (default: `grubx64.efi` beside shim).
    #[arg(long, value_name = "PATH")]
    pub grub: Option<PathBuf>,
    /// The kernel version whose `/boot/vmlinuz-VER` and `/boot/initrd.img-VER` are read
    /// (default: the newest `/boot/vmlinuz-*`).
    #[arg(long, value_name = "VER")]
    pub kernel_version: Option<String>,
    /// The kernel (an EFI-stub PE image).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// The initrd.
    #[arg(long, value_name = "PATH", conflicts_with = "no_initrd")]
    pub initrd: Option<PathBuf>,
    /// List no initrd (a kernel booted without one).
    #[arg(long)]
    pub no_initrd: bool,
    /// The kernel command line as grub measures it (`/boot/vmlinuz-VER root=... ro`; default:
    /// read from grub.cfg's first menuentry).
    #[arg(long, value_name = "TEXT", conflicts_with = "no_command_line")]
    pub command_line: Option<String>,
    /// List no command line (the policy then does not check it).
    #[arg(long)]
    pub no_command_line: bool,
    /// grub.cfg (default: `/boot/grub/grub.cfg`).
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

/// Prints the policy for the image's files.
pub fn run(args: &BootPolicyArgs) -> Result<String> {
    let policy = policy(args)?;
    serde_yaml::to_string(&policy).context("writing the policy as YAML")
}

/// The policy document for the image's files.
pub fn policy(args: &BootPolicyArgs) -> Result<PolicyDocument> {
    let root = &args.root;
    let shim = match &args.shim {
        Some(path) => path.clone(),
        None => files::shim(root)?,
    };
    let grub = match &args.grub {
        Some(path) => path.clone(),
        None => shim.with_file_name("grubx64.efi"),
    };
    let version = match &args.kernel_version {
        Some(version) => version.clone(),
        None if args.kernel.is_some() => String::new(),
        None => files::newest_kernel_version(root)?,
    };
    let kernel = match &args.kernel {
        Some(path) => path.clone(),
        None => root.join(format!("boot/vmlinuz-{version}")),
    };
    let initrd = if args.no_initrd {
        None
    } else {
        Some(match &args.initrd {
            Some(path) => path.clone(),
            None if version.is_empty() => {
                bail!("--kernel without --kernel-version: give --initrd PATH or --no-initrd")
            }
            None => root.join(format!("boot/initrd.img-{version}")),
        })
    };
    let command_line = if args.no_command_line {
        None
    } else if let Some(text) = &args.command_line {
        Some(text.clone())
    } else {
        let cfg = args.grub_cfg.clone().unwrap_or_else(|| root.join("boot/grub/grub.cfg"));
        Some(command_line_from(&cfg, &kernel)?)
    };

    let image = ImageDocument {
        name: args.image_name.clone(),
        bootloaders: vec![pe_digest(&shim, "shim")?, pe_digest(&grub, "grub")?],
        kernel: pe_digest(&kernel, "the kernel")?,
        kernel_file: Some(file_digest(&kernel, "the kernel", "--kernel PATH")?),
        initrd: initrd
            .map(|path| file_digest(&path, "the initrd", "--initrd PATH, or --no-initrd"))
            .transpose()?,
        command_line,
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

/// grub.cfg's first entry's measured command line, which must boot `kernel`.
fn command_line_from(cfg: &Path, kernel: &Path) -> Result<String> {
    let text = std::fs::read_to_string(cfg).with_context(|| {
        format!(
            "reading {} (give --command-line TEXT, or --no-command-line)",
            cfg.display()
        )
    })?;
    let entry = grub_cfg::first_entry_command_line(&text)
        .with_context(|| format!("{}: give --command-line TEXT, or --no-command-line", cfg.display()))?;
    let named = Path::new(&entry.kernel_path).file_name();
    if named != kernel.file_name() {
        bail!(
            "{}'s first menuentry boots {}, not {} (run update-grub, or give --command-line TEXT)",
            cfg.display(),
            entry.kernel_path,
            kernel.display()
        );
    }
    Ok(entry.measured)
}

fn pe_digest(path: &Path, what: &str) -> Result<String> {
    let image = std::fs::read(path).with_context(|| format!("reading {what} ({})", path.display()))?;
    let digest = authenticode::sha256(&image)
        .with_context(|| format!("{what} ({}) has no Authenticode digest", path.display()))?;
    Ok(hex(&digest))
}

/// The SHA-256 of a file as grub reads it into PCR 9 (the kernel file, the initrd).
fn file_digest(path: &Path, what: &str, give: &str) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {what} ({}; give {give})", path.display()))?;
    Ok(hex(
        aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes).as_ref()
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
