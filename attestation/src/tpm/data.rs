//! The `tpm/v1` wire contract of SPEC section 5: the DATA block (UTF-8 JSON, binary fields in
//! standard base64 with padding), the challenge annotation the signer writes on CSR #1, and the
//! challenge secret, derived and never stored.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::wire::WireError;

/// Standard base64 with padding, as the SPEC's table says.
mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }

    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
            match bytes {
                Some(b) => super::serialize(b, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
            #[derive(Deserialize)]
            struct Wrapped(#[serde(with = "super")] Vec<u8>);
            Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
        }
    }

    pub mod list {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(items: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
            #[derive(Serialize)]
            struct Wrapped<'a>(#[serde(with = "super")] &'a Vec<u8>);
            s.collect_seq(items.iter().map(Wrapped))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
            #[derive(Deserialize)]
            struct Wrapped(#[serde(with = "super")] Vec<u8>);
            Ok(Vec::<Wrapped>::deserialize(d)?.into_iter().map(|w| w.0).collect())
        }
    }
}

/// `pcrs` read strictly: the one bank `sha256` (any other is an unknown field), PCR indexes in
/// canonical decimal, no key twice. serde's maps keep the last of two equal keys, and `"0"`,
/// `"00"` and `"+0"` would all name PCR 0: either way two readers could see different values.
mod pcrs {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::Deserializer;
    use serde::de::{Error, MapAccess, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, D::Error> {
        d.deserialize_map(Banks)
    }

    struct Banks;

    impl<'de> Visitor<'de> for Banks {
        type Value = BTreeMap<String, BTreeMap<String, String>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"{"sha256": {"<index>": "<hex>"}}"#)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut banks = BTreeMap::new();
            while let Some(bank) = map.next_key::<String>()? {
                if bank != "sha256" {
                    return Err(A::Error::unknown_field(&bank, &["sha256"]));
                }
                if banks.contains_key(&bank) {
                    return Err(A::Error::duplicate_field("sha256"));
                }
                let values = map.next_value_seed(Indexes)?;
                banks.insert(bank, values);
            }
            Ok(banks)
        }
    }

    struct Indexes;

    impl<'de> serde::de::DeserializeSeed<'de> for Indexes {
        type Value = BTreeMap<String, String>;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Indexes {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"{"<index>": "<hex>"}"#)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut values = BTreeMap::new();
            while let Some(index) = map.next_key::<String>()? {
                let canonical = index == "0"
                    || (!index.is_empty()
                        && index.len() <= 2
                        && !index.starts_with('0')
                        && index.bytes().all(|b| b.is_ascii_digit()));
                if !canonical {
                    return Err(A::Error::custom(format!(
                        "PCR index {index:?} is not a decimal number below 100 without leading zeros"
                    )));
                }
                if values.contains_key(&index) {
                    return Err(A::Error::custom(format!("PCR {index} is listed twice")));
                }
                let value = map.next_value::<String>()?;
                values.insert(index, value);
            }
            Ok(values)
        }
    }
}

/// CSR #1 named by CSR #2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeRef {
    /// CSR #1's name.
    #[serde(rename = "csrName")]
    pub csr_name: String,
    /// CSR #1's UID.
    #[serde(rename = "csrUID")]
    pub csr_uid: String,
}

/// The DATA block of a `tpm/v1` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmData {
    /// 1 or 2.
    pub phase: u8,
    /// `TPM2B_PUBLIC` of the EK.
    #[serde(rename = "ekPublic", with = "b64")]
    pub ek_public: Vec<u8>,
    /// DER EK certificate from NV.
    #[serde(
        rename = "ekCertificate",
        default,
        skip_serializing_if = "Option::is_none",
        with = "b64::option"
    )]
    pub ek_certificate: Option<Vec<u8>>,
    /// DER intermediates.
    #[serde(
        rename = "ekIntermediates",
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "b64::list"
    )]
    pub ek_intermediates: Vec<Vec<u8>>,
    /// `TPM2B_PUBLIC` of the AK.
    #[serde(rename = "akPublic", with = "b64")]
    pub ak_public: Vec<u8>,
    /// `TPM2B_ATTEST` of the quote.
    #[serde(with = "b64")]
    pub quote: Vec<u8>,
    /// `TPMT_SIGNATURE` over it.
    #[serde(with = "b64")]
    pub signature: Vec<u8>,
    /// PCR values, informational in v1: `{"sha256": {"0": "<hex>"}}`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "pcrs::deserialize"
    )]
    pub pcrs: BTreeMap<String, BTreeMap<String, String>>,
    /// Phase 2: CSR #1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ChallengeRef>,
    /// Phase 1: the TCG event log the firmware and boot loaders measured into the PCRs, as the
    /// kernel exposes it (`binary_bios_measurements`), so a boot policy can be judged on the
    /// events the quote's PCRs replay (SPEC section 5, revision 5). Optional: without a policy
    /// the signer needs none.
    #[serde(
        rename = "eventLog",
        default,
        skip_serializing_if = "Option::is_none",
        with = "b64::option"
    )]
    pub event_log: Option<Vec<u8>>,
}

/// Largest event log read: real UEFI logs are 20 to 100 KiB (a few hundred events); 256 KiB
/// leaves room for firmware that logs every driver, and bounds what a node makes the signer
/// parse and replay.
pub const MAX_EVENT_LOG_BYTES: usize = 256 * 1024;

/// Largest DATA block read: a [`MAX_EVENT_LOG_BYTES`] log in base64 (4/3 of it, 342 KiB) and
/// room for the rest (EK certificate and intermediates, quote, signature: under 40 KiB). The
/// envelope caps a `tpm/v1` request at [`crate::names::MAX_TPM_REQUEST_BYTES`], this block's
/// PEM included.
const MAX_DATA: usize = 384 * 1024;

impl TpmData {
    /// The SHA-256 PCR values the node sent (`pcrs`), by index, each checked to be a SHA-256
    /// digest; `None` when it sent none. Not yet proven: the caller holds them to the quote.
    pub fn sha256_pcr_values(&self) -> Result<Option<BTreeMap<u32, Vec<u8>>>, String> {
        let Some(bank) = self.pcrs.get("sha256") else {
            return Ok(None);
        };
        let mut values = BTreeMap::new();
        for (index, value) in bank {
            let index: u32 = index.parse().map_err(|_| format!("pcrs: index {index:?}"))?;
            let value = crate::digest::from_hex(value)
                .filter(|v| v.len() == 32)
                .ok_or_else(|| format!("pcrs: the value of PCR {index} is not a sha256 digest"))?;
            values.insert(index, value);
        }
        Ok(Some(values))
    }

    /// Parses a DATA block; phase and challenge must agree.
    pub fn parse(data: &[u8]) -> Result<Self, WireError> {
        if data.len() > MAX_DATA {
            return Err(WireError::Invalid(format!("DATA block of {} bytes", data.len())));
        }
        let parsed: Self = serde_json::from_slice(data).map_err(|e| WireError::Invalid(format!("tpm/v1 DATA: {e}")))?;
        match (parsed.phase, &parsed.challenge) {
            _ if parsed
                .event_log
                .as_ref()
                .is_some_and(|log| log.len() > MAX_EVENT_LOG_BYTES) =>
            {
                Err(WireError::Invalid(format!(
                    "eventLog of {} bytes, more than the {MAX_EVENT_LOG_BYTES} read",
                    parsed.event_log.as_ref().map_or(0, Vec::len)
                )))
            }
            (1, None) | (2, Some(_)) => Ok(parsed),
            (1, Some(_)) => Err(WireError::Invalid("phase 1 carries no challenge".into())),
            (2, None) => Err(WireError::Invalid("phase 2 must name CSR #1 in challenge".into())),
            (other, _) => Err(WireError::Invalid(format!("phase {other} (1 or 2)"))),
        }
    }

    /// The block's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The annotation the signer writes on CSR #1: `cluster.x-k8s.io/tpm-credential-challenge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeAnnotation {
    /// RFC 3339, second precision.
    #[serde(rename = "issuedAt")]
    pub issued_at: String,
    /// `TPM2B_ID_OBJECT`.
    #[serde(rename = "credentialBlob", with = "b64")]
    pub credential_blob: Vec<u8>,
    /// `TPM2B_ENCRYPTED_SECRET`.
    #[serde(rename = "encryptedSecret", with = "b64")]
    pub encrypted_secret: Vec<u8>,
    /// HMAC-SHA256 over the CSR's UID, `issuedAt` and both blobs, under a key derived from the
    /// signer's challenge key: requesters can write this annotation too, and only a `mac` that
    /// verifies makes it the signer's (SPEC section 5).
    #[serde(with = "b64")]
    pub mac: Vec<u8>,
}

/// What the annotation `mac` key is derived with from the challenge key, so the mac and the
/// challenge secret never share an HMAC key.
const MAC_KEY_LABEL: &[u8] = b"node-attestation-signer tpm/v1 challenge annotation mac";

impl ChallengeAnnotation {
    /// The annotation the signer writes on CSR `csr_uid`, authenticated under `key`.
    pub fn sealed(
        key: &[u8],
        csr_uid: &str,
        issued_at: String,
        credential_blob: Vec<u8>,
        encrypted_secret: Vec<u8>,
    ) -> Self {
        let mut annotation = Self {
            issued_at,
            credential_blob,
            encrypted_secret,
            mac: Vec::new(),
        };
        annotation.mac = annotation.mac_tag(key, csr_uid).as_ref().to_vec();
        annotation
    }

    /// Whether the signer holding `key` wrote this annotation for CSR `csr_uid` (constant-time).
    pub fn is_authentic(&self, key: &[u8], csr_uid: &str) -> bool {
        let mac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &mac_key(key));
        aws_lc_rs::hmac::verify(&mac_key, &self.mac_input(csr_uid), &self.mac).is_ok()
    }

    fn mac_tag(&self, key: &[u8], csr_uid: &str) -> aws_lc_rs::hmac::Tag {
        let mac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &mac_key(key));
        aws_lc_rs::hmac::sign(&mac_key, &self.mac_input(csr_uid))
    }

    /// CSR UID, issuedAt, credentialBlob, encryptedSecret; each u32 big-endian length-prefixed.
    fn mac_input(&self, csr_uid: &str) -> Vec<u8> {
        let mut input = Vec::new();
        for field in [
            csr_uid.as_bytes(),
            self.issued_at.as_bytes(),
            &self.credential_blob,
            &self.encrypted_secret,
        ] {
            input.extend_from_slice(&(field.len() as u32).to_be_bytes());
            input.extend_from_slice(field);
        }
        input
    }
}

fn mac_key(key: &[u8]) -> zeroize::Zeroizing<Vec<u8>> {
    let derive = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    zeroize::Zeroizing::new(aws_lc_rs::hmac::sign(&derive, MAC_KEY_LABEL).as_ref().to_vec())
}

/// What the challenge secret is bound to (SPEC section 5).
#[derive(Debug, Clone, Copy)]
pub struct ChallengeBinding<'a> {
    /// The Cluster's UID.
    pub cluster_uid: &'a str,
    /// CSR #1's UID.
    pub csr_uid: &'a str,
    /// SHA-256 of the CSR's SubjectPublicKeyInfo DER.
    pub spki_sha256: &'a [u8; 32],
    /// The AK's TPM Name.
    pub ak_name: &'a [u8],
    /// The EK hash (lowercase hex of the canonical SPKI's SHA-256).
    pub ek_sha256: &'a str,
    /// When the challenge was issued (whole seconds).
    pub issued_at: OffsetDateTime,
}

/// `HMAC-SHA256(K, cluster UID || CSR #1 UID || SHA-256(SPKI) || AK name || EK hash ||
/// issuedAt)`, each field length-prefixed (u32 big-endian) so no two bindings share an input.
/// `K` lives in a management-cluster Secret: the secret survives restarts, is the same on every
/// replica, and no reader of CSRs can compute it.
pub fn challenge_secret(key: &[u8], binding: &ChallengeBinding<'_>) -> [u8; 32] {
    let hmac_key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    let mut ctx = aws_lc_rs::hmac::Context::with_key(&hmac_key);
    let issued = binding
        .issued_at
        .replace_nanosecond(0)
        .unwrap_or(binding.issued_at)
        .format(&Rfc3339)
        .unwrap_or_default();
    for field in [
        binding.cluster_uid.as_bytes(),
        binding.csr_uid.as_bytes(),
        binding.spki_sha256.as_slice(),
        binding.ak_name,
        binding.ek_sha256.as_bytes(),
        issued.as_bytes(),
    ] {
        ctx.update(&(field.len() as u32).to_be_bytes());
        ctx.update(field);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// Phase 2's quote binding: `SHA-256(SPKI DER || secret)`.
pub fn phase_two_extra_data(spki_der: &[u8], secret: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(spki_der);
    ctx.update(secret);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Decodes standard base64 (for callers holding annotation text).
pub fn decode_b64(text: &str) -> Result<Vec<u8>, WireError> {
    base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map_err(|e| WireError::Invalid(format!("base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(phase: u8) -> TpmData {
        TpmData {
            phase,
            ek_public: vec![0, 1, 2],
            ek_certificate: Some(vec![3]),
            ek_intermediates: vec![vec![4], vec![5, 6]],
            ak_public: vec![7],
            quote: vec![8],
            signature: vec![9],
            pcrs: BTreeMap::from([("sha256".into(), BTreeMap::from([("0".into(), "00".repeat(32))]))]),
            challenge: (phase == 2).then(|| ChallengeRef {
                csr_name: "node-csr-1".into(),
                csr_uid: "u-1".into(),
            }),
            event_log: None,
        }
    }

    #[test]
    fn data_blocks_round_trip_with_padded_base64() {
        for phase in [1, 2] {
            let data = sample(phase);
            let bytes = data.encode();
            assert_eq!(TpmData::parse(&bytes).unwrap(), data);
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.contains(r#""ekPublic":"AAEC""#), "{text}");
            assert!(text.contains(r#""ekIntermediates":["BA==","BQY="]"#), "{text}");
        }
    }

    #[test]
    fn the_event_log_round_trips_as_padded_base64_and_is_left_out_when_absent() {
        let without = sample(1);
        let text = String::from_utf8(without.encode()).unwrap();
        assert!(!text.contains("eventLog"), "{text}");
        let with = TpmData {
            event_log: Some(vec![0xff, 0, 1, 2]),
            ..sample(1)
        };
        let text = String::from_utf8(with.encode()).unwrap();
        assert!(text.contains(r#""eventLog":"/wABAg==""#), "{text}");
        assert_eq!(TpmData::parse(text.as_bytes()).unwrap(), with);
        let unpadded = text.replace(r#""/wABAg==""#, r#""/wABAg""#);
        assert!(TpmData::parse(unpadded.as_bytes()).is_err(), "{unpadded}");
        let null = text.replace(r#""/wABAg==""#, "null");
        assert_eq!(TpmData::parse(null.as_bytes()).unwrap().event_log, None, "{null}");
    }

    #[test]
    fn phases_unknown_fields_and_bad_base64_are_refused() {
        let mut one = serde_json::to_value(sample(1)).unwrap();
        one["challenge"] = serde_json::json!({"csrName": "x", "csrUID": "y"});
        assert!(
            TpmData::parse(one.to_string().as_bytes()).is_err(),
            "phase 1 with a challenge"
        );
        let mut two = serde_json::to_value(sample(2)).unwrap();
        two.as_object_mut().unwrap().remove("challenge");
        assert!(
            TpmData::parse(two.to_string().as_bytes()).is_err(),
            "phase 2 without one"
        );
        let mut extra = serde_json::to_value(sample(1)).unwrap();
        extra["policy"] = serde_json::json!("x");
        assert!(TpmData::parse(extra.to_string().as_bytes()).is_err(), "unknown field");
        let mut unpadded = serde_json::to_value(sample(1)).unwrap();
        unpadded["quote"] = serde_json::json!("CA");
        assert!(
            TpmData::parse(unpadded.to_string().as_bytes()).is_err(),
            "base64 without padding"
        );
        let mut three = serde_json::to_value(sample(1)).unwrap();
        three["phase"] = serde_json::json!(3);
        assert!(TpmData::parse(three.to_string().as_bytes()).is_err());
        assert!(TpmData::parse(&vec![b' '; MAX_DATA + 1]).is_err());
        let largest = TpmData {
            event_log: Some(vec![0xa5; MAX_EVENT_LOG_BYTES]),
            ..sample(1)
        };
        assert!(
            TpmData::parse(&largest.encode()).is_ok(),
            "a 256 KiB log fits the DATA cap"
        );
        let larger = TpmData {
            event_log: Some(vec![0xa5; MAX_EVENT_LOG_BYTES + 1]),
            ..sample(1)
        };
        let error = TpmData::parse(&larger.encode()).unwrap_err().to_string();
        assert!(error.contains("eventLog of 262145 bytes"), "{error}");
    }

    /// `sample(phase)` as JSON text with `edit` applied to its object.
    fn edited(phase: u8, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
        let mut value = serde_json::to_value(sample(phase)).unwrap();
        edit(value.as_object_mut().unwrap());
        value.to_string()
    }

    #[test]
    fn phase_is_a_json_number_one_or_two() {
        for phase in [1, 2] {
            assert!(TpmData::parse(edited(phase, |_| {}).as_bytes()).is_ok());
        }
        for bad in [
            serde_json::json!("1"),
            serde_json::json!(1.0),
            serde_json::json!(true),
            serde_json::json!(null),
            serde_json::json!([1]),
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(257),
        ] {
            let text = edited(1, |o| {
                o.insert("phase".into(), bad.clone());
            });
            assert!(TpmData::parse(text.as_bytes()).is_err(), "{text}");
        }
        // Spellings serde_json::Value would not write.
        let text = edited(1, |_| {});
        for spelling in ["1e0", "1.0", "01", "+1", "0x1"] {
            let odd = text.replacen(r#""phase":1"#, &format!(r#""phase":{spelling}"#), 1);
            assert_ne!(odd, text);
            assert!(TpmData::parse(odd.as_bytes()).is_err(), "{odd}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_at_every_level() {
        let top = edited(1, |o| {
            o.insert("phase2".into(), serde_json::json!(1));
        });
        assert!(TpmData::parse(top.as_bytes()).is_err(), "{top}");
        let challenge = edited(2, |o| {
            o["challenge"]["csrNamespace"] = serde_json::json!("x");
        });
        assert!(TpmData::parse(challenge.as_bytes()).is_err(), "{challenge}");
        let bank = edited(1, |o| {
            o["pcrs"]["sha1"] = serde_json::json!({"0": "00"});
        });
        assert!(TpmData::parse(bank.as_bytes()).is_err(), "{bank}");
        for index in ["00", "+0", "-1", " 1", "1 ", "x", "100", ""] {
            let text = edited(1, |o| {
                o["pcrs"] = serde_json::json!({"sha256": {index: "00"}});
            });
            assert!(TpmData::parse(text.as_bytes()).is_err(), "{text}");
        }
        let typed = edited(1, |o| {
            o["pcrs"] = serde_json::json!({"sha256": {"0": 0}});
        });
        assert!(TpmData::parse(typed.as_bytes()).is_err(), "{typed}");
        // What the node writes still parses.
        let pcrs = edited(1, |o| {
            o["pcrs"] = serde_json::json!({"sha256": {"0": "00", "7": "11", "23": "22"}});
        });
        assert_eq!(TpmData::parse(pcrs.as_bytes()).unwrap().pcrs["sha256"].len(), 3);
    }

    #[test]
    fn duplicate_keys_are_refused_at_every_level() {
        let text = edited(2, |_| {});
        let duplicated = |what: &str, with: &str| {
            let odd = text.replacen(what, with, 1);
            assert_ne!(odd, text, "{what} not in {text}");
            assert!(TpmData::parse(odd.as_bytes()).is_err(), "{odd}");
        };
        duplicated(r#""phase":2"#, r#""phase":2,"phase":2"#);
        duplicated(r#""quote":"#, r#""quote":"CA==","quote":"#);
        duplicated(r#""csrName":"#, r#""csrName":"other","csrName":"#);
        duplicated(r#""sha256":{"#, r#""sha256":{},"sha256":{"#);
        let zero = format!(r#""0":"{}""#, "00".repeat(32));
        duplicated(&zero, &format!(r#""0":"11",{zero}"#));
    }

    #[test]
    fn the_secret_is_bound_to_every_input_and_to_the_key() {
        let spki = [1u8; 32];
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let base = ChallengeBinding {
            cluster_uid: "c",
            csr_uid: "u",
            spki_sha256: &spki,
            ak_name: b"ak",
            ek_sha256: "ek",
            issued_at: at,
        };
        let s = challenge_secret(b"key", &base);
        assert_eq!(s, challenge_secret(b"key", &base), "derived, so recomputable");
        assert_ne!(s, challenge_secret(b"other key", &base));
        let other_spki = [2u8; 32];
        for changed in [
            ChallengeBinding {
                cluster_uid: "c2",
                ..base
            },
            ChallengeBinding { csr_uid: "u2", ..base },
            ChallengeBinding {
                spki_sha256: &other_spki,
                ..base
            },
            ChallengeBinding {
                ak_name: b"ak2",
                ..base
            },
            ChallengeBinding {
                ek_sha256: "ek2",
                ..base
            },
            ChallengeBinding {
                issued_at: at + time::Duration::seconds(1),
                ..base
            },
            // Field boundaries matter: "c"+"u" must not equal "cu"+"".
            ChallengeBinding {
                cluster_uid: "cu",
                csr_uid: "",
                ..base
            },
        ] {
            assert_ne!(s, challenge_secret(b"key", &changed));
        }
        assert_ne!(
            phase_two_extra_data(b"spki", &s),
            phase_two_extra_data(b"spki", &[0; 32])
        );
    }

    #[test]
    fn the_annotation_has_the_specs_field_names() {
        let a = ChallengeAnnotation {
            issued_at: "2026-11-22T10:00:00Z".into(),
            credential_blob: vec![1],
            encrypted_secret: vec![2],
            mac: vec![3],
        };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"issuedAt":"2026-11-22T10:00:00Z","credentialBlob":"AQ==","encryptedSecret":"Ag==","mac":"Aw=="}"#
        );
        assert_eq!(serde_json::from_str::<ChallengeAnnotation>(&text).unwrap(), a);
    }

    #[test]
    fn the_annotation_mac_binds_the_csr_every_field_and_the_key() {
        let key = [7u8; 32];
        let sealed = ChallengeAnnotation::sealed(&key, "uid-1", "2026-11-22T10:00:00Z".into(), vec![1], vec![2]);
        assert!(sealed.is_authentic(&key, "uid-1"));
        assert!(!sealed.is_authentic(&key, "uid-2"), "another CSR");
        assert!(!sealed.is_authentic(&[8u8; 32], "uid-1"), "another key");
        let tampered = [
            ChallengeAnnotation {
                issued_at: "2026-11-22T10:00:01Z".into(),
                ..sealed.clone()
            },
            ChallengeAnnotation {
                credential_blob: vec![9],
                ..sealed.clone()
            },
            ChallengeAnnotation {
                encrypted_secret: vec![9],
                ..sealed.clone()
            },
            ChallengeAnnotation {
                mac: sealed.mac[..31].to_vec(),
                ..sealed.clone()
            },
            ChallengeAnnotation {
                mac: Vec::new(),
                ..sealed.clone()
            },
            // Field boundaries matter: moving a byte between blobs changes the mac.
            ChallengeAnnotation {
                credential_blob: vec![1, 2],
                encrypted_secret: vec![],
                ..sealed.clone()
            },
        ];
        for forged in tampered {
            assert!(!forged.is_authentic(&key, "uid-1"), "{forged:?}");
        }
        let without_mac = r#"{"issuedAt":"2026-11-22T10:00:00Z","credentialBlob":"AQ==","encryptedSecret":"Ag=="}"#;
        assert!(serde_json::from_str::<ChallengeAnnotation>(without_mac).is_err());
    }
}
