//! A kubeadm node on this host, for the suites that run kubeadm itself (`envtest_kubeadm`'s
//! `kubeadm join`, `envtest_kubeadm_init`'s `kubeadm init` phases, `envtest_kubeadm_clouds`'
//! joins on each cloud's flavour): a private mount and UTS namespace in which temporary folders
//! stand for `/etc/kubernetes`, `/var/lib/kubelet` and kubelet's drop-in folder
//! `/etc/systemd/system/kubelet.service.d`, the plugin for its install path and a stub for
//! `systemctl`; and systemd's part, the unit's drop-ins read and run as systemd would.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kubelet::{Host, MountPoint, Recorder, der, program_path};

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
