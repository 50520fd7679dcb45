//! Per-cluster work queues: bounded, deduplicating, with delayed retries.
//!
//! A queue holds CSR names, not CSRs: the worker reads the current object from its watch cache
//! when it takes a name, so a dropped or repeated name costs nothing but a look. That is what
//! makes the bound safe: a full queue drops the name (and counts it), and the periodic resync
//! of the watch cache puts every undecided CSR back.

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
    closed: bool,
}

/// A bounded set of CSR names in arrival order.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    inner: Arc<Mutex<Inner>>,
    notify: Arc<Notify>,
    capacity: usize,
}

impl WorkQueue {
    /// A queue holding at most `capacity` names.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::default(),
            notify: Arc::new(Notify::new()),
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
                    return Some(name);
                }
            }
            notified.await;
        }
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
