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

use super::intake;
use super::resumed::{Next, Resumption};
use super::worker::{FINISHED_MEMORY, Worker, needs_us};
use crate::controller::backoff::Backoff;
use crate::controller::metrics::ClusterState;
use crate::locks::lock;

impl Worker {
    pub(super) async fn watch(&self) {
        let Some(writer) = lock(&self.writer).take() else {
            return;
        };
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        // Paged small, and only what the signer reads kept (super::intake): a hostile workload
        // cluster's CSRs cost bounded memory from the first list on.
        let config = watcher::Config::default().page_size(intake::CSR_PAGE);
        let metrics = self.shared.metrics.clone();
        let key = self.key.clone();
        let withheld = move |what: &'static str| metrics.csr_withheld(&key, what);
        let budget = Arc::clone(&self.request_budget);
        let mut events = watcher(api, config)
            .filter_map(move |event| std::future::ready(intake::admit(event, &withheld, &mut lock(&budget))))
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
