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
//! So each CSR the cache holds costs its metadata and at most 64 KiB of request (576 KiB for
//! `tpm/v1`, whose phase 1 carries the event log) while it waits for a decision; a flood of
//! junk under the signer's names is denied (and then costs its metadata) at the rate the queue
//! drains. docs/decisions.md says why there is no count cap: a CSR left out of the cache is a
//! join lost, or one read again from the apiserver for every other CSR that names it.

use std::collections::BTreeMap;

use attestation::envelope::withheld_request;
use attestation::names::{
    ANNOTATION_AZURE_CHALLENGE, ANNOTATION_TPM_CHALLENGE, MAX_REQUEST_BYTES, MAX_TPM_REQUEST_BYTES, SIGNER_TPM,
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
pub(super) fn admit(
    event: Result<watcher::Event<CertificateSigningRequest>, watcher::Error>,
    withheld: &dyn Fn(&'static str),
) -> Option<Result<watcher::Event<CertificateSigningRequest>, watcher::Error>> {
    match event {
        Ok(watcher::Event::Apply(mut csr)) => {
            slim(&mut csr, withheld)?;
            Some(Ok(watcher::Event::Apply(csr)))
        }
        Ok(watcher::Event::InitApply(mut csr)) => {
            slim(&mut csr, withheld)?;
            Some(Ok(watcher::Event::InitApply(csr)))
        }
        other => Some(other),
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
        let event = admit(
            Ok(watcher::Event::InitApply(with_request("example.com/unrelated", 10))),
            &|_| {},
        );
        assert!(event.is_none(), "dropped as it is decoded");
        let deleted = admit(
            Ok(watcher::Event::Delete(with_request("example.com/unrelated", 10))),
            &|_| {},
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
