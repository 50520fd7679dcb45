//! Which replica serves which Cluster: rendezvous (highest-random-weight) hashing of the
//! Cluster's UID over the live members, with bounded loads.
//!
//! Pure and deterministic: every replica that sees the same members and opted-in Clusters
//! computes the same owners, with no coordination beyond the membership Leases. Each member's
//! weight for a UID is the first 8 bytes of SHA-256(len(member) || member || uid); the highest
//! weight owns the UID (ties, which would need a 64-bit collision, go to the greater member
//! name). A member joining takes only the UIDs it now weighs highest on; a member leaving gives
//! up only its own.
//!
//! Plain rendezvous is even only over many Clusters: 30 Clusters over 3 replicas gave one
//! replica 14 (47% of the fleet's Machines, and of the memory to hold them). So [`assign`] caps
//! each member at its fair share plus 5% of it (`ceil(n / members)`, plus `fair / 20`): a UID
//! whose first choice is full goes to its next. Over thousands of Clusters the cap never binds
//! (plain rendezvous stays within 3% of the fair share there) and the minimal-move properties
//! above hold; over tens, the shares are even and a hand-over may move a few Clusters more.

/// A member's weight for `uid`.
pub fn weight(member: &str, uid: &str) -> u64 {
    let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    // The length prefix keeps ("ab", "c") and ("a", "bc") apart.
    hasher.update(&(member.len() as u64).to_be_bytes());
    hasher.update(member.as_bytes());
    hasher.update(uid.as_bytes());
    let digest = hasher.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// The owners of `uids` over `members`, in the order of `uids` (`None` without members):
/// each UID, taken in the order of the UIDs, goes to the member of highest weight that holds
/// fewer than the cap (see the module's documentation).
pub fn assign<'a>(uids: &[&str], members: &'a [String]) -> Vec<Option<&'a str>> {
    let mut owners = vec![None; uids.len()];
    if members.is_empty() {
        return owners;
    }
    let fair = uids.len().div_ceil(members.len());
    let cap = fair + fair / 20;
    let mut load = vec![0usize; members.len()];
    let mut order: Vec<usize> = (0..uids.len()).collect();
    // By UID, so that the order the caller lists the Clusters in changes nothing.
    order.sort_by(|a, b| uids[*a].cmp(uids[*b]));
    let mut ranked: Vec<(u64, usize)> = Vec::with_capacity(members.len());
    for index in order {
        ranked.clear();
        ranked.extend(
            members
                .iter()
                .enumerate()
                .map(|(m, name)| (weight(name, uids[index]), m)),
        );
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| members[b.1].cmp(&members[a.1])));
        if let Some(&(_, m)) = ranked.iter().find(|(_, m)| load[*m] < cap) {
            load[m] += 1;
            owners[index] = Some(members[m].as_str());
        }
    }
    owners
}

/// The member that owns `uid` by weight alone (no cap), or `None` without members.
#[cfg(test)]
pub fn owner<'a>(uid: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .max_by(|a, b| weight(a, uid).cmp(&weight(b, uid)).then_with(|| a.cmp(b)))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// UIDs shaped like the apiserver's (random v4 UUIDs), derived deterministically.
    fn uids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                let h = weight("uid", &i.to_string());
                let l = weight("uid2", &i.to_string());
                format!(
                    "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
                    h >> 32,
                    (h >> 16) & 0xffff,
                    h & 0xfff,
                    l >> 52,
                    l & 0xffff_ffff_ffff
                )
            })
            .collect()
    }

    fn assignment(uids: &[String], members: &[String]) -> HashMap<String, String> {
        let refs: Vec<&str> = uids.iter().map(String::as_str).collect();
        uids.iter()
            .zip(assign(&refs, members))
            .filter_map(|(u, owner)| Some((u.clone(), owner?.to_owned())))
            .collect()
    }

    fn loads(assignment: &HashMap<String, String>) -> Vec<usize> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for owner in assignment.values() {
            *counts.entry(owner).or_default() += 1;
        }
        let mut loads: Vec<usize> = counts.into_values().collect();
        loads.sort_unstable();
        loads
    }

    #[test]
    fn tens_of_clusters_are_split_evenly_where_plain_rendezvous_is_not() {
        let three = members(&["signer-0", "signer-1", "signer-2"]);
        let mut uneven = 0;
        for seed in 0..50 {
            let all: Vec<String> = uids(30 + seed).into_iter().skip(seed).collect();
            assert_eq!(loads(&assignment(&all, &three)), [10, 10, 10], "seed {seed}");
            let mut plain: HashMap<&str, usize> = HashMap::new();
            for u in &all {
                *plain.entry(owner(u, &three).unwrap()).or_default() += 1;
            }
            uneven += usize::from(plain.values().any(|n| *n >= 13));
        }
        assert!(
            uneven > 5,
            "plain rendezvous gives one member 13 or more of 30 in {uneven} of 50"
        );
        // 90 over 3: at most 31 each (30 plus 5%, rounded down: 1).
        let ninety = uids(90);
        assert!(loads(&assignment(&ninety, &three)).iter().all(|n| *n <= 31));
    }

    #[test]
    fn the_assignment_does_not_depend_on_the_order_clusters_are_listed_in() {
        let m = members(&["x", "y", "z"]);
        let all = uids(40);
        let mut reversed = all.clone();
        reversed.reverse();
        assert_eq!(assignment(&all, &m), assignment(&reversed, &m));
    }

    #[test]
    fn ten_thousand_uids_spread_over_three_members_within_three_percent() {
        let m = members(&["signer-7c9f-a", "signer-7c9f-b", "signer-7c9f-c"]);
        let all = uids(10_000);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for owner in assignment(&all, &m).into_values() {
            *counts.entry(owner).or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        for (member, n) in &counts {
            let share = *n as f64 / 10_000.0;
            assert!(
                (share - 1.0 / 3.0).abs() < 0.03,
                "{member} owns {n} of 10,000: {counts:?}"
            );
        }
    }

    #[test]
    fn over_thousands_of_clusters_the_cap_never_binds() {
        let all = uids(10_000);
        for m in [
            members(&["a", "b"]),
            members(&["a", "b", "c"]),
            members(&["a", "b", "c", "d", "e"]),
        ] {
            let bounded = assignment(&all, &m);
            assert!(all.iter().all(|u| owner(u, &m) == Some(bounded[u].as_str())), "{m:?}");
        }
    }

    #[test]
    fn a_joining_member_takes_only_its_share_and_moves_nothing_else() {
        let all = uids(10_000);
        let three = members(&["a", "b", "c"]);
        let four = members(&["a", "b", "c", "d"]);
        let before = assignment(&all, &three);
        let after = assignment(&all, &four);
        let moved: Vec<&String> = all.iter().filter(|u| before[*u] != after[*u]).collect();
        assert!(moved.iter().all(|u| after[*u] == "d"), "only moves to the new member");
        let share = moved.len() as f64 / 10_000.0;
        assert!((share - 0.25).abs() < 0.03, "{} moved", moved.len());
    }

    #[test]
    fn a_leaving_member_gives_up_only_its_own_clusters() {
        let all = uids(10_000);
        let three = members(&["a", "b", "c"]);
        let two = members(&["a", "c"]);
        let before = assignment(&all, &three);
        let after = assignment(&all, &two);
        for uid in &all {
            if before[uid] != "b" {
                assert_eq!(before[uid], after[uid], "{uid} moved though its owner stayed");
            }
        }
        let inherited: Vec<&str> = all
            .iter()
            .filter(|u| before[*u] == "b")
            .map(|u| after[u].as_str())
            .collect();
        let to_a = inherited.iter().filter(|o| **o == "a").count();
        assert!(
            (to_a as f64 / inherited.len() as f64 - 0.5).abs() < 0.05,
            "b's clusters split evenly: {to_a} of {}",
            inherited.len()
        );
    }

    #[test]
    fn the_owner_does_not_depend_on_the_order_members_are_listed_in() {
        let all = uids(500);
        let forward = assignment(&all, &members(&["x", "y", "z"]));
        let backward = assignment(&all, &members(&["z", "x", "y"]));
        assert_eq!(forward, backward);
    }

    #[test]
    fn weights_are_fixed_values_every_replica_and_version_computes_alike() {
        // A change here would move clusters between replicas running different versions.
        assert_eq!(weight("a", "b"), weight("a", "b"));
        assert_ne!(weight("ab", "c"), weight("a", "bc"));
        assert_eq!(
            weight("signer-0", "4f6c1c1e-0000-4000-8000-000000000000"),
            0x7851_7769_abe0_7ddd
        );
    }

    #[test]
    fn no_members_no_owner_and_one_member_owns_everything() {
        assert_eq!(owner("u", &[]), None);
        assert_eq!(assign(&["u"], &[]), [None]);
        let one = members(&["only"]);
        assert!(uids(100).iter().all(|u| owner(u, &one) == Some("only")));
        let all = uids(100);
        assert!(assignment(&all, &one).values().all(|o| o == "only"));
    }
}
