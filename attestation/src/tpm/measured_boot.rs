//! The verifier's use of a Cluster's boot policy (SPEC section 5, revision 5): the phase-1 event
//! log replayed against the quote, the policy judged on it, and phase 2 held to the same boot.
//!
//! Without a policy, revision 4 holds: PCR values are logged and any are accepted, and a log the
//! node sends is not judged. With one:
//!
//! 1. phase 1 must carry `eventLog`; it parses; its replay in the quote's one bank gives the
//!    quoted values of the PCRs the policy judges (revision 6: the node sends each quoted PCR's
//!    value in `pcrs`, which must hash to the quote's `pcrDigest`; a PCR the policy does not
//!    judge, such as a server's PCR 0 measured before its log begins, does not refuse the node;
//!    without `pcrs`, the whole selection must replay);
//! 2. the policy is judged on the replayed events ([`super::boot_policy::judge`]), which also
//!    requires the PCRs it reads quoted;
//! 3. phase 2 judges phase 1's log again (the policy may have changed meanwhile) and requires
//!    its quote to be of the same boot: same selection and `pcrDigest`, same `resetCount` and
//!    `restartCount`. The AK survives a reboot (its wrapped key is on disk), so without this a
//!    node could boot the allowed image for phase 1 and another one for phase 2.

use std::collections::BTreeMap;

use super::boot_policy::{PolicyState, judge, judged_pcrs};
use super::data::TpmData;
use super::event_log::{HashAlg, parse};
use super::quote::Quote;
use crate::challenge::{Refusal, challenge_failed};
use crate::decision::DenyReason;

fn invalid(message: impl Into<String>) -> Refusal {
    (DenyReason::AttestationInvalid, message.into())
}

/// Why the Cluster's `tpm/v1` CSRs wait, when its policy is named but not usable: never
/// approved without the policy the Cluster asked for, never denied for the signer's gap.
pub(super) fn held(state: &PolicyState) -> Option<String> {
    match state {
        PolicyState::Unresolved { source } => Some(format!(
            "tpm/v1: the Cluster's boot policy (ConfigMap {source}) has not been read: its tpm/v1 CSRs wait for it"
        )),
        PolicyState::Invalid { source, message } => Some(format!(
            "tpm/v1: the Cluster's boot policy (ConfigMap {source}) is unusable: {message}; its tpm/v1 CSRs wait, never approved without it, until the ConfigMap is fixed"
        )),
        PolicyState::Required => Some(
            "tpm/v1: the signer requires a boot policy of every tpm/v1 Cluster (--tpm-require-boot-policy), and this Cluster names none (annotation cluster.x-k8s.io/kubelet-tpm-boot-policy) while the signer has no --tpm-boot-policy default: its tpm/v1 CSRs wait, never approved, until it names one".to_owned(),
        ),
        PolicyState::None | PolicyState::Loaded { .. } => None,
    }
}

/// The quote's one PCR bank and its PCRs.
fn quoted_bank(quote: &Quote) -> Result<(HashAlg, Vec<u32>), Refusal> {
    let banks: Vec<_> = quote.selection.iter().filter(|s| !s.pcrs.is_empty()).collect();
    let [bank] = banks.as_slice() else {
        return Err(invalid(format!(
            "the quote selects PCRs of {} banks: a boot policy is judged on one bank's replay",
            banks.len()
        )));
    };
    let alg = HashAlg::from_tpm_alg_id(bank.hash).ok_or_else(|| {
        invalid(format!(
            "the quote's PCR bank {:#06x} is no hash the event log replays",
            bank.hash
        ))
    })?;
    Ok((alg, bank.pcrs.clone()))
}

/// The quoted PCRs' values the node sent in `pcrs`, when it sent them for the quote's bank:
/// they must be every quoted PCR's and hash to the quote's `pcrDigest` (so each is proven).
fn quoted_values(
    data: &TpmData,
    alg: HashAlg,
    quote: &Quote,
    selection: &[u32],
) -> Result<Option<BTreeMap<u32, Vec<u8>>>, Refusal> {
    if alg != HashAlg::Sha256 {
        return Ok(None);
    }
    let Some(values) = data.sha256_pcr_values().map_err(invalid)? else {
        return Ok(None);
    };
    let sent: Vec<u32> = values.keys().copied().collect();
    if sent != selection || !quote.pcr_digest_of_bank(alg.tpm_alg_id(), &values) {
        return Err(invalid(format!(
            "pcrs: the values sent for PCRs {sent:?} are not the quote's (PCRs {selection:?}, its pcrDigest)"
        )));
    }
    Ok(Some(values))
}

/// Phase 1 under `state`: the note's words on the boot, or why the CSR is refused.
pub(super) fn phase_one(state: &PolicyState, data: &TpmData, quote: &Quote) -> Result<String, Refusal> {
    let PolicyState::Loaded { source, policy } = state else {
        return Ok(match &data.event_log {
            Some(log) => format!("no boot policy (event log of {} bytes not judged)", log.len()),
            None => "no boot policy".to_owned(),
        });
    };
    let Some(bytes) = &data.event_log else {
        return Err(invalid(format!(
            "the Cluster's tpm/v1 boot policy (ConfigMap {source}) needs the node's measured-boot event log in the phase-1 DATA (eventLog): the node must send it, with a kubelet-authenticator that does (revision 5) and /sys/kernel/security/tpm0/binary_bios_measurements readable"
        )));
    };
    let log = parse(bytes).map_err(|e| invalid(format!("eventLog: {e}")))?;
    let (alg, pcrs) = quoted_bank(quote)?;
    let judged = judged_pcrs(policy);
    let replayed = log.replay(alg).map_err(|e| {
        invalid(format!(
            "the event log does not match the quoted PCRs ({e}): a log that does not match the quote proves nothing"
        ))
    })?;
    match quoted_values(data, alg, quote, &pcrs)? {
        // Each quoted PCR's value, proven by the quote: only the PCRs the policy judges must be
        // the log's (a real server measures PCR 0 before its log begins).
        Some(quoted) => {
            for pcr in judged.iter().filter(|p| pcrs.contains(p)) {
                if replayed.get(pcr) != quoted.get(pcr) {
                    return Err(invalid(format!(
                        "the event log does not match the quoted PCRs: its {alg} replay of PCR {pcr}, which the policy judges, is not the quoted value, and a log that does not match the quote proves nothing"
                    )));
                }
            }
        }
        // No values sent (a node before revision 6, or a SHA-1 quote): the whole selection must
        // replay.
        None => {
            if !quote.pcr_digest_of_bank(alg.tpm_alg_id(), &replayed) {
                return Err(invalid(format!(
                    "the event log does not match the quoted PCRs: its {alg} replay of PCRs {pcrs:?} does not hash to the quote's pcrDigest, and a log that does not match the quote proves nothing (a node that sends each quoted PCR's value in pcrs is held only to the PCRs the policy judges)"
                )));
            }
        }
    }
    let verdict = judge(policy, &log, alg, &pcrs).map_err(|refusal| invalid(refusal.message))?;
    Ok(format!("boot policy {source}: {}", verdict.summary))
}

/// Phase 2 under `state`: phase 1's boot judged again, and this quote of the same boot.
pub(super) fn phase_two(
    state: &PolicyState,
    first: &TpmData,
    first_quote: &Quote,
    quote: &Quote,
) -> Result<String, Refusal> {
    if !matches!(state, PolicyState::Loaded { .. }) {
        return Ok(String::new());
    }
    let note = phase_one(state, first, first_quote)?;
    if quote.selection != first_quote.selection || quote.pcr_digest != first_quote.pcr_digest {
        return Err(challenge_failed(
            "the phase-2 quote's PCRs are not phase 1's (another selection, or other values): the node booted again or extended its PCRs between the phases; it must start again from phase 1",
        ));
    }
    if (quote.reset_count, quote.restart_count) != (first_quote.reset_count, first_quote.restart_count) {
        return Err(challenge_failed(format!(
            "the TPM was reset or restarted between the phases (resetCount {} then {}, restartCount {} then {}): phase 2 must be of the boot phase 1 proved; the node must start again from phase 1",
            first_quote.reset_count, quote.reset_count, first_quote.restart_count, quote.restart_count
        )));
    }
    Ok(format!("{note}, phase 2 of the same boot"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tpm::alg;
    use crate::tpm::boot_policy::BootPolicy;
    use crate::tpm::boot_policy::testlog::Boot;
    use crate::tpm::quote::PcrSelection;

    const QUOTED: [u32; 7] = [0, 1, 4, 7, 8, 9, 11];

    fn loaded(boot: &Boot) -> PolicyState {
        PolicyState::Loaded {
            source: "team-a/boot".into(),
            policy: Arc::new(BootPolicy::parse(&boot.policy()).unwrap()),
        }
    }

    fn data(log: Option<Vec<u8>>) -> TpmData {
        TpmData {
            phase: 1,
            ek_public: vec![],
            ek_certificate: None,
            ek_intermediates: vec![],
            ak_public: vec![],
            quote: vec![],
            signature: vec![],
            pcrs: Default::default(),
            challenge: None,
            event_log: log,
        }
    }

    /// A quote of `log`'s replay (what a TPM that booted it quotes).
    fn quote_of(log: &[u8], pcrs: &[u32]) -> Quote {
        quote_of_values(&parse(log).unwrap().replay(HashAlg::Sha256).unwrap(), pcrs)
    }

    /// A quote of these PCR values.
    fn quote_of_values(values: &BTreeMap<u32, Vec<u8>>, pcrs: &[u32]) -> Quote {
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        for pcr in pcrs {
            ctx.update(&values[pcr]);
        }
        Quote {
            qualified_signer: vec![],
            extra_data: vec![],
            reset_count: 7,
            restart_count: 0,
            firmware_version: 0,
            selection: vec![PcrSelection {
                hash: alg::SHA256,
                pcrs: pcrs.to_vec(),
            }],
            pcr_digest: ctx.finish().as_ref().to_vec(),
            signed: vec![],
        }
    }

    #[test]
    fn a_policy_needs_the_log_its_replay_and_the_judge() {
        let boot = Boot::default();
        let state = loaded(&boot);
        let log = boot.through_grub().bytes();
        let quote = quote_of(&log, &QUOTED);
        let note = phase_one(&state, &data(Some(log.clone())), &quote).unwrap();
        assert!(note.starts_with("boot policy team-a/boot: Secure Boot on"), "{note}");

        let (reason, message) = phase_one(&state, &data(None), &quote).unwrap_err();
        assert_eq!(reason, DenyReason::AttestationInvalid);
        assert!(
            message.contains("needs the node's measured-boot event log") && message.contains("team-a/boot"),
            "{message}"
        );

        let other = Boot {
            kernel: crate::tpm::boot_policy::testlog::sha256(b"another kernel"),
            ..Boot::default()
        };
        let (_, message) = phase_one(&state, &data(Some(other.through_grub().bytes())), &quote).unwrap_err();
        assert!(
            message.starts_with("the event log does not match the quoted PCRs"),
            "{message}"
        );

        let (_, message) = phase_one(&state, &data(Some(vec![1, 2, 3])), &quote).unwrap_err();
        assert!(message.starts_with("eventLog: "), "{message}");

        let narrow = quote_of(&log, &[0, 1, 7]);
        let (_, message) = phase_one(&state, &data(Some(log.clone())), &narrow).unwrap_err();
        assert!(message.contains("does not cover PCRs [4, 8, 9]"), "{message}");

        let (_, message) = phase_one(
            &state,
            &data(Some(other.through_grub().bytes())),
            &quote_of(&other.through_grub().bytes(), &QUOTED),
        )
        .unwrap_err();
        assert!(
            message.contains("none of the policy's kernels (image debian-12)"),
            "{message}"
        );
    }

    /// DATA carrying each quoted PCR's value, as a revision 6 node sends it.
    fn with_values(log: Vec<u8>, values: &BTreeMap<u32, Vec<u8>>, pcrs: &[u32]) -> TpmData {
        let bank = pcrs
            .iter()
            .map(|p| (p.to_string(), crate::digest::hex(&values[p])))
            .collect();
        TpmData {
            pcrs: BTreeMap::from([("sha256".to_owned(), bank)]),
            ..data(Some(log))
        }
    }

    /// An HPE ProLiant DL160 Gen10 measures PCR 0 before its log begins: a PCR no policy judges
    /// does not refuse the node when it sends each quoted PCR's value; the same in PCR 4 does.
    #[test]
    fn only_the_pcrs_the_policy_judges_must_replay() {
        let boot = Boot::default();
        let state = loaded(&boot);
        let log = boot.through_grub().bytes();
        let replayed = parse(&log).unwrap().replay(HashAlg::Sha256).unwrap();
        let unlogged = |pcr: u32| {
            let mut values = replayed.clone();
            let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
            ctx.update(&values[&pcr]);
            ctx.update(&[0x5a; 32]);
            values.insert(pcr, ctx.finish().as_ref().to_vec());
            values
        };
        let pcr0 = unlogged(0);
        let quote = quote_of_values(&pcr0, &QUOTED);
        let note = phase_one(&state, &with_values(log.clone(), &pcr0, &QUOTED), &quote).unwrap();
        assert!(note.starts_with("boot policy team-a/boot: Secure Boot on"), "{note}");
        // A node that does not send the values is held to the whole selection.
        let (_, message) = phase_one(&state, &data(Some(log.clone())), &quote).unwrap_err();
        assert!(message.contains("does not hash to the quote's pcrDigest"), "{message}");

        let pcr4 = unlogged(4);
        let quote = quote_of_values(&pcr4, &QUOTED);
        let (reason, message) = phase_one(&state, &with_values(log.clone(), &pcr4, &QUOTED), &quote).unwrap_err();
        assert_eq!(reason, DenyReason::AttestationInvalid);
        assert!(
            message.contains("replay of PCR 4, which the policy judges"),
            "{message}"
        );

        // Values that are not the quote's prove nothing.
        let quote = quote_of_values(&pcr0, &QUOTED);
        let (_, message) = phase_one(&state, &with_values(log.clone(), &replayed, &QUOTED), &quote).unwrap_err();
        assert!(message.starts_with("pcrs: the values sent"), "{message}");
        let (_, message) = phase_one(&state, &with_values(log, &pcr0, &[0, 4, 7, 8, 9]), &quote).unwrap_err();
        assert!(
            message.starts_with("pcrs: the values sent for PCRs [0, 4, 7, 8, 9]"),
            "{message}"
        );
    }

    #[test]
    fn without_a_policy_revision_4_holds_and_a_named_one_holds_the_csr() {
        let quote = quote_of(&Boot::default().through_grub().bytes(), &QUOTED);
        assert_eq!(
            phase_one(&PolicyState::None, &data(None), &quote).unwrap(),
            "no boot policy"
        );
        let garbage = phase_one(&PolicyState::None, &data(Some(vec![1, 2])), &quote).unwrap();
        assert!(garbage.contains("not judged"), "{garbage}");
        assert_eq!(held(&PolicyState::None), None);
        let required = held(&PolicyState::Required).unwrap();
        assert!(
            required.contains("--tpm-require-boot-policy") && required.contains("never approved"),
            "{required}"
        );
        let unread = held(&PolicyState::named("team-a", Some("boot"))).unwrap();
        assert!(unread.contains("team-a/boot"), "{unread}");
        let invalid = held(&PolicyState::Invalid {
            source: "team-a/boot".into(),
            message: "no policy.yaml".into(),
        })
        .unwrap();
        assert!(
            invalid.contains("no policy.yaml") && invalid.contains("never approved"),
            "{invalid}"
        );
    }

    #[test]
    fn phase_two_must_be_of_the_same_boot() {
        let boot = Boot::default();
        let state = loaded(&boot);
        let log = boot.through_grub().bytes();
        let first = quote_of(&log, &QUOTED);
        let note = phase_two(&state, &data(Some(log.clone())), &first, &first.clone()).unwrap();
        assert!(note.ends_with("phase 2 of the same boot"), "{note}");
        let rebooted = Quote {
            reset_count: 8,
            ..first.clone()
        };
        let (reason, message) = phase_two(&state, &data(Some(log.clone())), &first, &rebooted).unwrap_err();
        assert_eq!(reason, DenyReason::ChallengeFailed);
        assert!(message.contains("resetCount 7 then 8"), "{message}");
        let other_values = Quote {
            pcr_digest: vec![0; 32],
            ..first.clone()
        };
        let (_, message) = phase_two(&state, &data(Some(log)), &first, &other_values).unwrap_err();
        assert!(message.contains("not phase 1's"), "{message}");
        assert_eq!(
            phase_two(&PolicyState::None, &data(None), &first, &other_values).unwrap(),
            ""
        );
    }
}
