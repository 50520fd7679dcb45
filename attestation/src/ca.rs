//! The workload cluster CA (`<cluster>-ca`: `tls.crt`, `tls.key`) and certificate issuance.
//!
//! Issuance copies exactly two things from a request, the subject (CN and O) and the
//! provider-ID extension; everything else is set here (SPEC section 3).

use std::fmt;

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SignatureAlgorithm, SigningKey,
};
use rustls_pki_types::PrivateKeyDer;
use time::{Duration, OffsetDateTime};
use x509_parser::prelude::FromDer;
use zeroize::{Zeroize, Zeroizing};

use crate::csr::{ParsedCsr, PublicKeyKind, StringKind};
use crate::digest::sha256;
use crate::identity::ProviderId;
use crate::names::PROVIDER_ID_OID;

/// Why a CA cannot be loaded. Messages never include key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// `tls.crt` is not one PEM certificate.
    #[error("CA certificate is not a PEM CERTIFICATE: {why}")]
    CertificatePem {
        /// What is wrong.
        why: String,
    },
    /// `tls.crt` does not decode.
    #[error("CA certificate does not decode: {why}")]
    CertificateDer {
        /// The decoder's complaint.
        why: String,
    },
    /// The certificate is not a CA (no basicConstraints CA:true, or no keyCertSign usage).
    #[error("certificate {subject} is not a CA (it needs basicConstraints CA:true and, with a key usage, keyCertSign)")]
    NotACa {
        /// Its subject.
        subject: String,
    },
    /// `tls.key` is not a PEM private key of a supported format.
    #[error("CA key is not a PEM RSA PRIVATE KEY, EC PRIVATE KEY or PRIVATE KEY (PKCS#8)")]
    KeyPem,
    /// The CA's key type is not one this signer signs with.
    #[error("CA key type {key} is not supported (RSA, ECDSA P-256/P-384)")]
    KeyUnsupported {
        /// The key kind.
        key: String,
    },
    /// The key does not load, or does not belong to the certificate.
    #[error("CA key does not match the CA certificate's public key")]
    KeyMismatch,
}

/// Why a certificate could not be issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The request's key cannot go in a certificate (rule 2 should have refused it).
    #[error("request key {key} cannot be certified")]
    UnsupportedKey {
        /// The key kind.
        key: String,
    },
    /// The CA expired, or expires before the minimum useful lifetime.
    #[error("CA certificate expired at {not_after}")]
    CaExpired {
        /// The CA's NotAfter.
        not_after: OffsetDateTime,
    },
    /// rcgen refused to build the certificate.
    #[error("building the certificate failed: {0}")]
    Build(String),
}

/// The signing key, zeroized on drop and never printed.
struct CaKey(KeyPair);

impl Drop for CaKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl PublicKeyData for CaKey {
    fn der_bytes(&self) -> &[u8] {
        self.0.der_bytes()
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.0.algorithm()
    }
}

impl SigningKey for CaKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.0.sign(msg)
    }
}

/// A workload cluster CA, ready to sign.
pub struct ClusterCa {
    cert_der: Vec<u8>,
    issuer: Issuer<'static, CaKey>,
    not_after: OffsetDateTime,
    subject: String,
    fingerprint: [u8; 32],
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// How long the certificate may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// The signer's clock.
    pub now: OffsetDateTime,
    /// `spec.expirationSeconds`, if set.
    pub requested_seconds: Option<i64>,
    /// `--client-cert-duration`.
    pub max: Duration,
}

/// What [`ClusterCa::issue`] produced.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// DER.
    pub der: Vec<u8>,
    /// NotAfter.
    pub not_after: OffsetDateTime,
}

impl IssuedCertificate {
    /// PEM, as `status.certificate` holds it.
    pub fn pem(&self) -> String {
        pem::encode_config(
            &pem::Pem::new("CERTIFICATE", self.der.clone()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }
}

impl fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// [`ClusterCa::fingerprint`] of a `tls.crt` without loading its key: enough to compare
    /// CAs across Clusters this process does not sign for.
    pub fn certificate_fingerprint(cert_pem: &[u8]) -> Result<[u8; 32], CaError> {
        let cert = pem::parse(cert_pem).map_err(|e| CaError::CertificatePem { why: e.to_string() })?;
        if cert.tag() != "CERTIFICATE" {
            return Err(CaError::CertificatePem {
                why: format!("found a {:?} block", crate::identity::truncate(cert.tag(), 40)),
            });
        }
        Ok(sha256(cert.contents()))
    }

    /// Loads `tls.crt` and `tls.key`. The key may be RSA PKCS#1 (Cluster API's default),
    /// PKCS#8, or EC SEC1; it must match the certificate.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, CaError> {
        let cert = pem::parse(cert_pem).map_err(|e| CaError::CertificatePem { why: e.to_string() })?;
        if cert.tag() != "CERTIFICATE" {
            return Err(CaError::CertificatePem {
                why: format!("found a {:?} block", crate::identity::truncate(cert.tag(), 40)),
            });
        }
        let cert_der = cert.into_contents();
        let (_, x509) = x509_parser::certificate::X509Certificate::from_der(&cert_der)
            .map_err(|e| CaError::CertificateDer { why: e.to_string() })?;
        let subject = x509.subject().to_string();
        let can_sign_certificates = x509
            .key_usage()
            .ok()
            .flatten()
            .is_none_or(|ku| ku.value.key_cert_sign());
        if !x509.is_ca() || !can_sign_certificates {
            return Err(CaError::NotACa { subject });
        }
        // rcgen copies the issuer name one attribute per RDN (and panics on an empty RDN).
        if x509.subject().iter().any(|rdn| rdn.iter().count() != 1) {
            return Err(CaError::CertificateDer {
                why: "the CA subject must have one attribute per RDN".into(),
            });
        }
        let spki = x509.public_key();
        let algorithm = signing_algorithm(&spki.algorithm).ok_or_else(|| CaError::KeyUnsupported {
            key: spki.algorithm.algorithm.to_id_string(),
        })?;

        let key_block = pem::parse(key_pem).map_err(|_| CaError::KeyPem)?;
        if !matches!(key_block.tag(), "RSA PRIVATE KEY" | "EC PRIVATE KEY" | "PRIVATE KEY") {
            return Err(CaError::KeyPem);
        }
        let key_der = Zeroizing::new(key_block.into_contents());
        let private = PrivateKeyDer::try_from(key_der.as_slice()).map_err(|_| CaError::KeyPem)?;
        let key = CaKey(KeyPair::from_der_and_sign_algo(&private, algorithm).map_err(|_| CaError::KeyMismatch)?);
        if key.der_bytes() != spki.subject_public_key.data.as_ref() {
            return Err(CaError::KeyMismatch);
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)
            .map_err(|e| CaError::CertificateDer { why: e.to_string() })?;
        let not_after = x509.validity().not_after.to_datetime();
        let fingerprint = sha256(&cert_der);
        Ok(Self {
            issuer,
            not_after,
            subject,
            fingerprint,
            cert_der,
        })
    }

    /// The CA certificate, DER.
    pub fn certificate_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// SHA-256 of the CA certificate: two opted-in Clusters must not share it.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// The CA's NotAfter.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// Signs a client certificate for an approved request: random 160-bit serial; NotBefore
    /// now-5m; NotAfter min(now + min(requested, max), CA NotAfter); subject CN and O copied;
    /// no SAN; KeyUsage digitalSignature (+keyEncipherment for RSA); EKU clientAuth;
    /// BasicConstraints CA:false, critical, an empty SEQUENCE; AKI and SKI; the provider-ID
    /// extension. Strict DER throughout.
    pub fn issue(
        &self,
        csr: &ParsedCsr,
        provider_id: &ProviderId,
        validity: Validity,
    ) -> Result<IssuedCertificate, IssueError> {
        let key = CsrKey::new(csr)?;
        let lifetime = match validity.requested_seconds {
            Some(seconds) if seconds > 0 => Duration::seconds(seconds).min(validity.max),
            _ => validity.max,
        };
        let not_after = (validity.now + lifetime).min(self.not_after);
        if not_after <= validity.now {
            return Err(IssueError::CaExpired {
                not_after: self.not_after,
            });
        }

        let provider_id_extension =
            rcgen::CustomExtension::from_oid_content(PROVIDER_ID_OID, provider_id.to_extension_value());
        let der = self.client_certificate(
            &key,
            csr.key_kind.is_rsa(),
            copy_subject(csr)?,
            validity.now,
            not_after,
            vec![provider_id_extension],
        )?;
        Ok(IssuedCertificate { der, not_after })
    }

    /// Signs the signer's own client certificate for a workload cluster: user `common_name`, in
    /// no group, for `key` (a key the signer generated and holds in memory only), NotBefore
    /// now-5m (clock skew), NotAfter min(now + lifetime, CA NotAfter). The rest is as for a
    /// kubelet ([`ClusterCa::issue`]): EKU clientAuth only, CA:false, strict DER. Nothing in it
    /// comes from a request: the signer authenticates as itself, bounded by its own RBAC
    /// (SPEC section 7, no per-cluster setup).
    pub fn issue_own_identity(
        &self,
        key: &impl PublicKeyData,
        common_name: &str,
        now: OffsetDateTime,
        lifetime: Duration,
    ) -> Result<IssuedCertificate, IssueError> {
        let not_after = (now + lifetime).min(self.not_after);
        if not_after <= now {
            return Err(IssueError::CaExpired {
                not_after: self.not_after,
            });
        }
        let rsa = key.algorithm() == &rcgen::PKCS_RSA_SHA256;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, DnValue::Utf8String(common_name.to_owned()));
        let der = self.client_certificate(key, rsa, subject, now, not_after, Vec::new())?;
        Ok(IssuedCertificate { der, not_after })
    }

    /// A client certificate for `key`: random 160-bit serial; NotBefore now-5m; `subject`; no
    /// SAN; KeyUsage digitalSignature (+keyEncipherment for RSA); EKU clientAuth;
    /// BasicConstraints CA:false, critical, an empty SEQUENCE; AKI and SKI; then `extensions`.
    fn client_certificate(
        &self,
        key: &impl PublicKeyData,
        rsa: bool,
        subject: DistinguishedName,
        now: OffsetDateTime,
        not_after: OffsetDateTime,
        extensions: Vec<rcgen::CustomExtension>,
    ) -> Result<Vec<u8>, IssueError> {
        let mut params = CertificateParams::default();
        params.serial_number = Some(random_serial().map_err(IssueError::Build)?.into());
        params.not_before = now - Duration::minutes(5);
        params.not_after = not_after;
        params.distinguished_name = subject;
        params.key_usages = if rsa {
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment]
        } else {
            vec![KeyUsagePurpose::DigitalSignature]
        };
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        // rcgen's `IsCa::ExplicitNoCa` writes BasicConstraints with `cA FALSE` spelled out,
        // which DER omits (a DEFAULT value) and strict parsers refuse; with `NoCa` it writes
        // neither BasicConstraints nor SKI, and both are written here.
        params.is_ca = IsCa::NoCa;
        params.use_authority_key_identifier_extension = true;
        let mut basic_constraints =
            rcgen::CustomExtension::from_oid_content(BASIC_CONSTRAINTS_OID, BASIC_CONSTRAINTS_NOT_CA.to_vec());
        basic_constraints.set_criticality(true);
        params.custom_extensions = vec![
            rcgen::CustomExtension::from_oid_content(SUBJECT_KEY_IDENTIFIER_OID, subject_key_identifier(key)?),
            basic_constraints,
        ];
        params.custom_extensions.extend(extensions);
        let cert = params
            .signed_by(key, &self.issuer)
            .map_err(|e| IssueError::Build(e.to_string()))?;
        Ok(cert.der().to_vec())
    }
}

/// BasicConstraints.
const BASIC_CONSTRAINTS_OID: &[u64] = &[2, 5, 29, 19];
/// BasicConstraints CA:false in DER: an empty SEQUENCE (`cA` DEFAULT FALSE is omitted).
const BASIC_CONSTRAINTS_NOT_CA: [u8; 2] = [0x30, 0x00];
/// SubjectKeyIdentifier.
const SUBJECT_KEY_IDENTIFIER_OID: &[u64] = &[2, 5, 29, 14];

/// The SubjectKeyIdentifier extension value: a DER OCTET STRING of the first 20 bytes of
/// SHA-256 over the certificate's SubjectPublicKeyInfo (RFC 7093 method 1, as rcgen derives it).
fn subject_key_identifier(key: &impl PublicKeyData) -> Result<Vec<u8>, IssueError> {
    use der::Encode;
    let digest = sha256(&key.subject_public_key_info());
    der::asn1::OctetStringRef::new(&digest[..20])
        .and_then(|id| id.to_der())
        .map_err(|e| IssueError::Build(e.to_string()))
}

/// The request's public key, as rcgen writes it into the certificate.
struct CsrKey<'a> {
    algorithm: &'static SignatureAlgorithm,
    key: &'a [u8],
}

impl<'a> CsrKey<'a> {
    fn new(csr: &'a ParsedCsr) -> Result<Self, IssueError> {
        let algorithm = match csr.key_kind {
            PublicKeyKind::Rsa { .. } => &rcgen::PKCS_RSA_SHA256,
            PublicKeyKind::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            PublicKeyKind::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            PublicKeyKind::Ed25519 => &rcgen::PKCS_ED25519,
            ref other => {
                return Err(IssueError::UnsupportedKey { key: other.to_string() });
            }
        };
        Ok(Self {
            algorithm,
            key: &csr.public_key,
        })
    }
}

impl PublicKeyData for CsrKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.key
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.algorithm
    }
}

fn copy_subject(csr: &ParsedCsr) -> Result<DistinguishedName, IssueError> {
    let mut dn = DistinguishedName::new();
    for attribute in &csr.subject {
        let ty = if attribute.is_common_name() {
            DnType::CommonName
        } else if attribute.is_organization() {
            DnType::OrganizationName
        } else {
            continue;
        };
        let value = attribute.value.clone().unwrap_or_default();
        let value = match attribute.kind {
            StringKind::Printable => DnValue::PrintableString(
                value
                    .try_into()
                    .map_err(|e: rcgen::Error| IssueError::Build(e.to_string()))?,
            ),
            _ => DnValue::Utf8String(value),
        };
        dn.push(ty, value);
    }
    Ok(dn)
}

fn signing_algorithm(algorithm: &x509_parser::x509::AlgorithmIdentifier<'_>) -> Option<&'static SignatureAlgorithm> {
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    };
    if algorithm.algorithm == OID_PKCS1_RSAENCRYPTION {
        return Some(&rcgen::PKCS_RSA_SHA256);
    }
    if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = algorithm.parameters.as_ref()?.as_oid().ok()?;
        if curve == OID_EC_P256 {
            return Some(&rcgen::PKCS_ECDSA_P256_SHA256);
        }
        if curve == OID_NIST_EC_P384 {
            return Some(&rcgen::PKCS_ECDSA_P384_SHA384);
        }
    }
    None
}

/// 20 random bytes with the top bit cleared: a positive 159-bit serial.
fn random_serial() -> Result<Vec<u8>, String> {
    let mut serial = vec![0u8; 20];
    SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| "the system random source failed".to_owned())?;
    serial[0] &= 0x7f;
    serial[0] |= 0x40;
    Ok(serial)
}
