//! `node-attestation-signer`: approves and signs attested kubelet client certificates for
//! Cluster API workload clusters. See the repository README.

mod check;
mod cloud;
mod controller;
mod csr_object;
mod manifests;
mod verifiers;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "node-attestation-signer", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decide one CSR offline, with every rule's outcome; signs it when approved and a CA is given.
    /// Exit 0 approved, 1 denied or left pending, 2 unusable input.
    Check(Box<check::CheckArgs>),
    /// Run the controller: watch every opted-in Cluster's CSRs, decide, claim, approve, sign.
    Run(Box<controller::RunArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Check(args) => check::run(args),
        Command::Run(args) => controller::run(args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
