//! SPEC section 7, "Join tokens", table-driven: which token the signer keeps, retires or holds
//! (never which it must not), when it extends, and, against a port of Cluster API's kubeadm
//! bootstrap provider ([`tests::cabpk`]), that no state the signer leaves makes the provider
//! refresh, rotate, re-create or fail.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use attestation::join_tokens::{
    self, Joined, Keep, SECRET_TYPE_BOOTSTRAP_TOKEN, TemplateToken, TokenPlan, TokenSecret, format_expiration, keep,
};
use attestation::machine::{ClusterView, Inventory, KubeadmConfigView, MachinePoolView, MachineView};
use serde_json::{Value, json};
use tests::cabpk::{Action, Cabpk, Owner};
use tests::capi::{self, annotate};
use time::{Duration, OffsetDateTime, macros::datetime};

const NOW: OffsetDateTime = datetime!(2026-11-26 12:00 UTC);

fn cluster() -> ClusterView {
    ClusterView::named(capi::CLUSTER, capi::NAMESPACE, &["tpm"])
}

fn claim(pid: &str) -> String {
    json!({"nodeName": "n", "providerID": pid, "csrUID": "u", "claimedAt": "2026-11-26T11:00:00Z"}).to_string()
}

/// A Machine `name` with config `<config>`; claimed or not; with a nodeRef or not.
fn machine(name: &str, config: &str, claimed: bool, node_ref: bool) -> Value {
    let pid = format!("aws:///us-east-1a/i-{name}");
    let mut m = capi::machine(name, Some(&pid));
    m["spec"]["bootstrap"]["configRef"]["name"] = json!(config);
    if claimed {
        annotate(&mut m, attestation::names::ANNOTATION_CLAIM, &claim(&pid));
    }
    if node_ref {
        m["status"]["nodeRef"] = json!({"name": name});
    }
    m
}

fn pool(name: &str, config: &str, deleting: bool) -> Value {
    let mut p = capi::machine_pool(name, &[]);
    p["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] = json!(config);
    if deleting {
        p["metadata"]["deletionTimestamp"] = json!("2026-11-26T11:00:00Z");
    }
    p
}

fn config(name: &str, token: &str) -> Value {
    capi::kubeadm_config(name, token, "v1beta2")
}

fn inventory(objects: &[Value]) -> Inventory {
    let mut inventory = Inventory::default();
    for o in objects {
        match o["kind"].as_str().unwrap() {
            "Machine" => inventory.machines.push(Arc::new(MachineView::from_object(o).unwrap())),
            "MachinePool" => inventory.pools.push(Arc::new(MachinePoolView::from_object(o).unwrap())),
            "KubeadmConfig" => inventory
                .kubeadm_configs
                .push(Arc::new(KubeadmConfigView::from_object(o).unwrap())),
            other => panic!("{other}"),
        }
    }
    inventory
}

/// The plan in short: `keep:<pools>`, `retire:<machines>`, `hold:<holders>`.
fn short(plan: &TokenPlan) -> String {
    match plan {
        TokenPlan::Keep { pools } => format!(
            "keep:{}",
            pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(",")
        ),
        TokenPlan::Retire { machines } => format!(
            "retire:{}",
            machines.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(",")
        ),
        TokenPlan::Hold { holders } => format!(
            "hold:{}",
            holders.iter().map(|h| h.what.as_str()).collect::<Vec<_>>().join(",")
        ),
    }
}

fn plans(
    objects: &[Value],
    templates: &[TemplateToken],
    joined: impl Fn(&MachineView) -> Joined,
) -> Vec<(String, String)> {
    join_tokens::plan(&cluster(), &inventory(objects), templates, joined, NOW)
        .iter()
        .map(|(id, p)| (id.clone(), short(p)))
        .collect()
}

fn by_node_ref(m: &MachineView) -> Joined {
    if m.node_ref().is_some() {
        Joined::NodeRef
    } else {
        Joined::No
    }
}

#[test]
fn which_token_is_kept_retired_or_held() {
    let t = |id: &str, plan: &str| (id.to_owned(), plan.to_owned());
    type Case = (&'static str, Vec<Value>, Vec<(String, String)>);
    let cases: Vec<Case> = vec![
        (
            "a pool's token is kept",
            vec![config("pool-a-kc", "aaaaaa"), pool("pool-a", "pool-a-kc", false)],
            vec![t("aaaaaa", "keep:pool-a")],
        ),
        (
            "a claimed Machine whose node joined: retired",
            vec![config("m1-kc", "bbbbbb"), machine("m1", "m1-kc", true, true)],
            vec![t("bbbbbb", "retire:m1")],
        ),
        (
            "an unclaimed Machine: held",
            vec![config("m1-kc", "bbbbbb"), machine("m1", "m1-kc", false, true)],
            vec![t("bbbbbb", "hold:Machine m1")],
        ),
        (
            "claimed, node not joined: held (a lost certificate is asked for again with the token)",
            vec![config("m1-kc", "bbbbbb"), machine("m1", "m1-kc", true, false)],
            vec![t("bbbbbb", "hold:Machine m1")],
        ),
        (
            "two Machines share a token: held until the last is claimed",
            vec![
                config("m1-kc", "cccccc"),
                config("m2-kc", "cccccc"),
                machine("m1", "m1-kc", true, true),
                machine("m2", "m2-kc", false, false),
            ],
            vec![t("cccccc", "hold:Machine m2")],
        ),
        (
            "two Machines share a token, both claimed and joined: retired for both",
            vec![
                config("m1-kc", "cccccc"),
                config("m2-kc", "cccccc"),
                machine("m1", "m1-kc", true, true),
                machine("m2", "m2-kc", true, true),
            ],
            vec![t("cccccc", "retire:m1,m2")],
        ),
        (
            "a pool and a claimed Machine share a token: kept, never deleted",
            vec![
                config("m1-kc", "dddddd"),
                config("pool-a-kc", "dddddd"),
                machine("m1", "m1-kc", true, true),
                pool("pool-a", "pool-a-kc", false),
            ],
            vec![t("dddddd", "keep:pool-a")],
        ),
        (
            "a config no Machine refers to yet (its Machine not seen): held",
            vec![
                config("m1-kc", "eeeeee"),
                config("m9-kc", "eeeeee"),
                machine("m1", "m1-kc", true, true),
            ],
            vec![t("eeeeee", "hold:KubeadmConfig m9-kc")],
        ),
        (
            "a pool being deleted: its token is neither kept nor deleted",
            vec![config("pool-a-kc", "ffffff"), pool("pool-a", "pool-a-kc", true)],
            vec![t("ffffff", "hold:MachinePool pool-a")],
        ),
        (
            "tokens apart: each its own plan",
            vec![
                config("m1-kc", "aaaaaa"),
                config("m2-kc", "bbbbbb"),
                machine("m1", "m1-kc", true, true),
                machine("m2", "m2-kc", false, false),
            ],
            vec![t("aaaaaa", "retire:m1"), t("bbbbbb", "hold:Machine m2")],
        ),
        (
            "a config naming no bootstrap token ID (not [a-z0-9]{6}) names nothing the signer touches",
            vec![config("m1-kc", "ABC/../x"), machine("m1", "m1-kc", true, true)],
            vec![],
        ),
        (
            "a Machine of another bootstrap provider: nothing",
            {
                let mut m = machine("m1", "m1-kc", true, true);
                m["spec"]["bootstrap"]["configRef"]["kind"] = json!("TalosConfig");
                vec![config("m1-kc", "aaaaaa"), m]
            },
            vec![t("aaaaaa", "hold:KubeadmConfig m1-kc")],
        ),
        (
            "a config labeled for another Cluster is not this Cluster's",
            {
                let mut c = config("m1-kc", "aaaaaa");
                c["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "other"});
                vec![c, machine("m1", "m1-kc", true, true)]
            },
            vec![],
        ),
    ];
    for (what, objects, expected) in cases {
        assert_eq!(plans(&objects, &[], by_node_ref), expected, "{what}");
    }
}

#[test]
fn a_template_naming_the_token_holds_it() {
    let objects = [config("m1-kc", "aaaaaa"), machine("m1", "m1-kc", true, true)];
    let templates = [TemplateToken {
        what: "KubeadmConfigTemplate workers".into(),
        token_id: "aaaaaa".into(),
    }];
    assert_eq!(
        plans(&objects, &templates, by_node_ref),
        [("aaaaaa".to_owned(), "hold:KubeadmConfigTemplate workers".to_owned())]
    );
}

#[test]
fn a_registered_node_without_node_ref_retires_only_after_the_grace() {
    let objects = [config("m1-kc", "aaaaaa"), machine("m1", "m1-kc", true, false)];
    let just_now = |_: &MachineView| Joined::Registered(NOW - Duration::seconds(3));
    let a_while_ago = |_: &MachineView| Joined::Registered(NOW - join_tokens::REGISTERED_GRACE);
    assert_eq!(plans(&objects, &[], just_now)[0].1, "hold:Machine m1");
    assert_eq!(plans(&objects, &[], a_while_ago)[0].1, "retire:m1");
}

/// A claimed Machine's token goes once the Node its claim names (`n`) registers carrying its
/// provider ID; another kubelet's Node carrying that provider ID does not count (an attack
/// review's finding: any node could otherwise get the token deleted early).
#[test]
fn only_the_node_the_claim_names_registers_a_claimed_machine() {
    use attestation::machine::NodeView;
    let m1 = MachineView::from_object(&machine("m1", "m1-kc", true, false)).unwrap();
    let pid = m1.provider_id().unwrap().to_owned();
    let node = |name: &str, pid: &str| NodeView {
        name: name.into(),
        provider_id: Some(pid.into()),
    };
    let registered = |nodes: Vec<NodeView>| join_tokens::claimed_node_registered(&m1, &nodes);
    assert!(!registered(vec![]));
    assert!(
        !registered(vec![node("intruder", &pid)]),
        "another Node carrying the provider ID"
    );
    assert!(
        !registered(vec![node("n", "aws:///us-east-1a/i-other")]),
        "the claim's node with another provider ID"
    );
    assert!(registered(vec![node("intruder", &pid), node("n", &pid)]));
    let unclaimed = MachineView::from_object(&machine("m2", "m2-kc", false, false)).unwrap();
    let m2_pid = unclaimed.provider_id().unwrap().to_owned();
    assert!(!join_tokens::claimed_node_registered(
        &unclaimed,
        &vec![node("m2", &m2_pid)]
    ));
}

fn token(expiration: Option<&str>) -> TokenSecret {
    TokenSecret {
        type_: Some(SECRET_TYPE_BOOTSTRAP_TOKEN.into()),
        token_id: Some("aaaaaa".into()),
        expiration: expiration.map(str::to_owned),
    }
}

/// The bootstrap provider's side: for each of its TTLs within the signer's bound, from the token
/// it creates, through the signer's extension, over two lifetimes of the signer's passes, every
/// reconcile of a pool (with and without nodes) does nothing.
#[test]
fn no_state_the_signer_leaves_makes_the_bootstrap_provider_act() {
    let lifetime = Duration::hours(48);
    let resync = Duration::seconds(30);
    for ttl in [
        Duration::minutes(15),
        Duration::hours(1),
        Duration::hours(24),
        Duration::hours(28),
    ] {
        let cabpk = Cabpk { ttl };
        // CABPK created the token: now + TTL. The signer's next pass (within one resync)
        // extends it unless it is already more than half a lifetime ahead.
        let mut secret = token(Some(&format_expiration(NOW + ttl)));
        if let Keep::Extend { to, .. } = keep(&secret, "aaaaaa", NOW + resync, lifetime).unwrap() {
            secret = token(Some(&format_expiration(to)));
        }
        let mut writes = 0;
        // Every CABPK check (TTL/3) and every signer pass (resync), over two lifetimes.
        let mut t = NOW + resync;
        while t < NOW + lifetime * 2 {
            for owner in [Owner::PoolWithNodes, Owner::PoolWithoutNodes] {
                assert_eq!(
                    cabpk.reconcile(owner, Some(&secret), t),
                    Action::Nothing,
                    "TTL {ttl}, {owner:?} at +{}: {secret:?}",
                    t - NOW
                );
            }
            if let Keep::Extend { to, .. } = keep(&secret, "aaaaaa", t, lifetime).unwrap() {
                secret = token(Some(&format_expiration(to)));
                writes += 1;
            }
            t += resync.min(cabpk.check_interval());
        }
        // One write per half lifetime: four over two lifetimes (no flapping).
        assert!((3..=4).contains(&writes), "TTL {ttl}: {writes} writes");
    }
}

/// The bound is tight: a provider TTL beyond `lifetime/2 * 6/5` rotates a kept token.
#[test]
fn beyond_the_documented_bound_the_provider_would_rotate() {
    let lifetime = Duration::hours(48);
    let cabpk = Cabpk {
        ttl: Duration::hours(30),
    };
    // The lowest expiration the signer leaves: just above half its lifetime ahead.
    let lowest = token(Some(&format_expiration(NOW + lifetime / 2 + Duration::seconds(1))));
    assert_eq!(
        cabpk.reconcile(Owner::PoolWithoutNodes, Some(&lowest), NOW),
        Action::Refresh
    );
}

/// What the signer never leaves, and what the provider would do with it: an absent or
/// unparseable expiration (the signer writes one at its next pass), a deleted pool token
/// (never: the signer does not delete them, and does not re-create one the provider lost), a
/// Machine token deleted before its nodeRef (the signer waits for nodeRef, or a registered Node
/// and a grace).
#[test]
fn the_states_the_signer_avoids_are_the_ones_the_provider_acts_on() {
    let cabpk = Cabpk {
        ttl: Duration::minutes(15),
    };
    assert_eq!(
        cabpk.reconcile(Owner::PoolWithNodes, Some(&token(None)), NOW),
        Action::Error("shouldRotate: expiration does not parse")
    );
    assert_eq!(
        cabpk.reconcile(Owner::PoolWithoutNodes, Some(&token(None)), NOW),
        Action::Refresh
    );
    assert_eq!(cabpk.reconcile(Owner::PoolWithNodes, None, NOW), Action::NewToken);
    assert!(matches!(
        cabpk.reconcile(Owner::MachineWithoutNode, None, NOW),
        Action::Error(_)
    ));
    assert_eq!(cabpk.reconcile(Owner::MachineWithNode, None, NOW), Action::Nothing);
    for bad in [None, Some("soon")] {
        assert!(matches!(
            keep(&token(bad), "aaaaaa", NOW, Duration::hours(48)).unwrap(),
            Keep::Extend { .. }
        ));
    }
}
