//! A software TPM 2.0 for the suites: Debian's swtpm, provisioned by `swtpm_setup` with an EK
//! certificate from `swtpm_localca`, driven with tpm2-tools over the swtpm TCTI. Without the
//! programs, [`Swtpm::start`] panics saying what to install: the suites that call it are
//! `#[ignore = "needs swtpm"]`, and `scripts/test` runs them only where swtpm is installed
//! (elsewhere nextest counts them as skipped).
//!
//! [`Swtpm::measure_boot`] plays the firmware: it extends the PCRs from a real TCG event log, and
//! [`Swtpm::reboot`] resets them, keeping the EK.

use crate::envtest::free_port;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running swtpm, stopped on drop.
pub struct Swtpm {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
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
        Self::provision(&[])
    }

    /// Like [`Swtpm::start`], with only these PCR banks allocated (`swtpm_setup --pcr-banks`,
    /// e.g. `["sha1"]` for a TPM whose firmware allocates SHA-1 only).
    pub fn start_with_banks(suite: &str, banks: &[&str]) -> Self {
        let missing = missing_programs();
        assert!(
            missing.is_empty(),
            "{suite} needs a software TPM: {} not installed; install Debian swtpm swtpm-tools tpm2-tools (scripts/deps does, as root), or run scripts/test, which skips this test without them",
            missing.join(", ")
        );
        Self::provision(banks)
    }

    /// Like [`Swtpm::start`], for benchmarks: `None`, with a SKIPPED line, without swtpm or
    /// tpm2-tools.
    pub fn start_if_installed(suite: &str) -> Option<Self> {
        let missing = missing_programs();
        if missing.is_empty() {
            Some(Self::provision(&[]))
        } else {
            eprintln!(
                "SKIPPED {suite}: {} not installed (Debian: swtpm swtpm-tools tpm2-tools)",
                missing.join(", ")
            );
            None
        }
    }

    fn provision(banks: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("state dir");
        let mut setup = Command::new("swtpm_setup");
        setup.args([
            "--tpm2",
            "--create-ek-cert",
            "--create-platform-cert",
            "--lock-nvram",
            "--overwrite",
        ]);
        if !banks.is_empty() {
            setup.args(["--pcr-banks", &banks.join(",")]);
        }
        let setup = setup.arg("--tpmstate").arg(&state).output().expect("swtpm_setup");
        assert!(
            setup.status.success(),
            "swtpm_setup: {}{}",
            String::from_utf8_lossy(&setup.stdout),
            String::from_utf8_lossy(&setup.stderr)
        );
        // The swtpm TCTI finds the control channel at port + 1.
        let port = loop {
            let port = free_port();
            if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
                break port;
            }
        };
        let child = Self::spawn(&state, port);
        Self {
            child,
            dir,
            port,
            tcti: format!("swtpm:host=127.0.0.1,port={port}"),
        }
    }

    /// swtpm on `state`, listening on `port` (and its control channel on `port + 1`) once this
    /// returns.
    fn spawn(state: &Path, port: u16) -> Child {
        let ctrl = port + 1;
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
        child
    }

    /// A reboot: swtpm stopped and started again on the same state and port. The EK (its seed
    /// and its NV certificate) stays; the PCRs are reset (TPM2_Startup(CLEAR)). The OS's
    /// TPM2_Shutdown(CLEAR) comes first, as on a real reboot: without it each restart counts as
    /// a failed authorization, and a few put the TPM in dictionary-attack lockout.
    pub fn reboot(&mut self) {
        self.ok(&["tpm2_shutdown", "--clear"]);
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The old listener's port may linger a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "port {} stayed busy", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Self::spawn(&self.dir.path().join("state"), self.port);
    }

    /// The PCR banks with PCRs allocated (`tpm2_getcap pcrs`), e.g. `["sha256"]`.
    pub fn allocated_banks(&self) -> Vec<String> {
        let out = self.ok(&["tpm2_getcap", "pcrs"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (bank, pcrs) = line.trim().strip_prefix("- ")?.split_once(':')?;
                let pcrs = pcrs.trim().trim_start_matches('[').trim_end_matches(']');
                (!pcrs.trim().is_empty()).then(|| bank.trim().to_owned())
            })
            .collect()
    }

    /// PCR `index` of `bank` (`tpm2_pcrread`).
    pub fn pcr(&self, bank: &str, index: u32) -> Vec<u8> {
        let out = self.ok(&["tpm2_pcrread", &format!("{bank}:{index}")]);
        let text = String::from_utf8_lossy(&out.stdout);
        let value = text
            .lines()
            .find_map(|l| l.split_once(": 0x").map(|(_, v)| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("tpm2_pcrread {bank}:{index}: {text}"));
        (0..value.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&value[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Extends PCRs as `tpm2_pcrextend` does, in order.
    pub fn extend(&self, items: &[Extend<'_>]) {
        for chunk in items.chunks(32) {
            let mut args = vec!["tpm2_pcrextend".to_owned()];
            for (pcr, digests) in chunk {
                let banks: Vec<String> = digests
                    .iter()
                    .map(|(bank, digest)| format!("{bank}={}", hex(digest)))
                    .collect();
                args.push(format!("{pcr}:{}", banks.join(",")));
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.ok(&args);
        }
    }

    /// Plays the firmware and boot loaders of `log`: every event but `EV_NO_ACTION` extended into
    /// its PCR, in every bank both the log and this TPM have. swtpm starts at locality 0 with
    /// zero PCRs, so a log with a `StartupLocality` event (PCR 0 starting at 3 or 4) could not
    /// be reproduced: such a log is refused. Returns the banks extended.
    pub fn measure_boot(&self, log: &attestation::tpm::event_log::EventLog) -> Vec<String> {
        const EV_NO_ACTION: u32 = 0x3;
        assert_eq!(
            log.startup_locality, None,
            "a log with a StartupLocality event cannot be played on swtpm (PCR 0 starts at zero here)"
        );
        let allocated = self.allocated_banks();
        let banks: Vec<attestation::tpm::event_log::HashAlg> = log
            .banks()
            .into_iter()
            .filter(|b| allocated.iter().any(|a| a == b.name()))
            .collect();
        assert!(
            !banks.is_empty(),
            "the log's banks and swtpm's ({allocated:?}) share none"
        );
        let items: Vec<Extend<'_>> = log
            .events
            .iter()
            .filter(|e| e.event_type != EV_NO_ACTION)
            .map(|e| {
                let digests = banks
                    .iter()
                    .filter_map(|b| Some((b.name(), e.digest(*b)?.to_vec())))
                    .collect();
                (e.pcr, digests)
            })
            .filter(|(_, digests): &(u32, Vec<_>)| !digests.is_empty())
            .collect();
        self.extend(&items);
        banks.iter().map(|b| b.name().to_owned()).collect()
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

/// One PCR extend: the PCR and its digest in each bank named (`sha256`, ...).
pub type Extend<'a> = (u32, Vec<(&'a str, Vec<u8>)>);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
