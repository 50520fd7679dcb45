//! `gcp/v1` and `aws/v1` end to end through the rule engine, with real cryptography: the node
//! side's attestors build the CSR (the audience or the SigV4 header binding its key), Google's
//! tokens are minted with test RSA keys, AWS's documents are PKCS#7 signed by a test CA given
//! as a region's certificate, and each case bends one thing an attacker controls. STS itself
//! is a stand-in here (the answer it would give); the cluster suite runs moto's real STS.

#![allow(clippy::unwrap_used, clippy::type_complexity)]

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use attestation::attestor::{AttestError, Attestor, Verifiers};
use attestation::aws::attestor::{AwsAttestor, Ec2Metadata, RoleCredentials};
use attestation::aws::{AwsData, AwsVerifier, CallerIdentity, RegionCertificates, StsAnswer, StsCall, StsEndpoints};
use attestation::cloud::CloudCall;
use attestation::decision::{DenyReason, Outcome};
use attestation::gcp::attestor::{GceMetadata, GcpAttestor};
use attestation::gcp::{GcpData, GcpVerifier, Jwks, KeyLookup};
use attestation::identity::{NodeName, ProviderId};
use attestation::machine::ClusterView;
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
use attestation::{CsrObject, Decision};
use serde_json::{Value, json};
use tests::capi;
use tests::cloud::{AwsIdentityCa, GceInstance, GoogleSigner, document, rsa2048_body};
use tests::csr::client_csr_object;
use time::{Duration, OffsetDateTime};

const ACCOUNT: &str = "123456789012";
const INSTANCE_ID: &str = "i-0123456789abcdef0";

/// The suite's clock: one instant at noon, never the machine's. SigV4 scopes a signature to
/// the day of its `x-amz-date`, so a case that moves a request by half an hour failed between
/// 00:00 and 00:30 UTC on the wall clock (the refusal named the scope's date, not the age).
const NOON: OffsetDateTime = time::macros::datetime!(2026-06-15 12:00:00 UTC);

fn now() -> OffsetDateTime {
    NOON
}

/// [`NOON`] as the node's attestors read their clock.
fn noon() -> SystemTime {
    SystemTime::from(NOON)
}

/// Files a CSR for worker-0 / `pid` through `attestor` and decides it.
fn decide(
    attestor: &mut dyn Attestor,
    pid: &str,
    verifiers: &Verifiers,
    cluster: &ClusterView,
    at: OffsetDateTime,
) -> Decision {
    let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let params = kubelet_client_params(&NodeName::new("worker-0").unwrap(), &ProviderId::new(pid).unwrap());
    let envelope = build_envelope(&params, &key, attestor, None).unwrap();
    decide_request(
        envelope.encode().into_bytes(),
        attestor.signer_name(),
        pid,
        verifiers,
        cluster,
        at,
    )
}

fn decide_request(
    request: Vec<u8>,
    signer: &str,
    pid: &str,
    verifiers: &Verifiers,
    cluster: &ClusterView,
    at: OffsetDateTime,
) -> Decision {
    let mut csr: CsrObject = client_csr_object(request, "abcdef");
    csr.signer_name = signer.into();
    csr.created = Some(at);
    let mut world = tests::worker0::Worker0::with_provider_id("", pid);
    world.cluster = cluster.clone();
    world.decide_with(&csr, at, verifiers)
}

fn denial(decision: &Decision) -> (DenyReason, String) {
    match &decision.outcome {
        Outcome::Denied { reason, message } => (*reason, message.clone()),
        other => panic!("not denied: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// gcp/v1
// ---------------------------------------------------------------------------------------------

/// A metadata server whose tokens `mint` makes from the audience asked for.
struct Mint<F: FnMut(&str) -> String>(F);

impl<F: FnMut(&str) -> String> GceMetadata for Mint<F> {
    fn identity_token(&mut self, audience: &str) -> Result<String, AttestError> {
        Ok((self.0)(audience))
    }
}

struct Gcp {
    signer: GoogleSigner,
    instance: GceInstance,
}

impl Gcp {
    fn new() -> Self {
        Self {
            signer: GoogleSigner::new(),
            instance: GceInstance::new("team-a-prod", "europe-west1-b", "4473882541632117237", "worker-0"),
        }
    }

    fn verifiers(&self) -> Verifiers {
        let keys = Jwks::parse(self.signer.jwks().as_bytes()).unwrap();
        Verifiers::new().with(GcpVerifier::new(Arc::new(keys)))
    }

    fn cluster() -> ClusterView {
        ClusterView::from_object(&capi::cluster("gcp")).unwrap()
    }

    /// Decides a CSR whose token's claims `edit` bends (given the honest claims).
    fn with_claims(&self, edit: impl Fn(&mut Value)) -> Decision {
        let kid = self.signer.current_kid();
        let mut attestor = GcpAttestor::new(Mint(|audience: &str| {
            let mut claims = self.instance.claims(audience, now().unix_timestamp());
            edit(&mut claims);
            self.signer.token(&kid, claims)
        }));
        decide(
            &mut attestor,
            &self.instance.provider_id(),
            &self.verifiers(),
            &Self::cluster(),
            now(),
        )
    }

    /// Decides a CSR carrying the token `make` returns for the right audience.
    fn with_token(&self, make: impl Fn(&str) -> String) -> Decision {
        let mut attestor = GcpAttestor::new(Mint(|audience: &str| make(audience)));
        decide(
            &mut attestor,
            &self.instance.provider_id(),
            &self.verifiers(),
            &Self::cluster(),
            now(),
        )
    }
}

#[test]
fn gcp_an_honest_token_is_approved_and_the_claim_records_the_instance() {
    let gcp = Gcp::new();
    let decision = gcp.with_claims(|_| {});
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    let claim = decision.claim.unwrap();
    assert_eq!(
        claim.record.instance.as_deref(),
        Some("gcp:team-a-prod/4473882541632117237")
    );
}

#[test]
fn gcp_forged_algorithms_and_keys_are_refused_before_any_claim_is_read() {
    let gcp = Gcp::new();
    let kid = gcp.signer.current_kid();
    let cases: Vec<(&str, Box<dyn Fn(&str) -> String>)> = vec![
        (
            "alg is \"none\"",
            Box::new(|aud| {
                GoogleSigner::token_with_header(
                    json!({"alg": "none", "kid": kid}),
                    gcp.instance.claims(aud, now().unix_timestamp()),
                    b"",
                )
            }),
        ),
        (
            "alg is \"HS256\"",
            Box::new(|aud| {
                gcp.signer
                    .hs256_with_rsa_public_key(&kid, gcp.instance.claims(aud, now().unix_timestamp()))
            }),
        ),
        (
            "not among Google's keys",
            Box::new(|aud| {
                GoogleSigner::token_with_header(
                    json!({"alg": "RS256", "kid": "unknown-kid", "typ": "JWT"}),
                    gcp.instance.claims(aud, now().unix_timestamp()),
                    b"sig",
                )
            }),
        ),
        (
            "signature does not verify",
            Box::new(|aud| {
                // Signed by a key of ours under Google's kid.
                let ours = GoogleSigner::new();
                let token = ours.token(&ours.current_kid(), gcp.instance.claims(aud, now().unix_timestamp()));
                let (_, rest) = token.split_once('.').unwrap();
                let header = tests_b64(&json!({"alg": "RS256", "kid": kid, "typ": "JWT"}).to_string());
                format!("{header}.{rest}")
            }),
        ),
    ];
    for (expected, make) in cases {
        let (reason, message) = denial(&gcp.with_token(make));
        assert_eq!(reason, DenyReason::AttestationInvalid, "{expected}: {message}");
        assert!(
            message.contains("gcp/v1 signature") && message.contains(expected),
            "{expected}: {message}"
        );
    }
}

fn tests_b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[test]
fn gcp_every_claim_is_checked_and_the_message_names_it() {
    let gcp = Gcp::new();
    let t = now().unix_timestamp();
    let cases: Vec<(&str, Box<dyn Fn(&mut Value)>)> = vec![
        ("issuer", Box::new(|c| c["iss"] = json!("https://evil.example"))),
        (
            "audience/binding",
            Box::new(|c| c["aud"] = json!("node-attestation.cluster.x-k8s.io/another-key")),
        ),
        (
            "audience/binding",
            Box::new(|c| c["aud"] = json!("https://example.com")),
        ),
        (
            "age: the token expired",
            Box::new(move |c| {
                c["iat"] = json!(t - 7200);
                c["exp"] = json!(t - 3600);
            }),
        ),
        ("age: the token's iat", Box::new(move |c| c["iat"] = json!(t - 900))),
        ("age: the token's iat", Box::new(move |c| c["iat"] = json!(t + 600))),
        (
            "age: the token is not valid before",
            Box::new(move |c| c["nbf"] = json!(t + 600)),
        ),
        (
            "provider ID",
            Box::new(|c| c["google"]["compute_engine"]["project_id"] = json!("other-project")),
        ),
        (
            "provider ID",
            Box::new(|c| c["google"]["compute_engine"]["zone"] = json!("us-central1-a")),
        ),
        (
            "provider ID",
            Box::new(|c| c["google"]["compute_engine"]["instance_name"] = json!("worker-1")),
        ),
        (
            "provider ID: the token names no Compute Engine instance",
            Box::new(|c| drop(c.as_object_mut().unwrap().remove("google"))),
        ),
        (
            "claims do not decode",
            Box::new(|c| c["aud"] = json!([c["aud"].clone()])),
        ),
    ];
    for (expected, edit) in cases {
        let (reason, message) = denial(&gcp.with_claims(edit));
        assert_eq!(reason, DenyReason::AttestationInvalid, "{expected}: {message}");
        assert!(message.contains(expected), "{expected}: {message}");
    }
}

#[test]
fn gcp_a_token_copied_from_another_csr_is_useless_with_this_key() {
    let gcp = Gcp::new();
    let stolen = gcp.signer.token(
        &gcp.signer.current_kid(),
        gcp.instance.claims(
            &attestation::gcp::audience(b"the node's real key"),
            now().unix_timestamp(),
        ),
    );
    let (reason, message) = denial(&gcp.with_token(|_| stolen.clone()));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("audience/binding"), "{message}");
}

#[test]
fn gcp_the_project_allow_list_narrows_who_may_attest() {
    let gcp = Gcp::new();
    let kid = gcp.signer.current_kid();
    let mut attestor = GcpAttestor::new(Mint(|aud: &str| {
        gcp.signer.token(&kid, gcp.instance.claims(aud, now().unix_timestamp()))
    }));
    let listed = Gcp::cluster().with_annotation(attestation::names::ANNOTATION_GCP_PROJECTS, "team-b, team-a-prod");
    let decision = decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &gcp.verifiers(),
        &listed,
        now(),
    );
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    let other = Gcp::cluster().with_annotation(attestation::names::ANNOTATION_GCP_PROJECTS, "team-b");
    let (reason, message) = denial(&decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &gcp.verifiers(),
        &other,
        now(),
    ));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("project"), "{message}");
}

/// Google's keys as a fetching cache sees them: a set fetched at some time.
struct FetchedAt(Jwks, OffsetDateTime);

impl attestation::gcp::GoogleKeys for FetchedAt {
    fn key(&self, kid: &str) -> KeyLookup {
        match self.0.get(kid) {
            Some(key) => KeyLookup::Found(key.clone()),
            None => KeyLookup::Unknown {
                fetched_at: Some(self.1),
            },
        }
    }
}

#[test]
fn gcp_a_rotated_key_makes_the_signer_fetch_again_then_an_unknown_one_is_refused() {
    let mut gcp = Gcp::new();
    let old_keys = Jwks::parse(gcp.signer.jwks().as_bytes()).unwrap();
    let new_kid = gcp.signer.rotate();
    let mut attestor = GcpAttestor::new(Mint(|aud: &str| {
        gcp.signer
            .token(&new_kid, gcp.instance.claims(aud, now().unix_timestamp()))
    }));
    // Keys fetched before the CSR: fetch again (no denial).
    let stale = Verifiers::new().with(GcpVerifier::new(Arc::new(FetchedAt(
        old_keys.clone(),
        now() - Duration::minutes(5),
    ))));
    let decision = decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &stale,
        &Gcp::cluster(),
        now(),
    );
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:?}");
    assert_eq!(decision.cloud_calls, [CloudCall::RefreshGoogleKeys]);
    // The apiserver's clock 10 minutes ahead of the signer's: the CSR's creationTimestamp lies
    // in the signer's future, but keys fetched after the signer first saw the CSR still
    // postdate it, so the unknown key is refused, not retried until the CSR expires.
    let ahead = Verifiers::new().with(GcpVerifier::new(Arc::new(FetchedAt(
        old_keys.clone(),
        now() + Duration::seconds(2),
    ))));
    let key = NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let params = kubelet_client_params(
        &NodeName::new("worker-0").unwrap(),
        &ProviderId::new(&gcp.instance.provider_id()).unwrap(),
    );
    let envelope = build_envelope(&params, &key, &mut attestor, None).unwrap();
    let mut csr: CsrObject = client_csr_object(envelope.encode().into_bytes(), "abcdef");
    csr.signer_name = attestation::names::SIGNER_GCP.into();
    csr.created = Some(now() + Duration::minutes(10));
    let mut world = tests::worker0::Worker0::with_provider_id("", &gcp.instance.provider_id());
    world.cluster = Gcp::cluster();
    let (reason, message) = denial(&world.decide_with(&csr, now(), &ahead));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("after the CSR was filed"), "{message}");
    // Keys fetched after the CSR and still without the kid: refused.
    let fresh = Verifiers::new().with(GcpVerifier::new(Arc::new(FetchedAt(
        old_keys,
        now() + Duration::minutes(1),
    ))));
    let (reason, message) = denial(&decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &fresh,
        &Gcp::cluster(),
        now(),
    ));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("after the CSR was filed"), "{message}");
}

#[test]
fn gcp_keys_not_loaded_yet_hold_the_csr_and_ask_for_them() {
    struct NotLoaded;
    impl attestation::gcp::GoogleKeys for NotLoaded {
        fn key(&self, _kid: &str) -> KeyLookup {
            KeyLookup::NotLoaded {
                why: Some("connection refused".into()),
            }
        }
    }
    let gcp = Gcp::new();
    let kid = gcp.signer.current_kid();
    let mut attestor = GcpAttestor::new(Mint(|aud: &str| {
        gcp.signer.token(&kid, gcp.instance.claims(aud, now().unix_timestamp()))
    }));
    let verifiers = Verifiers::new().with(GcpVerifier::new(Arc::new(NotLoaded)));
    let decision = decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &verifiers,
        &Gcp::cluster(),
        now(),
    );
    assert!(
        matches!(&decision.outcome, Outcome::Retry { message } if message.contains("connection refused")),
        "{decision:?}"
    );
    assert_eq!(decision.cloud_calls, [CloudCall::RefreshGoogleKeys]);
}

#[test]
fn gcp_malformed_data_blocks_are_refused() {
    let gcp = Gcp::new();
    for data in [
        &b"{}"[..],
        br#"{"identityToken":"a.b.c","extra":1}"#,
        b"not json",
        br#"{"identityToken":"a.b"}"#,
    ] {
        let mut spec = tests::csr::RequestSpec::kubelet("worker-0", &gcp.instance.provider_id());
        spec.provider = Some("gcp/v1".into());
        spec.data = Some(data.to_vec());
        let decision = decide_request(
            spec.build(),
            attestation::names::SIGNER_GCP,
            &gcp.instance.provider_id(),
            &gcp.verifiers(),
            &Gcp::cluster(),
            now(),
        );
        assert_eq!(
            denial(&decision).0,
            DenyReason::AttestationInvalid,
            "{}",
            String::from_utf8_lossy(data)
        );
    }
    let _ = GcpData::parse(b"{}").unwrap_err();
}

// ---------------------------------------------------------------------------------------------
// aws/v1
// ---------------------------------------------------------------------------------------------

/// IMDS as the node sees it: a signed document and the role's credentials.
struct Imds {
    rsa2048: String,
}

impl Ec2Metadata for Imds {
    fn identity_rsa2048(&mut self) -> Result<String, AttestError> {
        Ok(self.rsa2048.clone())
    }
    fn role_credentials(&mut self) -> Result<RoleCredentials, AttestError> {
        Ok(RoleCredentials {
            access_key_id: "ASIATESTTESTTESTTEST".into(),
            secret_access_key: zeroize::Zeroizing::new("secret".into()),
            session_token: zeroize::Zeroizing::new("session".into()),
        })
    }
}

/// STS as a stand-in: the ARN it names, recording what it was asked.
#[derive(Default)]
struct Sts {
    answer: Mutex<Option<StsAnswer>>,
    asked: Mutex<Vec<StsCall>>,
}

impl CallerIdentity for Sts {
    fn answer(&self, call: &StsCall) -> StsAnswer {
        self.asked.lock().unwrap().push(call.clone());
        self.answer.lock().unwrap().clone().unwrap_or(StsAnswer::NotAsked)
    }
}

struct Aws {
    ca: AwsIdentityCa,
    sts: Arc<Sts>,
}

const PID_AWS: &str = "aws:///us-east-1a/i-0123456789abcdef0";

impl Aws {
    fn new() -> Self {
        let sts = Arc::new(Sts::default());
        *sts.answer.lock().unwrap() = Some(StsAnswer::Caller {
            arn: format!("arn:aws:sts::{ACCOUNT}:assumed-role/node-role/{INSTANCE_ID}"),
        });
        Self {
            ca: AwsIdentityCa::new(),
            sts,
        }
    }

    fn verifiers(&self) -> Verifiers {
        let certificates = RegionCertificates::from_pem(&self.ca.regions_pem(&["us-east-1", "us-east-2"])).unwrap();
        Verifiers::new().with(AwsVerifier::new(self.sts.clone()).with_certificates(certificates))
    }

    fn attestor(&self, doc: &[u8]) -> AwsAttestor<Imds> {
        AwsAttestor::new(
            Imds {
                rsa2048: rsa2048_body(&self.ca.sign_document(doc)),
            },
            StsEndpoints::regional(),
        )
        .with_clock(noon)
    }

    fn honest_document() -> Vec<u8> {
        document(ACCOUNT, INSTANCE_ID, "us-east-1", "us-east-1a")
    }

    fn decide_with(&self, attestor: &mut dyn Attestor, cluster: &ClusterView) -> Decision {
        decide(attestor, PID_AWS, &self.verifiers(), cluster, now())
    }

    fn decide(&self, attestor: &mut dyn Attestor) -> Decision {
        self.decide_with(attestor, &ClusterView::from_object(&capi::cluster("aws")).unwrap())
    }

    /// Decides a CSR whose DATA block `edit` bends after the node built it honestly.
    fn tampered(&self, edit: impl Fn(&mut AwsData)) -> Decision {
        struct Bent<'a, F: Fn(&mut AwsData)>(&'a mut AwsAttestor<Imds>, F);
        impl<F: Fn(&mut AwsData)> Attestor for Bent<'_, F> {
            fn provider_version(&self) -> attestation::envelope::ProviderVersion {
                self.0.provider_version()
            }
            fn signer_name(&self) -> &'static str {
                self.0.signer_name()
            }
            fn attest(
                &mut self,
                request: &attestation::attestor::AttestationRequest<'_>,
            ) -> Result<Option<Vec<u8>>, AttestError> {
                let data = self.0.attest(request)?.unwrap();
                let mut data = AwsData::parse(&data).unwrap();
                (self.1)(&mut data);
                Ok(Some(data.to_bytes()))
            }
        }
        let mut honest = self.attestor(&Self::honest_document());
        self.decide(&mut Bent(&mut honest, edit))
    }
}

#[test]
fn aws_an_honest_node_is_approved_and_sts_is_asked_at_the_signers_endpoint() {
    let aws = Aws::new();
    let decision = aws.decide(&mut aws.attestor(&Aws::honest_document()));
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    assert_eq!(
        decision.claim.unwrap().record.instance.as_deref(),
        Some("aws:123456789012/i-0123456789abcdef0")
    );
    let asked = aws.sts.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].url, "https://sts.us-east-1.amazonaws.com/");
    assert_eq!(asked[0].body, b"Action=GetCallerIdentity&Version=2011-06-15");
}

#[test]
fn aws_the_first_decision_asks_the_controller_to_call_sts() {
    let aws = Aws::new();
    *aws.sts.answer.lock().unwrap() = None;
    let decision = aws.decide(&mut aws.attestor(&Aws::honest_document()));
    assert!(matches!(decision.outcome, Outcome::Retry { .. }), "{decision:?}");
    assert!(matches!(decision.cloud_calls.as_slice(), [CloudCall::CallerIdentity(call)] if call.region == "us-east-1"));
}

#[test]
fn aws_documents_of_another_region_ca_or_instance_are_refused() {
    let aws = Aws::new();
    // Signed by a key of ours (AWS's shipped certificates).
    let shipped = Verifiers::new().with(AwsVerifier::new(aws.sts.clone()));
    let (reason, message) = denial(&decide(
        &mut aws.attestor(&Aws::honest_document()),
        PID_AWS,
        &shipped,
        &ClusterView::from_object(&capi::cluster("aws")).unwrap(),
        now(),
    ));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("aws/v1 signature"), "{message}");
    // A region the certificates do not cover.
    let elsewhere = document(ACCOUNT, INSTANCE_ID, "eu-west-1", "us-east-1a");
    let (_, message) = denial(&aws.decide(&mut aws.attestor(&elsewhere)));
    assert!(message.contains("no AWS certificate for region eu-west-1"), "{message}");
    // Another instance's document.
    let other = document(ACCOUNT, "i-0fedcba9876543210", "us-east-1", "us-east-1a");
    let (_, message) = denial(&aws.decide(&mut aws.attestor(&other)));
    assert!(message.contains("provider ID"), "{message}");
    // Signed by another region's certificate: us-east-2's CA key is another test CA.
    let other_ca = AwsIdentityCa::new();
    let mut attestor = AwsAttestor::new(
        Imds {
            rsa2048: rsa2048_body(&other_ca.sign_document(&Aws::honest_document())),
        },
        StsEndpoints::regional(),
    )
    .with_clock(noon);
    let mut pem = aws.ca.regions_pem(&["us-east-2"]);
    pem.push_str(&other_ca.regions_pem(&["eu-west-1"]));
    let two = Verifiers::new()
        .with(AwsVerifier::new(aws.sts.clone()).with_certificates(RegionCertificates::from_pem(&pem).unwrap()));
    let (_, message) = denial(&decide(
        &mut attestor,
        PID_AWS,
        &two,
        &ClusterView::from_object(&capi::cluster("aws")).unwrap(),
        now(),
    ));
    assert!(message.contains("no AWS certificate for region us-east-1"), "{message}");
}

#[test]
fn aws_every_tampering_of_the_signed_request_is_refused_before_sts_is_asked() {
    use base64::Engine as _;
    let cases: Vec<(&str, Box<dyn Fn(&mut AwsData)>)> = vec![
        (
            "binding",
            Box::new(|d| {
                drop(
                    d.sts
                        .headers
                        .insert("x-kubelet-authenticator-binding".into(), "another-key".into()),
                )
            }),
        ),
        (
            "\"x-kubelet-authenticator-binding\" is not sent",
            Box::new(|d| drop(d.sts.headers.remove("x-kubelet-authenticator-binding"))),
        ),
        (
            "host",
            Box::new(|d| drop(d.sts.headers.insert("host".into(), "sts.evil.example".into()))),
        ),
        (
            "the body is not",
            Box::new(|d| {
                d.sts.body = base64::engine::general_purpose::STANDARD.encode("Action=AssumeRole&Version=2011-06-15")
            }),
        ),
        (
            "age",
            Box::new(|d| {
                let stale = (now() - Duration::minutes(30))
                    .format(time::macros::format_description!(
                        "[year][month][day]T[hour][minute][second]Z"
                    ))
                    .unwrap();
                d.sts.headers.insert("x-amz-date".into(), stale);
            }),
        ),
        (
            "not allowed",
            Box::new(|d| drop(d.sts.headers.insert("x-forwarded-host".into(), "evil".into()))),
        ),
        ("is missing", Box::new(|d| drop(d.sts.headers.remove("authorization")))),
        ("document", Box::new(|d| d.rsa2048 = "bm90IHBrY3M3".into())),
    ];
    for (expected, edit) in cases {
        let aws = Aws::new();
        let (reason, message) = denial(&aws.tampered(edit));
        assert_eq!(reason, DenyReason::AttestationInvalid, "{expected}: {message}");
        assert!(message.contains(expected), "{expected}: {message}");
        assert!(aws.sts.asked.lock().unwrap().is_empty(), "{expected}: STS was asked");
    }
}

#[test]
fn aws_sts_answers_decide_the_rest() {
    let cases = [
        (
            StsAnswer::Caller {
                arn: format!("arn:aws:sts::{ACCOUNT}:assumed-role/node-role/i-0fedcba9876543210"),
            },
            Some("session of"),
        ),
        (
            StsAnswer::Caller {
                arn: format!("arn:aws:sts::210987654321:assumed-role/node-role/{INSTANCE_ID}"),
            },
            Some("of account"),
        ),
        (
            StsAnswer::Caller {
                arn: format!("arn:aws:iam::{ACCOUNT}:user/mallory"),
            },
            Some("not an STS assumed-role ARN"),
        ),
        (
            StsAnswer::Caller {
                arn: format!("arn:aws-us-gov:sts::{ACCOUNT}:assumed-role/node-role/{INSTANCE_ID}"),
            },
            Some("partition"),
        ),
        (
            StsAnswer::Refused {
                status: 403,
                error: "SignatureDoesNotMatch: the request signature we calculated does not match".into(),
            },
            Some("SignatureDoesNotMatch"),
        ),
        (
            StsAnswer::Refused {
                status: 403,
                error: "InvalidClientTokenId: The security token included in the request is invalid".into(),
            },
            Some("InvalidClientTokenId"),
        ),
        (StsAnswer::Unavailable("connection refused".into()), None),
    ];
    for (answer, expected) in cases {
        let aws = Aws::new();
        *aws.sts.answer.lock().unwrap() = Some(answer.clone());
        let decision = aws.decide(&mut aws.attestor(&Aws::honest_document()));
        match expected {
            Some(expected) => {
                let (reason, message) = denial(&decision);
                assert_eq!(reason, DenyReason::AttestationInvalid, "{answer:?}");
                assert!(message.contains(expected), "{expected}: {message}");
            }
            None => {
                // STS unreachable is transient: the CSR waits, and no call is queued at once.
                assert!(
                    matches!(&decision.outcome, Outcome::Retry { message } if message.contains("connection refused")),
                    "{decision:?}"
                );
                assert!(decision.cloud_calls.is_empty());
            }
        }
    }
}

#[test]
fn aws_the_account_allow_list_narrows_who_may_attest() {
    let aws = Aws::new();
    let other = ClusterView::from_object(&capi::cluster("aws"))
        .unwrap()
        .with_annotation(attestation::names::ANNOTATION_AWS_ACCOUNTS, "210987654321");
    let (_, message) = denial(&aws.decide_with(&mut aws.attestor(&Aws::honest_document()), &other));
    assert!(message.contains("account"), "{message}");
    let listed = ClusterView::from_object(&capi::cluster("aws"))
        .unwrap()
        .with_annotation(attestation::names::ANNOTATION_AWS_ACCOUNTS, "210987654321,123456789012");
    let decision = aws.decide_with(&mut aws.attestor(&Aws::honest_document()), &listed);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
}

#[test]
fn aws_needs_the_clusters_node_roles_and_refuses_a_session_of_any_other_role() {
    let aws = Aws::new();
    let cluster = |roles: Option<&str>| {
        let mut object = capi::cluster("aws");
        let annotations = object["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.remove(attestation::names::ANNOTATION_AWS_ROLES);
        if let Some(roles) = roles {
            annotations.insert(attestation::names::ANNOTATION_AWS_ROLES.into(), json!(roles));
        }
        ClusterView::from_object(&object).unwrap()
    };
    // Without the annotation, or with one that names no role: not allowed, STS never asked.
    for (roles, expected) in [(None, "needs the Cluster's"), (Some(" , "), "names no one")] {
        let (reason, message) = denial(&aws.decide_with(&mut aws.attestor(&Aws::honest_document()), &cluster(roles)));
        assert_eq!(reason, DenyReason::AttestationNotAllowed, "{roles:?}: {message}");
        assert!(message.contains(expected), "{roles:?}: {message}");
        assert!(message.contains("cluster.x-k8s.io/kubelet-aws-roles"), "{message}");
        assert!(aws.sts.asked.lock().unwrap().is_empty(), "{roles:?}: STS was asked");
    }
    // The review's forgery: AssumeRole on an unrelated role, session named after the victim.
    *aws.sts.answer.lock().unwrap() = Some(StsAnswer::Caller {
        arn: format!("arn:aws:sts::{ACCOUNT}:assumed-role/ci-deployer/{INSTANCE_ID}"),
    });
    let (reason, message) = denial(&aws.decide_with(
        &mut aws.attestor(&Aws::honest_document()),
        &cluster(Some("node-role,control-plane-role")),
    ));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("role \"ci-deployer\""), "{message}");
    // Any of the listed roles, compared as IAM compares role names.
    *aws.sts.answer.lock().unwrap() = Some(StsAnswer::Caller {
        arn: format!("arn:aws:sts::{ACCOUNT}:assumed-role/Control-Plane-Role/{INSTANCE_ID}"),
    });
    let decision = aws.decide_with(
        &mut aws.attestor(&Aws::honest_document()),
        &cluster(Some("node-role, control-plane-role")),
    );
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
}

#[test]
fn allow_lists_that_name_no_one_are_refused_as_configuration_errors() {
    let aws = Aws::new();
    let accounts = ClusterView::from_object(&capi::cluster("aws"))
        .unwrap()
        .with_annotation(attestation::names::ANNOTATION_AWS_ACCOUNTS, " , ");
    let (reason, message) = denial(&aws.decide_with(&mut aws.attestor(&Aws::honest_document()), &accounts));
    assert_eq!(reason, DenyReason::AttestationNotAllowed, "{message}");
    assert!(
        message.contains("kubelet-aws-accounts") && message.contains("names no one"),
        "{message}"
    );

    let gcp = Gcp::new();
    let kid = gcp.signer.current_kid();
    let mut attestor = GcpAttestor::new(Mint(|audience: &str| {
        gcp.signer
            .token(&kid, gcp.instance.claims(audience, now().unix_timestamp()))
    }));
    let projects = Gcp::cluster().with_annotation(attestation::names::ANNOTATION_GCP_PROJECTS, "");
    let (reason, message) = denial(&decide(
        &mut attestor,
        &gcp.instance.provider_id(),
        &gcp.verifiers(),
        &projects,
        now(),
    ));
    assert_eq!(reason, DenyReason::AttestationNotAllowed, "{message}");
    assert!(
        message.contains("kubelet-gcp-projects") && message.contains("names no one"),
        "{message}"
    );
}

#[test]
fn gcp_a_field_holding_a_slash_cannot_name_another_instance() {
    // zone "europe-west1-b/x" and name "worker-0" join into the provider ID of instance
    // "worker-0" in "zone" x: refused on the zone's shape, whatever the Machine says.
    let gcp = Gcp::new();
    let kid = gcp.signer.current_kid();
    let mut attestor = GcpAttestor::new(Mint(|audience: &str| {
        let mut claims = gcp.instance.claims(audience, now().unix_timestamp());
        claims["google"]["compute_engine"]["zone"] = json!("europe-west1-b/x");
        gcp.signer.token(&kid, claims)
    }));
    let (reason, message) = denial(&decide(
        &mut attestor,
        "gce://team-a-prod/europe-west1-b/x/worker-0",
        &gcp.verifiers(),
        &Gcp::cluster(),
        now(),
    ));
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(message.contains("zone"), "{message}");
}

#[test]
fn aws_an_endpoint_with_a_path_is_posted_to_the_path_the_node_signed() {
    let aws = Aws::new();
    let endpoints = StsEndpoints::from_template("https://proxy.example/sts").unwrap();
    let certificates = RegionCertificates::from_pem(&aws.ca.regions_pem(&["us-east-1"])).unwrap();
    let verifiers = Verifiers::new().with(
        AwsVerifier::new(aws.sts.clone())
            .with_certificates(certificates)
            .with_endpoints(endpoints.clone()),
    );
    let mut attestor = AwsAttestor::new(
        Imds {
            rsa2048: rsa2048_body(&aws.ca.sign_document(&Aws::honest_document())),
        },
        endpoints,
    )
    .with_clock(noon);
    let cluster = ClusterView::from_object(&capi::cluster("aws")).unwrap();
    let decision = decide(&mut attestor, PID_AWS, &verifiers, &cluster, now());
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    // The AWS SDKs send GetCallerIdentity to the endpoint's path with a `/` after it, and sign
    // that path: the signer posts to the same one, or STS refuses the signature.
    assert_eq!(aws.sts.asked.lock().unwrap()[0].url, "https://proxy.example/sts/");
}

#[test]
fn aws_a_ber_encoded_document_is_read_like_aws_serves_it() {
    let aws = Aws::new();
    let der = aws.ca.sign_document(&Aws::honest_document());
    let mut attestor = AwsAttestor::new(
        Imds {
            rsa2048: rsa2048_body(&tests::cloud::to_ber_indefinite(&der)),
        },
        StsEndpoints::regional(),
    )
    .with_clock(noon);
    let decision = aws.decide(&mut attestor);
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
}

#[test]
fn aws_a_request_signed_long_ago_is_refused_as_stale() {
    fn long_ago() -> SystemTime {
        noon() - std::time::Duration::from_secs(3600)
    }
    let aws = Aws::new();
    let mut attestor = aws.attestor(&Aws::honest_document()).with_clock(long_ago);
    let (_, message) = denial(&aws.decide(&mut attestor));
    assert!(message.contains("age: x-amz-date"), "{message}");
}
