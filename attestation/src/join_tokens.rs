//! SPEC section 7, "Join tokens": which of an opted-in Cluster's kubeadm join tokens the signer
//! keeps valid (a MachinePool's, for the pool's life), which it deletes (a claimed Machine's,
//! once its node has joined), and which it leaves alone. Pure: the signer's duty reads the
//! inventory and the token Secrets, asks here, and writes what comes back.
//!
//! # Why, and the bootstrap provider's thresholds
//!
//! Cluster API's kubeadm bootstrap provider (CABPK, `bootstrap/kubeadm/.../kubeadmconfig`,
//! `refreshBootstrapTokenIfNeeded`, `rotateMachinePoolBootstrapToken`, `shouldRotate`) creates
//! each join token with `expiration = now + TTL` (its `--bootstrap-token-ttl`, default 15m)
//! and looks at it every `TTL/3`:
//!
//! - owner without nodeRefs (a Machine before its node registers, a pool before its first
//!   instance does): *refresh*, writing `expiration = now + TTL` when it is not after
//!   `now + 5/6 TTL` (or absent); a Secret that is gone is an error for a Machine, and a
//!   brand-new token (new bootstrap data) for a pool;
//! - a pool with nodeRefs: *rotate* to a brand-new token (new bootstrap data, so instances
//!   launched from the old launch configuration fail) when `expiration` is before
//!   `now + TTL/2`, when the Secret is gone, and it errors when `expiration` does not parse;
//! - a Machine with a nodeRef: nothing, ever.
//!
//! So a pool's token is kept with `expiration` between `now + lifetime/2` and
//! `now + lifetime` (written only when it falls below the half: one write per `lifetime/2`,
//! never a flap), which keeps CABPK on its "no refresh, no rotation" branch for every TTL up to
//! `lifetime/2 * 6/5` minus the signer's resync period (28 hours at the default 48h lifetime);
//! the signer never creates a missing Secret (CABPK's re-creation is the one path there) and
//! always leaves a parseable RFC 3339 `expiration`. A Machine's token is deleted only once the
//! Machine has a valid claim and its node has joined (`status.nodeRef`, CABPK's own test, or a
//! Node registered with the Machine's provider ID for [`REGISTERED_GRACE`] when nodeRef lags),
//! and only when nothing else that could still join names it.

use std::collections::BTreeMap;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::machine::{ClusterView, Inventory, MachineView};
use crate::target::TargetRef;

/// Cluster annotation: `"leave"` leaves the Cluster's join tokens to the bootstrap provider.
pub const ANNOTATION_JOIN_TOKENS: &str = "cluster.x-k8s.io/kubelet-join-tokens";

/// The only value of [`ANNOTATION_JOIN_TOKENS`] that means something.
pub const JOIN_TOKENS_LEAVE: &str = "leave";

/// The Secret type of a bootstrap token (`bootstrap.kubernetes.io/token`).
pub const SECRET_TYPE_BOOTSTRAP_TOKEN: &str = "bootstrap.kubernetes.io/token";

/// The bootstrap token Secrets' namespace in the workload cluster.
pub const TOKEN_NAMESPACE: &str = "kube-system";

/// How long a Node registered with a claimed Machine's provider ID waits for `status.nodeRef`
/// before its token is deleted anyway: Cluster API's Machine controller writes nodeRef within
/// seconds of registration, and deleting before it does could make CABPK try one refresh of a
/// token that is gone.
pub const REGISTERED_GRACE: time::Duration = time::Duration::seconds(10);

/// Whether `id` is a bootstrap token ID (`[a-z0-9]{6}`, as the apiserver's bootstrap token
/// authenticator and kubeadm require): a KubeadmConfig naming anything else names no token the
/// signer would touch.
pub fn is_token_id(id: &str) -> bool {
    id.len() == 6 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The name of token `id`'s Secret.
pub fn secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// Why a Cluster's tokens are left to the bootstrap provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftBecause {
    /// `insecure` is an authorized attestor: the token is what keeps strangers out.
    InsecureAllowed,
    /// The Cluster's [`ANNOTATION_JOIN_TOKENS`] says `leave`.
    ClusterAnnotation,
    /// The signer runs with `--leave-join-tokens`.
    Flag,
}

impl std::fmt::Display for LeftBecause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::InsecureAllowed => "insecure is an authorized attestor: the join token is what keeps strangers out",
            Self::ClusterAnnotation => "the Cluster is annotated cluster.x-k8s.io/kubelet-join-tokens: leave",
            Self::Flag => "the signer runs with --leave-join-tokens",
        })
    }
}

/// Whether the signer manages `cluster`'s join tokens.
pub fn managed(cluster: &ClusterView, leave_flag: bool) -> Result<(), LeftBecause> {
    if leave_flag {
        Err(LeftBecause::Flag)
    } else if cluster.annotation(ANNOTATION_JOIN_TOKENS) == Some(JOIN_TOKENS_LEAVE) {
        Err(LeftBecause::ClusterAnnotation)
    } else if cluster.allows("insecure") {
        Err(LeftBecause::InsecureAllowed)
    } else {
        Ok(())
    }
}

/// Whether a Machine's node has joined, as the duty sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// `status.nodeRef` is set.
    NodeRef,
    /// The Node the Machine's claim names is registered carrying its provider ID
    /// ([`claimed_node_registered`]), first seen then.
    Registered(OffsetDateTime),
    /// Neither.
    No,
}

/// Whether a claimed Machine's node has registered, for [`Joined::Registered`] (SPEC section
/// 7, revision 5): the Node its claim names exists and carries the Machine's provider ID. Any
/// other Node carrying the provider ID does not count: a Node's `spec.providerID` is written by
/// its own kubelet, so another node could otherwise get the Machine's token deleted early. A
/// Machine without a valid claim, or a Node list that cannot be read, is not registered.
pub fn claimed_node_registered(machine: &MachineView, nodes: &dyn crate::rules::NodeDirectory) -> bool {
    let (Some(claim), Some(provider_id)) = (machine.valid_claim(), machine.provider_id()) else {
        return false;
    };
    matches!(
        nodes.node(claim.node_name),
        crate::rules::NodeLookup::Found(node) if node.provider_id.as_deref() == Some(provider_id)
    )
}

/// Something that still needs a token, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `Machine <name>`, `KubeadmConfig <name>`, ...
    pub what: String,
    /// Why it holds the token.
    pub why: &'static str,
}

/// What the signer does with one join token of a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenPlan {
    /// A MachinePool bootstraps from it: kept valid ([`keep`]).
    Keep {
        /// The pools.
        pools: Vec<TargetRef>,
    },
    /// Every Machine naming it is claimed and joined: deleted ([`retirable`]).
    Retire {
        /// The Machines (the first gets the Event).
        machines: Vec<TargetRef>,
    },
    /// Something that may still join names it: left as it is.
    Hold {
        /// Who holds it.
        holders: Vec<Holder>,
    },
}

/// A template that names a join token: Machines made from it later would join with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateToken {
    /// `KubeadmConfigTemplate <name>`, `KubeadmControlPlane <name>`, ...
    pub what: String,
    /// The token ID it names.
    pub token_id: String,
}

#[derive(Default)]
struct Users {
    pools: Vec<TargetRef>,
    done: Vec<TargetRef>,
    holders: Vec<Holder>,
}

/// Every join token the Cluster's KubeadmConfigs name, by token ID, with its plan. `joined`
/// says whether a Machine's node has joined; `templates` are the templates of the Cluster's
/// namespace that name tokens (empty from the cache: a [`TokenPlan::Retire`] is confirmed on a
/// fresh read that lists them).
pub fn plan(
    cluster: &ClusterView,
    inventory: &Inventory,
    templates: &[TemplateToken],
    joined: impl Fn(&MachineView) -> Joined,
    now: OffsetDateTime,
) -> BTreeMap<String, TokenPlan> {
    let configs: BTreeMap<&str, &str> = inventory
        .kubeadm_configs
        .iter()
        .filter(|c| c.serves_cluster(&cluster.name))
        .filter_map(|c| Some((c.name(), c.join_token_id().filter(|id| is_token_id(id))?)))
        .collect();
    let mut users: BTreeMap<String, Users> = BTreeMap::new();
    let mut referenced: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for machine in &inventory.machines {
        let Some(config) = machine.bootstrap_config().filter(|c| c.is_kubeadm()) else {
            continue;
        };
        let Some((name, id)) = configs.get_key_value(&*config.name) else {
            continue;
        };
        referenced.insert(name);
        let entry = users.entry((*id).to_owned()).or_default();
        let what = format!("Machine {}", machine.name());
        let why = if machine.valid_claim().is_none() {
            Some("not claimed yet: its node may still join with the token")
        } else {
            match joined(machine) {
                Joined::NodeRef => None,
                Joined::Registered(since) if since + REGISTERED_GRACE <= now => None,
                Joined::Registered(_) => Some("claimed, its Node registered moments ago (waiting for status.nodeRef)"),
                Joined::No => {
                    Some("claimed, its node not registered yet (a lost certificate is requested again with the token)")
                }
            }
        };
        match why {
            None => entry.done.push(machine.target()),
            Some(why) => entry.holders.push(Holder { what, why }),
        }
    }
    for pool in &inventory.pools {
        let Some(config) = pool.bootstrap_config.as_ref().filter(|c| c.is_kubeadm()) else {
            continue;
        };
        let Some((name, id)) = configs.get_key_value(&*config.name) else {
            continue;
        };
        referenced.insert(name);
        let entry = users.entry((*id).to_owned()).or_default();
        if pool.deleting {
            entry.holders.push(Holder {
                what: format!("MachinePool {}", pool.name),
                why: "being deleted: its token is left to expire",
            });
        } else {
            entry.pools.push(pool.target());
        }
    }
    for (name, id) in &configs {
        if !referenced.contains(name) {
            users.entry((*id).to_owned()).or_default().holders.push(Holder {
                what: format!("KubeadmConfig {name}"),
                why: "names it, and no Machine or MachinePool of the Cluster refers to it yet",
            });
        }
    }
    for template in templates {
        if let Some(entry) = users.get_mut(&template.token_id) {
            entry.holders.push(Holder {
                what: template.what.clone(),
                why: "names it: Machines created from it later would join with it",
            });
        }
    }
    users
        .into_iter()
        .map(|(id, u)| {
            let plan = if !u.pools.is_empty() {
                TokenPlan::Keep { pools: u.pools }
            } else if !u.holders.is_empty() || u.done.is_empty() {
                TokenPlan::Hold { holders: u.holders }
            } else {
                TokenPlan::Retire { machines: u.done }
            };
            (id, plan)
        })
        .collect()
}

/// What the signer read of a token Secret (`data` decoded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSecret {
    /// `type`.
    pub type_: Option<String>,
    /// `data.token-id`.
    pub token_id: Option<String>,
    /// `data.expiration`.
    pub expiration: Option<String>,
}

impl TokenSecret {
    /// From a Secret's `type` and its decoded `data` (looked up by key): the token's secret
    /// half is never read out of it.
    pub fn from_data<'a>(type_: Option<&str>, data: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        let text = |key: &str| data(key).map(|v| String::from_utf8_lossy(v).into_owned());
        Self {
            type_: type_.map(str::to_owned),
            token_id: text("token-id"),
            expiration: text("expiration"),
        }
    }
}

/// What to do with a MachinePool's token Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// Valid for long enough: nothing to write.
    Fresh {
        /// Its expiration.
        expires: OffsetDateTime,
    },
    /// Write `expiration = to`.
    Extend {
        /// What it said before (verbatim, for the Event), if anything.
        from: Option<String>,
        /// The new expiration.
        to: OffsetDateTime,
    },
}

/// Why a Secret named like a token is not touched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAToken {
    /// Another type.
    #[error("its type is {0:?}, not bootstrap.kubernetes.io/token")]
    Type(Option<String>),
    /// Its type is not a bootstrap token's, as the apiserver found when it refused
    /// [`read_patch`]'s test: nothing of the Secret was read.
    #[error(
        "it is not of type bootstrap.kubernetes.io/token (the apiserver refused the type test; nothing of it was read)"
    )]
    TypeTestFailed,
    /// Its `token-id` is another one.
    #[error("its token-id is {found:?}, not {expected:?}")]
    TokenId {
        /// Expected.
        expected: String,
        /// Found.
        found: Option<String>,
    },
}

/// Checks that the Secret is token `id`'s: the signer writes nothing else.
pub fn is_token(secret: &TokenSecret, id: &str) -> Result<(), NotAToken> {
    if secret.type_.as_deref() != Some(SECRET_TYPE_BOOTSTRAP_TOKEN) {
        return Err(NotAToken::Type(secret.type_.clone()));
    }
    if secret.token_id.as_deref() != Some(id) {
        return Err(NotAToken::TokenId {
            expected: id.to_owned(),
            found: secret.token_id.clone(),
        });
    }
    Ok(())
}

/// What to do with pool token `id`'s Secret at `now`: extend to `now + lifetime` when its
/// expiration is absent, unparseable (CABPK errors on it) or less than `lifetime/2` ahead.
pub fn keep(secret: &TokenSecret, id: &str, now: OffsetDateTime, lifetime: time::Duration) -> Result<Keep, NotAToken> {
    is_token(secret, id)?;
    let expires = secret
        .expiration
        .as_deref()
        .and_then(|e| OffsetDateTime::parse(e, &Rfc3339).ok());
    Ok(match expires {
        Some(expires) if expires >= now + lifetime / 2 => Keep::Fresh { expires },
        _ => Keep::Extend {
            from: secret.expiration.clone(),
            to: whole_seconds(now + lifetime),
        },
    })
}

/// Checks that retired token `id`'s Secret may be deleted.
pub fn retirable(secret: &TokenSecret, id: &str) -> Result<(), NotAToken> {
    is_token(secret, id)
}

/// An expiration as CABPK and kubeadm write it: RFC 3339 in UTC, whole seconds.
pub fn format_expiration(at: OffsetDateTime) -> String {
    let at = whole_seconds(at).to_offset(time::UtcOffset::UTC);
    at.format(&Rfc3339).unwrap_or_default()
}

fn whole_seconds(at: OffsetDateTime) -> OffsetDateTime {
    at.replace_nanosecond(0).unwrap_or(at)
}

/// The JSON Patch (RFC 6902) the signer reads a token Secret with (SPEC section 7, revision 5:
/// no read of Secrets it does not manage). RBAC cannot narrow `get` to one Secret type or to a
/// name prefix, so the signer's workload role has no `get` on Secrets at all: it reads a token
/// with a PATCH whose only operation tests that the Secret is a bootstrap token. The apiserver
/// applies that test before anything else: a Secret of any other type is refused (422) and none
/// of its content comes back, on every Kubernetes version, with or without an admission policy;
/// a bootstrap token's patch changes nothing, so nothing is written, and the answer is the Secret.
pub fn read_patch() -> serde_json::Value {
    serde_json::json!([is_a_token()])
}

/// The JSON Patch that moves a token's `expiration` to `expiration` (an RFC 3339 time, as
/// [`format_expiration`] writes it), with `resource_version` as precondition (the apiserver
/// answers 409 when the Secret changed since it was read). It changes nothing else, and, like
/// [`read_patch`], applies only to a bootstrap token: the admission policy shipped with the
/// workload role refuses any other change, and where no such policy exists (Kubernetes before
/// 1.30) this form is the only Secret write the signer can make.
pub fn extension_patch(resource_version: &str, expiration: &str) -> serde_json::Value {
    use base64::Engine;
    serde_json::json!([
        is_a_token(),
        {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/data/expiration",
         "value": base64::engine::general_purpose::STANDARD.encode(expiration)},
    ])
}

fn is_a_token() -> serde_json::Value {
    serde_json::json!({"op": "test", "path": "/type", "value": SECRET_TYPE_BOOTSTRAP_TOKEN})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Secret write and read the signer makes tests first that the Secret is a bootstrap
    /// token, and an extension changes `expiration` only, under the read resourceVersion.
    #[test]
    fn token_patches_test_the_type_first_and_change_only_the_expiration() {
        let read = read_patch();
        assert_eq!(
            read,
            serde_json::json!([{"op": "test", "path": "/type", "value": "bootstrap.kubernetes.io/token"}])
        );
        let extend = extension_patch("41", "2027-01-01T00:00:00Z");
        let ops = extend.as_array().unwrap();
        assert_eq!(ops[0], read[0]);
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[1]["path"], "/metadata/resourceVersion");
        assert_eq!(ops[1]["value"], "41");
        assert_eq!(ops[2]["path"], "/data/expiration");
        assert_eq!(ops[2]["value"], "MjAyNy0wMS0wMVQwMDowMDowMFo=");
    }

    fn at(s: &str) -> OffsetDateTime {
        OffsetDateTime::parse(s, &Rfc3339).unwrap()
    }

    fn secret(expiration: Option<&str>) -> TokenSecret {
        TokenSecret {
            type_: Some(SECRET_TYPE_BOOTSTRAP_TOKEN.into()),
            token_id: Some("abcdef".into()),
            expiration: expiration.map(str::to_owned),
        }
    }

    #[test]
    fn a_pool_token_is_extended_only_below_half_its_lifetime() {
        let now = at("2026-11-26T12:00:00Z");
        let life = time::Duration::hours(48);
        for (expiration, extended) in [
            (Some("2026-11-28T12:00:00Z"), false),
            (Some("2026-11-27T12:00:00Z"), false),
            (Some("2026-11-27T11:59:59Z"), true),
            (Some("2026-11-26T12:15:00Z"), true), // CABPK's fresh token (TTL 15m)
            (Some("2026-11-26T11:00:00Z"), true), // expired
            (Some("tomorrow"), true),             // CABPK would error on it
            (Some(""), true),
            (None, true), // CABPK writes one (refresh) or errors (rotation)
        ] {
            let got = keep(&secret(expiration), "abcdef", now, life).unwrap();
            assert_eq!(matches!(got, Keep::Extend { .. }), extended, "{expiration:?}: {got:?}");
            if let Keep::Extend { to, .. } = got {
                assert_eq!(format_expiration(to), "2026-11-28T12:00:00Z");
            }
        }
    }

    #[test]
    fn only_the_named_tokens_secret_is_written() {
        let mut s = secret(None);
        s.type_ = Some("Opaque".into());
        assert!(matches!(
            keep(&s, "abcdef", OffsetDateTime::UNIX_EPOCH, time::Duration::HOUR),
            Err(NotAToken::Type(_))
        ));
        let mut s = secret(None);
        s.token_id = Some("zzzzzz".into());
        assert!(matches!(retirable(&s, "abcdef"), Err(NotAToken::TokenId { .. })));
        assert!(retirable(&secret(None), "abcdef").is_ok());
    }

    #[test]
    fn only_bootstrap_token_ids_name_a_token() {
        assert!(is_token_id("abcdef") && is_token_id("0a1b2c"));
        for bad in ["", "abcde", "abcdefg", "ABCDEF", "abc/ef", "../../", "abcde\u{e9}"] {
            assert!(!is_token_id(bad), "{bad}");
        }
    }

    #[test]
    fn expirations_are_written_as_cabpk_writes_them() {
        let t = at("2026-11-26T12:00:00.987654321+02:00");
        assert_eq!(format_expiration(t), "2026-11-26T10:00:00Z");
    }

    #[test]
    fn insecure_the_annotation_and_the_flag_leave_tokens_alone() {
        let tpm = ClusterView::named("c", "ns", &["tpm"]);
        assert_eq!(managed(&tpm, false), Ok(()));
        assert_eq!(managed(&tpm, true), Err(LeftBecause::Flag));
        assert_eq!(
            managed(&ClusterView::named("c", "ns", &["tpm", "insecure"]), false),
            Err(LeftBecause::InsecureAllowed)
        );
        let annotated = tpm.clone().with_annotation(ANNOTATION_JOIN_TOKENS, "leave");
        assert_eq!(managed(&annotated, false), Err(LeftBecause::ClusterAnnotation));
        let other = tpm.with_annotation(ANNOTATION_JOIN_TOKENS, "manage");
        assert_eq!(managed(&other, false), Ok(()));
    }
}
