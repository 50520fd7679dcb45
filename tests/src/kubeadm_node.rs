//! A kubeadm node on this host, for the suites that run kubeadm itself (`envtest_kubeadm`'s
//! `kubeadm join`, `envtest_kubeadm_init`'s `kubeadm init` phases, `envtest_kubeadm_clouds`'
//! joins on each cloud's flavour): a private mount and UTS namespace in which temporary folders
//! stand for `/etc/kubernetes`, `/var/lib/kubelet` and kubelet's drop-in folder
//! `/etc/systemd/system/kubelet.service.d`, the plugin for its install path and a stub for
//! `systemctl`; and systemd's part, the unit's drop-ins read and run as systemd would.
//!
//! And what those suites share around the node: the workload cluster as `kubeadm init`
//! leaves it for joining nodes (its configuration, [`ControlPlane`], in the version the
//! assets' kubeadm reads, [`crate::kubeadm_config`]; its cluster-side phases,
//! [`Kubeadm::init_cluster`]), an unmodified `kubeadm join` ([`Kubeadm::join`],
//! [`KubeadmJoin`]) and kubelet started where kubeadm asks systemd to ([`KubeletService`]),
//! with what kubeadm and kubelet of a minor before v1.31 need of this sandbox.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use serde_json::{Value, json};

use crate::ca::TestCa;
use crate::capi;
use crate::envtest::Envtest;
use crate::kubeadm_config::{self, ConfigVersion};
use crate::kubelet::{Containerd, ControllerManager, Host, Kubelet, MountPoint, NODE_IP, Recorder, der, program_path};
use crate::live::{self, Signer, Workload};

/// The `kubelet_authenticator` role, whose drop-in the node runs.
pub const ROLE: &str = "images/image-builder/ansible/roles/kubelet_authenticator";

/// kubeadm's kubelet drop-in as the Kubernetes packages install it
/// (`/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf`, kubernetes/release).
pub const KUBEADM_DROPIN: &str = r#"# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"#;
/// Where kubeadm before v1.31 checks kubelet's health (`localhost`, its `KubeletHealthzPort`),
/// whatever kubelet's `healthzPort`.
pub const KUBEADM_KUBELET_HEALTHZ_PORT: u16 = 10248;
/// systemd's `PATH` for services.
pub const SYSTEMD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The node's `/etc/kubernetes` (bind-mounted in its namespace).
pub const ETC_KUBERNETES: &str = "/etc/kubernetes";
/// The node's `/var/lib/kubelet` (bind-mounted in its namespace).
pub const VAR_LIB_KUBELET: &str = "/var/lib/kubelet";
/// The node's folder of kubelet drop-ins under `/etc` (bind-mounted in its namespace), where
/// the role's drop-in and those a bootstrap provider writes go.
pub const KUBELET_DROPINS: &str = "/etc/systemd/system/kubelet.service.d";
/// The node folders bind-mounted in its namespace, and their folders here.
const NODE_FOLDERS: [(&str, &str); 3] = [
    (ETC_KUBERNETES, "etc-kubernetes"),
    (VAR_LIB_KUBELET, "var-lib-kubelet"),
    (KUBELET_DROPINS, "kubelet-dropins"),
];

/// The envtest folder, when this host can run kubelet and kubeadm here; otherwise panics
/// saying what is missing (`scripts/test` skips the suite then).
pub fn require(suite: &str) -> PathBuf {
    let mut missing = crate::kubelet::missing_parts();
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS") {
        let kubeadm = Path::new(&dir).join("kubeadm");
        if std::fs::metadata(&kubeadm)
            .map(|m| m.permissions().mode() & 0o111 == 0)
            .unwrap_or(true)
        {
            missing.push(format!("kubeadm in KUBEBUILDER_ASSETS={}", Path::new(&dir).display()));
        }
    }
    for program in ["unshare", "nsenter", "sh", "env", "sleep"] {
        if program_path(program).is_none() {
            missing.push(format!("{program} (Debian: util-linux, coreutils)"));
        }
    }
    assert!(
        missing.is_empty(),
        "{suite} runs kubeadm and a real kubelet and needs: {}; run scripts/test, which skips this test without them",
        missing.join(", ")
    );
    crate::envtest::assets(suite)
}

/// Resolves the `{% if name ==/!= 'text' %}...{% endif %}` blocks of [`render`].
fn render_ifs(template: &str, lookup: &impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{% if ") {
        out.push_str(&rest[..start]);
        let head_end = rest[start..].find("%}").expect("an unterminated {%") + start;
        let condition = rest[start + 6..head_end].trim();
        let (name, negated, value) = match (condition.split_once(" != "), condition.split_once(" == ")) {
            (Some((n, v)), _) => (n, true, v),
            (None, Some((n, v))) => (n, false, v),
            _ => panic!("a condition this suite does not render: {condition}"),
        };
        let value = value.trim().trim_matches('\'');
        let actual = lookup(name.trim()).unwrap_or_else(|| panic!("no value for {name}"));
        let body_end = rest[head_end..]
            .find("{% endif %}")
            .expect("an {% if %} without {% endif %}")
            + head_end;
        let body = &rest[head_end + 2..body_end];
        assert!(
            !body.contains("{%"),
            "a nested statement this suite does not render: {body}"
        );
        if (actual == value) != negated {
            out.push_str(body);
        }
        rest = &rest[body_end + "{% endif %}".len()..];
    }
    out.push_str(rest);
    out
}

/// kubeadm's CA pin: `sha256:<hex of the SHA-256 of the CA's SubjectPublicKeyInfo>`.
pub fn ca_cert_hash(ca_pem: &[u8]) -> String {
    let der = der(std::str::from_utf8(ca_pem).unwrap());
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert.tbs_certificate.subject_pki.raw);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A Jinja template with only `{{ name }}` expressions and `{% if name == 'text' %}` /
/// `{% if name != 'text' %}` ... `{% endif %}` blocks (unnested; what the role's drop-in and the
/// template's cloud-init values use), each looked up; anything else (other statements,
/// comments, filters, an unknown name) fails the suite rather than being rendered wrong.
pub fn render(template: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let rendered = render_ifs(template, &lookup);
    let template = rendered.as_str();
    assert!(
        !template.contains("{%") && !template.contains("{#"),
        "a Jinja statement or comment this suite does not render:\n{template}"
    );
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").expect("an unterminated {{") + start;
        let name = rest[start + 2..end].trim();
        out.push_str(&lookup(name).unwrap_or_else(|| panic!("no value for {{{{ {name} }}}}")));
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The role's variables: its defaults (`defaults/main.yml`) with `overrides`.
pub fn role_variables(overrides: &[(&str, &str)]) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(crate::repo_root().join(ROLE).join("defaults/main.yml")).unwrap();
    let defaults: BTreeMap<String, serde_yaml::Value> = serde_yaml::from_str(&text).unwrap();
    let mut variables: BTreeMap<String, String> = defaults
        .into_iter()
        .filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_owned())))
        .collect();
    for (key, value) in overrides {
        assert!(variables.contains_key(*key), "the role has no variable {key}");
        variables.insert((*key).to_owned(), (*value).to_owned());
    }
    variables
}

/// kubelet's unit on an image baked with the role (`role`, its variables): kubeadm's
/// `10-kubeadm.conf`, then the role's drop-in rendered.
pub fn role_unit(role: &BTreeMap<String, String>) -> Unit {
    Unit::read(&[KUBEADM_DROPIN, &role_dropin(role)])
}

/// The role's drop-in rendered with `role` (its variables).
pub fn role_dropin(role: &BTreeMap<String, String>) -> String {
    let template = std::fs::read_to_string(
        crate::repo_root()
            .join(ROLE)
            .join("templates/20-kubelet-authenticator.conf.j2"),
    )
    .expect("the role's drop-in");
    render(&template, |name| role.get(name).cloned())
}

/// The `[Service]` settings of a unit's drop-ins, in the order systemd reads them.
#[derive(Debug, Default)]
pub struct Unit {
    /// `Environment=` settings, in order.
    pub environment: Vec<(String, String)>,
    /// Paths, and whether a missing file is fine (`-`).
    pub environment_files: Vec<(String, bool)>,
    /// `ExecStartPre=` command lines.
    pub exec_start_pre: Vec<String>,
    /// The last `ExecStart=`.
    pub exec_start: Option<String>,
}

impl Unit {
    /// Reads the drop-ins, in order.
    pub fn read(dropins: &[&str]) -> Self {
        let mut unit = Self::default();
        for text in dropins {
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                    continue;
                }
                let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("a unit line: {line}"));
                match key {
                    "Environment" => {
                        let value = value
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or(value);
                        let (name, setting) = value.split_once('=').expect("Environment=NAME=VALUE");
                        unit.environment.push((name.to_owned(), setting.to_owned()));
                    }
                    "EnvironmentFile" => {
                        let optional = value.starts_with('-');
                        unit.environment_files
                            .push((value.trim_start_matches('-').to_owned(), optional));
                    }
                    "ExecStartPre" => unit.exec_start_pre.push(value.to_owned()),
                    "ExecStart" if value.is_empty() => unit.exec_start = None,
                    "ExecStart" => unit.exec_start = Some(value.to_owned()),
                    other => panic!("a unit setting this suite does not run: {other}"),
                }
            }
        }
        unit
    }

    /// The service's environment: `Environment=` in order (later wins), then the files'
    /// settings, which override (read through `read`, a node path to its text).
    pub fn environment(&self, read: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |name: &str, value: &str| {
            env.retain(|(n, _)| n != name);
            env.push((name.to_owned(), value.to_owned()));
        };
        for (name, value) in &self.environment {
            set(name, value);
        }
        for (path, optional) in &self.environment_files {
            let Some(text) = read(path) else {
                assert!(optional, "EnvironmentFile={path} is missing");
                continue;
            };
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (name, value) = line.split_once('=').unwrap_or_else(|| panic!("{path}: {line}"));
                let value = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(value);
                set(name.trim(), value);
            }
        }
        env
    }
}

/// A command line as systemd splits it: words, `$NAME` replaced by the variable's words.
pub fn expand(command: &str, env: &[(String, String)]) -> Vec<String> {
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    command
        .split_whitespace()
        .flat_map(|word| match word.strip_prefix('$') {
            Some(name) => lookup(name)
                .unwrap_or_default()
                .split_whitespace()
                .map(ToOwned::to_owned)
                .collect(),
            None => vec![word.to_owned()],
        })
        .collect()
}

/// The node: a private mount and UTS namespace held by a `sleep` (see the module
/// documentation), its folders for `/etc/kubernetes` and `/var/lib/kubelet`, and the stub
/// `systemctl`'s record. On drop every process in it is killed, then the holder.
pub struct NodeNamespace {
    holder: Child,
    /// Its folder: the node's folders, the stub's record, the suite's files.
    pub dir: tempfile::TempDir,
    /// `nsenter`.
    pub nsenter: PathBuf,
}

impl NodeNamespace {
    /// Binds `etc`, `var`, `plugin` onto `install_path` and the stub onto every `systemctl`
    /// on systemd's `PATH`; sets the hostname to `hostname`.
    pub fn start(host: &mut Host, recorder: &Recorder, install_path: &str, plugin: &Path, hostname: &str) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        recorder.folder(dir.path());
        let d = dir.path();
        for (_, sub) in NODE_FOLDERS {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        let stub = d.join("systemctl");
        std::fs::write(
            &stub,
            format!(
                "#!/bin/sh\n# systemd is absent here: the suite starts kubelet; this records kubeadm's calls.\necho \"$*\" >> {}\n",
                d.join("systemctl.log").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut systemctls: Vec<PathBuf> = std::env::split_paths(SYSTEMD_PATH)
            .map(|p| p.join("systemctl"))
            .filter(|p| p.is_file())
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        systemctls.sort();
        systemctls.dedup();

        for (folder, _) in NODE_FOLDERS {
            host.mount_point(Path::new(folder), MountPoint::Folder);
        }
        host.mount_point(Path::new(install_path), MountPoint::File);
        let mut script = String::from("set -eu\n");
        let mut bind = |from: &Path, onto: &Path| {
            script.push_str(&format!("mount --bind '{}' '{}'\n", from.display(), onto.display()));
        };
        for (folder, sub) in NODE_FOLDERS {
            bind(&d.join(sub), Path::new(folder));
        }
        bind(plugin, Path::new(install_path));
        for systemctl in &systemctls {
            bind(&stub, systemctl);
        }
        script.push_str(&format!("hostname {hostname}\necho ready\nexec sleep infinity\n"));
        std::fs::write(d.join("namespace.sh"), &script).unwrap();
        let log = d.join("namespace.log");
        let holder = Command::new(program_path("unshare").unwrap())
            .args(["--mount", "--uts", "--propagation", "private", "--", "sh"])
            .arg(d.join("namespace.sh"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(d.join("namespace.err")).unwrap()))
            .spawn()
            .expect("unshare");
        recorder.process(&holder);
        let mut namespace = Self {
            holder,
            dir,
            nsenter: program_path("nsenter").unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&log).unwrap_or_default().trim() != "ready" {
            let exited = matches!(namespace.holder.try_wait(), Ok(Some(_)));
            assert!(
                !exited && Instant::now() < deadline,
                "the node's namespace did not come up:\n{script}\n{}",
                std::fs::read_to_string(namespace.dir.path().join("namespace.err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        namespace
    }

    /// The node of an image the `kubelet_authenticator` role baked (`role`, its variables):
    /// `plugin` at the role's install path, `/etc/kubernetes/pki` and the cert dir
    /// ([`NodeNamespace::bake_image`]); its hostname `hostname`.
    pub fn start_baked(
        host: &mut Host,
        recorder: &Recorder,
        role: &BTreeMap<String, String>,
        plugin: &Path,
        hostname: &str,
    ) -> Self {
        let ns = Self::start(
            host,
            recorder,
            &role["kubelet_authenticator_install_path"],
            plugin,
            hostname,
        );
        ns.bake_image(role);
        ns
    }

    /// The host path behind a node path under `/etc/kubernetes`, `/var/lib/kubelet` or
    /// [`KUBELET_DROPINS`]; panics for any other (it would be the host's own).
    pub fn path(&self, node_path: &str) -> PathBuf {
        for (mount, sub) in NODE_FOLDERS {
            if let Ok(rest) = Path::new(node_path).strip_prefix(mount) {
                return self.dir.path().join(sub).join(rest);
            }
        }
        panic!(
            "{node_path} is not under {ETC_KUBERNETES}, {VAR_LIB_KUBELET} or {KUBELET_DROPINS}, the node's own folders here"
        );
    }

    /// Installs the role's drop-in rendered with `role` where the role puts it
    /// (`kubelet_authenticator_dropin`), as on an image it baked.
    pub fn install_role_dropin(&self, role: &BTreeMap<String, String>) {
        let path = self.path(&role["kubelet_authenticator_dropin"]);
        std::fs::write(path, role_dropin(role)).expect("the role's drop-in");
    }

    /// kubelet's unit as systemd reads it now (what a `systemctl daemon-reload` loads): kubeadm's
    /// `10-kubeadm.conf` (the packages' `/usr/lib/systemd/system/kubelet.service.d`) and the
    /// `*.conf` of the node's [`KUBELET_DROPINS`], merged by file name (one in `/etc` wins over
    /// one of the same name) in the order of their names, as systemd merges drop-ins.
    pub fn unit(&self) -> Unit {
        let mut dropins: BTreeMap<String, String> = BTreeMap::new();
        dropins.insert("10-kubeadm.conf".to_owned(), KUBEADM_DROPIN.to_owned());
        for entry in std::fs::read_dir(self.path(KUBELET_DROPINS)).expect("the drop-in folder") {
            let path = entry.expect("a drop-in").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if name.ends_with(".conf") {
                dropins.insert(name, std::fs::read_to_string(&path).expect("a drop-in's text"));
            }
        }
        let texts: Vec<&str> = dropins.values().map(String::as_str).collect();
        Unit::read(&texts)
    }

    /// The image as the `kubelet_authenticator` role leaves it (`role`, its variables):
    /// `/etc/kubernetes/pki` and the cert dir (0700).
    pub fn bake_image(&self, role: &BTreeMap<String, String>) {
        std::fs::create_dir_all(self.path(&format!("{ETC_KUBERNETES}/pki"))).expect("pki folder");
        let cert_dir = self.path(&role["kubelet_authenticator_cert_dir"]);
        std::fs::create_dir_all(&cert_dir).expect("cert dir");
        std::fs::set_permissions(&cert_dir, std::fs::Permissions::from_mode(0o700)).expect("cert dir mode");
    }

    /// The bootstrap provider's `files` (a KubeadmConfig's), with cloud-init's values looked up
    /// in `metadata`, written with their permissions.
    pub fn write_files(&self, files: &serde_json::Value, metadata: impl Fn(&str) -> Option<String>) {
        self.write_files_as(files, |content| render(content, &metadata));
    }

    /// The bootstrap provider's `files`, each content as `rendered` gives it (cloud-init's
    /// rendering, say), written with their permissions.
    pub fn write_files_as(&self, files: &serde_json::Value, rendered: impl Fn(&str) -> String) {
        for file in files.as_array().expect("files") {
            let on_host = self.path(file["path"].as_str().expect("path"));
            std::fs::create_dir_all(on_host.parent().expect("a folder")).expect("folder");
            std::fs::write(&on_host, rendered(file["content"].as_str().expect("content"))).expect("file");
            let mode = u32::from_str_radix(file["permissions"].as_str().expect("permissions"), 8).expect("mode");
            std::fs::set_permissions(&on_host, std::fs::Permissions::from_mode(mode)).expect("file mode");
        }
    }

    /// A node file's text as a process in the namespace reads it (through the holder's root).
    pub fn read(&self, node_path: &str) -> Option<String> {
        let inside = format!("/proc/{}/root{node_path}", self.holder.id());
        std::fs::read_to_string(inside).ok()
    }

    /// `nsenter`'s arguments that run `env -i <env> <program> <args>` in the namespace, in
    /// the same process (nsenter and env execute, they do not fork).
    pub fn args(&self, env: &[(String, String)], program: &Path, args: &[String]) -> Vec<String> {
        let pid = self.holder.id();
        let mut all = vec![
            format!("--mount=/proc/{pid}/ns/mnt"),
            format!("--uts=/proc/{pid}/ns/uts"),
            "--".to_owned(),
            program_path("env").unwrap().display().to_string(),
            "-i".to_owned(),
        ];
        all.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        all.push(program.display().to_string());
        all.extend(args.iter().cloned());
        all
    }

    /// `nsenter` running `program` with `args` and `env` in the namespace.
    pub fn command(&self, env: &[(String, String)], program: &Path, args: &[String]) -> Command {
        let mut command = Command::new(&self.nsenter);
        command.args(self.args(env, program, args)).stdin(Stdio::null());
        command
    }

    /// What kubeadm asked systemd.
    pub fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("systemctl.log"))
            .unwrap_or_default()
            .lines()
            .map(ToOwned::to_owned)
            .collect()
    }

    /// The processes in the namespace (the holder's mount namespace) but the holder.
    pub fn members(&self) -> Vec<u32> {
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/mnt", self.holder.id())) else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .filter(|pid| *pid != self.holder.id())
                    .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|n| n == ns))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for NodeNamespace {
    fn drop(&mut self) {
        for _ in 0..20 {
            let members = self.members();
            if members.is_empty() {
                break;
            }
            for pid in members {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Waits for a child to exit, at most `timeout`.
pub async fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The control-plane Node `kubeadm init` registered: the suite's apiserver is the control
/// plane, and no kubelet of its own runs (the Node is written as its kubelet would have).
pub const CONTROL_PLANE: &str = "cp-0";
/// The address kubeadm init's control plane advertises (`localAPIEndpoint`): kubeadm refuses
/// loopback there, and nothing dials it (a node finds the apiserver at `controlPlaneEndpoint`,
/// the suite's, through cluster-info).
pub const CONTROL_PLANE_ADDRESS: &str = "192.0.2.10";
/// The address a control-plane node joining with `kubeadm join --control-plane` advertises.
pub const JOINING_CONTROL_PLANE_ADDRESS: &str = "192.0.2.11";
/// kubelet's own TLS bootstrap signer, kubeadm's path: kube-controller-manager approves its
/// CSRs under kubeadm's [`AUTO_APPROVE_BINDINGS`]; a node under attestation never files one.
pub const LEGACY_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// kubeadm's two auto-approve bindings (`bootstrap-token` phase): the join token's group may
/// have its CSRs approved by kube-controller-manager, and a node its renewals.
pub const AUTO_APPROVE_BINDINGS: [&str; 2] = [
    "kubeadm:node-autoapprove-bootstrap",
    "kubeadm:node-autoapprove-certificate-rotation",
];
/// The preflight checks a worker's `kubeadm join` skips (`--ignore-preflight-errors`), and
/// why: checks of this sandbox host, not of the node's configuration.
pub const IGNORED_PREFLIGHT_ERRORS: [(&str, &str); 6] = [
    (
        "FileExisting-iptables",
        "no iptables on a sandbox host; no iptables chains here",
    ),
    (
        "FileContent--proc-sys-net-ipv4-ip_forward",
        "pod networking; no pod runs",
    ),
    (
        "FileContent--proc-sys-net-bridge-bridge-nf-call-iptables",
        "pod networking; no pod runs",
    ),
    ("Swap", "the host's swap (failSwapOn: false)"),
    ("SystemVerification", "the host's kernel and cgroups"),
    ("Port-10250", "kubelet listens on a free port of its own"),
];
/// The phases of `kubeadm join --control-plane` skipped (`--skip-phases`), and why: what
/// needs the control plane's static pods, whose images this machine cannot pull (the suite
/// runs kube-apiserver and kube-controller-manager itself), or its other certificates.
pub const CONTROL_PLANE_JOIN_SKIPPED_PHASES: [(&str, &str); 5] = [
    (
        "preflight",
        "checks the host for a control plane (ports, manifests) and the shared certificates the skipped certs phase would use",
    ),
    (
        "control-plane-prepare/download-certs",
        "no --certificate-key: Cluster API hands the CA to the Machine itself",
    ),
    (
        "control-plane-prepare/certs",
        "the control plane's serving and client certificates, for static pods that do not run here",
    ),
    (
        "control-plane-prepare/control-plane",
        "static pod manifests whose images this machine cannot pull",
    ),
    ("wait-control-plane", "waits for those static pods through kubelet"),
];

/// The preflight checks a worker's `kubeadm join` skips where kubeadm is older than a minor
/// (check, the first kubeadm minor that no longer fails it here, why): tools of the host that
/// this sandbox does not install and that nothing run here uses.
pub const IGNORED_PREFLIGHT_ERRORS_BEFORE: [(&str, u32, &str); 2] = [
    (
        "FileExisting-crictl",
        31,
        "kubeadm before v1.31 requires crictl on the host; not installed here, and a worker join uses it for preflight checks only",
    ),
    (
        "FileExisting-conntrack",
        32,
        "kube-proxy's conntrack, required before v1.32; no kube-proxy runs here",
    ),
];

/// A control-plane join's `--skip-phases` ([`CONTROL_PLANE_JOIN_SKIPPED_PHASES`]).
pub fn skip_control_plane_join_phases() -> String {
    let phases: Vec<&str> = CONTROL_PLANE_JOIN_SKIPPED_PHASES
        .iter()
        .map(|(phase, _)| *phase)
        .collect();
    format!("--skip-phases={}", phases.join(","))
}

/// The workload cluster of a kubeadm suite, also its own management cluster: a fresh
/// apiserver (`suite`'s) with Cluster API's CRDs and the Cluster opted in for `attestors`
/// (the management cluster's client comes second). Its processes and folders are recorded, so
/// that the next run cleans up after a killed one.
pub async fn opted_in_cluster(suite: &str, host: &Host, attestors: &str) -> (Workload, kube::Client) {
    let env = Envtest::start(suite);
    let recorder = host.recorder();
    env.pids().into_iter().for_each(|pid| recorder.pid(pid));
    recorder.folder(env.dir());
    recorder.folder(env.client_ca.cert_path.parent().expect("the CA's folder"));
    env.install_capi_crds();
    let admin = live::client(&env.admin_kubeconfig).await;
    let w = Workload::register(env, &admin, capi::NAMESPACE, capi::CLUSTER, attestors).await;
    (w, admin)
}

/// Machine `machine` of the Cluster for node `node` on this host: its provider ID and the
/// addresses kubelet reports (the node address and the node name), against which the signer
/// checks a serving CSR's SANs.
pub fn node_machine(w: &Workload, machine: &str, node: &str, provider_id: &str) -> Value {
    let mut object = w.own(capi::machine(machine, Some(provider_id)));
    object["status"]["addresses"] = json!([
        {"type": "InternalIP", "address": NODE_IP.to_string()},
        {"type": "Hostname", "address": node}
    ]);
    object
}

/// [`node_machine`] as a KubeadmControlPlane makes one: labelled control-plane, its
/// KubeadmConfig named as the Machine (no nodeRef: no Machine controller runs here, the
/// registered Node carrying the provider ID names the node).
pub fn control_plane_machine(w: &Workload, machine: &str, node: &str, provider_id: &str) -> Value {
    let mut object = node_machine(w, machine, node, provider_id);
    object["metadata"]["labels"]["cluster.x-k8s.io/control-plane"] = json!("");
    object["spec"]["bootstrap"]["configRef"]["name"] = json!(machine);
    object
}

/// A worker's Machine for node `node` on this host ([`node_machine`], named as the node) and
/// its KubeadmConfig (`<node>-kc`, naming join token `token_id`), applied as the bootstrap
/// provider leaves them.
pub async fn apply_worker_machine(admin: &kube::Client, w: &Workload, node: &str, token_id: &str, provider_id: &str) {
    live::apply(
        admin,
        &w.own(capi::kubeadm_config(&format!("{node}-kc"), token_id, "v1beta2")),
    )
    .await;
    live::apply(admin, &node_machine(w, node, node, provider_id)).await;
}

/// kube-controller-manager as a kubeadm cluster runs it here (with `extra` flags): the CSR
/// controllers (`csrsigning` signs with the cluster CA, `csrapproving` is kubeadm's own path)
/// and `bootstrapsigner`, which signs `cluster-info` for each join token (a join's discovery
/// needs the JWS).
pub fn kubeadm_controller_manager(assets: &Path, env: &Envtest, host: &Host, extra: &[&str]) -> ControllerManager {
    ControllerManager::start_with_args(
        assets,
        env,
        host,
        &["csrsigning", "csrapproving", "bootstrapsigner"],
        extra,
    )
}

/// cloud-init's instance metadata (`ds.meta_data`) of an EC2 instance in `zone`, as the
/// shipped AWS templates' Jinja reads it; `None` for what else a template would ask.
pub fn ec2_metadata(zone: &'static str, instance_id: &'static str) -> impl Fn(&str) -> Option<String> + Copy {
    move |name: &str| match name {
        "ds.meta_data.placement.availability_zone" => Some(zone.to_owned()),
        "ds.meta_data.instance_id" => Some(instance_id.to_owned()),
        _ => None,
    }
}

/// A join token of InitConfiguration's `bootstrapTokens` (an hour, kubeadm's default usages
/// and group).
pub fn bootstrap_token(token: &str, description: Option<&str>) -> Value {
    let mut value = json!({"token": token, "ttl": "1h"});
    if let Some(description) = description {
        value["description"] = json!(description);
    }
    value
}

/// The cluster's KubeletConfiguration (what `upload-config kubelet` gives every joining node):
/// the sandbox's settings ([`crate::kubelet::sandbox_config`]) with `enforceNodeAllocatable:
/// [none]` for its `[]`: kubeadm leaves an empty list out of the config it uploads and writes,
/// and kubelet then defaults to enforcing `pods`, which `cgroupsPerQOS: false` refuses.
pub fn cluster_kubelet_config(cri: &str, port: u16, healthz_port: u16, dir: &Path) -> String {
    let sandbox = crate::kubelet::sandbox_config(cri, port, healthz_port, dir);
    let empty = "\nenforceNodeAllocatable: []\n";
    assert!(sandbox.contains(empty), "{sandbox}");
    sandbox.replace(empty, "\nenforceNodeAllocatable: [none]\n")
}

/// kubelet's `node-ip` (the node address, [`NODE_IP`]) added to an Init- or
/// JoinConfiguration's `kubeletExtraArgs` (`v1beta4` shape): the sandbox's own, so that
/// kubelet reports the address the serving CSR's SANs are checked against.
pub fn add_node_ip(configuration: &mut Value) {
    let args = &mut configuration["nodeRegistration"]["kubeletExtraArgs"];
    if args.is_null() {
        *args = json!([]);
    }
    args.as_array_mut()
        .expect("kubeletExtraArgs, a list")
        .push(json!({"name": "node-ip", "value": NODE_IP.to_string()}));
}

/// [`cluster_kubelet_config`] on `kubelet`'s ports and folder, with `containerd`.
pub fn kubelet_config_of(containerd: &Containerd, kubelet: &Kubelet) -> String {
    cluster_kubelet_config(
        &containerd.endpoint(),
        kubelet.port,
        kubelet.healthz_port,
        kubelet.dir(),
    )
}

/// The suite's apiserver as kubeadm's configuration names it.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    /// `controlPlaneEndpoint`, and a join's `apiServerEndpoint`: `127.0.0.1:<port>`.
    pub endpoint: String,
    /// The apiserver's port (`localAPIEndpoint.bindPort`).
    pub port: u16,
    /// `kubernetesVersion`: the apiserver's own.
    pub kubernetes_version: String,
    /// The cluster CA's pin (`caCertHashes`).
    pub ca_cert_hash: String,
}

impl ControlPlane {
    /// `w`'s apiserver.
    pub async fn of(w: &Workload) -> Self {
        let endpoint = w.env.server.trim_start_matches("https://").to_owned();
        let port = endpoint
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .expect("the apiserver's port");
        Self {
            port,
            kubernetes_version: w.admin.apiserver_version().await.expect("/version").git_version,
            ca_cert_hash: ca_cert_hash(&w.env.client_ca.cert_pem),
            endpoint,
        }
    }

    /// kubeadm init's InitConfiguration (the `v1beta4` shape, see [`crate::kubeadm_config`]):
    /// `bootstrap` (a KubeadmConfig's `initConfiguration`, or `{}`) with the join `tokens`
    /// ([`bootstrap_token`]), the control plane's own address, and control-plane node `node`
    /// on `cri`.
    pub fn init_configuration(&self, bootstrap: &Value, node: &str, cri: &str, tokens: Vec<Value>) -> Value {
        let mut init = bootstrap.clone();
        init["kind"] = json!("InitConfiguration");
        init["bootstrapTokens"] = json!(tokens);
        init["localAPIEndpoint"] = json!({"advertiseAddress": CONTROL_PLANE_ADDRESS, "bindPort": self.port});
        init["nodeRegistration"]["name"] = json!(node);
        init["nodeRegistration"]["criSocket"] = json!(cri);
        init
    }

    /// kubeadm init's configuration for a control plane that nodes join ([`Kubeadm::init_cluster`]):
    /// the InitConfiguration of [`CONTROL_PLANE`] on `cri` with the join `tokens`, and the
    /// ClusterConfiguration ([`ControlPlane::cluster_configuration`]).
    pub fn init_documents(&self, cri: &str, tokens: Vec<Value>, external_etcd: Option<&str>) -> [Value; 2] {
        [
            self.init_configuration(&json!({}), CONTROL_PLANE, cri, tokens),
            self.cluster_configuration(external_etcd),
        ]
    }

    /// The ClusterConfiguration of the Cluster (`v1beta4` shape), its etcd `external_etcd`'s
    /// when given (then a joining control plane has no etcd member to add).
    pub fn cluster_configuration(&self, external_etcd: Option<&str>) -> Value {
        let mut cluster = json!({"kind": "ClusterConfiguration", "kubernetesVersion": self.kubernetes_version,
            "clusterName": capi::CLUSTER, "controlPlaneEndpoint": self.endpoint,
            "networking": {"serviceSubnet": "10.0.0.0/24"}});
        if let Some(etcd) = external_etcd {
            cluster["etcd"] = json!({"external": {"endpoints": [etcd]}});
        }
        // kubeadm 1.33 turns ControlPlaneKubeletLocalMode on (beta): a control-plane node's
        // kubelet.conf then names its own localAPIEndpoint. Here those are placeholders
        // (192.0.2.10, .11: kubeadm refuses loopback, and the envtest apiserver listens on
        // 127.0.0.1 only), so the suites keep the 1.32 behaviour, kubelet.conf naming the
        // controlPlaneEndpoint; on a real control plane the local endpoint answers and the
        // plugin follows kubelet.conf's server either way.
        if crate::kubeadm_config::kubeadm_minor(&crate::envtest::assets("kubeadm")) >= 33 {
            cluster["featureGates"] = json!({"ControlPlaneKubeletLocalMode": false});
        }
        cluster
    }

    /// The JoinConfiguration the bootstrap provider makes of a KubeadmConfig's
    /// `joinConfiguration` (`bootstrap`, `v1beta4` shape): discovery by `token` pinned to the
    /// cluster CA; the node's name when given (else `bootstrap`'s, or the hostname); the
    /// suite's containerd at `cri`; kubelet's `node-ip` the node address; and, for a
    /// control-plane node, its own `localAPIEndpoint`.
    pub fn join_configuration(
        &self,
        bootstrap: &Value,
        token: &str,
        node: Option<&str>,
        cri: &str,
        control_plane: bool,
    ) -> Value {
        let mut join = bootstrap.clone();
        join["kind"] = json!("JoinConfiguration");
        join["discovery"] = json!({"bootstrapToken": {
            "apiServerEndpoint": self.endpoint, "token": token, "caCertHashes": [self.ca_cert_hash]}});
        if let Some(node) = node {
            join["nodeRegistration"]["name"] = json!(node);
        }
        join["nodeRegistration"]["criSocket"] = json!(cri);
        add_node_ip(&mut join);
        if control_plane {
            join["controlPlane"] =
                json!({"localAPIEndpoint": {"advertiseAddress": JOINING_CONTROL_PLANE_ADDRESS, "bindPort": self.port}});
        }
        join
    }
}

/// The kubeadm of `KUBEBUILDER_ASSETS`, run in a node's namespace with the environment it
/// would have there (`PATH` with the assets first, for the kubelet it checks, and `HOME`),
/// and its configuration version ([`ConfigVersion`]: `v1beta3` before kubeadm v1.31).
pub struct Kubeadm {
    /// The binary.
    pub binary: PathBuf,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// The configuration version it reads.
    pub config_version: ConfigVersion,
    /// Its minor (`kubeadm version -o short`).
    pub minor: u32,
}

impl Kubeadm {
    /// The kubeadm in `assets`.
    pub fn new(assets: &Path) -> Self {
        Self {
            binary: assets.join("kubeadm"),
            env: vec![
                ("PATH".to_owned(), format!("{}:{SYSTEMD_PATH}", assets.display())),
                ("HOME".to_owned(), "/root".to_owned()),
            ],
            config_version: ConfigVersion::of_kubeadm(assets),
            minor: kubeadm_config::kubeadm_minor(assets),
        }
    }

    /// The preflight checks a worker join skips with this kubeadm, and why:
    /// [`IGNORED_PREFLIGHT_ERRORS`], and those of [`IGNORED_PREFLIGHT_ERRORS_BEFORE`] that this
    /// kubeadm's minor still fails.
    pub fn ignored_preflight_errors(&self) -> Vec<(&'static str, &'static str)> {
        let older = IGNORED_PREFLIGHT_ERRORS_BEFORE
            .iter()
            .filter(|(_, fixed, _)| self.minor < *fixed)
            .map(|(check, _, why)| (*check, *why));
        IGNORED_PREFLIGHT_ERRORS.into_iter().chain(older).collect()
    }

    /// A worker join's `--ignore-preflight-errors` ([`Kubeadm::ignored_preflight_errors`]).
    pub fn ignore_preflight_errors(&self) -> String {
        let names: Vec<&str> = self.ignored_preflight_errors().iter().map(|(name, _)| *name).collect();
        format!("--ignore-preflight-errors={}", names.join(","))
    }

    /// Writes a `--config` file at `path`: `documents` (the `v1beta4` shape) in this
    /// kubeadm's version, then a KubeletConfiguration of `kubelet`'s lines when given.
    pub fn write_config(&self, path: &Path, documents: &[Value], kubelet: Option<&str>) {
        let documents = kubeadm_config::render(documents, self.config_version);
        std::fs::write(path, kubeadm_config::yaml_stream(&documents, kubelet)).expect("kubeadm's config");
    }

    /// `kubeadm <args>` in `ns`, to its end; panics unless it succeeds.
    pub fn output(&self, ns: &NodeNamespace, args: &[String]) -> Output {
        let out = ns.command(&self.env, &self.binary, args).output().expect("kubeadm");
        assert!(
            out.status.success(),
            "kubeadm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// [`Kubeadm::output`]: what it said (stdout, then stderr).
    pub fn run(&self, ns: &NodeNamespace, args: &[String]) -> String {
        let out = self.output(ns, args);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `kubeadm init phase <phase> --config <config>`, with `--kubeconfig <kubeconfig>` when
    /// given (else kubeadm reads `/etc/kubernetes/admin.conf`).
    pub fn init_phase(&self, ns: &NodeNamespace, config: &Path, phase: &[&str], kubeconfig: Option<&Path>) -> String {
        let mut args: Vec<String> = ["init", "phase"]
            .into_iter()
            .chain(phase.iter().copied())
            .map(ToOwned::to_owned)
            .collect();
        args.extend(["--config".to_owned(), config.display().to_string()]);
        if let Some(kubeconfig) = kubeconfig {
            args.extend(["--kubeconfig".to_owned(), kubeconfig.display().to_string()]);
        }
        self.run(ns, &args)
    }

    /// What `kubeadm init` leaves in the cluster for joining nodes, by kubeadm's own phases
    /// in `ns` with `init.yaml` there (`documents`, [`ControlPlane::init_documents`], and the
    /// cluster's KubeletConfiguration of `kubelet`'s lines) and the suite's admin credential:
    /// `upload-config kubeadm` (`kubeadm-config`), `upload-config kubelet` (`kubelet-config`,
    /// which annotates the control-plane Node: [`CONTROL_PLANE`] is registered first, with the
    /// hostname label kubeadm waits for, as kubeadm init's kubelet would have),
    /// `bootstrap-token` (the join tokens, their RBAC, `cluster-info` in kube-public,
    /// kubeadm's [`AUTO_APPROVE_BINDINGS`]). What the phases said.
    pub async fn init_cluster(&self, ns: &NodeNamespace, w: &Workload, documents: &[Value], kubelet: &str) -> String {
        let config = ns.dir.path().join("init.yaml");
        self.write_config(&config, documents, Some(kubelet));
        live::apply(
            &w.admin,
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": CONTROL_PLANE, "labels": {
                "kubernetes.io/hostname": CONTROL_PLANE, "node-role.kubernetes.io/control-plane": ""}}}),
        )
        .await;
        let mut said = String::new();
        for phase in [
            ["upload-config", "kubeadm"].as_slice(),
            &["upload-config", "kubelet"],
            &["bootstrap-token"],
        ] {
            said.push_str(&self.init_phase(ns, &config, phase, Some(&w.env.admin_kubeconfig)));
        }
        said
    }

    /// Starts an unmodified `kubeadm join` of `config` (a JoinConfiguration, `v1beta4` shape,
    /// written to `join.yaml` in this kubeadm's version) with `flags`, in `ns`, its output
    /// logged to `kubeadm-join.log` there.
    pub fn join(&self, ns: &NodeNamespace, recorder: &Recorder, config: &Value, flags: &[String]) -> KubeadmJoin {
        let config_path = ns.dir.path().join("join.yaml");
        self.write_config(&config_path, std::slice::from_ref(config), None);
        let mut args = vec![
            "join".to_owned(),
            "--config".to_owned(),
            config_path.display().to_string(),
        ];
        args.extend(flags.iter().cloned());
        let log = ns.dir.path().join("kubeadm-join.log");
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("kubeadm join's log")
        };
        let started = Instant::now();
        let child = ns
            .command(&self.env, &self.binary, &args)
            .stdout(open())
            .stderr(open())
            .spawn()
            .expect("kubeadm join");
        recorder.process(&child);
        KubeadmJoin { child, log, started }
    }
}

/// A running `kubeadm join` ([`Kubeadm::join`]).
pub struct KubeadmJoin {
    child: Child,
    log: PathBuf,
    /// When it started.
    pub started: Instant,
}

impl KubeadmJoin {
    /// What it has said so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits, at most `timeout`, for kubeadm to ask systemd to (re)start kubelet ("Starting
    /// the kubelet", right before `systemctl restart kubelet`) with `bootstrap-kubelet.conf`
    /// and kubelet's `config.yaml` written: where the suite, playing systemd, starts the unit.
    /// Panics, saying `what` did not come there, if kubeadm exits or the time is up first.
    pub async fn wait_for_kubelet_start(&mut self, ns: &NodeNamespace, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        while !(self.output().contains("[kubelet-start] Starting the kubelet")
            && ns.path(&format!("{ETC_KUBERNETES}/bootstrap-kubelet.conf")).exists()
            && ns.path(&format!("{VAR_LIB_KUBELET}/config.yaml")).exists())
        {
            let exited = self.child.try_wait().expect("kubeadm join's status");
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "{what} did not come to starting kubelet ({exited:?}):\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits, at most `timeout`, for it to exit.
    pub async fn finish(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.child, timeout).await
    }

    /// Waits, at most `timeout`, for it to finish as a join that worked: exit 0, having said
    /// "This node has joined the cluster". Panics otherwise, saying `what` did not, with
    /// `diagnostics`.
    pub async fn wait_joined(&mut self, what: &str, timeout: Duration, diagnostics: impl Fn(&Self) -> String) {
        let Some(status) = self.finish(timeout).await else {
            panic!("{what} did not finish\n{}", diagnostics(self));
        };
        assert!(
            status.success() && self.output().contains("This node has joined the cluster"),
            "{what}: {status}\n{}",
            diagnostics(self)
        );
    }
}

/// kubelet's service as systemd starts it from a [`Unit`]: its environment (systemd's `PATH`
/// and the unit's variables only), each `ExecStartPre` and `ExecStart`, `$NAME`s expanded.
#[derive(Debug, Clone)]
pub struct KubeletService {
    /// The environment.
    pub environment: Vec<(String, String)>,
    /// The `ExecStartPre=` command lines, in order.
    pub exec_start_pre: Vec<Vec<String>>,
    /// The `ExecStart=` command line.
    pub exec_start: Vec<String>,
}

impl KubeletService {
    /// kubelet's arguments (`ExecStart` after the program).
    pub fn kubelet_args(&self) -> &[String] {
        &self.exec_start[1..]
    }
}

impl NodeNamespace {
    /// The CA as Cluster API hands it to a control-plane Machine (kubeadm signs kubelet's
    /// certificate with it on the first one): `/etc/kubernetes/pki/ca.crt` and `ca.key`.
    pub fn install_cluster_ca(&self, ca: &TestCa) {
        std::fs::write(self.path(&format!("{ETC_KUBERNETES}/pki/ca.crt")), &ca.cert_pem).expect("ca.crt");
        std::fs::write(self.path(&format!("{ETC_KUBERNETES}/pki/ca.key")), &ca.key_pem).expect("ca.key");
    }

    /// kubelet's service as systemd would start `unit` now (the environment files read as
    /// they are in the namespace).
    pub fn kubelet_service(&self, unit: &Unit) -> KubeletService {
        let environment: Vec<(String, String)> = std::iter::once(("PATH".to_owned(), SYSTEMD_PATH.to_owned()))
            .chain(unit.environment(|path| self.read(path)))
            .collect();
        KubeletService {
            exec_start_pre: unit
                .exec_start_pre
                .iter()
                .map(|pre| expand(pre, &environment))
                .collect(),
            exec_start: expand(unit.exec_start.as_deref().expect("an ExecStart"), &environment),
            environment,
        }
    }

    /// Runs the service's `ExecStartPre`s in order, in the namespace; panics unless each
    /// succeeds, as systemd would not start kubelet then. What they said.
    pub fn run_exec_start_pre(&self, service: &KubeletService) -> String {
        let mut said = String::new();
        for pre in &service.exec_start_pre {
            let out = self
                .command(&service.environment, Path::new(&pre[0]), &pre[1..])
                .output()
                .expect("ExecStartPre");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "ExecStartPre {pre:?}: {text}");
            said.push_str(&text);
        }
        said
    }

    /// kubeadm's `/var/lib/kubelet/config.yaml` as the sandbox's kubelet and kubeadm of
    /// `minor` (the assets') need it; from v1.31 it is left as it is. Before v1.31:
    /// - kubelet refuses any `enforceNodeAllocatable` without `cgroupsPerQOS`, `none` included
    ///   ([`cluster_kubelet_config`]), and kubeadm writes no empty list (kubelet would default
    ///   it to `pods`): the empty list is written back, as kubelet reads the sandbox's own config;
    /// - kubeadm waits for kubelet's health at `localhost:10248` whatever `healthzPort` says:
    ///   kubelet serves it there when the port is free (else another of the suite's kubelets on
    ///   this host, whose network the nodes share, holds it and answers).
    fn accept_kubelet_config(&self, minor: u32) {
        if minor >= 31 {
            return;
        }
        let path = self.path(&format!("{VAR_LIB_KUBELET}/config.yaml"));
        let text = std::fs::read_to_string(&path).expect("kubelet's config.yaml");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubelet's config.yaml");
        let settings = config.as_mapping_mut().expect("kubelet's config, a mapping");
        let enforce = serde_yaml::Value::from("enforceNodeAllocatable");
        if settings.get(&enforce) == Some(&serde_yaml::Value::from(vec!["none"])) {
            settings.insert(enforce, serde_yaml::Value::Sequence(Vec::new()));
        }
        if std::net::TcpListener::bind(("127.0.0.1", KUBEADM_KUBELET_HEALTHZ_PORT)).is_ok() {
            settings.insert("healthzPort".into(), KUBEADM_KUBELET_HEALTHZ_PORT.into());
        }
        std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("kubelet's config.yaml");
    }

    /// Starts `kubelet` as the service's `ExecStart` (kubeadm's `/usr/bin/kubelet`, here the
    /// assets' kubelet) in the namespace.
    pub fn start_kubelet(&self, service: &KubeletService, kubelet: &mut Kubelet, assets: &Path) {
        assert_eq!(service.exec_start[0], "/usr/bin/kubelet", "{:?}", service.exec_start);
        self.accept_kubelet_config(kubeadm_config::kubeadm_minor(assets));
        kubelet.start_command(
            &self.nsenter,
            self.args(&service.environment, &assets.join("kubelet"), service.kubelet_args()),
        );
    }
}

/// Waits, at most `timeout`, for kube-controller-manager's `bootstrapsigner` to sign
/// `cluster-info` (kube-public) for every join token of `token_ids` (a join's discovery needs
/// the JWS); the ConfigMap's data.
pub async fn wait_cluster_info_signed(
    admin: &kube::Client,
    token_ids: &[&str],
    timeout: Duration,
    kcm: &ControllerManager,
) -> BTreeMap<String, String> {
    let configmaps: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), "kube-public");
    let deadline = Instant::now() + timeout;
    loop {
        let data = configmaps
            .get_opt("cluster-info")
            .await
            .expect("cluster-info")
            .and_then(|c| c.data)
            .unwrap_or_default();
        if token_ids
            .iter()
            .all(|id| data.contains_key(&format!("jws-kubeconfig-{id}")))
        {
            return data;
        }
        assert!(Instant::now() < deadline, "cluster-info is not signed\n{}", kcm.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What kubeadm init binds for the `admin.conf` it writes (group `kubeadm:cluster-admins`): a
/// joining control plane writes its own admin.conf with it, and marks its Node with that.
pub async fn bind_kubeadm_cluster_admins(admin: &kube::Client) {
    live::apply(
        admin,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kubeadm:cluster-admins"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins"}]}),
    )
    .await;
}

/// The last `lines` lines of the signer's log.
pub fn signer_tail(signer: &Signer, lines: usize) -> String {
    let log = signer.log();
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// What each process of a join said last, for a failure message: kubeadm join, kubelet, the
/// signer (its last `signer_lines` lines), kube-controller-manager.
pub fn join_diagnostics(
    join: &KubeadmJoin,
    kubelet: &Kubelet,
    signer: &Signer,
    signer_lines: usize,
    kcm: &ControllerManager,
) -> String {
    format!(
        "--- kubeadm join:\n{}\n--- kubelet:\n{}\n--- signer:\n{}\n--- kube-controller-manager:\n{}",
        join.output(),
        kubelet.log(),
        signer_tail(signer, signer_lines),
        kcm.log()
    )
}

/// Waits, at most `timeout`, for kubelet to register Node `name`; panics with `diagnostics`
/// if kubelet exits first or the time is up.
pub async fn wait_registered(
    admin: &kube::Client,
    name: &str,
    kubelet: &mut Kubelet,
    timeout: Duration,
    diagnostics: impl Fn(&Kubelet) -> String,
) -> Node {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(registered) = crate::kubelet::node(admin, name).await {
            return registered;
        }
        assert!(
            Instant::now() < deadline && kubelet.alive(),
            "Node {name} was not registered\n{}",
            diagnostics(kubelet)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod render_tests {
    use super::render;

    #[test]
    fn conditions_on_a_variable_are_rendered_and_anything_else_refused() {
        let vars = |name: &str| match name {
            "attestor" => Some("tpm".to_owned()),
            "file" => Some("/etc/p".to_owned()),
            _ => None,
        };
        let template =
            "a{% if attestor != 'azure' %} --f {{ file }}{% endif %} b{% if attestor == 'azure' %} x{% endif %}";
        assert_eq!(render(template, vars), "a --f /etc/p b");
        let azure = |name: &str| (name == "attestor").then(|| "azure".to_owned());
        assert_eq!(render("a{% if attestor != 'azure' %} --f{% endif %} b", azure), "a b");
        assert!(std::panic::catch_unwind(|| render("{% for x in y %}{% endfor %}", vars)).is_err());
        assert!(std::panic::catch_unwind(|| render("{# comment #}", vars)).is_err());
    }
}
