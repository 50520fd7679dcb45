//! Replay: what the PCRs hold if the log is true.

use std::collections::BTreeMap;

use super::{EventLog, EventLogError, HashAlg, PCR_COUNT, event_type};

impl EventLog {
    /// The PCR values after replaying every event in bank `alg`: `new = H(old || digest)` for
    /// every event but `EV_NO_ACTION`, in log order. All 24 PCRs are in the map; a PCR no event
    /// touched holds its reset value: zero, all ones for the D-RTM PCRs 17 to 22 (which a
    /// static boot never resets; when the log does extend them, a D-RTM launch reset them to
    /// zero first), and for PCR 0 `00..00 || locality` when a `StartupLocality` event says the
    /// TPM was started from locality 3 or 4.
    ///
    /// An event that extends a PCR and has no digest in `alg` is an error: the TPM extended
    /// every allocated bank, so a log missing one is not this TPM's.
    pub fn replay(&self, alg: HashAlg) -> Result<BTreeMap<u32, Vec<u8>>, EventLogError> {
        if !self.banks().contains(&alg) {
            return Err(EventLogError::NoBank { alg });
        }
        let size = alg.size();
        let mut pcrs: BTreeMap<u32, Vec<u8>> = (0..PCR_COUNT)
            .map(|pcr| (pcr, initial_value(self, pcr, size)))
            .collect();
        let mut extended = [false; PCR_COUNT as usize];
        let mut buf = Vec::with_capacity(2 * size);
        for event in &self.events {
            if event.event_type == event_type::NO_ACTION {
                continue;
            }
            let digest = event.digest(alg).ok_or_else(|| EventLogError::MissingDigest {
                event: event.describe(),
                alg,
            })?;
            let Some(value) = pcrs.get_mut(&event.pcr) else {
                // `parse` refuses PCRs above 23; an `EventLog` built by hand may not.
                return Err(EventLogError::BadEventData {
                    event: event.describe(),
                    reason: format!("PCR {} (0 to {})", event.pcr, PCR_COUNT - 1),
                });
            };
            let first = &mut extended[event.pcr as usize];
            if !*first && (17..=22).contains(&event.pcr) {
                value.fill(0);
            }
            *first = true;
            buf.clear();
            buf.extend_from_slice(value);
            buf.extend_from_slice(digest);
            *value = alg.digest(&buf);
        }
        Ok(pcrs)
    }
}

/// A PCR's value after `TPM2_Startup` (PC Client PFP 1.05, 3.3.3 and 9.4.5.3).
fn initial_value(log: &EventLog, pcr: u32, size: usize) -> Vec<u8> {
    match pcr {
        0 => {
            let mut value = vec![0; size];
            if let (Some(locality), Some(last)) = (log.startup_locality, value.last_mut()) {
                *last = locality;
            }
            value
        }
        17..=22 => vec![0xff; size],
        _ => vec![0; size],
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Event, LogFormat, parse};
    use super::*;
    use crate::tpm::event_log::AlgorithmSize;

    fn log(events: Vec<(u32, u32, Vec<u8>)>, locality: Option<u8>) -> EventLog {
        EventLog {
            events: events
                .into_iter()
                .enumerate()
                .map(|(index, (pcr, event_type, digest))| Event {
                    index,
                    pcr,
                    event_type,
                    digests: vec![(HashAlg::Sha256, digest)],
                    data: Vec::new(),
                })
                .collect(),
            format: LogFormat::CryptoAgile,
            algorithms: vec![AlgorithmSize {
                algorithm_id: 0x000B,
                digest_size: 32,
            }],
            startup_locality: locality,
            trailing_zeros: 0,
        }
    }

    fn extend(old: &[u8], digest: &[u8]) -> Vec<u8> {
        HashAlg::Sha256.digest(&[old, digest].concat())
    }

    #[test]
    fn events_extend_in_order_and_no_action_does_not() {
        let log = log(
            vec![
                (4, event_type::NO_ACTION, vec![9; 32]),
                (4, event_type::SEPARATOR, vec![1; 32]),
                (4, event_type::EFI_BOOT_SERVICES_APPLICATION, vec![2; 32]),
            ],
            None,
        );
        let pcrs = log.replay(HashAlg::Sha256).unwrap();
        assert_eq!(pcrs.len(), 24);
        assert_eq!(pcrs[&4], extend(&extend(&[0; 32], &[1; 32]), &[2; 32]));
        assert_eq!(pcrs[&5], vec![0; 32]);
        assert_eq!(pcrs[&17], vec![0xff; 32]);
    }

    #[test]
    fn pcr0_starts_at_the_startup_locality() {
        let log = log(vec![(0, event_type::S_CRTM_VERSION, vec![1; 32])], Some(3));
        let mut start = vec![0; 32];
        start[31] = 3;
        assert_eq!(log.replay(HashAlg::Sha256).unwrap()[&0], extend(&start, &[1; 32]));
    }

    #[test]
    fn a_drtm_pcr_starts_at_zero_when_extended() {
        let log = log(vec![(17, event_type::POST_CODE, vec![1; 32])], None);
        assert_eq!(log.replay(HashAlg::Sha256).unwrap()[&17], extend(&[0; 32], &[1; 32]));
    }

    #[test]
    fn a_missing_bank_or_digest_is_an_error() {
        let mut log = log(vec![(4, event_type::SEPARATOR, vec![1; 32])], None);
        assert_eq!(
            log.replay(HashAlg::Sha1),
            Err(EventLogError::NoBank { alg: HashAlg::Sha1 })
        );
        log.events[0].digests.clear();
        assert_eq!(
            log.replay(HashAlg::Sha256),
            Err(EventLogError::MissingDigest {
                event: "event 0 (PCR 4, EV_SEPARATOR)".into(),
                alg: HashAlg::Sha256
            })
        );
    }

    #[test]
    fn a_parsed_startup_locality_only_log_replays_pcr0_to_its_locality() {
        let mut data = b"StartupLocality\0".to_vec();
        data.push(3);
        let mut bytes = Vec::new();
        bytes.extend(0u32.to_le_bytes());
        bytes.extend(event_type::NO_ACTION.to_le_bytes());
        bytes.extend([0; 20]);
        bytes.extend((data.len() as u32).to_le_bytes());
        bytes.extend(&data);
        let pcrs = parse(&bytes).unwrap().replay(HashAlg::Sha1).unwrap();
        let mut want = vec![0; 20];
        want[19] = 3;
        assert_eq!(pcrs[&0], want);
    }
}
