//! Certificate authorities made by `openssl`, the way clusterctl and kubeadm users make them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA key format a Cluster API `<cluster>-ca` Secret may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaKeyFormat {
    /// RSA-2048, `RSA PRIVATE KEY` (PKCS#1): Cluster API's default.
    RsaPkcs1,
    /// RSA-2048, `PRIVATE KEY` (PKCS#8).
    RsaPkcs8,
    /// ECDSA P-256, `EC PRIVATE KEY` (SEC1).
    EcP256Sec1,
    /// ECDSA P-256, `PRIVATE KEY` (PKCS#8).
    EcP256Pkcs8,
    /// ECDSA P-384, `EC PRIVATE KEY` (SEC1).
    EcP384Sec1,
}

impl CaKeyFormat {
    /// Every format.
    pub const ALL: [CaKeyFormat; 5] = [
        Self::RsaPkcs1,
        Self::RsaPkcs8,
        Self::EcP256Sec1,
        Self::EcP256Pkcs8,
        Self::EcP384Sec1,
    ];
}

/// A CA on disk.
pub struct TestCa {
    _dir: tempfile::TempDir,
    /// `tls.crt`
    pub cert_path: PathBuf,
    /// `tls.key`
    pub key_path: PathBuf,
    /// Its certificate, PEM.
    pub cert_pem: Vec<u8>,
    /// Its key, PEM.
    pub key_pem: Vec<u8>,
}

fn openssl(args: &[&str], dir: &Path) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed for the test suite");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A self-signed CA named `CN=kubernetes`, valid `days` days, with its key in `format`.
pub fn openssl_ca(format: CaKeyFormat, days: u32) -> TestCa {
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    match format {
        CaKeyFormat::RsaPkcs1 | CaKeyFormat::RsaPkcs8 => openssl(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "pkcs8.key",
            ],
            d,
        ),
        CaKeyFormat::EcP256Sec1 | CaKeyFormat::EcP256Pkcs8 => openssl(
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "sec1.key",
            ],
            d,
        ),
        CaKeyFormat::EcP384Sec1 => openssl(
            &["ecparam", "-name", "secp384r1", "-genkey", "-noout", "-out", "sec1.key"],
            d,
        ),
    }
    let key_file = match format {
        CaKeyFormat::RsaPkcs1 => {
            openssl(&["rsa", "-in", "pkcs8.key", "-traditional", "-out", "tls.key"], d);
            "tls.key"
        }
        CaKeyFormat::RsaPkcs8 => "pkcs8.key",
        CaKeyFormat::EcP256Sec1 | CaKeyFormat::EcP384Sec1 => "sec1.key",
        CaKeyFormat::EcP256Pkcs8 => {
            openssl(
                &["pkcs8", "-topk8", "-nocrypt", "-in", "sec1.key", "-out", "tls.key"],
                d,
            );
            "tls.key"
        }
    };
    let days = days.to_string();
    openssl(
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            key_file,
            "-subj",
            "/CN=kubernetes",
            "-days",
            &days,
            "-out",
            "tls.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ],
        d,
    );
    let cert_path = d.join("tls.crt");
    let key_path = d.join(key_file);
    let cert_pem = std::fs::read(&cert_path).expect("tls.crt");
    let key_pem = std::fs::read(&key_path).expect("tls.key");
    TestCa {
        _dir: dir,
        cert_path,
        key_path,
        cert_pem,
        key_pem,
    }
}

/// Runs `openssl verify` of `leaf_pem` against `ca`, returning openssl's answer.
pub fn openssl_verify(ca: &TestCa, leaf_pem: &str, purpose: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let leaf = dir.path().join("leaf.pem");
    std::fs::write(&leaf, leaf_pem).expect("write leaf");
    let output = Command::new("openssl")
        .args(["verify", "-x509_strict", "-purpose", purpose, "-CAfile"])
        .arg(&ca.cert_path)
        .arg(&leaf)
        .output()
        .expect("openssl");
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A CA made with rcgen in memory (PKCS#8): for benchmarks, where process spawning is noise.
pub fn rcgen_ca(algorithm: &'static rcgen::SignatureAlgorithm) -> (String, String) {
    let key = if algorithm == &rcgen::PKCS_RSA_SHA256 {
        rcgen::KeyPair::generate_rsa_for(algorithm, rcgen::RsaKeySize::_2048)
    } else {
        rcgen::KeyPair::generate_for(algorithm)
    }
    .expect("CA key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, "kubernetes");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(3650);
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), key.serialize_pem())
}

/// An rcgen issuer for `ca`.
pub fn issuer(ca: &TestCa) -> rcgen::Issuer<'static, rcgen::KeyPair> {
    let ca_key = rcgen::KeyPair::from_pem(std::str::from_utf8(&ca.key_pem).expect("PEM")).expect("CA key");
    rcgen::Issuer::from_ca_cert_pem(std::str::from_utf8(&ca.cert_pem).expect("PEM"), ca_key).expect("CA")
}

/// A kubelet client certificate for `node` with `provider_id`, for the key `key_pem`, valid
/// from `not_before` to `not_after`, signed by `ca`: what the signer would issue, with dates of
/// the caller's choosing (one already due for renewal, say).
pub fn node_certificate(
    ca: &TestCa,
    key_pem: &str,
    node: &str,
    provider_id: &str,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> String {
    let key = rcgen::KeyPair::from_pem(key_pem).expect("node key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, attestation::names::GROUP_NODES);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.custom_extensions.push(rcgen::CustomExtension::from_oid_content(
        attestation::names::PROVIDER_ID_OID,
        attestation::identity::ProviderId::new(provider_id)
            .expect("provider ID")
            .to_extension_value(),
    ));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    params.signed_by(&key, &issuer(ca)).expect("node certificate").pem()
}

/// Makes the certificate behind `cert_dir`'s `kubelet-client-current.pem` link due for
/// rotation: a certificate for the same key, 10 hours old with 10 minutes left (past 50-55% of
/// its life), written beside it and linked as current. Returns the new certificate's PEM.
pub fn make_due_for_rotation(ca: &TestCa, cert_dir: &Path, node: &str, provider_id: &str) -> String {
    let current = cert_dir.join("kubelet-client-current.pem");
    let text = std::fs::read_to_string(&current).expect("the current certificate");
    let key_pem = pem::parse_many(text.as_bytes())
        .expect("PEM")
        .into_iter()
        .find(|b| b.tag().contains("PRIVATE KEY"))
        .map(|b| pem::encode(&b))
        .expect("a key beside the certificate");
    let now = time::OffsetDateTime::now_utc();
    let aging = node_certificate(
        ca,
        &key_pem,
        node,
        provider_id,
        now - time::Duration::hours(10),
        now + time::Duration::minutes(10),
    );
    std::fs::write(cert_dir.join("kubelet-client-aged.pem"), format!("{aging}{key_pem}")).expect("write");
    std::fs::remove_file(&current).expect("unlink current");
    std::os::unix::fs::symlink("kubelet-client-aged.pem", &current).expect("link current");
    aging
}
