//! A decision for people: its outcome, every rule's verdict, and what it would write. `check`
//! and `explain` print decisions alike.

use std::fmt::Write;

use attestation::decision::{Decision, Outcome, Verdict};

/// The outcome line, the rules (`pass`, `FAIL`, `wait`, `skip`), and the claim and CSR
/// annotations the decision carries (`claim` names what the claim line says: "claim to write").
pub fn decision(decision: &Decision, claim: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", outcome(&decision.outcome));
    let _ = writeln!(out, "rules:");
    for rule in &decision.rules {
        let (mark, text) = match &rule.verdict {
            Verdict::Passed { note } => ("pass", note.clone()),
            Verdict::Failed { reason, message } => ("FAIL", format!("{reason}: {message}")),
            Verdict::Pending { message, .. } => ("wait", message.clone()),
            Verdict::NotEvaluated { why } => ("skip", why.clone()),
            _ => ("?", String::new()),
        };
        let _ = writeln!(out, "  {mark}  {:<18} {text}", rule.rule.as_str());
    }
    if let Some(write) = &decision.claim {
        let _ = writeln!(
            out,
            "{claim} on {:?} {}: {}={}",
            write.target.kind, write.target.name, write.annotation, write.value
        );
    }
    for (key, value) in &decision.annotations {
        let _ = writeln!(out, "annotation to write on the CSR: {key}={value}");
    }
    out
}

/// `Approved (reason): message`, `Denied (reason): message`, `Retry (left pending): message`.
pub fn outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Approved { reason, message } => format!("Approved ({reason}): {message}"),
        Outcome::Denied { reason, message } => format!("Denied ({reason}): {message}"),
        Outcome::Retry { message } => format!("Retry (left pending): {message}"),
        _ => outcome.name().to_owned(),
    }
}
