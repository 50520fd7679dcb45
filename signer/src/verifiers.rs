//! The verifiers a signer runs with, assembled from the flags: `insecure/v1`, `tpm/v1` (its EK
//! trust and challenge key), `gcp/v1` and `aws/v1` (their caches of Google's keys and STS's
//! answers). `run` and `check` build them here alike, so an offline decision is the
//! controller's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use attestation::attestor::Verifiers;
use attestation::aws::CallerIdentity;
use attestation::gcp::GoogleKeys;
use attestation::tpm::challenge_key::ChallengeKey;

use crate::cloud::CloudArgs;

/// The `tpm/v1` flags.
#[derive(Debug, Clone, Copy)]
pub struct TpmSettings<'a> {
    /// `--tpm-ek-ca-bundle`: a PEM file or a folder of them.
    pub ek_ca_bundle: Option<&'a Path>,
    /// `--tpm-trust-on-first-use`.
    pub trust_on_first_use: bool,
    /// `--tpm-challenge-ttl`.
    pub challenge_ttl: std::time::Duration,
}

/// The `tpm/v1` flags of `check` and `explain` (`run` reads the same from its environment too).
#[derive(Debug, Clone, clap::Args)]
pub struct TpmFlags {
    /// `tpm/v1`: EK CA bundle (a PEM file or a folder of them), as the signer's flag.
    #[arg(long)]
    pub tpm_ek_ca_bundle: Option<PathBuf>,
    /// `tpm/v1`: trust an unpinned, unchained EK for an unclaimed Machine, as the signer's flag.
    #[arg(long)]
    pub tpm_trust_on_first_use: bool,
    /// `tpm/v1`: how long a challenge may go unanswered, as the signer's flag.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub tpm_challenge_ttl: std::time::Duration,
}

impl TpmFlags {
    /// As [`all`] takes them.
    pub fn settings(&self) -> TpmSettings<'_> {
        TpmSettings {
            ek_ca_bundle: self.tpm_ek_ca_bundle.as_deref(),
            trust_on_first_use: self.tpm_trust_on_first_use,
            challenge_ttl: self.tpm_challenge_ttl,
        }
    }
}

/// Every verifier: `tpm/v1` deriving its challenges under `challenge_key` (loaded now, or later
/// by the controller's loader), the cloud providers finding Google's keys in `google` and STS's
/// answers in `sts`.
pub fn all(
    challenge_key: ChallengeKey,
    tpm: &TpmSettings<'_>,
    cloud: &CloudArgs,
    google: Arc<dyn GoogleKeys>,
    sts: Arc<dyn CallerIdentity>,
) -> Result<Verifiers> {
    let mut tpm_verifier = attestation::tpm::TpmVerifier::with_challenge_key(challenge_key)
        .with_trust_on_first_use(tpm.trust_on_first_use)
        .with_challenge_ttl(time::Duration::try_from(tpm.challenge_ttl).context("--tpm-challenge-ttl is too large")?);
    if let Some(path) = tpm.ek_ca_bundle {
        let pem = read_bundle(path).with_context(|| format!("cannot read --tpm-ek-ca-bundle {}", path.display()))?;
        let trust = attestation::tpm::ek::EkTrust::from_pem(&pem)
            .map_err(|e| anyhow::anyhow!("--tpm-ek-ca-bundle {}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), anchors = trust.len(), "read the EK CA bundle");
        tpm_verifier = tpm_verifier.with_ek_trust(trust);
    }
    let max_age = cloud.max_age()?;
    Ok(Verifiers::new()
        .with(attestation::insecure::InsecureVerifier)
        .with(tpm_verifier)
        .with(attestation::gcp::GcpVerifier::new(google).with_max_age(max_age))
        .with(
            attestation::aws::AwsVerifier::new(sts)
                .with_certificates(cloud.region_certificates()?)
                .with_endpoints(cloud.sts_endpoints()?)
                .with_max_age(max_age),
        ))
}

/// `--tpm-ek-ca-bundle`: a PEM file, or a folder whose `*.pem` files are read in name order (the
/// shipped bundle is one ConfigMap per vendor, projected into one folder; the `..data` entries
/// a mounted ConfigMap carries are skipped).
fn read_bundle(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    if !path.is_dir() {
        return std::fs::read(path);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            !name.starts_with('.') && name.ends_with(".pem") && p.is_file()
        })
        .collect();
    files.sort();
    let mut all = Vec::new();
    for file in files {
        all.extend(std::fs::read(&file)?);
        all.push(b'\n');
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_folder_is_read_in_name_order_without_hidden_entries() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.pem"), "B").unwrap();
        std::fs::write(dir.path().join("a.pem"), "A").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "X").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("..data").join("c.pem"), "C").unwrap();
        assert_eq!(read_bundle(dir.path()).unwrap(), b"A\nB\n");
        assert_eq!(read_bundle(&dir.path().join("a.pem")).unwrap(), b"A");
    }
}
