//! `kubeconfig --adopt` (SPEC section 6): takes kubelet's identity over from a
//! kubeconfig the plugin did not write. On the first control-plane node `kubeadm init` writes
//! kubelet's kubeconfig with a certificate it issued from the cluster CA; on a node that joined
//! before its Cluster opted in, kubelet's own TLS bootstrap did. Either way:
//!
//! 1. the certificate and key that kubeconfig names (embedded, or files) go into the cert dir
//!    as its current credential, recorded as adopted (never as one the plugin obtained), unless
//!    the cert dir already holds them;
//! 2. the original kubeconfig is kept beside it (`<file>.pre-adoption`, 0600);
//! 3. the kubeconfig becomes the plugin's (apiserver and CA from the flags, else the bootstrap
//!    kubeconfig, else the adopted kubeconfig itself).
//!
//! The plugin's next call then renews with that certificate as the node's identity: its CSR,
//! filed as `system:node:<name>` and carrying the node's attestation, is an adoption for the
//! signer (rule 7). kubeadm's certificate stays the current credential until the signer's
//! arrives, so a refused adoption leaves kubelet working. When the credential cannot be taken
//! over (no certificate in the kubeconfig, one for another node, an expired one), nothing is
//! changed: kubelet keeps what it had, and the reason goes to stderr and to `status`.

use std::path::Path;

use anyhow::{Context, Result};
use attestation::identity::NodeName;
use base64::Engine as _;
use serde_json::Value;
use time::OffsetDateTime;
use zeroize::Zeroizing;

use crate::cert_dir::CertDir;

/// The suffix of the kept original kubeconfig.
pub const KEPT_SUFFIX: &str = ".pre-adoption";

/// What the existing kubeconfig is.
#[derive(Debug)]
pub enum Existing {
    /// Already the plugin's (its user runs a kubelet-authenticator): kept as it is.
    Plugin,
    /// The plugin's, with a client certificate added beside its exec user: what kubeadm's
    /// `kubelet-finalize` phase does at the end of `kubeadm init` (it points the current user at
    /// `kubelet-client-current.pem` and restarts kubelet). Rendered again, without it, so
    /// kubelet keeps calling the plugin.
    PluginWithCertificate {
        /// `server` and the CA.
        endpoint: Option<(String, (&'static str, String))>,
    },
    /// Another kubeconfig, with the client credential it names and its apiserver.
    Other {
        /// Certificate PEM.
        cert_pem: String,
        /// Key PEM.
        key_pem: Zeroizing<String>,
        /// `server` and the CA (`certificate-authority-data` or `certificate-authority`).
        endpoint: Option<(String, (&'static str, String))>,
    },
}

/// Reads the kubeconfig at `path` (its current context). `Err` says why its identity cannot be
/// taken over.
pub fn read_existing(path: &Path) -> Result<Existing, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value: Value =
        serde_yaml::from_str(&text).map_err(|e| format!("{} is not a kubeconfig: {e}", path.display()))?;
    let named = |list: &str, name: &str| -> Option<Value> {
        value
            .get(list)?
            .as_array()?
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some(name))
            .cloned()
    };
    let context_name = value
        .get("current-context")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{} has no current-context", path.display()))?;
    let context = named("contexts", context_name)
        .and_then(|c| c.get("context").cloned())
        .ok_or_else(|| format!("{}: no context {context_name:?}", path.display()))?;
    let user_name = context.get("user").and_then(Value::as_str).unwrap_or_default();
    let user = named("users", user_name)
        .and_then(|u| u.get("user").cloned())
        .ok_or_else(|| format!("{}: no user {user_name:?}", path.display()))?;
    let relative = |file: &str| -> std::path::PathBuf {
        let file = Path::new(file);
        if file.is_absolute() {
            file.to_owned()
        } else {
            path.parent().unwrap_or(Path::new("/")).join(file)
        }
    };
    let cluster_name = context.get("cluster").and_then(Value::as_str).unwrap_or_default();
    let endpoint = named("clusters", cluster_name)
        .and_then(|c| c.get("cluster").cloned())
        .and_then(|c| {
            let server = c.get("server")?.as_str()?.to_owned();
            let ca = match (
                c.get("certificate-authority-data").and_then(Value::as_str),
                c.get("certificate-authority").and_then(Value::as_str),
            ) {
                (Some(data), _) => ("certificate-authority-data", data.to_owned()),
                (None, Some(file)) => ("certificate-authority", relative(file).display().to_string()),
                (None, None) => return None,
            };
            Some((server, ca))
        });
    if let Some(command) = user.pointer("/exec/command").and_then(Value::as_str) {
        return if Path::new(command)
            .file_name()
            .is_some_and(|n| n == "kubelet-authenticator")
        {
            let certificate = [
                "client-certificate",
                "client-certificate-data",
                "client-key",
                "client-key-data",
            ]
            .iter()
            .any(|k| user.get(*k).is_some_and(|v| !v.is_null() && v.as_str() != Some("")));
            Ok(if certificate {
                Existing::PluginWithCertificate { endpoint }
            } else {
                Existing::Plugin
            })
        } else {
            Err(format!(
                "{}: its user runs {command:?}, not a client certificate: nothing to adopt",
                path.display()
            ))
        };
    }
    let material = |data_key: &str, file_key: &str| -> Result<Zeroizing<String>, String> {
        if let Some(data) = user.get(data_key).and_then(Value::as_str) {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| format!("{}: {data_key} is not base64: {e}", path.display()))?;
            return String::from_utf8(bytes)
                .map(Zeroizing::new)
                .map_err(|_| format!("{}: {data_key} is not PEM", path.display()));
        }
        if let Some(file) = user.get(file_key).and_then(Value::as_str) {
            let file = relative(file);
            return std::fs::read_to_string(&file)
                .map(Zeroizing::new)
                .map_err(|e| format!("cannot read {} ({file_key} of {}): {e}", file.display(), path.display()));
        }
        Err(format!(
            "{}: its user names no client certificate ({data_key} or {file_key}): nothing to adopt",
            path.display()
        ))
    };
    let cert_pem = material("client-certificate-data", "client-certificate")?;
    let key_pem = material("client-key-data", "client-key")?;
    Ok(Existing::Other {
        cert_pem: cert_pem.to_string(),
        key_pem,
        endpoint,
    })
}

/// Puts the adopted credential into the cert dir (unless it already holds it), after checking
/// it is a valid certificate for `node` with its key. `Err` says why it cannot be adopted.
pub fn install(
    dir: &CertDir,
    node: &NodeName,
    cert_pem: &str,
    key_pem: &str,
    now: OffsetDateTime,
) -> Result<(), String> {
    // kubelet's own bootstrap names one file (certificate and key) for both.
    let blocks = |text: &str, wanted: fn(&str) -> bool| -> Result<Zeroizing<String>, String> {
        let parsed = pem::parse_many(text.as_bytes()).map_err(|e| format!("not PEM: {e}"))?;
        Ok(Zeroizing::new(
            parsed
                .iter()
                .filter(|b| wanted(b.tag()))
                .map(pem::encode)
                .collect::<Vec<_>>()
                .concat(),
        ))
    };
    let cert_pem = blocks(cert_pem, |tag| tag == "CERTIFICATE")?;
    let key_pem = blocks(key_pem, |tag| tag.ends_with("PRIVATE KEY"))?;
    let (cert_pem, key_pem) = (cert_pem.as_str(), key_pem.as_str());
    let contents = Zeroizing::new(format!("{}\n{}\n", cert_pem.trim_end(), key_pem.trim_end()));
    crate::cert_dir::check(&contents, node, None, now)
        .map_err(|why| format!("the certificate to adopt is not usable for node {node}: {why}"))?;
    dir.adopt(cert_pem, key_pem, now)
        .map_err(|e| crate::error_chain::Chain(&e).to_string())
}

/// Keeps the original kubeconfig beside it (`<file>.pre-adoption`, 0600), once.
pub fn keep_original(path: &Path) -> Result<()> {
    let kept = std::path::PathBuf::from(format!("{}{KEPT_SUFFIX}", path.display()));
    if kept.exists() {
        return Ok(());
    }
    let bytes = Zeroizing::new(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?);
    crate::secret_file::write_private(&kept, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn kubeadms_embedded_and_file_credentials_are_read_and_the_plugins_own_is_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let embedded = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: system:node:cp-0@kubernetes\nclusters:\n- name: kubernetes\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: system:node:cp-0@kubernetes\n  context:\n    cluster: kubernetes\n    user: system:node:cp-0\nusers:\n- name: system:node:cp-0\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64("CERT"),
            b64("KEY")
        );
        let Existing::Other {
            cert_pem,
            key_pem,
            endpoint,
        } = read_existing(&write(dir.path(), "kubelet.conf", &embedded)).unwrap()
        else {
            panic!("kubeadm's kubeconfig is another's")
        };
        assert_eq!((cert_pem.as_str(), key_pem.as_str()), ("CERT", "KEY"));
        assert_eq!(
            endpoint,
            Some((
                "https://10.0.0.1:6443".to_owned(),
                ("certificate-authority-data", "Q0E=".to_owned())
            ))
        );

        write(dir.path(), "client.pem", "CERT AND KEY");
        let files = "apiVersion: v1\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://s\n    certificate-authority: pki/ca.crt\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n    client-certificate: client.pem\n    client-key: client.pem\n";
        let Existing::Other { cert_pem, endpoint, .. } =
            read_existing(&write(dir.path(), "files.conf", files)).unwrap()
        else {
            panic!()
        };
        assert_eq!(cert_pem, "CERT AND KEY");
        assert_eq!(
            endpoint.unwrap().1.1,
            dir.path().join("pki/ca.crt").display().to_string(),
            "relative paths are the kubeconfig's"
        );

        let plugin = "apiVersion: v1\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n    exec:\n      command: /usr/local/bin/kubelet-authenticator\n";
        assert!(matches!(
            read_existing(&write(dir.path(), "plugin.conf", plugin)),
            Ok(Existing::Plugin)
        ));
        // kubeadm's kubelet-finalize adds the rotatable certificate to the current user.
        let finalized = format!(
            "{plugin}    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n"
        );
        assert!(matches!(
            read_existing(&write(dir.path(), "finalized.conf", &finalized)),
            Ok(Existing::PluginWithCertificate { .. })
        ));

        let token = "apiVersion: v1\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n    token: abc\n";
        let why = read_existing(&write(dir.path(), "token.conf", token)).unwrap_err();
        assert!(why.contains("names no client certificate"), "{why}");
        assert!(read_existing(&write(dir.path(), "junk.conf", ": : :")).is_err());
        assert!(read_existing(&dir.path().join("missing")).is_err());
    }
}
