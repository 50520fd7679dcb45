//! Per-cluster work queues: bounded, deduplicating, with delayed retries.
//!
//! A queue holds CSR names, not CSRs: the worker reads the current object from its watch cache
//! when it takes a name, so a dropped or repeated name costs nothing but a look. That is what
//! makes the bound safe: a full queue drops the name (and counts it), and the watch cache's
//! undecided CSRs are queued again once the queue has drained to half ([`WorkQueue::refill_wanted`]),
//! and at every periodic resync. Without the early refill, a scale-up of more CSRs at once than
//! the queue holds left the rest waiting a whole resync period (30 s by default) while the
//! queue stood empty (`signer-load --csrs 2000`: 30.5 s to the last certificate).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued.
    Added,
    /// Already waiting.
    AlreadyQueued,
    /// The queue is full; the next resync brings it back.
    Dropped,
}

#[derive(Debug, Default)]
struct Inner {
    order: VecDeque<String>,
    queued: HashSet<String>,
    /// Taken by a worker and not yet done: never handed to a second worker at once.
    processing: HashSet<String>,
    /// Pushed while processing: queued again when done.
    dirty: HashSet<String>,
    /// A name was dropped since the last refill was asked for.
    dropped: bool,
    closed: bool,
}

/// A bounded set of CSR names in arrival order.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    inner: Arc<Mutex<Inner>>,
    notify: Arc<Notify>,
    /// Woken once the queue drained to half after dropping names.
    refill: Arc<Notify>,
    capacity: usize,
}

impl WorkQueue {
    /// A queue holding at most `capacity` names.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::default(),
            notify: Arc::new(Notify::new()),
            refill: Arc::new(Notify::new()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another task panicked mid-push; the set is still whole.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `name` unless it is already waiting or the queue is full.
    pub fn push(&self, name: &str) -> Pushed {
        let mut inner = self.lock();
        if inner.closed {
            return Pushed::Dropped;
        }
        if inner.queued.contains(name) {
            return Pushed::AlreadyQueued;
        }
        if inner.processing.contains(name) {
            inner.dirty.insert(name.to_owned());
            return Pushed::AlreadyQueued;
        }
        if inner.order.len() >= self.capacity {
            inner.dropped = true;
            return Pushed::Dropped;
        }
        inner.queued.insert(name.to_owned());
        inner.order.push_back(name.to_owned());
        drop(inner);
        self.notify.notify_one();
        Pushed::Added
    }

    /// Queues `name` after `delay` (a retry with backoff).
    pub fn push_after(&self, name: String, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.push(&name);
        });
    }

    /// The next name, waiting for one; `None` once closed.
    pub async fn pop(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                if let Some(name) = inner.order.pop_front() {
                    inner.queued.remove(&name);
                    inner.processing.insert(name.clone());
                    if inner.dropped && inner.order.len() <= self.capacity / 2 {
                        inner.dropped = false;
                        self.refill.notify_one();
                    }
                    return Some(name);
                }
            }
            notified.await;
        }
    }

    /// Returns once names were dropped and the queue has since drained to half its capacity:
    /// the caller queues the watch cache's undecided CSRs again. One waiter (the worker's
    /// resync loop); a refill asked for while nobody waits is kept for the next wait.
    pub async fn refill_wanted(&self) {
        self.refill.notified().await;
    }

    /// Marks `name` processed; queues it again if it was pushed meanwhile.
    pub fn done(&self, name: &str) {
        let mut inner = self.lock();
        inner.processing.remove(name);
        if inner.dirty.remove(name) {
            drop(inner);
            self.push(name);
        }
    }

    /// Names waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Stops the queue: waiting and later pops return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_are_deduplicated_bounded_and_fifo() {
        let q = WorkQueue::new(2);
        assert_eq!(q.push("a"), Pushed::Added);
        assert_eq!(q.push("a"), Pushed::AlreadyQueued);
        assert_eq!(q.push("b"), Pushed::Added);
        assert_eq!(q.push("c"), Pushed::Dropped);
        assert_eq!(q.pop().await.as_deref(), Some("a"));
        assert_eq!(q.push("a"), Pushed::AlreadyQueued, "in flight: held back");
        assert_eq!(q.pop().await.as_deref(), Some("b"));
        assert_eq!(q.len(), 0, "a is not handed to a second worker while in flight");
        q.done("a");
        q.done("b");
        assert_eq!(
            q.pop().await.as_deref(),
            Some("a"),
            "pushed while in flight: queued again at done"
        );
        q.done("a");
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn a_queue_that_dropped_names_asks_for_a_refill_once_drained_to_half() {
        let q = WorkQueue::new(4);
        for name in ["a", "b", "c", "d"] {
            assert_eq!(q.push(name), Pushed::Added);
        }
        assert_eq!(q.push("e"), Pushed::Dropped);
        assert_eq!(q.push("f"), Pushed::Dropped);
        assert_eq!(q.pop().await.as_deref(), Some("a"));
        assert!(!refill_asked(&q).await, "3 of 4 still queued: no refill yet");
        assert_eq!(q.pop().await.as_deref(), Some("b"));
        assert!(refill_asked(&q).await, "drained to half after drops");
        assert_eq!(q.pop().await.as_deref(), Some("c"));
        assert!(!refill_asked(&q).await, "asked once per run of drops");
        assert_eq!(q.push("e"), Pushed::Added, "the refill finds room");
    }

    #[tokio::test]
    async fn a_queue_that_dropped_nothing_asks_for_no_refill() {
        let q = WorkQueue::new(2);
        assert_eq!(q.push("a"), Pushed::Added);
        assert_eq!(q.pop().await.as_deref(), Some("a"));
        assert!(!refill_asked(&q).await);
    }

    /// Whether a refill was asked for (and takes it).
    async fn refill_asked(q: &WorkQueue) -> bool {
        tokio::time::timeout(Duration::from_millis(20), q.refill_wanted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn close_wakes_a_waiting_pop() {
        let q = WorkQueue::new(4);
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.pop().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
        assert_eq!(q.push("x"), Pushed::Dropped);
    }

    #[tokio::test]
    async fn delayed_pushes_arrive() {
        let q = WorkQueue::new(4);
        q.push_after("later".into(), Duration::from_millis(10));
        assert_eq!(q.pop().await.as_deref(), Some("later"));
    }
}
