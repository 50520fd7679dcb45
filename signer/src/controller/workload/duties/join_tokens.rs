//! SPEC section 7's join-token duty: for a Cluster whose authorized attestors exclude
//! `insecure`, each MachinePool's join token is kept valid for the pool's life and each
//! claimed Machine's is deleted once its node has joined. What to do with which token is
//! [`attestation::join_tokens`]'s (pure, with the bootstrap provider's thresholds written
//! down); this duty reads the token Secrets, writes what it says, and reports each change as
//! an Event on the MachinePool or Machine and a counter. Its workload role has no `get` on
//! Secrets: it reads a token with a PATCH that tests the Secret's type and changes nothing
//! ([`join_tokens::read_patch`]), so the apiserver never hands it another Secret.
//!
//! It never creates a token Secret (the bootstrap provider re-creates a pool's missing token,
//! and two creators would fight), writes only Secrets of type `bootstrap.kubernetes.io/token`
//! whose `token-id` is the one named, with the Secret's resourceVersion (extension) or UID and
//! resourceVersion (deletion) as precondition, and confirms every deletion on a fresh read of
//! the Cluster's Machines, MachinePools, KubeadmConfigs and templates.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use attestation::join_tokens::{self, Joined, Keep, LeftBecause, TOKEN_NAMESPACE, TokenPlan, secret_name};
use attestation::machine::{ClusterView, Inventory, TargetRef};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use time::OffsetDateTime;

use crate::controller::kubeadm::token_secret;
use crate::controller::management::fresh::FreshRead;
use crate::controller::workload::worker::Worker;

/// How often the Cluster's claimed Machines are looked at for a token to retire while a claim is
/// recent (a claimed Machine's token goes within seconds of its node joining); otherwise, and
/// for MachinePools' tokens, once per resync period: a quiet Cluster costs one pass per resync.
const RETIRE_TICK: Duration = Duration::from_secs(2);

/// How long after a claim the duty looks every [`RETIRE_TICK`]: the node registers, and
/// Cluster API writes its nodeRef, within this.
const CLOSE_LOOK: Duration = Duration::from_secs(120);

/// What the duty remembers between passes.
#[derive(Default)]
struct TokenDuty {
    /// Why the Cluster's tokens are left alone, as last reported.
    left: Option<LeftBecause>,
    /// When the pools' tokens were last read.
    pools_read: Option<Instant>,
    /// Tokens deleted, or found gone: never read again.
    gone: HashSet<String>,
    /// Tokens not to look at again before then: a retirement the fresh read did not confirm,
    /// or a request that failed.
    not_before: HashMap<String, Instant>,
    /// Claimed Machines (UID) whose Node registered before their nodeRef was written, and when
    /// that was first seen.
    registered: HashMap<String, OffsetDateTime>,
    /// Tokens already reported as missing or as not a token (reported once each).
    reported: HashSet<String>,
    /// The workload cluster refused the signer a token Secret (403): no token request before
    /// then (its RBAC is not `config/workload`'s; said once per pause, not once per token).
    forbidden_until: Option<Instant>,
}

/// How long the duty pauses after the workload cluster refuses it a token Secret (403).
const FORBIDDEN_PAUSE: Duration = Duration::from_secs(300);

impl Worker {
    /// SPEC section 7, "Join tokens": runs until the worker stops.
    pub(in crate::controller::workload) async fn join_token_loop(self: Arc<Self>) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), TOKEN_NAMESPACE);
        let mut duty = TokenDuty::default();
        let mut close_until = Instant::now() + CLOSE_LOOK;
        loop {
            self.join_token_pass(&api, &mut duty).await;
            let tick = if Instant::now() < close_until {
                RETIRE_TICK.min(self.shared.settings.resync)
            } else {
                self.shared.settings.resync
            };
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = self.claim_written.notified() => close_until = Instant::now() + CLOSE_LOOK,
            }
        }
    }

    async fn join_token_pass(&self, api: &Api<Secret>, duty: &mut TokenDuty) {
        let management = &self.shared.management;
        // A Cluster paused since the worker started gets no token read or written (SPEC
        // section 7); the fleet stops this worker at its next pass.
        let Some(cluster) = self.served_cluster() else {
            return;
        };
        match join_tokens::managed(&cluster, self.shared.settings.leave_join_tokens) {
            Err(why) => {
                if duty.left != Some(why) {
                    tracing::info!(%why, "join tokens left to the bootstrap provider");
                    duty.left = Some(why);
                }
                return;
            }
            Ok(()) => duty.left = None,
        }
        if duty.forbidden_until.is_some_and(|until| Instant::now() < until) {
            return;
        }
        let Some(inventory) = management.inventory(&cluster) else {
            return;
        };
        let now = OffsetDateTime::now_utc();
        let joined = self.joined_states(&inventory, duty, now);
        let plans = join_tokens::plan(&cluster, &inventory, &[], |m| lookup(&joined, m.uid()), now);
        let pools_due = duty
            .pools_read
            .is_none_or(|at| at.elapsed() >= self.shared.settings.resync);
        let mut candidates = Vec::new();
        for (id, plan) in &plans {
            match plan {
                TokenPlan::Keep { pools } if pools_due => self.keep_pool_token(api, id, pools, duty).await,
                TokenPlan::Retire { .. }
                    if !duty.gone.contains(id) && duty.not_before.get(id).is_none_or(|t| Instant::now() >= *t) =>
                {
                    candidates.push(id.clone());
                }
                _ => {}
            }
        }
        if pools_due {
            duty.pools_read = Some(Instant::now());
        }
        if !candidates.is_empty() {
            self.retire_tokens(api, &cluster, &candidates, duty).await;
        }
    }

    /// Whether each claimed Machine's node has joined: `status.nodeRef`, or the Node its claim
    /// names carrying its provider ID (first seen when, remembered in `duty`).
    fn joined_states(
        &self,
        inventory: &Inventory,
        duty: &mut TokenDuty,
        now: OffsetDateTime,
    ) -> HashMap<String, Joined> {
        let mut states = HashMap::new();
        for machine in &inventory.machines {
            if machine.valid_claim().is_none() {
                continue;
            }
            let state = if machine.node_ref().is_some() {
                Joined::NodeRef
            } else {
                if join_tokens::claimed_node_registered(machine, &self.nodes) {
                    Joined::Registered(*duty.registered.entry(machine.uid().to_owned()).or_insert(now))
                } else {
                    Joined::No
                }
            };
            states.insert(machine.uid().to_owned(), state);
        }
        duty.registered
            .retain(|uid, _| matches!(states.get(uid), Some(Joined::Registered(_))));
        states
    }

    /// Keeps pool token `id` valid ([`join_tokens::keep`]).
    async fn keep_pool_token(&self, api: &Api<Secret>, id: &str, pools: &[TargetRef], duty: &mut TokenDuty) {
        let name = secret_name(id);
        let secret = match read_token(api, &name).await {
            Ok(TokenRead::Token(secret)) => secret,
            Ok(TokenRead::NotAToken) => {
                self.not_a_token(id, &join_tokens::NotAToken::TypeTestFailed, pools, duty);
                return;
            }
            Ok(TokenRead::Gone) => {
                if duty.reported.insert(id.to_owned()) {
                    tracing::info!(
                        token = id,
                        "a MachinePool's join token is gone; the bootstrap provider creates a new one"
                    );
                    for pool in pools {
                        self.token_event(
                            pool,
                            EventType::Normal,
                            "JoinTokenMissing",
                            &format!("join token {id} (Secret {TOKEN_NAMESPACE}/{name}) is gone from the workload cluster: left to the bootstrap provider, which creates a new one for the pool; the signer keeps that one valid"),
                        );
                    }
                }
                return;
            }
            Err(e) => {
                self.token_request_failed(duty, id, "read", &e);
                return;
            }
        };
        let view = token_secret(&secret);
        let keep = match join_tokens::keep(
            &view,
            id,
            OffsetDateTime::now_utc(),
            self.shared.settings.join_token_lifetime,
        ) {
            Ok(keep) => {
                duty.reported.remove(id);
                keep
            }
            Err(e) => {
                self.not_a_token(id, &e, pools, duty);
                return;
            }
        };
        let Keep::Extend { from, to } = keep else {
            return;
        };
        let expiration = join_tokens::format_expiration(to);
        let Some(resource_version) = secret.resource_version() else {
            return;
        };
        let patch = match json_patch(join_tokens::extension_patch(&resource_version, &expiration)) {
            Ok(patch) => patch,
            Err(e) => return self.token_request_failed(duty, id, "extend", &e),
        };
        match api.patch(&name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                let from = from.as_deref().unwrap_or("(none)");
                tracing::info!(token = id, from, to = %expiration, "kept a MachinePool's join token valid");
                self.shared.metrics.join_token_change(&self.key, "extended");
                for pool in pools {
                    self.token_event(
                        pool,
                        EventType::Normal,
                        "JoinTokenExtended",
                        &format!("join token {id} kept valid for the pool: expiration {from} -> {expiration} (instances started from an older launch configuration still join; attestation decides each node's identity)"),
                    );
                }
            }
            // The bootstrap provider wrote it meanwhile: the next pass reads it again.
            Err(kube::Error::Api(status)) if status.code == 409 => duty.pools_read = None,
            Err(e) => self.token_request_failed(duty, id, "extend", &e),
        }
    }

    /// Confirms the retirement of `ids` on a fresh read of the Cluster's objects and templates,
    /// then deletes each token still retired.
    async fn retire_tokens(&self, api: &Api<Secret>, cluster: &ClusterView, ids: &[String], duty: &mut TokenDuty) {
        let management = &self.shared.management;
        let later = Instant::now() + self.shared.settings.resync;
        let hold = |duty: &mut TokenDuty, until: Instant| {
            for id in ids {
                duty.not_before.insert(id.clone(), until);
            }
        };
        let read = match management.fresh_inventory(cluster, OffsetDateTime::now_utc()).await {
            Ok(FreshRead::Read(inventory)) => management.token_templates(cluster).await.map(|t| (inventory, t)),
            Ok(FreshRead::TooSoon(wait)) => {
                // Reads of a Cluster are spaced (management::fresh): looked at once the next may start.
                hold(duty, Instant::now() + wait);
                return;
            }
            Err(e) => Err(e),
        };
        let (inventory, templates) = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "cannot confirm a join token's retirement; trying again later");
                hold(duty, later);
                return;
            }
        };
        let now = OffsetDateTime::now_utc();
        let joined = self.joined_states(&inventory, duty, now);
        let confirmed: BTreeMap<String, TokenPlan> =
            join_tokens::plan(cluster, &inventory, &templates, |m| lookup(&joined, m.uid()), now);
        for id in ids {
            match confirmed.get(id) {
                Some(TokenPlan::Retire { machines }) => self.retire_token(api, id, machines, duty).await,
                plan => {
                    tracing::debug!(
                        token = id,
                        ?plan,
                        "a join token's retirement is not confirmed on a fresh read"
                    );
                    duty.not_before.insert(id.clone(), later);
                }
            }
        }
    }

    /// Deletes retired token `id` ([`join_tokens::retirable`]).
    async fn retire_token(&self, api: &Api<Secret>, id: &str, machines: &[TargetRef], duty: &mut TokenDuty) {
        let name = secret_name(id);
        let secret = match read_token(api, &name).await {
            Ok(TokenRead::Token(secret)) => secret,
            Ok(TokenRead::NotAToken) => {
                self.not_a_token(id, &join_tokens::NotAToken::TypeTestFailed, machines, duty);
                duty.gone.insert(id.to_owned());
                return;
            }
            Ok(TokenRead::Gone) => {
                duty.gone.insert(id.to_owned());
                return;
            }
            Err(e) => {
                self.token_request_failed(duty, id, "read", &e);
                return;
            }
        };
        if let Err(e) = join_tokens::retirable(&token_secret(&secret), id) {
            self.not_a_token(id, &e, machines, duty);
            duty.gone.insert(id.to_owned());
            return;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.uid(),
                resource_version: secret.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                duty.gone.insert(id.to_owned());
                tracing::info!(
                    token = id,
                    machines = machines.len(),
                    "deleted a claimed Machine's join token"
                );
                self.shared.metrics.join_token_change(&self.key, "deleted");
                for machine in machines {
                    self.token_event(
                        machine,
                        EventType::Normal,
                        "JoinTokenDeleted",
                        &format!("join token {id} (Secret {TOKEN_NAMESPACE}/{name}) deleted: the Machine is claimed and its node has joined, and nothing that may still join names the token"),
                    );
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                duty.gone.insert(id.to_owned());
            }
            // Changed since read (409): read again at the next tick.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => self.token_request_failed(duty, id, "delete", &e),
        }
    }

    /// A token request that failed: a refusal (403) pauses the duty for [`FORBIDDEN_PAUSE`] and
    /// says what to do, once per pause; anything else is tried again after a resync period.
    fn token_request_failed(&self, duty: &mut TokenDuty, id: &str, what: &str, error: &kube::Error) {
        let now = Instant::now();
        match error {
            kube::Error::Api(status) if status.code == 403 => {
                if duty.forbidden_until.is_none_or(|until| now >= until) {
                    tracing::warn!(
                        token = id,
                        error = %error,
                        "the signer may not {what} join tokens in the workload cluster: apply config/workload (Role node-attestation-signer-join-tokens in kube-system), or run with --leave-join-tokens; join tokens are left alone for {}",
                        humantime::format_duration(FORBIDDEN_PAUSE)
                    );
                }
                duty.forbidden_until = Some(now + FORBIDDEN_PAUSE);
            }
            _ => {
                tracing::warn!(token = id, error = %error, "cannot {what} a join token; trying again later");
                duty.not_before.insert(id.to_owned(), now + self.shared.settings.resync);
            }
        }
    }

    /// A Secret named like token `id` that is not that token: never written, reported once.
    fn not_a_token(&self, id: &str, error: &join_tokens::NotAToken, targets: &[TargetRef], duty: &mut TokenDuty) {
        if duty.reported.insert(id.to_owned()) {
            let name = secret_name(id);
            tracing::warn!(token = id, %error, "a Secret named like a join token is not one; left alone");
            for target in targets {
                self.token_event(
                    target,
                    EventType::Warning,
                    "JoinTokenNotManaged",
                    &format!(
                        "Secret {TOKEN_NAMESPACE}/{name} is not join token {id}: {error}; the signer leaves it alone"
                    ),
                );
            }
        }
    }

    fn token_event(&self, target: &TargetRef, type_: EventType, reason: &str, text: &str) {
        self.report(self.target_reference(target), type_, reason, "JoinToken", text);
    }
}

/// What [`read_token`] found under a token's name.
enum TokenRead {
    /// A bootstrap token Secret.
    Token(Box<Secret>),
    /// No Secret of that name.
    Gone,
    /// A Secret of that name that is not a bootstrap token: the apiserver refused the read's
    /// type test (422), and none of its content came back.
    NotAToken,
}

/// Reads the token Secret `name` the only way the signer's workload role allows: a PATCH whose
/// one operation tests its type ([`join_tokens::read_patch`]), so no Secret but a bootstrap
/// token's ever reaches the signer (SPEC section 7, revision 5). The patch changes nothing:
/// nothing is written.
async fn read_token(api: &Api<Secret>, name: &str) -> Result<TokenRead, kube::Error> {
    match api
        .patch(name, &PatchParams::default(), &json_patch(join_tokens::read_patch())?)
        .await
    {
        Ok(secret) => Ok(TokenRead::Token(Box::new(secret))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(TokenRead::Gone),
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(TokenRead::NotAToken),
        Err(e) => Err(e),
    }
}

/// A JSON Patch built by [`join_tokens`]. It always converts; were it not to, the request is
/// not sent (never an empty patch in its place, which would read any Secret).
fn json_patch(operations: serde_json::Value) -> Result<Patch<()>, kube::Error> {
    serde_json::from_value(operations)
        .map(Patch::Json)
        .map_err(kube::Error::SerdeError)
}

fn lookup(joined: &HashMap<String, Joined>, uid: &str) -> Joined {
    joined.get(uid).copied().unwrap_or(Joined::No)
}
