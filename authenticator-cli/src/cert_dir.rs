//! The certificate directory, kept as kubelet keeps it: `kubelet-client-<timestamp>.pem` files
//! holding certificate and key, and `kubelet-client-current.pem` pointing at the newest.
//!
//! A cached credential is only trusted when it parses, its key matches its certificate, it is
//! for this node (CN `system:node:<name>`, O `system:nodes`, the provider-ID extension when one
//! is asked for) and it is still valid; anything else is reported and replaced.

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
/// The lock serialising concurrent invocations.
pub const LOCK: &str = "kubelet-authenticator.lock";

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
    /// Validity.
    pub not_before: OffsetDateTime,
    /// Validity.
    pub not_after: OffsetDateTime,
    /// When to renew: a jittered 70-90% of the lifetime.
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
    /// A file that must not be used; why.
    Unusable(String),
}

/// The rotation point: `not_before` plus a fraction of the lifetime between 70% and 90%,
/// derived from the certificate itself so every invocation agrees on it (a fresh random draw
/// per call would make some call always see "rotate now").
pub fn rotation_point(cert_der: &[u8], not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, cert_der);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    let unit = (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64;
    let fraction = 0.7 + 0.2 * unit;
    let lifetime = not_after - not_before;
    not_before + Duration::seconds_f64(lifetime.as_seconds_f64() * fraction)
}

/// Parses and checks a `cert + key` PEM file's contents for `node` (and `provider_id`).
pub fn check(
    contents: &str,
    node: &NodeName,
    provider_id: Option<&ProviderId>,
    now: OffsetDateTime,
) -> Result<Credential, String> {
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
    if let Some(wanted) = provider_id
        && cert_provider_id.as_deref() != Some(wanted.as_str())
    {
        return Err(format!(
            "certificate provider ID {cert_provider_id:?} is not {:?}",
            wanted.as_str()
        ));
    }
    let not_before = parsed.validity().not_before.to_datetime();
    let not_after = parsed.validity().not_after.to_datetime();
    if now >= not_after {
        return Err(format!("certificate expired at {not_after}"));
    }
    Ok(Credential {
        cert_pem: lf_pem(&cert),
        key_pem: key_text,
        subject,
        provider_id: cert_provider_id,
        rotate_at: rotation_point(cert.contents(), not_before, not_after),
        not_before,
        not_after,
    })
}

/// PEM with `\n` line endings (the `pem` crate writes `\r\n` by default).
fn lf_pem(block: &pem::Pem) -> String {
    pem::encode_config(block, pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
}

/// The cert dir.
#[derive(Debug, Clone)]
pub struct CertDir {
    dir: PathBuf,
}

impl CertDir {
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

    /// What `kubelet-client-current.pem` holds for `node`.
    pub fn current(&self, node: &NodeName, provider_id: Option<&ProviderId>, now: OffsetDateTime) -> Cached {
        let path = self.path(CURRENT);
        match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cached::Missing,
            Err(e) => Cached::Unusable(format!("cannot read {}: {e}", path.display())),
            Ok(contents) => match check(&contents, node, provider_id, now) {
                Ok(credential) => Cached::Usable(credential),
                Err(why) => Cached::Unusable(format!("{}: {why}", path.display())),
            },
        }
    }

    /// Stores a new credential: `kubelet-client-<timestamp>.pem` (0600, atomic), then
    /// `kubelet-client-current.pem` pointed at it by an atomic rename of a fresh symlink.
    pub fn store(&self, cert_pem: &str, key_pem: &str, now: OffsetDateTime) -> Result<PathBuf> {
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
        let link = self.path(&format!(".{CURRENT}.{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&name, &link).with_context(|| format!("cannot create {}", link.display()))?;
        std::fs::rename(&link, self.path(CURRENT))
            .with_context(|| format!("cannot update {}", self.path(CURRENT).display()))?;
        Ok(file)
    }

    /// Records the last failure for `status`.
    pub fn record_error(&self, message: &str, now: OffsetDateTime) {
        let text = format!("{now}: {message}\n");
        let _ = std::fs::write(self.path(LAST_ERROR), text);
    }

    /// Clears the last failure.
    pub fn clear_error(&self) {
        let _ = std::fs::remove_file(self.path(LAST_ERROR));
    }

    /// The last failure, if any.
    pub fn last_error(&self) -> Option<String> {
        std::fs::read_to_string(self.path(LAST_ERROR)).ok()
    }

    /// The backoff record ([`crate::backoff`]): `Ok(None)` when there is none, `Err(why)` when
    /// the file is unreadable or not a record (the caller treats it as absent and says so).
    pub fn backoff(&self) -> Result<Option<Backoff>, String> {
        use std::io::Read;
        let path = self.path(crate::backoff::FILE);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeName {
        NodeName::new("worker-0").unwrap()
    }

    fn issue(cn: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn rotation_falls_between_70_and_90_percent_and_is_stable() {
        let start = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let end = start + Duration::hours(100);
        let mut seen = Vec::new();
        for i in 0..200u32 {
            let at = rotation_point(&i.to_be_bytes(), start, end);
            assert!(
                at >= start + Duration::hours(70) && at <= start + Duration::hours(90),
                "{at}"
            );
            assert_eq!(
                at,
                rotation_point(&i.to_be_bytes(), start, end),
                "same certificate, same point"
            );
            seen.push(at);
        }
        seen.sort();
        assert!(seen[199] - seen[0] > Duration::hours(15), "jitter spreads the fleet");
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
        cache.store(&cert, &key, now).unwrap();
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
        cache.store(&other, &other_key, now).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("worker-1")));

        let (old, old_key) = issue(
            "system:node:worker-0",
            now - Duration::hours(9),
            now - Duration::hours(1),
        );
        cache.store(&old, &old_key, now).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("expired")));

        cache.store(&cert, &other_key, now).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(why) if why.contains("does not match")));

        std::fs::write(cache.path("garbage.pem"), "not pem at all").unwrap();
        std::fs::remove_file(cache.path(CURRENT)).unwrap();
        std::os::unix::fs::symlink("garbage.pem", cache.path(CURRENT)).unwrap();
        assert!(matches!(cache.current(&node(), None, now), Cached::Unusable(_)));

        let pid = ProviderId::new("aws:///x").unwrap();
        cache.store(&cert, &key, now).unwrap();
        assert!(
            matches!(cache.current(&node(), Some(&pid), now), Cached::Unusable(why) if why.contains("provider ID")),
            "a certificate without the expected provider ID is not this node's"
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
