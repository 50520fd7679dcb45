//! A TCG event log as a node (or an attacker) sends it in `tpm/v1`'s `eventLog`: parsed,
//! replayed in every bank, every event read through every view, and the boot policy judged on
//! it (under the policy its own measurements make, with every rule on). None may panic, and
//! what parses must be internally consistent.
#![no_main]

use attestation::tpm::boot_policy::{BootPolicy, from_log, judge};
use attestation::tpm::event_log::{self, HashAlg, events};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(log) = event_log::parse(data) else { return };
    assert!(log.events.iter().enumerate().all(|(i, e)| e.index == i));
    for alg in HashAlg::ALL {
        if let Ok(pcrs) = log.replay(alg) {
            assert_eq!(pcrs.len(), 24);
            assert!(pcrs.values().all(|v| v.len() == alg.size()));
        }
        let _ = event_log::secure_boot(&log, alg);
        for event in &log.events {
            let _ = event_log::efi_variable(event, alg);
            let _ = event_log::ipl_text(event, alg);
            let _ = event_log::separator(event, alg);
            let _ = event_log::authority_certificates(event, alg);
        }
    }
    if let Ok(mut document) = from_log::policy_from_log(&log, "fuzz") {
        // Every rule read: authorities and dbx listed, Secure Boot required.
        document.authorities = vec!["00".repeat(32)];
        document.dbx = vec!["00".repeat(32)];
        document.secure_boot = attestation::tpm::boot_policy::SecureBoot::Required;
        if let Ok(policy) = BootPolicy::try_from(document) {
            let _ = judge(&policy, &log, HashAlg::Sha256, &[0, 1, 4, 7, 8, 9, 11]);
        }
    }
    for event in &log.events {
        let _ = event.describe();
        let _ = event_log::linux_stub_event(event);
        let _ = events::ipl_label(event);
        let _ = events::image_path(event);
    }
});
