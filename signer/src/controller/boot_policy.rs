//! The `tpm/v1` boot policies (SPEC section 5, revision 5): the ConfigMap a Cluster's
//! `cluster.x-k8s.io/kubelet-tpm-boot-policy` annotation names in its namespace (or the
//! signer's `--tpm-boot-policy` default), read for the verifier, which is pure.
//!
//! Read with `get` through a small cache whose entries live [`TTL`], not watched: a watch
//! needs `list` and `watch` on ConfigMaps in every namespace (what an operator would least
//! like to grant: ConfigMaps hold much that is not ours, and the watch would hold them all in
//! memory), while a policy changes when an image is rolled out, and [`TTL`] later is soon
//! enough. A `tpm/v1` CSR costs a map lookup; a Cluster's policy costs one GET per [`TTL`]
//! while its nodes join (see docs/decisions.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attestation::machine::ClusterView;
use attestation::tpm::boot_policy::{BootPolicy, CONFIG_MAP_KEY, PolicyState};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

/// How long a read policy is used before it is read again.
pub const TTL: Duration = Duration::from_secs(30);
/// How long a failed read (the apiserver out of reach, no right to read) is kept.
const FAILED_TTL: Duration = Duration::from_secs(5);
/// Least time between two `BootPolicyInvalid` Warnings on one Cluster.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(300);

/// The operator's floor under every Cluster's `tpm/v1` boot policy (SPEC section 5, revision 6):
/// a Cluster's policy is written by whoever may edit ConfigMaps in its namespace, so the signer
/// can require one of every Cluster and hold each to Secure Boot whatever it says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct Floor {
    /// `tpm/v1`: require a boot policy of every Cluster. A Cluster that names none (no
    /// `cluster.x-k8s.io/kubelet-tpm-boot-policy` annotation, no `--tpm-boot-policy` default)
    /// has its `tpm/v1` CSRs held, never approved, and a `BootPolicyInvalid` Warning.
    #[arg(long, env = "SIGNER_TPM_REQUIRE_BOOT_POLICY")]
    pub tpm_require_boot_policy: bool,
    /// `tpm/v1`: every boot policy requires Secure Boot, whatever a Cluster's says
    /// (`secureBoot: optional` is judged as `required`).
    #[arg(long, env = "SIGNER_TPM_REQUIRE_SECURE_BOOT")]
    pub tpm_require_secure_boot: bool,
}

impl Floor {
    /// `state` (what the Cluster's ConfigMap says, or `None` when it names none) under the
    /// floor.
    pub fn apply(&self, state: PolicyState) -> PolicyState {
        match state {
            PolicyState::None if self.tpm_require_boot_policy => PolicyState::Required,
            PolicyState::Loaded { source, policy } if self.tpm_require_secure_boot => PolicyState::Loaded {
                source,
                policy: Arc::new(BootPolicy::clone(&policy).with_secure_boot_floor()),
            },
            state => state,
        }
    }
}

/// `--tpm-boot-policy`: `<namespace>/<name>`, both DNS labels or subdomains, as ConfigMap names are.
pub fn parse_default(value: &str) -> Result<(String, String), String> {
    let (namespace, name) = value
        .split_once('/')
        .ok_or_else(|| format!("--tpm-boot-policy {value:?} is not <namespace>/<name>"))?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !ok(namespace) || !ok(name) {
        return Err(format!(
            "--tpm-boot-policy {value:?} is not <namespace>/<name> of a ConfigMap"
        ));
    }
    Ok((namespace.to_owned(), name.to_owned()))
}

/// What a ConfigMap (or its absence) says, as the verifier's input.
pub fn state_of(source: &str, config_map: Option<&ConfigMap>) -> PolicyState {
    let invalid = |message: String| PolicyState::Invalid {
        source: source.to_owned(),
        message,
    };
    let Some(config_map) = config_map else {
        return invalid("the ConfigMap does not exist".into());
    };
    let Some(text) = config_map.data.as_ref().and_then(|d| d.get(CONFIG_MAP_KEY)) else {
        return invalid(format!("the ConfigMap has no data key {CONFIG_MAP_KEY}"));
    };
    match BootPolicy::parse(text) {
        Ok(policy) => PolicyState::Loaded {
            source: source.to_owned(),
            policy: Arc::new(policy),
        },
        Err(e) => invalid(format!("{CONFIG_MAP_KEY}: {e}")),
    }
}

/// The ConfigMap a Cluster's policy comes from: its annotation's, else the signer's default.
pub fn source_of(cluster: &ClusterView, default: Option<&(String, String)>) -> Option<(String, String)> {
    match &cluster.boot_policy {
        PolicyState::None => default.cloned(),
        state => state
            .source()
            .and_then(|s| s.split_once('/'))
            .map(|(ns, name)| (ns.to_owned(), name.to_owned())),
    }
}

/// The policies read, by `<namespace>/<name>`.
pub struct BootPolicies {
    client: Client,
    default: Option<(String, String)>,
    floor: Floor,
    cache: Mutex<HashMap<String, (Instant, Duration, PolicyState)>>,
    warned: Mutex<HashMap<String, Instant>>,
}

impl BootPolicies {
    /// Policies read through `client`; `default` from `--tpm-boot-policy`, under `floor`.
    pub fn new(client: Client, default: Option<(String, String)>, floor: Floor) -> Self {
        Self {
            client,
            default,
            floor,
            cache: Mutex::default(),
            warned: Mutex::default(),
        }
    }

    /// `cluster` with its policy resolved: read (or taken from the cache) when it names one or
    /// the signer has a default; as it was otherwise.
    pub async fn resolve(&self, cluster: &ClusterView) -> ClusterView {
        let mut resolved = cluster.clone();
        let Some((namespace, name)) = source_of(cluster, self.default.as_ref()) else {
            resolved.boot_policy = self.floor.apply(PolicyState::None);
            return resolved;
        };
        let source = format!("{namespace}/{name}");
        let cached = crate::locks::lock(&self.cache)
            .get(&source)
            .filter(|(at, ttl, _)| at.elapsed() < *ttl)
            .map(|(_, _, state)| state.clone());
        resolved.boot_policy = match cached {
            Some(state) => state,
            None => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
                let (state, ttl) = match api.get_opt(&name).await {
                    Ok(config_map) => (state_of(&source, config_map.as_ref()), TTL),
                    Err(e) => (
                        PolicyState::Invalid {
                            source: source.clone(),
                            message: format!(
                                "cannot read the ConfigMap ({e}); the signer needs get on configmaps (config/rbac)"
                            ),
                        },
                        FAILED_TTL,
                    ),
                };
                if let PolicyState::Invalid { message, .. } = &state {
                    tracing::warn!(policy = %source, "tpm/v1 boot policy unusable: {message}");
                }
                crate::locks::lock(&self.cache).insert(source, (Instant::now(), ttl, state.clone()));
                state
            }
        };
        resolved.boot_policy = self.floor.apply(resolved.boot_policy);
        resolved
    }

    /// Whether a `BootPolicyInvalid` Warning on Cluster `key` is due (one per [`WARNING_INTERVAL`]).
    pub fn warning_due(&self, key: &str) -> bool {
        let mut warned = crate::locks::lock(&self.warned);
        let due = warned.get(key).is_none_or(|at| at.elapsed() >= WARNING_INTERVAL);
        if due {
            warned.insert(key.to_owned(), Instant::now());
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn config_map(key: &str, text: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([(key.to_owned(), text.to_owned())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_config_map_is_a_policy_or_says_why_not() {
        let policy = "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nimages:\n  - name: x\n    kernel: \"aa00000000000000000000000000000000000000000000000000000000000000\"\n";
        assert!(matches!(
            state_of("team-a/boot", Some(&config_map(CONFIG_MAP_KEY, policy))),
            PolicyState::Loaded { ref source, .. } if source == "team-a/boot"
        ));
        let why = |state: PolicyState| match state {
            PolicyState::Invalid { message, .. } => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(why(state_of("a/b", None)), "the ConfigMap does not exist");
        assert!(why(state_of("a/b", Some(&config_map("policy.yml", policy)))).contains("no data key policy.yaml"));
        let bad = why(state_of(
            "a/b",
            Some(&config_map(CONFIG_MAP_KEY, "kind: TpmBootPolicy\n")),
        ));
        assert!(bad.starts_with("policy.yaml: the policy does not parse"), "{bad}");
    }

    #[test]
    fn the_floor_requires_a_policy_and_secure_boot() {
        let policy = "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nsecureBoot: optional\nimages:\n  - name: x\n    kernel: \"aa00000000000000000000000000000000000000000000000000000000000000\"\n";
        let loaded = state_of("team-a/boot", Some(&config_map(CONFIG_MAP_KEY, policy)));
        let none = Floor::default();
        assert_eq!(none.apply(PolicyState::None), PolicyState::None);
        assert_eq!(none.apply(loaded.clone()), loaded);
        let floor = Floor {
            tpm_require_boot_policy: true,
            tpm_require_secure_boot: true,
        };
        assert_eq!(floor.apply(PolicyState::None), PolicyState::Required);
        let PolicyState::Loaded { policy, source } = floor.apply(loaded) else {
            panic!("still loaded");
        };
        assert_eq!(source, "team-a/boot");
        assert_eq!(policy.secure_boot, attestation::tpm::boot_policy::SecureBoot::Required);
        assert!(policy.secure_boot_floor);
        let invalid = PolicyState::Invalid {
            source: "a/b".into(),
            message: "gone".into(),
        };
        assert_eq!(floor.apply(invalid.clone()), invalid);
    }

    #[test]
    fn the_annotation_wins_over_the_default() {
        let default = ("node-attestation-system".to_owned(), "default".to_owned());
        let plain = ClusterView::named("prod", "team-a", &["tpm"]);
        assert_eq!(source_of(&plain, None), None);
        assert_eq!(source_of(&plain, Some(&default)), Some(default.clone()));
        let annotated = plain.with_annotation(attestation::names::ANNOTATION_TPM_BOOT_POLICY, "boot");
        assert_eq!(
            source_of(&annotated, Some(&default)),
            Some(("team-a".to_owned(), "boot".to_owned()))
        );
        assert!(parse_default("ns/name").is_ok());
        for bad in ["name", "ns/", "/name", "NS/name", "ns/na me"] {
            assert!(parse_default(bad).is_err(), "{bad}");
        }
    }
}
