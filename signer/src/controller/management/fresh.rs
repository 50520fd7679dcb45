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
//! before it, and reads of one Cluster never overlap. Reads older than [`KEPT`] are dropped.
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

/// The last fresh read of each Cluster with recent denials.
#[derive(Default)]
pub struct FreshReads {
    clusters: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Fresh>>>>>,
}

#[derive(Clone)]
struct Fresh {
    /// When the read started (the apiserver's state is at least as new).
    started: OffsetDateTime,
    inventory: Arc<Inventory>,
}

impl FreshReads {
    /// Cluster `key`'s objects as read at or after `not_before`: the last read when it started
    /// then, or `read` made now (one at a time per Cluster).
    pub async fn at_least_as_new<E>(
        &self,
        key: &str,
        not_before: OffsetDateTime,
        read: impl Future<Output = Result<Inventory, E>>,
    ) -> Result<Arc<Inventory>, E> {
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
            return Ok(Arc::clone(&known.inventory));
        }
        let started = OffsetDateTime::now_utc();
        let inventory = Arc::new(read.await?);
        *fresh = Some(Fresh {
            started,
            inventory: Arc::clone(&inventory),
        });
        Ok(inventory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_serves_the_csrs_seen_before_it_and_never_older_ones() {
        let reads = FreshReads::default();
        let count = std::sync::atomic::AtomicUsize::new(0);
        let read = || async {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, ()>(Inventory::default())
        };
        let seen = OffsetDateTime::now_utc();
        reads.at_least_as_new("ns/a", seen, read()).await.unwrap();
        reads.at_least_as_new("ns/a", seen, read()).await.unwrap();
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one read for CSRs seen before it"
        );
        let later = OffsetDateTime::now_utc() + time::Duration::seconds(1);
        reads.at_least_as_new("ns/a", later, read()).await.unwrap();
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "a CSR seen after it reads again"
        );
        reads.at_least_as_new("ns/b", seen, read()).await.unwrap();
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "each Cluster its own read"
        );
        assert_eq!(
            reads
                .at_least_as_new("ns/c", seen, async { Err::<Inventory, _>("cut off") })
                .await
                .unwrap_err(),
            "cut off",
            "a failed read is the caller's error"
        );
    }
}
