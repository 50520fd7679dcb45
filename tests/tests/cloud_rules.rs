//! SPEC rule 12 for cloud identity: once a Machine (or pool instance) is claimed by a cloud
//! provider, only that provider proving that same instance may renew it; insecure/v1 and
//! tpm/v1 are `AttestationNotAllowed` there, another instance `AttestationInvalid`, and cloud
//! providers get no rule-11 re-bootstrap exception. The verifiers here are stand-ins that
//! report a configured instance: the cryptography is `cloud_verify`'s.

#![allow(clippy::unwrap_used)]

use attestation::attestor::{Evidence, Verification, Verifier, Verifiers};
use attestation::decision::{DenyReason, Outcome};
use attestation::insecure::InsecureVerifier;
use attestation::machine::{ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView, NodeView};
use attestation::names::{ANNOTATION_CLAIM, SIGNER_AWS, SIGNER_GCP, SIGNER_INSECURE, SIGNER_TPM};
use attestation::{Clock, CsrObject, Decision, Inputs};
use serde_json::{Value, json};
use tests::capi::{self, annotate};
use tests::csr::{RequestSpec, client_csr_object};
use time::{Duration, macros::datetime};

const PID: &str = "aws:///us-east-1a/i-0123456789abcdef0";
const INSTANCE: &str = "aws:123456789012/i-0123456789abcdef0";
const EK: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A verifier that proves what it is told to.
struct Proves {
    provider: &'static str,
    signer: &'static str,
    instance: Option<&'static str>,
    ek: Option<&'static str>,
}

impl Verifier for Proves {
    fn provider(&self) -> &'static str {
        self.provider
    }
    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }
    fn signer_name(&self) -> &'static str {
        self.signer
    }
    fn proves_hardware_identity(&self) -> bool {
        self.ek.is_some()
    }

    fn proves_instance(&self) -> bool {
        self.provider != "tpm"
    }
    fn verify(&self, _evidence: &Evidence<'_>) -> Verification {
        Verification::Verified {
            ek_sha256: self.ek.map(str::to_owned),
            instance: self.instance.map(str::to_owned),
            note: format!("{} stand-in", self.provider),
            supersedes: None,
        }
    }
}

struct Case {
    provider: &'static str,
    proven_instance: Option<&'static str>,
    claim: Option<Value>,
    renewal: bool,
    pool: bool,
    /// An EK pin on the pool (`cluster.x-k8s.io/tpm-ek-sha256`).
    pool_ek_pin: bool,
}

impl Case {
    fn aws() -> Self {
        Self {
            provider: "aws",
            proven_instance: Some(INSTANCE),
            claim: None,
            renewal: false,
            pool: false,
            pool_ek_pin: false,
        }
    }

    fn claimed_by(mut self, instance: Option<&str>, ek: Option<&str>) -> Self {
        let mut record =
            json!({"nodeName": "worker-0", "providerID": PID, "csrUID": "first", "claimedAt": "2026-11-01T00:00:00Z"});
        if let Some(instance) = instance {
            record["instance"] = json!(instance);
        }
        if let Some(ek) = ek {
            record["ekSHA256"] = json!(ek);
        }
        self.claim = Some(record);
        self
    }

    fn decide(&self) -> Decision {
        let signer = match self.provider {
            "aws" => SIGNER_AWS,
            "gcp" => SIGNER_GCP,
            "tpm" => SIGNER_TPM,
            _ => SIGNER_INSECURE,
        };
        let mut spec = RequestSpec::kubelet("worker-0", PID);
        spec.provider = Some(format!("{}/v1", self.provider));
        spec.data = (self.provider != "insecure").then(|| b"{}".to_vec());
        let mut csr: CsrObject = client_csr_object(spec.build(), "abcdef");
        csr.signer_name = signer.into();
        let mut target = if self.pool {
            capi::machine_pool("pool", &[PID])
        } else {
            capi::machine("worker-0", Some(PID))
        };
        if self.pool_ek_pin {
            annotate(&mut target, "cluster.x-k8s.io/tpm-ek-sha256", EK);
        }
        let mut nodes = Vec::new();
        if let Some(record) = &self.claim {
            if self.pool {
                annotate(
                    &mut target,
                    "cluster.x-k8s.io/kubelet-claims",
                    &json!({ PID: record }).to_string(),
                );
            } else {
                annotate(&mut target, ANNOTATION_CLAIM, &record.to_string());
            }
        }
        if self.renewal {
            csr.username = "system:node:worker-0".into();
            csr.groups = vec!["system:nodes".into(), "system:authenticated".into()];
            nodes.push(NodeView::from_object(&capi::node("worker-0", Some(PID))).unwrap());
        }
        let cluster = ClusterView::from_object(&capi::cluster("aws,gcp,tpm,insecure")).unwrap();
        let mut inventory = Inventory::default();
        if self.pool {
            inventory
                .pools
                .push(MachinePoolView::from_object(&target).unwrap().into());
        } else {
            inventory
                .machines
                .push(MachineView::from_object(&target).unwrap().into());
        }
        let config = if self.pool { "pool-kc" } else { "worker-0-kc" };
        inventory.kubeadm_configs = vec![
            KubeadmConfigView::from_object(&capi::kubeadm_config(config, "abcdef", "v1beta2"))
                .unwrap()
                .into(),
        ];
        let verifiers = Verifiers::new()
            .with(InsecureVerifier)
            .with(Proves {
                provider: "aws",
                signer: SIGNER_AWS,
                instance: if self.provider == "aws" {
                    self.proven_instance
                } else {
                    None
                },
                ek: None,
            })
            .with(Proves {
                provider: "gcp",
                signer: SIGNER_GCP,
                instance: if self.provider == "gcp" {
                    self.proven_instance
                } else {
                    None
                },
                ek: None,
            })
            .with(Proves {
                provider: "tpm",
                signer: SIGNER_TPM,
                instance: None,
                ek: Some(EK),
            });
        let now = datetime!(2026-11-22 08:00 UTC);
        attestation::decide(&Inputs {
            csr: &csr,
            cluster: &cluster,
            inventory: &inventory,
            nodes: &nodes,
            csrs: &attestation::NoCsrs,
            verifiers: &verifiers,
            clock: Clock {
                now,
                first_seen: now,
                max_age: Duration::minutes(15),
            },
        })
        .unwrap()
    }
}

fn denied(decision: &Decision) -> Option<(DenyReason, String)> {
    match &decision.outcome {
        Outcome::Denied { reason, message } => Some((*reason, message.clone())),
        _ => None,
    }
}

#[test]
fn a_cloud_join_records_the_proven_instance_in_the_claim() {
    let decision = Case::aws().decide();
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    let claim = decision.claim.unwrap();
    assert_eq!(claim.record.instance.as_deref(), Some(INSTANCE));
    assert!(
        claim
            .value
            .contains(r#""instance":"aws:123456789012/i-0123456789abcdef0""#),
        "{}",
        claim.value
    );
}

#[test]
fn a_renewal_proving_the_claimed_instance_is_approved() {
    let mut case = Case::aws().claimed_by(Some(INSTANCE), None);
    case.renewal = true;
    let decision = case.decide();
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    assert!(decision.claim.is_none());
}

#[test]
fn an_instance_bound_machine_refuses_insecure_and_tpm_renewals() {
    for provider in ["insecure", "tpm", "gcp"] {
        let mut case = Case::aws().claimed_by(Some(INSTANCE), None);
        case.provider = provider;
        case.renewal = true;
        let (reason, message) = denied(&case.decide()).unwrap_or_else(|| panic!("{provider} was not denied"));
        assert_eq!(reason, DenyReason::AttestationNotAllowed, "{provider}: {message}");
        assert!(message.contains("aws/v1 proving that instance"), "{message}");
    }
}

#[test]
fn another_instance_is_invalid_and_the_message_names_both() {
    let mut case = Case::aws().claimed_by(Some(INSTANCE), None);
    case.renewal = true;
    case.proven_instance = Some("aws:123456789012/i-0fedcba9876543210");
    let (reason, message) = denied(&case.decide()).unwrap();
    assert_eq!(reason, DenyReason::AttestationInvalid);
    assert!(
        message.contains("i-0123456789abcdef0") && message.contains("i-0fedcba9876543210"),
        "{message}"
    );
}

#[test]
fn cloud_providers_get_no_re_bootstrap_exception() {
    // The same instance asking again with a bootstrap token: the Machine is claimed (rule 11),
    // whatever the cloud proves; only a TPM with the claimed EK may re-bootstrap.
    let case = Case::aws().claimed_by(Some(INSTANCE), None);
    let (reason, _) = denied(&case.decide()).unwrap();
    assert_eq!(reason, DenyReason::MachineAlreadyClaimed);
}

#[test]
fn an_ek_bound_machine_refuses_cloud_providers() {
    let mut case = Case::aws().claimed_by(None, Some(EK));
    case.renewal = true;
    let (reason, message) = denied(&case.decide()).unwrap();
    assert_eq!(reason, DenyReason::AttestationNotAllowed, "{message}");
}

#[test]
fn a_machine_claimed_without_an_instance_is_not_instance_bound() {
    // Claimed under insecure/v1 before the Cluster moved to aws: a renewal with aws/v1 holds.
    let mut case = Case::aws().claimed_by(None, None);
    case.renewal = true;
    let decision = case.decide();
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
}

#[test]
fn a_pool_instance_is_bound_to_its_own_instance_too() {
    let mut joined = Case::aws();
    joined.pool = true;
    let decision = joined.decide();
    assert!(matches!(decision.outcome, Outcome::Approved { .. }), "{decision:?}");
    assert!(decision.claim.unwrap().value.contains(INSTANCE));

    let mut downgrade = Case::aws().claimed_by(Some(INSTANCE), None);
    downgrade.pool = true;
    downgrade.renewal = true;
    downgrade.provider = "insecure";
    assert_eq!(
        denied(&downgrade.decide()).unwrap().0,
        DenyReason::AttestationNotAllowed
    );

    let mut other = Case::aws().claimed_by(Some(INSTANCE), None);
    other.pool = true;
    other.renewal = true;
    other.proven_instance = Some("aws:123456789012/i-0fedcba9876543210");
    assert_eq!(denied(&other.decide()).unwrap().0, DenyReason::AttestationInvalid);
}

/// SPEC rule 7, adoption, for every attestor: the registered node itself, for a Machine with no
/// claim, is approved under that attestor's proof and claimed as for an initial request (the
/// claim records the proven instance or EK from then on). A pool instance carries no names, so
/// (revision 5) it is adopted only under an attestor that proves the instance: a cloud identity,
/// or `tpm/v1` with an EK pinned on the pool; under `insecure/v1` or an unpinned EK it is
/// refused, saying what the operator can do.
#[test]
fn every_attestor_adopts_a_registered_node_and_binds_the_claim() {
    for (pool, pool_ek_pin) in [(false, false), (true, false), (true, true)] {
        for provider in ["aws", "gcp", "tpm", "insecure"] {
            let mut case = Case::aws();
            case.provider = provider;
            case.renewal = true; // the node itself asks; no claim: an adoption
            case.pool = pool;
            case.pool_ek_pin = pool_ek_pin;
            let decision = case.decide();
            let what = format!("{provider}, pool {pool}, EK pin {pool_ek_pin}");
            let proves_instance = !pool || matches!(provider, "aws" | "gcp") || (provider == "tpm" && pool_ek_pin);
            if !proves_instance {
                let (reason, message) = denied(&decision).unwrap_or_else(|| panic!("{what}: {decision:?}"));
                assert_eq!(reason, DenyReason::RequesterNotAllowed, "{what}: {message}");
                assert!(
                    message.contains("does not prove the node is that instance")
                        && message.contains("reprovision the instance")
                        && message.contains("pin its EK"),
                    "{what}: {message}"
                );
                assert!(decision.claim.is_none(), "{what}");
                continue;
            }
            if pool_ek_pin && provider != "tpm" {
                // An EK-pinned pool accepts only tpm/v1 (rule 12), adoption or not.
                let (reason, message) = denied(&decision).unwrap_or_else(|| panic!("{what}: {decision:?}"));
                assert_eq!(reason, DenyReason::AttestationNotAllowed, "{what}: {message}");
                continue;
            }
            assert!(
                matches!(decision.outcome, Outcome::Approved { .. }),
                "{what}: {decision:?}"
            );
            let claim = decision
                .claim
                .unwrap_or_else(|| panic!("{what}: an adoption writes the claim"));
            match provider {
                "aws" | "gcp" => assert_eq!(claim.record.instance.as_deref(), Some(INSTANCE), "{what}"),
                "tpm" => assert_eq!(claim.record.ek_sha256.as_deref(), Some(EK), "{what}"),
                _ => assert!(
                    claim.record.instance.is_none() && claim.record.ek_sha256.is_none(),
                    "{what}"
                ),
            }
        }
    }
}
