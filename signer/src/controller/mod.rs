//! `node-attestation-signer run`: the management-cluster controller, in three rooms and what
//! stands around them. Each room's module says what it owns and what it may not touch; an
//! arrow between modules only ever points down this list (`scripts/module-graph --check`).
//!
//! - Around the rooms, usable by all: [`metrics`] and [`http`] (`/metrics`, `/healthz`,
//!   `/readyz`), [`events`] (the rate-limited Event sink), [`client`] (apiserver clients),
//!   [`backoff`], [`kubeadm`] (kubeadm's objects by name), [`challenge_key`] (the `tpm/v1`
//!   challenge key), [`boot_policy`] (the `tpm/v1` boot policies' ConfigMaps).
//! - [`management`]: the management-cluster cache: Clusters, the served Clusters' Machines,
//!   MachinePools and KubeadmConfigs, the claim write, Secrets.
//! - [`workload`]: the per-workload-cluster worker: watching and queueing CSRs, deciding one,
//!   applying the decision, and the cluster's other duties.
//! - [`fleet`]: fleet membership and sharding: which Clusters this replica serves, their
//!   Secrets, and the workers it starts and stops.
//! - This module and [`args`]: the wiring: flags, leadership, and the rooms started in order.
//!
//! Decisions are the rule engine's ([`attestation::decide`]); the controller only fetches their
//! inputs and applies their results.

pub mod args;
pub mod backoff;
pub mod boot_policy;
pub mod challenge_key;
pub mod client;
pub mod events;
pub mod fleet;
pub mod http;
pub mod kubeadm;
pub mod management;
pub mod metrics;
pub mod workload;
pub mod workload_access;

pub use args::{Coordination, LogFormat, RunArgs};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,kube_lease_manager=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// `--replica-name` (`POD_NAME`), else the host name.
fn replica_name(args: &RunArgs) -> String {
    args.replica_name
        .clone()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node-attestation-signer".to_owned())
}

/// Unique per process: the replica name and the process id.
fn identity(replica: &str) -> String {
    format!("{replica}_{}", std::process::id())
}

async fn management_client(args: &RunArgs) -> Result<Client> {
    let config = management_config(args.kubeconfig.as_deref()).await?;
    client::build(config).context("cannot build the management client")
}

/// The management cluster's client configuration: `kubeconfig`, else in-cluster, else
/// `~/.kube/config`.
pub(crate) async fn management_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the management kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("management kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no management cluster: not in a Pod and no kubeconfig (use --kubeconfig)")?,
    })
}

/// SIGTERM (what the kubelet sends) or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs the controller until the process is stopped.
pub fn run(args: &RunArgs) -> Result<()> {
    init_logging(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: &RunArgs) -> Result<()> {
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    metrics.client_certificate_duration(args.client_cert_duration);
    metrics.paused_cluster_alert_after(args.paused_cluster_alert_after);
    let ready = Arc::new(AtomicBool::new(false));
    let registry = Arc::new(registry);
    let endpoints = http::Endpoints {
        registry: Arc::clone(&registry),
        ready: Arc::clone(&ready),
    };
    let metrics_addr = http::serve(args.metrics_bind_address, endpoints.clone())
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--metrics-bind-address)",
                args.metrics_bind_address
            )
        })?;
    let health_addr = http::serve(args.health_probe_bind_address, endpoints)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--health-probe-bind-address)",
                args.health_probe_bind_address
            )
        })?;
    tracing::info!(metrics = %metrics_addr, health = %health_addr, "serving /metrics, /healthz, /readyz");

    let client = management_client(args).await?;
    client
        .apiserver_version()
        .await
        .context("the management cluster's apiserver does not answer")?;
    let replica = replica_name(args);
    let identity = identity(&replica);
    let sharded = args.leader_elect && args.coordination == Coordination::Shard;
    // Ready now when leader-elected (a standby serves nothing and must be ready for a rollout to
    // go on); otherwise once this replica serves its share (fleet::readiness).
    let leader_elected = args.leader_elect && !sharded;
    if leader_elected {
        ready.store(true, Ordering::Relaxed);
    }
    if !args.leader_elect && args.coordination == Coordination::Shard {
        tracing::warn!("--coordination=shard is ignored with --leader-elect=false: this process serves every cluster");
    }
    let (membership_client, holder) = (client.clone(), identity.clone());

    let mut leadership = if args.leader_elect && !sharded {
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.leader_election_id)
            .with_namespace(&args.leader_election_namespace)
            .with_identity(&identity)
            .with_duration(15)
            .with_grace(5)
            .build()
            .await
            .with_context(|| {
                format!(
                    "cannot set up leader election with Lease {ns}/{id}: create namespace {ns} (or set \
                     POD_NAMESPACE / --leader-election-namespace), or run one replica with --leader-elect=false",
                    ns = args.leader_election_namespace,
                    id = args.leader_election_id
                )
            })?;
        let (mut channel, task) = manager.watch().await;
        tracing::info!(
            lease = %format!("{}/{}", args.leader_election_namespace, args.leader_election_id),
            %identity,
            "waiting for leadership"
        );
        while !*channel.borrow_and_update() {
            channel
                .changed()
                .await
                .context("leader election stopped before this replica led")?;
        }
        Some((channel, task))
    } else {
        None
    };
    if !sharded {
        metrics.leader(true);
        tracing::info!(%identity, "leading: serving opted-in clusters");
    }

    let challenge_key = Arc::new(challenge_key::ChallengeKeyLoader::new(
        client.clone(),
        &args.leader_election_namespace,
        &args.tpm_challenge_key_secret,
    ));
    // Followed from the start: a failure only holds tpm/v1 CSRs, and a rotation reaches every
    // replica within a period.
    tokio::spawn(Arc::clone(&challenge_key).follow());
    let cloud = Arc::new(crate::cloud::Cloud::new(&args.cloud, args.request_timeout)?);
    tokio::spawn(Arc::clone(&cloud).keep_keys_current());
    let verifiers = crate::verifiers::all(
        challenge_key.key(),
        &crate::verifiers::TpmSettings {
            ek_ca_bundle: args.tpm_ek_ca_bundle.as_deref(),
            trust_on_first_use: args.tpm_trust_on_first_use,
            challenge_ttl: args.tpm_challenge_ttl,
        },
        &args.cloud,
        cloud.google.clone(),
        cloud.sts.clone(),
        cloud.arm.clone(),
    )?;
    let management = management::Management::start(client.clone(), args.namespace.clone()).await?;
    let reporter = Reporter {
        controller: "node-attestation-signer".to_owned(),
        instance: Some(identity),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    let shared = Arc::new(workload::Shared {
        management,
        metrics: metrics.clone(),
        events: events::EventSink::start(recorder.clone(), events::Budget::default(), metrics.event_outcomes()),
        recorder,
        reporter,
        in_flight: workload::inflight::InFlight::new(workload::inflight::Tuning::default(), metrics.in_flight_gauges()),
        verifiers,
        challenge_key,
        boot_policies: Arc::new(boot_policy::BootPolicies::new(
            client.clone(),
            args.tpm_boot_policy
                .as_deref()
                .map(boot_policy::parse_default)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            args.tpm_boot_policy_floor,
        )),
        cloud,
        crypto: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
        settings: workload::Settings {
            client_cert_duration: time::Duration::try_from(args.client_cert_duration)
                .context("--client-cert-duration is too large")?,
            csr_max_age: time::Duration::try_from(args.csr_max_age).context("--csr-max-age is too large")?,
            keep_legacy_autoapprove: args.keep_legacy_autoapprove,
            leave_join_tokens: args.leave_join_tokens,
            join_token_lifetime: join_token_lifetime(args.join_token_lifetime, args.resync_period)?,
            resync: args.resync_period,
            secret_resync: args.secret_resync_period,
            queue_capacity: args.queue_capacity,
            csr_request_bytes: args.csr_request_bytes_per_cluster,
            concurrency: args.concurrency_per_cluster,
            request_timeout: args.request_timeout,
            workload_certificate_duration: workload_certificate_duration(args.workload_certificate_duration)?,
        },
        states_changed: tokio::sync::Notify::new(),
    });
    // Joined only once the watches have started (the Cluster API objects of its share are then
    // listed as it gains them): until then the peers keep this share.
    let mut membership = if sharded {
        let settings = fleet::membership::Settings::new(
            &args.leader_election_namespace,
            &args.leader_election_id,
            &replica,
            &holder,
        );
        Some(fleet::membership::Membership::join(membership_client, settings, metrics.clone()).await?)
    } else {
        None
    };
    let scope = match &membership {
        Some(membership) => fleet::scope::Scope::Shard(membership.view()),
        None => fleet::scope::Scope::Everything,
    };
    // Its own view of the shard (the same membership), for the Clusters that are not opted in.
    let templated_scope = match &membership {
        Some(membership) => fleet::scope::Scope::Shard(membership.view()),
        None => fleet::scope::Scope::Everything,
    };
    let templated = tokio::spawn(fleet::templated::TemplatedScan::new(Arc::clone(&shared), templated_scope).run());
    let fleet = fleet::Fleet::new(shared, scope);
    let fleet = if leader_elected {
        fleet
    } else {
        fleet.ready_when_serving(Arc::clone(&ready))
    };
    let fleet = tokio::spawn(fleet.run());

    let lost = async {
        match leadership.as_mut() {
            Some((channel, _)) => loop {
                if channel.changed().await.is_err() || !*channel.borrow_and_update() {
                    return;
                }
            },
            None => std::future::pending().await,
        }
    };
    let membership_stopped = async {
        match membership.as_mut() {
            Some(membership) => membership.stopped().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = membership_stopped => {
            fleet.abort();
            templated.abort();
            bail!("the membership Lease tasks stopped; exiting so the other replicas take this share");
        }
        () = lost => {
            metrics.leader(false);
            fleet.abort();
            templated.abort();
            // Exiting is the safe way out: a replica that lost its Lease must stop writing now,
            // and its restart re-joins the election with empty caches.
            bail!("lost the leader Lease; exiting so another replica leads");
        }
        () = terminated() => {
            tracing::info!("terminated; stopping");
            fleet.abort();
            templated.abort();
            // Hand this replica's share over now: the peers see the Lease deleted.
            if let Some(membership) = membership {
                membership.leave().await;
            }
            // Hand the Lease over now instead of letting a standby wait out its duration.
            if let Some((channel, task)) = leadership {
                drop(channel);
                if let Ok(Ok(Ok(manager))) = tokio::time::timeout(std::time::Duration::from_secs(3), task).await {
                    let _ = manager.release().await;
                }
            }
            metrics.leader(false);
            Ok(())
        }
    }
}

/// `--workload-certificate-duration`, checked: renewed after two thirds of its life and
/// retried at least every 10 seconds when that fails, a certificate of less than 3 minutes
/// would leave little room for a failed renewal (or for clocks that disagree).
fn workload_certificate_duration(lifetime: std::time::Duration) -> Result<time::Duration> {
    if lifetime < std::time::Duration::from_secs(180) {
        anyhow::bail!(
            "--workload-certificate-duration {} is shorter than 3m: the signer's own certificate is renewed after two thirds of its life, and a shorter one leaves no room to retry a failed renewal; raise it (default 1h)",
            humantime::format_duration(lifetime)
        );
    }
    time::Duration::try_from(lifetime).context("--workload-certificate-duration is too large")
}

/// `--join-token-lifetime`, checked against `--resync-period`: a MachinePool's token is looked
/// at once per resync and extended when half its lifetime is left, so a lifetime of less than
/// four resyncs could lapse between two looks.
fn join_token_lifetime(lifetime: std::time::Duration, resync: std::time::Duration) -> Result<time::Duration> {
    if lifetime < resync.saturating_mul(4) {
        anyhow::bail!(
            "--join-token-lifetime {} is shorter than four --resync-period ({}): a MachinePool's token could lapse between two looks; raise it (default 48h)",
            humantime::format_duration(lifetime),
            humantime::format_duration(resync)
        );
    }
    if lifetime > MAX_JOIN_TOKEN_LIFETIME {
        anyhow::bail!(
            "--join-token-lifetime {} is longer than {}: a MachinePool's join token is kept valid at most that far ahead, so that a token the signer stops looking after expires within a week; lower it (default 48h)",
            humantime::format_duration(lifetime),
            humantime::format_duration(MAX_JOIN_TOKEN_LIFETIME)
        );
    }
    time::Duration::try_from(lifetime).context("--join-token-lifetime is too large")
}

/// The longest `--join-token-lifetime`: a join token the signer stops looking after (the Cluster
/// opted out, the signer gone) expires within a week. The workload admission policy refuses the
/// removal of an `expiration`; it cannot bound the value (CEL cannot decode a Secret's base64).
const MAX_JOIN_TOKEN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_token_lifetime_is_bounded_both_ways() {
        let resync = std::time::Duration::from_secs(60);
        let hours = |h: u64| std::time::Duration::from_secs(h * 3600);
        assert_eq!(
            join_token_lifetime(hours(48), resync).unwrap(),
            time::Duration::hours(48)
        );
        assert!(join_token_lifetime(hours(168), resync).is_ok());
        let long = join_token_lifetime(hours(169), resync).unwrap_err().to_string();
        assert!(long.contains("longer than 7days"), "{long}");
        let short = join_token_lifetime(std::time::Duration::from_secs(120), resync)
            .unwrap_err()
            .to_string();
        assert!(short.contains("shorter than four --resync-period"), "{short}");
    }
}
