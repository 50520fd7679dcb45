//! The two log formats, read strictly: every length is checked against what is left before
//! anything is allocated, counts are capped, and a structure that does not add up is an error
//! naming the event and its offset.

use super::{
    AlgorithmSize, Event, EventLog, EventLogError, HashAlg, LogFormat, MAX_ALGORITHMS, MAX_DIGEST_SIZE, MAX_EVENTS,
    PCR_COUNT, event_type,
};

/// The signature of the crypto-agile header's `TCG_EfiSpecIDEventStruct`.
const SPEC_ID_SIGNATURE: &[u8; 16] = b"Spec ID Event03\0";

/// The signature of the `TCG_EfiStartupLocalityEvent` (PC Client PFP 1.05, 9.4.5.3).
const STARTUP_LOCALITY_SIGNATURE: &[u8; 16] = b"StartupLocality\0";

/// Parses a log in either format (`TCG_PCR_EVENT` SHA-1 legacy, or crypto-agile).
///
/// The format is told by the first event: an `EV_NO_ACTION` in PCR 0 whose data starts with
/// `Spec ID Event03\0` opens a crypto-agile log; anything else is the first event of a legacy
/// log.
pub fn parse(bytes: &[u8]) -> Result<EventLog, EventLogError> {
    if bytes.is_empty() {
        return Err(EventLogError::Empty);
    }
    let mut reader = Reader { buf: bytes, pos: 0 };
    let header = legacy_event(&mut reader, 0)?;
    let crypto_agile =
        header.event_type == event_type::NO_ACTION && header.pcr == 0 && header.data.starts_with(SPEC_ID_SIGNATURE);
    let (format, algorithms) = if crypto_agile {
        let algorithms = spec_id(&header.data).map_err(|reason| EventLogError::Malformed {
            index: 0,
            offset: 0,
            reason: format!("Spec ID Event03: {reason}"),
        })?;
        (LogFormat::CryptoAgile, algorithms)
    } else {
        let sha1 = AlgorithmSize {
            algorithm_id: HashAlg::Sha1.tpm_alg_id(),
            digest_size: 20,
        };
        (LogFormat::Sha1Legacy, vec![sha1])
    };
    let mut log = EventLog {
        events: vec![header],
        format,
        algorithms,
        startup_locality: None,
        trailing_zeros: 0,
    };
    note_startup_locality(&mut log, 0, 0)?;
    loop {
        let rest = reader.rest();
        if rest.is_empty() {
            break;
        }
        // Quirk: zero padding after the last event (a log read from the whole ACPI log area,
        // or a fixed-size buffer). A zero event of either format would be PCR 0, EV_PREBOOT_CERT
        // with no data, which no firmware writes; all-zero remainders are padding.
        if rest.iter().all(|b| *b == 0) {
            log.trailing_zeros = rest.len();
            break;
        }
        let index = log.events.len();
        if index >= MAX_EVENTS {
            return Err(EventLogError::TooManyEvents { limit: MAX_EVENTS });
        }
        let offset = reader.pos;
        let event = match format {
            LogFormat::Sha1Legacy => legacy_event(&mut reader, index)?,
            LogFormat::CryptoAgile => agile_event(&mut reader, index, &log.algorithms)?,
        };
        log.events.push(event);
        note_startup_locality(&mut log, index, offset)?;
    }
    Ok(log)
}

/// Records a `StartupLocality` `EV_NO_ACTION` event, which must come before anything is
/// extended into PCR 0 and only once (it says what PCR 0 was reset to).
fn note_startup_locality(log: &mut EventLog, index: usize, offset: usize) -> Result<(), EventLogError> {
    let Some(event) = log.events.get(index) else {
        return Ok(());
    };
    if event.event_type != event_type::NO_ACTION || !event.data.starts_with(STARTUP_LOCALITY_SIGNATURE) {
        return Ok(());
    }
    let malformed = |reason: &str| EventLogError::Malformed {
        index,
        offset,
        reason: format!("StartupLocality: {reason}"),
    };
    let [locality] = event.data[STARTUP_LOCALITY_SIGNATURE.len()..] else {
        return Err(malformed("the data is not 16 + 1 bytes"));
    };
    if event.pcr != 0 {
        return Err(malformed("not in PCR 0"));
    }
    if locality > 4 {
        return Err(malformed(&format!("locality {locality} (0 to 4)")));
    }
    if log.startup_locality.is_some() {
        return Err(malformed("a second StartupLocality event"));
    }
    let extended_before = log.events[..index]
        .iter()
        .any(|e| e.pcr == 0 && e.event_type != event_type::NO_ACTION);
    if extended_before {
        return Err(malformed("after PCR 0 was extended"));
    }
    log.startup_locality = Some(locality);
    Ok(())
}

/// A `TCG_PCR_EVENT`: PCR index, type, SHA-1 digest, size, data.
fn legacy_event(reader: &mut Reader<'_>, index: usize) -> Result<Event, EventLogError> {
    let mut at = reader.at(index);
    let pcr = at.u32("pcrIndex")?;
    let event_type = at.u32("eventType")?;
    at.check_pcr(pcr, event_type)?;
    let digest = at.bytes(20, "digest")?.to_vec();
    let data = at.sized_data()?;
    Ok(Event {
        index,
        pcr,
        event_type,
        digests: vec![(HashAlg::Sha1, digest)],
        data,
    })
}

/// A `TCG_PCR_EVENT2`: PCR index, type, `TPML_DIGEST_VALUES`, size, data.
fn agile_event(reader: &mut Reader<'_>, index: usize, algorithms: &[AlgorithmSize]) -> Result<Event, EventLogError> {
    let mut at = reader.at(index);
    let pcr = at.u32("pcrIndex")?;
    let event_type = at.u32("eventType")?;
    at.check_pcr(pcr, event_type)?;
    let count = at.u32("digests.count")?;
    if count as usize > algorithms.len() {
        return Err(at.malformed(format!(
            "{count} digests, the header declares {} algorithms",
            algorithms.len()
        )));
    }
    let mut digests = Vec::with_capacity(count as usize);
    let mut seen: Vec<u16> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id = at.u16("digests.hashAlg")?;
        let Some(declared) = algorithms.iter().find(|a| a.algorithm_id == id) else {
            return Err(at.malformed(format!("digest algorithm {id:#06x} is not declared in the header")));
        };
        if seen.contains(&id) {
            return Err(at.malformed(format!("two digests of algorithm {id:#06x}")));
        }
        seen.push(id);
        let digest = at.bytes(usize::from(declared.digest_size), "digests.digest")?;
        if let Some(alg) = HashAlg::from_tpm_alg_id(id) {
            digests.push((alg, digest.to_vec()));
        }
    }
    let data = at.sized_data()?;
    Ok(Event {
        index,
        pcr,
        event_type,
        digests,
        data,
    })
}

/// The algorithms of a `TCG_EfiSpecIDEventStruct` (TCG PC Client PFP 1.05, 9.4.5.1), checked:
/// version 2.0, 1 to [`MAX_ALGORITHMS`] algorithms, no algorithm twice, the known ones with
/// their own sizes, unknown ones at most [`MAX_DIGEST_SIZE`] bytes, and the vendor info taking
/// exactly the rest.
fn spec_id(data: &[u8]) -> Result<Vec<AlgorithmSize>, String> {
    let mut reader = Reader { buf: data, pos: 0 };
    let mut at = reader.at(0);
    let truncated = |_| "truncated".to_string();
    at.bytes(16, "signature").map_err(truncated)?;
    at.u32("platformClass").map_err(truncated)?;
    let minor = at.u8("specVersionMinor").map_err(truncated)?;
    let major = at.u8("specVersionMajor").map_err(truncated)?;
    at.u8("specErrata").map_err(truncated)?;
    at.u8("uintnSize").map_err(truncated)?;
    if (major, minor) != (2, 0) {
        return Err(format!("spec version {major}.{minor}, not 2.0"));
    }
    let count = at.u32("numberOfAlgorithms").map_err(truncated)?;
    if count == 0 || count as usize > MAX_ALGORITHMS {
        return Err(format!("{count} algorithms (1 to {MAX_ALGORITHMS})"));
    }
    let mut algorithms: Vec<AlgorithmSize> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let algorithm_id = at.u16("algorithmId").map_err(truncated)?;
        let digest_size = at.u16("digestSize").map_err(truncated)?;
        if algorithms.iter().any(|a| a.algorithm_id == algorithm_id) {
            return Err(format!("algorithm {algorithm_id:#06x} declared twice"));
        }
        let size_ok = match HashAlg::from_tpm_alg_id(algorithm_id) {
            Some(alg) => usize::from(digest_size) == alg.size(),
            None => digest_size != 0 && usize::from(digest_size) <= MAX_DIGEST_SIZE,
        };
        if !size_ok {
            return Err(format!(
                "algorithm {algorithm_id:#06x} with a {digest_size}-byte digest"
            ));
        }
        algorithms.push(AlgorithmSize {
            algorithm_id,
            digest_size,
        });
    }
    let vendor_size = at.u8("vendorInfoSize").map_err(truncated)?;
    let left = data.len() - at.reader.pos;
    if left != usize::from(vendor_size) {
        return Err(format!("vendorInfoSize {vendor_size}, but {left} bytes follow"));
    }
    Ok(algorithms)
}

/// A little-endian cursor over the log.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// What is left.
    fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos.min(self.buf.len())..]
    }

    /// A cursor for event `index`, starting here (errors name the event and this offset).
    fn at(&mut self, index: usize) -> EventReader<'_, 'a> {
        let offset = self.pos;
        EventReader {
            reader: self,
            index,
            offset,
        }
    }
}

/// The cursor while one event is read.
struct EventReader<'r, 'a> {
    reader: &'r mut Reader<'a>,
    index: usize,
    offset: usize,
}

impl<'a> EventReader<'_, 'a> {
    fn malformed(&self, reason: String) -> EventLogError {
        EventLogError::Malformed {
            index: self.index,
            offset: self.offset,
            reason,
        }
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], EventLogError> {
        let start = self.reader.pos;
        let end = start
            .checked_add(n)
            .filter(|end| *end <= self.reader.buf.len())
            .ok_or(EventLogError::Truncated {
                index: self.index,
                offset: self.offset,
                what,
            })?;
        self.reader.pos = end;
        Ok(&self.reader.buf[start..end])
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EventLogError> {
        let b = self.bytes(1, what)?;
        Ok(b[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, EventLogError> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EventLogError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The PCR index: 0 to 23, or for `EV_NO_ACTION` (never extended) anything. Quirk:
    /// Windows appends `EV_NO_ACTION` events with PCR `0xFFFFFFFF` (`option_rom_eventlog`).
    fn check_pcr(&self, pcr: u32, event_type: u32) -> Result<(), EventLogError> {
        if pcr >= PCR_COUNT && event_type != event_type::NO_ACTION {
            return Err(self.malformed(format!("PCR {pcr} (0 to {})", PCR_COUNT - 1)));
        }
        Ok(())
    }

    /// `eventSize` and the event data, the size checked against what is left before copying.
    fn sized_data(&mut self) -> Result<Vec<u8>, EventLogError> {
        let size = self.u32("eventSize")?;
        let size = usize::try_from(size).map_err(|_| self.malformed("eventSize".into()))?;
        Ok(self.bytes(size, "event data")?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `TCG_PCR_EVENT`.
    pub(crate) fn legacy(pcr: u32, event_type: u32, digest: [u8; 20], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(pcr.to_le_bytes());
        out.extend(event_type.to_le_bytes());
        out.extend(digest);
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
        out
    }

    /// A `Spec ID Event03` header declaring `algs` (id, size).
    pub(crate) fn spec_header(algs: &[(u16, u16)]) -> Vec<u8> {
        let mut data = SPEC_ID_SIGNATURE.to_vec();
        data.extend(0u32.to_le_bytes());
        data.extend([0, 2, 0, 8]);
        data.extend((algs.len() as u32).to_le_bytes());
        for (id, size) in algs {
            data.extend(id.to_le_bytes());
            data.extend(size.to_le_bytes());
        }
        data.push(0);
        legacy(0, event_type::NO_ACTION, [0; 20], &data)
    }

    /// A `TCG_PCR_EVENT2`.
    pub(crate) fn agile(pcr: u32, event_type: u32, digests: &[(u16, Vec<u8>)], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(pcr.to_le_bytes());
        out.extend(event_type.to_le_bytes());
        out.extend((digests.len() as u32).to_le_bytes());
        for (id, digest) in digests {
            out.extend(id.to_le_bytes());
            out.extend(digest);
        }
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
        out
    }

    fn sha256_log(events: &[Vec<u8>]) -> Vec<u8> {
        let mut log = spec_header(&[(0x000B, 32)]);
        for event in events {
            log.extend(event);
        }
        log
    }

    #[test]
    fn a_legacy_log_has_one_sha1_bank() {
        let mut bytes = legacy(0, event_type::S_CRTM_VERSION, [1; 20], b"v1");
        bytes.extend(legacy(4, event_type::SEPARATOR, [2; 20], &[0; 4]));
        let log = parse(&bytes).unwrap();
        assert_eq!(log.format, LogFormat::Sha1Legacy);
        assert_eq!(log.banks(), vec![HashAlg::Sha1]);
        assert_eq!(log.events.len(), 2);
        assert_eq!(log.events[1].index, 1);
        assert_eq!(log.events[1].digest(HashAlg::Sha1), Some(&[2; 20][..]));
        assert_eq!(log.events[1].describe(), "event 1 (PCR 4, EV_SEPARATOR)");
    }

    #[test]
    fn a_crypto_agile_log_keeps_its_header_as_event_zero() {
        let bytes = sha256_log(&[agile(7, event_type::SEPARATOR, &[(0x000B, vec![3; 32])], &[0; 4])]);
        let log = parse(&bytes).unwrap();
        assert_eq!(log.format, LogFormat::CryptoAgile);
        assert_eq!(log.banks(), vec![HashAlg::Sha256]);
        assert_eq!(log.events[0].event_type, event_type::NO_ACTION);
        assert_eq!(log.events[1].digest(HashAlg::Sha256), Some(&[3; 32][..]));
        assert_eq!(log.events[1].digest(HashAlg::Sha1), None);
    }

    #[test]
    fn an_unknown_declared_algorithm_is_skipped_by_its_declared_size() {
        let mut bytes = spec_header(&[(0x0012, 32), (0x000B, 32)]);
        bytes.extend(agile(
            4,
            event_type::SEPARATOR,
            &[(0x0012, vec![9; 32]), (0x000B, vec![3; 32])],
            &[0; 4],
        ));
        let log = parse(&bytes).unwrap();
        assert_eq!(log.banks(), vec![HashAlg::Sha256]);
        assert_eq!(log.events[1].digests, vec![(HashAlg::Sha256, vec![3; 32])]);
    }

    #[test]
    fn trailing_zeros_are_padding() {
        let mut bytes = sha256_log(&[agile(7, event_type::SEPARATOR, &[(0x000B, vec![3; 32])], &[0; 4])]);
        bytes.extend([0; 100]);
        let log = parse(&bytes).unwrap();
        assert_eq!(log.events.len(), 2);
        assert_eq!(log.trailing_zeros, 100);
    }

    #[test]
    fn trailing_garbage_is_an_error() {
        let mut bytes = sha256_log(&[]);
        bytes.extend([0, 0, 0, 0, 1]);
        assert!(matches!(parse(&bytes), Err(EventLogError::Truncated { index: 1, .. })));
    }

    #[test]
    fn a_huge_event_size_is_truncation_not_allocation() {
        let mut bytes = legacy(0, 8, [0; 20], b"");
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            parse(&bytes),
            Err(EventLogError::Truncated {
                index: 0,
                offset: 0,
                what: "event data"
            })
        );
    }

    #[test]
    fn structural_errors_name_the_event_and_its_offset() {
        let header_len = sha256_log(&[]).len();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (agile(24, 4, &[(0x000B, vec![0; 32])], &[]), "PCR 24"),
            (agile(u32::MAX, 4, &[(0x000B, vec![0; 32])], &[]), "PCR 4294967295"),
            (
                agile(4, 4, &[(0x000B, vec![0; 32]), (0x000B, vec![0; 32])], &[]),
                "2 digests",
            ),
            (agile(4, 4, &[(0x0004, vec![0; 20])], &[]), "not declared"),
        ];
        for (event, want) in cases {
            match parse(&sha256_log(&[event])) {
                Err(EventLogError::Malformed { index, offset, reason }) => {
                    assert_eq!((index, offset), (1, header_len));
                    assert!(reason.contains(want), "{reason}");
                }
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_digest_declared_twice_in_one_event_is_refused() {
        let mut bytes = spec_header(&[(0x0004, 20), (0x000B, 32)]);
        bytes.extend(agile(4, 4, &[(0x000B, vec![0; 32]), (0x000B, vec![0; 32])], &[]));
        let err = parse(&bytes).unwrap_err();
        assert!(err.to_string().contains("two digests"), "{err}");
    }

    #[test]
    fn bad_spec_id_headers_are_refused() {
        let cases: Vec<(Vec<(u16, u16)>, &str)> = vec![
            (vec![], "0 algorithms"),
            (vec![(0x000B, 20)], "20-byte digest"),
            (vec![(0x000B, 32), (0x000B, 32)], "declared twice"),
            (vec![(0x0012, 65)], "65-byte digest"),
            (vec![(0x0012, 0)], "0-byte digest"),
            (vec![(1, 32); MAX_ALGORITHMS + 1], "17 algorithms"),
        ];
        for (algs, want) in cases {
            let err = parse(&spec_header(&algs)).unwrap_err();
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        let mut bytes = spec_header(&[(0x000B, 32)]);
        bytes[32 + 20] = 1; // specVersionMinor
        assert!(parse(&bytes).unwrap_err().to_string().contains("version 2.1"));
    }

    #[test]
    fn the_startup_locality_is_read_once_before_pcr0_is_extended() {
        let mut locality = STARTUP_LOCALITY_SIGNATURE.to_vec();
        locality.push(3);
        let no_action = |pcr| agile(pcr, event_type::NO_ACTION, &[(0x000B, vec![0; 32])], &locality);
        let crtm = agile(0, event_type::S_CRTM_VERSION, &[(0x000B, vec![1; 32])], b"v");
        assert_eq!(parse(&sha256_log(&[no_action(0)])).unwrap().startup_locality, Some(3));
        for events in [
            vec![crtm.clone(), no_action(0)],
            vec![no_action(0), no_action(0)],
            vec![no_action(1)],
        ] {
            let err = parse(&sha256_log(&events)).unwrap_err();
            assert!(err.to_string().contains("StartupLocality"), "{err}");
        }
    }

    #[test]
    fn a_legacy_startup_locality_only_log_parses() {
        // go-attestation's short_no_action_eventlog: one legacy EV_NO_ACTION, 17 bytes of data.
        let mut data = STARTUP_LOCALITY_SIGNATURE.to_vec();
        data.push(3);
        let log = parse(&legacy(0, event_type::NO_ACTION, [0; 20], &data)).unwrap();
        assert_eq!(log.format, LogFormat::Sha1Legacy);
        assert_eq!(log.startup_locality, Some(3));
    }

    #[test]
    fn no_action_events_may_name_any_pcr() {
        let event = agile(u32::MAX, event_type::NO_ACTION, &[(0x000B, vec![0; 32])], b"AIK");
        let log = parse(&sha256_log(&[event])).unwrap();
        assert_eq!(log.events[1].pcr, u32::MAX);
    }

    #[test]
    fn an_empty_log_is_an_error() {
        assert_eq!(parse(&[]), Err(EventLogError::Empty));
    }

    /// A small crypto-agile log with SHA-1 and SHA-256, for the mutation properties.
    fn two_bank_log() -> Vec<u8> {
        let mut bytes = spec_header(&[(0x0004, 20), (0x000B, 32)]);
        for (pcr, event_type) in [(0, event_type::S_CRTM_VERSION), (7, event_type::SEPARATOR)] {
            bytes.extend(agile(
                pcr,
                event_type,
                &[(0x0004, vec![pcr as u8; 20]), (0x000B, vec![pcr as u8; 32])],
                &[0; 4],
            ));
        }
        bytes
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            if let Ok(log) = parse(&bytes) {
                for alg in HashAlg::ALL {
                    let _ = log.replay(alg);
                }
            }
        }

        #[test]
        fn overwritten_words_never_panic_and_what_parses_replays(
            writes in proptest::collection::vec((0usize..200, proptest::num::u32::ANY), 1..6)
        ) {
            let mut bytes = two_bank_log();
            for (at, word) in writes {
                let at = at % (bytes.len() - 3);
                bytes[at..at + 4].copy_from_slice(&word.to_le_bytes());
            }
            if let Ok(log) = parse(&bytes) {
                proptest::prop_assert!(log.events.iter().enumerate().all(|(i, e)| e.index == i));
                for alg in log.banks() {
                    if let Ok(pcrs) = log.replay(alg) {
                        proptest::prop_assert!(pcrs.values().all(|v| v.len() == alg.size()));
                    }
                }
            }
        }
    }
}
