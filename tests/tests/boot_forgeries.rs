//! The five forged boots of the attack review (SPEC section 5, revision 6), built from keylime's
//! real RHEL 9 log by `tests::boot_log::forgery`, judged as the signer judges them: the real boot
//! is accepted under the policy its own measurements make, and each forgery is refused naming
//! the event it falsified. `tpm_boot_policy` plays the same forgeries on swtpm through the
//! node's attestor and the signer's rule engine.

#![allow(clippy::unwrap_used)]

use attestation::tpm::boot_policy::{BootPolicy, judge};
use attestation::tpm::event_log::{self, HashAlg};
use tests::boot_log::{self, forgery};

const QUOTED: [u32; 7] = [0, 1, 4, 7, 8, 9, 11];

#[test]
fn each_forged_boot_is_refused_naming_its_event() {
    let real = event_log::parse(&boot_log::read(boot_log::RHEL9)).unwrap();
    let policy = BootPolicy::parse(&boot_log::own_policy(&real, "rhel-9")).unwrap();
    let verdict = judge(&policy, &real, HashAlg::Sha256, &QUOTED).unwrap();
    assert_eq!(
        verdict.summary,
        "Secure Boot on, image rhel-9 (3 boot applications, command line, initrd)"
    );
    for forged in forgery::all(&real) {
        // What the TPM would quote is the forged log's own replay: the attacker's extends.
        let bytes = boot_log::encode(&forged.log);
        let parsed = event_log::parse(&bytes).unwrap();
        assert_eq!(parsed, forged.log, "{}: the log encodes as it parses", forged.what);
        let message = judge(&policy, &parsed, HashAlg::Sha256, &QUOTED)
            .map(|v| v.summary)
            .expect_err(forged.what);
        assert!(
            message.message.contains(&forged.refusal),
            "{}: {}",
            forged.what,
            message.message
        );
        eprintln!("{}: {}", forged.what, message.message);
    }
}

#[test]
fn the_real_log_encodes_as_it_was_read() {
    let bytes = boot_log::read(boot_log::RHEL9);
    let real = event_log::parse(&bytes).unwrap();
    assert_eq!(boot_log::encode(&real), bytes);
}
