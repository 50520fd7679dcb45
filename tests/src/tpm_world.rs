//! A `tpm/v1` world without a cluster: worker-0's Machine, the signer's rule engine with a
//! [`TpmVerifier`] trusting `swtpm_localca`, and helpers that run the node's [`TpmAttestor`]
//! through both phases. Shared by the `tpm_attest` suite and the `tpm_join` benchmark.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::new_without_default, missing_docs)]

use attestation::CsrObject;
use attestation::attestor::ChallengeAnswer;
use attestation::decision::{Decision, Outcome};
use attestation::envelope::RequestEnvelope;
use attestation::identity::{NodeName, ProviderId};
use attestation::machine::ClusterView;
use attestation::names::{ANNOTATION_CLAIM, ANNOTATION_TPM_CHALLENGE, GROUP_BOOTSTRAPPERS, SIGNER_TPM, usage};
use attestation::request::{KeyAlgorithm, NodeKey, build_envelope, kubelet_client_params};
use attestation::tpm::TpmVerifier;
use attestation::tpm::attestor::TpmAttestor;
use attestation::tpm::boot_policy::PolicyState;
use attestation::tpm::challenge_key::ChallengeKey;
use attestation::tpm::ek::EkTrust;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::capi;
use crate::swtpm::localca_bundle;

pub const PID: &str = "aws:///us-east-1a/i-0abc";
pub const NODE: &str = "worker-0";

/// A Cluster with worker-0 and worker-1, a `tpm/v1` verifier, and the CSRs filed so far.
pub struct World {
    pub machines: Vec<Value>,
    pub bundle: Vec<u8>,
    pub challenge_key: Vec<u8>,
    /// A replica's challenge key slot, as the controller follows its Secret; `None`: a verifier
    /// given [`World::challenge_key`] once.
    pub key_slot: Option<ChallengeKey>,
    pub trust_on_first_use: bool,
    pub csrs: Vec<CsrObject>,
    pub now: OffsetDateTime,
    pub serial: u32,
    /// The Cluster's `tpm/v1` boot policy as the signer read it (none by default).
    pub boot_policy: PolicyState,
}

impl World {
    pub fn new() -> Self {
        Self {
            machines: vec![
                capi::machine(NODE, Some(PID)),
                capi::machine("worker-1", Some("aws:///us-east-1a/i-0def")),
            ],
            bundle: localca_bundle(),
            challenge_key: vec![7; 32],
            key_slot: None,
            trust_on_first_use: false,
            csrs: Vec::new(),
            now: OffsetDateTime::now_utc().replace_nanosecond(0).unwrap(),
            serial: 0,
            boot_policy: PolicyState::None,
        }
    }

    pub fn verifier(&self) -> TpmVerifier {
        match &self.key_slot {
            Some(slot) => TpmVerifier::with_challenge_key(slot.clone()),
            None => TpmVerifier::new(self.challenge_key.clone()).unwrap(),
        }
        .with_ek_trust(EkTrust::from_pem(&self.bundle).unwrap())
        .with_trust_on_first_use(self.trust_on_first_use)
    }

    /// The same verifier without the challenge key, as `explain` runs it.
    pub fn verifier_without_key(&self) -> TpmVerifier {
        TpmVerifier::with_challenge_key(ChallengeKey::withheld())
            .with_ek_trust(EkTrust::from_pem(&self.bundle).unwrap())
            .with_trust_on_first_use(self.trust_on_first_use)
    }

    /// A CSR object filed by worker-0's join token.
    pub fn object(&mut self, envelope: &RequestEnvelope) -> CsrObject {
        self.serial += 1;
        CsrObject {
            name: format!("node-csr-{}", self.serial),
            uid: format!("00000000-0000-4000-8000-{:012}", self.serial),
            request: envelope.encode().into_bytes(),
            signer_name: SIGNER_TPM.into(),
            usages: vec![usage::DIGITAL_SIGNATURE.into(), usage::CLIENT_AUTH.into()],
            username: "system:bootstrap:abcdef".into(),
            groups: vec![GROUP_BOOTSTRAPPERS.into()],
            created: Some(self.now),
            ..CsrObject::default()
        }
    }

    pub fn decide(&self, csr: &CsrObject) -> Decision {
        self.decide_with(csr, self.verifier())
    }

    /// The decision of a signer configured as `verifier` (explain's, with the challenge key
    /// withheld, for one).
    pub fn decide_with(&self, csr: &CsrObject, verifier: TpmVerifier) -> Decision {
        let mut cluster = ClusterView::from_object(&capi::cluster("tpm")).unwrap();
        cluster.boot_policy = self.boot_policy.clone();
        capi::decide_in(
            csr,
            &cluster,
            &self.machines,
            &self.csrs,
            attestation::attestor::Verifiers::new().with(verifier),
            self.now,
        )
    }

    /// Phase 1 for `key`: the CSR, and the decision on it.
    pub fn phase_one(&mut self, attestor: &mut TpmAttestor, key: &NodeKey) -> (CsrObject, Decision) {
        let envelope = build_envelope(&params(), key, attestor, None).expect("phase 1 attestation");
        let csr = self.object(&envelope);
        let decision = self.decide(&csr);
        (csr, decision)
    }

    /// Phase 1 that must be challenged; the challenged CSR #1 is now in the cluster.
    pub fn challenged(&mut self, attestor: &mut TpmAttestor, key: &NodeKey) -> CsrObject {
        let (mut csr, decision) = self.phase_one(attestor, key);
        assert!(
            matches!(decision.outcome, Outcome::Retry { .. }),
            "phase 1 leaves CSR #1 pending: {:#?}",
            decision
        );
        assert!(
            decision.annotations.contains_key(ANNOTATION_TPM_CHALLENGE),
            "{decision:#?}"
        );
        csr.annotations = decision.annotations;
        self.csrs.push(csr.clone());
        csr
    }

    /// Phase 2: the attestor answers CSR #1's challenge with `key`.
    pub fn phase_two(&mut self, attestor: &mut TpmAttestor, key: &NodeKey, first: &CsrObject) -> (CsrObject, Decision) {
        let annotation = first.annotations[ANNOTATION_TPM_CHALLENGE].clone();
        let answer = ChallengeAnswer {
            csr_name: &first.name,
            csr_uid: &first.uid,
            annotation: &annotation,
        };
        let envelope = build_envelope(&params(), key, attestor, Some(answer)).expect("phase 2 attestation");
        let csr = self.object(&envelope);
        let decision = self.decide(&csr);
        (csr, decision)
    }

    /// Every CSR filed so far is finished (denied, superseded or issued), as the signer leaves
    /// them: their challenges no longer count.
    pub fn finish_all(&mut self) {
        for csr in &mut self.csrs {
            csr.finished = true;
        }
    }

    pub fn claim_with_ek(&mut self, ek: &str) {
        let record = json!({"nodeName": NODE, "providerID": PID, "csrUID": "earlier", "ekSHA256": ek,
                            "claimedAt": "2026-11-01T00:00:00Z"});
        capi::annotate(&mut self.machines[0], ANNOTATION_CLAIM, &record.to_string());
    }
}

pub fn params() -> rcgen::CertificateParams {
    kubelet_client_params(&NodeName::new(NODE).unwrap(), &ProviderId::new(PID).unwrap())
}

pub fn key() -> NodeKey {
    NodeKey::generate(KeyAlgorithm::EcdsaP256).unwrap()
}

pub fn spki(key: &NodeKey) -> Vec<u8> {
    rcgen::PublicKeyData::subject_public_key_info(key.key_pair())
}
