//! The record of what the signer issued in a workload cluster: one entry per certificate, in
//! sixteen ConfigMaps of `kube-system` (`node-attestation-issued-0` to `-f`, by the credential
//! ID's first hex digit), written before the certificate is (a certificate is never issued
//! unrecorded; an entry whose certificate never reached the CSR is harmless and pruned at its
//! NotAfter). The record outlives the CSR (kube-controller-manager's cleaner deletes an issued
//! CSR after an hour) and the signer's restarts, and costs one workload write per certificate,
//! nothing in the management cluster.
//!
//! Only cluster administrators write `kube-system` ConfigMaps; an entry that does not read
//! (edited by hand) is skipped and reported, never trusted partially.
//!
//! The signer reads the record when it starts serving a Cluster, adds to it at each issuance,
//! and removes the entries past their NotAfter at each resync ([`expired_by_shard`]).
//!
//! An entry is the key `<credential ID>` and the value
//! `v1 <notAfter, Unix seconds> <M|P> <Machine or MachinePool UID> <its name> <node> <providerID>`:
//! about 220 bytes with a 36-byte UID and AWS names (a generated Machine name, an EC2 host name
//! and provider ID), so one shard holds about 4,000 entries under [`SHARD_BYTES`] and the
//! sixteen about 65,000, each pruned at its NotAfter: at the default 168h lifetime and a renewal
//! at most every 84h, two or three live certificates per node, over 20,000 nodes per cluster.

use crate::machine::TargetKind;

use super::CredentialId;

/// The record's ConfigMaps' namespace.
pub const NAMESPACE: &str = "kube-system";

/// The name of shard `shard` (0 to 15).
pub fn shard_name(shard: usize) -> String {
    format!("node-attestation-issued-{:x}", shard & 0xf)
}

/// Every shard's name.
pub fn shard_names() -> impl Iterator<Item = String> {
    (0..16).map(shard_name)
}

/// Most bytes the signer writes in one shard's `data` before it stops recording there (and so
/// stops issuing into it: see the module doc), below the apiserver's 1 MiB object limit with
/// room for metadata and managed fields.
pub const SHARD_BYTES: usize = 900 * 1024;

/// One issued certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// Its credential ID.
    pub id: CredentialId,
    /// NotAfter, Unix seconds.
    pub not_after: i64,
    /// Machine or MachinePool.
    pub kind: TargetKind,
    /// The Machine's or MachinePool's UID.
    pub target_uid: String,
    /// Its name (for people: the UID decides).
    pub target_name: String,
    /// The node name in the certificate.
    pub node: String,
    /// The provider ID it was issued for.
    pub provider_id: String,
}

/// Why a record entry does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record entry {key:?} does not read: {why}")]
pub struct EntryError {
    key: String,
    why: &'static str,
}

impl IssuedCertificate {
    /// The entry's key.
    pub fn key(&self) -> String {
        self.id.to_string()
    }

    /// The entry's value.
    pub fn value(&self) -> String {
        let kind = match self.kind {
            TargetKind::Machine => "M",
            TargetKind::MachinePool => "P",
        };
        format!(
            "v1 {} {kind} {} {} {} {}",
            self.not_after, self.target_uid, self.target_name, self.node, self.provider_id
        )
    }

    /// Reads an entry.
    pub fn parse(key: &str, value: &str) -> Result<Self, EntryError> {
        let error = |why| EntryError {
            key: key.chars().take(80).collect(),
            why,
        };
        let id = CredentialId::from_hex(key).ok_or_else(|| error("the key is not 64 lowercase hex digits"))?;
        let mut words = value.split(' ');
        if words.next() != Some("v1") {
            return Err(error("not a v1 entry"));
        }
        let mut next = |what| words.next().filter(|w| !w.is_empty()).ok_or_else(|| error(what));
        let not_after = next("no NotAfter")?
            .parse()
            .map_err(|_| error("NotAfter is not a number"))?;
        let kind = match next("no kind")? {
            "M" => TargetKind::Machine,
            "P" => TargetKind::MachinePool,
            _ => return Err(error("the kind is neither M nor P")),
        };
        let target_uid = next("no UID")?.to_owned();
        let target_name = next("no name")?.to_owned();
        let node = next("no node")?.to_owned();
        let provider_id = next("no providerID")?.to_owned();
        if words.next().is_some() {
            return Err(error("more words than a v1 entry has"));
        }
        Ok(Self {
            id,
            not_after,
            kind,
            target_uid,
            target_name,
            node,
            provider_id,
        })
    }

    /// Whether it is expired at `now` (Unix seconds): no longer recorded or listed.
    pub fn expired(&self, now: i64) -> bool {
        self.not_after <= now
    }
}

/// Every entry of a shard's `data` that reads, and the errors of those that do not.
pub fn read_shard<'a>(
    data: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> (Vec<IssuedCertificate>, Vec<EntryError>) {
    let mut read = Vec::new();
    let mut errors = Vec::new();
    for (key, value) in data {
        match IssuedCertificate::parse(key, value) {
            Ok(entry) => read.push(entry),
            Err(e) => errors.push(e),
        }
    }
    (read, errors)
}

/// The entries of `entries` expired at `now`, by shard: what the record's pruning removes (an
/// expired certificate has nothing left to refuse, and a shard that only grew would fill).
pub fn expired_by_shard<'a>(
    entries: impl IntoIterator<Item = &'a IssuedCertificate>,
    now: i64,
) -> std::collections::BTreeMap<usize, Vec<&'a IssuedCertificate>> {
    let mut by_shard = std::collections::BTreeMap::<usize, Vec<&IssuedCertificate>>::new();
    for entry in entries.into_iter().filter(|e| e.expired(now)) {
        by_shard.entry(entry.id.shard()).or_default().push(entry);
    }
    by_shard
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> IssuedCertificate {
        IssuedCertificate {
            id: CredentialId::of_certificate(b"cert"),
            not_after: 1_800_000_000,
            kind: TargetKind::Machine,
            target_uid: "6c1f3b2e-0000-4000-8000-000000000001".into(),
            target_name: "prod-md-0-abcde-xyz12".into(),
            node: "ip-10-0-1-17.us-west-2.compute.internal".into(),
            provider_id: "aws:///us-west-2a/i-0123456789abcdef0".into(),
        }
    }

    #[test]
    fn an_entry_reads_back_and_its_size_is_as_documented() {
        let e = entry();
        assert_eq!(IssuedCertificate::parse(&e.key(), &e.value()), Ok(e.clone()));
        let size = e.key().len() + e.value().len();
        assert!(
            (200..=240).contains(&size),
            "{size} bytes: the module doc says about 220"
        );
        assert!(SHARD_BYTES / size >= 4_000, "the module doc says about 4,000 per shard");
    }

    #[test]
    fn a_hand_edited_entry_is_refused_whole() {
        let e = entry();
        let value = e.value();
        for (key, value) in [
            ("not-hex".to_owned(), value.clone()),
            (e.key(), "v2 1 M a b c d".to_owned()),
            (e.key(), value.replace(" M ", " X ")),
            (e.key(), format!("{value} extra")),
            (e.key(), "v1 soon M a b c d".to_owned()),
            (e.key(), "v1 1 M a b c".to_owned()),
            (e.key(), "v1 1 M a  b c d".to_owned()),
            (e.key(), String::new()),
        ] {
            assert!(IssuedCertificate::parse(&key, &value).is_err(), "{key} {value:?}");
        }
        let data = [(e.key(), value), ("x".to_owned(), "y".to_owned())];
        let (read, errors) = read_shard(data.iter().map(|(k, v)| (k, v)));
        assert_eq!((read.len(), errors.len()), (1, 1));
    }

    #[test]
    fn only_expired_entries_are_pruned_each_from_its_shard() {
        let live = entry();
        let mut old = entry();
        old.id = CredentialId::of_certificate(b"old");
        old.not_after = 1_700_000_000;
        let mut older = entry();
        older.id = CredentialId::of_certificate(b"older");
        older.not_after = 1_600_000_000;
        let entries = [live.clone(), old.clone(), older.clone()];
        let pruned = expired_by_shard(&entries, 1_750_000_000);
        let ids: Vec<CredentialId> = pruned.values().flatten().map(|e| e.id).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&old.id) && ids.contains(&older.id) && !ids.contains(&live.id));
        for (shard, entries) in &pruned {
            assert!(entries.iter().all(|e| e.id.shard() == *shard));
        }
        assert!(expired_by_shard(&entries, 1_500_000_000).is_empty());
    }

    #[test]
    fn shards_are_named_by_the_first_hex_digit() {
        let e = entry();
        assert_eq!(
            shard_name(e.id.shard()),
            format!("node-attestation-issued-{}", &e.key()[..1])
        );
        assert_eq!(shard_names().count(), 16);
        assert_eq!(shard_name(15), "node-attestation-issued-f");
    }
}
