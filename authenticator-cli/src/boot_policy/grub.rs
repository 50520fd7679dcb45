//! Debian's and Ubuntu's boot path: the firmware starts shim (`/boot/efi/EFI/<vendor>/shimx64.efi`),
//! shim starts `grubx64.efi` beside it, grub runs `/boot/grub/grub.cfg`'s first `menuentry`:
//! it reads `/boot/vmlinuz-VER` (PCR 9), has shim verify it (PCR 4), measures the command line
//! (PCR 8, [`grub_cfg`](super::grub_cfg)) and reads `/boot/initrd.img-VER` (PCR 9).

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{BootApplication, BootFiles, BootPolicyArgs, command_line_or, files, grub_cfg, initrd_or};

/// The files of Debian's grub boot path under `args.root`, the flags' where given.
pub fn read(args: &BootPolicyArgs) -> Result<BootFiles> {
    let root = &args.root;
    let (shim, grub) = files::shim_and_grub(args)?;
    let version = match &args.kernel_version {
        Some(version) => version.clone(),
        None if args.kernel.is_some() => String::new(),
        None => files::newest_kernel_version(root)?,
    };
    let kernel = match &args.kernel {
        Some(path) => path.clone(),
        None => root.join(format!("boot/vmlinuz-{version}")),
    };
    let initrd = initrd_or(args, || {
        if version.is_empty() {
            bail!("--kernel without --kernel-version: give --initrd PATH or --no-initrd")
        }
        Ok(Some(root.join(format!("boot/initrd.img-{version}"))))
    })?;
    let command_line = command_line_or(args, || {
        let cfg = args.grub_cfg.clone().unwrap_or_else(|| root.join("boot/grub/grub.cfg"));
        command_line_from(&cfg, &kernel).map(Some)
    })?;
    Ok(BootFiles {
        bootloaders: vec![BootApplication::shim(shim), BootApplication::loader("grub", grub)],
        kernel,
        kernel_file: true,
        initrd,
        command_line,
        notes: Vec::new(),
    })
}

/// grub.cfg's first entry's measured command line, which must boot `kernel`.
fn command_line_from(cfg: &Path, kernel: &Path) -> Result<String> {
    let text = files::read_text(cfg, "grub.cfg", "--command-line TEXT, or --no-command-line")?;
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
