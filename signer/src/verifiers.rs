//! The verifiers a signer runs with, assembled from the flags: `insecure/v1`, `tpm/v1` (its EK
//! trust and challenge key), `gcp/v1` and `aws/v1` (their caches of Google's keys and STS's
//! answers), `azure/v1` (Microsoft's CA bundle, ARM's answers, and the challenge key and TTL
//! it shares with `tpm/v1`). `run` and `check` build them here alike, so an offline decision is
//! the controller's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use attestation::attestor::Verifiers;
use attestation::aws::CallerIdentity;
use attestation::azure::{MicrosoftTrust, VirtualMachines};
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
    /// `--tpm-challenge-ttl` (`azure/v1`'s challenges too).
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
    /// `tpm/v1` and `azure/v1`: how long a challenge may go unanswered, as the signer's flag.
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

/// Every verifier: `tpm/v1` and `azure/v1` deriving their challenges under `challenge_key`
/// (loaded now, or later by the controller's loader), the cloud providers finding Google's keys
/// in `google`, STS's answers in `sts` and ARM's in `vms`.
pub fn all(
    challenge_key: ChallengeKey,
    tpm: &TpmSettings<'_>,
    cloud: &CloudArgs,
    google: Arc<dyn GoogleKeys>,
    sts: Arc<dyn CallerIdentity>,
    vms: Arc<dyn VirtualMachines>,
) -> Result<Verifiers> {
    let challenge_ttl = time::Duration::try_from(tpm.challenge_ttl).context("--tpm-challenge-ttl is too large")?;
    let azure_verifier = attestation::azure::AzureVerifier::new(challenge_key.clone(), vms)
        .with_trust(azure_trust(cloud.azure_ca_bundle.as_deref())?)
        .with_challenge_ttl(challenge_ttl);
    let mut tpm_verifier = attestation::tpm::TpmVerifier::with_challenge_key(challenge_key)
        .with_trust_on_first_use(tpm.trust_on_first_use)
        .with_challenge_ttl(challenge_ttl);
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
        )
        .with(azure_verifier))
}

/// `--azure-ca-bundle` (a PEM file or a folder of them, as `--tpm-ek-ca-bundle`), or the
/// bundle built into the signer.
fn azure_trust(bundle: Option<&Path>) -> Result<MicrosoftTrust> {
    let Some(path) = bundle else {
        return Ok(MicrosoftTrust::shipped());
    };
    let pem = read_bundle(path).with_context(|| format!("cannot read --azure-ca-bundle {}", path.display()))?;
    let trust =
        MicrosoftTrust::from_pem(&pem).map_err(|e| anyhow::anyhow!("--azure-ca-bundle {}: {e}", path.display()))?;
    let (roots, intermediates) = trust.len();
    tracing::info!(path = %path.display(), roots, intermediates, "read the Azure CA bundle");
    Ok(trust)
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

    #[test]
    fn the_azure_ca_bundle_is_a_file_or_a_folder_and_replaces_the_shipped_one() {
        let pki = ::tests::azure::AzurePki::new(&["metadata.azure.com"]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0-root.pem"), &pki.root_pem).unwrap();
        std::fs::write(dir.path().join("1-intermediate.pem"), &pki.intermediate_pem).unwrap();
        assert_eq!(azure_trust(Some(dir.path())).unwrap().len(), (1, 1));
        let file = dir.path().join("bundle.crt");
        std::fs::write(&file, pki.bundle_pem()).unwrap();
        assert_eq!(azure_trust(Some(&file)).unwrap().len(), (1, 1));
        let (roots, intermediates) = azure_trust(None).unwrap().len();
        assert!(
            roots > 0 && intermediates > 0,
            "the shipped bundle: {roots} roots, {intermediates} intermediates"
        );
        std::fs::write(&file, &pki.intermediate_pem).unwrap();
        let error = format!("{:#}", azure_trust(Some(&file)).unwrap_err());
        assert!(
            error.starts_with("--azure-ca-bundle ") && error.contains("no root"),
            "{error}"
        );
        let error = format!("{:#}", azure_trust(Some(&dir.path().join("none.pem"))).unwrap_err());
        assert!(error.starts_with("cannot read --azure-ca-bundle"), "{error}");
    }

    #[test]
    fn azure_v1_is_served_under_its_signer_name() {
        use clap::FromArgMatches as _;
        let command = <CloudArgs as clap::Args>::augment_args(clap::Command::new("cloud"));
        let cloud = CloudArgs::from_arg_matches(&command.try_get_matches_from(["cloud"]).unwrap()).unwrap();
        assert_eq!(cloud.azure_arm_endpoint, "https://management.azure.com");
        let io = crate::cloud::Cloud::new(&cloud, std::time::Duration::from_secs(1)).unwrap();
        let verifiers = all(
            ChallengeKey::withheld(),
            &TpmSettings {
                ek_ca_bundle: None,
                trust_on_first_use: false,
                challenge_ttl: std::time::Duration::from_secs(600),
            },
            &cloud,
            io.google.clone(),
            io.sts.clone(),
            io.arm.clone(),
        )
        .unwrap();
        let azure = verifiers.for_provider("azure").unwrap();
        assert_eq!(azure.signer_name(), attestation::names::SIGNER_AZURE);
        assert_eq!(azure.versions(), ["v1"]);
    }
}
