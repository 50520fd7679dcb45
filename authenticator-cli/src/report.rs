//! `status` (what the cert dir holds, for a person) and `kubeconfig` (the kubelet kubeconfig
//! whose user runs this plugin, for image builds).

use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use time::OffsetDateTime;

use crate::backoff::{self, Hold};
use crate::cert_dir::{CURRENT, Cached, CertDir};
use crate::exec::ExecArgs;

/// `status`: subject, provider ID, validity, rotation point, backoff, last error.
pub fn status(args: &ExecArgs) -> Result<String> {
    let node = args.node()?;
    // A provider ID given that cannot be read is an error, not a status without one.
    let provider_id = match (&args.provider_id, &args.provider_id_file) {
        (None, None) => None,
        _ => Some(args.provider_id()?),
    };
    // For a person: it looks, and creates nothing. A missing cert dir is said, not made (exec
    // mode creates it at its first call).
    let dir = CertDir::existing(&args.cert_dir);
    let dir_state = match std::fs::metadata(&args.cert_dir) {
        Ok(meta) if meta.is_dir() => DirState::Present,
        Ok(_) => DirState::Other("NOT A DIRECTORY".to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DirState::Missing,
        Err(e) => DirState::Other(format!("cannot be read: {e}")),
    };
    let now = OffsetDateTime::now_utc();
    let mut out = String::new();
    let _ = match &dir_state {
        DirState::Present => writeln!(out, "cert dir:      {}", args.cert_dir.display()),
        DirState::Missing => writeln!(
            out,
            "cert dir:      {} (does not exist: nothing stored yet; exec mode creates it)",
            args.cert_dir.display()
        ),
        DirState::Other(why) => writeln!(out, "cert dir:      {} ({why})", args.cert_dir.display()),
    };
    let _ = writeln!(out, "node:          {}", node.username());
    let _ = writeln!(out, "attestor:      {}", args.attestor.provider_version());
    let _ = writeln!(out, "signer:        {}", args.signer());
    let backoff = dir.backoff();
    let request = provider_id.as_ref().map(|p| args.request_key(&node, p));
    let hold = match (&backoff, &request) {
        (Ok(Some(record)), Some(request)) => Some(record.hold(request, now)),
        _ => None,
    };
    let current = dir.current(&node, provider_id.as_ref(), now);
    // The signer backdates notBefore by 5 minutes: a certificate issued at or after `at`
    // starts no earlier than 5 minutes before it.
    let issued_since = |at: OffsetDateTime| match &current {
        Cached::Usable(c) => c.not_before >= at - time::Duration::minutes(5),
        _ => false,
    };
    match &current {
        Cached::Missing => {
            let next = match hold {
                Some(Hold::Until(_)) => "a CSR is filed when the backoff ends",
                _ => "the next call files a CSR",
            };
            let missing = match dir_state {
                DirState::Missing => "the cert dir does not exist".to_owned(),
                _ => format!("{CURRENT} is missing"),
            };
            let _ = writeln!(out, "certificate:   none yet ({missing}): {next}");
        }
        Cached::Unusable(why) => {
            let _ = writeln!(out, "certificate:   UNUSABLE, will be replaced: {why}");
        }
        Cached::Foreign(c, why) => {
            let _ = writeln!(out, "certificate:   FOREIGN: {}", why.explain());
            let _ = writeln!(
                out,
                "               {} ({})",
                c.subject,
                std::fs::canonicalize(dir.path(CURRENT)).unwrap_or_default().display()
            );
            let _ = writeln!(out, "provider ID:   {}", c.provider_id.as_deref().unwrap_or("(none)"));
            let _ = writeln!(out, "not before:    {}", backoff::rfc3339(c.not_before));
            let _ = writeln!(out, "not after:     {}", backoff::rfc3339(c.not_after));
            let state = if let Some(Hold::Until(_)) = hold {
                "renewed with it as the node's identity when the backoff ends, answered until then"
            } else {
                "the next call renews with it as the node's identity"
            };
            let _ = writeln!(out, "rotation:      {state}");
        }
        Cached::Usable(c) => {
            let _ = writeln!(
                out,
                "certificate:   {} ({})",
                c.subject,
                std::fs::canonicalize(dir.path(CURRENT)).unwrap_or_default().display()
            );
            let _ = writeln!(out, "provider ID:   {}", c.provider_id.as_deref().unwrap_or("(none)"));
            let _ = writeln!(out, "not before:    {}", backoff::rfc3339(c.not_before));
            let _ = writeln!(out, "not after:     {}", backoff::rfc3339(c.not_after));
            let state = if now < c.rotate_at {
                "cached, answered at once"
            } else if let Some(Hold::Until(_)) = hold {
                "due: renewed when the backoff ends, answered until then"
            } else {
                "due: the next call renews"
            };
            let _ = writeln!(out, "rotation at:   {} ({state})", backoff::rfc3339(c.rotate_at));
        }
    }
    if let Some(replaced) = dir.obtained().and_then(|record| record.replaced) {
        let _ = writeln!(
            out,
            "replaced:      at {} a certificate (sha256 {}) {}",
            backoff::rfc3339(replaced.at),
            replaced.sha256,
            backoff::printable(&replaced.why)
        );
    }
    match backoff {
        Ok(None) => {
            let _ = writeln!(out, "backoff:       none");
        }
        Err(why) => {
            let _ = writeln!(out, "backoff:       ignored, not a record: {why}");
        }
        Ok(Some(record)) => {
            let _ = writeln!(out, "backoff:       {}", record.describe());
            let next = match hold {
                Some(Hold::Until(until)) => format!("not before {}", backoff::when(until, now)),
                Some(Hold::Over) => "the next call files a CSR (the delay has passed)".to_owned(),
                Some(Hold::OtherRequest) => "the next call files a CSR (recorded for other flags)".to_owned(),
                Some(Hold::Implausible) => format!(
                    "the next call files a CSR (the record asks to wait beyond the {} cap: ignored)",
                    backoff::CAP
                ),
                None => format!(
                    "not before {} (no provider ID to compare)",
                    backoff::rfc3339(record.retry_at)
                ),
            };
            let _ = writeln!(out, "next CSR:      {next}");
        }
    }
    let _ = writeln!(
        out,
        "last error:    {}",
        dir.last_error()
            .map_or_else(|| "none".to_owned(), |e| e.trim().to_owned())
    );
    let last_denial = dir.last_denial();
    match &last_denial {
        Ok(None) => {
            let _ = writeln!(out, "last denial:   none");
        }
        Err(why) => {
            let _ = writeln!(out, "last denial:   ignored, not a record: {why}");
        }
        Ok(Some(denial)) => {
            let since = if issued_since(denial.denied_at) {
                " (a certificate was issued since)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "last denial:   {}{since}: CSR {} {} ({}): {}",
                backoff::rfc3339(denial.denied_at),
                backoff::printable(&denial.csr),
                backoff::printable(&denial.condition),
                backoff::printable(&denial.reason),
                backoff::printable(&denial.message)
            );
        }
    }
    // The question a person asks next, asked from the management side.
    let locate = match &provider_id {
        Some(id) => format!("--provider-id {}", shell_word(id.as_str())),
        None => "--cluster <namespace>/<cluster>".to_owned(),
    };
    let _ = writeln!(
        out,
        "explain:       node-attestation-signer explain {locate} --node {}",
        shell_word(node.as_str())
    );
    if let Ok(Some(denial)) = &last_denial
        && !denial.csr.is_empty()
    {
        let _ = writeln!(
            out,
            "               node-attestation-signer explain {locate} {}",
            shell_word(&denial.csr)
        );
    }
    Ok(out)
}

/// What `status` found at the cert dir's path.
enum DirState {
    /// A directory.
    Present,
    /// Nothing.
    Missing,
    /// Something else, or an error; said as it is.
    Other(String),
}

/// `word` as one shell word: as it is when it is plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", backoff::printable(word).replace('\'', "'\\''"))
    }
}

/// Arguments of `kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// The workload apiserver URL (default: the bootstrap kubeconfig's).
    #[arg(long)]
    pub server: Option<String>,
    /// Its CA bundle on the node (default: the bootstrap kubeconfig's CA).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Where the plugin is installed on the node.
    #[arg(long, default_value = "/usr/local/bin/kubelet-authenticator")]
    pub command: PathBuf,
    /// Write the kubeconfig here (0600, atomically) instead of printing it.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// With --output: leave an existing file as it is (kubelet's unit renders its kubeconfig on
    /// every start; only the first, after `kubeadm join` wrote the bootstrap kubeconfig, writes).
    #[arg(long, requires = "output")]
    pub keep_existing: bool,
    /// With --output: an existing file the plugin did not write (kubeadm's kubelet.conf on the
    /// first control-plane node, or kubelet's own on a node that joined before the opt-in) is
    /// taken over: its client certificate becomes the cert dir's current credential (the
    /// signer adopts the node at the plugin's first request, made with it), the file is kept as
    /// `<output>.pre-adoption`, and the plugin's kubeconfig replaces it. An existing plugin
    /// kubeconfig is kept. When the certificate cannot be taken over, nothing changes and the
    /// reason goes to `status`; the exit status stays 0 so kubelet still starts.
    #[arg(long, requires = "output", conflicts_with = "keep_existing")]
    pub adopt: bool,
}

/// The apiserver and its CA, as the rendered kubeconfig names them.
struct Endpoint {
    server: String,
    /// `certificate-authority` (a path) or `certificate-authority-data` (base64).
    ca: (&'static str, String),
}

/// `--server` and `--ca-file`, or what the bootstrap kubeconfig's current context names (the
/// file `kubeadm join` writes before it starts kubelet), or `fallback` (the adopted
/// kubeconfig's apiserver) when there is no bootstrap kubeconfig (the first control-plane node
/// has none; `kubeadm join` deletes it at the end).
fn endpoint_or(
    args: &KubeconfigArgs,
    exec: &ExecArgs,
    fallback: Option<(String, (&'static str, String))>,
) -> Result<Endpoint> {
    let from_bootstrap = || -> Result<(String, (&'static str, String))> {
        let path = &exec.bootstrap_kubeconfig;
        if let Some(fallback) = fallback.clone().filter(|_| !path.exists()) {
            return Ok(fallback);
        }
        let kubeconfig = crate::obtain::read_kubeconfig(path, || {
            format!("the bootstrap kubeconfig {} (--bootstrap-kubeconfig)", path.display())
        })
        .context("no --server and --ca-file, and their defaults come from the bootstrap kubeconfig")?;
        let context = kubeconfig
            .current_context
            .as_deref()
            .and_then(|name| kubeconfig.contexts.iter().find(|c| c.name == name))
            .and_then(|c| c.context.as_ref())
            .with_context(|| format!("{}: no current context", path.display()))?;
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .with_context(|| format!("{}: no cluster {:?}", path.display(), context.cluster))?;
        let server = cluster
            .server
            .clone()
            .with_context(|| format!("{}: the cluster names no server", path.display()))?;
        let ca = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(data), _) => ("certificate-authority-data", data.clone()),
            (None, Some(file)) => ("certificate-authority", file.clone()),
            (None, None) => anyhow::bail!("{}: the cluster names no CA", path.display()),
        };
        Ok((server, ca))
    };
    let (server, ca) = match (&args.server, &args.ca_file) {
        (Some(server), Some(ca)) => (server.clone(), ("certificate-authority", ca.display().to_string())),
        (server, ca_file) => {
            let (bootstrap_server, bootstrap_ca) = from_bootstrap()?;
            (
                server.clone().unwrap_or(bootstrap_server),
                ca_file
                    .as_ref()
                    .map_or(bootstrap_ca, |f| ("certificate-authority", f.display().to_string())),
            )
        }
    };
    Ok(Endpoint { server, ca })
}

/// `kubeconfig`: a kubelet kubeconfig whose user runs this plugin with `exec`'s flags, printed
/// or written to `--output`.
pub fn kubeconfig(args: &KubeconfigArgs, exec: &ExecArgs) -> Result<String> {
    if let Some(path) = args.output.as_deref().filter(|p| args.keep_existing && p.exists()) {
        eprintln!("kubelet-authenticator: {} exists; kept as it is", path.display());
        return Ok(String::new());
    }
    if let Some(path) = args.output.as_deref().filter(|p| args.adopt && p.exists()) {
        return adopt(path, args, exec).map(|()| String::new());
    }
    let text = render_kubeconfig(args, exec, None)?;
    match &args.output {
        Some(path) => {
            crate::secret_file::write_private(path, text.as_bytes())?;
            eprintln!("kubelet-authenticator: wrote {}", path.display());
            Ok(String::new())
        }
        None => Ok(text),
    }
}

/// `kubeconfig --adopt` over an existing `path` ([`crate::adopt`]).
fn adopt(path: &std::path::Path, args: &KubeconfigArgs, exec: &ExecArgs) -> Result<()> {
    use crate::adopt::{Existing, install, keep_original, read_existing};
    // A refusal never stops kubelet's start: said, recorded for `status` when the cert dir
    // opens, exit status 0.
    let refuse = |why: String| {
        let message = format!(
            "adoption of {} refused: {why}; kubelet keeps it as it is",
            path.display()
        );
        eprintln!("kubelet-authenticator: {message}");
        if let Ok(dir) = crate::cert_dir::CertDir::open(&exec.cert_dir) {
            dir.record_error(&message, time::OffsetDateTime::now_utc());
        }
    };
    let (cert_pem, key_pem, endpoint) = match read_existing(path) {
        Ok(Existing::Plugin) => {
            eprintln!(
                "kubelet-authenticator: {} is already the plugin's; kept as it is",
                path.display()
            );
            return Ok(());
        }
        Ok(Existing::PluginWithCertificate { endpoint }) => {
            let text = render_kubeconfig(args, exec, endpoint)?;
            crate::secret_file::write_private(path, text.as_bytes())?;
            eprintln!(
                "kubelet-authenticator: {} named a client certificate beside the plugin (kubeadm's kubelet-finalize); rendered again without it",
                path.display()
            );
            return Ok(());
        }
        Ok(Existing::Other {
            cert_pem,
            key_pem,
            endpoint,
        }) => (cert_pem, key_pem, endpoint),
        Err(why) => {
            refuse(why);
            return Ok(());
        }
    };
    // Only a certificate to take over needs the node's name and the cert dir.
    let node = match exec.node() {
        Ok(node) => node,
        Err(e) => {
            refuse(crate::error_chain::Chain(&e).to_string());
            return Ok(());
        }
    };
    let dir = crate::cert_dir::CertDir::open(&exec.cert_dir)?;
    let _lock = dir.lock()?;
    if let Err(why) = install(&dir, &node, &cert_pem, &key_pem, time::OffsetDateTime::now_utc()) {
        refuse(why);
        return Ok(());
    }
    let text = render_kubeconfig(args, exec, endpoint)?;
    keep_original(path)?;
    crate::secret_file::write_private(path, text.as_bytes())?;
    eprintln!(
        "kubelet-authenticator: adopted {}: its certificate is the current credential until the signer's arrives; the original is kept as {}{}",
        path.display(),
        path.display(),
        crate::adopt::KEPT_SUFFIX
    );
    Ok(())
}

fn render_kubeconfig(
    args: &KubeconfigArgs,
    exec: &ExecArgs,
    fallback: Option<(String, (&'static str, String))>,
) -> Result<String> {
    let endpoint = endpoint_or(args, exec, fallback)?;
    let mut plugin_args: Vec<String> = vec![
        "--bootstrap-kubeconfig".into(),
        exec.bootstrap_kubeconfig.display().to_string(),
        "--cert-dir".into(),
        exec.cert_dir.display().to_string(),
        "--attestor".into(),
        clap::ValueEnum::to_possible_value(&exec.attestor)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default(),
    ];
    let mut push = |flag: &str, value: Option<String>| {
        if let Some(v) = value {
            plugin_args.push(flag.to_owned());
            plugin_args.push(v);
        }
    };
    push("--node-name", exec.node_name.clone());
    push("--provider-id", exec.provider_id.clone());
    push(
        "--provider-id-file",
        exec.provider_id_file.as_ref().map(|p| p.display().to_string()),
    );
    push("--signer-name", exec.signer_name.clone());
    // The TPM's flags go with the tpm attestor, and with any other when they were changed (so
    // what was asked for is what the kubeconfig runs).
    let tpm = exec.attestor == crate::csr::AttestorName::Tpm;
    push(
        "--tpm-tcti",
        (tpm || exec.tpm.tpm_tcti != crate::csr::DEFAULT_TCTI).then(|| exec.tpm.tpm_tcti.clone()),
    );
    push(
        "--tpm-ek",
        (tpm || exec.tpm.tpm_ek != crate::csr::EkKind::Rsa2048)
            .then(|| clap::ValueEnum::to_possible_value(&exec.tpm.tpm_ek))
            .flatten()
            .map(|v| v.get_name().to_owned()),
    );
    push(
        "--tpm-event-log",
        exec.tpm.tpm_event_log.as_ref().map(|p| p.display().to_string()),
    );
    push("--timeout", Some(humantime::format_duration(exec.timeout).to_string()));
    // Only when changed: the kubeconfigs rendered before the flag existed stay the same.
    push(
        "--renewal-timeout",
        (exec.renewal_timeout != crate::exec::DEFAULT_RENEWAL_TIMEOUT)
            .then(|| humantime::format_duration(exec.renewal_timeout).to_string()),
    );
    push(
        "--requested-duration",
        exec.requested_duration
            .map(|d| humantime::format_duration(d).to_string()),
    );
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": {
            "server": endpoint.server,
            endpoint.ca.0: endpoint.ca.1}}],
        // provideClusterInfo: renewals find the apiserver in KUBERNETES_EXEC_INFO, so they
        // keep working once `kubeadm join` has deleted the bootstrap kubeconfig.
        "users": [{"name": "kubelet", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": args.command.display().to_string(),
            "args": plugin_args,
            "interactiveMode": "Never",
            "provideClusterInfo": true}}}],
        "contexts": [{"name": "default", "context": {"cluster": "default-cluster", "user": "kubelet"}}],
        "current-context": "default",
    });
    serde_yaml::to_string(&config).context("cannot render the kubeconfig")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Both {
        #[command(flatten)]
        exec: ExecArgs,
        #[command(flatten)]
        kubeconfig: KubeconfigArgs,
    }

    #[test]
    fn the_kubeconfig_runs_the_plugin_with_the_node_flags() {
        let both = Both::parse_from([
            "x",
            "--server",
            "https://10.0.0.1:6443",
            "--ca-file",
            "/etc/kubernetes/pki/ca.crt",
            "--attestor",
            "insecure",
            "--provider-id-file",
            "/etc/kubernetes/provider-id",
        ]);
        let text = kubeconfig(&both.kubeconfig, &both.exec).unwrap();
        let parsed: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        let exec = &parsed["users"][0]["user"]["exec"];
        assert_eq!(exec["command"], "/usr/local/bin/kubelet-authenticator");
        assert_eq!(exec["apiVersion"], "client.authentication.k8s.io/v1");
        let args: Vec<&str> = exec["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert_eq!(
            args,
            [
                "--bootstrap-kubeconfig",
                "/etc/kubernetes/bootstrap-kubelet.conf",
                "--cert-dir",
                "/var/lib/kubelet/pki",
                "--attestor",
                "insecure",
                "--provider-id-file",
                "/etc/kubernetes/provider-id",
                "--timeout",
                "15m"
            ]
        );
        assert_eq!(parsed["clusters"][0]["cluster"]["server"], "https://10.0.0.1:6443");
    }

    /// Every flag of exec mode, found through clap, is set away from its default (another of
    /// its possible values, or a distinct `<n>m`, which parses as a path, a name and a duration
    /// alike); the kubeconfig is rendered and its `args` parsed back must be the same
    /// `ExecArgs`. Flags that conflict go in separate rounds. A flag the kubeconfig forgets to
    /// copy fails here.
    #[test]
    fn every_exec_flag_set_away_from_its_default_survives_the_rendered_kubeconfig() {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            exec: ExecArgs,
        }
        let command = <Wrapper as clap::CommandFactory>::command();
        let mut rounds: Vec<Vec<&clap::Arg>> = Vec::new();
        // Declared on one side only (`provider_id` conflicts with `provider_id_file`): both asked.
        let conflict = |a: &clap::Arg, b: &clap::Arg| {
            let names = |x: &clap::Arg, y: &clap::Arg| {
                command
                    .get_arg_conflicts_with(x)
                    .iter()
                    .any(|c| c.get_id() == y.get_id())
            };
            names(a, b) || names(b, a)
        };
        for arg in command.get_arguments() {
            let fits = |round: &Vec<&clap::Arg>| round.iter().all(|other| !conflict(arg, other));
            match rounds.iter_mut().find(|round| fits(round)) {
                Some(round) => round.push(arg),
                None => rounds.push(vec![arg]),
            }
        }
        let mut distinct = 20..;
        let mut covered = 0;
        for round in &rounds {
            let mut argv: Vec<Vec<String>> = Vec::new();
            for arg in round {
                let long = arg
                    .get_long()
                    .unwrap_or_else(|| panic!("{}: exec mode takes only long flags", arg.get_id()));
                let mut tokens = vec![format!("--{long}")];
                if arg.get_action().takes_values() {
                    let defaults = arg.get_default_values();
                    let other = arg
                        .get_possible_values()
                        .into_iter()
                        .map(|v| v.get_name().to_owned())
                        .find(|v| defaults.iter().all(|d| d != v.as_str()));
                    tokens.push(other.unwrap_or_else(|| format!("{}m", distinct.next().unwrap_or_default())));
                }
                argv.push(tokens);
            }
            let parse = |flags: &[Vec<String>]| {
                let argv = std::iter::once("x".to_owned()).chain(flags.iter().flatten().cloned());
                Wrapper::try_parse_from(argv).map(|w| w.exec)
            };
            let input = parse(&argv).unwrap();
            for (i, tokens) in argv.iter().enumerate() {
                let mut without = argv.clone();
                without.remove(i);
                assert_ne!(
                    parse(&without).unwrap(),
                    input,
                    "{tokens:?} is set away from its default"
                );
            }
            covered += argv.len();

            let args = KubeconfigArgs {
                server: Some("https://10.0.0.1:6443".into()),
                ca_file: Some("/etc/kubernetes/pki/ca.crt".into()),
                command: "/usr/local/bin/kubelet-authenticator".into(),
                output: None,
                keep_existing: false,
                adopt: false,
            };
            let text = kubeconfig(&args, &input).unwrap();
            let parsed: serde_json::Value = serde_yaml::from_str(&text).unwrap();
            let rendered: Vec<String> = parsed["users"][0]["user"]["exec"]["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect();
            let back = Wrapper::try_parse_from(std::iter::once("x".to_owned()).chain(rendered.iter().cloned()))
                .unwrap_or_else(|e| panic!("{rendered:?} does not parse: {e}"))
                .exec;
            assert_eq!(back, input, "{argv:?} rendered as {rendered:?}");
        }
        assert_eq!(covered, command.get_arguments().count(), "every flag was tried");
        assert!(
            covered >= 11,
            "clap's introspection sees the flattened flags ({covered})"
        );
    }

    #[test]
    fn without_server_the_kubeconfig_takes_the_bootstrap_kubeconfigs_cluster_and_asks_for_cluster_info() {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = dir.path().join("bootstrap-kubelet.conf");
        std::fs::write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: UEVN\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        )
        .unwrap();
        let both = Both::parse_from([
            "x",
            "--bootstrap-kubeconfig",
            bootstrap.to_str().unwrap(),
            "--attestor",
            "insecure",
        ]);
        let parsed: serde_json::Value =
            serde_yaml::from_str(&kubeconfig(&both.kubeconfig, &both.exec).unwrap()).unwrap();
        let cluster = &parsed["clusters"][0]["cluster"];
        assert_eq!(cluster["server"], "https://10.0.0.1:6443");
        assert_eq!(cluster["certificate-authority-data"], "UEVN");
        assert_eq!(parsed["users"][0]["user"]["exec"]["provideClusterInfo"], true);
        assert!(
            !serde_yaml::to_string(&parsed).unwrap().contains("abcdef"),
            "the bootstrap token never reaches kubelet's kubeconfig"
        );

        // --output writes 0600; --keep-existing leaves what is there.
        let out = dir.path().join("kubelet.conf");
        let write = |keep: bool| {
            let mut argv = vec![
                "x",
                "--bootstrap-kubeconfig",
                bootstrap.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
            ];
            if keep {
                argv.push("--keep-existing");
            }
            let both = Both::parse_from(argv);
            kubeconfig(&both.kubeconfig, &both.exec).unwrap()
        };
        assert_eq!(write(true), "");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&out, "kept").unwrap();
        write(true);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "kept");
        write(false);
        assert_ne!(std::fs::read_to_string(&out).unwrap(), "kept");

        std::fs::remove_file(&bootstrap).unwrap();
        let both = Both::parse_from(["x", "--bootstrap-kubeconfig", bootstrap.to_str().unwrap()]);
        assert!(
            kubeconfig(&both.kubeconfig, &both.exec).is_err(),
            "no --server and no bootstrap kubeconfig"
        );
    }

    /// A node certificate for `cn` and its key, as kubeadm issues them (no provider-ID
    /// extension), valid for an hour.
    fn kubeadm_certificate(cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn kubeadm_kubelet_conf(cert: &str, key: &str) -> String {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: system:node:cp-0@kubernetes\nclusters:\n- name: kubernetes\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: UEVN\ncontexts:\n- name: system:node:cp-0@kubernetes\n  context:\n    cluster: kubernetes\n    user: system:node:cp-0\nusers:\n- name: system:node:cp-0\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert),
            b64(key)
        )
    }

    #[test]
    fn adopt_takes_kubeadms_kubelet_conf_over_and_refuses_another_nodes_without_touching_it() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let out = dir.path().join("kubelet.conf");
        let adopt = || {
            let both = Both::parse_from([
                "x",
                "--bootstrap-kubeconfig",
                dir.path().join("absent.conf").to_str().unwrap(),
                "--cert-dir",
                pki.to_str().unwrap(),
                "--node-name",
                "cp-0",
                "--provider-id",
                "aws:///us-east-1a/i-0abc",
                "--attestor",
                "insecure",
                "--output",
                out.to_str().unwrap(),
                "--adopt",
            ]);
            kubeconfig(&both.kubeconfig, &both.exec).unwrap()
        };

        // Another node's certificate: nothing changes, the reason is kept for `status`.
        let (other_cert, other_key) = kubeadm_certificate("system:node:cp-9");
        let other = kubeadm_kubelet_conf(&other_cert, &other_key);
        std::fs::write(&out, &other).unwrap();
        adopt();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            other,
            "kubelet keeps what it had"
        );
        let dir_state = crate::cert_dir::CertDir::existing(&pki);
        assert!(
            dir_state.last_error().unwrap().contains("adoption of"),
            "{:?}",
            dir_state.last_error()
        );

        // kubeadm's own: its certificate becomes the current credential, recorded as adopted;
        // the file becomes the plugin's, with kubeadm's apiserver; the original is kept.
        let (cert, key) = kubeadm_certificate("system:node:cp-0");
        let original = kubeadm_kubelet_conf(&cert, &key);
        std::fs::write(&out, &original).unwrap();
        adopt();
        let node = attestation::identity::NodeName::new("cp-0").unwrap();
        let pid = attestation::identity::ProviderId::new("aws:///us-east-1a/i-0abc").unwrap();
        match dir_state.current(&node, Some(&pid), time::OffsetDateTime::now_utc()) {
            crate::cert_dir::Cached::Foreign(credential, why) => {
                assert_eq!(why, crate::cert_dir::NotObtained::Adopted);
                assert!(credential.cert_pem.contains(cert.lines().nth(1).unwrap()));
            }
            other => panic!("the adopted certificate is current: {other:?}"),
        }
        let rendered: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(rendered["clusters"][0]["cluster"]["server"], "https://10.0.0.1:6443");
        assert_eq!(rendered["clusters"][0]["cluster"]["certificate-authority-data"], "UEVN");
        assert!(rendered["users"][0]["user"]["exec"]["command"].is_string());
        assert!(!std::fs::read_to_string(&out).unwrap().contains("client-key-data"));
        let kept = dir.path().join("kubelet.conf.pre-adoption");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), original);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);

        // The next start keeps the plugin's kubeconfig; kubeadm's kubelet-finalize adding the
        // rotatable certificate beside the exec user is rendered away.
        let plugin = std::fs::read_to_string(&out).unwrap();
        adopt();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), plugin);
        let finalized = plugin.replace(
            "    exec:",
            "    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n    exec:",
        );
        assert_ne!(finalized, plugin);
        std::fs::write(&out, &finalized).unwrap();
        adopt();
        assert!(!std::fs::read_to_string(&out).unwrap().contains("client-certificate"));
    }

    #[test]
    fn words_a_shell_would_split_or_expand_are_quoted() {
        assert_eq!(shell_word("aws:///us-east-1a/i-0abc"), "aws:///us-east-1a/i-0abc");
        assert_eq!(shell_word("gce://p/z/worker-0"), "gce://p/z/worker-0");
        assert_eq!(shell_word("node-csr-abc"), "node-csr-abc");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("$(reboot)"), "'$(reboot)'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
