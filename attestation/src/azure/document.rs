//! The statement inside Azure's attested document (SPEC section 5): `nonce`, `vmId`,
//! `subscriptionId` and `timeStamp` are read; `plan`, `sku`, `licenseType` and anything Azure
//! adds are not judged.
//!
//! Azure writes its times as `MM/DD/YY HH:MM:SS -0000` (UTC, a two-digit year, the offset
//! always `-0000`), for example `07/28/26 13:24:00 -0000`. Only that form is read: a
//! statement's time is what makes it expire, and a lenient reading is a way to stretch it.

use serde::Deserialize;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

/// The attested statement, as Azure signs it (unverified until its PKCS#7 is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestedDocument {
    /// The nonce it was fetched with.
    pub nonce: String,
    /// The VM's unique ID (a GUID, as written).
    pub vm_id: String,
    /// The subscription (a GUID, as written).
    pub subscription_id: String,
    /// `timeStamp.createdOn`.
    pub created_on: OffsetDateTime,
    /// `timeStamp.expiresOn`.
    pub expires_on: OffsetDateTime,
}

#[derive(Deserialize)]
struct Raw {
    nonce: String,
    #[serde(rename = "vmId")]
    vm_id: String,
    #[serde(rename = "subscriptionId")]
    subscription_id: Option<String>,
    #[serde(rename = "timeStamp")]
    time_stamp: RawTimeStamp,
}

#[derive(Deserialize)]
struct RawTimeStamp {
    #[serde(rename = "createdOn")]
    created_on: String,
    #[serde(rename = "expiresOn")]
    expires_on: String,
}

/// Reads `MM/DD/YY HH:MM:SS -0000` (years 2000-2099).
pub fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    let bad = || {
        format!(
            "time {:?} is not MM/DD/YY HH:MM:SS -0000",
            crate::identity::truncate(text, 40)
        )
    };
    let bytes = text.as_bytes();
    if bytes.len() != 23 || &text[17..] != " -0000" {
        return Err(bad());
    }
    let number = |from: usize| -> Result<u8, String> {
        let pair = &bytes[from..from + 2];
        if pair.iter().all(u8::is_ascii_digit) {
            Ok((pair[0] - b'0') * 10 + (pair[1] - b'0'))
        } else {
            Err(bad())
        }
    };
    for (at, separator) in [(2, b'/'), (5, b'/'), (8, b' '), (11, b':'), (14, b':')] {
        if bytes[at] != separator {
            return Err(bad());
        }
    }
    let month = Month::try_from(number(0)?).map_err(|_| bad())?;
    let date = Date::from_calendar_date(2000 + i32::from(number(6)?), month, number(3)?).map_err(|_| bad())?;
    let time = Time::from_hms(number(9)?, number(12)?, number(15)?).map_err(|_| bad())?;
    Ok(PrimitiveDateTime::new(date, time).assume_utc())
}

impl AttestedDocument {
    /// Reads the statement (JSON). A statement without `subscriptionId` (IMDS before its
    /// 2018-10-01 API) cannot be bound to a provider ID and is refused.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let raw: Raw =
            serde_json::from_slice(bytes).map_err(|e| format!("the attested statement does not read: {e}"))?;
        let subscription_id = raw.subscription_id.ok_or(
            "the attested statement carries no subscriptionId (fetch it with api-version 2020-09-01 or later)",
        )?;
        Ok(Self {
            nonce: raw.nonce,
            vm_id: raw.vm_id,
            subscription_id,
            created_on: parse_time(&raw.time_stamp.created_on).map_err(|e| format!("createdOn: {e}"))?,
            expires_on: parse_time(&raw.time_stamp.expires_on).map_err(|e| format!("expiresOn: {e}"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn azures_time_form_and_only_it_reads() {
        assert_eq!(
            parse_time("07/28/26 13:24:00 -0000").unwrap(),
            datetime!(2026-07-28 13:24:00 UTC)
        );
        assert_eq!(
            parse_time("12/31/99 23:59:59 -0000").unwrap(),
            datetime!(2099-12-31 23:59:59 UTC)
        );
        for bad in [
            "07/28/2026 13:24:00 -0000",
            "2026-07-28T13:24:00Z",
            "07/28/26 13:24:00 +0100",
            "13/28/26 13:24:00 -0000",
            "02/30/26 13:24:00 -0000",
            "07/28/26 24:00:00 -0000",
            "07/28/26 13:24:00 -0000 ",
            "07-28-26 13:24:00 -0000",
            "0a/28/26 13:24:00 -0000",
            "",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_real_statement_reads_and_one_without_a_subscription_is_refused() {
        let real = br#"{"licenseType":"","nonce":"20260728-132400","plan":{"name":"","product":"","publisher":""},"sku":"22_04-lts-gen2","subscriptionId":"8a205152-b25a-417f-a676-80465535a6c9","timeStamp":{"createdOn":"07/28/26 13:24:00 -0000","expiresOn":"07/28/26 19:24:00 -0000"},"vmId":"b1310a36-d400-46f6-82cb-6217df846586"}"#;
        let document = AttestedDocument::parse(real).unwrap();
        assert_eq!(document.vm_id, "b1310a36-d400-46f6-82cb-6217df846586");
        assert_eq!(document.expires_on - document.created_on, time::Duration::hours(6));
        let old = br#"{"nonce":"1234567890","plan":{},"timeStamp":{"createdOn":"12/13/19 00:33:40 -0000","expiresOn":"12/13/19 06:33:40 -0000"},"vmId":"5d06deb3-807b-46dd-aef5-78aaf9193f71"}"#;
        assert!(AttestedDocument::parse(old).unwrap_err().contains("subscriptionId"));
        assert!(AttestedDocument::parse(b"{}").is_err());
    }
}
