//! Certificates issued from approved CSRs, with CAs in every key format Cluster API may use,
//! checked by `openssl verify` and parsed back: nothing from the request but the subject and
//! the provider-ID extension, validity clamped to the CA.

#![allow(clippy::unwrap_used)]

use attestation::ca::{CaError, ClusterCa, Validity};
use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;
use attestation::request::KeyAlgorithm;
use rcgen::{CustomExtension, SanType};
use tests::ca::{CaKeyFormat, TestCa, openssl_ca, openssl_verify};
use tests::csr::RequestSpec;
use tests::strict_der::{BASIC_CONSTRAINTS, assert_strict_der, extension};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::{FromDer, X509Certificate};

const PID: &str = "aws:///us-east-1a/i-0abc";

fn parsed(spec: &RequestSpec) -> ParsedCsr {
    let envelope = RequestEnvelope::parse(&spec.build()).unwrap();
    ParsedCsr::from_der(&envelope.csr_der).unwrap()
}

fn load(ca: &TestCa) -> ClusterCa {
    ClusterCa::from_pem(&ca.cert_pem, &ca.key_pem).unwrap_or_else(|e| panic!("load CA: {e}"))
}

fn validity() -> Validity {
    Validity {
        now: OffsetDateTime::now_utc(),
        requested_seconds: None,
        max: Duration::hours(168),
    }
}

#[test]
fn every_ca_key_format_issues_certificates_openssl_accepts() {
    for format in CaKeyFormat::ALL {
        let test_ca = openssl_ca(format, 3650);
        let ca = load(&test_ca);
        for key in [
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
            KeyAlgorithm::Rsa2048,
            KeyAlgorithm::Ed25519,
        ] {
            let mut spec = RequestSpec::kubelet("worker-0", PID);
            spec.key = key;
            let issued = ca
                .issue(&parsed(&spec), &ProviderId::new(PID).unwrap(), validity())
                .unwrap();
            openssl_verify(&test_ca, &issued.pem(), "sslclient")
                .unwrap_or_else(|e| panic!("{format:?} CA, {key:?} leaf: {e}"));
            assert!(
                openssl_verify(&test_ca, &issued.pem(), "sslserver").is_err(),
                "{format:?}/{key:?}: a client certificate must not serve TLS"
            );
        }
    }
}

#[test]
fn every_issued_certificate_is_strict_der_with_ca_false_as_an_empty_critical_sequence() {
    for format in CaKeyFormat::ALL {
        let ca = load(&openssl_ca(format, 3650));
        for key in [
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
            KeyAlgorithm::Rsa2048,
            KeyAlgorithm::Ed25519,
        ] {
            let mut spec = RequestSpec::kubelet("worker-0", PID);
            spec.key = key;
            let issued = ca
                .issue(&parsed(&spec), &ProviderId::new(PID).unwrap(), validity())
                .unwrap();
            let what = format!("{format:?} CA, {key:?} leaf");
            // `cA FALSE` written out is BER, not DER: Python cryptography 48 refuses it.
            assert_eq!(
                extension(&issued.der, BASIC_CONSTRAINTS),
                Some((true, vec![0x30, 0x00])),
                "{what}: BasicConstraints is critical and an empty SEQUENCE"
            );
            assert_strict_der(&what, &issued.der);
        }
    }
}

#[test]
fn an_issued_certificate_carries_exactly_what_the_spec_lists() {
    let test_ca = openssl_ca(CaKeyFormat::RsaPkcs1, 3650);
    let ca = load(&test_ca);
    for key in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
        let mut spec = RequestSpec::kubelet("worker-0", PID);
        spec.key = key;
        let csr = parsed(&spec);
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let issued = ca
            .issue(
                &csr,
                &ProviderId::new(PID).unwrap(),
                Validity {
                    now,
                    requested_seconds: Some(3600),
                    max: Duration::hours(168),
                },
            )
            .unwrap();
        assert_strict_der(&format!("{key:?} leaf"), &issued.der);
        let (rest, cert) = X509Certificate::from_der(&issued.der).unwrap();
        assert!(rest.is_empty());

        assert_eq!(cert.subject().to_string(), "O=system:nodes, CN=system:node:worker-0");
        assert_eq!(
            cert.public_key().raw,
            csr.spki_der.as_slice(),
            "the SPKI is the request's, byte for byte"
        );
        assert!(cert.raw_serial().len() >= 16, "serial of at least 128 bits");
        assert_eq!(
            cert.validity().not_before.timestamp(),
            (now - Duration::minutes(5)).unix_timestamp()
        );
        assert_eq!(
            cert.validity().not_after.timestamp(),
            (now + Duration::hours(1)).unix_timestamp(),
            "expirationSeconds honoured"
        );

        let mut oids: Vec<String> = cert.extensions().iter().map(|e| e.oid.to_id_string()).collect();
        oids.sort();
        assert_eq!(
            oids,
            [
                "1.3.6.1.4.1.11129.2.1.21",
                "2.5.29.14",
                "2.5.29.15",
                "2.5.29.19",
                "2.5.29.35",
                "2.5.29.37"
            ],
            "{key:?}"
        );
        for ext in cert.extensions() {
            match ext.parsed_extension() {
                ParsedExtension::BasicConstraints(bc) => assert!(!bc.ca && ext.critical),
                ParsedExtension::SubjectKeyIdentifier(ski) => assert_eq!(ski.0.len(), 20, "{key:?}: SKI"),
                ParsedExtension::KeyUsage(ku) => {
                    assert!(ku.digital_signature());
                    assert_eq!(ku.key_encipherment(), key == KeyAlgorithm::Rsa2048);
                    assert!(!ku.key_cert_sign());
                }
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    assert!(eku.client_auth && !eku.server_auth && eku.other.is_empty())
                }
                ParsedExtension::AuthorityKeyIdentifier(aki) => {
                    let ca_cert = X509Certificate::from_der(ca.certificate_der()).unwrap().1;
                    let ca_ski = ca_cert.extensions().iter().find_map(|e| match e.parsed_extension() {
                        ParsedExtension::SubjectKeyIdentifier(ski) => Some(ski.0.to_vec()),
                        _ => None,
                    });
                    assert_eq!(
                        aki.key_identifier.as_ref().map(|k| k.0.to_vec()),
                        ca_ski,
                        "AKI is the CA's SKI"
                    );
                }
                _ => {}
            }
            if ext.oid.to_id_string() == "1.3.6.1.4.1.11129.2.1.21" {
                assert!(!ext.critical);
                assert_eq!(ProviderId::from_extension_value(ext.value).unwrap().as_str(), PID);
            }
        }
    }
}

#[test]
fn nothing_else_from_the_request_reaches_the_certificate() {
    let test_ca = openssl_ca(CaKeyFormat::EcP256Sec1, 3650);
    let ca = load(&test_ca);
    let mut spec = RequestSpec::kubelet("worker-0", PID);
    spec.sans = vec![SanType::DnsName("kubernetes.default".try_into().unwrap())];
    spec.extra_extensions = vec![CustomExtension::from_oid_content(
        &[2, 5, 29, 19],
        vec![0x30, 0x03, 0x01, 0x01, 0xff],
    )];
    let issued = ca
        .issue(&parsed(&spec), &ProviderId::new(PID).unwrap(), validity())
        .unwrap();
    assert_strict_der("a leaf from a request asking for a SAN and CA:true", &issued.der);
    let cert = X509Certificate::from_der(&issued.der).unwrap().1;
    assert!(cert.subject_alternative_name().unwrap().is_none(), "no SAN");
    assert!(!cert.is_ca());
}

#[test]
fn validity_is_clamped_to_the_ca_and_to_the_maximum() {
    let test_ca = openssl_ca(CaKeyFormat::RsaPkcs8, 1);
    let ca = load(&test_ca);
    let csr = parsed(&RequestSpec::kubelet("worker-0", PID));
    let pid = ProviderId::new(PID).unwrap();
    let issued = ca.issue(&csr, &pid, validity()).unwrap();
    assert_eq!(issued.not_after, ca.not_after(), "a one-day CA caps a 168h certificate");
    assert_strict_der("a leaf capped by its CA", &issued.der);

    let long_ca = load(&openssl_ca(CaKeyFormat::EcP256Pkcs8, 3650));
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let asked_too_much = Validity {
        now,
        requested_seconds: Some(86_400 * 365),
        max: Duration::hours(168),
    };
    assert_eq!(
        long_ca.issue(&csr, &pid, asked_too_much).unwrap().not_after,
        now + Duration::hours(168)
    );

    let expired = Validity {
        now: ca.not_after() + Duration::seconds(1),
        ..validity()
    };
    assert!(ca.issue(&csr, &pid, expired).is_err(), "an expired CA signs nothing");
}

#[test]
fn a_ca_key_must_match_its_certificate_and_be_a_ca() {
    let a = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let b = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    assert_eq!(
        ClusterCa::from_pem(&a.cert_pem, &b.key_pem).unwrap_err(),
        CaError::KeyMismatch
    );
    let ec = openssl_ca(CaKeyFormat::EcP256Sec1, 30);
    assert_eq!(
        ClusterCa::from_pem(&a.cert_pem, &ec.key_pem).unwrap_err(),
        CaError::KeyMismatch
    );
    assert!(matches!(
        ClusterCa::from_pem(b"junk", &a.key_pem),
        Err(CaError::CertificatePem { .. })
    ));
    assert_eq!(ClusterCa::from_pem(&a.cert_pem, b"junk").unwrap_err(), CaError::KeyPem);
    assert_eq!(
        ClusterCa::from_pem(&a.cert_pem, &a.cert_pem).unwrap_err(),
        CaError::KeyPem
    );

    // A leaf certificate is not a CA.
    let leaf = load(&a)
        .issue(
            &parsed(&RequestSpec::kubelet("worker-0", PID)),
            &ProviderId::new(PID).unwrap(),
            validity(),
        )
        .unwrap();
    let key = tests::csr::key(KeyAlgorithm::EcdsaP256).private_key_pem();
    assert!(matches!(
        ClusterCa::from_pem(leaf.pem().as_bytes(), key.as_bytes()),
        Err(CaError::NotACa { .. })
    ));
}

#[test]
fn the_ca_key_never_shows_in_debug_output() {
    let test_ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    let ca = load(&test_ca);
    let shown = format!("{ca:?}");
    assert!(shown.contains("redacted") && !shown.contains("PRIVATE"), "{shown}");
}

#[test]
fn two_clusters_sharing_a_ca_are_recognisable() {
    let test_ca = openssl_ca(CaKeyFormat::RsaPkcs1, 30);
    assert_eq!(load(&test_ca).fingerprint(), load(&test_ca).fingerprint());
    assert_ne!(
        load(&test_ca).fingerprint(),
        load(&openssl_ca(CaKeyFormat::RsaPkcs1, 30)).fingerprint()
    );
    // Compared without the key, as for Clusters another replica serves.
    assert_eq!(
        ClusterCa::certificate_fingerprint(&test_ca.cert_pem).unwrap(),
        load(&test_ca).fingerprint()
    );
    assert!(
        ClusterCa::certificate_fingerprint(&test_ca.key_pem).is_err(),
        "a key is no certificate"
    );
}

#[test]
fn a_ca_certificate_without_key_cert_sign_is_refused() {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not-a-signing-ca");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).unwrap();
    assert!(matches!(
        ClusterCa::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes()),
        Err(CaError::NotACa { .. })
    ));
}

#[test]
fn the_signers_own_identity_is_a_strict_client_certificate_for_its_user_only() {
    for format in CaKeyFormat::ALL {
        let test_ca = openssl_ca(format, 3650);
        let ca = load(&test_ca);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let issued = ca
            .issue_own_identity(&key, "node-attestation-signer", now, Duration::hours(1))
            .unwrap();
        assert_strict_der(&format!("{format:?} own identity"), &issued.der);
        openssl_verify(&test_ca, &issued.pem(), "sslclient").unwrap_or_else(|e| panic!("{format:?}: {e}"));
        assert!(openssl_verify(&test_ca, &issued.pem(), "sslserver").is_err());
        let (_, cert) = X509Certificate::from_der(&issued.der).unwrap();
        assert_eq!(
            cert.subject().to_string(),
            "CN=node-attestation-signer",
            "the user, in no group (no O)"
        );
        assert_eq!(
            cert.public_key().raw,
            rcgen::PublicKeyData::subject_public_key_info(&key).as_slice()
        );
        assert_eq!(
            cert.validity().not_before.timestamp(),
            (now - Duration::minutes(5)).unix_timestamp()
        );
        assert_eq!(issued.not_after, now + Duration::hours(1));
        let mut oids: Vec<String> = cert.extensions().iter().map(|e| e.oid.to_id_string()).collect();
        oids.sort();
        assert_eq!(
            oids,
            ["2.5.29.14", "2.5.29.15", "2.5.29.19", "2.5.29.35", "2.5.29.37"],
            "no provider ID, nothing but a client certificate's extensions"
        );
    }
}

#[test]
fn the_signers_own_identity_never_outlives_the_ca() {
    let test_ca = openssl_ca(CaKeyFormat::RsaPkcs1, 1);
    let ca = load(&test_ca);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let now = OffsetDateTime::now_utc();
    let issued = ca
        .issue_own_identity(&key, "node-attestation-signer", now, Duration::days(30))
        .unwrap();
    assert_eq!(issued.not_after, ca.not_after(), "clamped to the CA");
    assert!(matches!(
        ca.issue_own_identity(
            &key,
            "node-attestation-signer",
            now + Duration::days(2),
            Duration::hours(1)
        ),
        Err(attestation::ca::IssueError::CaExpired { .. })
    ));
}
