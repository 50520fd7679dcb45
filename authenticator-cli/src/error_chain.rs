//! How an error is printed where a person reads it (stderr, and the last-error file `status`
//! shows): the context chain joined by `: `, each cause once.
//!
//! The rule for this crate's own errors is that a type either prints its cause in `Display` or
//! returns it from `source()`, never both. Some dependencies do both (kube's
//! `KubeconfigError::LoadCertificateAuthority` wraps `LoadDataError::ReadFile`, which wraps the
//! `io::Error`, each printing the next), so anyhow's `{:#}` would say "No such file or
//! directory" three times. [`Chain`] leaves out a cause whose text the cause printed before it
//! already contains: whatever a dependency does, the cause appears once.

use std::fmt;

/// `error` and its causes, each said once (see the module documentation).
pub struct Chain<'a>(pub &'a anyhow::Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut printed: Option<String> = None;
        for cause in self.0.chain() {
            let text = cause.to_string();
            if let Some(before) = &printed {
                if before.contains(text.as_str()) {
                    continue;
                }
                f.write_str(": ")?;
            }
            f.write_str(&text)?;
            printed = Some(text);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    /// A dependency's error that prints its cause and also returns it from `source()`.
    #[derive(Debug, thiserror::Error)]
    #[error("failed to read file '{1:?}': {0}")]
    struct Both(#[source] std::io::Error, std::path::PathBuf);

    /// One that wraps it the same way (kube's `LoadCertificateAuthority(LoadDataError)`).
    #[derive(Debug, thiserror::Error)]
    #[error("failed to load certificate authority: {0}")]
    struct Outer(#[source] Both);

    fn not_found() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::NotFound)
    }

    #[test]
    fn a_cause_a_dependency_prints_and_returns_as_source_is_said_once() {
        let error = anyhow::Error::new(Outer(Both(not_found(), "/etc/ca.crt".into())))
            .context("bootstrap kubeconfig /etc/kubernetes/bootstrap-kubelet.conf");
        let text = Chain(&error).to_string();
        assert_eq!(text.matches(&not_found().to_string()).count(), 1, "{text}");
        assert_eq!(text.matches("failed to read file").count(), 1, "{text}");
        assert!(
            text.starts_with("bootstrap kubeconfig /etc/kubernetes/bootstrap-kubelet.conf: failed to load"),
            "{text}"
        );
        assert!(
            format!("{error:#}").matches(&not_found().to_string()).count() > 1,
            "anyhow's own rendering repeats it (why Chain exists)"
        );
    }

    #[test]
    fn a_chain_of_distinct_causes_is_printed_whole() {
        let error = Err::<(), _>(not_found())
            .context("cannot read /x")
            .context("filing the CSR")
            .unwrap_err();
        assert_eq!(
            Chain(&error).to_string(),
            format!("filing the CSR: cannot read /x: {}", not_found())
        );
        let single = anyhow::anyhow!("plain");
        assert_eq!(Chain(&single).to_string(), "plain");
    }
}
