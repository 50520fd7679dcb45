//! `node-attestation-signer explain-rbac`: the least privilege `explain` needs to reach workload
//! clusters through their `<cluster>-kubeconfig` Secrets. RBAC cannot name Secrets by pattern,
//! so a role that may read "the kubeconfig Secrets" of a namespace may read every Secret there,
//! the `<cluster>-ca` keys included, which would let its holder issue node identities. This
//! prints, for one namespace, a Role that may `get` exactly the named Clusters' kubeconfig
//! Secrets and a RoleBinding of it to the given people: pure, from the names given, no cluster
//! asked.
//!
//! What it hands out is much: `<cluster>-kubeconfig` is Cluster API's admin kubeconfig of the
//! workload cluster (`system:masters`), so its holders are cluster-admin there. It says so on
//! stderr and in the Role's annotation. Its objects are named after the people they are for
//! (`node-attestation-explain-<first subject>-<hash of all>`), so one run per team in one
//! namespace does not overwrite another's, and labelled so that the uninstall finds them.

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
    /// Name of the Role and RoleBinding (default: `node-attestation-explain-<first subject>-<hash
    /// of every subject>`, one pair per set of people).
    #[arg(long)]
    pub name: Option<String>,
}

/// What the Role grants, said before it is applied (stderr) and kept on it (an annotation).
pub const WARNING: &str = "these Secrets are Cluster API's admin kubeconfigs of the workload clusters (system:masters): whoever this Role is bound to is cluster-admin of those clusters, not only able to run explain; bind it to the people who may be that";

/// The label values that find every `explain-rbac` object (the uninstall deletes by them).
pub const COMPONENT: &str = "explain";

/// The Role and RoleBinding, as one YAML stream on stdout.
pub fn run(args: &ExplainRbacArgs) -> Result<()> {
    let objects = objects(args)?;
    eprintln!("explain-rbac: WARNING: {WARNING}");
    for object in objects {
        print!("---\n{}", serde_yaml::to_string(&object)?);
    }
    Ok(())
}

/// The Role allowed `get` on exactly `<cluster>-kubeconfig` and
/// `<cluster>-node-attestation-kubeconfig` of each Cluster, and its binding.
pub fn objects(args: &ExplainRbacArgs) -> Result<[Value; 2]> {
    check_name("namespace", &args.namespace)?;
    if let Some(name) = &args.name {
        check_name("--name", name)?;
    }
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
    let name = args.name.clone().unwrap_or_else(|| default_name(args));
    let labels = json!({"app.kubernetes.io/name": "node-attestation-signer", "app.kubernetes.io/component": COMPONENT});
    let annotations = json!({"node-attestation.cluster.x-k8s.io/warning": WARNING});
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": args.namespace, "labels": labels, "annotations": annotations},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": secrets, "verbs": ["get"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": args.namespace, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects,
    });
    Ok([role, binding])
}

/// `node-attestation-explain-<first subject, as a name>-<8 hex of SHA-256 over every subject,
/// sorted>`: one pair per set of people, whatever order they were given in; two sets whose
/// first names read alike still differ by the hash.
fn default_name(args: &ExplainRbacArgs) -> String {
    let mut subjects: Vec<String> = args
        .groups
        .iter()
        .map(|g| format!("Group:{g}"))
        .chain(args.users.iter().map(|u| format!("User:{u}")))
        .collect();
    let first = args.groups.first().or(args.users.first()).cloned().unwrap_or_default();
    subjects.sort();
    subjects.dedup();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, subjects.join("\n").as_bytes());
    let hash: String = digest.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    let readable: String = first
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(30)
        .collect();
    let readable = readable.trim_matches('-');
    if readable.is_empty() {
        format!("node-attestation-explain-{hash}")
    } else {
        format!("node-attestation-explain-{readable}-{hash}")
    }
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
            name: None,
        }
    }

    #[test]
    fn each_set_of_people_gets_its_own_pair_and_the_role_says_what_it_grants() {
        let mut a = args(&["prod"]);
        let [role, binding] = objects(&a).unwrap();
        let name = role["metadata"]["name"].as_str().unwrap().to_owned();
        assert!(name.starts_with("node-attestation-explain-platform-"), "{name}");
        assert_eq!(binding["metadata"]["name"], name);
        assert_eq!(binding["roleRef"]["name"], name);
        assert!(check_name("name", &name).is_ok(), "{name}");
        assert!(
            role["metadata"]["annotations"]["node-attestation.cluster.x-k8s.io/warning"]
                .as_str()
                .unwrap()
                .contains("cluster-admin")
        );
        assert_eq!(role["metadata"]["labels"]["app.kubernetes.io/component"], COMPONENT);
        // The same people in another order: the same pair (a re-run updates it).
        a.users.insert(0, "bob".into());
        let reordered = ExplainRbacArgs {
            groups: a.groups.clone(),
            users: vec!["alice".into(), "bob".into()],
            ..args(&["prod"])
        };
        assert_eq!(
            objects(&a).unwrap()[0]["metadata"]["name"],
            objects(&reordered).unwrap()[0]["metadata"]["name"]
        );
        // Other people: another pair, even when their names read alike.
        let other = ExplainRbacArgs {
            groups: vec!["Platform".into()],
            ..args(&["prod"])
        };
        assert_ne!(objects(&other).unwrap()[0]["metadata"]["name"], json!(name));
        let given = ExplainRbacArgs {
            name: Some("mine".into()),
            ..args(&["prod"])
        };
        assert_eq!(objects(&given).unwrap()[0]["metadata"]["name"], "mine");
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
