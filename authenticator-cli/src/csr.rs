//! `kubelet-authenticator csr`: key + attested request, printed, not filed.

use std::path::PathBuf;

use anyhow::{Context, Result};
use attestation::attestor::Attestor;
use attestation::identity::{NodeName, ProviderId};
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};

use crate::metadata::{AzureImdsHttp, GceMetadataHttp, ImdsV2, env_value};

/// Which attestor to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttestorName {
    /// `insecure/v1`: no evidence; only for infrastructure without a secure mechanism.
    Insecure,
    /// `tpm/v1`: TPM 2.0 attestation.
    Tpm,
    /// `gcp/v1`: the Compute Engine metadata server's identity token for the CSR's key
    /// (`GCE_METADATA_HOST` names another metadata server, host[:port]).
    Gcp,
    /// `aws/v1`: the EC2 identity document and an STS request signed with the instance role
    /// (IMDSv2; `AWS_EC2_METADATA_SERVICE_ENDPOINT` names another metadata service, a URL, and
    /// `AWS_ENDPOINT_URL_STS` the STS endpoint signed for).
    Aws,
    /// `azure/v1`: two CSRs, as `tpm/v1`: the first asks the signer for a challenge, the second
    /// carries the attested document of Azure's instance metadata service fetched with the
    /// challenge's nonce (`AZURE_METADATA_ENDPOINT` names another metadata service, a URL).
    /// Without `--provider-id` or `--provider-id-file`, exec mode reads the VM's from it.
    Azure,
}

/// The environment variable naming the STS endpoint `aws/v1` signs for (the AWS SDK
/// convention; `{region}` in it is replaced by the instance's region), instead of the regional
/// endpoints: the signer must send the request to the same endpoint.
pub const AWS_ENDPOINT_URL_STS_ENV: &str = "AWS_ENDPOINT_URL_STS";

impl AttestorName {
    /// The attestor, ready to run.
    pub fn attestor(self, tpm: &TpmOptions) -> Result<Box<dyn Attestor>> {
        match self {
            Self::Insecure => Ok(Box::new(attestation::insecure::InsecureAttestor)),
            #[cfg(feature = "tpm")]
            Self::Tpm => {
                use attestation::tpm::attestor::{EkAlgorithm, TpmAttestor};
                let algorithm = match tpm.tpm_ek {
                    EkKind::Rsa2048 => EkAlgorithm::Rsa2048,
                    EkKind::EccP256 => EkAlgorithm::EccP256,
                };
                use attestation::tpm::attestor::EventLogSource;
                tpm_device_opens(&tpm.tpm_tcti)?;
                let event_log = match &tpm.tpm_event_log {
                    Some(path) => EventLogSource::File(path.clone()),
                    None => EventLogSource::Kernel,
                };
                Ok(Box::new(TssLogExplained(
                    TpmAttestor::new(&tpm.tpm_tcti)?
                        .with_ek_algorithm(algorithm)
                        .with_event_log(event_log),
                )))
            }
            #[cfg(not(feature = "tpm"))]
            Self::Tpm => {
                let _ = tpm;
                anyhow::bail!(
                    "--attestor tpm: this kubelet-authenticator was built without the tpm feature; rebuild with it, or use --attestor insecure where the Cluster allows it"
                )
            }
            Self::Gcp => {
                use attestation::gcp::attestor::GcpAttestor;
                Ok(Box::new(GcpAttestor::new(GceMetadataHttp::from_env()?)))
            }
            Self::Aws => {
                use attestation::aws::StsEndpoints;
                use attestation::aws::attestor::AwsAttestor;
                let endpoints = match env_value(AWS_ENDPOINT_URL_STS_ENV)? {
                    // from_template's own message names the signer's flag: say which setting it is here.
                    Some(url) => StsEndpoints::from_template(&url)
                        .map_err(|_| anyhow::anyhow!("{AWS_ENDPOINT_URL_STS_ENV} {url:?} is not an http(s) URL"))?,
                    None => StsEndpoints::regional(),
                };
                Ok(Box::new(AwsAttestor::new(ImdsV2::from_env()?, endpoints)))
            }
            Self::Azure => {
                use attestation::azure::AzureAttestor;
                Ok(Box::new(AzureAttestor::new(AzureImdsHttp::from_env()?)))
            }
        }
    }

    /// Whether the attestor finds the node's provider ID itself when no flag gives it
    /// (`azure`: the VM's, from the instance metadata service, as CAPZ writes it).
    pub fn finds_provider_id(self) -> bool {
        matches!(self, Self::Azure)
    }

    /// The PROVIDER block this attestor writes (`tpm/v1`, ...).
    pub fn provider_version(self) -> &'static str {
        match self {
            Self::Insecure => "insecure/v1",
            Self::Tpm => "tpm/v1",
            Self::Gcp => "gcp/v1",
            Self::Aws => "aws/v1",
            Self::Azure => "azure/v1",
        }
    }

    /// The client signer name this attestor's CSRs go to.
    pub fn signer_name(self) -> &'static str {
        match self {
            Self::Insecure => attestation::names::SIGNER_INSECURE,
            Self::Tpm => attestation::names::SIGNER_TPM,
            Self::Gcp => attestation::names::SIGNER_GCP,
            Self::Aws => attestation::names::SIGNER_AWS,
            Self::Azure => attestation::names::SIGNER_AZURE,
        }
    }
}

/// For a `device` TCTI (`device`, `device:<path>`; the default `/dev/tpm0` when no path is
/// given), whether the device opens, checked before tpm2-tss loads the TCTI. A node without a
/// TPM is the common failure, and there tpm2-tss first logs three `ERROR:tcti` lines of its own
/// to stderr and then returns a code tss-esapi reads as "response code not recognized"; checked
/// here, the message names the device and the OS error, and the TPM library is never loaded.
/// (Silencing tpm2-tss itself takes `TSS2_LOG` in the environment before it loads, which this
/// process cannot set: `std::env::set_var` is unsafe in edition 2024 and the workspace forbids
/// unsafe code.) Other TCTIs (swtpm, mssim, tabrmd) are left to tpm2-tss.
#[cfg(feature = "tpm")]
fn tpm_device_opens(tcti: &str) -> Result<()> {
    let path = match tcti.strip_prefix("device") {
        Some("" | ":") => "/dev/tpm0",
        Some(rest) => match rest.strip_prefix(':') {
            Some(path) => path,
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    // Opened as tpm2-tss opens it (read-write), and closed at once: a permission problem is
    // found here too. The kernel's resource manager (`tpmrm0`) gives each open its own space.
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(path);
    let error = match opened {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::Error::new(e).context(format!("no TPM at {path} (--tpm-tcti {tcti})"))
        }
        Err(e) => anyhow::Error::new(e).context(format!("cannot open the TPM at {path} (--tpm-tcti {tcti})")),
    };
    Err(error.context("--attestor tpm"))
}

/// The TPM attestor, its failures saying where the `ERROR:` lines printed before them come
/// from: tpm2-tss logs its own errors to stderr, and this process cannot turn that off (see
/// [`tpm_device_opens`]). Said only while `TSS2_LOG` is unset: an operator who set it asked
/// for those lines.
#[cfg(feature = "tpm")]
struct TssLogExplained<A>(A);

/// What a TPM failure adds while `TSS2_LOG` is unset.
#[cfg(feature = "tpm")]
const TSS2_LOG_HINT: &str = "lines above starting ERROR: or WARNING: are tpm2-tss's own log; TSS2_LOG=all+none in the environment silences them";

#[cfg(feature = "tpm")]
impl<A: Attestor> Attestor for TssLogExplained<A> {
    fn provider_version(&self) -> attestation::envelope::ProviderVersion {
        self.0.provider_version()
    }

    fn signer_name(&self) -> &'static str {
        self.0.signer_name()
    }

    fn attest(
        &mut self,
        request: &attestation::attestor::AttestationRequest<'_>,
    ) -> Result<Option<Vec<u8>>, attestation::attestor::AttestError> {
        use attestation::attestor::AttestError;
        let explained = |why: String| {
            if std::env::var_os("TSS2_LOG").is_some() {
                why
            } else {
                format!("{why} ({TSS2_LOG_HINT})")
            }
        };
        self.0.attest(request).map_err(|error| match error {
            AttestError::DeviceUnavailable(why) => AttestError::DeviceUnavailable(explained(why)),
            AttestError::Failed(why) => AttestError::Failed(explained(why)),
            other => other,
        })
    }

    fn challenge_annotation(&self) -> Option<&'static str> {
        self.0.challenge_annotation()
    }
}

/// Key type to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyType {
    /// ECDSA P-256 (what kubelet uses).
    EcdsaP256,
    /// ECDSA P-384.
    EcdsaP384,
    /// RSA-2048.
    Rsa2048,
    /// Ed25519.
    Ed25519,
}

/// Arguments of `csr`.
#[derive(Debug, clap::Args)]
pub struct CsrArgs {
    /// Node name: the CSR's CN is `system:node:<name>`.
    #[arg(long)]
    pub node_name: String,
    /// The Machine's `spec.providerID`, carried in the provider-ID extension.
    #[arg(long)]
    pub provider_id: String,
    /// Attestor: tpm (TPM 2.0, see --tpm-tcti), gcp (Compute Engine metadata server; env
    /// GCE_METADATA_HOST=host[:port] to use another), aws (EC2 metadata service, IMDSv2, and a
    /// signed STS request; env AWS_EC2_METADATA_SERVICE_ENDPOINT=<url> and AWS_ENDPOINT_URL_STS=<url>
    /// to use others), azure (Azure instance metadata service; env AZURE_METADATA_ENDPOINT=<url> to
    /// use another), or insecure (no evidence). For tpm and azure this prints the first of their
    /// two CSRs, which asks the signer for a challenge.
    #[arg(long, value_enum)]
    pub attestor: AttestorName,
    /// Where to write the private key (PKCS#8 PEM, mode 0600, written atomically).
    #[arg(long)]
    pub key_out: PathBuf,
    /// Key type.
    #[arg(long, value_enum, default_value_t = KeyType::EcdsaP256)]
    pub key_type: KeyType,
    /// The TPM.
    #[command(flatten)]
    pub tpm: TpmOptions,
}

/// The TPM the node uses unless `--tpm-tcti` says otherwise: the kernel's resource manager.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";

/// Where the TPM is and which EK it presents (for `--attestor tpm`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct TpmOptions {
    /// TPM TCTI, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
    #[arg(long, env = "KUBELET_AUTHENTICATOR_TPM_TCTI", default_value = DEFAULT_TCTI)]
    pub tpm_tcti: String,
    /// The EK presented: the TCG default template's RSA-2048 key, or its ECC P-256 key.
    #[arg(long, env = "KUBELET_AUTHENTICATOR_TPM_EK", value_enum, default_value_t = EkKind::Rsa2048)]
    pub tpm_ek: EkKind,
    /// The TCG event log sent with the first CSR, for a Cluster's boot policy (at most 256 KiB).
    /// Default: the kernel's, /sys/kernel/security/tpm0/binary_bios_measurements, when it can
    /// be read (none is sent otherwise); a file named here must be read.
    #[arg(long, env = "KUBELET_AUTHENTICATOR_TPM_EVENT_LOG", value_name = "PATH")]
    pub tpm_event_log: Option<PathBuf>,
}

/// EK algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EkKind {
    /// RSA-2048 (what the SPEC prefers).
    Rsa2048,
    /// ECC NIST P-256.
    EccP256,
}

/// Runs `csr`.
pub fn run(args: &CsrArgs) -> Result<()> {
    let node_name = NodeName::new(&args.node_name).context("--node-name")?;
    let provider_id = ProviderId::new(&args.provider_id).context("--provider-id")?;
    let mut attestor = args.attestor.attestor(&args.tpm)?;
    let algorithm = match args.key_type {
        KeyType::EcdsaP256 => KeyAlgorithm::EcdsaP256,
        KeyType::EcdsaP384 => KeyAlgorithm::EcdsaP384,
        KeyType::Rsa2048 => KeyAlgorithm::Rsa2048,
        KeyType::Ed25519 => KeyAlgorithm::Ed25519,
    };
    let key = NodeKey::generate(algorithm)?;
    let envelope = build_envelope(
        &kubelet_client_params(&node_name, &provider_id),
        &key,
        attestor.as_mut(),
        None,
    )?;
    crate::secret_file::write_private(&args.key_out, key.private_key_pem().as_bytes())?;
    print!("{}", envelope.encode());
    eprintln!("signer name: {}", attestor.signer_name());
    if let Some(annotation) = attestor.challenge_annotation() {
        eprintln!(
            "this is CSR #1 of {}: the signer answers it with a challenge in the annotation {annotation}, which exec mode answers with CSR #2 (same key)",
            attestor.provider_version()
        );
    }
    Ok(())
}
