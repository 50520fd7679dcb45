//! Whose signature an attested document must carry (SPEC section 5): a leaf certificate that
//! chains, through intermediates the signer ships, to a Microsoft or DigiCert root it ships, and
//! that names a host under the cloud's metadata domain.
//!
//! Azure embeds only the leaf in the document. Its intermediates are not fetched from the URL
//! the leaf names (an attacker's document could name any URL); they come from the bundle
//! (`config/components/azure-ca-bundle`, built into the signer and replaceable with
//! `--azure-ca-bundle`). Path building, validity, name constraints and the TLS server EKU are
//! rustls-webpki's, with aws-lc-rs's algorithms. Revocation is not checked: the document lives
//! six hours, and its nonce makes it good for one CSR.

use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use time::OffsetDateTime;
use x509_parser::prelude::FromDer;

/// The clouds' metadata domains: a leaf must name one, or a host under one.
pub const METADATA_DOMAINS: &[(&str, &str)] = &[
    ("metadata.azure.com", "Azure public cloud"),
    ("metadata.azure.us", "Azure US Government"),
    ("metadata.azure.cn", "Azure China (21Vianet)"),
];

/// The algorithms a chain may be signed with (aws-lc-rs only).
static ALGORITHMS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA384,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA512,
    webpki::aws_lc_rs::RSA_PKCS1_3072_8192_SHA384,
    webpki::aws_lc_rs::ECDSA_P256_SHA256,
    webpki::aws_lc_rs::ECDSA_P256_SHA384,
    webpki::aws_lc_rs::ECDSA_P384_SHA256,
    webpki::aws_lc_rs::ECDSA_P384_SHA384,
];

/// The certificates the signer ships (config/components/azure-ca-bundle/bundle: sources and
/// fingerprints in its SOURCES.tsv, checked by scripts/azure-ca-bundle).
const SHIPPED: &[&str] = &[
    include_str!("../../../config/components/azure-ca-bundle/bundle/baltimore-cybertrust-root.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/digicert-global-root-ca.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/digicert-global-root-g2.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-03-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-03.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-04-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-04.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-07-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-07.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-08-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-rsa-tls-issuing-ca-08.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-tls-issuing-ca-01-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-azure-tls-issuing-ca-05-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-it-tls-ca-4.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-rsa-root-certificate-authority-2017.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-rsa-tls-ca-01.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-rsa-tls-ca-02.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-02.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-04.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-06.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-08.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-10.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-12.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-14.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-g2-rsa-ca-ocsp-16.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-rsa-root-g2-xsign.pem"),
    include_str!("../../../config/components/azure-ca-bundle/bundle/microsoft-tls-rsa-root-g2.pem"),
];

/// Roots and intermediates an attested document's leaf must chain through, and the metadata
/// domains its name may be under.
#[derive(Clone)]
pub struct MicrosoftTrust {
    roots: Vec<TrustAnchor<'static>>,
    intermediates: Vec<CertificateDer<'static>>,
    domains: Vec<(String, &'static str)>,
}

impl std::fmt::Debug for MicrosoftTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicrosoftTrust")
            .field("roots", &self.roots.len())
            .field("intermediates", &self.intermediates.len())
            .finish()
    }
}

fn all_domains() -> Vec<(String, &'static str)> {
    METADATA_DOMAINS.iter().map(|(d, c)| ((*d).to_owned(), *c)).collect()
}

/// What a verified leaf is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedLeaf {
    /// The DNS name under a metadata domain it names.
    pub dns_name: String,
    /// Which cloud that domain is.
    pub cloud: &'static str,
}

impl MicrosoftTrust {
    /// The bundle built into the signer.
    pub fn shipped() -> Self {
        let pem: String = SHIPPED.concat();
        Self::from_pem(pem.as_bytes()).unwrap_or_else(|_| Self {
            roots: Vec::new(),
            intermediates: Vec::new(),
            domains: all_domains(),
        })
    }

    /// A bundle of PEM certificates: the self-issued ones (subject = issuer) are roots, the
    /// others intermediates. Anything but CERTIFICATE blocks is an error, as is a bundle
    /// without a root.
    pub fn from_pem(pem_bytes: &[u8]) -> Result<Self, String> {
        let blocks = pem::parse_many(pem_bytes).map_err(|e| format!("the Azure CA bundle is not PEM: {e}"))?;
        let mut roots = Vec::new();
        let mut intermediates = Vec::new();
        for (index, block) in blocks.into_iter().enumerate() {
            if block.tag() != "CERTIFICATE" {
                return Err(format!(
                    "the Azure CA bundle's block {} is a {:?}, not a CERTIFICATE",
                    index + 1,
                    crate::identity::truncate(block.tag(), 40)
                ));
            }
            let der = block.into_contents();
            let (_, certificate) = x509_parser::certificate::X509Certificate::from_der(&der)
                .map_err(|e| format!("the Azure CA bundle's certificate {} does not parse: {e}", index + 1))?;
            let self_issued = certificate.subject().as_raw() == certificate.issuer().as_raw();
            let der = CertificateDer::from(der);
            if self_issued {
                let anchor = webpki::anchor_from_trusted_cert(&der)
                    .map_err(|e| format!("the Azure CA bundle's root {} is unusable: {e:?}", index + 1))?
                    .to_owned();
                roots.push(anchor);
            } else {
                intermediates.push(der);
            }
        }
        if roots.is_empty() {
            return Err("the Azure CA bundle holds no root (self-issued) certificate".into());
        }
        Ok(Self {
            roots,
            intermediates,
            domains: all_domains(),
        })
    }

    /// Only documents of these clouds' metadata domains (`metadata.azure.com`,
    /// `metadata.azure.us`, `metadata.azure.cn`), instead of all three.
    pub fn with_metadata_domains(mut self, domains: &[&str]) -> Result<Self, String> {
        let mut chosen = Vec::new();
        for domain in domains {
            let known = METADATA_DOMAINS
                .iter()
                .find(|(d, _)| d.eq_ignore_ascii_case(domain))
                .ok_or_else(|| {
                    format!(
                        "{:?} is not an Azure metadata domain ({})",
                        crate::identity::truncate(domain, 64),
                        METADATA_DOMAINS.iter().map(|(d, _)| *d).collect::<Vec<_>>().join(", ")
                    )
                })?;
            chosen.push(((*known.0).to_owned(), known.1));
        }
        if chosen.is_empty() {
            return Err("no Azure metadata domain given".into());
        }
        self.domains = chosen;
        Ok(self)
    }

    /// Roots and intermediates held.
    pub fn len(&self) -> (usize, usize) {
        (self.roots.len(), self.intermediates.len())
    }

    /// Checks `leaf_der` at `now`: it chains to a root for TLS server use, and names a host
    /// under a metadata domain.
    pub fn verify(&self, leaf_der: &[u8], now: OffsetDateTime) -> Result<TrustedLeaf, String> {
        let leaf = CertificateDer::from(leaf_der);
        let end_entity = webpki::EndEntityCert::try_from(&leaf)
            .map_err(|e| format!("the document's certificate does not parse: {e:?}"))?;
        let seconds = u64::try_from(now.unix_timestamp()).map_err(|_| "the clock is before 1970".to_owned())?;
        let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(seconds));
        end_entity
            .verify_for_usage(
                ALGORITHMS,
                &self.roots,
                &self.intermediates,
                time,
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .map_err(|e| {
                format!("the document's certificate does not chain to the Azure CA bundle's roots at {now}: {e:?}")
            })?;
        let (_, certificate) = x509_parser::certificate::X509Certificate::from_der(leaf_der)
            .map_err(|e| format!("the document's certificate does not parse: {e}"))?;
        let names = dns_names(&certificate);
        names
            .iter()
            .find_map(|name| {
                let lower = name.to_ascii_lowercase();
                self.domains.iter().find_map(|(domain, cloud)| {
                    let under = lower == *domain
                        || lower
                            .strip_suffix(domain.as_str())
                            .is_some_and(|head| head.ends_with('.'));
                    under.then(|| TrustedLeaf {
                        dns_name: lower.clone(),
                        cloud,
                    })
                })
            })
            .ok_or_else(|| {
                format!(
                    "the document's certificate names {:?} in its SAN (its CN is not read), none under the accepted metadata domains ({})",
                    names.iter().take(4).collect::<Vec<_>>(),
                    self.domains
                        .iter()
                        .map(|(d, _)| d.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

/// The certificate's DNS names: its SAN dNSNames only (SPEC section 5, revision 5). A
/// certificate without a SAN names no host: Go's crypto/x509, rustls-webpki and the CA/Browser
/// Forum's rules ignore the CN, and no Azure document's leaf needs it, so neither does this.
fn dns_names(certificate: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    match certificate.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}
