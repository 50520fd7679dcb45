//! kubeadm's own configuration (`kubeadm.k8s.io`: InitConfiguration, ClusterConfiguration,
//! JoinConfiguration) in the version the kubeadm of `KUBEBUILDER_ASSETS` reads, as Cluster
//! API's kubeadm bootstrap provider renders it: `v1beta4` from kubeadm v1.31, `v1beta3` before
//! (kubeadm v1.30 knows no `v1beta4`).
//!
//! The suites write every document in the `v1beta4` shape (the shape of Cluster API's `v1beta2`
//! KubeadmConfigSpec, whose `kubeletExtraArgs` are lists too) and [`render`] turns them into
//! the version kubeadm reads. What `v1beta3` says otherwise (from kubeadm's
//! `cmd/kubeadm/app/apis/kubeadm/v1beta3/types.go` and `conversion.go`):
//! - `extraArgs` (`apiServer`, `controllerManager`, `scheduler`, `etcd.local`) and
//!   `nodeRegistration.kubeletExtraArgs` are maps `{name: value}`, not lists of `{name, value}`;
//! - there is no `timeouts`: InitConfiguration's `controlPlaneComponentHealthCheck` is
//!   ClusterConfiguration's `apiServer.timeoutForControlPlane`, JoinConfiguration's `discovery`
//!   is `discovery.timeout`; the other timeouts have no `v1beta3` field;
//! - there is no `certificateValidityPeriod`, `caCertificateValidityPeriod`,
//!   `encryptionAlgorithm`, `extraEnvVars`, `dns.disabled`, `proxy.disabled`, nor
//!   `nodeRegistration.imagePullSerial`.
//!
//! A field `v1beta3` cannot say fails the suite rather than being dropped: the node would run
//! other than the suite says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value, json};

/// The API group of kubeadm's configuration.
pub const GROUP: &str = "kubeadm.k8s.io";
/// The first kubeadm minor that reads `v1beta4` (and the first for which Cluster API's
/// bootstrap provider renders it).
pub const V1BETA4_FROM: u32 = 31;

/// A version of kubeadm's configuration API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVersion {
    /// `kubeadm.k8s.io/v1beta3`: kubeadm v1.22 to v1.30 (read, deprecated, by later ones).
    V1Beta3,
    /// `kubeadm.k8s.io/v1beta4`: kubeadm v1.31 on.
    V1Beta4,
}

impl ConfigVersion {
    /// What Cluster API's bootstrap provider renders for a kubeadm of `minor` (1.`minor`).
    pub const fn for_minor(minor: u32) -> Self {
        if minor < V1BETA4_FROM {
            Self::V1Beta3
        } else {
            Self::V1Beta4
        }
    }

    /// The version the kubeadm in `assets` (`KUBEBUILDER_ASSETS`) reads.
    pub fn of_kubeadm(assets: &Path) -> Self {
        Self::for_minor(kubeadm_minor(assets))
    }

    /// `kubeadm.k8s.io/v1beta3` or `kubeadm.k8s.io/v1beta4`.
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::V1Beta3 => "kubeadm.k8s.io/v1beta3",
            Self::V1Beta4 => "kubeadm.k8s.io/v1beta4",
        }
    }

    /// Whether ClusterConfiguration can set the validity of the certificates kubeadm signs
    /// (`certificateValidityPeriod`, `v1beta4` only: before, kubeadm signs for a year, and
    /// only `kubeadm kubeconfig user --validity-period` signs for less).
    pub const fn has_certificate_validity_period(self) -> bool {
        matches!(self, Self::V1Beta4)
    }
}

/// `kubeadm version -o short` of the kubeadm in `assets` (`v1.30.0`), run once per folder.
pub fn kubeadm_version(assets: &Path) -> String {
    static VERSIONS: OnceLock<Mutex<BTreeMap<PathBuf, String>>> = OnceLock::new();
    let mut versions = VERSIONS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    versions
        .entry(assets.to_path_buf())
        .or_insert_with(|| {
            let kubeadm = assets.join("kubeadm");
            let out = Command::new(&kubeadm)
                .args(["version", "-o", "short"])
                .output()
                .unwrap_or_else(|e| panic!("{} version: {e}", kubeadm.display()));
            assert!(
                out.status.success(),
                "{} version -o short: {}",
                kubeadm.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        })
        .clone()
}

/// The minor of the kubeadm in `assets` (`30` for `v1.30.0`).
pub fn kubeadm_minor(assets: &Path) -> u32 {
    let version = kubeadm_version(assets);
    crate::envtest::minor_of(&version)
        .unwrap_or_else(|| panic!("kubeadm version -o short said {version:?}, not v1.<minor>.<patch>"))
}

/// The minor of a `v1.<minor>.<patch>[-suffix]` version.
/// `documents` (kubeadm's, in the `v1beta4` shape, each with its `kind`; any other document
/// passes as it is) as `version` says them. Panics on a field `version` cannot say.
pub fn render(documents: &[Value], version: ConfigVersion) -> Vec<Value> {
    let mut out: Vec<Value> = documents.to_vec();
    let kubeadm =
        |doc: &Value| doc["apiVersion"].is_null() || doc["apiVersion"].as_str().is_some_and(|a| a.starts_with(GROUP));
    for doc in out.iter_mut().filter(|d| kubeadm(d)) {
        doc["apiVersion"] = json!(version.api_version());
    }
    if version == ConfigVersion::V1Beta4 {
        return out;
    }
    // InitConfiguration's control-plane timeout goes to ClusterConfiguration in v1beta3.
    let mut control_plane_timeout = None;
    for doc in out.iter_mut().filter(|d| kubeadm(d)) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "InitConfiguration" => {
                control_plane_timeout = take_timeouts(doc, &kind, &["controlPlaneComponentHealthCheck"])
                    .remove("controlPlaneComponentHealthCheck");
                node_registration_to_v1beta3(doc, &kind);
            }
            "JoinConfiguration" => {
                if let Some(timeout) = take_timeouts(doc, &kind, &["discovery"]).remove("discovery") {
                    doc["discovery"]["timeout"] = timeout;
                }
                node_registration_to_v1beta3(doc, &kind);
            }
            "ClusterConfiguration" => cluster_to_v1beta3(doc),
            other => panic!("kubeadm.k8s.io/v1beta3 has no {other}"),
        }
    }
    if let Some(timeout) = control_plane_timeout {
        let cluster = out
            .iter_mut()
            .find(|d| d["kind"] == "ClusterConfiguration")
            .expect("v1beta3 says InitConfiguration's timeouts.controlPlaneComponentHealthCheck in a ClusterConfiguration (apiServer.timeoutForControlPlane): give one");
        cluster["apiServer"]["timeoutForControlPlane"] = timeout;
    }
    out
}

/// Takes `timeouts` out of a document; panics on one v1beta3 cannot say (not in `sayable`).
fn take_timeouts(doc: &mut Value, kind: &str, sayable: &[&str]) -> Map<String, Value> {
    let Some(timeouts) = doc.as_object_mut().and_then(|d| d.remove("timeouts")) else {
        return Map::new();
    };
    let timeouts = timeouts.as_object().cloned().unwrap_or_default();
    for name in timeouts.keys() {
        assert!(
            sayable.contains(&name.as_str()),
            "kubeadm.k8s.io/v1beta3 cannot say {kind}'s timeouts.{name} (v1beta4 only): a kubeadm before v1.{V1BETA4_FROM} would wait its built-in time"
        );
    }
    timeouts
}

/// nodeRegistration in v1beta3: `kubeletExtraArgs` a map, no `imagePullSerial`.
fn node_registration_to_v1beta3(doc: &mut Value, kind: &str) {
    let registration = &mut doc["nodeRegistration"];
    if registration.is_null() {
        return;
    }
    assert!(
        registration.get("imagePullSerial").is_none(),
        "kubeadm.k8s.io/v1beta3 cannot say {kind}'s nodeRegistration.imagePullSerial"
    );
    args_to_map(registration, "kubeletExtraArgs", kind);
}

/// ClusterConfiguration in v1beta3: the components' `extraArgs` maps; no field of v1beta4's own.
fn cluster_to_v1beta3(doc: &mut Value) {
    for field in [
        "certificateValidityPeriod",
        "caCertificateValidityPeriod",
        "encryptionAlgorithm",
    ] {
        assert!(
            doc.get(field).is_none(),
            "kubeadm.k8s.io/v1beta3 cannot say ClusterConfiguration's {field} (v1beta4 only, kubeadm v1.{V1BETA4_FROM} on)"
        );
    }
    for (path, field) in [("dns", "disabled"), ("proxy", "disabled")] {
        assert!(
            doc[path].get(field).is_none(),
            "kubeadm.k8s.io/v1beta3 cannot say ClusterConfiguration's {path}.{field}"
        );
    }
    for component in ["apiServer", "controllerManager", "scheduler"] {
        if doc[component].is_object() {
            assert!(
                doc[component].get("extraEnvVars").is_none(),
                "kubeadm.k8s.io/v1beta3 cannot say ClusterConfiguration's {component}.extraEnvVars"
            );
            args_to_map(&mut doc[component], "extraArgs", "ClusterConfiguration");
        }
    }
    if doc["etcd"]["local"].is_object() {
        assert!(
            doc["etcd"]["local"].get("extraEnvVars").is_none(),
            "kubeadm.k8s.io/v1beta3 cannot say ClusterConfiguration's etcd.local.extraEnvVars"
        );
        args_to_map(&mut doc["etcd"]["local"], "extraArgs", "ClusterConfiguration");
    }
}

/// `{name, value}` list → `{name: value}` map; a name given twice (v1beta4 allows it, a map
/// cannot say it) panics.
fn args_to_map(parent: &mut Value, field: &str, kind: &str) {
    let Some(list) = parent.get(field) else {
        return;
    };
    let Some(list) = list.as_array() else {
        assert!(list.is_object(), "{kind}'s {field}: neither a list nor a map: {list}");
        return;
    };
    let mut map = Map::new();
    for arg in list {
        let (Some(name), Some(value)) = (arg["name"].as_str(), arg["value"].as_str()) else {
            panic!("{kind}'s {field}: not a {{name, value}}: {arg}");
        };
        assert!(
            map.insert(name.to_owned(), json!(value)).is_none(),
            "kubeadm.k8s.io/v1beta3 cannot say {kind}'s {field} {name} twice"
        );
    }
    parent[field] = Value::Object(map);
}

/// A YAML stream of `documents`, then a KubeletConfiguration of `kubelet` (its YAML lines, the
/// top level), as kubeadm's `--config` takes them.
pub fn yaml_stream(documents: &[Value], kubelet: Option<&str>) -> String {
    let mut text: String = documents
        .iter()
        .map(|d| serde_yaml::to_string(d).expect("a kubeadm document"))
        .collect::<Vec<_>>()
        .join("---\n");
    if let Some(kubelet) = kubelet {
        text.push_str("---\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n");
        text.push_str(kubelet);
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn minors_before_31_get_v1beta3() {
        assert_eq!(crate::envtest::minor_of("v1.30.0"), Some(30));
        assert_eq!(crate::envtest::minor_of("v1.32.0-beta.0"), Some(32));
        assert_eq!(crate::envtest::minor_of("1.32"), None);
        assert_eq!(ConfigVersion::for_minor(30), ConfigVersion::V1Beta3);
        assert_eq!(ConfigVersion::for_minor(31), ConfigVersion::V1Beta4);
        assert_eq!(ConfigVersion::for_minor(33), ConfigVersion::V1Beta4);
    }

    #[test]
    fn v1beta3_has_maps_of_extra_args_and_its_own_timeouts() {
        let documents = [
            json!({"kind": "InitConfiguration",
                "nodeRegistration": {"name": "cp-0", "kubeletExtraArgs": [{"name": "node-ip", "value": "10.0.0.1"}]},
                "timeouts": {"controlPlaneComponentHealthCheck": "5m0s"}}),
            json!({"kind": "ClusterConfiguration", "apiServer": {"extraArgs": [{"name": "v", "value": "2"}]},
                "etcd": {"local": {"extraArgs": [{"name": "quota-backend-bytes", "value": "1"}]}}}),
            json!({"kind": "JoinConfiguration", "discovery": {"bootstrapToken": {"token": "a.b"}},
                "nodeRegistration": {"kubeletExtraArgs": [{"name": "provider-id", "value": "aws:///a/i"}]},
                "timeouts": {"discovery": "1m0s"}}),
        ];
        let v1beta4 = render(&documents, ConfigVersion::V1Beta4);
        assert_eq!(v1beta4[0]["apiVersion"], "kubeadm.k8s.io/v1beta4");
        assert_eq!(v1beta4[0]["timeouts"], documents[0]["timeouts"]);
        let v1beta3 = render(&documents, ConfigVersion::V1Beta3);
        assert!(v1beta3.iter().all(|d| d["apiVersion"] == "kubeadm.k8s.io/v1beta3"));
        assert_eq!(
            v1beta3[0]["nodeRegistration"]["kubeletExtraArgs"],
            json!({"node-ip": "10.0.0.1"})
        );
        assert!(v1beta3[0].get("timeouts").is_none());
        assert_eq!(
            v1beta3[1]["apiServer"],
            json!({"extraArgs": {"v": "2"}, "timeoutForControlPlane": "5m0s"})
        );
        assert_eq!(
            v1beta3[1]["etcd"]["local"]["extraArgs"],
            json!({"quota-backend-bytes": "1"})
        );
        assert_eq!(v1beta3[2]["discovery"]["timeout"], "1m0s");
        assert_eq!(
            v1beta3[2]["nodeRegistration"]["kubeletExtraArgs"],
            json!({"provider-id": "aws:///a/i"})
        );
    }

    #[test]
    fn what_v1beta3_cannot_say_fails() {
        let validity = [json!({"kind": "ClusterConfiguration", "certificateValidityPeriod": "4m"})];
        assert_eq!(
            render(&validity, ConfigVersion::V1Beta4)[0]["certificateValidityPeriod"],
            "4m"
        );
        for documents in [
            validity.to_vec(),
            vec![json!({"kind": "JoinConfiguration", "timeouts": {"tlsBootstrap": "1m"}})],
            vec![
                json!({"kind": "JoinConfiguration", "nodeRegistration": {"kubeletExtraArgs": [
                {"name": "v", "value": "1"}, {"name": "v", "value": "2"}]}}),
            ],
        ] {
            assert!(std::panic::catch_unwind(|| render(&documents, ConfigVersion::V1Beta3)).is_err());
        }
    }

    #[test]
    fn the_stream_ends_with_the_kubelet_configuration() {
        let text = yaml_stream(
            &[
                json!({"kind": "InitConfiguration"}),
                json!({"kind": "ClusterConfiguration"}),
            ],
            Some("port: 1\n"),
        );
        assert_eq!(
            text,
            "kind: InitConfiguration\n---\nkind: ClusterConfiguration\n---\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: 1\n"
        );
    }
}
