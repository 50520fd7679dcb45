//! Which opted-in Clusters this replica serves: all of them, or the shard's share by the
//! membership's live view ([`Scope`], [`assign`]). Pure but for the view's channel.

use std::collections::HashMap;

use attestation::machine::ClusterView;
use tokio::sync::watch;

use super::membership::View;

/// Which opted-in Clusters this replica serves.
pub enum Scope {
    /// All of them: one replica (`--leader-elect=false`) or the leader.
    Everything,
    /// Those the shard assigns to this replica, by the membership's live view.
    Shard(watch::Receiver<View>),
}

impl Scope {
    /// The view to filter by, `None` for everything. A view whose membership has stopped is
    /// fenced: nothing is served without renewals.
    pub(super) fn view(&self) -> Option<View> {
        match self {
            Self::Everything => None,
            Self::Shard(view) => {
                let mut current = view.borrow().clone();
                if view.has_changed().is_err() {
                    current.fenced = true;
                }
                Some(current)
            }
        }
    }

    /// Resolves at the next membership change (never for [`Scope::Everything`] or a stopped
    /// membership).
    pub(super) async fn changed(&mut self) {
        match self {
            Self::Shard(view) if view.has_changed().is_ok() => {
                let _ = view.changed().await;
            }
            _ => std::future::pending().await,
        }
    }
}

/// This replica's part of the opted-in Clusters.
pub(super) struct Assignment {
    /// The Clusters this replica serves.
    pub mine: Vec<ClusterView>,
    /// The opted-in Clusters other replicas serve (none unsharded).
    pub theirs: Vec<ClusterView>,
    /// Each opted-in Cluster's owner by UID, sharded; empty otherwise.
    pub owners: HashMap<String, String>,
}

/// Splits `opted_in` between this replica and the others by `view` (`None`: all are this
/// replica's).
pub(super) fn assign(view: Option<&View>, opted_in: Vec<ClusterView>) -> Assignment {
    // Owners are assigned over every opted-in Cluster at once (the shares are capped).
    let owners: HashMap<String, String> = match view {
        Some(view) => {
            let uids: Vec<&str> = opted_in.iter().map(|c| c.uid.as_str()).collect();
            uids.iter()
                .zip(view.owners(&uids))
                .filter_map(|(uid, owner)| Some(((*uid).to_owned(), owner?.to_owned())))
                .collect()
        }
        None => HashMap::new(),
    };
    let (mine, theirs): (Vec<ClusterView>, Vec<ClusterView>) = opted_in
        .into_iter()
        .partition(|c| view.is_none_or(|v| v.is_me(owners.get(&c.uid).map(String::as_str))));
    Assignment { mine, theirs, owners }
}
