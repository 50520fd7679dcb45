//! Shard membership: every replica renews its own `coordination.k8s.io` Lease and watches its
//! peers' (docs/decisions.md, "Sharding").
//!
//! - Each replica writes one Lease, `<--leader-election-id>-<replica>` in the signer's namespace,
//!   labelled [`MEMBER_LABEL`]`=<--leader-election-id>`, with a holder identity unique to the
//!   process, `leaseDurationSeconds` 15, renewed every 5 s: Lease writes per second are
//!   replicas / 5 whatever the number of clusters.
//! - A watch of the labelled Leases gives the live members. A peer is live until its last
//!   observed renewal plus its duration, measured on this process's monotonic clock from the
//!   moment the renewal was seen (a peer seen for the first time is trusted for what is left of
//!   its `renewTime + leaseDurationSeconds` by the wall clock, at most one duration), so clock
//!   skew between replicas does not move the hand-over.
//! - A replica that has not renewed its own Lease for longer than the duration minus one renewal
//!   period is *fenced*: it owns nothing until it renews again, 5 s before its peers may take
//!   its clusters over.
//! - [`Membership::leave`] (on SIGTERM) deletes the Lease: the peers take over at once.
//! - Leases of members dead for [`STALE_MEMBER_AFTER`] (a Deployment's pods get new names) are
//!   deleted by whichever live member sees them, under a resourceVersion precondition.
//!
//! The assignment of Clusters to members is [`super::shard`]'s; this module only says who is
//! live.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::shard;
use crate::controller::metrics::Metrics;

/// The label every member Lease carries; its value is the group (`--leader-election-id`), so
/// two signer installations in one namespace do not mix.
pub const MEMBER_LABEL: &str = "node-attestation.cluster.x-k8s.io/signer-member";

/// A member Lease dead for this long is deleted by a live member.
pub const STALE_MEMBER_AFTER: Duration = Duration::from_secs(600);

/// How a replica takes part.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Namespace of the member Leases (`--leader-election-namespace`).
    pub namespace: String,
    /// The group, `--leader-election-id`: the label value and the Lease name prefix.
    pub group: String,
    /// Stable replica name (`POD_NAME`, else the host name).
    pub replica: String,
    /// Unique per process: the Lease's `holderIdentity`.
    pub holder: String,
    /// `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How often the Lease is renewed.
    pub renew_period: Duration,
}

impl Settings {
    /// The defaults: a 15 s Lease renewed every 5 s.
    pub fn new(namespace: &str, group: &str, replica: &str, holder: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            replica: replica.to_owned(),
            holder: holder.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(5),
        }
    }

    /// This replica's Lease name, which is also its member name.
    pub fn lease_name(&self) -> String {
        member_lease_name(&self.group, &self.replica)
    }

    /// Without a renewal for this long the replica owns nothing: one renewal period before
    /// its peers may see the Lease expire.
    pub fn fence_after(&self) -> Duration {
        self.lease_duration.saturating_sub(self.renew_period)
    }
}

/// Why membership could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// The group is not usable as a label value.
    #[error(
        "--leader-election-id {group:?} cannot label the member Leases: at most 63 characters, letters, digits, '-', '_', '.', alphanumeric at both ends"
    )]
    InvalidGroup {
        /// The group given.
        group: String,
    },
    /// The first write of the own Lease failed.
    #[error(
        "cannot write membership Lease {namespace}/{name}: {why} (the signer's Role needs create and patch on leases.coordination.k8s.io in {namespace}; set POD_NAMESPACE or --leader-election-namespace)"
    )]
    Join {
        /// Namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The API's answer.
        why: String,
    },
    /// The member Leases cannot be listed or watched.
    #[error(
        "cannot list the membership Leases in {namespace}: {why} (the signer's Role needs list and watch on leases.coordination.k8s.io there)"
    )]
    List {
        /// Namespace.
        namespace: String,
        /// The API's answer.
        why: String,
    },
}

/// Who is live, as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// This replica's member name.
    pub me: String,
    /// Live members, sorted; `me` among them unless fenced.
    pub members: Vec<String>,
    /// This replica could not renew its Lease in time: it owns nothing.
    pub fenced: bool,
}

impl View {
    /// The members that own the Clusters of `uids` (every opted-in Cluster: the shares are
    /// capped, see [`shard::assign`]), in the order of `uids`.
    pub fn owners(&self, uids: &[&str]) -> Vec<Option<&str>> {
        shard::assign(uids, &self.members)
    }

    /// Whether `owner` (one of [`Self::owners`]) is this replica, not fenced.
    pub fn is_me(&self, owner: Option<&str>) -> bool {
        !self.fenced && owner == Some(self.me.as_str())
    }

    /// Whether this replica stands aside for now: fenced, or renewing again but not yet
    /// counted among the members (a returning member's arrival settles like a new one's). It
    /// owns nothing meanwhile, and gets its share back once counted.
    pub fn standing_aside(&self) -> bool {
        self.fenced || !self.members.contains(&self.me)
    }

    /// The members, for logs and Events.
    pub fn members_text(&self) -> String {
        self.members.join(", ")
    }
}

/// The Lease name of `replica` in `group`: a DNS subdomain (lower case, `[a-z0-9.-]`, at most
/// 253 characters; a longer name keeps its start and a digest of the whole).
pub fn member_lease_name(group: &str, replica: &str) -> String {
    let raw = format!("{group}-{replica}");
    let alnum_ends = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric()) && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let clean: String = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if clean == raw && raw.len() <= 253 && alnum_ends(&raw) {
        return raw;
    }
    // Changed or cut: a digest of the replica name keeps two replicas on two Leases.
    let mut head = clean;
    head.truncate(236);
    let head = head.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let head = if head.is_empty() { "member" } else { head };
    format!("{head}-{:016x}", shard::weight(group, replica))
}

/// A label value (also what Kubernetes accepts as a label value, except the empty one).
fn valid_label_value(value: &str) -> bool {
    let alnum_ends = value.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && value.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && alnum_ends
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One member Lease as last seen.
#[derive(Debug, Clone)]
struct Seen {
    holder: Option<String>,
    renew_ms: Option<i64>,
    resource_version: Option<String>,
    expires: Instant,
}

/// The member Leases seen, with when each stops counting as live. Pure: the caller passes the
/// clocks.
#[derive(Debug, Default)]
pub struct Roster {
    seen: HashMap<String, Seen>,
}

impl Roster {
    /// Records `lease` as read at `now` (monotonic) and `wall_ms` (milliseconds since the epoch).
    /// A changed holder or renewTime is a renewal seen now: live for one duration from `now`. A
    /// Lease seen for the first time is live for what its own times leave, at most one duration.
    /// A Lease without a holder, a renewTime or a positive duration is not live.
    pub fn observe(&mut self, lease: &Lease, now: Instant, wall_ms: i64) {
        let name = lease.name_any();
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        let renew_ms = spec.renew_time.or(spec.acquire_time).map(|t| t.0.as_millisecond());
        let duration_ms = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0)) * 1000;
        let resource_version = lease.resource_version();
        let expires = match self.seen.get(&name) {
            Some(before) if before.holder == holder && before.renew_ms == renew_ms => before.expires,
            _ if holder.is_none() || renew_ms.is_none() || duration_ms == 0 => now,
            Some(_) => now + Duration::from_millis(duration_ms.unsigned_abs()),
            None => {
                let left = renew_ms.map_or(0, |r| r.saturating_add(duration_ms).saturating_sub(wall_ms));
                now + Duration::from_millis(left.clamp(0, duration_ms).unsigned_abs())
            }
        };
        self.seen.insert(
            name,
            Seen {
                holder,
                renew_ms,
                resource_version,
                expires,
            },
        );
    }

    /// A Lease was deleted.
    pub fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }

    /// A fresh list: Leases no longer there are forgotten, unchanged ones keep their expiry.
    pub fn relist(&mut self, leases: &[Lease], now: Instant, wall_ms: i64) {
        let names: Vec<String> = leases.iter().map(ResourceExt::name_any).collect();
        self.seen.retain(|name, _| names.contains(name));
        for lease in leases {
            self.observe(lease, now, wall_ms);
        }
    }

    /// The live members at `now`, sorted.
    pub fn live(&self, now: Instant) -> Vec<String> {
        let mut live: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| s.expires > now)
            .map(|(name, _)| name.clone())
            .collect();
        live.sort();
        live
    }

    /// Leases dead for longer than `after`, with the resourceVersion to delete them under.
    pub fn stale(&self, now: Instant, after: Duration) -> Vec<(String, Option<String>)> {
        self.seen
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.expires) > after)
            .map(|(name, s)| (name.clone(), s.resource_version.clone()))
            .collect()
    }
}

/// The view at `now` from the roster and this replica's last successful renewal (the moment
/// its request was sent).
pub fn view_at(roster: &Roster, me: &str, last_renewal: Option<Instant>, fence_after: Duration, now: Instant) -> View {
    let fenced = last_renewal.is_none_or(|at| now.saturating_duration_since(at) > fence_after);
    let mut members: Vec<String> = roster.live(now).into_iter().filter(|m| m != me).collect();
    if !fenced {
        members.push(me.to_owned());
        members.sort();
    }
    View {
        me: me.to_owned(),
        members,
        fenced,
    }
}

/// How long new members wait before they count: until no member has arrived for this long.
pub const ARRIVALS_SETTLE: Duration = Duration::from_secs(2);

/// Members that arrive count only once arrivals have settled; members that leave stop counting
/// at once.
///
/// Replicas started together (a rollout's first pods, a cold start) do not see each other at
/// the same moment. Counted at once, the first one up would own every Cluster until the others
/// appeared a second later, and start listing every Cluster's Machines: at a million Machines
/// about 3 GB of JSON and the views of the whole fleet, in a pod whose memory limit is sized
/// for its third (at 30,000 Machines, a shard replica's peak 2.3 MiB above its settled RSS).
/// With arrivals held until none has come for [`ARRIVALS_SETTLE`], every replica counts the
/// same members when it first serves. What it costs: a replica that restarts, and its peers,
/// take its share back that much later; a replica that leaves or dies is never waited for.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// The members counted.
    counted: Vec<String>,
    /// The arrivals not counted yet, and when the last of them was first seen.
    waiting: Option<(Vec<String>, Instant)>,
}

impl Arrivals {
    /// Arrivals for a replica joining at `now`: when a live peer has held its Lease for
    /// [`ARRIVALS_SETTLE`] already (by `acquireTime`), the group is running (a restart, a
    /// rollout) and every live member counts at once, this replica included, so that a
    /// restarted replica takes its share back without waiting; otherwise (a cold start, or
    /// peers that have just started too) arrivals settle first.
    pub fn joining(live: &[String], me: &str, acquired_ms: &HashMap<String, i64>, wall_ms: i64) -> Self {
        let settle_ms = i64::try_from(ARRIVALS_SETTLE.as_millis()).unwrap_or(i64::MAX);
        let running = live.iter().filter(|m| *m != me).any(|m| {
            acquired_ms
                .get(m)
                .is_some_and(|at| wall_ms.saturating_sub(*at) >= settle_ms)
        });
        Self {
            counted: if running { live.to_vec() } else { Vec::new() },
            waiting: None,
        }
    }

    /// The members to count at `now`, of the `live` ones (sorted).
    pub fn count(&mut self, live: &[String], now: Instant, settle: Duration) -> Vec<String> {
        self.counted.retain(|m| live.contains(m));
        let new: Vec<String> = live.iter().filter(|m| !self.counted.contains(m)).cloned().collect();
        if new.is_empty() {
            self.waiting = None;
            return self.counted.clone();
        }
        let since = match &self.waiting {
            Some((waiting, since)) if new.iter().all(|m| waiting.contains(m)) => *since,
            _ => now,
        };
        if now.saturating_duration_since(since) >= settle {
            self.counted = live.to_vec();
            self.waiting = None;
        } else {
            self.waiting = Some((new, since));
        }
        self.counted.clone()
    }
}

/// This replica's membership: the renewal and watch tasks, and the view they keep.
pub struct Membership {
    settings: Settings,
    api: Api<Lease>,
    renewer: JoinHandle<()>,
    observer: JoinHandle<()>,
    view: watch::Receiver<View>,
}

impl Membership {
    /// Writes this replica's Lease, lists its peers', and starts renewing and watching.
    pub async fn join(client: Client, settings: Settings, metrics: Metrics) -> Result<Self, MembershipError> {
        if !valid_label_value(&settings.group) {
            return Err(MembershipError::InvalidGroup {
                group: settings.group.clone(),
            });
        }
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let me = settings.lease_name();
        let sent = Instant::now();
        renew(&api, &settings, true).await.map_err(|e| MembershipError::Join {
            namespace: settings.namespace.clone(),
            name: me.clone(),
            why: e.to_string(),
        })?;
        let selector = format!("{MEMBER_LABEL}={}", settings.group);
        let listed = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| MembershipError::List {
                namespace: settings.namespace.clone(),
                why: e.to_string(),
            })?;
        let mut roster = Roster::default();
        roster.relist(&listed.items, Instant::now(), Timestamp::now().as_millisecond());
        let now = Instant::now();
        let mut first = view_at(&roster, &me, Some(sent), settings.fence_after(), now);
        let acquired_ms: HashMap<String, i64> = listed
            .items
            .iter()
            .filter_map(|l| Some((l.name_any(), l.spec.as_ref()?.acquire_time.as_ref()?.0.as_millisecond())))
            .collect();
        let mut arrivals = Arrivals::joining(&first.members, &me, &acquired_ms, Timestamp::now().as_millisecond());
        first.members = arrivals.count(&first.members, now, ARRIVALS_SETTLE);
        tracing::info!(
            lease = %format!("{}/{me}", settings.namespace),
            holder = %settings.holder,
            members = %first.members_text(),
            "joined the signer shard"
        );
        metrics.shard_view(first.members.len(), first.fenced);
        let (view_tx, view) = watch::channel(first);
        let (renewed_tx, renewed) = watch::channel(Some(sent));
        let span = tracing::info_span!("membership", lease = %me);
        let renewer = tokio::spawn(renew_loop(api.clone(), settings.clone(), renewed_tx).instrument(span.clone()));
        let observer = tokio::spawn(
            observe_loop(
                api.clone(),
                settings.clone(),
                (roster, arrivals),
                renewed,
                view_tx,
                metrics,
            )
            .instrument(span),
        );
        Ok(Self {
            settings,
            api,
            renewer,
            observer,
            view,
        })
    }

    /// The live view; changes whenever a member comes, goes, or this replica is fenced.
    pub fn view(&self) -> watch::Receiver<View> {
        self.view.clone()
    }

    /// Resolves if a membership task stopped (a bug: the caller should exit).
    pub async fn stopped(&mut self) {
        tokio::select! {
            _ = &mut self.renewer => {}
            _ = &mut self.observer => {}
        }
    }

    /// Stops renewing and deletes this replica's Lease, so the peers take its clusters now.
    pub async fn leave(self) {
        self.renewer.abort();
        self.observer.abort();
        let name = self.settings.lease_name();
        match tokio::time::timeout(Duration::from_secs(3), self.api.delete(&name, &DeleteParams::default())).await {
            Ok(Ok(_)) => tracing::info!(lease = %name, "left the signer shard: Lease deleted"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "cannot delete the membership Lease; peers take over when it expires")
            }
            Err(_) => {
                tracing::warn!(lease = %name, "deleting the membership Lease timed out; peers take over when it expires")
            }
        }
    }
}

/// One renewal: a merge patch of the holder, duration and renewTime (and the label), or the
/// Lease created when it is missing.
async fn renew(api: &Api<Lease>, settings: &Settings, first: bool) -> Result<(), kube::Error> {
    let name = settings.lease_name();
    let now = MicroTime(Timestamp::now());
    let seconds = i32::try_from(settings.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let mut spec = serde_json::json!({
        "holderIdentity": settings.holder,
        "leaseDurationSeconds": seconds,
        "renewTime": now,
    });
    if first {
        spec["acquireTime"] = serde_json::json!(now);
    }
    let patch = serde_json::json!({
        "metadata": { "labels": { MEMBER_LABEL: settings.group } },
        "spec": spec,
    });
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some([(MEMBER_LABEL.to_owned(), settings.group.clone())].into()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(settings.holder.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

async fn renew_loop(api: Api<Lease>, settings: Settings, renewed: watch::Sender<Option<Instant>>) {
    let mut ticks = tokio::time::interval(settings.renew_period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut failing = false;
    loop {
        ticks.tick().await;
        let sent = Instant::now();
        match tokio::time::timeout(settings.renew_period, renew(&api, &settings, false)).await {
            Ok(Ok(())) => {
                if failing {
                    tracing::info!("membership Lease renewed again");
                    failing = false;
                }
                renewed.send_replace(Some(sent));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot renew the membership Lease");
                failing = true;
            }
            Err(_) => {
                tracing::warn!("renewing the membership Lease timed out");
                failing = true;
            }
        }
    }
}

async fn observe_loop(
    api: Api<Lease>,
    settings: Settings,
    (mut roster, mut arrivals): (Roster, Arrivals),
    mut renewed: watch::Receiver<Option<Instant>>,
    view_tx: watch::Sender<View>,
    metrics: Metrics,
) {
    let me = settings.lease_name();
    let selector = format!("{MEMBER_LABEL}={}", settings.group);
    let mut events = watcher(api.clone(), watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let mut buffer: Option<Vec<Lease>> = None;
    // Expiries and settled arrivals are found by these ticks.
    let mut ticks = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            event = events.next() => {
                let (now, wall_ms) = (Instant::now(), Timestamp::now().as_millisecond());
                match event {
                    Some(Ok(watcher::Event::Init)) => buffer = Some(Vec::new()),
                    Some(Ok(watcher::Event::InitApply(lease))) => {
                        if let Some(buffer) = buffer.as_mut() {
                            buffer.push(lease);
                        }
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(leases) = buffer.take() {
                            roster.relist(&leases, now, wall_ms);
                        }
                    }
                    Some(Ok(watcher::Event::Apply(lease))) => roster.observe(&lease, now, wall_ms),
                    Some(Ok(watcher::Event::Delete(lease))) => roster.forget(&lease.name_any()),
                    Some(Err(e)) => tracing::warn!(error = %e, "watch of the membership Leases failed; retrying"),
                    // The watcher's stream does not end; if it did, ticks still expire members.
                    None => events = futures::stream::pending().boxed(),
                }
            }
            changed = renewed.changed() => {
                if changed.is_err() {
                    // The renewer is gone: no more renewals, so the fence will fall.
                    renewed = watch::channel(None).1;
                }
            }
            _ = ticks.tick() => {}
        }
        let last_renewal = *renewed.borrow();
        let now = Instant::now();
        let mut view = view_at(&roster, &me, last_renewal, settings.fence_after(), now);
        view.members = arrivals.count(&view.members, now, ARRIVALS_SETTLE);
        view_tx.send_if_modified(|current| {
            if *current == view {
                return false;
            }
            if current.fenced != view.fenced {
                if view.fenced {
                    tracing::error!(
                        fence_after = ?settings.fence_after(),
                        "membership Lease not renewed in time: serving no cluster until it is"
                    );
                } else {
                    tracing::info!("membership Lease renewed: serving this replica's share again");
                }
            }
            if current.members != view.members {
                tracing::info!(members = %view.members_text(), "signer shard members changed");
            }
            metrics.shard_view(view.members.len(), view.fenced);
            *current = view.clone();
            true
        });
        if !view.fenced {
            for (name, resource_version) in roster.stale(now, STALE_MEMBER_AFTER) {
                if name == me {
                    continue;
                }
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version,
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                match tokio::time::timeout(settings.renew_period, api.delete(&name, &params)).await {
                    Ok(Ok(_)) => {
                        tracing::info!(lease = %name, "deleted the Lease of a member dead for 10 minutes");
                        roster.forget(&name);
                    }
                    Ok(Err(e)) => tracing::debug!(lease = %name, error = %e, "stale member Lease not deleted"),
                    Err(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, holder: Option<&str>, renew_ms: Option<i64>, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                resource_version: Some("1".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(seconds),
                renew_time: renew_ms
                    .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                    .map(MicroTime),
                ..LeaseSpec::default()
            }),
        }
    }

    const WALL: i64 = 1_750_000_000_000;
    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_renewal_seen_now_counts_for_one_duration_from_now() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("s-a", Some("a_1"), Some(WALL), 15), t0, WALL);
        roster.observe(
            &lease("s-a", Some("a_1"), Some(WALL + 5000), 15),
            t0 + 5 * S,
            WALL + 5000,
        );
        assert_eq!(roster.live(t0 + 19 * S), ["s-a"]);
        assert!(roster.live(t0 + 21 * S).is_empty());
    }

    #[test]
    fn an_unchanged_lease_read_again_does_not_extend_its_life() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("s-a", Some("a_1"), Some(WALL), 15), t0, WALL);
        roster.relist(&[lease("s-a", Some("a_1"), Some(WALL), 15)], t0 + 10 * S, WALL + 10_000);
        assert!(roster.live(t0 + 16 * S).is_empty());
    }

    #[test]
    fn a_lease_seen_first_counts_for_what_its_own_times_leave_at_most_one_duration() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("old", Some("o_1"), Some(WALL - 10_000), 15), t0, WALL);
        roster.observe(&lease("dead", Some("d_1"), Some(WALL - 60_000), 15), t0, WALL);
        // A peer whose clock runs a minute ahead is trusted for one duration, not more.
        roster.observe(&lease("ahead", Some("h_1"), Some(WALL + 60_000), 15), t0, WALL);
        assert_eq!(roster.live(t0 + 4 * S), ["ahead", "old"]);
        assert_eq!(roster.live(t0 + 6 * S), ["ahead"]);
        assert!(roster.live(t0 + 16 * S).is_empty());
    }

    #[test]
    fn a_released_or_malformed_lease_is_not_a_member() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("released", None, Some(WALL), 15), t0, WALL);
        roster.observe(&lease("no-time", Some("x"), None, 15), t0, WALL);
        roster.observe(&lease("no-duration", Some("x"), Some(WALL), 0), t0, WALL);
        assert!(roster.live(t0).is_empty());
    }

    #[test]
    fn a_relist_forgets_deleted_leases() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("s-a", Some("a"), Some(WALL), 15), t0, WALL);
        roster.observe(&lease("s-b", Some("b"), Some(WALL), 15), t0, WALL);
        roster.relist(&[lease("s-b", Some("b"), Some(WALL), 15)], t0, WALL);
        assert_eq!(roster.live(t0), ["s-b"]);
        roster.forget("s-b");
        assert!(roster.live(t0).is_empty());
    }

    #[test]
    fn a_replica_that_cannot_renew_is_fenced_before_its_peers_may_take_over() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("s-b", Some("b"), Some(WALL), 15), t0, WALL);
        let settings = Settings::new("ns", "s", "a", "a_1");
        let fence = settings.fence_after();
        assert_eq!(fence, 10 * S);
        let fresh = view_at(&roster, "s-a", Some(t0), fence, t0 + 9 * S);
        assert!(!fresh.fenced);
        assert_eq!(fresh.members, ["s-a", "s-b"]);
        let fenced = view_at(&roster, "s-a", Some(t0), fence, t0 + 11 * S);
        assert!(fenced.fenced);
        assert_eq!(fenced.members, ["s-b"]);
        let uids: Vec<String> = (0..200).map(|i| format!("uid-{i}")).collect();
        let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
        assert!(
            fenced.owners(&uids).into_iter().all(|o| !fenced.is_me(o)),
            "a fenced replica owns nothing"
        );
        assert!(view_at(&roster, "s-a", None, fence, t0).fenced, "never renewed");
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn replicas_starting_together_count_each_other_only_once_arrivals_settle() {
        let t0 = Instant::now();
        let settle = ARRIVALS_SETTLE;
        let mut a = Arrivals::default();
        // Alone at first: it counts nobody, itself included, so it serves nothing yet.
        assert!(a.count(&names(&["s-a"]), t0, settle).is_empty());
        assert!(a.count(&names(&["s-a", "s-b"]), t0 + S / 2, settle).is_empty());
        assert!(a.count(&names(&["s-a", "s-b", "s-c"]), t0 + S, settle).is_empty());
        // Each arrival restarts the wait; 2 s after the last one, all three count at once.
        assert!(a.count(&names(&["s-a", "s-b", "s-c"]), t0 + 2 * S, settle).is_empty());
        assert_eq!(
            a.count(&names(&["s-a", "s-b", "s-c"]), t0 + 3 * S, settle),
            ["s-a", "s-b", "s-c"]
        );
        // Joining a running group (a peer has held its Lease for 2 s), all count at once.
        let acquired: HashMap<String, i64> = [("s-a".to_owned(), 10_000), ("s-c".to_owned(), 11_500)].into();
        let mut b = Arrivals::joining(&names(&["s-a", "s-b", "s-c"]), "s-b", &acquired, 12_000);
        assert_eq!(
            b.count(&names(&["s-a", "s-b", "s-c"]), t0, settle),
            ["s-a", "s-b", "s-c"]
        );
        // Peers that started a moment ago are a cold start: wait.
        let mut c = Arrivals::joining(&names(&["s-b", "s-c"]), "s-b", &acquired, 12_000);
        assert!(c.count(&names(&["s-b", "s-c"]), t0, settle).is_empty());
        // A member that dies stops counting at once; one that comes back waits again.
        assert_eq!(a.count(&names(&["s-a", "s-c"]), t0 + 4 * S, settle), ["s-a", "s-c"]);
        assert_eq!(
            a.count(&names(&["s-a", "s-b", "s-c"]), t0 + 5 * S, settle),
            ["s-a", "s-c"]
        );
        assert_eq!(a.count(&names(&["s-a", "s-c"]), t0 + 6 * S, settle), ["s-a", "s-c"]);
        assert_eq!(
            a.count(&names(&["s-a", "s-b", "s-c"]), t0 + 6 * S, settle),
            ["s-a", "s-c"]
        );
        assert_eq!(
            a.count(&names(&["s-a", "s-b", "s-c"]), t0 + 8 * S, settle),
            ["s-a", "s-b", "s-c"]
        );
    }

    #[test]
    fn members_split_clusters_and_exactly_one_owns_each() {
        let members = vec!["s-a".to_owned(), "s-b".to_owned(), "s-c".to_owned()];
        let views: Vec<View> = members
            .iter()
            .map(|me| View {
                me: me.clone(),
                members: members.clone(),
                fenced: false,
            })
            .collect();
        let uids: Vec<String> = (0..300).map(|i| format!("uid-{i}")).collect();
        let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
        let owned: Vec<Vec<bool>> = views
            .iter()
            .map(|v| v.owners(&uids).into_iter().map(|o| v.is_me(o)).collect())
            .collect();
        for (i, uid) in uids.iter().enumerate() {
            assert_eq!(owned.iter().filter(|v| v[i]).count(), 1, "{uid}");
        }
        // 100 each is fair; the cap allows 5% more (105), which leaves at least 300 - 2 x 105.
        assert!(
            owned
                .iter()
                .all(|v| (90..=105).contains(&v.iter().filter(|o| **o).count()))
        );
    }

    #[test]
    fn dead_leases_are_stale_only_after_the_grace() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.observe(&lease("gone", Some("g"), Some(WALL - 20_000), 15), t0, WALL);
        assert!(roster.stale(t0 + 60 * S, STALE_MEMBER_AFTER).is_empty());
        assert_eq!(
            roster.stale(t0 + 601 * S, STALE_MEMBER_AFTER),
            [("gone".to_owned(), Some("1".to_owned()))]
        );
    }

    #[test]
    fn lease_names_are_dns_subdomains_and_distinct_per_replica() {
        assert_eq!(
            member_lease_name("node-attestation-signer", "node-attestation-signer-7d9c-x2k"),
            "node-attestation-signer-node-attestation-signer-7d9c-x2k"
        );
        let upper = member_lease_name("s", "Host_A");
        let lower = member_lease_name("s", "host-a");
        assert_ne!(upper, lower, "two replica names never share a Lease");
        assert!(upper.starts_with("s-host-a-"), "{upper}");
        let long = member_lease_name("s", &"x".repeat(400));
        assert!(long.len() <= 253, "{}", long.len());
        for name in [upper, lower, long] {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            );
            assert!(name.starts_with(|c: char| c.is_ascii_alphanumeric()));
            assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn the_group_must_be_a_label_value() {
        assert!(valid_label_value("node-attestation-signer"));
        assert!(!valid_label_value(""));
        assert!(!valid_label_value(&"a".repeat(64)));
        assert!(!valid_label_value("-a"));
        assert!(!valid_label_value("a/b"));
    }
}
