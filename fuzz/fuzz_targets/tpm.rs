//! TPM structures as a node (or an attacker) sends them in a `tpm/v1` DATA block: public
//! areas, quotes and signatures. Whatever parses must not panic in what the verifier does next.
#![no_main]

use attestation::tpm::data::TpmData;
use attestation::tpm::public::TpmPublic;
use attestation::tpm::quote::{Quote, Signature};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(public) = TpmPublic::from_tpm2b(data) {
        let _ = public.name();
        let _ = public.check_attestation_key();
        let _ = public.canonical_spki();
        let _ = Signature::parse(data).map(|s| s.verify(&public, data));
    }
    if let Ok(quote) = Quote::from_tpm2b(data) {
        let _ = quote.pcr_digest_matches(&[(0, vec![0; 32])]);
    }
    let _ = Quote::from_attest(data);
    let _ = Signature::parse(data);
    if let Ok(block) = TpmData::parse(data) {
        // What parses must encode back to the same block.
        assert_eq!(TpmData::parse(&block.encode()).ok(), Some(block));
    }
});
