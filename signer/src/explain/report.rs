//! The pure part of `explain`: which CSR a question is about, what the signer recorded on it,
//! what it was judged against, and how all that reads for people or as JSON. The decision
//! itself is the rule engine's, made by the caller.

use std::fmt::Write;

use attestation::claim::{ClaimState, KubeletClaim};
use attestation::decision::Decision;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;
use attestation::machine::{Inventory, NodeView, TargetKind};
use attestation::names::NODE_USER_PREFIX;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde::Serialize;
use time::OffsetDateTime;

use super::gather::EventLine;

/// Most Events printed for one CSR (the newest).
const MOST_EVENTS: usize = 20;

/// What a CSR's request names, read without judging it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Requested {
    /// The subject's node name (`system:node:<name>` without the prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The provider-ID extension.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The PROVIDER block (`tpm/v1`, `insecure/v1`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attestor: Option<String>,
}

/// Reads the node name, provider ID and attestor a request names; unreadable parts stay
/// `None` (the rules say why).
pub fn requested(request: &[u8]) -> Requested {
    let Ok(envelope) = RequestEnvelope::parse(request) else {
        return Requested::default();
    };
    let attestor = envelope
        .provider
        .as_ref()
        .map(|p| format!("{}/{}", p.provider(), p.version()));
    let Ok(csr) = attestation::csr::ParsedCsr::from_der(&envelope.csr_der) else {
        return Requested {
            attestor,
            ..Requested::default()
        };
    };
    Requested {
        node: csr
            .common_names()
            .find_map(|cn| cn.value.as_deref()?.strip_prefix(NODE_USER_PREFIX))
            .map(str::to_owned),
        provider_id: csr
            .provider_id_extensions()
            .find_map(|e| ProviderId::from_extension_value(&e.value).ok())
            .map(|p| p.as_str().to_owned()),
        attestor,
    }
}

/// What the signer (or anyone) recorded on a CSR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// `Pending`, `Approved` (not signed yet), `Issued`, `Denied` or `Failed`.
    pub state: String,
    /// The condition's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The condition's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the condition was last updated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// The CSR's standing from its conditions and certificate: a denial or failure first, then an
/// issued certificate, then an approval.
pub fn recorded(csr: &CertificateSigningRequest) -> Recorded {
    let status = csr.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c.type_ == type_ && c.status == "True");
    let issued = status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    let (state, found) = if let Some(c) = condition("Denied") {
        ("Denied", Some(c))
    } else if let Some(c) = condition("Failed") {
        ("Failed", Some(c))
    } else if issued {
        ("Issued", condition("Approved"))
    } else if let Some(c) = condition("Approved") {
        ("Approved", Some(c))
    } else {
        ("Pending", None)
    };
    Recorded {
        state: state.to_owned(),
        reason: found.and_then(|c| c.reason.clone()),
        message: found.and_then(|c| c.message.clone()),
        at: found
            .and_then(|c| c.last_update_time.as_ref().or(c.last_transition_time.as_ref()))
            .map(|t| t.0.to_string()),
    }
}

/// The newest CSR whose request names `node` (or that `node` itself filed, a renewal).
///
/// `creationTimestamp` has whole seconds, and a node files two CSRs in one second (`tpm/v1`
/// phases), as can someone else in its name: among CSRs of the same second the one that got
/// furthest wins (issued, then approved, pending, failed, denied), so a node that holds its
/// certificate is explained by it and the others are listed beside it.
pub fn newest_for_node<'a>(csrs: &'a [CertificateSigningRequest], node: &str) -> Option<&'a CertificateSigningRequest> {
    let username = format!("{NODE_USER_PREFIX}{node}");
    let rank = |csr: &CertificateSigningRequest| match recorded(csr).state.as_str() {
        "Issued" => 4,
        "Approved" => 3,
        "Pending" => 2,
        "Failed" => 1,
        _ => 0,
    };
    csrs.iter()
        .filter(|c| attestation::rules::classify(&c.spec.signer_name).is_some())
        .filter(|c| {
            c.spec.username.as_deref() == Some(username.as_str())
                || requested(&c.spec.request.0).node.as_deref() == Some(node)
        })
        .max_by(|a, b| {
            (&a.metadata.creation_timestamp, rank(a), &a.metadata.name).cmp(&(
                &b.metadata.creation_timestamp,
                rank(b),
                &b.metadata.name,
            ))
        })
}

/// The Machine (or MachinePool) a CSR was judged against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JudgedMachine {
    /// `Machine` or `MachinePool`.
    pub kind: String,
    /// `namespace/name`.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its provider ID (a pool: the instance's, when the CSR names one of them).
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// `status.nodeRef` (a pool: whether the instance's node is among `status.nodeRefs`).
    #[serde(rename = "nodeRef", skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<String>,
    /// Bootstrap data is ready.
    #[serde(rename = "bootstrapReady")]
    pub bootstrap_ready: bool,
    /// Being deleted.
    pub deleting: bool,
    /// EK pins.
    #[serde(rename = "ekPins", skip_serializing_if = "Vec::is_empty")]
    pub ek_pins: Vec<String>,
    /// Its claim, as it stands.
    pub claim: ClaimView,
}

/// A claim as `explain` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ClaimView {
    /// No claim yet.
    Unclaimed,
    /// A claim for the current provider ID.
    Valid {
        /// The record.
        #[serde(flatten)]
        record: KubeletClaim,
        /// Which CSR holds it: `this CSR`, `CSR <name>`, or a CSR no longer in the cluster.
        #[serde(rename = "heldBy")]
        held_by: String,
    },
    /// A claim for another provider ID: replaced by the next issuance.
    Stale {
        /// The record.
        #[serde(flatten)]
        record: KubeletClaim,
    },
    /// Does not decode: counted as claimed until an operator removes it.
    Unreadable {
        /// Why.
        why: String,
    },
}

fn claim_view(state: &ClaimState, csr: &CertificateSigningRequest, csrs: &[CertificateSigningRequest]) -> ClaimView {
    match state {
        ClaimState::Unclaimed => ClaimView::Unclaimed,
        ClaimState::Stale(record) => ClaimView::Stale { record: record.clone() },
        ClaimState::Unreadable(why) => ClaimView::Unreadable { why: why.clone() },
        ClaimState::Valid(record) => {
            let held_by = if csr.metadata.uid.as_deref() == Some(record.csr_uid.as_str()) {
                "this CSR".to_owned()
            } else {
                csrs.iter()
                    .find(|c| c.metadata.uid.as_deref() == Some(record.csr_uid.as_str()))
                    .and_then(|c| c.metadata.name.as_deref())
                    .map_or_else(
                        || "a CSR no longer in the workload cluster".to_owned(),
                        |name| format!("CSR {name}"),
                    )
            };
            ClaimView::Valid {
                record: record.clone(),
                held_by,
            }
        }
    }
}

/// The Machine or MachinePool the decision targets, else the one carrying the CSR's provider
/// ID, else the Machine named as the node.
pub fn judged_machine(
    decision: &Decision,
    requested: &Requested,
    inventory: &Inventory,
    csr: &CertificateSigningRequest,
    csrs: &[CertificateSigningRequest],
) -> Option<JudgedMachine> {
    let target = decision.target.as_ref();
    let pid = requested.provider_id.as_deref();
    let pool_target = target.filter(|t| t.kind == TargetKind::MachinePool);
    let pool = inventory.pools.iter().find(|p| match pool_target {
        Some(t) => p.uid == t.uid,
        None => target.is_none() && pid.is_some_and(|pid| p.provider_ids.iter().any(|id| id == pid)),
    });
    if let Some(pool) = pool {
        let instance = pid.filter(|pid| pool.provider_ids.iter().any(|id| id == pid));
        return Some(JudgedMachine {
            kind: "MachinePool".into(),
            name: format!("{}/{}", pool.namespace, pool.name),
            uid: pool.uid.clone(),
            provider_id: instance.map(str::to_owned),
            node_ref: requested.node.as_ref().filter(|n| pool.node_refs.contains(n)).cloned(),
            bootstrap_ready: pool.bootstrap_ready,
            deleting: pool.deleting,
            ek_pins: pool.ek_pins.clone(),
            claim: claim_view(
                &instance.map_or(ClaimState::Unclaimed, |pid| pool.claims.instance(pid)),
                csr,
                csrs,
            ),
        });
    }
    let machine = inventory
        .machines
        .iter()
        .find(|m| target.is_some_and(|t| t.kind == TargetKind::Machine && m.uid() == t.uid))
        .or_else(|| {
            target.is_none().then_some(())?;
            inventory
                .machines
                .iter()
                .find(|m| pid.is_some() && m.provider_id() == pid)
                .or_else(|| {
                    inventory
                        .machines
                        .iter()
                        .find(|m| requested.node.as_deref() == Some(m.name()))
                })
        })?;
    Some(JudgedMachine {
        kind: "Machine".into(),
        name: format!("{}/{}", machine.namespace, machine.name()),
        uid: machine.uid().to_owned(),
        provider_id: machine.provider_id().map(str::to_owned),
        node_ref: machine.node_ref().map(str::to_owned),
        bootstrap_ready: machine.bootstrap_ready,
        deleting: machine.deleting,
        ek_pins: machine.ek_pins().map(str::to_owned).collect(),
        claim: claim_view(&machine.claim(), csr, csrs),
    })
}

/// The CSR as `explain` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CsrSummary {
    /// Its name.
    pub name: String,
    /// Its signer name.
    #[serde(rename = "signerName")]
    pub signer_name: String,
    /// Who filed it.
    pub requester: String,
    /// When (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filed: Option<String>,
    /// Seconds since then.
    #[serde(rename = "ageSeconds", skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
    /// What its request names.
    #[serde(flatten)]
    pub requested: Requested,
}

/// One CSR explained.
#[derive(Debug, Serialize)]
pub struct Explanation<'a> {
    /// `namespace/name` of the Cluster.
    pub cluster: String,
    /// The CSR.
    pub csr: CsrSummary,
    /// What is recorded on it.
    pub recorded: Recorded,
    /// What the rule engine decides now, with every rule's outcome.
    pub now: &'a Decision,
    /// The Machine or MachinePool it was judged against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<JudgedMachine>,
    /// The workload Node of its name or provider ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeLine>,
    /// The Events the signer wrote about it, its Machine and its Cluster (newest last).
    pub events: Vec<EventLine>,
    /// Other CSRs for the same node (newest last).
    #[serde(rename = "otherCSRs", skip_serializing_if = "Vec::is_empty")]
    pub other_csrs: Vec<ListedCsr>,
    /// What `explain` could not know, or assumed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A workload Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeLine {
    /// Its name.
    pub name: String,
    /// Its provider ID.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

/// The CSR summary of `csr` at `now`.
pub fn summary(csr: &CertificateSigningRequest, now: OffsetDateTime) -> CsrSummary {
    let filed = csr
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok());
    CsrSummary {
        name: csr.metadata.name.clone().unwrap_or_default(),
        signer_name: csr.spec.signer_name.clone(),
        requester: csr.spec.username.clone().unwrap_or_default(),
        filed: csr.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        age_seconds: filed.map(|f| (now - f).whole_seconds()),
        requested: requested(&csr.spec.request.0),
    }
}

/// The Node the CSR is for: by name, else by provider ID.
pub fn node_line(requested: &Requested, nodes: &[NodeView]) -> Option<NodeLine> {
    nodes
        .iter()
        .find(|n| requested.node.as_deref() == Some(n.name.as_str()))
        .or_else(|| {
            nodes
                .iter()
                .find(|n| requested.provider_id.is_some() && n.provider_id == requested.provider_id)
        })
        .map(|n| NodeLine {
            name: n.name.clone(),
            provider_id: n.provider_id.clone(),
        })
}

/// The Events about this CSR: those naming it, and those about its Machine (or, folded, its
/// Cluster) that name its Machine; the newest [`MOST_EVENTS`].
pub fn events_about(events: &[EventLine], csr_name: &str, machine: Option<&JudgedMachine>) -> Vec<EventLine> {
    let machine_name = machine.map(|m| m.name.rsplit('/').next().unwrap_or_default().to_owned());
    let relevant: Vec<EventLine> = events
        .iter()
        .filter(|e| {
            mentions(&e.note, csr_name)
                || machine.is_some_and(|m| e.regarding_uid == m.uid)
                || machine_name.as_deref().is_some_and(|name| mentions(&e.note, name))
        })
        .cloned()
        .collect();
    let skip = relevant.len().saturating_sub(MOST_EVENTS);
    relevant.into_iter().skip(skip).collect()
}

/// `word` appears in `text` as a whole name (not inside a longer one: worker-1 is not in
/// worker-10).
fn mentions(text: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let mut after = text[at + word.len()..].chars();
        // A dot ends a sentence, or goes on into a longer DNS name.
        let continues = match after.next() {
            Some('.') => after.next().is_some_and(|c| c.is_ascii_alphanumeric()),
            Some(c) => is_name(c),
            None => false,
        };
        !before.is_some_and(is_name) && !continues
    })
}

/// One line of `--pending` (and of the other CSRs for a node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedCsr {
    /// The CSR.
    #[serde(flatten)]
    pub csr: CsrSummary,
    /// What is recorded on it.
    pub recorded: Recorded,
    /// For a CSR still waiting: the rule engine's outcome now (`Approved`, `Denied`, `Retry`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub now: Option<String>,
    /// Its reason now (the SPEC reason of a denial; the attestor's of an approval).
    #[serde(rename = "nowReason", skip_serializing_if = "Option::is_none")]
    pub now_reason: Option<String>,
    /// The message now.
    #[serde(rename = "nowMessage", skip_serializing_if = "Option::is_none")]
    pub now_message: Option<String>,
}

/// The outcome, reason and message of a decision, as strings.
pub fn outcome_parts(decision: &Decision) -> (String, Option<String>, String) {
    use attestation::decision::Outcome;
    match &decision.outcome {
        Outcome::Approved { reason, message } => ("Approved".into(), Some(reason.clone()), message.clone()),
        Outcome::Denied { reason, message } => ("Denied".into(), Some(reason.as_str().to_owned()), message.clone()),
        Outcome::Retry { message } => ("Retry".into(), None, message.clone()),
        other => (other.name().to_owned(), None, String::new()),
    }
}

/// True for a CSR `--pending` lists: ours, and not issued (pending, approved but unsigned,
/// denied or failed).
pub fn is_listed(csr: &CertificateSigningRequest) -> bool {
    attestation::rules::classify(&csr.spec.signer_name).is_some() && recorded(csr).state != "Issued"
}

fn age(seconds: Option<i64>) -> String {
    match seconds {
        None => "?".into(),
        Some(s) if s < 120 => format!("{s}s"),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86_400),
    }
}

/// One CSR for people.
pub fn render_explanation(e: &Explanation<'_>) -> String {
    let mut out = String::new();
    let csr = &e.csr;
    let _ = writeln!(out, "CSR {} of Cluster {}", csr.name, e.cluster);
    let _ = writeln!(out, "  signer:      {}", csr.signer_name);
    let _ = writeln!(out, "  requester:   {}", csr.requester);
    let _ = writeln!(
        out,
        "  asks for:    node {} · provider ID {} · attestor {}",
        csr.requested.node.as_deref().unwrap_or("(none)"),
        csr.requested.provider_id.as_deref().unwrap_or("(none)"),
        csr.requested.attestor.as_deref().unwrap_or("(none)")
    );
    let _ = writeln!(
        out,
        "  filed:       {} ({} ago)",
        csr.filed.as_deref().unwrap_or("?"),
        age(csr.age_seconds)
    );
    let r = &e.recorded;
    let _ = match (&r.reason, &r.message) {
        (Some(reason), message) => writeln!(
            out,
            "  recorded:    {} ({reason}){}: {}",
            r.state,
            r.at.as_deref().map(|at| format!(" at {at}")).unwrap_or_default(),
            message.as_deref().unwrap_or_default()
        ),
        (None, _) => writeln!(out, "  recorded:    {}", r.state),
    };
    let _ = writeln!(out);
    let _ = write!(
        out,
        "Decision now: {}",
        crate::render::decision(e.now, "claim it would write")
    );
    let _ = writeln!(out);
    match &e.machine {
        None => {
            let _ = writeln!(out, "Machine: none found for this CSR's provider ID or node name");
        }
        Some(m) => {
            let _ = writeln!(out, "{} {} (uid {})", m.kind, m.name, m.uid);
            let _ = writeln!(
                out,
                "  provider ID {} · nodeRef {} · bootstrap {} · {}{}",
                m.provider_id.as_deref().unwrap_or("(none)"),
                m.node_ref.as_deref().unwrap_or("(none)"),
                if m.bootstrap_ready { "ready" } else { "NOT ready" },
                if m.deleting { "DELETING" } else { "not deleting" },
                if m.ek_pins.is_empty() {
                    String::new()
                } else {
                    format!(" · EK pins {}", m.ek_pins.join(", "))
                }
            );
            let _ = match &m.claim {
                ClaimView::Unclaimed => writeln!(out, "  claim:       none"),
                ClaimView::Valid { record, held_by } => writeln!(
                    out,
                    "  claim:       node {} · held by {held_by} (uid {}) · claimed {}{}{}",
                    record.node_name,
                    record.csr_uid,
                    record.claimed_at,
                    record
                        .ek_sha256
                        .as_deref()
                        .map(|ek| format!(" · EK {ek}"))
                        .unwrap_or_default(),
                    record
                        .instance
                        .as_deref()
                        .map(|i| format!(" · instance {i}"))
                        .unwrap_or_default()
                ),
                ClaimView::Stale { record } => writeln!(
                    out,
                    "  claim:       stale (for provider ID {}, node {}): replaced at the next issuance",
                    record.provider_id, record.node_name
                ),
                ClaimView::Unreadable { why } => writeln!(
                    out,
                    "  claim:       UNREADABLE, counted as claimed until an operator removes it: {why}"
                ),
            };
        }
    }
    let _ = match &e.node {
        Some(n) => writeln!(
            out,
            "Node {} (workload cluster): provider ID {}",
            n.name,
            n.provider_id.as_deref().unwrap_or("(none)")
        ),
        None => writeln!(out, "Node: none of this name or provider ID in the workload cluster"),
    };
    if !e.other_csrs.is_empty() {
        let _ = writeln!(out, "Other CSRs for this node (newest last):");
        for other in &e.other_csrs {
            let _ = writeln!(out, "  {}", listed_line(other));
        }
    }
    let _ = writeln!(out, "Events (management cluster, newest last):");
    if e.events.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for event in &e.events {
        let times = if event.count > 1 {
            format!(" x{}", event.count)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {} {} {}{times} {}: {}",
            event.at, event.type_, event.reason, event.regarding, event.note
        );
    }
    for note in &e.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

fn listed_line(c: &ListedCsr) -> String {
    let (state, reason, message) = match (&c.now, c.recorded.state.as_str()) {
        (Some(now), "Pending" | "Approved") => (
            format!("{} (now: {now})", c.recorded.state),
            c.now_reason.clone(),
            c.now_message.clone(),
        ),
        _ => (
            c.recorded.state.clone(),
            c.recorded.reason.clone(),
            c.recorded.message.clone(),
        ),
    };
    format!(
        "{:<32} {:<20} {:>5}  {:<22} {:<24} {}",
        c.csr.name,
        c.csr.requested.node.as_deref().unwrap_or("-"),
        age(c.csr.age_seconds),
        state,
        reason.unwrap_or_else(|| "-".into()),
        message
            .map(|m| attestation::identity::truncate(&m, 160))
            .unwrap_or_default()
    )
}

/// `--pending` for people.
pub fn render_pending(cluster: &str, listed: &[ListedCsr]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Cluster {cluster}: {} CSRs pending, denied or failed",
        listed.len()
    );
    if listed.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<32} {:<20} {:>5}  {:<22} {:<24} MESSAGE",
        "CSR", "NODE", "AGE", "STATE", "REASON"
    );
    for c in listed {
        let _ = writeln!(out, "{}", listed_line(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn csr(name: &str, created: &str, conditions: serde_json::Value, certificate: bool) -> CertificateSigningRequest {
        let mut status = json!({"conditions": conditions});
        if certificate {
            status["certificate"] = json!("Y2VydA==");
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
            "spec": {"request": "", "signerName": attestation::names::SIGNER_INSECURE, "username": format!("system:node:{name}")},
            "status": status,
        }))
        .unwrap()
    }

    fn condition(type_: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": "True", "reason": reason, "message": format!("{reason} message"),
               "lastUpdateTime": "2026-01-01T00:00:00Z"})
    }

    #[test]
    fn the_recorded_state_puts_a_denial_or_failure_before_an_approval() {
        let t = "2026-01-01T00:00:00Z";
        assert_eq!(recorded(&csr("a", t, json!([]), false)).state, "Pending");
        assert_eq!(
            recorded(&csr(
                "a",
                t,
                json!([condition("Approved", "AttestedInsecureV1")]),
                false
            ))
            .state,
            "Approved"
        );
        let issued = recorded(&csr("a", t, json!([condition("Approved", "AttestedInsecureV1")]), true));
        assert_eq!(
            (issued.state.as_str(), issued.reason.as_deref()),
            ("Issued", Some("AttestedInsecureV1"))
        );
        let failed = recorded(&csr(
            "a",
            t,
            json!([
                condition("Approved", "AttestedInsecureV1"),
                condition("Failed", "MachineAlreadyClaimed")
            ]),
            false,
        ));
        assert_eq!(
            (failed.state.as_str(), failed.reason.as_deref()),
            ("Failed", Some("MachineAlreadyClaimed"))
        );
        let denied = recorded(&csr("a", t, json!([condition("Denied", "UnknownMachine")]), false));
        assert_eq!(denied.message.as_deref(), Some("UnknownMachine message"));
        assert_eq!(denied.at.as_deref(), Some("2026-01-01T00:00:00Z"));
    }

    #[test]
    fn the_newest_csr_of_a_node_is_chosen_by_creation_then_name() {
        let csrs = vec![
            csr("w0", "2026-01-01T00:00:00Z", json!([]), false),
            csr("w0", "2026-01-01T00:05:00Z", json!([]), false),
            csr("w1", "2026-01-01T00:09:00Z", json!([]), false),
        ];
        let newest = newest_for_node(&csrs, "w0").unwrap();
        assert_eq!(
            newest.metadata.creation_timestamp.as_ref().unwrap().0.to_string(),
            "2026-01-01T00:05:00Z"
        );
        assert!(newest_for_node(&csrs, "w").is_none());
        // In one second: the issued one, whatever the names.
        let second = "2026-01-01T00:07:00Z";
        let mut tied = csrs.clone();
        tied.push(csr("w0", second, json!([condition("Denied", "Superseded")]), false));
        tied.push(csr("w0", second, json!([condition("Approved", "AttestedTpmV1")]), true));
        tied.push(csr("w0", second, json!([]), false));
        let newest = newest_for_node(&tied, "w0").unwrap();
        assert_eq!(recorded(newest).state, "Issued");
    }

    #[test]
    fn a_name_is_mentioned_only_as_a_whole_name() {
        assert!(mentions("CSR join-worker-1 denied", "join-worker-1"));
        assert!(mentions("Machines worker-1, worker-2", "worker-1"));
        assert!(mentions("claimed worker-1.", "worker-1"));
        assert!(!mentions("CSR join-worker-10 denied", "worker-1"));
        assert!(!mentions("CSR join-worker-10 denied", "join-worker-1"));
        assert!(!mentions("anything", ""));
        assert!(!mentions("node ip-10-0-0-1.ec2.internal", "ip-10-0-0-1"));
    }

    #[test]
    fn an_unreadable_request_names_nothing_and_does_not_panic() {
        assert_eq!(requested(b"not a PEM"), Requested::default());
        assert_eq!(requested(&[0xff; 40]), Requested::default());
    }
}
