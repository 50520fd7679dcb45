//! SPEC section 7, "Taking an identity back": the record of every certificate this signer
//! issued in the workload cluster, and the list of revoked ones that cluster's
//! `node-attestation-revoked-certificates` ValidatingAdmissionPolicy refuses.
//!
//! What is revoked is [`attestation::revocation`]'s (pure); this duty keeps the record in memory
//! (read once when the worker starts, added to at each issuance before the certificate is
//! written: [`Worker::record_issued`], pruned of expired entries at each resync, in memory and
//! in the cluster), reads the list again at each resync (an operator's entries, an edit by
//! hand), looks every [`TICK`] whether the
//! management cache, the Nodes or the clock revoke something new, and writes the list only when
//! it changes (one merge patch), reporting each revocation (log line, Event, counter). A
//! restarted signer reads the record and the list again and catches up within a few ticks of
//! its Cluster's objects being listed.
//!
//! Writes go through the signer's own workload identity (Role
//! `node-attestation-signer-revocation`), as merge patches under [`FIELD_MANAGER`], so that an
//! operator's entries (`node-attestation-signer revoke`) and the RBAC file's own apply never
//! fight over them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::machine::{TargetKind, TargetRef};
use attestation::revocation::CredentialId;
use attestation::revocation::identity_expiry;
use attestation::revocation::record::{self, IssuedCertificate, SHARD_BYTES};
use attestation::revocation::revoked_list::{self, ListChange};
use attestation::revocation::triggers::{self, Nodes};
use kube::runtime::events::EventType;
use time::OffsetDateTime;

use crate::controller::management::ApplyError;
use crate::controller::workload::issued::LookedAt;
use crate::controller::workload::worker::Worker;
use crate::controller::workload_access::config_map_data;
use crate::locks::lock;

/// The field manager of the record's and the list's entries.
pub const FIELD_MANAGER: &str = "node-attestation-signer-revocation";

/// How often the duty looks for a new revocation: a trigger is acted on within this, plus the
/// management watch's and the apiserver's own delays (SPEC: within 10 seconds).
pub const TICK: Duration = Duration::from_secs(1);

impl Worker {
    /// Records `certificate` (a Machine's or pool instance's, for `node`) in the workload
    /// cluster, before it is written to its CSR: a certificate is never issued unrecorded.
    pub(in crate::controller::workload) async fn record_issued(
        &self,
        certificate: &attestation::ca::IssuedCertificate,
        target: &TargetRef,
        node: &str,
        provider_id: &str,
    ) -> Result<(), ApplyError> {
        let entry = IssuedCertificate {
            id: CredentialId::of_certificate(&certificate.der),
            not_after: certificate.not_after.unix_timestamp(),
            kind: target.kind,
            target_uid: target.uid.clone(),
            target_name: target.name.clone(),
            node: node.to_owned(),
            provider_id: provider_id.to_owned(),
        };
        let shard = entry.id.shard();
        let (key, value) = (entry.key(), entry.value());
        if lock(&self.revocation).shard_bytes[shard] + key.len() + value.len() > SHARD_BYTES {
            return Err(ApplyError::Transient(format!(
                "the record of issued certificates (ConfigMap kube-system/{}) is full: a certificate is not issued unrecorded; it empties as certificates expire",
                record::shard_name(shard)
            )));
        }
        let name = record::shard_name(shard);
        let data = BTreeMap::from([(key.clone(), value.clone())]);
        match config_map_data::merge(&self.client, &name, &data, &[], FIELD_MANAGER, None).await {
            Ok(_) => {}
            // The signer's workload role predates revocation (an operator's kubeconfig whose
            // config/workload was not applied again): issuing unrecorded keeps nodes joining,
            // loudly; the certificate then expires on its own (docs/revocation.md).
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::warn!(
                    node,
                    "the certificate is issued unrecorded: the workload cluster refuses the signer its record ({}); apply config/workload there",
                    status.message
                );
                self.shared.metrics.certificate_unrecorded(&self.key);
                self.cluster_event(
                    EventType::Warning,
                    "CertificateUnrecorded",
                    &format!("the certificate of node {node} is issued without a record, so it cannot be revoked: the workload cluster refuses the signer ConfigMap kube-system/{name}; apply config/workload there (Role node-attestation-signer-revocation)"),
                );
                return Ok(());
            }
            Err(e) => return Err(write_error(&name, e)),
        }
        let mut state = lock(&self.revocation);
        state.shard_bytes[shard] += key.len() + value.len();
        if let Some(issued) = state.issued.as_mut() {
            issued.insert(entry.id, entry);
        }
        Ok(())
    }

    /// Sets `add` and removes `remove` in ConfigMap `name`'s data (creating it when missing),
    /// only at `version` when given; its new resourceVersion.
    async fn merge_data(
        &self,
        name: &str,
        add: &BTreeMap<String, String>,
        remove: &[String],
        version: Option<&str>,
    ) -> Result<Option<String>, ApplyError> {
        config_map_data::merge(&self.client, name, add, remove, FIELD_MANAGER, version)
            .await
            .map_err(|e| write_error(name, e))
    }

    /// Reads the record's sixteen shards into memory (merged with what was recorded since).
    async fn read_record(&self) -> Result<(), String> {
        let mut read = HashMap::new();
        let mut bytes = [0usize; 16];
        let mut unreadable = 0usize;
        for (shard, name) in record::shard_names().enumerate() {
            let data = match config_map_data::read(&self.client, &name).await {
                Ok(found) => found.map(|(data, _)| data).unwrap_or_default(),
                Err(e) => return Err(format!("cannot read ConfigMap kube-system/{name}: {e}")),
            };
            bytes[shard] = data.iter().map(|(k, v)| k.len() + v.len()).sum();
            let (entries, errors) = record::read_shard(&data);
            unreadable += errors.len();
            read.extend(entries.into_iter().map(|e| (e.id, e)));
        }
        if unreadable > 0 {
            tracing::warn!(
                unreadable,
                "entries of the record of issued certificates do not read: they are ignored (edited by hand?)"
            );
        }
        let mut state = lock(&self.revocation);
        let issued = state.issued.get_or_insert_with(HashMap::new);
        issued.extend(read);
        state.shard_bytes = bytes;
        Ok(())
    }

    /// Removes the record's expired entries, from the cluster's shards and from memory; a shard
    /// that cannot be written now is pruned at the next resync.
    async fn prune_record(&self) {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let expired: Vec<(usize, Vec<IssuedCertificate>)> = {
            let state = lock(&self.revocation);
            let Some(issued) = state.issued.as_ref() else { return };
            record::expired_by_shard(issued.values(), now)
                .into_iter()
                .map(|(shard, entries)| (shard, entries.into_iter().cloned().collect()))
                .collect()
        };
        for (shard, entries) in expired {
            let name = record::shard_name(shard);
            let keys: Vec<String> = entries.iter().map(IssuedCertificate::key).collect();
            if let Err(e) =
                config_map_data::merge(&self.client, &name, &BTreeMap::new(), &keys, FIELD_MANAGER, None).await
            {
                tracing::debug!(error = %e, "cannot prune the record's {name} now");
                continue;
            }
            let mut state = lock(&self.revocation);
            let freed: usize = entries.iter().map(|e| e.key().len() + e.value().len()).sum();
            state.shard_bytes[shard] = state.shard_bytes[shard].saturating_sub(freed);
            if let Some(issued) = state.issued.as_mut() {
                for e in &entries {
                    issued.remove(&e.id);
                }
            }
        }
    }

    /// Reads the revoked list; a missing one is created empty (the policy allows while it is
    /// missing, and says nothing).
    async fn read_list(&self) -> Result<(), String> {
        let name = revoked_list::NAME;
        match config_map_data::read(&self.client, name).await {
            Ok(Some((found, version))) => {
                let mut state = lock(&self.revocation);
                let before = state.listed.replace(found);
                state.listed_version = Some(version);
                if let (Some(before), Some(now)) = (before, state.listed.as_ref()) {
                    // Certificates the signer did not list: an operator's `revoke`, said here too.
                    let known: HashSet<CredentialId> = revoked_list::listed_certificates(&before)
                        .into_iter()
                        .map(|l| l.id)
                        .collect();
                    for l in revoked_list::listed_certificates(now)
                        .into_iter()
                        .filter(|l| !known.contains(&l.id))
                    {
                        tracing::info!(credential_id = %l.id, why = %l.why, "revoked list: a certificate listed by another (an operator's revoke)");
                    }
                }
                state.missing_reported = false;
                self.shared.metrics.revocation_list_missing(&self.key, false);
                Ok(())
            }
            Ok(None) => {
                if !std::mem::replace(&mut lock(&self.revocation).missing_reported, true) {
                    tracing::warn!(
                        "ConfigMap kube-system/{name} is missing: nothing revoked is refused until it is back; the signer creates it"
                    );
                    self.cluster_event(
                        EventType::Warning,
                        "RevocationListMissing",
                        &format!("ConfigMap kube-system/{name} of the workload cluster is missing: its admission policy refuses no revoked certificate until the signer has created it again"),
                    );
                }
                self.shared.metrics.revocation_list_missing(&self.key, true);
                let version = self
                    .merge_data(name, &BTreeMap::new(), &[], None)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut state = lock(&self.revocation);
                state.listed = Some(BTreeMap::new());
                state.listed_version = version;
                self.shared.metrics.revocation_list_missing(&self.key, false);
                Ok(())
            }
            Err(e) => Err(format!("cannot read ConfigMap kube-system/{name}: {e}")),
        }
    }

    /// Runs until the worker stops.
    pub(in crate::controller::workload) async fn revocation_loop(self: Arc<Self>) {
        let mut record_read = false;
        let mut last_read: Option<Instant> = None;
        let mut warned_full = false;
        loop {
            tokio::time::sleep(TICK).await;
            if self.served_cluster().is_none() {
                continue;
            }
            // The record once (this worker adds what it issues), until it could be read.
            if !record_read {
                match self.read_record().await {
                    Ok(()) => record_read = true,
                    Err(why) => {
                        tracing::debug!(%why, "revocation: cannot read the record yet");
                        continue;
                    }
                }
            }
            // The list at the start and every resync (an operator's entries, an edit by hand),
            // and the record's expired entries pruned as often.
            if last_read.is_none_or(|at| at.elapsed() >= self.shared.settings.resync) {
                if let Err(why) = self.read_list().await {
                    tracing::debug!(%why, "revocation: cannot read the revoked list yet");
                    continue;
                }
                last_read = Some(Instant::now());
                self.prune_record().await;
            }
            let Some(change) = self.revocation_change() else {
                continue;
            };
            if change.left_out > 0 && !std::mem::replace(&mut warned_full, true) {
                tracing::error!(
                    left_out = change.left_out,
                    "the revoked list (kube-system/{}) is full: revocations are left out until entries expire",
                    revoked_list::NAME
                );
                self.cluster_event(EventType::Warning, "RevocationListFull", &format!("{} revocations are left out: the list kube-system/{} is full until entries expire; shorten --client-cert-duration", change.left_out, revoked_list::NAME));
            }
            if change.is_empty() {
                continue;
            }
            let version = lock(&self.revocation).listed_version.clone();
            match self
                .merge_data(revoked_list::NAME, &change.set, &change.remove, version.as_deref())
                .await
            {
                Ok(version) => self.listed_changed(&change, version),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the revoked list");
                    // Read again next tick (it may have changed under us), and look again.
                    last_read = None;
                    lock(&self.revocation).looked_at = None;
                }
            }
        }
    }

    /// The list's change now, when the Cluster's objects, its Nodes' index, its apiserver's
    /// minor, the record and the list are all known.
    fn revocation_change(&self) -> Option<ListChange> {
        let cluster = self.served_cluster()?;
        let inventory = self.shared.management.inventory(&cluster)?;
        let version = self.apiserver_version()?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let generation = self.nodes.generation();
        let mut state = lock(&self.revocation);
        let looked_at = LookedAt {
            inventory: Arc::as_ptr(&inventory) as usize,
            nodes: generation,
            issued: state.issued.as_ref()?.len(),
            listed_version: state.listed_version.clone(),
            by_id: version.has_credential_id(),
            minute: now / 60,
        };
        // Nothing it depends on changed since the last look: nothing new can be revoked (a
        // written change moves the list's version, so a look follows every write).
        if state.looked_at.as_ref() == Some(&looked_at) {
            return None;
        }
        state.looked_at = Some(looked_at);
        let names: Option<HashSet<String>> = generation
            .and_then(|_| self.nodes.all().ok())
            .map(|nodes| nodes.into_iter().map(|n| n.name).collect());
        let nodes = names.as_ref().map_or(Nodes::Unknown, Nodes::Listed);
        let issued = state.issued.as_ref()?;
        let listed = state.listed.as_ref()?;
        let revoked = triggers::revoked(issued.values(), &inventory, nodes, now);
        let live = triggers::live_node_names(&inventory);
        // The same look tells when the first live node loses its identity without a renewal.
        let revoked_ids: HashSet<CredentialId> = revoked.iter().map(|r| r.certificate.id).collect();
        let deadline = identity_expiry::earliest_identity_expiry(issued.values(), &revoked_ids, &live, now);
        self.shared.metrics.identities_earliest_expiry(&self.key, deadline);
        Some(revoked_list::change(
            listed,
            &revoked,
            !version.has_credential_id(),
            &live,
            now,
        ))
    }

    /// Takes a written change into memory and reports each new revocation.
    fn listed_changed(&self, change: &ListChange, version: Option<String>) {
        let mut state = lock(&self.revocation);
        // The record's entries of the certificates newly listed, for the report.
        let revoked: Vec<(IssuedCertificate, attestation::revocation::RevokeReason)> = change
            .added
            .iter()
            .filter_map(|added| {
                let c = state.issued.as_ref()?.get(&added.id)?;
                Some((c.clone(), added.why))
            })
            .collect();
        state.listed_version = version;
        let listed = state.listed.get_or_insert_with(BTreeMap::new);
        for key in &change.remove {
            listed.remove(key);
        }
        listed.extend(change.set.clone());
        let total = revoked_list::listed_certificates(listed).len() + revoked_list::listed_nodes(listed).len();
        drop(state);
        self.shared.metrics.revoked_listed(&self.key, total);
        for node in &change.added_nodes {
            tracing::info!(%node, "revoked by node name (the workload apiserver names no credential ID)");
        }
        for (c, why) in &revoked {
            self.shared.metrics.certificate_revoked(&self.key, why.as_str());
            let kind = match c.kind {
                TargetKind::Machine => "Machine",
                TargetKind::MachinePool => "MachinePool",
            };
            tracing::info!(node = %c.node, credential_id = %c.id, %why, "revoked the certificate of {kind} {}", c.target_name);
            self.cluster_event(
                EventType::Normal,
                "CertificateRevoked",
                &format!(
                    "the certificate {} of node {} ({kind} {}, provider ID {}) is revoked ({why}): the workload apiserver refuses its writes until it would have expired",
                    c.id.user_extra(),
                    c.node,
                    c.target_name,
                    c.provider_id
                ),
            );
        }
    }
}

fn write_error(name: &str, error: kube::Error) -> ApplyError {
    match error {
        kube::Error::Api(status) if status.code == 403 => ApplyError::Transient(format!(
            "the workload cluster refused the signer ConfigMap kube-system/{name} ({}): apply config/workload (Role node-attestation-signer-revocation)",
            status.message
        )),
        kube::Error::Api(status) if status.code == 429 || status.code >= 500 => {
            ApplyError::Overloaded(format!("ConfigMap kube-system/{name}: {}", status.message))
        }
        e => ApplyError::Transient(format!("ConfigMap kube-system/{name}: {e}")),
    }
}
