//! A decision for people: its outcome, every rule's verdict, and what it would write. `check`
//! and `explain` print decisions alike.

use std::fmt::Write;

use attestation::decision::{Decision, Outcome, Verdict};
use attestation::machine::ClusterView;
use attestation::names::ANNOTATION_OPT_IN;

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

/// What the signer does for `cluster` while it is paused (SPEC section 7), naming how it is
/// paused; `None` when it is not.
pub fn paused(cluster: &ClusterView) -> Option<String> {
    let how = cluster.paused?;
    Some(format!(
        "Cluster {} is paused ({how}): the signer decides none of its CSRs and writes nothing for it (no claim, certificate, join token, binding or RBAC change) until it is unpaused; its CSRs stay pending, and the decision shown is the one it would take once the Cluster is unpaused",
        named(cluster)
    ))
}

/// What the workload apiserver's minor lacks (SPEC section 7, "Kubernetes minors"), one note
/// per limitation; `None` from v1.32.
pub fn workload_minor(version: &attestation::kubernetes_minor::ApiserverVersion) -> Option<String> {
    let lacks = version.limitations();
    (!lacks.is_empty()).then(|| {
        format!(
            "the workload apiserver is {version}: {}",
            lacks.iter().map(|l| l.describe()).collect::<Vec<_>>().join("; ")
        )
    })
}

/// The Cluster's `tpm/v1` boot policy as the signer reads it: its ConfigMap and images, or why
/// it holds the Cluster's `tpm/v1` CSRs; `None` without one.
pub fn boot_policy(cluster: &ClusterView) -> Option<String> {
    use attestation::tpm::boot_policy::{PolicyState, SecureBoot};
    match &cluster.boot_policy {
        PolicyState::None => None,
        PolicyState::Required => Some(
            "tpm/v1 boot policy: none named, and the signer requires one (--tpm-require-boot-policy): it holds the Cluster's tpm/v1 CSRs (never approved) until the Cluster names one".to_owned(),
        ),
        PolicyState::Unresolved { source } => Some(format!("tpm/v1 boot policy: ConfigMap {source}, not read")),
        PolicyState::Invalid { source, message } => Some(format!(
            "tpm/v1 boot policy: ConfigMap {source} is unusable ({message}): the signer holds the Cluster's tpm/v1 CSRs (never approved) until it is fixed"
        )),
        PolicyState::Loaded { source, policy } => {
            let images: Vec<&str> = policy.images.iter().map(|i| i.name.as_str()).collect();
            let list = |n: usize, what: &str| {
                if n == 0 {
                    format!("any {what}")
                } else {
                    format!("{n} {what} allowed")
                }
            };
            Some(format!(
                "tpm/v1 boot policy: ConfigMap {source}: images {}; Secure Boot {}, {}, {}",
                images.join(", "),
                match (policy.secure_boot, policy.secure_boot_floor) {
                    (_, true) => "required (the signer's floor, --tpm-require-secure-boot)",
                    (SecureBoot::Required, false) => "required",
                    (SecureBoot::Optional, false) => "optional",
                },
                list(policy.authorities.len(), "authorities"),
                list(policy.dbx.len(), "dbx")
            ))
        }
    }
}

/// `<namespace>/<name>`, or the name alone when the namespace is not known.
fn named(cluster: &ClusterView) -> String {
    if cluster.namespace.is_empty() {
        cluster.name.clone()
    } else {
        cluster.key()
    }
}

/// Why the signer ignores `cluster`, naming what its opt-in annotation holds.
pub fn not_opted_in(cluster: &ClusterView) -> String {
    let why = match cluster.annotation(ANNOTATION_OPT_IN) {
        None => format!("{ANNOTATION_OPT_IN}: \"true\" is missing"),
        Some(value) => format!(
            "{ANNOTATION_OPT_IN} is {:?}, not \"true\"",
            attestation::identity::truncate(value, 40)
        ),
    };
    format!(
        "Cluster {} is not opted in ({why}): the signer ignores its CSRs. {OPTED_OUT_KEEPS}",
        named(cluster)
    )
}

/// What a Cluster that is not (or no longer) opted in keeps of the signer (SPEC section 7,
/// revision 5: opting out recreates nothing), for `explain`, `check` and the signer's log.
pub const OPTED_OUT_KEEPS: &str = "What stays as the signer left it: the claims on its Machines and MachinePools (annotations cluster.x-k8s.io/kubelet-claim and kubelet-claims, inert without the signer), the signer's workload RBAC (ClusterRole and ClusterRoleBinding node-attestation-signer-workload, Roles and RoleBindings node-attestation-signer-join-tokens and -revocation, ValidatingAdmissionPolicies and bindings node-attestation-signer-join-tokens and -configmaps), the revocation policy node-attestation-revoked-certificates with its list, which keeps refusing what was revoked before the opt-out until it would have expired, kubeadm's auto-approve bindings as they are (removed ones are not recreated: node-attestation-signer opt-out-bindings prints them), and join tokens as they are; nodes whose kubelet renews through kubelet-authenticator get no new certificate";

/// Annotations of an opt-out in progress: what the Cluster asks of the signer while its nodes
/// roll to stock kubeadm templates (`None` when it asks none of it).
pub fn opting_out(cluster: &ClusterView) -> Option<String> {
    use attestation::join_tokens::{ANNOTATION_JOIN_TOKENS, JOIN_TOKENS_LEAVE};
    use attestation::outside_attestation::{ANNOTATION_LEGACY_AUTOAPPROVE, keeps_legacy_autoapprove};
    let keeps = keeps_legacy_autoapprove(cluster);
    let leaves = cluster.annotation(ANNOTATION_JOIN_TOKENS) == Some(JOIN_TOKENS_LEAVE);
    keeps.then(|| {
        format!(
            "Cluster {} keeps kubeadm's auto-approve bindings ({ANNOTATION_LEGACY_AUTOAPPROVE}: keep): the signer neither removes nor recreates them, so nodes with the stock kubeadm configuration join and renew through kube-controller-manager, while nodes with the plugin still renew through the signer{}",
            named(cluster),
            if leaves {
                String::new()
            } else {
                format!("; an opt-out also leaves join tokens to the bootstrap provider ({ANNOTATION_JOIN_TOKENS}: {JOIN_TOKENS_LEAVE})")
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_not_opted_in_is_told_what_its_annotation_holds() {
        let absent = ClusterView::named("prod", "team-a", &[]);
        assert!(not_opted_in(&absent).contains(r#"kubelet-authentication: "true" is missing"#));
        let off = ClusterView::named("prod", "team-a", &[]).with_annotation(ANNOTATION_OPT_IN, "false");
        let said = not_opted_in(&off);
        assert!(
            said.contains(r#"kubelet-authentication is "false", not "true""#),
            "{said}"
        );
        assert!(said.starts_with("Cluster team-a/prod is not opted in"), "{said}");
        assert!(
            said.contains("opt-out-bindings") && said.contains("not recreated"),
            "{said}"
        );
    }

    #[test]
    fn an_opt_out_in_progress_is_said() {
        let cluster = ClusterView::named("prod", "team-a", &["tpm"]);
        assert_eq!(opting_out(&cluster), None);
        let keeping = cluster
            .clone()
            .with_annotation("cluster.x-k8s.io/kubelet-legacy-autoapprove", "keep");
        let said = opting_out(&keeping).unwrap();
        assert!(
            said.contains("neither removes nor recreates") && said.contains("kubelet-join-tokens"),
            "{said}"
        );
        let leaving = keeping.with_annotation("cluster.x-k8s.io/kubelet-join-tokens", "leave");
        assert!(!opting_out(&leaving).unwrap().contains("kubelet-join-tokens"));
    }

    #[test]
    fn a_paused_cluster_is_told_how_it_is_paused_and_what_waits() {
        assert_eq!(paused(&ClusterView::named("prod", "team-a", &["tpm"])), None);
        let mut cluster = ClusterView::named("prod", "team-a", &["tpm"]);
        cluster.paused = Some(attestation::machine::Paused::Annotation);
        let said = paused(&cluster).unwrap();
        assert!(
            said.starts_with("Cluster team-a/prod is paused (it carries the cluster.x-k8s.io/paused annotation)"),
            "{said}"
        );
        assert!(
            said.contains("stay pending") && said.contains("once the Cluster is unpaused"),
            "{said}"
        );
        cluster.paused = Some(attestation::machine::Paused::Spec);
        assert!(paused(&cluster).unwrap().contains("(spec.paused is true)"));
    }
}
