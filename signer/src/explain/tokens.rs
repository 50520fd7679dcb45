//! `explain --pending`'s join tokens (SPEC section 7): each token the Cluster's KubeadmConfigs
//! name, what the signer does with it and why, and the expiry its Secret holds (read when the
//! workload identity may read `kube-system` Secrets; the token's secret half is never read
//! into the report).

use std::fmt::Write as _;

use attestation::join_tokens::{self, Joined, LeftBecause, TokenPlan, TokenSecret};
use attestation::machine::{ClusterView, Inventory, NodeView};
use serde::Serialize;
use time::OffsetDateTime;

/// One join token, as `explain` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenLine {
    /// The token ID (`bootstrap-token-<id>`).
    pub id: String,
    /// `kept`, `retire` or `held`.
    pub plan: &'static str,
    /// For whom, or why.
    pub detail: String,
    /// The Secret's `expiration`, `gone`, or why it could not be read.
    pub secret: String,
}

/// Every token of the Cluster and what the signer does with it, or why it leaves them all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenReport {
    /// Why the signer leaves this Cluster's tokens alone, if it does.
    pub left: Option<String>,
    /// The tokens.
    pub tokens: Vec<TokenLine>,
}

/// What the signer would do with each token now (a Node registered with a claimed Machine's
/// provider ID counts as joined; the signer itself waits a few seconds for nodeRef).
pub fn plans(
    cluster: &ClusterView,
    inventory: &Inventory,
    nodes: &[NodeView],
    now: OffsetDateTime,
) -> Vec<(String, TokenPlan)> {
    let joined = |machine: &attestation::machine::MachineView| {
        if machine.node_ref().is_some() {
            Joined::NodeRef
        } else if machine
            .provider_id()
            .is_some_and(|pid| nodes.iter().any(|n| n.provider_id.as_deref() == Some(pid)))
        {
            Joined::Registered(now - join_tokens::REGISTERED_GRACE)
        } else {
            Joined::No
        }
    };
    join_tokens::plan(cluster, inventory, &[], joined, now)
        .into_iter()
        .collect()
}

/// The report, from the plans and what reading each token's Secret gave.
pub fn report(
    left: Option<LeftBecause>,
    plans: &[(String, TokenPlan)],
    secret: impl Fn(&str) -> Result<Option<TokenSecret>, String>,
    now: OffsetDateTime,
) -> TokenReport {
    let tokens = plans
        .iter()
        .map(|(id, plan)| {
            let (plan_word, detail) = match plan {
                TokenPlan::Keep { pools } => (
                    "kept",
                    format!(
                        "valid for the life of MachinePool {}",
                        pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                ),
                TokenPlan::Retire { machines } => (
                    "retire",
                    format!(
                        "Machine {} claimed and joined: deleted",
                        machines.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                ),
                TokenPlan::Hold { holders } => (
                    "held",
                    holders
                        .iter()
                        .map(|h| format!("{} {}", h.what, h.why))
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            };
            let secret = match secret(id) {
                Ok(None) => "gone".to_owned(),
                Ok(Some(s)) => match join_tokens::is_token(&s, id) {
                    Err(e) => format!("not a token: {e}"),
                    Ok(()) => expiry(s.expiration.as_deref(), now),
                },
                Err(why) => format!("not read: {why}"),
            };
            TokenLine {
                id: id.clone(),
                plan: plan_word,
                detail,
                secret,
            }
        })
        .collect();
    TokenReport {
        left: left.map(|why| format!("left to the bootstrap provider: {why}")),
        tokens,
    }
}

fn expiry(expiration: Option<&str>, now: OffsetDateTime) -> String {
    let Some(text) = expiration else {
        return "no expiration".to_owned();
    };
    match OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        Ok(at) if at <= now => format!("expired {text}"),
        Ok(at) => format!(
            "expires {text} (in {})",
            humantime::format_duration(std::time::Duration::from_secs(
                (at - now).whole_seconds().unsigned_abs()
            ))
        ),
        Err(_) => format!("expiration {text:?} does not parse"),
    }
}

/// The report for people.
pub fn render(report: &TokenReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Join tokens: {}", report.tokens.len());
    if let Some(left) = &report.left {
        let _ = writeln!(out, "  {left}");
    }
    for t in &report.tokens {
        let _ = writeln!(out, "  {:<8} {:<7} {}  [{}]", t.id, t.plan, t.detail, t.secret);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use attestation::target::TargetRef;

    #[test]
    fn a_kept_token_shows_its_expiry_and_a_missing_secret_says_gone() {
        let now =
            OffsetDateTime::parse("2026-11-26T12:00:00Z", &time::format_description::well_known::Rfc3339).unwrap();
        let plans = vec![
            (
                "aaaaaa".to_owned(),
                TokenPlan::Keep {
                    pools: vec![TargetRef::pool("pool-a", "ns", "u")],
                },
            ),
            (
                "bbbbbb".to_owned(),
                TokenPlan::Retire {
                    machines: vec![TargetRef::machine("m1", "ns", "u1")],
                },
            ),
        ];
        let report = report(
            None,
            &plans,
            |id| {
                Ok((id == "aaaaaa").then(|| TokenSecret {
                    type_: Some(join_tokens::SECRET_TYPE_BOOTSTRAP_TOKEN.into()),
                    token_id: Some("aaaaaa".into()),
                    expiration: Some("2026-11-28T12:00:00Z".into()),
                }))
            },
            now,
        );
        let text = render(&report);
        assert!(
            text.contains(
                "aaaaaa   kept    valid for the life of MachinePool pool-a  [expires 2026-11-28T12:00:00Z (in 2days)]"
            ),
            "{text}"
        );
        assert!(
            text.contains("bbbbbb   retire  Machine m1 claimed and joined: deleted  [gone]"),
            "{text}"
        );
    }
}
