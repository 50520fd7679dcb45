//! `kubelet-authenticator`: the node side of attested kubelet identity, a client-go exec
//! credential plugin. See the repository README.
//!
//! - exec mode (no subcommand): what kubelet runs; [`exec`].
//! - `status`, `kubeconfig`: [`report`]; `csr`: an offline request, [`csr`].
//! - `boot-policy`: the image's `tpm/v1` reference values, [`boot_policy`].

mod adopt;
mod backoff;
mod boot_policy;
mod cert_dir;
mod csr;
mod error_chain;
mod exec;
mod exec_credential;
mod metadata;
mod obtain;
mod report;
mod secret_file;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kubelet-authenticator",
    version,
    // `-h` shows `about` only: it too says what the bare command is, since that is what kubelet
    // runs and what a person meets first in a kubeconfig.
    about = "Attested kubelet client certificates. Without a subcommand: the client-go exec \
        credential plugin kubelet runs (prints one ExecCredential). Subcommands are for people \
        and image builds.",
    override_usage = "kubelet-authenticator [OPTIONS]             (exec mode: what kubelet runs)\n       \
        kubelet-authenticator [OPTIONS] <COMMAND>   (OPTIONS go before the subcommand)",
    long_about = "Attested kubelet client certificates for Cluster API workload clusters.\n\n\
        Without a subcommand it is the client-go exec credential plugin: kubelet (its kubeconfig \
        user) runs it, and it prints one ExecCredential (KUBERNETES_EXEC_INFO is read), filing and \
        renewing the certificate through the signer as needed. The subcommands are for people and \
        image builds.",
    args_conflicts_with_subcommands = false
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    exec: exec::ExecArgs,
}

#[derive(Subcommand)]
enum Command {
    /// What the cert dir holds: subject, provider ID, validity, rotation point, backoff, last error.
    // The exec-mode flags it reads belong to the top-level command: the usage says where they go,
    // since clap's "unexpected argument" is all a person typing them after `status` would see.
    #[command(override_usage = "kubelet-authenticator [OPTIONS] status    (OPTIONS: see kubelet-authenticator --help)")]
    Status,
    /// Print a kubelet kubeconfig whose user runs this plugin with the given flags.
    #[command(
        override_usage = "kubelet-authenticator [OPTIONS] kubeconfig [KUBECONFIG OPTIONS]    (OPTIONS: see kubelet-authenticator --help)"
    )]
    Kubeconfig(report::KubeconfigArgs),
    /// Generate a key and print a complete `spec.request` envelope for it (offline).
    Csr(csr::CsrArgs),
    /// Print the tpm/v1 boot policy (one image) for this image's shim, grub, kernel, initrd and
    /// command line: run last when baking an image.
    BootPolicy(boot_policy::BootPolicyArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        None => exec::run(&cli.exec),
        Some(Command::Status) => report::status(&cli.exec),
        Some(Command::Kubeconfig(args)) => report::kubeconfig(args, &cli.exec),
        Some(Command::Csr(args)) => csr::run(args).map(|()| String::new()),
        Some(Command::BootPolicy(args)) => boot_policy::run(args),
    };
    match result {
        Ok(output) => {
            // One write of the whole text: stdout never holds part of a credential.
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(output.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        // Every failure, whatever the mode, exits 1 (clap's usage errors exit 2).
        Err(error) => {
            eprintln!("kubelet-authenticator: {}", error_chain::Chain(&error));
            ExitCode::FAILURE
        }
    }
}
