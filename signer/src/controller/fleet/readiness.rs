//! When a replica is ready (SPEC section 7, "Told before it breaks"): once it serves its share,
//! so that a rolling update of a sharded Deployment waits for each new replica to have taken up
//! the Clusters the shard gave it before the next old one goes. Pure: the fleet calls
//! [`serves_its_share`] after each pass and publishes the answer for `/readyz`.
//!
//! "Taken up" is not "healthy": a Cluster whose Secrets are broken, whose CA is shared, whose
//! apiserver is down or which is paused is taken up (its problem is its own, reported by its
//! state and alerts); holding every replica unready for one broken Cluster would stop every
//! rollout of the signer until it is fixed. What is not taken up is a Cluster of the share with
//! no worker yet, or whose worker is still listing its Machines: a replica that stopped then
//! would leave those Clusters unserved for the time it takes to list them again.

/// How a Cluster of this replica's share stands, for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A worker runs for it and has listed its objects (whatever its state otherwise).
    Served,
    /// Held back by its own problem (Secrets, shared CA) or paused: taken up, not served.
    HeldBack,
    /// A worker runs for it but is still listing its Cluster API objects.
    Listing,
    /// No worker and no known problem yet (just assigned).
    NotYet,
}

/// Whether this replica serves its share: a member of the shard that does not stand aside
/// (`standing_aside`: fenced, or not yet counted), each of whose Clusters is [`Standing::Served`]
/// or [`Standing::HeldBack`]. Unsharded (one process serving everything), the share is every
/// opted-in Cluster.
pub fn serves_its_share(standing_aside: bool, share: impl IntoIterator<Item = Standing>) -> bool {
    !standing_aside
        && share
            .into_iter()
            .all(|s| matches!(s, Standing::Served | Standing::HeldBack))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_cluster_of_the_share_is_taken_up_whatever_its_health() {
        assert!(serves_its_share(false, []), "an empty share");
        assert!(serves_its_share(false, [Standing::Served, Standing::HeldBack]));
        assert!(!serves_its_share(false, [Standing::Served, Standing::Listing]));
        assert!(!serves_its_share(false, [Standing::NotYet]));
        assert!(
            !serves_its_share(true, [Standing::Served]),
            "a replica standing aside serves nothing"
        );
    }
}
