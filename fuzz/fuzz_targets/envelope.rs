//! `spec.request` as an attacker writes it: envelope, PKCS#10, signature check, extension.
#![no_main]

use attestation::csr::ParsedCsr;
use attestation::envelope::RequestEnvelope;
use attestation::identity::ProviderId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = RequestEnvelope::parse(data) else { return };
    // What parses must encode back to something that parses the same.
    assert_eq!(RequestEnvelope::parse(envelope.encode().as_bytes()).as_ref(), Ok(&envelope));
    let Ok(csr) = ParsedCsr::from_der(&envelope.csr_der) else { return };
    let _ = csr.verify_signature();
    for extension in csr.provider_id_extensions() {
        let _ = ProviderId::from_extension_value(&extension.value);
    }
});
