//! Watching and queueing: the workload cluster's CSRs through a watch cache, every one that
//! still needs this signer queued (at once, and again every `--resync-period`), and the queue
//! taken one CSR per task, within this cluster's and the fleet's limits.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::resumed::{Next, Resumption};
use super::worker::{FINISHED_MEMORY, Worker, needs_us};
use crate::controller::backoff::Backoff;
use crate::controller::metrics::ClusterState;
use crate::csr_object::{Stage, stage};
use crate::locks::lock;

impl Worker {
    pub(super) async fn watch(&self) {
        let Some(writer) = lock(&self.writer).take() else {
            return;
        };
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default())
            .modify(slim)
            .reflect(writer)
            .boxed();
        let mut backoff = Backoff::default();
        // A list's objects reach the store only at its end (the reflector swaps the whole list
        // in at InitDone): names queued earlier were taken while the store did not hold them
        // yet, and so left for the next resync (30 s after every restart or hand-over).
        let mut listed: Vec<String> = Vec::new();
        // A watch started again after a failure says nothing when it works (super::resumed).
        let mut resumption = Resumption::default();
        loop {
            let event = match resumption.next(&mut events).await {
                Next::Event(event) => event,
                Next::UpAgain => {
                    backoff.reset();
                    self.watch_up();
                    continue;
                }
                Next::Ended => break,
            };
            if let Ok(event) = &event
                && resumption.up_on(event)
            {
                if matches!(event, watcher::Event::InitDone) {
                    for name in listed.drain(..) {
                        self.enqueue(&name);
                    }
                }
                backoff.reset();
                self.watch_up();
            }
            match event {
                Ok(watcher::Event::Apply(csr)) => {
                    if needs_us(&csr) {
                        self.enqueue(&csr.name_any());
                    }
                }
                Ok(watcher::Event::InitApply(csr)) => {
                    if needs_us(&csr) {
                        listed.push(csr.name_any());
                    }
                }
                Ok(watcher::Event::Delete(csr)) => {
                    if let Some(uid) = csr.uid() {
                        lock(&self.first_seen).remove(&uid);
                        lock(&self.attempts).remove(&uid);
                        lock(&self.finished).remove(&uid);
                    }
                }
                Ok(watcher::Event::InitDone) => {}
                Ok(watcher::Event::Init) => listed.clear(),
                Err(e) => {
                    self.csr_watch_up.store(false, Ordering::Relaxed);
                    if self.set_state(ClusterState::Unreachable) {
                        tracing::warn!(error = %e, "workload apiserver unreachable; retrying with backoff");
                    }
                    backoff.wait().await;
                    resumption.retrying();
                }
            }
        }
    }

    /// The CSR watch is up (listed, or started again after a failure): the cluster is `Ready`.
    pub(super) fn watch_up(&self) {
        self.csr_watch_up.store(true, Ordering::Relaxed);
        if self.set_state(ClusterState::Ready) {
            tracing::info!("watching CSRs of the workload cluster");
            self.nodes.retry_now();
        }
    }

    /// Every `--resync-period`, and whenever the queue drained after dropping names (a
    /// scale-up larger than `--queue-capacity`), queues the watch cache's undecided CSRs again.
    pub(super) async fn resync_loop(self: Arc<Self>) {
        let mut next = tokio::time::Instant::now() + self.shared.settings.resync;
        loop {
            let periodic = tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    next += self.shared.settings.resync;
                    true
                }
                () = self.queue.refill_wanted() => false,
            };
            let pending: Vec<_> = self.csrs.state().into_iter().filter(|c| needs_us(c)).collect();
            if periodic {
                let live: std::collections::HashSet<String> = pending.iter().filter_map(|c| c.uid()).collect();
                lock(&self.first_seen).retain(|uid, _| live.contains(uid));
                lock(&self.attempts).retain(|uid, _| live.contains(uid));
                lock(&self.finished).retain(|uid, at| live.contains(uid) && at.elapsed() < FINISHED_MEMORY);
            }
            for csr in pending {
                self.enqueue(&csr.name_any());
            }
        }
    }

    /// Takes CSR names from the queue and works on each in its own task, once this cluster
    /// is under `--concurrency-per-cluster` and the fleet has a slot. An idle cluster costs
    /// this one task; a busy one waits for at most one slot at a time, so the fleet's slots go
    /// round the busy clusters whatever their queue lengths.
    pub(super) async fn dispatch_loop(self: Arc<Self>) {
        let per_cluster = Arc::new(Semaphore::new(self.shared.settings.concurrency.max(1)));
        let mut running = tokio::task::JoinSet::new();
        while let Some(name) = self.queue.pop().await {
            let Ok(own) = Arc::clone(&per_cluster).acquire_owned().await else {
                break;
            };
            let mut slot = self.shared.in_flight.acquire(&self.turn).await;
            let worker = Arc::clone(&self);
            running.spawn(
                async move {
                    let span = tracing::info_span!("csr", csr = %name, machine = tracing::field::Empty);
                    let answer = worker.process(&name).instrument(span).await;
                    slot.answer(answer);
                    drop(slot);
                    drop(own);
                    worker.queue.done(&name);
                }
                .in_current_span(),
            );
            while running.try_join_next().is_some() {}
        }
    }
}

/// What the watch cache keeps of a CSR. A decided CSR is only ever looked at for its stage,
/// names and annotations (a TPM CSR #1 that is finished fails phase 2 before its request is
/// read), so its request is dropped: 5,000 junk CSRs denied in a flood then cost their
/// metadata, not their payloads, until kube-controller-manager's cleaner deletes them. An issued
/// certificate becomes [`ISSUED`]: a certificate is what makes an issued CSR finished
/// ([`stage`]), and without one the CSR would look approved and unsigned and be signed again
/// (refused by the apiserver, forever); nothing reads the certificate itself from the cache.
pub(super) fn slim(csr: &mut CertificateSigningRequest) {
    csr.managed_fields_mut().clear();
    if stage(csr) == Stage::Done {
        csr.spec.request = k8s_openapi::ByteString(Vec::new());
        if let Some(certificate) = csr.status.as_mut().and_then(|s| s.certificate.as_mut()) {
            *certificate = k8s_openapi::ByteString(ISSUED.to_vec());
        }
    }
}

/// What the watch cache keeps of an issued certificate (about 1 KiB of PEM otherwise).
const ISSUED: &[u8] = b"issued";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::workload::apply::tests::csr;

    #[test]
    fn the_watch_cache_drops_what_a_finished_csr_no_longer_needs_and_keeps_it_finished() {
        use attestation::names::SIGNER_INSECURE;
        let mut issued = csr(SIGNER_INSECURE, &["Approved"], true);
        issued.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut issued);
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
        slim(&mut denied);
        assert!(denied.spec.request.0.is_empty());
        assert!(!needs_us(&denied));

        let mut approved = csr(SIGNER_INSECURE, &["Approved"], false);
        approved.spec.request = k8s_openapi::ByteString(b"request".to_vec());
        slim(&mut approved);
        assert_eq!(
            approved.spec.request.0, b"request",
            "an approved, unsigned CSR is still to sign"
        );
    }
}
