//! A TCG event log as a node (or an attacker) sends it in `tpm/v1`'s `eventLog`: parsed,
//! replayed in every bank, and every event read through every view. None may panic, and what
//! parses must be internally consistent.
#![no_main]

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
    for event in &log.events {
        let _ = event.describe();
        let _ = event_log::linux_stub_event(event);
        let _ = events::ipl_label(event);
        let _ = events::image_path(event);
    }
});
