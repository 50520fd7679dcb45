//! `node-attestation-signer explain-rbac`: the least privilege `explain` needs to reach workload
//! clusters through their `<cluster>-kubeconfig` Secrets. RBAC cannot name Secrets by pattern,
//! so a role that may read "the kubeconfig Secrets" of a namespace may read every Secret there,
//! the `<cluster>-ca` keys included, which would let its holder issue node identities. This
//! prints, for one namespace, a Role that may `get` exactly the named Clusters' kubeconfig
//! Secrets and a RoleBinding of it to the given people: pure, from the names given, no cluster
//! asked.

use anyhow::{Result, bail};
use serde_json::{Value, json};

/// Arguments of `explain-rbac`.
#[derive(Debug, clap::Args)]
pub struct ExplainRbacArgs {
    /// The Clusters' namespace.
    #[arg(long, short = 'n')]
    pub namespace: String,
    /// A Cluster whose kubeconfig Secret explain may read (repeat for several).
    #[arg(long = "cluster", required = true)]
    pub clusters: Vec<String>,
    /// A group that may run explain for them (repeat for several).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// A user that may run explain for them (repeat for several).
    #[arg(long = "user")]
    pub users: Vec<String>,
    /// Name of the Role and RoleBinding.
    #[arg(long, default_value = "node-attestation-explain-kubeconfigs")]
    pub name: String,
}

/// The Role and RoleBinding, as one YAML stream on stdout.
pub fn run(args: &ExplainRbacArgs) -> Result<()> {
    let objects = objects(args)?;
    for object in objects {
        print!("---\n{}", serde_yaml::to_string(&object)?);
    }
    Ok(())
}

/// The Role allowed `get` on exactly `<cluster>-kubeconfig` and
/// `<cluster>-node-attestation-kubeconfig` of each Cluster, and its binding.
pub fn objects(args: &ExplainRbacArgs) -> Result<[Value; 2]> {
    check_name("namespace", &args.namespace)?;
    check_name("--name", &args.name)?;
    let mut secrets = Vec::new();
    for cluster in &args.clusters {
        check_name("--cluster", cluster)?;
        // Cluster API's, and an operator's own when the Cluster has one (explain picks it as
        // the signer does).
        for secret in [
            format!("{cluster}-kubeconfig"),
            crate::controller::workload_access::operator_kubeconfig_secret(cluster),
        ] {
            if !secrets.contains(&secret) {
                secrets.push(secret);
            }
        }
    }
    let subjects: Vec<Value> = args
        .groups
        .iter()
        .map(|g| ("Group", g))
        .chain(args.users.iter().map(|u| ("User", u)))
        .map(|(kind, name)| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}))
        .collect();
    if subjects.is_empty() {
        bail!("name who may run explain: --group or --user (at least one)");
    }
    let labels = json!({"app.kubernetes.io/name": "node-attestation-signer", "app.kubernetes.io/component": "explain"});
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": args.name, "namespace": args.namespace, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": secrets, "verbs": ["get"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": args.name, "namespace": args.namespace, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": args.name},
        "subjects": subjects,
    });
    Ok([role, binding])
}

/// A Kubernetes object name (DNS-1123 subdomain): anything else would make a Role that names
/// nothing, or that the apiserver refuses.
fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if !ok {
        bail!("{what} {name:?} is not a Kubernetes object name (lowercase letters, digits, '-' and '.')");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(clusters: &[&str]) -> ExplainRbacArgs {
        ExplainRbacArgs {
            namespace: "team-a".into(),
            clusters: clusters.iter().map(|c| (*c).to_owned()).collect(),
            groups: vec!["platform".into()],
            users: vec!["alice".into()],
            name: "node-attestation-explain-kubeconfigs".into(),
        }
    }

    #[test]
    fn the_role_names_exactly_the_kubeconfig_secrets_and_never_a_ca() {
        let [role, binding] = objects(&args(&["prod", "dev", "prod"])).unwrap();
        assert_eq!(role["kind"], "Role");
        assert_eq!(role["metadata"]["namespace"], "team-a");
        assert_eq!(role["rules"].as_array().unwrap().len(), 1);
        let rule = &role["rules"][0];
        assert_eq!(
            rule["resourceNames"],
            json!([
                "prod-kubeconfig",
                "prod-node-attestation-kubeconfig",
                "dev-kubeconfig",
                "dev-node-attestation-kubeconfig"
            ])
        );
        assert_eq!(rule["verbs"], json!(["get"]));
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["kind"], "Group");
        assert_eq!(binding["subjects"][1]["kind"], "User");
    }

    #[test]
    fn bad_names_and_no_subjects_are_refused() {
        assert!(objects(&args(&["Prod"])).is_err());
        assert!(objects(&args(&["a/b"])).is_err());
        let mut nobody = args(&["prod"]);
        nobody.groups.clear();
        nobody.users.clear();
        assert!(objects(&nobody).unwrap_err().to_string().contains("--group or --user"));
    }
}
