//! The rule engine, table-driven: every client and serving reason of the SPEC, and the
//! approvals, with CSRs generated here (several key types, RSA with and without key
//! encipherment). Each case starts from a CSR that is approved and bends one thing.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use attestation::attestor::{Evidence, Verification, Verifier, Verifiers};
use attestation::decision::{CsrKind, Decision, DenyReason, Outcome, Rule, Verdict};
use attestation::insecure::InsecureVerifier;
use attestation::machine::{ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView, NodeView};
use attestation::names::{SIGNER_TPM, usage};
use attestation::request::KeyAlgorithm;
use attestation::rules::{NodeDirectory, NodeLookup};
use attestation::{Clock, CsrObject, Inputs};
use rcgen::{CustomExtension, DnType, SanType};
use serde_json::{Value, json};
use tests::capi::{self, annotate};
use tests::csr::{RequestSpec, client_csr_object, serving_csr_object, subject};
use tests::pkcs10::{
    Critical, Pkcs10, attribute, attributes, ca_true_extension, extension, extension_request, oids,
    provider_id_extension, san_extension, seq, set, string, tag, tlv,
};
use time::{Duration, OffsetDateTime, macros::datetime};

const PID: &str = "aws:///us-east-1a/i-0abc";
const NOW: OffsetDateTime = datetime!(2026-11-22 08:00 UTC);
const EK: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const OTHER_EK: &str = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";

/// A `tpm` verifier stand-in: returns a configured outcome and counts calls.
struct FakeTpm {
    outcome: Verification,
    calls: Arc<AtomicUsize>,
}

impl Verifier for FakeTpm {
    fn provider(&self) -> &'static str {
        "tpm"
    }
    fn versions(&self) -> &'static [&'static str] {
        &["v1"]
    }
    fn signer_name(&self) -> &'static str {
        SIGNER_TPM
    }
    fn proves_hardware_identity(&self) -> bool {
        true
    }
    fn verify(&self, _evidence: &Evidence<'_>) -> Verification {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.outcome.clone()
    }
}

/// Nodes that cannot be listed right now.
struct Unreachable;

impl NodeDirectory for Unreachable {
    fn node(&self, _name: &str) -> NodeLookup {
        NodeLookup::Unavailable("connection refused".into())
    }

    fn nodes_with_provider_id(&self, _provider_id: &str) -> Result<Vec<String>, String> {
        Err("connection refused".into())
    }
}

#[derive(Clone)]
struct Scenario {
    request: RequestSpec,
    csr: CsrObject,
    cluster: Value,
    machines: Vec<Value>,
    configs: Vec<Value>,
    nodes: Vec<Value>,
    nodes_unreachable: bool,
    tpm: Option<Verification>,
    /// Rewrites the built `spec.request`.
    tamper: Option<fn(Vec<u8>) -> Vec<u8>>,
    first_seen: OffsetDateTime,
}

fn verified(ek: &str) -> Verification {
    Verification::Verified {
        ek_sha256: Some(ek.to_owned()),
        instance: None,
        note: "fake".into(),
        supersedes: None,
    }
}

impl Scenario {
    /// worker-0: a bootstrapped Machine with its KubeadmConfig, asked for by that config's token.
    fn client() -> Self {
        Self {
            request: RequestSpec::kubelet("worker-0", PID),
            csr: client_csr_object(Vec::new(), "abcdef"),
            cluster: capi::cluster("tpm,insecure"),
            machines: vec![
                capi::machine("worker-0", Some(PID)),
                capi::machine("worker-1", Some("aws:///us-east-1a/i-0def")),
            ],
            configs: vec![
                capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta2"),
                capi::kubeadm_config("worker-1-kc", "ghijkl", "v1beta2"),
            ],
            nodes: Vec::new(),
            nodes_unreachable: false,
            tpm: None,
            tamper: None,
            first_seen: NOW - Duration::minutes(1),
        }
    }

    /// worker-0 registered with nodeRef and addresses, asking for its serving certificate.
    fn serving() -> Self {
        let mut machine = capi::machine("worker-0", Some(PID));
        machine["status"]["nodeRef"] = json!({"name": "worker-0"});
        machine["status"]["addresses"] = json!([
            {"type": "Hostname", "address": "worker-0"},
            {"type": "InternalDNS", "address": "Worker-0.EC2.internal"},
            {"type": "InternalIP", "address": "10.0.0.7"},
            {"type": "InternalIP", "address": "fd00::7"}
        ]);
        Self {
            request: RequestSpec::serving(
                "worker-0",
                vec![
                    SanType::DnsName("worker-0".try_into().unwrap()),
                    SanType::IpAddress("10.0.0.7".parse().unwrap()),
                ],
            ),
            csr: serving_csr_object(Vec::new(), "worker-0"),
            machines: vec![machine],
            ..Self::client()
        }
    }

    fn as_tpm(&mut self, outcome: Verification) {
        self.request.provider = Some("tpm/v1".into());
        self.request.data = Some(br#"{"phase":2}"#.to_vec());
        self.csr.signer_name = SIGNER_TPM.into();
        self.tpm = Some(outcome);
    }

    fn claim(&mut self, node: &str, csr_uid: &str, ek: Option<&str>) {
        let mut record =
            json!({"nodeName": node, "providerID": PID, "csrUID": csr_uid, "claimedAt": "2026-11-01T00:00:00Z"});
        if let Some(ek) = ek {
            record["ekSHA256"] = json!(ek);
        }
        annotate(
            &mut self.machines[0],
            "cluster.x-k8s.io/kubelet-claim",
            &record.to_string(),
        );
    }

    fn renewal(&mut self) {
        self.claim("worker-0", "earlier-csr", None);
        self.machines[0]["status"]["nodeRef"] = json!({"name": "worker-0"});
        self.nodes.push(capi::node("worker-0", Some(PID)));
        self.csr.username = "system:node:worker-0".into();
        self.csr.groups = vec!["system:nodes".into(), "system:authenticated".into()];
    }

    /// The node itself asks with the identity it already holds (kubeadm's, or one issued
    /// before the opt-in) for its Machine, which names it (`status.nodeRef`) and holds no
    /// claim: an adoption (rule 7).
    fn adoption(&mut self) {
        self.machines[0]["status"]["nodeRef"] = json!({"name": "worker-0"});
        self.nodes.push(capi::node("worker-0", Some(PID)));
        self.csr.username = "system:node:worker-0".into();
        self.csr.groups = vec!["system:nodes".into(), "system:authenticated".into()];
    }

    /// The first control-plane node (`kubeadm init`): Machine prod-cp-x7k2p of the
    /// KubeadmControlPlane, no nodeRef yet, its Node registered under the host name with the
    /// Machine's provider ID, asking with kubeadm's certificate.
    fn control_plane_adoption(&mut self) {
        let mut machine = capi::machine("prod-cp-x7k2p", Some(PID));
        machine["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
        // The host name, as the infrastructure provider reports it.
        machine["status"]["addresses"] = json!([
            {"type": "InternalIP", "address": "10.0.0.7"},
            {"type": "InternalDNS", "address": "ip-10-0-0-7"}
        ]);
        machine["spec"]["bootstrap"]["configRef"]["name"] = json!("prod-cp-x7k2p");
        self.machines[0] = machine;
        self.configs[0] = capi::kubeadm_config("prod-cp-x7k2p", "abcdef", "v1beta2");
        self.request = RequestSpec::kubelet("ip-10-0-0-7", PID);
        self.nodes.push(capi::node("ip-10-0-0-7", Some(PID)));
        self.csr.username = "system:node:ip-10-0-0-7".into();
        self.csr.groups = vec!["system:nodes".into(), "system:authenticated".into()];
    }

    fn decide_counting(&self) -> (Decision, usize) {
        let mut csr = self.csr.clone();
        csr.request = self.request.build();
        if let Some(tamper) = self.tamper {
            csr.request = tamper(csr.request);
        }
        let cluster = ClusterView::from_object(&self.cluster).unwrap();
        let mut inventory = Inventory::default();
        for m in &self.machines {
            match m["kind"].as_str() {
                Some("MachinePool") => inventory.pools.push(MachinePoolView::from_object(m).unwrap().into()),
                _ => inventory.machines.push(MachineView::from_object(m).unwrap().into()),
            }
        }
        inventory.kubeadm_configs = self
            .configs
            .iter()
            .map(|c| KubeadmConfigView::from_object(c).unwrap().into())
            .collect();
        let nodes: Vec<NodeView> = self.nodes.iter().map(|n| NodeView::from_object(n).unwrap()).collect();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut verifiers = Verifiers::new().with(InsecureVerifier);
        if let Some(outcome) = &self.tpm {
            verifiers = verifiers.with(FakeTpm {
                outcome: outcome.clone(),
                calls: calls.clone(),
            });
        }
        let directory: &dyn NodeDirectory = if self.nodes_unreachable { &Unreachable } else { &nodes };
        let inputs = Inputs {
            csr: &csr,
            cluster: &cluster,
            inventory: &inventory,
            nodes: directory,
            csrs: &attestation::NoCsrs,
            verifiers: &verifiers,
            clock: Clock {
                now: NOW,
                first_seen: self.first_seen,
                max_age: Duration::minutes(15),
            },
        };
        let decision = attestation::decide(&inputs).unwrap();
        (decision, calls.load(Ordering::SeqCst))
    }

    fn decide(&self) -> Decision {
        self.decide_counting().0
    }
}

/// The client scenario with its request assembled from DER parts, `edit` bending them.
fn client_by_hand(edit: fn(&mut Pkcs10)) -> Scenario {
    let mut s = Scenario::client();
    let mut raw = Pkcs10::kubelet("worker-0", PID);
    edit(&mut raw);
    s.request.raw = Some(raw);
    s
}

/// The serving scenario with its request assembled from DER parts (SANs worker-0 and
/// 10.0.0.7), `edit` bending them.
fn serving_by_hand(edit: fn(&mut Pkcs10)) -> Scenario {
    let mut s = Scenario::serving();
    let mut raw = Pkcs10 {
        attributes: attributes(&[extension_request(&[serving_san()])]),
        ..Pkcs10::kubelet("worker-0", "unused")
    };
    edit(&mut raw);
    s.request.raw = Some(raw);
    s
}

fn serving_san() -> Vec<u8> {
    san_extension(&["worker-0"], &[[10, 0, 0, 7]])
}

/// Puts `text` into the first base64 line of the CSR block, after its first eight characters.
fn in_base64(request: Vec<u8>, text: &str) -> Vec<u8> {
    let request = String::from_utf8(request).unwrap();
    let at = request.find("-----\n").unwrap() + "-----\n".len() + 8;
    format!("{}{text}{}", &request[..at], &request[at..]).into_bytes()
}

/// Replaces the first `from` in the request text with `to`.
fn replaced(request: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    String::from_utf8(request).unwrap().replacen(from, to, 1).into_bytes()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Approved,
    Denied(DenyReason),
    Retry,
}

type Case = (&'static str, fn() -> Scenario, Expect);

const POOL_PID: &str = "aws:///us-east-1a/i-pool1";
const POOL_PID_2: &str = "aws:///us-east-1a/i-pool2";

/// Instance i-pool1 of MachinePool pool-a (two instances), asking for node `name`.
fn pool_instance(name: &str) -> Scenario {
    let mut s = Scenario::client();
    s.request = RequestSpec::kubelet(name, POOL_PID);
    s.machines.push(capi::machine_pool("pool-a", &[POOL_PID, POOL_PID_2]));
    s.configs.push(capi::kubeadm_config("pool-a-kc", "abcdef", "v1beta2"));
    s
}

/// Node `pool-node-x1` asks to be adopted as instance [`POOL_PID`] of pool-a under `tpm/v1`
/// (its EK pinned on the pool, or trusted by its chain only), while `nodes` (in that order) carry
/// the instance's provider ID.
fn pool_adoption(nodes: &[&str], pinned: bool) -> Scenario {
    let mut s = pool_instance("pool-node-x1");
    for node in nodes {
        s.nodes.push(capi::node(node, Some(POOL_PID)));
    }
    s.csr.username = "system:node:pool-node-x1".into();
    s.csr.groups = vec!["system:nodes".into()];
    if pinned {
        let pool = s.machines.len() - 1;
        annotate(&mut s.machines[pool], "cluster.x-k8s.io/tpm-ek-sha256", EK);
    }
    s.as_tpm(verified(EK));
    s
}

/// A claim record for the pool annotation.
fn pool_claim(pid: &str, node: &str) -> Value {
    json!({"nodeName": node, "providerID": pid, "csrUID": "first", "claimedAt": "2026-11-01T00:00:00Z"})
}

/// Runs the cases; returns every denial reason they reached.
fn check(cases: &[Case]) -> std::collections::BTreeSet<DenyReason> {
    let mut reached = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for (name, scenario, expect) in cases {
        let decision = scenario().decide();
        let got = match &decision.outcome {
            Outcome::Approved { .. } => Expect::Approved,
            Outcome::Denied { reason, .. } => Expect::Denied(*reason),
            Outcome::Retry { .. } => Expect::Retry,
            other => panic!("unexpected outcome {other:?}"),
        };
        // Every rule gets a verdict.
        assert_eq!(
            decision.rules.len(),
            if decision.kind == CsrKind::KubeletClient { 12 } else { 8 },
            "{name}"
        );
        if let Outcome::Denied { reason, .. } = &decision.outcome {
            let from_rule = decision.rules.iter().any(|r| match &r.verdict {
                Verdict::Failed { reason: r, .. } => r == reason,
                Verdict::Pending { on_expiry, .. } => on_expiry == reason,
                _ => false,
            });
            assert!(from_rule, "{name}: the denial reason {reason} is no rule's");
            reached.insert(*reason);
        }
        if got != *expect {
            failures.push(format!(
                "{name}: expected {expect:?}, got {got:?}\n{}",
                serde_json::to_string_pretty(&decision).unwrap()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    reached
}

#[test]
fn client_csr_table() {
    use DenyReason::*;
    use Expect::{Approved, Denied, Retry};
    let cases: Vec<Case> = vec![
        (
            "approves the machine's own join token with a P-256 key",
            Scenario::client,
            Approved,
        ),
        (
            "approves a P-384 key",
            || {
                let mut s = Scenario::client();
                s.request.key = KeyAlgorithm::EcdsaP384;
                s
            },
            Approved,
        ),
        (
            "approves an Ed25519 key",
            || {
                let mut s = Scenario::client();
                s.request.key = KeyAlgorithm::Ed25519;
                s
            },
            Approved,
        ),
        (
            "approves an RSA key asking for key encipherment",
            || {
                let mut s = Scenario::client();
                s.request.key = KeyAlgorithm::Rsa2048;
                s.csr.usages.push(usage::KEY_ENCIPHERMENT.into());
                s
            },
            Approved,
        ),
        (
            "approves an RSA key without key encipherment",
            || {
                let mut s = Scenario::client();
                s.request.key = KeyAlgorithm::Rsa2048;
                s
            },
            Approved,
        ),
        (
            "approves a v1beta1 Machine and KubeadmConfig",
            || {
                let mut s = Scenario::client();
                s.machines[0] = capi::machine_v1beta1("worker-0", PID);
                s.configs[0] = capi::kubeadm_config("worker-0-kc", "abcdef", "v1beta1");
                s
            },
            Approved,
        ),
        (
            "approves the infrastructure machine's name as node name",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-0-infra", PID);
                s
            },
            Approved,
        ),
        (
            "approves an InternalDNS address as node name",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-0.internal", PID);
                s
            },
            Approved,
        ),
        (
            "approves a MachinePool instance listed in providerIDList",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("pool-node-x1", "aws:///us-east-1a/i-pool1");
                s.machines.push(capi::machine_pool(
                    "pool-a",
                    &["aws:///us-east-1a/i-pool1", "aws:///us-east-1a/i-pool2"],
                ));
                s.configs.push(capi::kubeadm_config("pool-a-kc", "abcdef", "v1beta2"));
                s
            },
            Approved,
        ),
        (
            "approves a v1beta1 MachinePool instance",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("pool-node-x1", "aws:///us-east-1a/i-pool1");
                s.machines
                    .push(capi::machine_pool_v1beta1("pool-a", &["aws:///us-east-1a/i-pool1"]));
                s.configs.push(capi::kubeadm_config("pool-a-kc", "abcdef", "v1beta1"));
                s
            },
            Approved,
        ),
        (
            "approves a renewal by the node itself",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s
            },
            Approved,
        ),
        (
            "approves again a CSR whose claim it already wrote (restart)",
            || {
                let mut s = Scenario::client();
                let uid = s.csr.uid.clone();
                s.claim("worker-0", &uid, None);
                s
            },
            Approved,
        ),
        (
            "approves and replaces a stale claim for another provider ID",
            || {
                let mut s = Scenario::client();
                annotate(
                    &mut s.machines[0],
                    "cluster.x-k8s.io/kubelet-claim",
                    r#"{"nodeName":"old","providerID":"aws:///old","csrUID":"x","claimedAt":"2026-01-01T00:00:00Z"}"#,
                );
                s
            },
            Approved,
        ),
        (
            "approves any bootstrap token when the KubeadmConfig names none",
            || {
                let mut s = Scenario::client();
                s.configs[0]["spec"] = json!({});
                s.csr.username = "system:bootstrap:zzzzzz".into();
                s
            },
            Approved,
        ),
        (
            "approves when the bootstrap config is not kubeadm's",
            || {
                let mut s = Scenario::client();
                s.machines[0]["spec"]["bootstrap"]["configRef"] =
                    json!({"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "TalosConfig", "name": "t"});
                s.csr.username = "system:bootstrap:zzzzzz".into();
                s
            },
            Approved,
        ),
        (
            "approves the v1beta2 BootstrapConfigReady condition",
            || {
                let mut s = Scenario::client();
                s.machines[0]["status"] = json!({"conditions": [{"type": "BootstrapConfigReady", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-11-22T07:00:00Z"}]});
                s
            },
            Approved,
        ),
        // Rule 1.
        (
            "denies bytes that are not PEM",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|_| b"hello".to_vec());
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a request with a private key block appended",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|mut r| {
                    r.extend_from_slice(b"-----BEGIN PRIVATE KEY-----\nAQID\n-----END PRIVATE KEY-----\n");
                    r
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies text after the last block",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|mut r| {
                    r.extend_from_slice(b"trailing");
                    r
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a CSR block that is not PKCS#10",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|_| {
                    b"-----BEGIN CERTIFICATE REQUEST-----\nMAMCAQE=\n-----END CERTIFICATE REQUEST-----\n".to_vec()
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a request over 64 KiB",
            || {
                let mut s = Scenario::client();
                s.request.data = Some(vec![b'x'; 70_000]);
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "approves CRLF line endings",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| String::from_utf8(r).unwrap().replace('\n', "\r\n").into_bytes());
                s
            },
            Approved,
        ),
        (
            "denies a form feed inside the base64 of the CSR block",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| in_base64(r, "\u{c}"));
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a vertical tab inside the base64",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| in_base64(r, "\u{b}"));
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a no-break space (U+00A0) inside the base64",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| in_base64(r, "\u{a0}"));
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies an em space (U+2003) inside the base64",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| in_base64(r, "\u{2003}"));
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies a space inside a base64 line",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| in_base64(r, " "));
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies data on the BEGIN line",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| {
                    replaced(
                        r,
                        "-----BEGIN CERTIFICATE REQUEST-----\n",
                        "-----BEGIN CERTIFICATE REQUEST-----",
                    )
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies two blocks on one line",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| {
                    replaced(
                        r,
                        "-----END CERTIFICATE REQUEST-----\n",
                        "-----END CERTIFICATE REQUEST-----",
                    )
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "denies spaces after the END line",
            || {
                let mut s = Scenario::client();
                s.tamper = Some(|r| {
                    replaced(
                        r,
                        "-----END CERTIFICATE REQUEST-----\n",
                        "-----END CERTIFICATE REQUEST-----  \n",
                    )
                });
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "approves a request assembled by hand from DER parts",
            || client_by_hand(|_| {}),
            Approved,
        ),
        (
            "denies PKCS#10 version 2 (INTEGER 1)",
            || client_by_hand(|p| p.version = tlv(tag::INTEGER, &[1])),
            Denied(InvalidRequest),
        ),
        (
            "denies PKCS#10 version 3 (INTEGER 2)",
            || client_by_hand(|p| p.version = tlv(tag::INTEGER, &[2])),
            Denied(InvalidRequest),
        ),
        // Rule 2.
        (
            "denies a corrupted self-signature",
            || {
                let mut s = Scenario::client();
                s.request.corrupt_signature = true;
                s
            },
            Denied(InvalidSignature),
        ),
        (
            "denies a P-521 key",
            || {
                let mut s = Scenario::client();
                s.request.unusual_key = Some(&rcgen::PKCS_ECDSA_P521_SHA512);
                s
            },
            Denied(InvalidSignature),
        ),
        // Rule 3.
        (
            "denies a CN without system:node:",
            || {
                let mut s = Scenario::client();
                s.request.subject = subject(&[
                    (DnType::OrganizationName, "system:nodes"),
                    (DnType::CommonName, "worker-0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "denies O=system:masters",
            || {
                let mut s = Scenario::client();
                s.request.subject = subject(&[
                    (DnType::OrganizationName, "system:masters"),
                    (DnType::CommonName, "system:node:worker-0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "denies a second O",
            || {
                let mut s = Scenario::client();
                s.request.subject = subject(&[
                    (DnType::OrganizationName, "system:nodes"),
                    (DnType::OrganizationName, "system:masters"),
                    (DnType::CommonName, "system:node:worker-0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "denies an extra subject attribute",
            || {
                let mut s = Scenario::client();
                s.request.subject = subject(&[
                    (DnType::CountryName, "US"),
                    (DnType::OrganizationName, "system:nodes"),
                    (DnType::CommonName, "system:node:worker-0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "denies a node name that is not a DNS subdomain",
            || {
                let mut s = Scenario::client();
                s.request.subject = subject(&[
                    (DnType::OrganizationName, "system:nodes"),
                    (DnType::CommonName, "system:node:Worker_0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        // Rule 4.
        (
            "denies a DNS SAN",
            || {
                let mut s = Scenario::client();
                s.request.sans = vec![SanType::DnsName("kubernetes".try_into().unwrap())];
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies an IP SAN",
            || {
                let mut s = Scenario::client();
                s.request.sans = vec![SanType::IpAddress("10.96.0.1".parse().unwrap())];
                s
            },
            Denied(ForbiddenSan),
        ),
        // Rule 5.
        (
            "denies a CA basic constraint",
            || {
                let mut s = Scenario::client();
                s.request.extra_extensions = vec![CustomExtension::from_oid_content(
                    &[2, 5, 29, 19],
                    vec![0x30, 0x03, 0x01, 0x01, 0xff],
                )];
                s
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies an unknown extension",
            || {
                let mut s = Scenario::client();
                s.request.extra_extensions = vec![CustomExtension::from_oid_content(&[1, 2, 3, 4], vec![0x05, 0x00])];
                s
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a critical provider-ID extension",
            || {
                let mut s = Scenario::client();
                s.request.provider_id_critical = true;
                s
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a repeated provider-ID extension",
            || {
                let mut s = Scenario::client();
                let value = s.request.provider_id_extension.clone().unwrap();
                s.request.extra_extensions = vec![CustomExtension::from_oid_content(
                    attestation::names::PROVIDER_ID_OID,
                    value,
                )];
                s
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a critical CA:TRUE basic constraint in a second extensionRequest value",
            || {
                client_by_hand(|p| {
                    p.attributes = attributes(&[attribute(
                        oids::EXTENSION_REQUEST,
                        &[seq(&[provider_id_extension(PID)]), seq(&[ca_true_extension()])],
                    )])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies extensions placed after an empty extensionRequest SET",
            || {
                client_by_hand(|p| {
                    p.attributes = attributes(&[seq(&[
                        tests::pkcs10::oid(oids::EXTENSION_REQUEST),
                        set(&[]),
                        seq(&[provider_id_extension(PID)]),
                    ])])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies an empty extensionRequest SET",
            || client_by_hand(|p| p.attributes = attributes(&[attribute(oids::EXTENSION_REQUEST, &[])])),
            Denied(ForbiddenExtension),
        ),
        (
            "denies a challengePassword attribute",
            || {
                client_by_hand(|p| {
                    p.attributes = attributes(&[
                        extension_request(&[provider_id_extension(PID)]),
                        attribute(oids::CHALLENGE_PASSWORD, &[string(tag::PRINTABLE_STRING, "secret")]),
                    ])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies two extensionRequest attributes",
            || {
                client_by_hand(|p| {
                    p.attributes = attributes(&[
                        extension_request(&[provider_id_extension(PID)]),
                        extension_request(&[ca_true_extension()]),
                    ])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies bytes after the Extensions value inside the extensionRequest SET",
            || {
                client_by_hand(|p| {
                    let mut values = seq(&[provider_id_extension(PID)]);
                    values.push(0x01);
                    p.attributes = attributes(&[seq(&[
                        tests::pkcs10::oid(oids::EXTENSION_REQUEST),
                        tlv(tag::SET, &values),
                    ])])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies bytes after the last extension inside the Extensions value",
            || {
                client_by_hand(|p| {
                    let mut extensions = provider_id_extension(PID);
                    extensions.extend([0x05, 0x00]);
                    p.attributes = attributes(&[attribute(oids::EXTENSION_REQUEST, &[tlv(tag::SEQUENCE, &extensions)])])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a critical flag written out as FALSE (not DER)",
            || {
                client_by_hand(|p| {
                    p.attributes = attributes(&[extension_request(&[extension(
                        oids::PROVIDER_ID,
                        Critical::ExplicitFalse,
                        &string(tag::UTF8_STRING, PID),
                    )])])
                })
            },
            Denied(ForbiddenExtension),
        ),
        // Rule 6.
        (
            "denies server auth on a client CSR",
            || {
                let mut s = Scenario::client();
                s.csr.usages.push(usage::SERVER_AUTH.into());
                s
            },
            Denied(ForbiddenUsage),
        ),
        (
            "denies key encipherment for an ECDSA key",
            || {
                let mut s = Scenario::client();
                s.csr.usages.push(usage::KEY_ENCIPHERMENT.into());
                s
            },
            Denied(ForbiddenUsage),
        ),
        (
            "denies a CSR without client auth",
            || {
                let mut s = Scenario::client();
                s.csr.usages = vec![usage::DIGITAL_SIGNATURE.into()];
                s
            },
            Denied(ForbiddenUsage),
        ),
        // Rule 7.
        (
            "denies a service account",
            || {
                let mut s = Scenario::client();
                s.csr.username = "system:serviceaccount:kube-system:default".into();
                s.csr.groups = vec!["system:serviceaccounts".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "denies a bootstrap user outside system:bootstrappers",
            || {
                let mut s = Scenario::client();
                s.csr.groups = vec!["system:authenticated".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "denies a token that is not the Machine's KubeadmConfig's",
            || {
                let mut s = Scenario::client();
                s.csr.username = "system:bootstrap:ghijkl".into();
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "denies a renewal by another node",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.csr.username = "system:node:worker-1".into();
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "a request from the node for a Machine without a claim is an adoption (rule 7)",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.machines[0]["metadata"]["annotations"] = json!({});
                s
            },
            Approved,
        ),
        // Rule 8.
        (
            "denies a CSR without the provider-ID extension",
            || {
                let mut s = Scenario::client();
                s.request.provider_id_extension = None;
                s
            },
            Denied(MissingProviderId),
        ),
        (
            "denies a provider ID encoded as PrintableString",
            || {
                let mut s = Scenario::client();
                let mut value = s.request.provider_id_extension.clone().unwrap();
                value[0] = 0x13;
                s.request.provider_id_extension = Some(value);
                s
            },
            Denied(MissingProviderId),
        ),
        (
            "denies an empty provider ID",
            || {
                let mut s = Scenario::client();
                s.request.provider_id_extension = Some(vec![0x0c, 0x00]);
                s
            },
            Denied(MissingProviderId),
        ),
        // Rule 9.
        (
            "denies a provider ID no Machine has once all Machines have one",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-0", "aws:///us-east-1a/i-unknown");
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "waits while a Machine still has no provider ID",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-2", "aws:///us-east-1a/i-unknown");
                s.machines.push(capi::machine("worker-2", None));
                s
            },
            Retry,
        ),
        (
            "denies a provider ID on two Machines",
            || {
                let mut s = Scenario::client();
                s.machines[1]["spec"]["providerID"] = json!(PID);
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "denies a provider ID only a Machine of another namespace has",
            || {
                let mut s = Scenario::client();
                s.machines[0]["metadata"]["namespace"] = json!("team-b");
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "denies a provider ID only a Machine of another Cluster has",
            || {
                let mut s = Scenario::client();
                s.machines[0]["spec"]["clusterName"] = json!("other");
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "denies a Machine being deleted",
            || {
                let mut s = Scenario::client();
                s.machines[0]["metadata"]["deletionTimestamp"] = json!("2026-11-22T07:59:00Z");
                s
            },
            Denied(MachineNotReady),
        ),
        (
            "denies the renewal of a deleted Machine's node, even while another Machine has no provider ID yet",
            || {
                let mut s = Scenario::client();
                s.renewal();
                // Remediated: worker-0 deleted, its replacement not provisioned yet.
                s.machines.remove(0);
                s.machines.push(capi::machine("worker-0-r7x2k", None));
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "denies the renewal of an instance removed from its MachinePool's providerIDList",
            || {
                let mut s = pool_instance("pool-node-x1");
                s.machines[2]["spec"]["providerIDList"] = json!([POOL_PID_2]);
                annotate(
                    &mut s.machines[2],
                    "cluster.x-k8s.io/kubelet-claims",
                    &json!({ POOL_PID: pool_claim(POOL_PID, "pool-node-x1") }).to_string(),
                );
                s.csr.username = "system:node:pool-node-x1".into();
                s.csr.groups = vec!["system:nodes".into()];
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "waits for bootstrap data",
            || {
                let mut s = Scenario::client();
                s.machines[0]["status"] = json!({});
                s
            },
            Retry,
        ),
        (
            "expires waiting for bootstrap data past --csr-max-age",
            || {
                let mut s = Scenario::client();
                s.machines[0]["status"] = json!({});
                s.first_seen = NOW - Duration::minutes(16);
                s
            },
            Denied(Expired),
        ),
        (
            "waits for a KubeadmConfig not yet seen",
            || {
                let mut s = Scenario::client();
                s.configs.remove(0);
                s
            },
            Retry,
        ),
        (
            "a KubeadmConfig labeled for another Cluster is not the Machine's: wait as for one not seen",
            || {
                let mut s = Scenario::client();
                s.configs[0]["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "other"});
                s
            },
            Retry,
        ),
        (
            "approves with a KubeadmConfig labeled for the Machine's own Cluster",
            || {
                let mut s = Scenario::client();
                let cluster = s.cluster["metadata"]["name"].clone();
                s.configs[0]["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": cluster});
                s
            },
            Approved,
        ),
        // Rule 10.
        (
            "denies a node name unrelated to the Machine",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("kube-apiserver-0", PID);
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a name whose Node carries another provider ID",
            || {
                let mut s = Scenario::client();
                s.nodes.push(capi::node("worker-0", Some("aws:///us-east-1a/i-0def")));
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a name other than the claim's",
            || {
                let mut s = Scenario::client();
                s.claim("worker-0", "first-csr", None);
                s.request = RequestSpec::kubelet("worker-0.internal", PID);
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a renewal under another name than the claim's",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.request = RequestSpec::kubelet("worker-0.internal", PID);
                s.csr.username = "system:node:worker-0.internal".into();
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "waits when the workload cluster cannot be asked for Nodes",
            || {
                let mut s = Scenario::client();
                s.nodes_unreachable = true;
                s
            },
            Retry,
        ),
        // Rule 11.
        (
            "denies the hijack of a registered node (status.nodeRef)",
            || {
                let mut s = Scenario::client();
                s.machines[0]["status"]["nodeRef"] = json!({"name": "worker-0"});
                s
            },
            Denied(NodeAlreadyRegistered),
        ),
        (
            "denies an initial request when the Node exists",
            || {
                let mut s = Scenario::client();
                s.nodes.push(capi::node("worker-0", Some(PID)));
                s
            },
            Denied(NodeAlreadyRegistered),
        ),
        (
            "denies an initial request for a claimed Machine",
            || {
                let mut s = Scenario::client();
                s.claim("worker-0", "another-csr", None);
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
        (
            "denies when the claim annotation does not decode",
            || {
                let mut s = Scenario::client();
                annotate(&mut s.machines[0], "cluster.x-k8s.io/kubelet-claim", "{not json");
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
        (
            "denies a second instance claim in a MachinePool",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("pool-node-x1", "aws:///us-east-1a/i-pool1");
                let mut pool = capi::machine_pool("pool-a", &["aws:///us-east-1a/i-pool1"]);
                annotate(
                    &mut pool,
                    "cluster.x-k8s.io/kubelet-claims",
                    r#"{"aws:///us-east-1a/i-pool1":{"nodeName":"pool-node-x1","providerID":"aws:///us-east-1a/i-pool1","csrUID":"first","claimedAt":"2026-11-01T00:00:00Z"}}"#,
                );
                s.machines.push(pool);
                s.configs.push(capi::kubeadm_config("pool-a-kc", "abcdef", "v1beta2"));
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
        // Rule 10: a node name belongs to one Machine or pool instance.
        (
            "denies a pool instance taking another Machine's name",
            || pool_instance("worker-1"),
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking another Machine's infrastructure name",
            || pool_instance("worker-1-infra"),
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking another Machine's DNS address",
            || pool_instance("worker-1.internal"),
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking another Machine's nodeRef",
            || {
                let mut s = pool_instance("node-b");
                s.machines[1]["status"]["nodeRef"] = json!({"name": "node-b"});
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking the name on another Machine's claim",
            || {
                let mut s = pool_instance("node-c");
                let record = json!({"nodeName": "node-c", "providerID": "aws:///us-east-1a/i-0def",
                                    "csrUID": "x", "claimedAt": "2026-11-01T00:00:00Z"});
                annotate(
                    &mut s.machines[1],
                    "cluster.x-k8s.io/kubelet-claim",
                    &record.to_string(),
                );
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking the name another instance of its pool claimed",
            || {
                let mut s = pool_instance("pool-node-x2");
                let claims = json!({ POOL_PID_2: pool_claim(POOL_PID_2, "pool-node-x2") });
                annotate(
                    &mut s.machines[2],
                    "cluster.x-k8s.io/kubelet-claims",
                    &claims.to_string(),
                );
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "denies a pool instance taking the name an instance of another pool claimed",
            || {
                let mut s = pool_instance("pool-node-y1");
                let mut other = capi::machine_pool("pool-b", &["aws:///us-east-1a/i-poolb1"]);
                let claims =
                    json!({ "aws:///us-east-1a/i-poolb1": pool_claim("aws:///us-east-1a/i-poolb1", "pool-node-y1") });
                annotate(&mut other, "cluster.x-k8s.io/kubelet-claims", &claims.to_string());
                s.machines.push(other);
                s
            },
            Denied(NodeNameMismatch),
        ),
        (
            "approves a pool instance whose name a removed instance once claimed",
            || {
                let mut s = pool_instance("pool-node-x9");
                let claims =
                    json!({ "aws:///us-east-1a/i-gone": pool_claim("aws:///us-east-1a/i-gone", "pool-node-x9") });
                annotate(
                    &mut s.machines[2],
                    "cluster.x-k8s.io/kubelet-claims",
                    &claims.to_string(),
                );
                s
            },
            Approved,
        ),
        (
            "denies a Machine asking for a name another Machine's nodeRef holds",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-0.internal", PID);
                s.machines[1]["status"]["nodeRef"] = json!({"name": "worker-0.internal"});
                s
            },
            Denied(NodeNameMismatch),
        ),
        // Rule 11: a pool instance (or Machine) is registered by its Node.
        (
            "denies a pool instance whose Node registered under another name",
            || {
                let mut s = pool_instance("pool-node-new");
                s.nodes.push(capi::node("pool-node-x1", Some(POOL_PID)));
                s
            },
            Denied(NodeAlreadyRegistered),
        ),
        (
            "denies a pool instance whose Node the pool's nodeRefs names",
            || {
                let mut s = pool_instance("pool-node-new");
                s.machines[2]["status"]["nodeRefs"] = json!([{"kind": "Node", "name": "pool-node-x1"}]);
                s.nodes.push(capi::node("pool-node-x1", Some(POOL_PID)));
                s
            },
            Denied(NodeAlreadyRegistered),
        ),
        (
            "waits on a pool instance while the Nodes cannot be read",
            || {
                let mut s = pool_instance("pool-node-x1");
                s.nodes_unreachable = true;
                s
            },
            Retry,
        ),
        (
            "approves a pool instance when only another instance's Node exists",
            || {
                let mut s = pool_instance("pool-node-x1");
                s.nodes.push(capi::node("pool-node-x2", Some(POOL_PID_2)));
                s
            },
            Approved,
        ),
        (
            "denies a Machine whose Node registered under another name before its nodeRef",
            || {
                let mut s = Scenario::client();
                s.nodes.push(capi::node("i-0abc.ec2.internal", Some(PID)));
                s
            },
            Denied(NodeAlreadyRegistered),
        ),
        // Rule 12: an EK-bound Machine accepts only tpm/v1 with its EK.
        (
            "denies an insecure/v1 renewal of a Machine whose claim records an EK",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.claim("worker-0", "earlier-csr", Some(EK));
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "denies an insecure/v1 first join of a Machine carrying an EK pin",
            || {
                let mut s = Scenario::client();
                annotate(&mut s.machines[0], "cluster.x-k8s.io/tpm-ek-sha256", EK);
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "denies an insecure/v1 instance of an EK-pinned MachinePool",
            || {
                let mut s = pool_instance("pool-node-x1");
                annotate(&mut s.machines[2], "cluster.x-k8s.io/tpm-ek-sha256", EK);
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "denies an insecure/v1 renewal of a pool instance whose claim records an EK",
            || {
                let mut s = pool_instance("pool-node-x1");
                let mut claim = pool_claim(POOL_PID, "pool-node-x1");
                claim["ekSHA256"] = json!(EK);
                annotate(
                    &mut s.machines[2],
                    "cluster.x-k8s.io/kubelet-claims",
                    &json!({ POOL_PID: claim }).to_string(),
                );
                s.csr.username = "system:node:pool-node-x1".into();
                s.csr.groups = vec!["system:nodes".into()];
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "approves tpm/v1 with the EK a Machine's claim records, on renewal",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.claim("worker-0", "earlier-csr", Some(EK));
                s.as_tpm(verified(EK));
                s
            },
            Approved,
        ),
        // Rule 12.
        (
            "denies a CSR without attestation blocks",
            || {
                let mut s = Scenario::client();
                s.request.provider = None;
                s
            },
            Denied(AttestationMissing),
        ),
        (
            "denies insecure/v1 where the Cluster allows only tpm",
            || {
                let mut s = Scenario::client();
                s.cluster = capi::cluster("tpm");
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "denies insecure/v1 filed with the tpm signer",
            || {
                let mut s = Scenario::client();
                s.csr.signer_name = SIGNER_TPM.into();
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "denies an unsupported version",
            || {
                let mut s = Scenario::client();
                s.request.provider = Some("insecure/v2".into());
                s
            },
            Denied(UnsupportedAttestationVersion),
        ),
        (
            "denies an unknown provider",
            || {
                let mut s = Scenario::client();
                s.request.provider = Some("sgx/v1".into());
                s
            },
            Denied(UnsupportedAttestationVersion),
        ),
        (
            "denies insecure/v1 with a DATA block",
            || {
                let mut s = Scenario::client();
                s.request.data = Some(b"x".to_vec());
                s
            },
            Denied(AttestationInvalid),
        ),
        (
            "denies an EK the verifier does not trust",
            || {
                let mut s = Scenario::client();
                s.as_tpm(Verification::Failed {
                    reason: EndorsementKeyUntrusted,
                    message: "no chain".into(),
                });
                s
            },
            Denied(EndorsementKeyUntrusted),
        ),
        (
            "denies a failed challenge",
            || {
                let mut s = Scenario::client();
                s.as_tpm(Verification::Failed {
                    reason: ChallengeFailed,
                    message: "wrong secret".into(),
                });
                s
            },
            Denied(ChallengeFailed),
        ),
        (
            "approves a verified tpm/v1 CSR",
            || {
                let mut s = Scenario::client();
                s.as_tpm(verified(EK));
                s
            },
            Approved,
        ),
        (
            "approves the re-bootstrap of a claimed, registered Machine with the claim's EK",
            || {
                let mut s = Scenario::client();
                s.as_tpm(verified(EK));
                s.claim("worker-0", "lost-disk-csr", Some(EK));
                s.machines[0]["status"]["nodeRef"] = json!({"name": "worker-0"});
                s.nodes.push(capi::node("worker-0", Some(PID)));
                s
            },
            Approved,
        ),
        (
            "denies the re-bootstrap of a claimed Machine with another EK",
            || {
                let mut s = Scenario::client();
                s.as_tpm(verified(OTHER_EK));
                s.claim("worker-0", "first-csr", Some(EK));
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
        (
            "approves tpm/v1 for a pool instance whose EK only a removed instance's lingering record holds",
            || {
                let mut s = pool_instance("pool-node-x1");
                let mut gone = pool_claim("aws:///us-east-1a/i-pool-gone", "pool-node-gone");
                gone["ekSHA256"] = json!(EK);
                annotate(
                    &mut s.machines[2],
                    "cluster.x-k8s.io/kubelet-claims",
                    &json!({ "aws:///us-east-1a/i-pool-gone": gone }).to_string(),
                );
                s.as_tpm(verified(EK));
                s
            },
            Approved,
        ),
        (
            "denies a tpm/v1 renewal showing another EK",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.claim("worker-0", "first-csr", Some(EK));
                s.as_tpm(verified(OTHER_EK));
                s
            },
            Denied(EndorsementKeyMismatch),
        ),
        (
            "denies an insecure re-bootstrap of a TPM-claimed Machine",
            || {
                let mut s = Scenario::client();
                s.claim("worker-0", "first-csr", Some(EK));
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
    ];
    let reached = check(&cases);
    // Every client reason of SPEC section 3 but `Superseded`, which only the TPM two-phase
    // flow in the controller produces.
    let all = [
        InvalidRequest,
        InvalidSignature,
        SubjectMismatch,
        ForbiddenSan,
        ForbiddenExtension,
        ForbiddenUsage,
        RequesterNotAllowed,
        MissingProviderId,
        MachineNotFound,
        MachineNotReady,
        NodeNameMismatch,
        NodeAlreadyRegistered,
        MachineAlreadyClaimed,
        AttestationMissing,
        AttestationNotAllowed,
        UnsupportedAttestationVersion,
        AttestationInvalid,
        EndorsementKeyUntrusted,
        EndorsementKeyMismatch,
        ChallengeFailed,
        Expired,
    ];
    let missing: Vec<_> = all.iter().filter(|r| !reached.contains(r)).collect();
    assert!(missing.is_empty(), "client reasons no case reaches: {missing:?}");
}

#[test]
fn serving_csr_table() {
    use DenyReason::*;
    use Expect::{Approved, Denied, Retry};
    let cases: Vec<Case> = vec![
        (
            "approves DNS and IP SANs that are the Machine's addresses",
            Scenario::serving,
            Approved,
        ),
        (
            "approves a DNS SAN differing only in case",
            || {
                let mut s = Scenario::serving();
                s.request.sans = vec![SanType::DnsName("worker-0.ec2.INTERNAL".try_into().unwrap())];
                s
            },
            Approved,
        ),
        (
            "approves an IPv6 SAN in another spelling",
            || {
                let mut s = Scenario::serving();
                s.request.sans = vec![SanType::IpAddress("fd00:0:0:0:0:0:0:7".parse().unwrap())];
                s
            },
            Approved,
        ),
        (
            "approves key encipherment with an ECDSA key (kubelets before 1.27)",
            || {
                let mut s = Scenario::serving();
                s.csr.usages.push(usage::KEY_ENCIPHERMENT.into());
                s
            },
            Approved,
        ),
        (
            "approves a node found through the signer's claim",
            || {
                let mut s = Scenario::serving();
                s.machines[0]["status"].as_object_mut().unwrap().remove("nodeRef");
                s.claim("worker-0", "c", None);
                s
            },
            Approved,
        ),
        (
            "waits for a SAN not yet among the addresses",
            || {
                let mut s = Scenario::serving();
                s.request.sans.push(SanType::IpAddress("192.168.1.9".parse().unwrap()));
                s
            },
            Retry,
        ),
        (
            "denies a SAN still not among the addresses past --csr-max-age",
            || {
                let mut s = Scenario::serving();
                s.request.sans.push(SanType::IpAddress("192.168.1.9".parse().unwrap()));
                s.first_seen = NOW - Duration::minutes(20);
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies an email SAN at once",
            || {
                let mut s = Scenario::serving();
                s.request
                    .sans
                    .push(SanType::Rfc822Name("root@example.com".try_into().unwrap()));
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies a URI SAN at once",
            || {
                let mut s = Scenario::serving();
                s.request
                    .sans
                    .push(SanType::URI("spiffe://cluster/ns/x".try_into().unwrap()));
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies a request without SANs",
            || {
                let mut s = Scenario::serving();
                s.request.sans.clear();
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies a bootstrap-token requester",
            || {
                let mut s = Scenario::serving();
                s.csr.username = "system:bootstrap:abcdef".into();
                s.csr.groups = vec!["system:bootstrappers".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "denies a CN that is not the requester",
            || {
                let mut s = Scenario::serving();
                s.csr.username = "system:node:worker-1".into();
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "denies client auth on a serving CSR",
            || {
                let mut s = Scenario::serving();
                s.csr.usages.push(usage::CLIENT_AUTH.into());
                s
            },
            Denied(ForbiddenUsage),
        ),
        (
            "denies a corrupted signature",
            || {
                let mut s = Scenario::serving();
                s.request.corrupt_signature = true;
                s
            },
            Denied(InvalidSignature),
        ),
        (
            "approves a serving request assembled by hand from DER parts",
            || serving_by_hand(|_| {}),
            Approved,
        ),
        (
            "denies a serving SAN in a second extensionRequest value",
            || {
                serving_by_hand(|p| {
                    p.attributes = attributes(&[attribute(
                        oids::EXTENSION_REQUEST,
                        &[
                            seq(&[serving_san()]),
                            seq(&[san_extension(&["kubernetes.default"], &[])]),
                        ],
                    )])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies serving SANs placed after an empty extensionRequest SET",
            || {
                serving_by_hand(|p| {
                    p.attributes = attributes(&[seq(&[
                        tests::pkcs10::oid(oids::EXTENSION_REQUEST),
                        set(&[]),
                        seq(&[serving_san()]),
                    ])])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a challengePassword attribute on a serving CSR",
            || {
                serving_by_hand(|p| {
                    p.attributes = attributes(&[
                        extension_request(&[serving_san()]),
                        attribute(oids::CHALLENGE_PASSWORD, &[string(tag::PRINTABLE_STRING, "secret")]),
                    ])
                })
            },
            Denied(ForbiddenExtension),
        ),
        (
            "denies a serving SAN extension repeated",
            || serving_by_hand(|p| p.attributes = attributes(&[extension_request(&[serving_san(), serving_san()])])),
            Denied(ForbiddenExtension),
        ),
        (
            "denies attestation blocks on a serving CSR",
            || {
                let mut s = Scenario::serving();
                s.request.provider = Some("insecure/v1".into());
                s
            },
            Denied(InvalidRequest),
        ),
        (
            "waits while no Machine has the node",
            || {
                let mut s = Scenario::serving();
                s.machines[0]["status"].as_object_mut().unwrap().remove("nodeRef");
                s
            },
            Retry,
        ),
        (
            "never finds the Machine through the Node's own providerID",
            || {
                let mut s = Scenario::serving();
                s.machines[0]["status"].as_object_mut().unwrap().remove("nodeRef");
                s.nodes.push(capi::node("worker-0", Some(PID)));
                s
            },
            Retry,
        ),
        (
            "denies a node two Machines point at",
            || {
                let mut s = Scenario::serving();
                let mut twin = s.machines[0].clone();
                twin["metadata"]["name"] = json!("worker-9");
                s.machines.push(twin);
                s
            },
            Denied(MachineNotFound),
        ),
        (
            "waits, then denies, a MachinePool instance: pools carry no addresses",
            || {
                let mut s = Scenario::serving();
                s.machines.clear();
                let mut pool = capi::machine_pool("pool-a", &[PID]);
                annotate(
                    &mut pool,
                    "cluster.x-k8s.io/kubelet-claims",
                    &format!(
                        r#"{{"{PID}":{{"nodeName":"worker-0","providerID":"{PID}","csrUID":"c","claimedAt":"2026-11-01T00:00:00Z"}}}}"#
                    ),
                );
                s.machines.push(pool);
                s.first_seen = NOW - Duration::minutes(20);
                s
            },
            Denied(ForbiddenSan),
        ),
        (
            "denies O=system:masters",
            || {
                let mut s = Scenario::serving();
                s.request.subject = subject(&[
                    (DnType::OrganizationName, "system:masters"),
                    (DnType::CommonName, "system:node:worker-0"),
                ]);
                s
            },
            Denied(SubjectMismatch),
        ),
        (
            "expires when no Machine ever gets the node",
            || {
                let mut s = Scenario::serving();
                s.machines[0]["status"].as_object_mut().unwrap().remove("nodeRef");
                s.first_seen = NOW - Duration::minutes(16);
                s
            },
            Denied(Expired),
        ),
    ];
    let reached = check(&cases);
    let all = [
        InvalidRequest,
        InvalidSignature,
        SubjectMismatch,
        ForbiddenSan,
        ForbiddenExtension,
        ForbiddenUsage,
        RequesterNotAllowed,
        MachineNotFound,
        Expired,
    ];
    let missing: Vec<_> = all.iter().filter(|r| !reached.contains(r)).collect();
    assert!(missing.is_empty(), "serving reasons no case reaches: {missing:?}");
}

/// SPEC rule 7, adoption: the node itself, for a Machine or pool instance with no
/// valid claim that already names it, under rule 12 as for an initial request.
#[test]
fn adoption_table() {
    use DenyReason::*;
    use Expect::*;
    let cases: Vec<Case> = vec![
        (
            "adopts a worker's node named by status.nodeRef (insecure/v1)",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s
            },
            Approved,
        ),
        (
            "adopts a worker's node with tpm/v1 proving its EK",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.as_tpm(verified(EK));
                s
            },
            Approved,
        ),
        (
            "a tpm/v1 adoption goes through the two-phase challenge like an initial request",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.as_tpm(Verification::Challenge {
                    annotations: Default::default(),
                    note: "challenge issued".into(),
                    ek_sha256: Some(EK.into()),
                });
                s
            },
            Retry,
        ),
        (
            "adopts the first control-plane node (kubeadm init) named by its registered Node's provider ID",
            || {
                let mut s = Scenario::client();
                s.control_plane_adoption();
                s
            },
            Approved,
        ),
        (
            "adopts the first control-plane node with tpm/v1",
            || {
                let mut s = Scenario::client();
                s.control_plane_adoption();
                s.as_tpm(verified(EK));
                s
            },
            Approved,
        ),
        (
            "adopts over a stale claim (another provider ID)",
            || {
                let mut s = Scenario::client();
                s.adoption();
                let record = json!({"nodeName": "old", "providerID": "aws:///us-east-1a/i-gone", "csrUID": "x", "claimedAt": "2026-11-01T00:00:00Z"});
                annotate(
                    &mut s.machines[0],
                    "cluster.x-k8s.io/kubelet-claim",
                    &record.to_string(),
                );
                s
            },
            Approved,
        ),
        (
            "refuses another node's certificate (the requester is not the CSR's node)",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.csr.username = "system:node:worker-1".into();
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a node for a Machine whose status.nodeRef names another node",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.machines[0]["status"]["nodeRef"] = json!({"name": "worker-9"});
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a node when the Node carrying the provider ID has another name",
            || {
                let mut s = Scenario::client();
                s.control_plane_adoption();
                s.nodes = vec![capi::node("ip-10-0-0-99", Some(PID))];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a node that registered a Node with another Machine's provider ID under a name that Machine does not carry",
            || {
                // Any node identity may register a Node with any provider ID: for a Machine
                // not joined yet, that Node alone would name the thief.
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("intruder", PID);
                s.nodes.push(capi::node("intruder", Some(PID)));
                s.csr.username = "system:node:intruder".into();
                s.csr.groups = vec!["system:nodes".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses it even when Cluster API wrote the intruder's Node into status.nodeRef",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("intruder", PID);
                s.nodes.push(capi::node("intruder", Some(PID)));
                s.machines[0]["status"]["nodeRef"] = json!({"name": "intruder"});
                s.csr.username = "system:node:intruder".into();
                s.csr.groups = vec!["system:nodes".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a node whose Machine names no node yet (it joins with its token)",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.machines[0]["status"]["nodeRef"] = Value::Null;
                s.nodes.clear();
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a claimed Machine's adoption by another node",
            || {
                let mut s = Scenario::client();
                s.adoption();
                s.claim("worker-1", "earlier-csr", None);
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "waits when the workload cluster's Nodes cannot be read",
            || {
                let mut s = Scenario::client();
                s.control_plane_adoption();
                s.nodes_unreachable = true;
                s
            },
            Retry,
        ),
        (
            "refuses insecure/v1 for an EK-pinned Machine, adoption or not",
            || {
                let mut s = Scenario::client();
                s.adoption();
                annotate(&mut s.machines[0], "cluster.x-k8s.io/tpm-ek-sha256", EK);
                s
            },
            Denied(AttestationNotAllowed),
        ),
        (
            "refuses tpm/v1 proving an EK another Machine's claim records",
            || {
                let mut s = Scenario::client();
                s.adoption();
                let record = json!({"nodeName": "worker-1", "providerID": "aws:///us-east-1a/i-0def", "csrUID": "c1", "ekSHA256": OTHER_EK, "claimedAt": "2026-11-01T00:00:00Z"});
                annotate(
                    &mut s.machines[1],
                    "cluster.x-k8s.io/kubelet-claim",
                    &record.to_string(),
                );
                s.as_tpm(verified(OTHER_EK));
                s
            },
            Denied(EndorsementKeyMismatch),
        ),
        (
            "a Machine whose claim does not decode is not adopted",
            || {
                let mut s = Scenario::client();
                s.adoption();
                annotate(&mut s.machines[0], "cluster.x-k8s.io/kubelet-claim", "{not json");
                s
            },
            Denied(MachineAlreadyClaimed),
        ),
        (
            "adopts a MachinePool instance whose one registered Node carries its provider ID, with tpm/v1 proving an EK pinned on the pool",
            || pool_adoption(&["pool-node-x1"], true),
            Approved,
        ),
        (
            "refuses a pool instance's adoption under insecure/v1: nothing proves the node is that instance",
            || {
                let mut s = pool_instance("pool-node-x1");
                s.nodes.push(capi::node("pool-node-x1", Some(POOL_PID)));
                s.csr.username = "system:node:pool-node-x1".into();
                s.csr.groups = vec!["system:nodes".into()];
                s
            },
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a pool instance's adoption with tpm/v1 whose EK no pin on the pool names (chain or first use)",
            || pool_adoption(&["pool-node-x1"], false),
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a pool instance's adoption under another name than its registered Node's",
            || pool_adoption(&["pool-node-zz"], true),
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses a pool instance's adoption when two Nodes carry its provider ID, the requester's listed first",
            || pool_adoption(&["pool-node-x1", "pool-node-zz"], true),
            Denied(RequesterNotAllowed),
        ),
        (
            "refuses it the same when the requester's Node is listed last",
            || pool_adoption(&["pool-node-zz", "pool-node-x1"], true),
            Denied(RequesterNotAllowed),
        ),
        (
            "waits for a pool instance's adoption when the Nodes cannot be read",
            || {
                let mut s = pool_adoption(&["pool-node-x1"], true);
                s.nodes_unreachable = true;
                s
            },
            Retry,
        ),
    ];
    check(&cases);
}

/// SPEC rule 7 (revision 5): a refused adoption names the names the Machine does carry, so the
/// operator sees at once which name its node should have registered under.
#[test]
fn a_refused_adoption_names_the_machines_names() {
    let mut s = Scenario::client();
    s.control_plane_adoption();
    s.request = RequestSpec::kubelet("intruder", PID);
    s.nodes.push(capi::node("intruder", Some(PID)));
    s.csr.username = "system:node:intruder".into();
    let decision = s.decide();
    let Outcome::Denied { reason, message } = &decision.outcome else {
        panic!("{decision:?}");
    };
    assert_eq!(*reason, DenyReason::RequesterNotAllowed);
    assert!(
        message.contains(r#"name "prod-cp-x7k2p""#) && message.contains(r#"InternalDNS "ip-10-0-0-7""#),
        "{message}"
    );
}

/// A node whose Machine is deleted is told so (SPEC rule 9): while the Machine is being deleted,
/// and once it is gone (a pool instance: once it left `spec.providerIDList`, naming the pool and
/// the claim that ended), without waiting out `--csr-max-age`.
#[test]
fn a_deleted_machines_node_is_told_why_its_renewal_is_refused() {
    let denial = |s: Scenario| match s.decide().outcome {
        Outcome::Denied { reason, message } => (reason, message),
        other => panic!("{other:?}"),
    };
    let mut deleting = Scenario::client();
    deleting.renewal();
    deleting.machines[0]["metadata"]["deletionTimestamp"] = json!("2026-11-22T07:59:00Z");
    let (reason, message) = denial(deleting);
    assert_eq!(reason, DenyReason::MachineNotReady);
    assert!(
        message.contains("Machine worker-0 is being deleted") && message.contains("its claim goes with it"),
        "{message}"
    );
    let mut gone = Scenario::client();
    gone.renewal();
    gone.machines.remove(0);
    let (reason, message) = denial(gone);
    assert_eq!(reason, DenyReason::MachineNotFound);
    assert!(
        message.contains("Machine was deleted") && message.contains(PID),
        "{message}"
    );
    let mut removed = pool_instance("pool-node-x1");
    removed.machines[2]["spec"]["providerIDList"] = json!([POOL_PID_2]);
    annotate(
        &mut removed.machines[2],
        "cluster.x-k8s.io/kubelet-claims",
        &json!({ POOL_PID: pool_claim(POOL_PID, "pool-node-x1") }).to_string(),
    );
    removed.csr.username = "system:node:pool-node-x1".into();
    removed.csr.groups = vec!["system:nodes".into()];
    let (reason, message) = denial(removed);
    assert_eq!(reason, DenyReason::MachineNotFound);
    assert!(
        message.contains("removed from MachinePool pool-a's spec.providerIDList")
            && message.contains(r#"node "pool-node-x1""#),
        "{message}"
    );
    // A first request for the same provider ID still waits while the pool's list may lag.
    let mut joining = pool_instance("pool-node-x9");
    joining.request = RequestSpec::kubelet("pool-node-x9", "aws:///us-east-1a/i-pool9");
    assert!(matches!(joining.decide().outcome, Outcome::Retry { .. }));
}

#[test]
fn an_adoption_writes_the_claim_replacing_a_stale_one() {
    let mut s = Scenario::client();
    s.control_plane_adoption();
    s.as_tpm(verified(EK));
    let decision = s.decide();
    let claim = decision.claim.expect("an adoption claims the Machine");
    assert_eq!(claim.record.node_name, "ip-10-0-0-7");
    assert_eq!(claim.record.ek_sha256.as_deref(), Some(EK));
    assert_eq!(decision.target.map(|t| t.name), Some("prod-cp-x7k2p".into()));
    let requester = decision.rules.iter().find(|r| r.rule == Rule::Requester).unwrap();
    assert!(format!("{:?}", requester.verdict).contains("adoption"), "{requester:?}");
}

#[test]
fn an_approved_initial_request_writes_the_claim_with_a_precondition() {
    let decision = Scenario::client().decide();
    let claim = decision.claim.expect("initial issuance writes a claim");
    assert_eq!(claim.annotation, "cluster.x-k8s.io/kubelet-claim");
    assert_eq!(claim.resource_version.as_deref(), Some("100"));
    assert_eq!(claim.record.node_name, "worker-0");
    assert_eq!(claim.record.provider_id, PID);
    assert_eq!(claim.record.csr_uid, Scenario::client().csr.uid);
    assert_eq!(claim.record.claimed_at, "2026-11-22T08:00:00Z");
    assert_eq!(decision.target.map(|t| t.name), Some("worker-0".into()));
    assert!(matches!(decision.outcome, Outcome::Approved { ref reason, .. } if reason == "AttestedInsecureV1"));
}

#[test]
fn a_tpm_claim_records_the_attested_ek() {
    let mut s = Scenario::client();
    s.as_tpm(verified(EK));
    let claim = s.decide().claim.expect("claim");
    assert_eq!(claim.record.ek_sha256.as_deref(), Some(EK));
}

#[test]
fn renewals_and_resumed_claims_write_no_claim() {
    let mut renewal = Scenario::client();
    renewal.renewal();
    assert!(renewal.decide().claim.is_none());
    let mut resumed = Scenario::client();
    let uid = resumed.csr.uid.clone();
    resumed.claim("worker-0", &uid, None);
    assert!(resumed.decide().claim.is_none());
}

#[test]
fn a_pool_claim_keeps_the_other_instances_records() {
    let mut s = Scenario::client();
    s.request = RequestSpec::kubelet("pool-node-x2", "aws:///us-east-1a/i-pool2");
    let mut pool = capi::machine_pool("pool-a", &["aws:///us-east-1a/i-pool1", "aws:///us-east-1a/i-pool2"]);
    annotate(
        &mut pool,
        "cluster.x-k8s.io/kubelet-claims",
        r#"{"aws:///us-east-1a/i-pool1":{"nodeName":"pool-node-x1","providerID":"aws:///us-east-1a/i-pool1","csrUID":"first","claimedAt":"2026-11-01T00:00:00Z"}}"#,
    );
    s.machines.push(pool);
    s.configs.push(capi::kubeadm_config("pool-a-kc", "abcdef", "v1beta2"));
    let claim = s.decide().claim.expect("claim");
    assert_eq!(claim.annotation, "cluster.x-k8s.io/kubelet-claims");
    let records: Value = serde_json::from_str(&claim.value).unwrap();
    assert_eq!(records.as_object().unwrap().len(), 2);
    assert_eq!(records["aws:///us-east-1a/i-pool2"]["nodeName"], "pool-node-x2");
}

#[test]
fn cheap_rules_run_before_any_cryptography() {
    let mut s = Scenario::client();
    s.as_tpm(verified(EK));
    s.request.corrupt_signature = true;
    s.csr.usages.push(usage::SERVER_AUTH.into());
    let (decision, calls) = s.decide_counting();
    assert_eq!(calls, 0, "the verifier must not run after a cheap failure");
    assert!(matches!(
        decision.verdict(Rule::Signature),
        Some(Verdict::NotEvaluated { .. })
    ));
    assert!(matches!(
        decision.outcome,
        Outcome::Denied {
            reason: DenyReason::ForbiddenUsage,
            ..
        }
    ));
}

#[test]
fn an_unsupported_version_is_answered_with_the_supported_ones() {
    let mut s = Scenario::client();
    s.request.provider = Some("insecure/v9".into());
    let decision = s.decide();
    assert_eq!(
        decision
            .annotations
            .get("cluster.x-k8s.io/attestation-supported-versions")
            .map(String::as_str),
        Some("insecure/v1")
    );
}

#[test]
fn denial_messages_name_the_offending_value_truncated() {
    let mut s = Scenario::client();
    s.csr.username = format!("system:serviceaccount:{}", "x".repeat(5000));
    let decision = s.decide();
    let Outcome::Denied { message, .. } = decision.outcome else {
        panic!("denied")
    };
    assert!(message.contains("system:serviceaccount:xxx"), "{message}");
    assert!(
        message.len() < 600,
        "attacker-controlled text is truncated: {} bytes",
        message.len()
    );
}

#[test]
fn every_failing_cheap_rule_is_reported_not_just_the_first() {
    let mut s = Scenario::client();
    s.request.sans = vec![SanType::DnsName("x".try_into().unwrap())];
    s.csr.usages.push(usage::SERVER_AUTH.into());
    let decision = s.decide();
    assert!(matches!(
        decision.verdict(Rule::SubjectAltNames),
        Some(Verdict::Failed {
            reason: DenyReason::ForbiddenSan,
            ..
        })
    ));
    assert!(matches!(
        decision.verdict(Rule::Usages),
        Some(Verdict::Failed {
            reason: DenyReason::ForbiddenUsage,
            ..
        })
    ));
    assert!(
        matches!(
            decision.outcome,
            Outcome::Denied {
                reason: DenyReason::ForbiddenSan,
                ..
            }
        ),
        "the first in SPEC order decides"
    );
}

/// SPEC section 7 (revision 6), a hostile workload cluster: a denial that rests on the CSR
/// alone (who filed it, what it asks for) is settled, so the signer confirms it with no fresh
/// read of the management cluster; one that rests on what the management cluster holds is not.
#[test]
fn only_a_denial_on_the_csr_alone_is_settled_without_a_read() {
    type SettledCase = (&'static str, fn() -> Scenario, bool);
    let cases: [SettledCase; 4] = [
        (
            "a node asking for another node's name",
            || {
                let mut s = Scenario::client();
                s.renewal();
                s.csr.username = "system:node:worker-1".into();
                s
            },
            true,
        ),
        (
            "a service account",
            || {
                let mut s = Scenario::client();
                s.csr.username = "system:serviceaccount:kube-system:default".into();
                s.csr.groups = vec!["system:serviceaccounts".into()];
                s
            },
            true,
        ),
        (
            "a token that is not the Machine's KubeadmConfig's",
            || {
                let mut s = Scenario::client();
                s.csr.username = "system:bootstrap:ghijkl".into();
                s
            },
            false,
        ),
        (
            "a provider ID no Machine has",
            || {
                let mut s = Scenario::client();
                s.request = RequestSpec::kubelet("worker-0", "aws:///us-east-1a/i-unknown");
                s
            },
            false,
        ),
    ];
    for (name, scenario, settled) in cases {
        let decision = scenario().decide();
        assert!(
            matches!(decision.outcome, Outcome::Denied { .. }),
            "{name}: {decision:?}"
        );
        assert_eq!(decision.settled_by_request, settled, "{name}");
    }
}
