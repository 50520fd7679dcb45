//! A real kubelet (from `KUBEBUILDER_ASSETS`, beside kube-apiserver) on this host, for the
//! suites in which a node joins a cluster suite's apiserver: its own containerd, a
//! kube-controller-manager that signs what the signer approved, and the host state a kubelet
//! cannot be kept from touching, put back afterwards.
//!
//! Everything a kubelet can be pointed elsewhere for lives in temporary folders: its root dir,
//! pod logs, volume plugins, containerd's root, state, socket and CNI config. What it cannot
//! ([`Host`]): the node address (not loopback; an interface [`INTERFACE`] holding [`NODE_IP`],
//! of type dummy, or a bridge without ports where the kernel has no dummy driver),
//! `/var/lib/kubelet/device-plugins` and `/var/log/containers` (fixed paths), and
//! the kernel tunables kubelet sets at start ([`SYSCTLS`]). [`Host::claim`] takes a host-wide
//! lock (one kubelet suite at a time), saves and later restores those tunables, creates the
//! folders it must and removes them again (and the empty mount points a suite running a node
//! in its own mount namespace needs, [`Host::mount_point`]), and after a run that was killed
//! (nextest's timeout, SIGKILL) ends that run's processes by their recorded ids, unmounts and
//! removes its folders and restores the tunables it had saved. Every process here is stopped on
//! drop; with `KUBELET_LOG_DIR` set, the logs of kubelet, containerd and kube-controller-manager
//! are copied there first.
//!
//! A sandbox without systemd and with cgroup v1 needs in the KubeletConfiguration (see
//! [`sandbox_config`]): `cgroupDriver: cgroupfs`, `cgroupsPerQOS: false`,
//! `enforceNodeAllocatable: []`, `failSwapOn: false`, `makeIPTablesUtilChains: false`,
//! `resolvConf: ""`, and its own ports; on the command line `--root-dir` and `--cert-dir`
//! (whose default, `/var/lib/kubelet/pki`, does not follow `--root-dir`), `--node-ip`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;

use crate::envtest::{Envtest, free_port};

/// The interface holding the node address (kubelet refuses a loopback node IP).
pub const INTERFACE: &str = "ka-dummy0";
/// The node address, on [`INTERFACE`].
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The kernel tunables kubelet sets when it starts (`setupKernelTunables`; with
/// `protectKernelDefaults: true` it refuses to start instead): saved before and restored after.
pub const SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// Paths kubelet uses whatever its root dir (the device manager's socket folder, the container
/// log links), created when missing and removed again.
pub const HOST_DIRS: [&str; 2] = ["/var/lib/kubelet/device-plugins", "/var/log/containers"];

/// What this host lacks to run a kubelet here, in words; empty when nothing is missing.
/// `scripts/test` checks the same (the part `kubelet`).
pub fn missing_parts() -> Vec<String> {
    let mut missing = Vec::new();
    if std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX) != 0 {
        missing.push("root (kubelet and containerd run as root)".to_owned());
    }
    match std::env::var_os("KUBEBUILDER_ASSETS") {
        None => missing
            .push("KUBEBUILDER_ASSETS (a folder holding kube-apiserver, kubelet, kube-controller-manager)".to_owned()),
        Some(dir) => {
            for binary in ["kube-apiserver", "kubectl", "kubelet", "kube-controller-manager"] {
                if !Path::new(&dir).join(binary).exists() {
                    missing.push(format!("{binary} in KUBEBUILDER_ASSETS={}", Path::new(&dir).display()));
                }
            }
        }
    }
    for program in ["containerd", "runc", "ip", "mount", "umount", "openssl"] {
        if program_path(program).is_none() {
            missing.push(format!("{program} (Debian: containerd, runc, iproute2)"));
        }
    }
    missing
}

/// The envtest folder, when this host can run a kubelet; otherwise panics saying what is
/// missing (a suite run without the real parts fails, it does not pass).
pub fn require(suite: &str) -> PathBuf {
    let missing = missing_parts();
    assert!(
        missing.is_empty(),
        "{suite} runs a real kubelet and needs: {}; run scripts/test, which skips this test without them",
        missing.join(", ")
    );
    crate::envtest::assets(suite)
}

/// `program` on `PATH` (or in the sbin folders, where Debian puts runc).
pub fn program_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn run(program: &str, args: &[&str]) -> std::process::Output {
    Command::new(program_path(program).unwrap_or_else(|| PathBuf::from(program)))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn run_ok(program: &str, args: &[&str]) {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Keeps a copy of a log in `$KUBELET_LOG_DIR` when it is set (the temporary folders go).
fn keep_log(path: &Path, name: &str) {
    if let Some(dir) = std::env::var_os("KUBELET_LOG_DIR") {
        let _ = std::fs::copy(path, Path::new(&dir).join(format!("{name}-{}.log", std::process::id())));
    }
}

/// Writes what a run started, so that the next one can clean up after it if it is killed.
#[derive(Clone, Debug)]
pub struct Recorder {
    state: PathBuf,
}

impl Recorder {
    fn append(&self, file: &str, line: &str) {
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(self.state.join(file)) {
            let _ = writeln!(f, "{line}");
        }
    }

    /// A process started (its id and start time: an id reused by another process is not it).
    pub fn process(&self, child: &Child) {
        self.pid(child.id());
    }

    /// A process started elsewhere (the apiserver's, the signer's), by its id.
    pub fn pid(&self, pid: u32) {
        if let Some(start) = start_time(pid) {
            self.append("processes", &format!("{pid} {start}"));
        }
    }

    /// A folder to unmount (everything under it) and remove.
    pub fn folder(&self, path: &Path) {
        self.append("folders", &path.display().to_string());
    }
}

/// A process's start time (field 22 of `/proc/<pid>/stat`).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19).map(ToOwned::to_owned)
}

/// Unmounts every mount at or under `path` (lazily, deepest first).
pub fn unmount_under(path: &Path) {
    for _ in 0..10 {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|p| p.replace("\\040", " "))
            .filter(|p| Path::new(p).starts_with(path))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = run("umount", &["-l", &point]);
        }
    }
}

/// What [`Host::mount_point`] makes: a folder or an empty file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountPoint {
    /// An empty folder.
    Folder,
    /// An empty file.
    File,
}

/// The host as a kubelet leaves it: held by one suite at a time, put back on drop.
pub struct Host {
    lock: File,
    recorder: Recorder,
    sysctls: Vec<(String, String)>,
    created: Vec<PathBuf>,
    mount_points: Vec<(PathBuf, PathBuf)>,
    /// The kind of link [`INTERFACE`] is: `dummy`, or `bridge` where the kernel has no dummy
    /// driver.
    pub interface_kind: &'static str,
}

impl Host {
    /// Waits for the host-wide lock, cleans up after a killed run, saves [`SYSCTLS`], creates
    /// [`HOST_DIRS`] and the dummy interface [`INTERFACE`] with [`NODE_IP`].
    pub fn claim() -> Self {
        let state = std::env::temp_dir().join("kubelet-authenticator-kubelet-suites");
        std::fs::create_dir_all(&state).expect("state folder");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(state.join("lock"))
            .expect("lock file");
        lock.lock().expect("the host-wide kubelet lock");
        let recorder = Recorder { state };
        let mut host = Self {
            lock,
            recorder,
            sysctls: Vec::new(),
            created: Vec::new(),
            mount_points: Vec::new(),
            interface_kind: "",
        };
        host.clean_up_after_a_killed_run();

        // Saved to a file first: after a killed run the saved values are the host's own.
        let saved = host.recorder.state.join("sysctls");
        host.sysctls = SYSCTLS
            .iter()
            .map(|key| {
                let value = std::fs::read_to_string(Path::new("/proc/sys").join(key)).expect("sysctl");
                ((*key).to_owned(), value.trim().to_owned())
            })
            .collect();
        let text: String = host.sysctls.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        std::fs::write(&saved, text).expect("save sysctls");

        for dir in HOST_DIRS {
            // The topmost folder created is the one to remove.
            let mut top = None;
            for ancestor in Path::new(dir).ancestors() {
                if ancestor.exists() {
                    break;
                }
                top = Some(ancestor.to_owned());
            }
            if let Some(top) = top {
                std::fs::create_dir_all(dir).expect("create a host folder");
                host.recorder.append("created", &top.display().to_string());
                host.created.push(top);
            }
        }

        let _ = run("ip", &["link", "del", INTERFACE]);
        host.recorder.append("interface", INTERFACE);
        // A kernel without the dummy driver (built without it, modules off) still has bridges:
        // one without ports holds a local address as well.
        let kinds = ["dummy", "bridge"];
        let failures: Vec<String> = kinds
            .iter()
            .map_while(|kind| {
                let out = run("ip", &["link", "add", INTERFACE, "type", kind]);
                (!out.status.success()).then(|| format!("{kind}: {}", String::from_utf8_lossy(&out.stderr).trim()))
            })
            .collect();
        assert!(
            failures.len() < kinds.len(),
            "cannot create the interface {INTERFACE} for the node address: {failures:?}"
        );
        host.interface_kind = kinds[failures.len()];
        run_ok("ip", &["addr", "add", &format!("{NODE_IP}/32"), "dev", INTERFACE]);
        run_ok("ip", &["link", "set", INTERFACE, "up"]);
        host
    }

    /// Where the processes and folders of this run are recorded.
    pub fn recorder(&self) -> Recorder {
        self.recorder.clone()
    }

    /// Makes sure `path` exists on the host, as the target of a bind mount made in a private
    /// mount namespace (`unshare --mount`), where a suite puts its own folders in place of a
    /// node's fixed paths (`/etc/kubernetes`, say) without touching the host's. A missing path
    /// is created (with its missing parent folders) empty, recorded, and removed again on drop,
    /// or by the next run after a killed one, when it is still empty and nothing is mounted on
    /// it here; an existing path is left as it is.
    pub fn mount_point(&mut self, path: &Path, kind: MountPoint) {
        if std::fs::symlink_metadata(path).is_ok() {
            return;
        }
        let mut top = path.to_owned();
        for ancestor in path.ancestors().skip(1) {
            if ancestor.exists() {
                break;
            }
            ancestor.clone_into(&mut top);
        }
        // Recorded first: a run killed right after creating it still has it removed.
        self.recorder
            .append("mount-points", &format!("{}\t{}", path.display(), top.display()));
        self.mount_points.push((path.to_owned(), top));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("a mount point's folder");
        }
        match kind {
            MountPoint::Folder => std::fs::create_dir(path).expect("a mount point folder"),
            MountPoint::File => drop(File::create(path).expect("a mount point file")),
        }
    }

    fn clean_up_after_a_killed_run(&mut self) {
        let state = &self.recorder.state;
        let read = |file: &str| std::fs::read_to_string(state.join(file)).unwrap_or_default();
        for line in read("processes").lines() {
            let Some((pid, start)) = line.split_once(' ') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else { continue };
            if start_time(pid).as_deref() == Some(start) {
                let _ = run("kill", &["-KILL", &pid.to_string()]);
                let deadline = Instant::now() + Duration::from_secs(10);
                while start_time(pid).as_deref() == Some(start) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        for folder in read("folders").lines().filter(|l| !l.is_empty()) {
            unmount_under(Path::new(folder));
            let _ = std::fs::remove_dir_all(folder);
        }
        if !read("interface").is_empty() {
            let _ = run("ip", &["link", "del", INTERFACE]);
        }
        for line in read("sysctls").lines() {
            if let Some((key, value)) = line.split_once(' ') {
                let _ = std::fs::write(Path::new("/proc/sys").join(key), value);
            }
        }
        for line in read("mount-points").lines() {
            if let Some((path, top)) = line.split_once('\t') {
                remove_mount_point(Path::new(path), Path::new(top));
            }
        }
        for folder in read("created").lines().filter(|l| !l.is_empty()) {
            remove_created(Path::new(folder));
        }
        for file in STATE_FILES {
            let _ = std::fs::remove_file(state.join(file));
        }
    }
}

/// The files of a run's record in the state folder.
const STATE_FILES: [&str; 6] = [
    "processes",
    "folders",
    "interface",
    "sysctls",
    "created",
    "mount-points",
];

/// Whether something is mounted on `path` in this mount namespace.
fn mounted_here(path: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| Path::new(&p.replace("\\040", " ")) == path)
}

/// Removes a mount point [`Host::mount_point`] created, if it is still empty and nothing is
/// mounted on it here, then its parent folders up to `top` (the topmost one it created) that
/// are empty.
fn remove_mount_point(path: &Path, top: &Path) {
    if mounted_here(path) {
        return;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir(path);
        }
        Ok(m) if m.is_file() && m.len() == 0 => {
            let _ = std::fs::remove_file(path);
        }
        _ => return,
    }
    for ancestor in path.ancestors().skip(1).take_while(|a| a.starts_with(top)) {
        let _ = std::fs::remove_dir(ancestor);
    }
}

/// Removes a host folder this module created: the device plugins' (kubelet's socket and
/// checkpoint) entirely, the others only when empty.
fn remove_created(top: &Path) {
    let device_plugins = Path::new(HOST_DIRS[0]);
    if device_plugins.starts_with(top) {
        let _ = std::fs::remove_dir_all(device_plugins);
    }
    let mut dirs: Vec<&Path> = HOST_DIRS
        .iter()
        .flat_map(|d| Path::new(d).ancestors())
        .filter(|d| d.starts_with(top))
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.as_os_str().len()));
    dirs.dedup();
    for dir in dirs {
        let _ = std::fs::remove_dir(dir);
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", INTERFACE]);
        for (key, value) in &self.sysctls {
            let _ = std::fs::write(Path::new("/proc/sys").join(key), value);
        }
        for (path, top) in &self.mount_points {
            remove_mount_point(path, top);
        }
        for top in &self.created {
            remove_created(top);
        }
        for file in STATE_FILES {
            let _ = std::fs::remove_file(self.recorder.state.join(file));
        }
        let _ = self.lock.unlock();
    }
}

/// Stops `child`: SIGTERM, then SIGKILL after `grace`.
fn stop(child: &mut Child, grace: Duration) {
    let _ = run("kill", &["-TERM", &child.id().to_string()]);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn log_file(path: &Path) -> Stdio {
    Stdio::from(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("log file"),
    )
}

/// Whether an overlay mount works in `dir` (containerd's overlayfs snapshotter needs it; in
/// some sandboxes it does not, and the native snapshotter is used instead).
pub fn overlay_works(dir: &Path) -> bool {
    let base = dir.join("overlay-check");
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| base.join(d));
    for d in [&lower, &upper, &work, &merged] {
        if std::fs::create_dir_all(d).is_err() {
            return false;
        }
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let mounted = run(
        "mount",
        &[
            "-t",
            "overlay",
            "overlay",
            "-o",
            &options,
            merged.to_str().expect("UTF-8 path"),
        ],
    )
    .status
    .success();
    if mounted {
        let _ = run("umount", &[merged.to_str().expect("UTF-8 path")]);
    }
    let _ = std::fs::remove_dir_all(&base);
    mounted
}

/// containerd with its own root, state, socket, CRI state and CNI configuration, in a
/// temporary folder. Nothing is pulled and no pod runs: kubelet needs a container runtime only
/// to report the node Ready. The CNI configuration is one `loopback` network list, which is
/// what the CRI plugin needs to report the network ready (no plugin binary is ever run).
pub struct Containerd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// The CRI socket.
    pub socket: PathBuf,
    /// `overlayfs` where an overlay mount works here, else `native`.
    pub snapshotter: &'static str,
}

impl Containerd {
    /// Starts containerd and waits until its socket answers.
    pub fn start(host: &Host) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let recorder = host.recorder();
        recorder.folder(dir.path());
        let d = dir.path();
        let snapshotter = if overlay_works(d) { "overlayfs" } else { "native" };
        for sub in ["root", "state", "opt", "cni/net.d", "cni/bin"] {
            std::fs::create_dir_all(d.join(sub)).expect("containerd folder");
        }
        std::fs::write(
            d.join("cni/net.d/10-loopback.conflist"),
            r#"{"cniVersion": "0.4.0", "name": "kubelet-authenticator-test", "plugins": [{"type": "loopback"}]}"#,
        )
        .expect("CNI config");
        let socket = d.join("containerd.sock");
        let p = |sub: &str| d.join(sub).display().to_string();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "{snapshotter}"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni_bin}"
      conf_dir = "{cni_conf}"
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
"#,
            root = p("root"),
            state = p("state"),
            socket = socket.display(),
            cni_bin = p("cni/bin"),
            cni_conf = p("cni/net.d"),
            opt = p("opt"),
        );
        std::fs::write(d.join("config.toml"), config).expect("containerd config");
        let log = d.join("containerd.log");
        let child = Command::new(program_path("containerd").expect("containerd"))
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log_file(&log))
            .stderr(log_file(&log))
            .spawn()
            .expect("start containerd");
        recorder.process(&child);
        let mut containerd = Self {
            child: Some(child),
            dir,
            socket,
            snapshotter,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&containerd.socket).is_err() {
            let exited = containerd
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            assert!(
                !exited && Instant::now() < deadline,
                "containerd did not start:\n{}",
                containerd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        containerd
    }

    /// `unix://<socket>`, kubelet's `containerRuntimeEndpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The end of its log.
    pub fn log(&self) -> String {
        tail(&self.dir.path().join("containerd.log"), 40)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, Duration::from_secs(10));
        }
        keep_log(&self.dir.path().join("containerd.log"), "containerd");
        unmount_under(self.dir.path());
    }
}

/// kube-controller-manager's flags against `env`: as admin, running `controllers`, signing with
/// the apiserver's client CA (so its certificates authenticate), no leader election, no port.
pub fn controller_manager_args(env: &Envtest, controllers: &[&str]) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", env.admin_kubeconfig.display()),
        format!("--controllers={}", controllers.join(",")),
        format!("--cluster-signing-cert-file={}", env.client_ca.cert_path.display()),
        format!("--cluster-signing-key-file={}", env.client_ca.key_path.display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--v=2".into(),
    ]
}

/// kube-controller-manager running the CSR controllers only (`csrsigning`, `csrapproving`) as
/// the workload cluster's: it signs approved CSRs of the `kubernetes.io` signers (kubelet
/// serving certificates among them) with the cluster CA ([`Envtest::client_ca`]). Its
/// approver is kubeadm's path for `kubernetes.io/kube-apiserver-client-kubelet`, which a node
/// of this project never uses.
pub struct ControllerManager {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl ControllerManager {
    /// Starts it with `env`'s admin kubeconfig (no leader election, no serving port).
    pub fn start(assets: &Path, env: &Envtest, host: &Host) -> Self {
        Self::start_with_controllers(assets, env, host, &["csrsigning", "csrapproving"])
    }

    /// [`ControllerManager::start`] running `controllers` (kube-controller-manager's
    /// `--controllers`), e.g. also `bootstrapsigner`, which signs `cluster-info` for
    /// `kubeadm join`'s token discovery.
    pub fn start_with_controllers(assets: &Path, env: &Envtest, host: &Host, controllers: &[&str]) -> Self {
        Self::start_with_args(assets, env, host, controllers, &[])
    }

    /// [`ControllerManager::start_with_controllers`] with `extra` flags (e.g.
    /// `--cluster-signing-duration=3m`, so a node of kubeadm's own path rotates within a suite).
    pub fn start_with_args(assets: &Path, env: &Envtest, host: &Host, controllers: &[&str], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        host.recorder().folder(dir.path());
        let log = dir.path().join("kube-controller-manager.log");
        let child = Command::new(assets.join("kube-controller-manager"))
            .args(controller_manager_args(env, controllers))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file(&log))
            .stderr(log_file(&log))
            .spawn()
            .expect("start kube-controller-manager");
        host.recorder().process(&child);
        Self {
            child: Some(child),
            dir,
        }
    }

    /// The end of its log.
    pub fn log(&self) -> String {
        tail(&self.dir.path().join("kube-controller-manager.log"), 40)
    }

    /// The process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, Duration::from_secs(5));
        }
        keep_log(
            &self.dir.path().join("kube-controller-manager.log"),
            "kube-controller-manager",
        );
    }
}

/// What a KubeletConfiguration needs to run in this sandbox, as YAML lines (top level). Every
/// line is needed:
///
/// - `cgroupDriver: cgroupfs`: no systemd here.
/// - `cgroupsPerQOS: false`, `enforceNodeAllocatable: []`: no QoS or node-allocatable cgroup
///   hierarchy (it would be created under the host's cgroups, which a sandbox may not allow).
/// - `failSwapOn: false`: whatever the host's swap.
/// - `makeIPTablesUtilChains: false`: the host's iptables are left alone.
/// - `resolvConf: ""`: no host resolv.conf for pods (none run).
/// - `address`, `port`, `healthzBindAddress`, `healthzPort`, `readOnlyPort: 0`: free ports.
/// - `containerRuntimeEndpoint`: this suite's containerd.
/// - `podLogsDir`, `volumePluginDir`: under `dir`, not `/var/log/pods` and `/usr/libexec`.
pub fn sandbox_config(runtime_endpoint: &str, port: u16, healthz_port: u16, dir: &Path) -> String {
    format!(
        r#"cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: ""
address: {NODE_IP}
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
readOnlyPort: 0
containerRuntimeEndpoint: {runtime_endpoint}
podLogsDir: {pod_logs}
volumePluginDir: {volume_plugins}
"#,
        pod_logs = dir.join("pod-logs").display(),
        volume_plugins = dir.join("volume-plugins").display(),
    )
}

/// A kubelet whose user is whatever the kubeconfig says, with its root dir (and so its
/// `pki` cert dir) in a temporary folder, client-certificate rotation off, no bootstrap
/// kubeconfig, serving certificates from `serverTLSBootstrap`.
pub struct Kubelet {
    binary: PathBuf,
    recorder: Recorder,
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
    /// The node name (`--hostname-override`).
    pub node: String,
    /// The provider ID of its config.
    pub provider_id: String,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// The HTTPS port (on [`NODE_IP`]).
    pub port: u16,
    /// The healthz port (loopback).
    pub healthz_port: u16,
}

impl Kubelet {
    /// Prepares (does not start) kubelet `node` of provider ID `provider_id` on `containerd`.
    pub fn new(assets: &Path, host: &Host, containerd: &Containerd, node: &str, provider_id: &str) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let recorder = host.recorder();
        recorder.folder(dir.path());
        let root_dir = dir.path().join("root");
        std::fs::create_dir_all(&root_dir).expect("root dir");
        let (port, healthz_port) = (free_port(), free_port());
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nproviderID: {provider_id}\nserverTLSBootstrap: true\n{}",
            sandbox_config(&containerd.endpoint(), port, healthz_port, dir.path())
        );
        std::fs::write(dir.path().join("config.yaml"), config).expect("kubelet config");
        Self {
            binary: assets.join("kubelet"),
            recorder,
            child: None,
            args: Vec::new(),
            node: node.to_owned(),
            provider_id: provider_id.to_owned(),
            root_dir,
            port,
            healthz_port,
            dir,
        }
    }

    /// The folder of its config, log and root dir (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its cert dir (`<root-dir>/pki`, kubelet's default): where the serving certificate goes,
    /// and where the plugin keeps the client certificate.
    pub fn pki_dir(&self) -> PathBuf {
        self.root_dir.join("pki")
    }

    /// Its KubeletConfiguration file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// Starts it with `--kubeconfig kubeconfig` and the flags a node of this project runs with
    /// (see [`Kubelet::start_with`] for others).
    pub fn start(&mut self, kubeconfig: &Path) {
        let args = vec![
            format!("--config={}", self.config_path().display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", self.root_dir.display()),
            // Not under --root-dir by default: /var/lib/kubelet/pki.
            format!("--cert-dir={}", self.pki_dir().display()),
            format!("--hostname-override={}", self.node),
            format!("--node-ip={NODE_IP}"),
            "--rotate-certificates=false".to_owned(),
            "--v=2".to_owned(),
        ];
        self.start_with(args);
    }

    /// Starts it with exactly `args` (a kubeadm-written config and flags, say); its log and
    /// restarts as with [`Kubelet::start`].
    pub fn start_with(&mut self, args: Vec<String>) {
        self.args = args;
        self.spawn();
    }

    /// Starts `program` with `args` in its place: a launcher that ends by executing kubelet in
    /// the same process (`nsenter ... -- env -i ... kubelet ...`, say), so that the process
    /// stopped is kubelet; its log and restarts as with [`Kubelet::start`].
    pub fn start_command(&mut self, program: &Path, args: Vec<String>) {
        program.clone_into(&mut self.binary);
        self.start_with(args);
    }

    fn spawn(&mut self) {
        let log = self.dir.path().join("kubelet.log");
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env_remove("KUBERNETES_EXEC_INFO")
            .stdin(Stdio::null())
            .stdout(log_file(&log))
            .stderr(log_file(&log))
            .spawn()
            .expect("start kubelet");
        self.recorder.process(&child);
        self.child = Some(child);
    }

    /// SIGTERM, and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, Duration::from_secs(20));
        }
    }

    /// Starts it again with the flags of [`Kubelet::start`] (its log goes on), after
    /// [`Kubelet::stop`].
    pub fn start_again(&mut self) {
        assert!(!self.args.is_empty(), "start_again before start");
        self.stop();
        self.spawn();
    }

    /// The process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The end of its log.
    pub fn log(&self) -> String {
        tail(&self.dir.path().join("kubelet.log"), 60)
    }

    /// The whole log.
    pub fn full_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kubelet.log")).unwrap_or_default()
    }

    /// The certificate it serves on its HTTPS port, PEM, when a TLS handshake verifies with
    /// `ca_file` for its node name and [`NODE_IP`]; the reason otherwise.
    pub fn served_certificate(&self, ca_file: &Path) -> Result<String, String> {
        let out = Command::new("openssl")
            .args(["s_client", "-connect", &format!("{NODE_IP}:{}", self.port), "-CAfile"])
            .arg(ca_file)
            .args([
                "-verify_return_error",
                "-verify_hostname",
                &self.node,
                "-verify_ip",
                &NODE_IP.to_string(),
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let begin = stdout.find("-----BEGIN CERTIFICATE-----");
        let end = stdout.find("-----END CERTIFICATE-----");
        match (
            out.status.success() && stdout.contains("Verify return code: 0 (ok)"),
            begin,
            end,
        ) {
            (true, Some(b), Some(e)) => Ok(format!("{}\n", &stdout[b..e + "-----END CERTIFICATE-----".len()])),
            _ => Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))),
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        keep_log(&self.dir.path().join("kubelet.log"), "kubelet");
        // kubelet bind-mounts its root dir onto itself (rshared).
        unmount_under(self.dir.path());
    }
}

/// One CSR as [`CsrRecorder`] saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its name.
    pub name: String,
    /// `spec.signerName`.
    pub signer: String,
    /// `spec.username`: who filed it.
    pub username: String,
    /// When the recorder first saw it.
    pub first_seen: Instant,
    /// When it first saw it approved.
    pub approved: Option<Instant>,
    /// The approval's reason.
    pub approved_reason: Option<String>,
    /// When it first saw it denied or failed, with the reason.
    pub refused: Option<(Instant, String)>,
    /// When it first saw a certificate, and the certificate (PEM).
    pub issued: Option<(Instant, String)>,
}

/// Every CSR of a cluster from now on, created and changed, through a watch: a CSR that came
/// and went between two looks is seen too.
pub struct CsrRecorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CsrRecorder {
    /// Starts watching with `admin`, and returns once the first list is in.
    pub async fn start(admin: kube::Client) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let api: kube::Api<CertificateSigningRequest> = kube::Api::all(admin);
            let mut ready = Some(ready_tx);
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr) | watcher::Event::Delete(csr)) => {
                        observe(&record, &csr);
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(30), ready_rx).await;
        Self { seen, task }
    }

    /// Every CSR seen so far, in the order first seen.
    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().expect("recorder").clone()
    }

    /// Those of `signer`.
    pub fn of(&self, signer: &str) -> Vec<Seen> {
        self.all().into_iter().filter(|s| s.signer == signer).collect()
    }

    /// Waits until a CSR matching `wanted` has been seen with a certificate; `None` after
    /// `timeout`.
    pub async fn wait_issued(&self, timeout: Duration, wanted: impl Fn(&Seen) -> bool) -> Option<Seen> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.all().into_iter().find(|s| wanted(s) && s.issued.is_some()) {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn observe(record: &Mutex<Vec<Seen>>, csr: &CertificateSigningRequest) {
    let now = Instant::now();
    let name = csr.metadata.name.clone().unwrap_or_default();
    let Ok(mut seen) = record.lock() else { return };
    let index = match seen.iter().position(|s| s.name == name) {
        Some(i) => i,
        None => {
            seen.push(Seen {
                name,
                signer: csr.spec.signer_name.clone(),
                username: csr.spec.username.clone().unwrap_or_default(),
                first_seen: now,
                approved: None,
                approved_reason: None,
                refused: None,
                issued: None,
            });
            seen.len() - 1
        }
    };
    let entry = &mut seen[index];
    let status = csr.status.clone().unwrap_or_default();
    for condition in status.conditions.unwrap_or_default() {
        match condition.type_.as_str() {
            "Approved" if entry.approved.is_none() => {
                entry.approved = Some(now);
                entry.approved_reason = condition.reason;
            }
            "Denied" | "Failed" if entry.refused.is_none() => {
                entry.refused = Some((
                    now,
                    format!("{} {}", condition.type_, condition.reason.unwrap_or_default()),
                ));
            }
            _ => {}
        }
    }
    if entry.issued.is_none()
        && let Some(certificate) = status.certificate.filter(|c| !c.0.is_empty())
    {
        entry.issued = Some((now, String::from_utf8_lossy(&certificate.0).into_owned()));
    }
}

impl Drop for CsrRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Unix time in seconds.
pub fn now() -> i64 {
    now_micros() / 1_000_000
}

/// Unix time in microseconds (a Lease's renewTime has this precision).
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// DER of the first certificate of a PEM text.
pub fn der(pem_text: &str) -> Vec<u8> {
    pem::parse_many(pem_text.as_bytes())
        .expect("PEM")
        .into_iter()
        .find(|b| b.tag() == "CERTIFICATE")
        .expect("a certificate")
        .contents()
        .to_vec()
}

/// NotBefore, NotAfter (Unix seconds) and subject of the first certificate of a PEM text.
pub fn validity(pem_text: &str) -> (i64, i64, String) {
    let der = der(pem_text);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
        cert.subject().to_string(),
    )
}

/// The Node `name`, if it is there.
pub async fn node(admin: &kube::Client, name: &str) -> Option<k8s_openapi::api::core::v1::Node> {
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// Whether the Node's Ready condition is True.
pub fn ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The renewTime of Node `name`'s Lease (Unix microseconds).
pub async fn lease_renewed(admin: &kube::Client, name: &str) -> Option<i64> {
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), "kube-node-lease")
        .get_opt(name)
        .await
        .ok()
        .flatten()?;
    lease.spec?.renew_time.map(|t| t.0.as_microsecond())
}

/// Waits until Node `name`'s Lease is renewed after `after` (Unix microseconds) and the Node
/// is Ready.
pub async fn wait_renewed_and_ready(admin: &kube::Client, name: &str, after: i64, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let renewed = lease_renewed(admin, name).await.is_some_and(|t| t > after);
        if renewed && node(admin, name).await.is_some_and(|n| ready(&n)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// A duration in seconds, for the suites' timing lines.
pub fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// Waits until the plugin's cert dir holds the certificate of `pem` as its current one.
pub async fn wait_current(cert_dir: &Path, pem: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let current = std::fs::read_to_string(cert_dir.join("kubelet-client-current.pem")).unwrap_or_default();
        if current.contains("CERTIFICATE") && der(&current) == der(pem) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Sleeps until `not_after` (Unix seconds) has passed, then waits until Node `name` renews its
/// Lease after it and is Ready: the node talks with a later certificate (the apiserver checks
/// a client certificate's validity on every request).
pub async fn ready_past(admin: &kube::Client, name: &str, not_after: i64, timeout: Duration) -> bool {
    let wait = not_after + 1 - now();
    if wait > 0 {
        tokio::time::sleep(Duration::from_secs(u64::try_from(wait).unwrap_or(0))).await;
    }
    wait_renewed_and_ready(admin, name, not_after * 1_000_000, timeout).await
}
