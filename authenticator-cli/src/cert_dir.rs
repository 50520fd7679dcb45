//! The certificate directory, kept as kubelet keeps it: `kubelet-client-<timestamp>.pem` files
//! holding certificate and key, and `kubelet-client-current.pem` pointing at the newest.
//!
//! A cached credential is only trusted when it parses, its key matches its certificate, it is
//! for this node (CN `system:node:<name>`, O `system:nodes`, the provider-ID extension when one
//! is asked for) and it is still valid; anything else is reported and replaced.
//!
//! A certificate for this node that the plugin did not obtain is told apart
//! ([`Cached::Foreign`]): kubelet's own certificate manager, when its rotation is on, writes
//! kube-controller-manager's certificates into the same `kubelet-client-current.pem`. The
//! plugin knows its own by [`OBTAINED`], the SHA-256 of every certificate it stored, written
//! before the link is swapped so the file never points at an unrecorded certificate of ours.
//!
//! Upgrade: a cert dir written by a version before that record has none. Then a certificate
//! carrying this node's provider-ID extension counts as obtained (only this plugin's signers put
//! that extension in a kubelet certificate; kube-controller-manager copies no extensions), and
//! one without it does not. The first certificate stored creates the record. A record that is
//! unreadable or corrupt counts as absent: it is a diagnosis, not a trust boundary (whoever can
//! write it can write the certificate too), and answering the upgrade rule is the safe default.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use attestation::identity::{NodeName, ProviderId};
use time::{Duration, OffsetDateTime};
use zeroize::Zeroizing;

use crate::backoff::Backoff;
use crate::secret_file::write_private;

/// The file kubelet and this plugin read.
pub const CURRENT: &str = "kubelet-client-current.pem";
/// The last failure, for `status` (no secrets in it).
pub const LAST_ERROR: &str = "kubelet-authenticator-last-error";
/// The last denial, kept after a certificate is issued (the backoff record is not): `status`
/// names it, and the `explain` command that tells why.
pub const LAST_DENIAL: &str = "kubelet-authenticator-last-denial";
/// The lock serialising concurrent invocations.
pub const LOCK: &str = "kubelet-authenticator.lock";
/// The SHA-256 of the certificates this plugin stored (no secrets in it).
pub const OBTAINED: &str = "kubelet-authenticator-obtained";
/// How many stored certificates [`OBTAINED`] remembers (the current one, and a few before it
/// for a crash between the record and the link).
const OBTAINED_KEPT: usize = 8;

/// A certificate and key from the cert dir, checked.
#[derive(Clone)]
pub struct Credential {
    /// Certificate PEM.
    pub cert_pem: String,
    /// Key PEM.
    pub key_pem: Zeroizing<String>,
    /// Subject CN.
    pub subject: String,
    /// The provider ID in the certificate, if any.
    pub provider_id: Option<String>,
    /// SHA-256 of the certificate (DER), lowercase hex.
    pub sha256: String,
    /// Validity.
    pub not_before: OffsetDateTime,
    /// Validity.
    pub not_after: OffsetDateTime,
    /// When to renew: a jittered 50-55% of the usable lifetime ([`rotation_point`]).
    pub rotate_at: OffsetDateTime,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// What the cache holds.
#[derive(Debug)]
pub enum Cached {
    /// Nothing yet.
    Missing,
    /// A usable credential (possibly past its rotation point).
    Usable(Credential),
    /// A valid certificate for this node, with its key, that this plugin did not obtain.
    Foreign(Credential, NotObtained),
    /// A file that must not be used; why.
    Unusable(String),
}

/// How the plugin knows a certificate is not one it obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotObtained {
    /// It carries no provider-ID extension (this plugin's signers always copy it).
    NoProviderId,
    /// [`OBTAINED`] does not list it.
    NotRecorded,
    /// Taken over from the kubeconfig kubeadm (or kubelet's own bootstrap) wrote
    /// (`kubeconfig --adopt`): the signer adopts the node at its first request (rule 7).
    Adopted,
}

impl NotObtained {
    /// What a person should read, and do.
    pub fn explain(self) -> String {
        if self == Self::Adopted {
            return "taken over from kubelet's previous kubeconfig (kubeadm's certificate, or one issued before the Cluster opted in): the signer adopts the node at its first request, made with it".to_owned();
        }
        let how = match self {
            Self::Adopted => "",
            Self::NoProviderId => "it carries no provider-ID extension",
            Self::NotRecorded => "it is not among the certificates kubelet-authenticator stored",
        };
        format!(
            "not obtained by kubelet-authenticator ({how}): kubelet's own rotation (rotateCertificates / --rotate-certificates) probably wrote it; run kubelet with --rotate-certificates=false"
        )
    }
}

/// The share of a certificate's usable life after which the plugin starts renewing it: from half
/// (SPEC section 6, outage tolerance) to 55%, jittered per certificate. Whatever the point, at
/// least 45% of the usable life is left when renewal starts, and the plugin keeps answering the
/// valid certificate while renewals fail: that 45% is how long the signer or the management
/// cluster may be away (75.6 h at the default 168 h) before the first node loses its identity.
pub const ROTATION_FROM: f64 = 0.50;
/// See [`ROTATION_FROM`].
pub const ROTATION_TO: f64 = 0.55;

/// How much of a certificate's `notBefore` is backdating rather than life: Kubernetes' signers
/// (kube-controller-manager's and ours) set `notBefore` 5 minutes before issuance so that a node
/// whose clock is behind accepts it. Counting those minutes as life would put a short
/// certificate's renewal before its issuance (half of a 3-minute certificate backdated 5 minutes
/// falls a minute before it was issued) and the plugin would renew in a loop.
const BACKDATING: Duration = Duration::minutes(5);

/// The rotation point: past the backdating, a fraction between [`ROTATION_FROM`] and
/// [`ROTATION_TO`] of the life after it, derived from the certificate itself so every invocation
/// agrees on it (a fresh random draw per call would make some call always see "rotate now").
/// For a lifetime under 7.5 minutes (no signer's here), two thirds of it count as backdating.
pub fn rotation_point(cert_der: &[u8], not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert_der);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    let unit = (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64;
    let fraction = ROTATION_FROM + (ROTATION_TO - ROTATION_FROM) * unit;
    let lifetime = not_after - not_before;
    let backdating = BACKDATING.min(lifetime * 2 / 3);
    let life = lifetime - backdating;
    not_before + backdating + Duration::seconds_f64(life.as_seconds_f64() * fraction)
}

/// Parses and checks a `cert + key` PEM file's contents for `node` and `provider_id` (the
/// certificate must carry it when one is given).
pub fn check(
    contents: &str,
    node: &NodeName,
    provider_id: Option<&ProviderId>,
    now: OffsetDateTime,
) -> Result<Credential, String> {
    let credential = check_node(contents, node, now)?;
    if let Some(wanted) = provider_id
        && credential.provider_id.as_deref() != Some(wanted.as_str())
    {
        return Err(format!(
            "certificate provider ID {:?} is not {:?}",
            credential.provider_id,
            wanted.as_str()
        ));
    }
    Ok(credential)
}

/// Parses and checks a `cert + key` PEM file's contents for `node`: one certificate and its
/// key, CN `system:node:<name>`, O `system:nodes`, not expired. The provider ID is read, not
/// checked.
fn check_node(contents: &str, node: &NodeName, now: OffsetDateTime) -> Result<Credential, String> {
    let mut cert_pem = None;
    let mut key_pem = None;
    for block in pem::parse_many(contents.as_bytes()).map_err(|e| format!("not PEM: {e}"))? {
        match block.tag() {
            "CERTIFICATE" if cert_pem.is_none() => cert_pem = Some(block),
            "PRIVATE KEY" | "EC PRIVATE KEY" | "RSA PRIVATE KEY" if key_pem.is_none() => key_pem = Some(block),
            other => return Err(format!("unexpected PEM block {other:?}")),
        }
    }
    let (Some(cert), Some(key)) = (cert_pem, key_pem) else {
        return Err("needs one CERTIFICATE and one PRIVATE KEY block".into());
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.contents()).map_err(|e| format!("certificate: {e}"))?;
    let key_text = Zeroizing::new(lf_pem(&key));
    let key_pair = rcgen::KeyPair::from_pem(&key_text).map_err(|e| format!("key: {e}"))?;
    if rcgen::PublicKeyData::subject_public_key_info(&key_pair) != parsed.public_key().raw {
        return Err("the key does not match the certificate".into());
    }
    let subject = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    if subject != node.username() {
        return Err(format!("certificate is for {subject:?}, not {:?}", node.username()));
    }
    let orgs: Vec<&str> = parsed
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    if orgs != [attestation::names::GROUP_NODES] {
        return Err(format!("certificate organizations {orgs:?} are not [\"system:nodes\"]"));
    }
    let provider_oid = x509_parser::der_parser::oid::Oid::from(attestation::names::PROVIDER_ID_OID).ok();
    let cert_provider_id = parsed
        .extensions()
        .iter()
        .find(|e| Some(&e.oid) == provider_oid.as_ref())
        .and_then(|e| ProviderId::from_extension_value(e.value).ok())
        .map(|p| p.as_str().to_owned());
    let not_before = parsed.validity().not_before.to_datetime();
    let not_after = parsed.validity().not_after.to_datetime();
    if now >= not_after {
        return Err(format!("certificate expired at {}", crate::backoff::rfc3339(not_after)));
    }
    Ok(Credential {
        cert_pem: lf_pem(&cert),
        key_pem: key_text,
        subject,
        provider_id: cert_provider_id,
        sha256: sha256_hex(cert.contents()),
        rotate_at: rotation_point(cert.contents(), not_before, not_after),
        not_before,
        not_after,
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// PEM with `\n` line endings (the `pem` crate writes `\r\n` by default).
fn lf_pem(block: &pem::Pem) -> String {
    pem::encode_config(block, pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
}

/// `text` (a last-error record) with a leading time in `time`'s display form
/// (`2026-11-26 15:04:05.123 +00:00:00: ...`, what earlier versions wrote) rewritten as RFC 3339
/// in UTC; any other text as it is.
fn rfc3339_prefix(text: &str) -> String {
    const DISPLAYED: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
        "[year]-[month]-[day] [hour padding:none]:[minute]:[second].[subsecond] [offset_hour sign:mandatory]:[offset_minute]:[offset_second]"
    );
    text.split_once(": ")
        .and_then(|(at, rest)| {
            let at = OffsetDateTime::parse(at, DISPLAYED).ok()?;
            Some(format!("{}: {rest}", crate::backoff::rfc3339(at)))
        })
        .unwrap_or_else(|| text.to_owned())
}

/// The cert dir.
#[derive(Debug, Clone)]
pub struct CertDir {
    dir: PathBuf,
}

impl CertDir {
    /// `dir` as it is, never created (what `status` reads: a missing folder holds nothing).
    pub fn existing(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    /// `dir`, created (0700) if missing.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create the cert dir {}", dir.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        Ok(Self { dir: dir.to_owned() })
    }

    /// The path of a file in the dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// What `kubelet-client-current.pem` holds for `node`: a certificate with another
    /// Machine's provider ID is unusable; one without the extension, or one [`OBTAINED`] does
    /// not list, is foreign.
    pub fn current(&self, node: &NodeName, provider_id: Option<&ProviderId>, now: OffsetDateTime) -> Cached {
        let path = self.path(CURRENT);
        let credential = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Cached::Missing,
            Err(e) => return Cached::Unusable(format!("cannot read {}: {e}", path.display())),
            Ok(contents) => match check_node(&contents, node, now) {
                Ok(credential) => credential,
                Err(why) => return Cached::Unusable(format!("{}: {why}", path.display())),
            },
        };
        let record = self.obtained();
        if record.as_ref().and_then(|r| r.adopted.as_deref()) == Some(credential.sha256.as_str()) {
            return Cached::Foreign(credential, NotObtained::Adopted);
        }
        match (&credential.provider_id, provider_id) {
            (None, _) => Cached::Foreign(credential, NotObtained::NoProviderId),
            (Some(have), Some(wanted)) if have != wanted.as_str() => Cached::Unusable(format!(
                "{}: certificate provider ID {have:?} is not {:?}",
                path.display(),
                wanted.as_str()
            )),
            _ => match record {
                Some(record) if !record.sha256.contains(&credential.sha256) => {
                    Cached::Foreign(credential, NotObtained::NotRecorded)
                }
                // Listed; or no record (an earlier version's dir: the provider-ID extension
                // makes it ours, see the module's documentation).
                _ => Cached::Usable(credential),
            },
        }
    }

    /// The record of stored certificates; `None` when there is none or it is not a record.
    pub fn obtained(&self) -> Option<Obtained> {
        use std::io::Read;
        let file = std::fs::File::open(self.path(OBTAINED)).ok()?;
        let mut text = String::new();
        file.take(crate::backoff::MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .ok()?;
        Obtained::parse(&text)
    }

    /// Stores a new credential: `kubelet-client-<timestamp>.pem` (0600, atomic), its SHA-256
    /// added to [`OBTAINED`] (atomic), then `kubelet-client-current.pem` pointed at it by an
    /// atomic rename of a fresh symlink. `replacing`: the foreign certificate it replaces, kept
    /// in the record for `status`.
    pub fn store(
        &self,
        cert_pem: &str,
        key_pem: &str,
        now: OffsetDateTime,
        replacing: Option<(&Credential, NotObtained)>,
    ) -> Result<PathBuf> {
        let cert_der = pem::parse(cert_pem.as_bytes())
            .ok()
            .filter(|p| p.tag() == "CERTIFICATE")
            .context("storing a certificate that is not one PEM CERTIFICATE")?;
        let stamp = format!(
            "{:04}-{:02}-{:02}-{:02}-{:02}-{:02}",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let name = format!("kubelet-client-{stamp}.pem");
        let file = self.path(&name);
        let contents = Zeroizing::new(format!("{}\n{}", cert_pem.trim_end(), key_pem.trim_end()) + "\n");
        write_private(&file, contents.as_bytes())?;
        let mut record = self.obtained().unwrap_or_default();
        record.remember(sha256_hex(cert_der.contents()));
        // The adopted certificate (if any) is no longer current.
        record.adopted = None;
        if let Some((old, why)) = replacing {
            record.replaced = Some(Replaced {
                at: now,
                sha256: old.sha256.clone(),
                why: why.explain(),
            });
        }
        write_private(&self.path(OBTAINED), record.to_json().as_bytes())?;
        let link = self.path(&format!(".{CURRENT}.{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&name, &link).with_context(|| format!("cannot create {}", link.display()))?;
        std::fs::rename(&link, self.path(CURRENT))
            .with_context(|| format!("cannot update {}", self.path(CURRENT).display()))?;
        Ok(file)
    }

    /// Makes an adopted credential (kubeadm's, `kubeconfig --adopt`) the current one:
    /// `kubelet-client-adopted-<timestamp>.pem` (0600, atomic), its SHA-256 recorded in
    /// [`OBTAINED`] as adopted (never as obtained), then `kubelet-client-current.pem` pointed at
    /// it. When the current file already holds that certificate (kubeadm's kubeconfig names the
    /// file), only the record is written.
    pub fn adopt(&self, cert_pem: &str, key_pem: &str, now: OffsetDateTime) -> Result<()> {
        let cert_der = pem::parse(cert_pem.as_bytes())
            .ok()
            .filter(|p| p.tag() == "CERTIFICATE")
            .context("adopting a certificate that is not one PEM CERTIFICATE")?;
        let sha256 = sha256_hex(cert_der.contents());
        let mut record = self.obtained().unwrap_or_default();
        let current_holds_it = std::fs::read_to_string(self.path(CURRENT))
            .ok()
            .and_then(|text| pem::parse_many(text.as_bytes()).ok())
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.tag() == "CERTIFICATE" && sha256_hex(b.contents()) == sha256)
            });
        record.adopted = Some(sha256);
        write_private(&self.path(OBTAINED), record.to_json().as_bytes())?;
        if current_holds_it {
            return Ok(());
        }
        let name = format!("kubelet-client-adopted-{}.pem", now.unix_timestamp());
        let contents = Zeroizing::new(format!("{}\n{}", cert_pem.trim_end(), key_pem.trim_end()) + "\n");
        write_private(&self.path(&name), contents.as_bytes())?;
        let link = self.path(&format!(".{CURRENT}.{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&name, &link).with_context(|| format!("cannot create {}", link.display()))?;
        std::fs::rename(&link, self.path(CURRENT))
            .with_context(|| format!("cannot update {}", self.path(CURRENT).display()))?;
        Ok(())
    }

    /// Records the last failure for `status`: `<RFC 3339 time>: <message>`.
    pub fn record_error(&self, message: &str, now: OffsetDateTime) {
        let text = format!("{}: {message}\n", crate::backoff::rfc3339(now));
        let _ = std::fs::write(self.path(LAST_ERROR), text);
    }

    /// Clears the last failure.
    pub fn clear_error(&self) {
        let _ = std::fs::remove_file(self.path(LAST_ERROR));
    }

    /// The last failure, if any, its time in RFC 3339 (a file written by an earlier version,
    /// which wrote the time as `time` displays it, is read with its time converted).
    pub fn last_error(&self) -> Option<String> {
        std::fs::read_to_string(self.path(LAST_ERROR))
            .ok()
            .map(|text| rfc3339_prefix(&text))
    }

    /// The backoff record ([`crate::backoff`]): `Ok(None)` when there is none, `Err(why)` when
    /// the file is unreadable or not a record (the caller treats it as absent and says so).
    pub fn backoff(&self) -> Result<Option<Backoff>, String> {
        self.denial_record(crate::backoff::FILE)
    }

    /// The last denial ([`LAST_DENIAL`], a backoff record), as [`CertDir::backoff`] reads it.
    pub fn last_denial(&self) -> Result<Option<Backoff>, String> {
        self.denial_record(LAST_DENIAL)
    }

    /// Writes the last denial (0600, atomic).
    pub fn store_last_denial(&self, denial: &Backoff) -> Result<()> {
        write_private(&self.path(LAST_DENIAL), denial.to_json().as_bytes())
    }

    fn denial_record(&self, name: &str) -> Result<Option<Backoff>, String> {
        use std::io::Read;
        let path = self.path(name);
        let file = match std::fs::File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other.map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        };
        let mut text = String::new();
        file.take(crate::backoff::MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if text.len() as u64 > crate::backoff::MAX_FILE_BYTES {
            return Err(format!("{} is larger than 64 KiB", path.display()));
        }
        Backoff::parse(&text)
            .map(Some)
            .map_err(|why| format!("{}: {why}", path.display()))
    }

    /// Writes the backoff record (0600, atomic).
    pub fn store_backoff(&self, backoff: &Backoff) -> Result<()> {
        write_private(&self.path(crate::backoff::FILE), backoff.to_json().as_bytes())
    }

    /// Removes the backoff record: the next refusal starts the schedule again.
    pub fn clear_backoff(&self) {
        let _ = std::fs::remove_file(self.path(crate::backoff::FILE));
    }

    /// Takes the exclusive lock of the dir (blocking): one invocation files a CSR at a time.
    pub fn lock(&self) -> Result<std::fs::File> {
        let path = self.path(LOCK);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock {}", path.display()))?;
        file.lock().with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(file)
    }
}

/// The certificates this plugin stored ([`OBTAINED`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Obtained {
    /// SHA-256 (lowercase hex) of each, newest first.
    pub sha256: Vec<String>,
    /// The last foreign certificate a stored one replaced.
    pub replaced: Option<Replaced>,
    /// SHA-256 of the certificate taken over by `kubeconfig --adopt`, while it is current.
    pub adopted: Option<String>,
}

/// A foreign certificate the plugin replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    /// When.
    pub at: OffsetDateTime,
    /// Its SHA-256 (lowercase hex).
    pub sha256: String,
    /// Why it was foreign ([`NotObtained::explain`]).
    pub why: String,
}

impl Obtained {
    fn remember(&mut self, sha256: String) {
        self.sha256.retain(|s| *s != sha256);
        self.sha256.insert(0, sha256);
        self.sha256.truncate(OBTAINED_KEPT);
    }

    fn to_json(&self) -> String {
        let mut value = serde_json::json!({ "sha256": self.sha256 });
        if let Some(adopted) = &self.adopted {
            value["adopted"] = serde_json::json!(adopted);
        }
        if let Some(r) = &self.replaced {
            value["replaced"] = serde_json::json!({
                "at": crate::backoff::rfc3339(r.at),
                "sha256": r.sha256,
                "why": r.why,
            });
        }
        value.to_string() + "\n"
    }

    /// The record in `text`; `None` unless every digest is 64 lowercase hex characters.
    fn parse(text: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        let is_digest = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let sha256 = value
            .get("sha256")?
            .as_array()?
            .iter()
            .take(OBTAINED_KEPT)
            .map(|d| d.as_str().filter(|d| is_digest(d)).map(str::to_owned))
            .collect::<Option<Vec<_>>>()?;
        let replaced = value.get("replaced").and_then(|r| {
            Some(Replaced {
                at: time::OffsetDateTime::parse(r.get("at")?.as_str()?, &time::format_description::well_known::Rfc3339)
                    .ok()?,
                sha256: r.get("sha256")?.as_str().filter(|d| is_digest(d))?.to_owned(),
                why: r.get("why")?.as_str()?.chars().take(1024).collect(),
            })
        });
        let adopted = value
            .get("adopted")
            .and_then(|a| a.as_str())
            .filter(|d| is_digest(d))
            .map(str::to_owned);
        Some(Self {
            sha256,
            replaced,
            adopted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeName {
        NodeName::new("worker-0").unwrap()
    }

    const PID: &str = "aws:///x";

    fn issue(cn: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> (String, String) {
        issue_with(cn, Some(PID), not_before, not_after)
    }

    /// A self-signed node certificate and its key; with the provider-ID extension when given
    /// (as the signer issues), without it as kube-controller-manager does.
    fn issue_with(
        cn: &str,
        provider_id: Option<&str>,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        if let Some(id) = provider_id {
            params.custom_extensions.push(rcgen::CustomExtension::from_oid_content(
                attestation::names::PROVIDER_ID_OID,
                ProviderId::new(id).unwrap().to_extension_value(),
            ));
        }
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn the_last_error_is_read_with_an_rfc3339_time_also_from_a_file_an_earlier_version_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CertDir::existing(tmp.path());
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap() + Duration::milliseconds(372);
        dir.record_error("filing the CSR: refused: a: b", at);
        assert_eq!(
            dir.last_error().unwrap(),
            "2027-01-15T08:00:00Z: filing the CSR: refused: a: b\n"
        );
        // What earlier versions wrote: the time as `time` displays it, in any offset.
        let offset = time::UtcOffset::from_hms(2, 0, 0).unwrap();
        for earlier in [at, at.to_offset(offset), at.replace_nanosecond(0).unwrap()] {
            std::fs::write(dir.path(LAST_ERROR), format!("{earlier}: timed out: x\n")).unwrap();
            assert_eq!(
                dir.last_error().unwrap(),
                "2027-01-15T08:00:00Z: timed out: x\n",
                "{earlier}"
            );
        }
        std::fs::write(dir.path(LAST_ERROR), "no time here: x\n").unwrap();
        assert_eq!(dir.last_error().unwrap(), "no time here: x\n");
    }

    #[test]
    fn rotation_falls_between_half_and_55_percent_of_the_life_after_backdating_and_is_stable() {
        let start = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        // 100 hours of life after 5 minutes of backdating.
        let end = start + BACKDATING + Duration::hours(100);
        let mut seen = Vec::new();
        for i in 0..200u32 {
            let at = rotation_point(&i.to_be_bytes(), start, end);
            let after = at - start - BACKDATING;
            assert!(after >= Duration::hours(50) && after <= Duration::hours(55), "{at}");
            assert!(end - at >= Duration::hours(45), "the outage tolerance: 45% of the life");
            assert_eq!(
                at,
                rotation_point(&i.to_be_bytes(), start, end),
                "same certificate, same point"
            );
            seen.push(at);
        }
        seen.sort();
        assert!(seen[199] - seen[0] > Duration::hours(4), "jitter spreads the fleet");
    }

    #[test]
    fn the_default_lifetime_tolerates_a_three_day_outage() {
        let issued = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let (not_before, not_after) = (issued - BACKDATING, issued + Duration::hours(168));
        for i in 0..200u32 {
            let at = rotation_point(&i.to_be_bytes(), not_before, not_after);
            assert!(not_after - at >= Duration::hours(75), "{}", not_after - at);
            assert!(at - issued >= Duration::hours(84), "{}", at - issued);
        }
    }

    #[test]
    fn a_short_certificate_is_never_due_before_it_was_issued() {
        // The envtest suites' 3-minute certificates, backdated 5 minutes by the signer: due
        // 90 to 99 s after issuance, never at once.
        let issued = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let (not_before, not_after) = (issued - BACKDATING, issued + Duration::minutes(3));
        for i in 0..200u32 {
            let after = rotation_point(&i.to_be_bytes(), not_before, not_after) - issued;
            assert!(
                after >= Duration::seconds(90) && after <= Duration::seconds(99),
                "{after}"
            );
        }
        // A certificate from a signer that does not backdate, shorter than the backdating: two
        // thirds of it count as such, the rest is life.
        let (not_before, not_after) = (issued, issued + Duration::minutes(2));
        let at = rotation_point(&0u32.to_be_bytes(), not_before, not_after);
        assert!(at > issued + Duration::seconds(80) && at < not_after, "{at}");
    }

    #[test]
    fn a_good_file_is_usable_and_a_foreign_expired_or_mismatched_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CertDir::open(dir.path()).unwrap();
        let now = OffsetDateTime::now_utc();
        assert!(matches!(cache.current(&node(), None, now), Cached::Missing));

        let (cert, key) = issue(
            "system:node:worker-0",
            now - Duration::hours(1),
            now + Duration::hours(9),
        );
        cache.store(&cert, &key, now, None).unwrap();
        let Cached::Usable(c) = cache.current(&node(), None, now) else {
            panic!()
        };
        assert!(c.rotate_at > now && c.rotate_at < c.not_after);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let target = std::fs::canonicalize(cache.path(CURRENT)).unwrap();
            assert_eq!(std::fs::metadata(target).unwrap().permissions().mode() & 0o777, 0o600);
        }

        let (other, other_key) = issue(
            "system:node:worker-1",
            now - Duration::hours(1),
            now + Duration::hours(9),
        );
        cache.store(&other, &other_key, now, None).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("worker-1")));

        let (old, old_key) = issue(
            "system:node:worker-0",
            now - Duration::hours(9),
            now - Duration::hours(1),
        );
        cache.store(&old, &old_key, now, None).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("expired")));

        cache.store(&cert, &other_key, now, None).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("does not match")));

        std::fs::write(cache.path("garbage.pem"), "not pem at all").unwrap();
        std::fs::remove_file(cache.path(CURRENT)).unwrap();
        std::os::unix::fs::symlink("garbage.pem", cache.path(CURRENT)).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(_)));

        let other_machine = ProviderId::new("aws:///other").unwrap();
        cache.store(&cert, &key, now, None).unwrap();
        assert!(matches!(
            cache.current(&node(), Some(&ProviderId::new(PID).unwrap()), now),
            Cached::Usable(_)
        ));
        assert!(
            matches!(cache.current(&node(), Some(&other_machine), now), Cached::Unusable(why) if why.contains("provider ID")),
            "a certificate for another Machine is not this node's"
        );
    }

    #[test]
    fn a_certificate_it_did_not_store_is_foreign_and_an_earlier_versions_dir_is_trusted_by_its_extension() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CertDir::open(dir.path()).unwrap();
        let now = OffsetDateTime::now_utc();
        let pid = ProviderId::new(PID).unwrap();
        let hours = |h| now + Duration::hours(h);
        let write_current = |cert: &str, key: &str, name: &str| {
            std::fs::write(cache.path(name), format!("{cert}{key}")).unwrap();
            let _ = std::fs::remove_file(cache.path(CURRENT));
            std::os::unix::fs::symlink(name, cache.path(CURRENT)).unwrap();
        };

        // An earlier version's dir, no record: the provider-ID extension makes it ours.
        let (ours, our_key) = issue("system:node:worker-0", hours(-1), hours(9));
        write_current(&ours, &our_key, "kubelet-client-old.pem");
        assert!(cache.obtained().is_none());
        assert!(matches!(cache.current(&node(), Some(&pid), now), Cached::Usable(_)));

        // kube-controller-manager's certificate (no extension), written by kubelet's rotation.
        let (kcm, kcm_key) = issue_with("system:node:worker-0", None, hours(-1), hours(9));
        write_current(&kcm, &kcm_key, "kubelet-client-kcm.pem");
        let Cached::Foreign(foreign, why) = cache.current(&node(), Some(&pid), now) else {
            panic!("a certificate without the extension is foreign")
        };
        assert_eq!(why, NotObtained::NoProviderId);
        assert!(
            why.explain().contains("--rotate-certificates=false"),
            "{}",
            why.explain()
        );
        assert!(
            matches!(cache.current(&node(), None, now), Cached::Foreign(..)),
            "with or without a provider ID to compare"
        );

        // Replaced by one it obtained: recorded, and the replacement noted.
        let (fresh, fresh_key) = issue("system:node:worker-0", hours(-1), hours(9));
        cache.store(&fresh, &fresh_key, now, Some((&foreign, why))).unwrap();
        let Cached::Usable(stored) = cache.current(&node(), Some(&pid), now) else {
            panic!("what it stored is usable")
        };
        let record = cache.obtained().unwrap();
        assert_eq!(record.sha256, std::slice::from_ref(&stored.sha256));
        let replaced = record.replaced.unwrap();
        assert_eq!(replaced.sha256, foreign.sha256);
        assert!(replaced.why.contains("no provider-ID extension"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.path(OBTAINED)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        // Now there is a record: a certificate with the extension it did not store is foreign.
        write_current(&ours, &our_key, "kubelet-client-old.pem");
        assert!(matches!(
            cache.current(&node(), Some(&pid), now),
            Cached::Foreign(_, NotObtained::NotRecorded)
        ));
        // Foreign never means usable for another node, or with another key.
        let (other_node, other_key) = issue_with("system:node:worker-1", None, hours(-1), hours(9));
        write_current(&other_node, &other_key, "kubelet-client-other.pem");
        assert!(matches!(cache.current(&node(), Some(&pid), now), Cached::Unusable(_)));
        write_current(&kcm, &our_key, "kubelet-client-mixed.pem");
        assert!(
            matches!(cache.current(&node(), Some(&pid), now), Cached::Unusable(why) if why.contains("does not match"))
        );

        // The record keeps the last few, newest first; the one current before a store stays listed.
        for _ in 0..10 {
            let (c, k) = issue("system:node:worker-0", hours(-1), hours(9));
            cache.store(&c, &k, now, None).unwrap();
        }
        let record = cache.obtained().unwrap();
        assert_eq!(record.sha256.len(), 8);
        let Cached::Usable(latest) = cache.current(&node(), Some(&pid), now) else {
            panic!()
        };
        assert_eq!(record.sha256[0], latest.sha256);
    }

    #[test]
    fn a_corrupt_record_counts_as_none() {
        let valid = "a".repeat(64);
        for text in [
            "".to_owned(),
            "{".to_owned(),
            "{\"sha256\": \"x\"}".to_owned(),
            format!("{{\"sha256\": [\"{}\"]}}", "A".repeat(64)),
            format!("{{\"sha256\": [\"{valid}\", 7]}}"),
            format!("{{\"sha256\": [\"{}\"]}}", "a".repeat(63)),
        ] {
            assert_eq!(Obtained::parse(&text), None, "{text}");
        }
        let odd = Obtained::parse(&format!(
            "{{\"sha256\": [\"{valid}\"], \"replaced\": {{\"at\": \"yesterday\"}}, \"new\": 1}}"
        ))
        .unwrap();
        assert_eq!(
            (odd.sha256, odd.replaced),
            (vec![valid], None),
            "a broken note drops the note only"
        );
    }

    #[test]
    fn the_backoff_file_is_private_round_trips_and_refuses_what_is_not_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CertDir::open(dir.path()).unwrap();
        assert_eq!(cache.backoff(), Ok(None));
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let refused = crate::obtain::Refused {
            csr: "node-csr-abc".into(),
            condition: crate::obtain::Refusal::Failed,
            reason: "SignerFailed".into(),
            message: "m".into(),
            supported: None,
        };
        let record = Backoff::after(None, "req", &refused, now, 0.3);
        cache.store_backoff(&record).unwrap();
        assert_eq!(cache.backoff(), Ok(Some(record)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.path(crate::backoff::FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }

        std::fs::write(cache.path(crate::backoff::FILE), " ".repeat(70 * 1024)).unwrap();
        assert!(matches!(cache.backoff(), Err(why) if why.contains("64 KiB")));
        std::fs::write(cache.path(crate::backoff::FILE), [0xff, 0xfe, b'{']).unwrap();
        assert!(cache.backoff().is_err(), "not UTF-8");
        std::fs::remove_file(cache.path(crate::backoff::FILE)).unwrap();
        std::fs::create_dir(cache.path(crate::backoff::FILE)).unwrap();
        assert!(cache.backoff().is_err(), "a directory in its place");
        std::fs::remove_dir(cache.path(crate::backoff::FILE)).unwrap();
        cache.clear_backoff();
        assert_eq!(cache.backoff(), Ok(None));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// A cache file is local but written by a process that may have crashed, or by someone
        /// else: any bytes give a verdict, never a panic.
        #[test]
        fn any_cache_file_gives_a_verdict(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = check(&text, &node(), None, OffsetDateTime::now_utc());
            let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", base64_of(&bytes));
            let _ = check(&pem, &node(), None, OffsetDateTime::now_utc());
            let _ = Obtained::parse(&text);
        }

        #[test]
        fn any_exec_info_gives_a_version_or_an_error(text in ".{0,300}") {
            let _ = crate::exec_credential::parse_exec_info(Some(&text));
        }
    }

    fn base64_of(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}
