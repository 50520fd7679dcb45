//! Reads that confirm the cache before a final denial.
//!
//! The cache follows the management cluster through watches; a replica whose connection to it
//! is down still holds what it last saw, and a Machine created since is simply absent there. An
//! approval is safe on a stale cache (the claim's write goes to the apiserver, with its
//! precondition), but a denial is final: a CSR refused because its Machine was not in the cache
//! is lost to its node. So a denial by a rule that reads the Cluster's Machines, MachinePools or
//! KubeadmConfigs is decided again on a fresh read of them before it is written.
//!
//! A flood of such denials (junk CSRs, a hijack attempt) costs one read per Cluster at a time,
//! not one per CSR: a read that started after a CSR was first seen serves every CSR first seen
//! before it, and reads of one Cluster never overlap or start less than [`SPACING`] apart: a
//! continuous flood of junk CSRs at one workload cluster (anyone holding its join token can file
//! them) had each read start as the last ended, 468 reads of the namespace's Machines,
//! MachinePools and KubeadmConfigs in 10 s (`signer-load --scenario flood`), each a LIST the
//! size of the namespace. A CSR that needs a read sooner is told how long to wait
//! ([`FreshRead::TooSoon`]) and is queued again then, holding no slot meanwhile: waiting inside
//! the slot made the same flood's 5,000 junk CSRs take 87 s instead of 10. Reads older than
//! [`KEPT`] are dropped.
//! Such a shared read may be older than what the cache showed a later decision (a claim written
//! since): one that does not confirm a denial is taken again, newer than the decision, before
//! the cache is called behind (`workload::csr`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attestation::machine::Inventory;
use time::OffsetDateTime;

use crate::locks::lock;

/// How long a fresh read is kept for the CSRs that may reuse it.
const KEPT: Duration = Duration::from_secs(10);

/// Least time between the starts of two fresh reads of one Cluster: a final denial waits at
/// most this much longer, and a flood costs the management apiserver at most one read of the
/// Cluster's namespace per this.
const SPACING: Duration = Duration::from_secs(1);

/// The last fresh read of each Cluster with recent denials.
#[derive(Default)]
pub struct FreshReads {
    clusters: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Fresh>>>>>,
}

/// What a CSR gets of a fresh read.
pub enum FreshRead {
    /// The Cluster's objects, read at or after the instant asked for.
    Read(Arc<Inventory>),
    /// The last read started less than [`SPACING`] ago: ask again after this long.
    TooSoon(Duration),
}

#[derive(Clone)]
struct Fresh {
    /// When the read started (the apiserver's state is at least as new).
    started: OffsetDateTime,
    inventory: Arc<Inventory>,
}

impl FreshReads {
    /// Cluster `key`'s objects as read at or after `not_before`: the last read when it started
    /// then, or `read` made now (one at a time per Cluster), or how long to wait when the last
    /// read started less than [`SPACING`] ago.
    pub async fn at_least_as_new<E>(
        &self,
        key: &str,
        not_before: OffsetDateTime,
        read: impl Future<Output = Result<Inventory, E>>,
    ) -> Result<FreshRead, E> {
        let slot = {
            let mut clusters = lock(&self.clusters);
            let now = OffsetDateTime::now_utc();
            clusters.retain(|k, slot| {
                k == key
                    || slot
                        .try_lock()
                        .map_or(true, |fresh| fresh.as_ref().is_some_and(|f| now - f.started < KEPT))
            });
            Arc::clone(clusters.entry(key.to_owned()).or_default())
        };
        let mut fresh = slot.lock().await;
        if let Some(known) = fresh.as_ref().filter(|f| f.started >= not_before) {
            return Ok(FreshRead::Read(Arc::clone(&known.inventory)));
        }
        if let Some(last) = fresh.as_ref() {
            let since = Duration::try_from(OffsetDateTime::now_utc() - last.started).unwrap_or_default();
            if let Some(wait) = SPACING.checked_sub(since).filter(|w| !w.is_zero()) {
                return Ok(FreshRead::TooSoon(wait));
            }
        }
        let started = OffsetDateTime::now_utc();
        let inventory = Arc::new(read.await?);
        *fresh = Some(Fresh {
            started,
            inventory: Arc::clone(&inventory),
        });
        Ok(FreshRead::Read(inventory))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_now(outcome: FreshRead) -> Arc<Inventory> {
        match outcome {
            FreshRead::Read(inventory) => inventory,
            FreshRead::TooSoon(wait) => panic!("told to wait {wait:?}"),
        }
    }

    #[tokio::test]
    async fn a_read_serves_the_csrs_seen_before_it_and_never_older_ones() {
        let reads = FreshReads::default();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let read = || async {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, ()>(Inventory::default())
        };
        let seen = OffsetDateTime::now_utc();
        read_now(reads.at_least_as_new("ns/a", seen, read()).await.unwrap());
        read_now(reads.at_least_as_new("ns/a", seen, read()).await.unwrap());
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one read for CSRs seen before it"
        );
        let later = OffsetDateTime::now_utc() + time::Duration::milliseconds(1);
        let FreshRead::TooSoon(wait) = reads.at_least_as_new("ns/a", later, read()).await.unwrap() else {
            panic!("a second read within the spacing");
        };
        assert!(wait <= SPACING && !wait.is_zero(), "{wait:?}");
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1, "not read meanwhile");
        tokio::time::sleep(wait).await;
        read_now(reads.at_least_as_new("ns/a", later, read()).await.unwrap());
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "a CSR seen after it reads again, once the spacing is over"
        );
        read_now(reads.at_least_as_new("ns/b", seen, read()).await.unwrap());
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "each Cluster its own read, not spaced from another's"
        );
        assert_eq!(
            reads
                .at_least_as_new("ns/c", seen, async { Err::<Inventory, _>("cut off") })
                .await
                .err(),
            Some("cut off"),
            "a failed read is the caller's error"
        );
    }
}
