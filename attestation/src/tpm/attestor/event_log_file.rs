//! Where the node finds the TCG event log it sends with phase 1 (SPEC section 5, revision 5):
//! the log the firmware and boot loaders measured into the PCRs, which the signer replays
//! against the quote to judge a boot policy.
//!
//! The kernel's copy is optional: without a boot policy the signer needs no log, and many
//! nodes (no measured boot, a container without securityfs, a TPM that is not `tpm0`) have
//! none, so its absence is a debug line, and one over the size limit a warning: neither stops a
//! join. A path the operator names must be read, and within the limit.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where Linux exposes the firmware's event log (securityfs).
pub const KERNEL_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The largest log sent: the DATA block carries it in base64, and the signer caps the request.
/// Real UEFI logs are 20-100 KiB; a bigger file is not a measured-boot log worth trusting.
pub const MAX_EVENT_LOG: usize = 256 * 1024;

/// Which event log the node sends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EventLogSource {
    /// [`KERNEL_EVENT_LOG`] when it can be read, otherwise none.
    #[default]
    Kernel,
    /// This file, which must be read.
    File(PathBuf),
    /// None (tests, and TPMs whose PCRs no log explains).
    None,
}

/// Why the named log is not sent.
#[derive(Debug, thiserror::Error)]
pub enum EventLogFileError {
    /// The file could not be opened or read.
    #[error("cannot read the TPM event log {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is over [`MAX_EVENT_LOG`].
    #[error("the TPM event log {path} has {size} bytes, over the {MAX_EVENT_LOG}-byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
}

impl EventLogSource {
    /// The source's bytes: `Ok(None)` when there is nothing to send (no source, or the
    /// kernel's log is absent or unreadable).
    pub fn read(&self) -> Result<Option<Vec<u8>>, EventLogFileError> {
        match self {
            Self::None => Ok(None),
            Self::File(path) => read_capped(path).map(Some),
            Self::Kernel => {
                let path = Path::new(KERNEL_EVENT_LOG);
                match read_capped(path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(EventLogFileError::Unreadable { source, .. }) => {
                        tracing::debug!(
                            path = KERNEL_EVENT_LOG,
                            error = %source,
                            "no TPM event log sent: the kernel's cannot be read (a Cluster with a boot policy will refuse this node)"
                        );
                        Ok(None)
                    }
                    // Not the node's choice, and a Cluster without a boot policy needs no
                    // log: the join goes on without one, and only a Cluster with a policy
                    // refuses it (saying the log is missing).
                    Err(too_large) => {
                        tracing::warn!(
                            error = %too_large,
                            "no TPM event log sent: the kernel's is over the limit (a Cluster with a boot policy will refuse this node)"
                        );
                        Ok(None)
                    }
                }
            }
        }
    }
}

/// The file's bytes, at most [`MAX_EVENT_LOG`]. securityfs files report a size of zero, so the
/// size is counted by reading, never taken from metadata.
fn read_capped(path: &Path) -> Result<Vec<u8>, EventLogFileError> {
    let unreadable = |source| EventLogFileError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    let cap = MAX_EVENT_LOG as u64 + 1;
    (&mut file).take(cap).read_to_end(&mut bytes).map_err(unreadable)?;
    if bytes.len() > MAX_EVENT_LOG {
        let rest = std::io::copy(&mut file, &mut std::io::sink()).map_err(unreadable)?;
        return Err(EventLogFileError::TooLarge {
            path: path.to_owned(),
            size: cap + rest,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_file_is_read_whole_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, vec![7u8; MAX_EVENT_LOG]).unwrap();
        let read = EventLogSource::File(path.clone()).read().unwrap().unwrap();
        assert_eq!(read.len(), MAX_EVENT_LOG);
        std::fs::write(&path, b"").unwrap();
        assert_eq!(EventLogSource::File(path).read().unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_named_file_over_the_limit_is_refused_naming_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![0u8; MAX_EVENT_LOG + 4097]).unwrap();
        let error = EventLogSource::File(path.clone()).read().unwrap_err();
        assert!(
            matches!(error, EventLogFileError::TooLarge { size, .. } if size == MAX_EVENT_LOG as u64 + 4097),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("266241 bytes"),
            "{text}"
        );
    }

    #[test]
    fn a_named_file_that_cannot_be_read_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let error = EventLogSource::File(path.clone()).read().unwrap_err();
        assert!(matches!(error, EventLogFileError::Unreadable { .. }), "{error:?}");
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
        // A folder opens but does not read.
        let error = EventLogSource::File(dir.path().to_owned()).read().unwrap_err();
        assert!(matches!(error, EventLogFileError::Unreadable { .. }), "{error:?}");
    }

    #[test]
    fn no_source_sends_nothing_and_the_kernels_log_is_optional() {
        assert_eq!(EventLogSource::None.read().unwrap(), None);
        // Wherever the tests run, the kernel's log is read or quietly absent, never an error
        // (unless it is over the limit, which no real log is).
        assert!(EventLogSource::Kernel.read().is_ok());
    }
}
