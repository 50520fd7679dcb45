//! Cluster API's kubeadm bootstrap provider (CABPK) as it decides about a join token, ported
//! line for line from kubernetes-sigs/cluster-api (`bootstrap/kubeadm`, the KubeadmConfig
//! reconciler: `refreshBootstrapTokenIfNeeded`, `rotateMachinePoolBootstrapToken`,
//! `shouldRotate`, `getToken`, `skipTokenRefreshIfExpiringAfter`,
//! `tokenCheckRefreshOrRotationInterval`), so the suites can show that no token state the
//! signer leaves makes it refresh, rotate, re-create or fail.
//!
//! Which branch runs (`Reconcile`, once the bootstrap data exists and the config names a
//! token): an owner without nodeRefs (a Machine before its node registers, a pool before its
//! first instance does) is *refreshed*; a MachinePool with nodeRefs is *rotated*; a Machine
//! with a nodeRef is left alone.

use attestation::join_tokens::TokenSecret;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// What CABPK does with a token at one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing (requeued after `TTL/3`).
    Nothing,
    /// Writes `expiration = now + TTL` on the same Secret.
    Refresh,
    /// Creates a brand-new token and new bootstrap data: instances launched from the old
    /// launch configuration no longer join.
    NewToken,
    /// Returns an error (logged, retried with backoff).
    Error(&'static str),
}

/// The config's owner, as CABPK tells the branches apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A Machine without `status.nodeRef`.
    MachineWithoutNode,
    /// A Machine with `status.nodeRef`.
    MachineWithNode,
    /// A MachinePool without `status.nodeRefs`.
    PoolWithoutNodes,
    /// A MachinePool with `status.nodeRefs`.
    PoolWithNodes,
}

/// CABPK with `--bootstrap-token-ttl` = `ttl` (default 15m).
#[derive(Debug, Clone, Copy)]
pub struct Cabpk {
    /// `--bootstrap-token-ttl`.
    pub ttl: time::Duration,
}

impl Cabpk {
    /// `skipTokenRefreshIfExpiringAfter`: TTL * 5/6.
    pub fn skip_refresh_if_expiring_after(&self) -> time::Duration {
        self.ttl * 5 / 6
    }

    /// `tokenCheckRefreshOrRotationInterval`: TTL / 3.
    pub fn check_interval(&self) -> time::Duration {
        self.ttl / 3
    }

    /// One reconcile of a config owned by `owner` whose token Secret is `secret` (`None`:
    /// gone), at `now`.
    pub fn reconcile(&self, owner: Owner, secret: Option<&TokenSecret>, now: OffsetDateTime) -> Action {
        match owner {
            Owner::MachineWithNode => Action::Nothing,
            Owner::MachineWithoutNode => self.refresh(secret, false, now),
            Owner::PoolWithoutNodes => self.refresh(secret, true, now),
            Owner::PoolWithNodes => self.rotate(secret, now),
        }
    }

    /// `refreshBootstrapTokenIfNeeded`.
    fn refresh(&self, secret: Option<&TokenSecret>, pool: bool, now: OffsetDateTime) -> Action {
        let Some(secret) = secret else {
            // getToken: NotFound. A pool gets a new token; a Machine an error.
            return if pool {
                Action::NewToken
            } else {
                Action::Error("failed to get bootstrap token secret in order to refresh it")
            };
        };
        match secret.expiration.as_deref().filter(|e| !e.is_empty()) {
            // "Token has no valid value for expiration, writing new expiration timestamp"
            None => Action::Refresh,
            Some(text) => match OffsetDateTime::parse(text, &Rfc3339) {
                Err(_) => Action::Error("can't parse expiration time of bootstrap token"),
                // expiration.After(now + TTL*5/6): "Token needs no refresh"
                Ok(expiration) if expiration > now + self.skip_refresh_if_expiring_after() => Action::Nothing,
                Ok(_) => Action::Refresh,
            },
        }
    }

    /// `rotateMachinePoolBootstrapToken` through `shouldRotate`.
    fn rotate(&self, secret: Option<&TokenSecret>, now: OffsetDateTime) -> Action {
        let Some(secret) = secret else {
            // "If the secret is deleted before due to unknown reasons ... should be rotated"
            return Action::NewToken;
        };
        // time.Parse(time.RFC3339, "") fails as well: an absent expiration is an error here.
        match secret.expiration.as_deref().map(|e| OffsetDateTime::parse(e, &Rfc3339)) {
            None | Some(Err(_)) => Action::Error("shouldRotate: expiration does not parse"),
            // expiration.Before(now + TTL/2)
            Some(Ok(expiration)) if expiration < now + self.ttl / 2 => Action::NewToken,
            Some(Ok(_)) => Action::Nothing,
        }
    }
}
