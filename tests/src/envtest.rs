//! A real kube-apiserver and etcd for the cluster suites, found through `KUBEBUILDER_ASSETS`
//! (the controller-runtime envtest convention: a folder holding `kube-apiserver`, `etcd`,
//! `kubectl`). Without the variable, [`Envtest::start`] panics saying so: the suites that call it
//! are `#[ignore = "needs KUBEBUILDER_ASSETS: …"]`, and `scripts/test` runs them only where the
//! variable is set (elsewhere nextest counts them as skipped).
//!
//! The apiserver trusts one CA for client certificates: [`Envtest::client_ca`], an RSA PKCS#1
//! key as Cluster API writes `<cluster>-ca` (a harness may choose another, [`use_client_ca`]),
//! so certificates the signer issues with it authenticate for real, through the Node authorizer
//! and RBAC.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::ca::{CaKeyFormat, TestCa, issuer, openssl_ca};

/// The client CA's key format of every apiserver this process starts from now on, when a
/// harness chose one ([`use_client_ca`]); otherwise RSA PKCS#1, as Cluster API writes it.
static CLIENT_CA_FORMAT: OnceLock<CaKeyFormat> = OnceLock::new();

/// Makes every apiserver this process starts trust (and every `<cluster>-ca` it registers hold) a
/// CA of `format`: `signer-load --ca-key` measures a join under an ECDSA cluster CA with it. Set
/// once, before the first apiserver; the suites keep Cluster API's RSA default.
pub fn use_client_ca(format: CaKeyFormat) {
    CLIENT_CA_FORMAT
        .set(format)
        .expect("the client CA's format is chosen once, before any apiserver starts");
}

/// A running etcd + kube-apiserver pair on loopback, stopped on drop.
pub struct Envtest {
    assets: PathBuf,
    // Before `dir`: an own etcd stops before its data folder is removed.
    etcd: Arc<Etcd>,
    dir: tempfile::TempDir,
    apiserver: Option<Child>,
    apiserver_args: Vec<String>,
    /// `https://127.0.0.1:<port>`
    pub server: String,
    /// The CA of client certificates (and of the serving certificate).
    pub client_ca: TestCa,
    /// An admin (system:masters) kubeconfig.
    pub admin_kubeconfig: PathBuf,
}

/// The folder of envtest binaries. Panics, saying what to do, when `KUBEBUILDER_ASSETS` is unset
/// or holds no `kube-apiserver`: a suite run without the real parts fails, it does not pass.
pub fn assets(suite: &str) -> PathBuf {
    match std::env::var_os("KUBEBUILDER_ASSETS") {
        Some(dir) if Path::new(&dir).join("kube-apiserver").exists() => PathBuf::from(dir),
        Some(dir) => panic!(
            "{suite}: KUBEBUILDER_ASSETS={} holds no kube-apiserver; point it at a folder holding kube-apiserver, etcd and kubectl",
            Path::new(&dir).display()
        ),
        None => panic!(
            "{suite} needs a real kube-apiserver and etcd: set KUBEBUILDER_ASSETS to a folder holding kube-apiserver, etcd and kubectl, or run scripts/test, which skips this test without it"
        ),
    }
}

/// The Kubernetes minor of `KUBEBUILDER_ASSETS`' kube-apiserver (`kube-apiserver --version`:
/// `Kubernetes v1.32.0-beta.0`), read once: suites whose expectations depend on the minor
/// (KEP-4601 selectors, credential IDs, kubeadm's configuration version) ask it.
pub fn kubernetes_minor() -> u32 {
    static MINOR: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MINOR.get_or_init(|| {
        let apiserver = assets("kubernetes_minor").join("kube-apiserver");
        let out = Command::new(&apiserver)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", apiserver.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .find_map(minor_of)
            .unwrap_or_else(|| panic!("{} --version: {text:?} names no v1.<minor>", apiserver.display()))
    })
}

/// The minor of a `v1.<minor>.<patch>` version (`v1.32.0-beta.0`: 32).
pub fn minor_of(version: &str) -> Option<u32> {
    version.strip_prefix("v1.")?.split('.').next()?.parse().ok()
}

/// A loopback port nobody listens on now, and that no other call in this process got.
///
/// Chosen at random below the kernel's ephemeral range (`ip_local_port_range`), checked by
/// binding it: a port from `bind(:0)` comes from that range, where every outgoing connection
/// (kubectl's, the apiservers' to etcd) also takes its local port, so between this probe and the
/// server's own bind another socket could take it, which is how a suite lost a start to
/// "address already in use". Outside the range only another listener can, and the starts below
/// retry then.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    let (low, high) = ports_below_ephemeral_range();
    for _ in 0..1000 {
        let [a, b, ..] = rand_bytes();
        let port = low + u16::from_le_bytes([a, b]) % (high - low);
        let mut taken = handed_out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if taken.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        taken.insert(port);
        return port;
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `[low, high)`: the ports from 15,000 up to the start of the kernel's ephemeral range (32,768
/// by default), or 15,000..30,000 where the range cannot be read or starts lower.
fn ports_below_ephemeral_range() -> (u16, u16) {
    const LOW: u16 = 15_000;
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok());
    match start {
        Some(start) if start > LOW + 1_000 => (LOW, start),
        _ => (LOW, 30_000),
    }
}

/// Why an apiserver did not become ready.
enum Unready {
    TimedOut(Duration),
    Exited,
    LostItsPort,
}

/// How many times a server that lost its port to another process is started again on a new one.
const BIND_ATTEMPTS: usize = 5;

/// Whether a server's error log says another socket took its port first.
fn lost_its_port(err_log: &Path) -> bool {
    std::fs::read_to_string(err_log).is_ok_and(|e| e.contains("address already in use"))
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(std::fs::File::create(dir.join(name)).expect("log file"))
}

impl Envtest {
    /// Starts etcd and kube-apiserver (Node,RBAC authorization, bootstrap tokens enabled) and
    /// waits until the apiserver is ready. Panics without `KUBEBUILDER_ASSETS` (see [`assets`]).
    pub fn start(suite: &str) -> Self {
        let assets = assets(suite);
        let dir = tempfile::tempdir().expect("temporary directory");
        let etcd = Arc::new(Etcd::spawn(&assets, dir.path(), None, &[]));
        Self::start_apiserver_on(assets, dir, etcd, &[])
    }

    /// [`Envtest::start`] with more kube-apiserver flags (an audit log, say).
    pub fn start_with(suite: &str, apiserver_flags: &[String]) -> Self {
        Self::start_tuned(suite, &[], apiserver_flags)
    }

    /// [`Envtest::start_with`] with more etcd flags too (a larger `--quota-backend-bytes` for a
    /// fleet of 100,000 objects, say).
    pub fn start_tuned(suite: &str, etcd_flags: &[String], apiserver_flags: &[String]) -> Self {
        let assets = assets(suite);
        let dir = tempfile::tempdir().expect("temporary directory");
        let etcd = Arc::new(Etcd::spawn(&assets, dir.path(), None, etcd_flags));
        Self::start_apiserver_on(assets, dir, etcd, apiserver_flags)
    }

    /// Starts a kube-apiserver like [`Envtest::start`] on `etcd`, shared with other
    /// apiservers, under its own `--etcd-prefix`: many clusters for the price of one etcd.
    pub fn start_on(suite: &str, etcd: &SharedEtcd) -> Self {
        let assets = assets(suite);
        let dir = tempfile::tempdir().expect("temporary directory");
        let prefix = format!("--etcd-prefix=/registry-{:032x}", u128::from_le_bytes(rand_bytes()));
        Self::start_apiserver_on(assets, dir, Arc::clone(&etcd.0), &[prefix])
    }

    fn start_apiserver_on(assets: PathBuf, dir: tempfile::TempDir, etcd: Arc<Etcd>, extra: &[String]) -> Self {
        let d = dir.path().to_owned();
        let d = d.as_path();
        let client_ca = openssl_ca(*CLIENT_CA_FORMAT.get_or_init(|| CaKeyFormat::RsaPkcs1), 3650);
        let token = format!("{:032x}", u128::from_le_bytes(rand_bytes()));
        let (serving_cert, serving_key) = serving_certificate(&client_ca);
        std::fs::write(d.join("apiserver.crt"), serving_cert).expect("write");
        std::fs::write(d.join("apiserver.key"), serving_key).expect("write");
        let sa = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        std::fs::write(d.join("sa.key"), sa.serialize_pem()).expect("write");
        std::fs::write(d.join("sa.pub"), sa.public_key_pem()).expect("write");
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},admin,admin-uid,system:masters\n"),
        )
        .expect("write");
        let api_port = free_port();
        let apiserver_args: Vec<String> = [
            &format!("--etcd-servers={}", etcd.url),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            &format!("--secure-port={api_port}"),
            &format!("--cert-dir={}", d.join("certdir").display()),
            &format!("--tls-cert-file={}", d.join("apiserver.crt").display()),
            &format!("--tls-private-key-file={}", d.join("apiserver.key").display()),
            &format!("--client-ca-file={}", client_ca.cert_path.display()),
            "--service-account-issuer=https://kubernetes.default.svc",
            &format!("--service-account-key-file={}", d.join("sa.pub").display()),
            &format!("--service-account-signing-key-file={}", d.join("sa.key").display()),
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            &format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--enable-bootstrap-token-auth",
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount",
        ]
        .iter()
        .map(ToString::to_string)
        .chain(extra.iter().cloned())
        .collect();
        let admin_kubeconfig = d.join("admin.kubeconfig");
        let mut env = Self {
            assets,
            dir,
            etcd,
            apiserver: None,
            apiserver_args,
            server: String::new(),
            client_ca,
            admin_kubeconfig,
        };
        for attempt in 1..=BIND_ATTEMPTS {
            if attempt > 1 {
                // Another process took the port between the probe and the bind: another one.
                env.listen_on(free_port());
            }
            env.server = format!("https://127.0.0.1:{}", env.secure_port());
            std::fs::write(
                &env.admin_kubeconfig,
                kubeconfig(&env.server, &env.client_ca.cert_pem, &format!("token: {token}")),
            )
            .expect("write");
            env.apiserver = Some(spawn_apiserver(&env.assets, env.dir.path(), &env.apiserver_args));
            match env.await_ready(Duration::from_secs(90)) {
                Ok(()) => return env,
                Err(Unready::LostItsPort) if attempt < BIND_ATTEMPTS => env.stop_apiserver(),
                Err(unready) => env.give_up(unready),
            }
        }
        unreachable!("the last attempt returns or gives up")
    }

    /// The `--secure-port` it was started with.
    fn secure_port(&self) -> u16 {
        self.apiserver_args
            .iter()
            .find_map(|a| a.strip_prefix("--secure-port=")?.parse().ok())
            .expect("--secure-port is among the flags")
    }

    fn listen_on(&mut self, port: u16) {
        for arg in &mut self.apiserver_args {
            if arg.starts_with("--secure-port=") {
                *arg = format!("--secure-port={port}");
            }
        }
    }

    /// Stops kube-apiserver (etcd keeps the data): the cluster is down until
    /// [`Envtest::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts kube-apiserver again on the same port and data, and waits until it is ready.
    pub fn start_apiserver(&mut self) {
        if self.apiserver.is_none() {
            self.apiserver = Some(spawn_apiserver(&self.assets, self.dir.path(), &self.apiserver_args));
            self.wait_ready(Duration::from_secs(90));
        }
    }

    /// A client certificate for `common_name` in `organizations`, signed by the client CA:
    /// `(certificate PEM, key PEM)`.
    pub fn client_certificate(&self, common_name: &str, organizations: &[&str]) -> (String, String) {
        let issuer = issuer(&self.client_ca);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        for o in organizations {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *o);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).expect("client certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// The admin kubeconfig with its token replaced by a bootstrap token `<id>.<secret>`.
    pub fn bootstrap_kubeconfig(&self, token: &str) -> PathBuf {
        let admin = std::fs::read_to_string(&self.admin_kubeconfig).expect("admin kubeconfig");
        let path = self.dir.path().join(format!("bootstrap-{token}.kubeconfig"));
        let text: String = admin
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("token:") {
                    format!("    token: {token}")
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, text + "\n").expect("write kubeconfig");
        path
    }

    /// The URL of its etcd (plain HTTP on loopback): an external etcd for kubeadm.
    pub fn etcd_url(&self) -> &str {
        &self.etcd.url
    }

    /// The process ids of etcd and (while it runs) kube-apiserver.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.etcd.child.id())
            .chain(self.apiserver.as_ref().map(Child::id))
            .collect()
    }

    /// The process id of kube-apiserver, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// The process id of etcd.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd.child.id()
    }

    /// The folder holding logs and kubeconfigs (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn wait_ready(&mut self, timeout: Duration) {
        if let Err(unready) = self.await_ready(timeout) {
            self.give_up(unready);
        }
    }

    /// Waits until `/readyz` says ok, the apiserver exits, or `timeout` passes.
    fn await_ready(&mut self, timeout: Duration) -> Result<(), Unready> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            if out.status.success() && out.stdout.starts_with(b"ok") {
                return Ok(());
            }
            let exited = self
                .apiserver
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited && lost_its_port(&self.dir.path().join("apiserver.err")) {
                return Err(Unready::LostItsPort);
            }
            if exited {
                return Err(Unready::Exited);
            }
            if Instant::now() > deadline {
                return Err(Unready::TimedOut(timeout));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn give_up(&self, unready: Unready) -> ! {
        let err = std::fs::read_to_string(self.dir.path().join("apiserver.err")).unwrap_or_default();
        let tail: String = err
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        let why = match unready {
            Unready::TimedOut(timeout) => format!("not ready after {timeout:?}"),
            Unready::Exited => "exited before it was ready".to_owned(),
            Unready::LostItsPort => format!("lost its port to another process {BIND_ATTEMPTS} times"),
        };
        panic!("kube-apiserver {why}:\n{tail}");
    }

    /// Runs kubectl as admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.admin_kubeconfig, args, None)
    }

    /// Runs kubectl with another kubeconfig, optionally feeding `stdin`.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(self.assets.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// `kubectl apply --server-side` of `objects` (JSON) as admin; panics with kubectl's error.
    /// Server-owned metadata (uid, resourceVersion) is dropped first.
    pub fn apply(&self, objects: &[serde_json::Value]) {
        let items: Vec<serde_json::Value> = objects
            .iter()
            .cloned()
            .map(|mut object| {
                if let Some(meta) = object.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
                    for owned in ["uid", "resourceVersion", "creationTimestamp"] {
                        meta.remove(owned);
                    }
                }
                object
            })
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let out = self.kubectl_as(
            &self.admin_kubeconfig,
            &["apply", "--server-side", "-f", "-"],
            Some(&list.to_string()),
        );
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Installs the Cluster API CRDs of `testdata/crds` and waits until they are served.
    pub fn install_capi_crds(&self) {
        let crds = crate::repo_root().join("testdata/crds");
        let out = self.kubectl(&["apply", "--server-side", "-f", crds.to_str().expect("UTF-8 path")]);
        assert!(
            out.status.success(),
            "install CRDs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = self.kubectl(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
        assert!(
            out.status.success(),
            "CRDs not established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A kubeconfig authenticating with a bearer token (a ServiceAccount's, say).
    pub fn kubeconfig_for_token(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig(&self.server, &self.client_ca.cert_pem, &format!("token: {token}")),
        )
        .expect("write kubeconfig");
        path
    }

    /// A kubeconfig authenticating with a client certificate and key (PEM).
    pub fn kubeconfig_for_certificate(&self, name: &str, cert_pem: &str, key_pem: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        let user = format!(
            "client-certificate-data: {}\n    client-key-data: {}",
            base64(cert_pem.as_bytes()),
            base64(key_pem.as_bytes())
        );
        std::fs::write(&path, kubeconfig(&self.server, &self.client_ca.cert_pem, &user)).expect("write kubeconfig");
        path
    }
}

impl Drop for Envtest {
    fn drop(&mut self) {
        // etcd stops with its last apiserver (`Etcd`'s drop).
        self.stop_apiserver();
    }
}

/// One etcd several [`Envtest`]s keep data in ([`Envtest::start_on`]), each under its own
/// prefix; it stops when the last of them and this handle are dropped.
pub struct SharedEtcd(Arc<Etcd>);

impl SharedEtcd {
    /// Starts etcd in a folder of its own. Panics without `KUBEBUILDER_ASSETS`.
    pub fn start(suite: &str) -> Self {
        let assets = assets(suite);
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().to_owned();
        Self(Arc::new(Etcd::spawn(&assets, &path, Some(dir), &[])))
    }

    /// The process id of etcd.
    pub fn pid(&self) -> u32 {
        self.0.child.id()
    }
}

struct Etcd {
    child: Child,
    url: String,
    /// Its own folder when shared; otherwise the data lives in the one [`Envtest`]'s.
    _dir: Option<tempfile::TempDir>,
}

impl Etcd {
    /// Starts etcd and waits until it serves its client port (so a lost bind race is
    /// seen here, and retried on other ports, rather than as an apiserver that never gets ready).
    fn spawn(assets: &Path, d: &Path, own_dir: Option<tempfile::TempDir>, extra: &[String]) -> Self {
        for _ in 0..BIND_ATTEMPTS {
            let (etcd_port, peer_port) = (free_port(), free_port());
            let mut child = Command::new(etcd_binary(assets))
                .args([
                    "--name=default",
                    &format!("--data-dir={}", d.join("etcd").display()),
                    &format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                    &format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                    &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                    &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                    &format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                    "--unsafe-no-fsync",
                ])
                .args(extra)
                .stdout(log_file(d, "etcd.log"))
                .stderr(log_file(d, "etcd.err"))
                .spawn()
                .expect("start etcd");
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                // Its own log, not a connection (which another process on the port would take):
                // etcd 3.4 says "serving insecure client requests on 127.0.0.1:<port>", 3.5
                // "serving client traffic insecurely" with the address.
                let serving = std::fs::read_to_string(d.join("etcd.err")).is_ok_and(|log| {
                    let address = format!("127.0.0.1:{etcd_port}");
                    log.lines().any(|l| l.contains("serving") && l.contains(&address))
                });
                if serving {
                    return Self {
                        child,
                        url: format!("http://127.0.0.1:{etcd_port}"),
                        _dir: own_dir,
                    };
                }
                if child.try_wait().ok().flatten().is_some() {
                    if lost_its_port(&d.join("etcd.err")) {
                        let _ = std::fs::remove_dir_all(d.join("etcd"));
                        break;
                    }
                    panic!(
                        "etcd exited: {}",
                        std::fs::read_to_string(d.join("etcd.err")).unwrap_or_default()
                    );
                }
                assert!(Instant::now() < deadline, "etcd did not serve within 60s");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("etcd lost its ports to other processes {BIND_ATTEMPTS} times")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_apiserver(assets: &Path, dir: &Path, args: &[String]) -> Child {
    Command::new(assets.join("kube-apiserver"))
        .args(args)
        .stdout(log_file(dir, "apiserver.log"))
        .stderr(log_file(dir, "apiserver.err"))
        .spawn()
        .expect("start kube-apiserver")
}

fn etcd_binary(assets: &Path) -> PathBuf {
    let bundled = assets.join("etcd");
    if bundled.exists() {
        bundled
    } else {
        PathBuf::from("etcd")
    }
}

fn kubeconfig(server: &str, ca_pem: &[u8], user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: user\n  user:\n    {user}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: user\ncurrent-context: envtest\n",
        base64(ca_pem)
    )
}

fn serving_certificate(ca: &TestCa) -> (String, String) {
    let issuer = issuer(ca);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "kubernetes".to_owned()]).expect("params");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("IP")));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).expect("serving certificate");
    (cert.pem(), key.serialize_pem())
}

fn rand_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("/dev/urandom");
    bytes
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
