//! `node-attestation-signer`: approves and signs attested kubelet client certificates for
//! Cluster API workload clusters. See the repository README.

mod check;
mod cloud;
mod controller;
mod csr_object;
mod explain;
mod locks;
mod manifests;
mod opt_out;
mod render;
mod revoke;
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
    /// Why was this node denied? Read-only, against the live management cluster and (through
    /// the Cluster's kubeconfig Secret) its workload cluster: the decision the signer would take
    /// now with every rule's outcome, what is recorded on the CSR, the Machine, claim and Node it
    /// was judged against, and the Events written; or, with --pending, every CSR still waiting
    /// or refused. Exit 0 when explained, 2 when it could not be.
    Explain(Box<explain::ExplainArgs>),
    /// Print a Role and RoleBinding letting the given people run explain for the given Clusters
    /// of one namespace: `get` on exactly their `<cluster>-kubeconfig` Secrets, never another
    /// Secret (apply it with `kubectl apply -f -`).
    ExplainRbac(explain::rbac::ExplainRbacArgs),
    /// Print kubeadm's two auto-approve ClusterRoleBindings exactly as kubeadm creates them, for
    /// an opt-out: apply them in the workload cluster (`kubectl apply -f -`) once the Cluster is
    /// annotated `cluster.x-k8s.io/kubelet-legacy-autoapprove: keep`, before nodes roll to stock
    /// kubeadm templates.
    OptOutBindings,
    /// Revoke every certificate the signer issued for one node or one Machine, by hand: the
    /// workload cluster's admission policy refuses their writes within seconds, until each
    /// would have expired. Leaves a Warning Event on the Cluster (or Machine) and prints what
    /// it revoked. Exit 0 when revoked, 2 when nothing could be.
    Revoke(Box<revoke::RevokeArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Check(args) => check::run(args),
        Command::Run(args) => controller::run(args).map(|()| true),
        Command::Explain(args) => explain::run(args).map(|()| true),
        Command::ExplainRbac(args) => explain::rbac::run(args).map(|()| true),
        Command::OptOutBindings => opt_out::run().map(|()| true),
        Command::Revoke(args) => revoke::run(args).map(|()| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {}", said_once(&error));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes joined by `: `, as anyhow's `{:#}` prints them, but a cause whose
/// words are already printed is left out: some libraries' errors (kube's kubeconfig errors,
/// `time`'s parse errors) print their cause in their message and return it from `source()` too.
fn said_once(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its cause and returns it from `source()`, against the rule.
    #[derive(Debug)]
    struct Both(std::io::Error);

    impl std::fmt::Display for Both {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed to read kubeconfig: {}", self.0)
        }
    }

    impl std::error::Error for Both {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_printed_is_not_printed_again() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let error = anyhow::Error::new(Both(io())).context("cannot read the management kubeconfig /x");
        assert_eq!(
            said_once(&error),
            "cannot read the management kubeconfig /x: failed to read kubeconfig: No such file or directory"
        );
        // A cause not yet said is printed as anyhow prints it.
        let error = anyhow::Error::new(io()).context("cannot read /x");
        assert_eq!(said_once(&error), format!("{error:#}"));
    }
}
