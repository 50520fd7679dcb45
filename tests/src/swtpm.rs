//! A software TPM 2.0 for the suites: Debian's swtpm, provisioned by `swtpm_setup` with an EK
//! certificate from `swtpm_localca`, driven with tpm2-tools over the swtpm TCTI. Without the
//! programs, [`Swtpm::start`] panics saying what to install: the suites that call it are
//! `#[ignore = "needs swtpm"]`, and `scripts/test` runs them only where swtpm is installed
//! (elsewhere nextest counts them as skipped).

use crate::envtest::free_port;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running swtpm, stopped on drop.
pub struct Swtpm {
    child: Child,
    dir: tempfile::TempDir,
    /// `swtpm:host=127.0.0.1,port=N`
    pub tcti: String,
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The programs a [`Swtpm`] needs that are not on `PATH`.
pub fn missing_programs() -> Vec<&'static str> {
    ["swtpm", "swtpm_setup", "tpm2_createek", "tpm2_activatecredential"]
        .into_iter()
        .filter(|p| !have(p))
        .collect()
}

impl Swtpm {
    /// Provisions and starts a fresh TPM. Panics, saying what to install, without swtpm or
    /// tpm2-tools: a suite run without the real parts fails, it does not pass.
    pub fn start(suite: &str) -> Self {
        let missing = missing_programs();
        assert!(
            missing.is_empty(),
            "{suite} needs a software TPM: {} not installed; install Debian swtpm swtpm-tools tpm2-tools (scripts/deps does, as root), or run scripts/test, which skips this test without them",
            missing.join(", ")
        );
        Self::provision()
    }

    /// Like [`Swtpm::start`], for benchmarks: `None`, with a SKIPPED line, without swtpm or
    /// tpm2-tools.
    pub fn start_if_installed(suite: &str) -> Option<Self> {
        let missing = missing_programs();
        if missing.is_empty() {
            Some(Self::provision())
        } else {
            eprintln!(
                "SKIPPED {suite}: {} not installed (Debian: swtpm swtpm-tools tpm2-tools)",
                missing.join(", ")
            );
            None
        }
    }

    fn provision() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("state dir");
        let setup = Command::new("swtpm_setup")
            .args([
                "--tpm2",
                "--create-ek-cert",
                "--create-platform-cert",
                "--lock-nvram",
                "--overwrite",
            ])
            .arg("--tpmstate")
            .arg(&state)
            .output()
            .expect("swtpm_setup");
        assert!(
            setup.status.success(),
            "swtpm_setup: {}{}",
            String::from_utf8_lossy(&setup.stdout),
            String::from_utf8_lossy(&setup.stderr)
        );
        // The swtpm TCTI finds the control channel at port + 1.
        let (port, ctrl) = loop {
            let port = free_port();
            if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
                break (port, port + 1);
            }
        };
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--flags", "not-need-init,startup-clear"])
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .args(["--server", &format!("type=tcp,port={port},bindaddr=127.0.0.1")])
            .args(["--ctrl", &format!("type=tcp,port={ctrl},bindaddr=127.0.0.1")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start swtpm");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "swtpm did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            dir,
            tcti: format!("swtpm:host=127.0.0.1,port={port}"),
        }
    }

    /// The folder tools run in (relative file names land here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path in [`Swtpm::dir`].
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs a tpm2-tools command against this TPM.
    pub fn tool(&self, args: &[&str]) -> Output {
        Command::new(args[0])
            .args(&args[1..])
            .env("TPM2TOOLS_TCTI", &self.tcti)
            .current_dir(self.dir.path())
            .output()
            .expect("run a tpm2-tools command")
    }

    /// Like [`Swtpm::tool`], panicking with the tool's error when it fails.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.tool(args);
        assert!(
            out.status.success(),
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// The folder where `swtpm_localca` keeps its CA (from `/etc/swtpm-localca.conf`).
pub fn localca_dir() -> PathBuf {
    std::fs::read_to_string("/etc/swtpm-localca.conf")
        .ok()
        .and_then(|conf| {
            conf.lines()
                .find_map(|l| l.strip_prefix("statedir = ").map(|d| d.trim().to_owned()))
        })
        .unwrap_or_else(|| "/var/lib/swtpm-localca".to_owned())
        .into()
}

/// `swtpm_localca`'s root and issuing certificates (PEM), as an EK CA bundle: the TPM's NV
/// holds only the EK certificate, so the issuer is trusted directly.
pub fn localca_bundle() -> Vec<u8> {
    let dir = localca_dir();
    let mut bundle = std::fs::read(dir.join("swtpm-localca-rootca-cert.pem")).expect("localca root");
    bundle.extend(std::fs::read(dir.join("issuercert.pem")).expect("localca issuer"));
    bundle
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
