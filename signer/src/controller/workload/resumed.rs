//! When a failed watch of the workload cluster is up again.
//!
//! kube's watcher starts a failed watch again from the resourceVersion it had, without a list,
//! and says nothing when that works: no event comes until something changes. The CSR watch
//! (which says whether the Cluster is `Ready`) and the Node index (which holds CSRs until it is
//! live) each count themselves down at a failure, and stayed down: the first fleet run
//! (docs/capacity.md) left 313 of 1,000 served Clusters `Unreachable` after a 429 on their first
//! watch, and a cut of the connection left every join waiting for Nodes. A watch started again
//! fails at once when it is refused (429, 403, a connection refused or reset), so a retry that
//! brings no error within [`SETTLED`] is taken as up again; so is any change it delivers. A
//! watch that has to list again (its version expired) says so itself, at the list's end.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// How long a watch started again after a failure must go without an error to count as up.
pub const SETTLED: Duration = Duration::from_secs(5);

/// What came of waiting on a watch.
#[derive(Debug)]
pub enum Next<T> {
    /// The watcher's next event or error.
    Event(T),
    /// The watch started again after a failure went [`SETTLED`] without an error: it is up.
    UpAgain,
    /// The stream ended.
    Ended,
}

/// Follows one watch's retries (see the module).
#[derive(Debug)]
pub struct Resumption {
    retrying: bool,
    settled: Duration,
}

impl Default for Resumption {
    fn default() -> Self {
        Self::settling_in(SETTLED)
    }
}

impl Resumption {
    /// A watch whose retries count as up after `settled` without an error.
    pub fn settling_in(settled: Duration) -> Self {
        Self {
            retrying: false,
            settled,
        }
    }

    /// The next of `events`; while a retry is on its way, [`Next::UpAgain`] once it went the
    /// settling time without an error. (Waiting is cancel-safe: the watcher keeps the request
    /// it is making.)
    pub async fn next<S>(&mut self, events: &mut S) -> Next<S::Item>
    where
        S: Stream + Unpin,
    {
        let next = if self.retrying {
            match tokio::time::timeout(self.settled, events.next()).await {
                Ok(next) => next,
                Err(_settled) => {
                    self.retrying = false;
                    return Next::UpAgain;
                }
            }
        } else {
            events.next().await
        };
        next.map_or(Next::Ended, Next::Event)
    }

    /// The watch failed and is being started again (after its backoff): its next event, or the
    /// settling time without one, says how that went.
    pub fn retrying(&mut self) {
        self.retrying = true;
    }

    /// Whether `event` shows the watch up: the end of a list, or a change delivered by a watch
    /// started again. A list started again is up at its end, not before.
    pub fn up_on<K>(&mut self, event: &watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Init | watcher::Event::InitApply(_) => {
                self.retrying = false;
                false
            }
            watcher::Event::InitDone => {
                self.retrying = false;
                true
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => std::mem::take(&mut self.retrying),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_millis(30);

    #[tokio::test]
    async fn a_retry_without_an_error_is_up_after_the_settling_time_and_not_before_a_failure() {
        let mut quiet = futures::stream::pending::<Result<watcher::Event<()>, ()>>();
        let mut watch = Resumption::settling_in(SOON);
        // Not retrying: nothing is said for a quiet watch (it waits for its next event).
        let waited = tokio::time::timeout(SOON * 4, watch.next(&mut quiet)).await;
        assert!(waited.is_err(), "a quiet watch that never failed is not 'up again'");
        watch.retrying();
        assert!(matches!(watch.next(&mut quiet).await, Next::UpAgain));
        // Said once.
        let waited = tokio::time::timeout(SOON * 4, watch.next(&mut quiet)).await;
        assert!(waited.is_err());
    }

    #[tokio::test]
    async fn a_retry_that_fails_again_is_the_error_and_a_change_is_up() {
        let mut watch = Resumption::settling_in(Duration::from_secs(60));
        let mut failing = futures::stream::iter([Err::<watcher::Event<()>, _>("refused")]);
        watch.retrying();
        assert!(matches!(watch.next(&mut failing).await, Next::Event(Err("refused"))));
        assert!(matches!(watch.next(&mut failing).await, Next::Ended));

        watch.retrying();
        assert!(watch.up_on(&watcher::Event::Apply(())), "a change: the watch is up");
        assert!(!watch.up_on(&watcher::Event::Apply(())), "said once");
        watch.retrying();
        assert!(!watch.up_on(&watcher::Event::<()>::Init), "listing again: not yet");
        assert!(!watch.up_on(&watcher::Event::InitApply(())));
        assert!(watch.up_on(&watcher::Event::<()>::InitDone), "the list's end");
        assert!(
            watch.up_on(&watcher::Event::<()>::InitDone),
            "a list's end always says up"
        );
    }
}
