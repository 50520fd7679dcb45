//! The rule engine: pure functions from parsed inputs to a [`Decision`].
//!
//! The controller fetches, calls [`decide`], and applies the result; the offline `check`
//! command does the same without a cluster. No I/O and no clock reads happen here: time comes
//! in through [`Clock`].

mod client;
mod serving;

use std::collections::BTreeMap;

use time::{Duration, OffsetDateTime};

use crate::attestor::Verifiers;
use crate::csr_object::{CsrDirectory, CsrObject};
use crate::decision::{CsrKind, Decision, DenyReason, Outcome, Rule, RuleOutcome, Verdict};
use crate::machine::{ClusterView, Inventory, NodeView};
use crate::names::{SIGNER_AWS, SIGNER_AZURE, SIGNER_GCP, SIGNER_INSECURE, SIGNER_KUBELET_SERVING, SIGNER_TPM};

/// Time, as the signer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// Now.
    pub now: OffsetDateTime,
    /// When the signer first saw this CSR.
    pub first_seen: OffsetDateTime,
    /// `--csr-max-age`: how long transient gaps are retried.
    pub max_age: Duration,
}

/// The answer of a Node lookup in the workload cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLookup {
    /// A Node of that name exists.
    Found(NodeView),
    /// No Node of that name.
    Absent,
    /// The workload cluster could not be asked (a transient gap).
    Unavailable(String),
}

/// Where Nodes are looked up: the workload apiserver and a watch cache in the controller, a
/// file offline.
pub trait NodeDirectory {
    /// The Node called `name`.
    fn node(&self, name: &str) -> NodeLookup;
    /// The names of every Node whose `spec.providerID` is `provider_id`, sorted; `Err` when
    /// the workload cluster cannot be asked (a transient gap). Rule 11: an instance or Machine
    /// whose Node registered under any name is registered. Rule 7: a pool instance is adopted
    /// only when exactly one Node carries its provider ID. Several Nodes can: a Node's
    /// providerID is written by its own kubelet, so a caller never picks "the first" of them.
    fn nodes_with_provider_id(&self, provider_id: &str) -> Result<Vec<String>, String>;
}

impl NodeDirectory for [NodeView] {
    fn node(&self, name: &str) -> NodeLookup {
        self.iter()
            .find(|n| n.name == name)
            .cloned()
            .map_or(NodeLookup::Absent, NodeLookup::Found)
    }

    fn nodes_with_provider_id(&self, provider_id: &str) -> Result<Vec<String>, String> {
        let mut names: Vec<String> = self
            .iter()
            .filter(|n| n.provider_id.as_deref() == Some(provider_id))
            .map(|n| n.name.clone())
            .collect();
        names.sort();
        Ok(names)
    }
}

impl NodeDirectory for Vec<NodeView> {
    fn node(&self, name: &str) -> NodeLookup {
        self.as_slice().node(name)
    }

    fn nodes_with_provider_id(&self, provider_id: &str) -> Result<Vec<String>, String> {
        self.as_slice().nodes_with_provider_id(provider_id)
    }
}

/// Everything a decision depends on.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    /// The CSR.
    pub csr: &'a CsrObject,
    /// Its Cluster (opted in; the caller filters).
    pub cluster: &'a ClusterView,
    /// The Cluster's Machines, MachinePools and KubeadmConfigs.
    pub inventory: &'a Inventory,
    /// The workload cluster's Nodes.
    pub nodes: &'a dyn NodeDirectory,
    /// The workload cluster's other CSRs.
    pub csrs: &'a dyn CsrDirectory,
    /// The attestation verifiers.
    pub verifiers: &'a Verifiers,
    /// The signer's clock.
    pub clock: Clock,
}

/// The CSR is for a signer this project does not handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("signer {signer_name:?} is not handled by node-attestation-signer")]
pub struct NotOurSigner {
    /// The CSR's signerName.
    pub signer_name: String,
}

/// What kind of CSR a signer name is, if it is one of ours.
pub fn classify(signer_name: &str) -> Option<CsrKind> {
    match signer_name {
        SIGNER_INSECURE | SIGNER_TPM | SIGNER_GCP | SIGNER_AWS | SIGNER_AZURE => Some(CsrKind::KubeletClient),
        SIGNER_KUBELET_SERVING => Some(CsrKind::KubeletServing),
        _ => None,
    }
}

/// Decides a CSR.
pub fn decide(inputs: &Inputs<'_>) -> Result<Decision, NotOurSigner> {
    match classify(&inputs.csr.signer_name) {
        Some(CsrKind::KubeletClient) => Ok(client::decide(inputs)),
        Some(CsrKind::KubeletServing) => Ok(serving::decide(inputs)),
        None => Err(NotOurSigner {
            signer_name: inputs.csr.signer_name.clone(),
        }),
    }
}

/// The node name a request asks for (its CN without `system:node:`), when the request parses
/// that far: what the controller looks up in the workload cluster before calling [`decide`],
/// so the [`NodeDirectory`] it passes holds that one Node. `None` for anything malformed, which
/// [`decide`] then denies with the precise reason.
pub fn requested_node_name(request: &[u8]) -> Option<crate::identity::NodeName> {
    let envelope = crate::envelope::RequestEnvelope::parse(request).ok()?;
    let parsed = crate::csr::ParsedCsr::from_der(&envelope.csr_der).ok()?;
    check_subject(&parsed).ok()
}

/// Collects verdicts, then turns them into a [`Decision`].
struct Book {
    kind: CsrKind,
    verdicts: BTreeMap<Rule, Verdict>,
    order: &'static [Rule],
    /// Rules that failed on the CSR alone ([`Book::fail_on_request`]).
    on_request: std::collections::BTreeSet<Rule>,
}

impl Book {
    fn new(kind: CsrKind, order: &'static [Rule]) -> Self {
        Self {
            kind,
            verdicts: BTreeMap::new(),
            order,
            on_request: Default::default(),
        }
    }

    /// [`Book::fail`] for a verdict read from the CSR alone: a denial by it is settled.
    fn fail_on_request(&mut self, rule: Rule, reason: DenyReason, message: impl Into<String>) {
        self.on_request.insert(rule);
        self.fail(rule, reason, message);
    }

    fn pass(&mut self, rule: Rule, note: impl Into<String>) {
        self.verdicts.insert(rule, Verdict::Passed { note: note.into() });
    }

    fn fail(&mut self, rule: Rule, reason: DenyReason, message: impl Into<String>) {
        self.verdicts.insert(
            rule,
            Verdict::Failed {
                reason,
                message: message.into(),
            },
        );
    }

    fn pending(&mut self, rule: Rule, message: impl Into<String>) {
        self.pending_or(rule, DenyReason::Expired, message);
    }

    fn pending_or(&mut self, rule: Rule, on_expiry: DenyReason, message: impl Into<String>) {
        self.verdicts.insert(
            rule,
            Verdict::Pending {
                message: message.into(),
                on_expiry,
            },
        );
    }

    fn record(&mut self, rule: Rule, verdict: Verdict) {
        self.verdicts.insert(rule, verdict);
    }

    fn any_failed(&self) -> bool {
        self.verdicts.values().any(|v| matches!(v, Verdict::Failed { .. }))
    }

    /// Rule 2, only once every cheap rule held: no cryptography on a request already denied.
    fn check_signature(&mut self, parsed: &crate::csr::ParsedCsr) {
        if self.any_failed() {
            self.record(
                Rule::Signature,
                Verdict::NotEvaluated {
                    why: "a cheaper rule failed: no cryptography".into(),
                },
            );
            return;
        }
        match parsed.verify_signature() {
            Ok(()) => self.pass(
                Rule::Signature,
                format!("self-signature verifies under the {} key", parsed.key_kind),
            ),
            Err(e) => self.fail(Rule::Signature, DenyReason::InvalidSignature, e.to_string()),
        }
    }

    /// Every rule without a verdict yet is marked not evaluated, for `why`.
    fn skip_rest(&mut self, why: &str) {
        for rule in self.order {
            self.verdicts
                .entry(*rule)
                .or_insert_with(|| Verdict::NotEvaluated { why: why.to_owned() });
        }
    }

    fn finish(mut self, clock: &Clock, approved_reason: &str, approved_message: String) -> Decision {
        self.skip_rest("needs the result of a rule that did not pass");
        let rules: Vec<RuleOutcome> = self
            .order
            .iter()
            .filter_map(|rule| {
                self.verdicts
                    .remove(rule)
                    .map(|verdict| RuleOutcome { rule: *rule, verdict })
            })
            .collect();
        let failed_rule = rules
            .iter()
            .find(|r| matches!(r.verdict, Verdict::Failed { .. }))
            .map(|r| r.rule);
        let settled_by_request = failed_rule.is_some_and(|rule| self.on_request.contains(&rule));
        let failed = rules.iter().find_map(|r| match &r.verdict {
            Verdict::Failed { reason, message } => Some((*reason, format!("{}: {message}", r.rule.as_str()))),
            _ => None,
        });
        let pending = rules.iter().find_map(|r| match &r.verdict {
            Verdict::Pending { message, on_expiry } => Some((*on_expiry, format!("{}: {message}", r.rule.as_str()))),
            _ => None,
        });
        let outcome = match (failed, pending) {
            (Some((reason, message)), _) => Outcome::Denied { reason, message },
            (None, Some((on_expiry, message))) => {
                let age = clock.now - clock.first_seen;
                if age > clock.max_age {
                    Outcome::Denied {
                        reason: on_expiry,
                        message: format!(
                            "still pending after {} (--csr-max-age {}): {message}",
                            minutes(age),
                            minutes(clock.max_age)
                        ),
                    }
                } else {
                    Outcome::Retry { message }
                }
            }
            (None, None) => Outcome::Approved {
                reason: approved_reason.to_owned(),
                message: approved_message,
            },
        };
        Decision {
            kind: self.kind,
            outcome,
            rules,
            claim: None,
            annotations: BTreeMap::new(),
            target: None,
            supersedes: None,
            issuance: None,
            cloud_calls: Vec::new(),
            settled_by_request,
        }
    }
}

fn minutes(d: Duration) -> String {
    format!("{}m{}s", d.whole_minutes(), d.whole_seconds() % 60)
}

/// Shortens attacker-controlled values inside messages.
fn shown(value: &str) -> String {
    format!("{:?}", crate::identity::truncate(value, 96))
}

/// Checks `spec.usages` is exactly `required`, plus any of `optional`, each at most once.
fn check_usages(usages: &[String], required: &[&str], optional: &[&str]) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for usage in usages {
        if seen.contains(&usage.as_str()) {
            return Err(format!("usage {} listed twice", shown(usage)));
        }
        if !required.contains(&usage.as_str()) && !optional.contains(&usage.as_str()) {
            return Err(format!(
                "usage {} is not allowed (allowed: {})",
                shown(usage),
                [required, optional].concat().join(", ")
            ));
        }
        seen.push(usage);
    }
    match required.iter().find(|r| !seen.contains(r)) {
        Some(missing) => Err(format!("usage {missing:?} is required")),
        None => Ok(()),
    }
}

/// Checks the subject is exactly CN=system:node:<name>, O=system:nodes; returns the node name.
fn check_subject(csr: &crate::csr::ParsedCsr) -> Result<crate::identity::NodeName, String> {
    use crate::csr::StringKind;
    use crate::names::{GROUP_NODES, NODE_USER_PREFIX};
    if let Some(attr) = csr.subject.iter().find(|a| !a.is_common_name() && !a.is_organization()) {
        return Err(format!("subject attribute {} is not allowed (only CN and O)", attr.oid));
    }
    if csr.subject.iter().any(|a| a.multi_valued_rdn) {
        return Err("multi-valued RDNs are not allowed".into());
    }
    if csr
        .subject
        .iter()
        .any(|a| a.kind == StringKind::Other || a.value.is_none())
    {
        return Err("subject values must be PrintableString or UTF8String".into());
    }
    let orgs: Vec<&str> = csr.organizations().filter_map(|a| a.value.as_deref()).collect();
    if orgs != [GROUP_NODES] {
        return Err(format!(
            "O must be exactly [{GROUP_NODES:?}], got {}",
            shown(&format!("{orgs:?}"))
        ));
    }
    let cns: Vec<&str> = csr.common_names().filter_map(|a| a.value.as_deref()).collect();
    let [cn] = cns.as_slice() else {
        return Err(format!("exactly one CN required, got {}", cns.len()));
    };
    let name = cn
        .strip_prefix(NODE_USER_PREFIX)
        .ok_or_else(|| format!("CN {} does not start with {NODE_USER_PREFIX:?}", shown(cn)))?;
    crate::identity::NodeName::new(name).map_err(|e| format!("CN {}: {e}", shown(cn)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usages_are_an_exact_set() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let req = ["digital signature", "client auth"];
        assert!(check_usages(&v(&["client auth", "digital signature"]), &req, &[]).is_ok());
        assert!(check_usages(&v(&["client auth"]), &req, &[]).is_err());
        assert!(
            check_usages(
                &v(&["client auth", "digital signature", "digital signature"]),
                &req,
                &[]
            )
            .is_err()
        );
        assert!(check_usages(&v(&["client auth", "digital signature", "server auth"]), &req, &[]).is_err());
        assert!(
            check_usages(
                &v(&["client auth", "digital signature", "key encipherment"]),
                &req,
                &["key encipherment"]
            )
            .is_ok()
        );
    }
}
