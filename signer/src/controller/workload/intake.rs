//! What the watch cache keeps of a workload cluster's CSRs (SPEC section 7, "A hostile workload
//! cluster"). Anyone holding a bootstrap token, and every node, can file CSRs of any signer
//! name, each up to etcd's object limit (the apiserver reads only the request's first PEM
//! block), and pending CSRs stay until kube-controller-manager's cleaner removes them a day
//! later. Kept whole, 400 of a megabyte cost the signer 410 MiB, and a signer started over them
//! decoded a 500-object page of 560 MB: an out-of-memory kill on every start. So:
//!
//! - The list is read in pages of [`CSR_PAGE`] objects: one page of the largest CSRs etcd
//!   stores is about 8 MiB, not hundreds.
//! - Only CSRs of the names the signer reads reach the cache ([`Kept`]): its own signer names
//!   (which it decides) and kubeadm's kubelet name (whose pending CSRs it reports). Any other
//!   signer name is dropped as it is decoded.
//! - Of those, only what the rules and the reports read is kept ([`slim`]): no managed fields;
//!   annotations and labels as they are up to [`MAX_KEPT_METADATA`] bytes (the signer writes
//!   an approval from the cached object, and the apiserver keeps the metadata it is sent),
//!   past it only the two challenges the signer itself writes, each up to
//!   [`MAX_CHALLENGE_ANNOTATION`] bytes (a longer one is forged, and is kept as a value that
//!   fails its MAC); a request larger than its signer name allows (SPEC rule 1) replaced by
//!   [`attestation::envelope::withheld_request`], which the rule engine denies as too large
//!   naming its real size; kubeadm's CSRs without their request; a decided CSR without its
//!   request and with a stand-in certificate.
//!
//! - The requests held of a cluster's pending CSRs are capped ([`RequestBudget`],
//!   `--csr-request-bytes-per-cluster`, 32 MiB by default). Past the cap a pending CSR is held
//!   without its request ([`DEFERRED`]) and read from the apiserver when it is decided: a
//!   flood past the cap costs a read per CSR, never a lost join. A CSR carrying a challenge is
//!   held whole past the cap (a phase-2 CSR reads its first phase from the cache; the verifier
//!   bounds real challenges per Machine, and a forged one is denied at once).
//!
//! So a cluster's CSRs cost the cache their metadata and at most the cap of requests; junk of
//! the signer's names is denied (and then costs its metadata) at the rate the queue drains.

use std::collections::{BTreeMap, HashMap};

use attestation::envelope::withheld_request;
use attestation::names::{
    ANNOTATION_AZURE_CHALLENGE, ANNOTATION_TPM_CHALLENGE, MAX_REQUEST_BYTES, MAX_TPM_REQUEST_BYTES, SIGNER_AZURE,
    SIGNER_TPM,
};
use attestation::outside_attestation::LEGACY_KUBELET_SIGNER;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::ResourceExt;
use kube::runtime::watcher;

use crate::csr_object::{Stage, stage};

/// Objects per page of the CSR list: etcd stores objects of up to about 1.5 MiB, so a page
/// costs at most about 8 MiB of JSON while it is decoded. kube-controller-manager's cleaner
/// keeps a cluster's CSRs to about a day's (an hour's once decided): a few pages.
pub(super) const CSR_PAGE: u32 = 5;

/// The largest challenge annotation kept: the signer's own are under 4 KiB.
pub(super) const MAX_CHALLENGE_ANNOTATION: usize = 16 * 1024;

/// Annotations and labels kept as they are up to this many bytes (a CSR of the plugin carries
/// one challenge, some tools a few small annotations); past it, only the challenges.
pub(super) const MAX_KEPT_METADATA: usize = 16 * 1024;

/// What the cache keeps in place of a request past the cluster's cap: the CSR is read from the
/// apiserver when it is decided ([`deferred`]). A NUL starts it, which no PEM text holds.
pub(super) const DEFERRED: &[u8] = b"\0deferred: read this CSR from the apiserver\n";

/// Whether the cache holds `csr` without its request, to be read from the apiserver.
pub(super) fn deferred(csr: &CertificateSigningRequest) -> bool {
    csr.spec.request.0 == DEFERRED
}

/// The request bytes the cache holds of one cluster's pending CSRs, by UID, and their cap.
#[derive(Debug, Default)]
pub(super) struct RequestBudget {
    limit: usize,
    held: HashMap<String, usize>,
    total: usize,
}

impl RequestBudget {
    /// A budget of `limit` bytes.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Whether `uid`'s request of `len` bytes may be held: it is already, it fits, or it
    /// carries a challenge.
    fn admit(&mut self, uid: &str, len: usize, challenged: bool) -> bool {
        if let Some(held) = self.held.get_mut(uid) {
            self.total = self.total - *held + len;
            *held = len;
            return true;
        }
        if !challenged && self.total + len > self.limit {
            return false;
        }
        self.held.insert(uid.to_owned(), len);
        self.total += len;
        true
    }

    /// `uid` decided or gone: its request is no longer held.
    fn release(&mut self, uid: &str) {
        if let Some(len) = self.held.remove(uid) {
            self.total -= len;
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(super) fn total(&self) -> usize {
        self.total
    }
}

/// What the cache keeps a CSR for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// One of the signer's names: decided here. The most its request may be.
    Ours { max_request: usize },
    /// kubeadm's kubelet name: its pending CSRs are reported, nothing more.
    Legacy,
}

/// Whether, and why, the cache keeps CSRs of `signer_name`.
pub(super) fn kept(signer_name: &str) -> Option<Kept> {
    if signer_name == LEGACY_KUBELET_SIGNER {
        return Some(Kept::Legacy);
    }
    attestation::rules::classify(signer_name)?;
    let max_request = if signer_name == SIGNER_TPM {
        MAX_TPM_REQUEST_BYTES
    } else {
        MAX_REQUEST_BYTES
    };
    Some(Kept::Ours { max_request })
}

/// A watch event as the cache takes it: `None` for a CSR of a name it does not keep, the CSR
/// slimmed otherwise. Deletions and the list's markers pass (a deletion of a CSR the cache
/// never held changes nothing).
/// `withheld` is told what was withheld of a CSR (`request`, `metadata`), for the metrics.
/// `budget` holds the cluster's requests under its cap.
pub(super) fn admit(
    event: Result<watcher::Event<CertificateSigningRequest>, watcher::Error>,
    withheld: &dyn Fn(&'static str),
    budget: &mut RequestBudget,
) -> Option<Result<watcher::Event<CertificateSigningRequest>, watcher::Error>> {
    match event {
        Ok(watcher::Event::Apply(mut csr)) => {
            slim(&mut csr, withheld)?;
            within(&mut csr, budget);
            Some(Ok(watcher::Event::Apply(csr)))
        }
        Ok(watcher::Event::InitApply(mut csr)) => {
            slim(&mut csr, withheld)?;
            within(&mut csr, budget);
            Some(Ok(watcher::Event::InitApply(csr)))
        }
        Ok(watcher::Event::Delete(csr)) => {
            budget.release(csr.uid().as_deref().unwrap_or_default());
            Some(Ok(watcher::Event::Delete(csr)))
        }
        Ok(watcher::Event::Init) => {
            // A new list replaces what is held.
            *budget = RequestBudget::new(budget.limit);
            Some(Ok(watcher::Event::Init))
        }
        other => Some(other),
    }
}

/// A slimmed CSR's request held under `budget`, or deferred past it.
fn within(csr: &mut CertificateSigningRequest, budget: &mut RequestBudget) {
    let uid = csr.uid().unwrap_or_default();
    let len = csr.spec.request.0.len();
    if len == 0 || stage(csr) == Stage::Done || attestation::envelope::withheld_size(&csr.spec.request.0).is_some() {
        budget.release(&uid);
        return;
    }
    // The challenge of the signer name that challenges (a requester may write either
    // annotation; a forged one is denied ChallengeFailed at once, and another name's is not read).
    let challenge = match csr.spec.signer_name.as_str() {
        SIGNER_TPM => Some(ANNOTATION_TPM_CHALLENGE),
        SIGNER_AZURE => Some(ANNOTATION_AZURE_CHALLENGE),
        _ => None,
    };
    let challenged = challenge.is_some_and(|k| csr.annotations().contains_key(k));
    if !budget.admit(&uid, len, challenged) {
        csr.spec.request = k8s_openapi::ByteString(DEFERRED.to_vec());
    }
}

/// Slims `csr` to what the signer reads of it; `None` when the cache does not keep it.
pub(super) fn slim(csr: &mut CertificateSigningRequest, withheld: &dyn Fn(&'static str)) -> Option<()> {
    let kept = kept(&csr.spec.signer_name)?;
    csr.managed_fields_mut().clear();
    let metadata_bytes: usize = csr
        .annotations()
        .iter()
        .chain(csr.labels().iter())
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if kept != Kept::Legacy && metadata_bytes > MAX_KEPT_METADATA && stage(csr) != Stage::Done {
        withheld("metadata");
    }
    if kept == Kept::Legacy || metadata_bytes > MAX_KEPT_METADATA {
        // Written back (an approval carries the cached object's metadata), a hostile CSR
        // keeps only what the signer reads of it.
        csr.labels_mut().clear();
        let annotations = std::mem::take(csr.annotations_mut());
        *csr.annotations_mut() = challenges(annotations);
    }
    if kept == Kept::Legacy {
        csr.annotations_mut().clear();
        csr.spec.request = k8s_openapi::ByteString(Vec::new());
        if let Some(certificate) = csr.status.as_mut().and_then(|s| s.certificate.as_mut()) {
            *certificate = k8s_openapi::ByteString(ISSUED.to_vec());
        }
        return Some(());
    }
    if stage(csr) == Stage::Done {
        csr.spec.request = k8s_openapi::ByteString(Vec::new());
        if let Some(certificate) = csr.status.as_mut().and_then(|s| s.certificate.as_mut()) {
            *certificate = k8s_openapi::ByteString(ISSUED.to_vec());
        }
        return Some(());
    }
    if let Kept::Ours { max_request } = kept
        && csr.spec.request.0.len() > max_request
    {
        let len = csr.spec.request.0.len();
        csr.spec.request = k8s_openapi::ByteString(withheld_request(len, max_request));
        withheld("request");
    }
    Some(())
}

/// The challenge annotations of `annotations`, a too long one replaced by a value that is not
/// a challenge (so it still counts as forged).
fn challenges(mut annotations: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut kept = BTreeMap::new();
    for key in [ANNOTATION_TPM_CHALLENGE, ANNOTATION_AZURE_CHALLENGE] {
        if let Some((key, value)) = annotations.remove_entry(key) {
            let value = if value.len() > MAX_CHALLENGE_ANNOTATION {
                format!("withheld: {} bytes, longer than any challenge", value.len())
            } else {
                value
            };
            kept.insert(key, value);
        }
    }
    kept
}

/// What the watch cache keeps of an issued certificate (about 1 KiB of PEM otherwise): a
/// certificate is what makes an issued CSR finished ([`stage`]), and without one the CSR would
/// look approved and unsigned and be signed again (refused by the apiserver, forever); nothing
/// reads the certificate itself from the cache.
const ISSUED: &[u8] = b"issued";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::workload::apply::tests::csr;
    use crate::controller::workload::worker::needs_us;
    use attestation::names::{SIGNER_GCP, SIGNER_INSECURE};

    fn with_request(signer: &str, len: usize) -> CertificateSigningRequest {
        let mut csr = csr(signer, &[], false);
        csr.spec.request = k8s_openapi::ByteString(vec![b'A'; len]);
        csr
    }

    #[test]
    fn a_finished_csr_keeps_its_stage_and_loses_its_payload() {
        let mut issued = csr(SIGNER_INSECURE, &["Approved"], true);
        issued.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut issued, &|_| {}).unwrap();
        assert!(issued.spec.request.0.is_empty());
        assert_eq!(
            issued
                .status
                .as_ref()
                .and_then(|s| s.certificate.as_ref())
                .map(|c| c.0.as_slice()),
            Some(ISSUED)
        );
        assert_eq!(stage(&issued), Stage::Done, "still finished: never signed again");
        assert!(!needs_us(&issued));

        let mut denied = csr(SIGNER_INSECURE, &["Denied"], false);
        denied.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut denied, &|_| {}).unwrap();
        assert!(denied.spec.request.0.is_empty());
        assert!(!needs_us(&denied));

        let mut approved = csr(SIGNER_INSECURE, &["Approved"], false);
        approved.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut approved, &|_| {}).unwrap();
        assert_eq!(
            approved.spec.request.0, b"request",
            "an approved, unsigned CSR is still to sign"
        );
    }

    #[test]
    fn other_signer_names_are_not_kept_and_kubeadms_lose_their_request() {
        let mut unrelated = with_request("example.com/unrelated", 1 << 20);
        assert_eq!(slim(&mut unrelated, &|_| {}), None);
        let mut budget = RequestBudget::new(1 << 20);
        let event = admit(
            Ok(watcher::Event::InitApply(with_request("example.com/unrelated", 10))),
            &|_| {},
            &mut budget,
        );
        assert!(event.is_none(), "dropped as it is decoded");
        let deleted = admit(
            Ok(watcher::Event::Delete(with_request("example.com/unrelated", 10))),
            &|_| {},
            &mut budget,
        );
        assert!(matches!(deleted, Some(Ok(watcher::Event::Delete(_)))), "deletions pass");

        let mut legacy = with_request(LEGACY_KUBELET_SIGNER, 1 << 20);
        legacy.annotations_mut().insert("junk".into(), "x".repeat(200_000));
        slim(&mut legacy, &|_| {}).unwrap();
        assert!(legacy.spec.request.0.is_empty());
        assert!(legacy.annotations().is_empty());
        assert_eq!(stage(&legacy), Stage::Pending, "still reported as pending");
    }

    #[test]
    fn a_request_larger_than_its_signer_allows_is_withheld_and_refused_naming_its_size() {
        let told = std::cell::RefCell::new(Vec::new());
        let mut big = with_request(SIGNER_GCP, MAX_REQUEST_BYTES + 1);
        slim(&mut big, &|what| told.borrow_mut().push(what)).unwrap();
        assert_eq!(*told.borrow(), ["request"], "counted for the metrics");
        assert!(big.spec.request.0.len() < 64);
        assert!(needs_us(&big), "still decided: denied for its size");
        assert_eq!(
            attestation::envelope::RequestEnvelope::parse(&big.spec.request.0),
            Err(attestation::envelope::EnvelopeError::TooLarge {
                len: MAX_REQUEST_BYTES + 1,
                limit: MAX_REQUEST_BYTES
            })
        );
        // tpm/v1 may carry its event log: 576 KiB are kept, one byte more is not.
        let mut tpm = with_request(SIGNER_TPM, MAX_TPM_REQUEST_BYTES);
        slim(&mut tpm, &|_| {}).unwrap();
        assert_eq!(tpm.spec.request.0.len(), MAX_TPM_REQUEST_BYTES);
        let mut tpm = with_request(SIGNER_TPM, MAX_TPM_REQUEST_BYTES + 1);
        slim(&mut tpm, &|_| {}).unwrap();
        assert!(tpm.spec.request.0.len() < 64);
        let mut small = with_request(SIGNER_GCP, MAX_REQUEST_BYTES);
        slim(&mut small, &|_| {}).unwrap();
        assert_eq!(small.spec.request.0.len(), MAX_REQUEST_BYTES);
    }

    fn named(mut csr: CertificateSigningRequest, uid: &str) -> CertificateSigningRequest {
        csr.metadata.uid = Some(uid.into());
        csr
    }

    #[test]
    fn requests_past_the_clusters_cap_are_deferred_and_a_challenge_is_held_whole() {
        let mut budget = RequestBudget::new(100);
        let apply = |csr, budget: &mut RequestBudget| match admit(Ok(watcher::Event::Apply(csr)), &|_| {}, budget) {
            Some(Ok(watcher::Event::Apply(csr))) => csr,
            other => panic!("{other:?}"),
        };
        let first = apply(named(with_request(SIGNER_GCP, 60), "a"), &mut budget);
        assert_eq!(first.spec.request.0.len(), 60);
        let second = apply(named(with_request(SIGNER_GCP, 60), "b"), &mut budget);
        assert!(deferred(&second), "past the cap: read when decided");
        assert_eq!(budget.total(), 60);
        // The same CSR again (an update) keeps its place.
        assert_eq!(
            apply(named(with_request(SIGNER_GCP, 60), "a"), &mut budget)
                .spec
                .request
                .0
                .len(),
            60
        );
        // A challenged CSR is held whole past the cap.
        let mut challenged = named(with_request(SIGNER_TPM, 60), "c");
        challenged
            .annotations_mut()
            .insert(ANNOTATION_TPM_CHALLENGE.into(), "{}".into());
        assert_eq!(apply(challenged, &mut budget).spec.request.0.len(), 60);
        // Another signer name's challenge annotation is not read: still past the cap.
        let mut posing = named(with_request(SIGNER_GCP, 60), "e");
        posing
            .annotations_mut()
            .insert(ANNOTATION_TPM_CHALLENGE.into(), "{}".into());
        assert!(deferred(&apply(posing, &mut budget)));
        // Decided or deleted, a request leaves the budget, and the next fits.
        let mut decided = named(csr(SIGNER_GCP, &["Denied"], false), "a");
        decided.spec.request = k8s_openapi::ByteString(vec![b'A'; 60]);
        apply(decided, &mut budget);
        assert_eq!(budget.total(), 60);
        admit(
            Ok(watcher::Event::Delete(named(with_request(SIGNER_TPM, 60), "c"))),
            &|_| {},
            &mut budget,
        );
        assert_eq!(budget.total(), 0);
        assert_eq!(
            apply(named(with_request(SIGNER_GCP, 60), "b"), &mut budget)
                .spec
                .request
                .0
                .len(),
            60
        );
        // A withheld (oversized) request holds nothing.
        let big = apply(named(with_request(SIGNER_GCP, MAX_REQUEST_BYTES + 1), "d"), &mut budget);
        assert!(!deferred(&big));
        assert_eq!(budget.total(), 60);
    }

    #[test]
    fn small_metadata_is_kept_as_it_is() {
        let mut csr = with_request(SIGNER_TPM, 10);
        csr.annotations_mut().insert("example.com/note".into(), "hello".into());
        csr.labels_mut().insert("l".into(), "v".into());
        slim(&mut csr, &|_| {}).unwrap();
        assert_eq!(csr.annotations()["example.com/note"], "hello");
        assert_eq!(csr.labels()["l"], "v");
    }

    #[test]
    fn only_the_challenge_annotations_are_kept_and_a_huge_one_stays_forged() {
        let mut csr = with_request(SIGNER_TPM, 10);
        let annotations = csr.annotations_mut();
        annotations.insert("junk".into(), "x".repeat(200_000));
        annotations.insert(ANNOTATION_TPM_CHALLENGE.into(), "{\"issuedAt\":\"...\"}".into());
        annotations.insert(
            ANNOTATION_AZURE_CHALLENGE.into(),
            "y".repeat(MAX_CHALLENGE_ANNOTATION + 1),
        );
        csr.labels_mut().insert("l".into(), "v".into());
        slim(&mut csr, &|_| {}).unwrap();
        let kept = csr.annotations();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[ANNOTATION_TPM_CHALLENGE], "{\"issuedAt\":\"...\"}");
        assert!(kept[ANNOTATION_AZURE_CHALLENGE].starts_with("withheld: "));
        assert!(csr.labels().is_empty());
    }
}
