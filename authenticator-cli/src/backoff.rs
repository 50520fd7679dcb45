//! Backing off after a denial (SPEC 6). After a CSR is Denied or Failed (both count as a
//! denial here: the signer said no, and asking again at once gets the same answer), exec mode
//! files no new one until a delay has passed, so a misconfigured node cannot flood the workload
//! cluster with CSRs while kubelet calls it every few seconds. The state is a small JSON file in the cert
//! dir, [`FILE`], written atomically with mode 0600 and read and written under the cert dir's
//! lock; it holds no secrets:
//!
//! ```json
//! {"denials": 3, "request": "tpm cluster.x-k8s.io/... system:node:worker-0 aws:///...",
//!  "csr": "node-csr-abc", "condition": "Denied", "reason": "MachineAlreadyClaimed",
//!  "message": "...", "deniedAt": "2026-01-01T10:00:00Z", "retryAt": "2026-01-01T10:02:00Z"}
//! ```
//!
//! The schedule ([`delay`]): 30 s after the first denial, doubling with each consecutive one,
//! capped at 15 min; each delay is shortened by up to 20% at random, so a fleet refused at once
//! (a MachinePool with a wrong setting) does not come back at once, and the cap stays a bound.
//! A successful issuance removes the file. A record made for other flags (attestor, signer,
//! node, provider ID) does not hold: changing the node's configuration is the fix it waits for.
//!
//! The file is believed only as far as it is plausible ([`Backoff::hold`]): a record asking to
//! wait longer than the cap from now (the clock moved back, or someone wrote it) is ignored, and
//! one that does not parse is treated as absent, with a warning. Both cost at most one CSR
//! before a real denial writes a fresh record; treating them as the cap instead would hold a
//! node back for a reason that has nothing to do with the signer.

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

use crate::obtain::Refused;

/// The state file in the cert dir.
pub const FILE: &str = "kubelet-authenticator-backoff";
/// The delay after the first denial.
pub const FIRST: Duration = Duration::seconds(30);
/// The longest delay.
pub const CAP: Duration = Duration::minutes(15);
/// The file is small; anything bigger is not ours.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
/// Texts from the signer are kept to this many characters.
const MAX_TEXT: usize = 1024;

/// The delay after the `denials`-th consecutive denial: `FIRST * 2^(denials - 1)`, at most
/// [`CAP`], shortened by `jitter` (in [0, 1]; anything else counts as 0) times 20%.
pub fn delay(denials: u32, jitter: f64) -> Duration {
    // 30 s * 2^5 is already past the cap: more doublings change nothing (and cannot overflow).
    let doublings = denials.saturating_sub(1).min(6);
    let full = (FIRST * 2i32.pow(doublings)).min(CAP);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    full * (1.0 - 0.2 * jitter)
}

/// The recorded denials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// Consecutive denials (at least 1).
    pub denials: u32,
    /// What was asked for ([`crate::exec::ExecArgs::request_key`]).
    pub request: String,
    /// The last refused CSR.
    pub csr: String,
    /// `Denied` or `Failed`.
    pub condition: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// When the denial was seen.
    pub denied_at: OffsetDateTime,
    /// No CSR is filed before this.
    pub retry_at: OffsetDateTime,
}

/// What a record means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// No CSR before then.
    Until(OffsetDateTime),
    /// The delay has passed: the next call files one.
    Over,
    /// Recorded for other flags: the next call files one.
    OtherRequest,
    /// Asks to wait longer than [`CAP`] from now: not believed.
    Implausible,
}

impl Backoff {
    /// The record after `refused`: one more denial than `previous` when that was for the same
    /// request, else the first.
    pub fn after(
        previous: Option<&Backoff>,
        request: &str,
        refused: &Refused,
        now: OffsetDateTime,
        jitter: f64,
    ) -> Self {
        let denials = match previous {
            Some(p) if p.request == request => p.denials.saturating_add(1),
            _ => 1,
        };
        Self {
            denials,
            request: request.to_owned(),
            csr: bounded(&refused.csr),
            condition: refused.condition.as_str().to_owned(),
            reason: bounded(&refused.reason),
            message: bounded(&refused.message),
            // Whole seconds: what the file keeps.
            denied_at: whole_seconds(now),
            retry_at: whole_seconds(now + delay(denials, jitter)),
        }
    }

    /// Whether the record holds back a CSR for `request` at `now`.
    pub fn hold(&self, request: &str, now: OffsetDateTime) -> Hold {
        if self.request != request {
            Hold::OtherRequest
        } else if now >= self.retry_at {
            Hold::Over
        } else if self.retry_at - now > CAP {
            Hold::Implausible
        } else {
            Hold::Until(self.retry_at)
        }
    }

    /// The denials for a person: count and the last one (control characters escaped).
    pub fn describe(&self) -> String {
        printable(&format!(
            "{} denial{} in a row; the last: CSR {} {}: {}: {}",
            self.denials,
            if self.denials == 1 { "" } else { "s" },
            self.csr,
            self.condition,
            self.reason,
            self.message
        ))
    }

    /// The file's contents.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "denials": self.denials,
            "request": self.request,
            "csr": self.csr,
            "condition": self.condition,
            "reason": self.reason,
            "message": self.message,
            "deniedAt": rfc3339(self.denied_at),
            "retryAt": rfc3339(self.retry_at),
        })
        .to_string()
            + "\n"
    }

    /// Reads the file's contents; why not, when they are not a record. Unknown fields are
    /// ignored (a newer version may add some); texts are cut to 1024 characters.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object().ok_or("not a JSON object")?;
        let denials = object
            .get("denials")
            .and_then(serde_json::Value::as_u64)
            .filter(|n| *n > 0)
            .ok_or("denials is not a positive count")?;
        let string = |key: &str| {
            object
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(bounded)
                .ok_or_else(|| format!("{key} is not a string"))
        };
        let instant = |key: &str| {
            let text = string(key)?;
            OffsetDateTime::parse(&text, &Rfc3339)
                .map(|t| t.to_offset(time::UtcOffset::UTC))
                .map_err(|e| format!("{key} is not RFC 3339: {e}"))
        };
        Ok(Self {
            denials: u32::try_from(denials).unwrap_or(u32::MAX),
            request: string("request")?,
            csr: string("csr")?,
            condition: string("condition")?,
            reason: string("reason")?,
            message: string("message")?,
            denied_at: instant("deniedAt")?,
            retry_at: instant("retryAt")?,
        })
    }
}

/// RFC 3339, whole seconds, UTC.
pub fn rfc3339(at: OffsetDateTime) -> String {
    whole_seconds(at.to_offset(time::UtcOffset::UTC))
        .format(&Rfc3339)
        .unwrap_or_else(|_| at.to_string())
}

/// `at` for a person: RFC 3339 and how far from `now`.
pub fn when(at: OffsetDateTime, now: OffsetDateTime) -> String {
    let left = (at - now).max(Duration::ZERO);
    let left = std::time::Duration::from_secs(u64::try_from(left.whole_seconds()).unwrap_or(0));
    format!("{} (in {})", rfc3339(at), humantime::format_duration(left))
}

fn whole_seconds(at: OffsetDateTime) -> OffsetDateTime {
    at.replace_nanosecond(0).unwrap_or(at)
}

fn bounded(text: &str) -> String {
    text.chars().take(MAX_TEXT).collect()
}

/// Control characters (a terminal's escape sequences) escaped.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obtain::Refusal;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    fn refused(reason: &str) -> Refused {
        Refused {
            csr: "node-csr-abc".into(),
            condition: Refusal::Denied,
            reason: reason.into(),
            message: "Machine worker-0 is claimed by node worker-0".into(),
            supported: None,
        }
    }

    #[test]
    fn the_delay_doubles_from_30s_to_a_15m_cap_and_jitter_only_shortens_it() {
        let plain: Vec<i64> = (1..=8).map(|n| delay(n, 0.0).whole_seconds()).collect();
        assert_eq!(plain, [30, 60, 120, 240, 480, 900, 900, 900]);
        assert_eq!(delay(0, 0.0), FIRST, "no denial recorded counts as the first");
        assert_eq!(delay(u32::MAX, 0.0), CAP);
        for n in [1, 3, 6, 40, u32::MAX] {
            for jitter in [0.0, 0.25, 0.5, 0.999, 1.0] {
                let d = delay(n, jitter);
                assert!(d <= delay(n, 0.0) && d >= delay(n, 0.0) * 0.8, "{n} {jitter}: {d}");
            }
            for hostile in [f64::NAN, f64::INFINITY, -1.0, 7.0] {
                let d = delay(n, hostile);
                assert!(d <= CAP && d >= FIRST * 0.8, "{n} {hostile}: {d}");
            }
        }
    }

    #[test]
    fn consecutive_denials_of_one_request_count_up_and_other_flags_start_again() {
        let first = Backoff::after(None, "req", &refused("MachineAlreadyClaimed"), at(0), 0.0);
        assert_eq!((first.denials, first.retry_at), (1, at(30)));
        assert_eq!(first.hold("req", at(10)), Hold::Until(at(30)));
        assert_eq!(first.hold("req", at(30)), Hold::Over);
        assert_eq!(first.hold("other flags", at(10)), Hold::OtherRequest);

        // Refused again after the delay: consecutive, the delay doubles.
        let second = Backoff::after(Some(&first), "req", &refused("MachineAlreadyClaimed"), at(40), 0.0);
        assert_eq!((second.denials, second.retry_at), (2, at(100)));
        let changed = Backoff::after(Some(&second), "new flags", &refused("NodeNameMismatch"), at(200), 0.0);
        assert_eq!((changed.denials, changed.retry_at), (1, at(230)));

        let saturated = Backoff {
            denials: u32::MAX,
            ..second.clone()
        };
        let next = Backoff::after(Some(&saturated), "req", &refused("x"), at(0), 0.0);
        assert_eq!((next.denials, next.retry_at), (u32::MAX, at(900)));
    }

    #[test]
    fn a_record_asking_to_wait_beyond_the_cap_is_not_believed() {
        let mut record = Backoff::after(None, "req", &refused("x"), at(0), 0.0);
        record.retry_at = at(0) + CAP;
        assert_eq!(record.hold("req", at(0)), Hold::Until(at(0) + CAP));
        record.retry_at = at(0) + CAP + Duration::seconds(1);
        assert_eq!(
            record.hold("req", at(0)),
            Hold::Implausible,
            "clock moved back, or hand-written"
        );
        record.retry_at = OffsetDateTime::from_unix_timestamp(253_402_300_799).unwrap();
        assert_eq!(record.hold("req", at(0)), Hold::Implausible);
    }

    #[test]
    fn the_file_round_trips_and_describes_the_last_denial() {
        let record = Backoff::after(None, "req", &refused("MachineAlreadyClaimed"), at(0), 0.5);
        let back = Backoff::parse(&record.to_json()).unwrap();
        assert_eq!(back, record);
        assert_eq!(
            back.describe(),
            "1 denial in a row; the last: CSR node-csr-abc Denied: MachineAlreadyClaimed: Machine worker-0 is claimed by node worker-0"
        );
        assert_eq!(when(at(95), at(0)), "2027-01-15T08:01:35Z (in 1m 35s)");
        assert_eq!(when(at(0), at(5)), "2027-01-15T08:00:00Z (in 0s)");
    }

    #[test]
    fn hostile_or_corrupt_files_are_refused_with_a_reason_not_a_panic() {
        let good = Backoff::after(None, "req", &refused("x"), at(0), 0.0).to_json();
        let mut value: serde_json::Value = serde_json::from_str(&good).unwrap();
        for (key, bad) in [
            ("denials", serde_json::json!(0)),
            ("denials", serde_json::json!(-1)),
            ("denials", serde_json::json!(1.5)),
            ("denials", serde_json::json!("3")),
            ("retryAt", serde_json::json!("tomorrow")),
            ("retryAt", serde_json::json!(1_800_000_000)),
            ("deniedAt", serde_json::Value::Null),
            ("reason", serde_json::json!(["x"])),
        ] {
            let mut broken = value.clone();
            broken[key] = bad.clone();
            assert!(Backoff::parse(&broken.to_string()).is_err(), "{key}: {bad}");
        }
        for text in ["", "{", "[]", "null", "\"x\"", "{}", "\u{0}"] {
            assert!(Backoff::parse(text).is_err(), "{text:?}");
        }

        value["denials"] = serde_json::json!(u64::MAX);
        value["message"] = serde_json::json!("\u{1b}[2Jcleared".repeat(1000));
        value["future"] = serde_json::json!({"a newer": "version"});
        let odd = Backoff::parse(&value.to_string()).unwrap();
        assert_eq!(odd.denials, u32::MAX, "a huge count saturates");
        assert_eq!(odd.message.chars().count(), 1024, "texts are bounded");
        assert!(!odd.describe().contains('\u{1b}'), "no terminal escapes reach status");
    }

    proptest::proptest! {
        #[test]
        fn any_file_contents_give_a_record_or_a_reason(text in ".{0,400}") {
            if let Ok(record) = Backoff::parse(&text) {
                let _ = record.hold("req", at(0));
                let _ = record.describe();
            }
        }

        #[test]
        fn any_record_waits_at_most_the_cap(
            denials in 0u32..,
            jitter in proptest::prelude::any::<f64>(),
            offset in -1_000_000i64..1_000_000,
        ) {
            let record = Backoff {
                denials: denials.max(1),
                ..Backoff::after(None, "req", &refused("x"), at(offset), jitter)
            };
            match record.hold("req", at(0)) {
                Hold::Until(until) => proptest::prop_assert!(until - at(0) <= CAP),
                Hold::Over | Hold::Implausible => {}
                Hold::OtherRequest => proptest::prop_assert!(false),
            }
        }
    }
}
