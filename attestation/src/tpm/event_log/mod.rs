//! The TCG PC Client measured-boot event log (TCG PC Client Platform Firmware Profile, section
//! 10; TCG EFI Protocol, section 5): parsed, replayed into PCR values, and the events a boot
//! policy judges decoded.
//!
//! A node sends its log (the kernel's `binary_bios_measurements`) next to a quote. The log itself
//! proves nothing: only its replay, compared with quoted PCR values, makes its digests count, and
//! only an event whose digest covers its data (checked by the views in [`events`]) makes that
//! data count. So the pieces are:
//!
//! - [`parse`]: both formats, the SHA-1 legacy `TCG_PCR_EVENT` log and the crypto-agile
//!   `TCG_PCR_EVENT2` log announced by a `Spec ID Event03` header. Strict on structure, every
//!   length checked against what is left, counts capped ([`MAX_EVENTS`], [`MAX_ALGORITHMS`]):
//!   never a panic, never an allocation larger than the input. The quirks of real firmware it
//!   tolerates are listed in `docs/event-log.md`, each with the real log that shows it.
//! - [`EventLog::replay`]: the PCR values the log claims, bank by bank.
//! - [`events`]: typed views (EFI variables, `EV_IPL` text, separators, the Linux EFI stub's
//!   tagged events, Secure Boot state, authority certificates).

mod error;
pub mod events;
mod parse;
mod replay;

pub use error::EventLogError;
pub use events::{
    EfiVariable, LinuxStubEvent, Separator, SignatureData, authority_certificates, efi_variable, image_path, ipl_label,
    ipl_text, linux_stub_event, secure_boot, separator,
};
pub use parse::parse;

/// At most this many events in a log (real UEFI logs have 50 to a few hundred; Windows with
/// many boot drivers, a few thousand). A crypto-agile event is at least 16 bytes, so 256 KiB of
/// hostile input could otherwise claim 16 384.
pub const MAX_EVENTS: usize = 10_000;

/// At most this many digest algorithms in the `Spec ID Event03` header (the TPM 2.0 algorithm
/// registry names fewer than ten hashes).
pub const MAX_ALGORITHMS: usize = 16;

/// At most this many bytes in one digest of an algorithm the header declares (SHA-512 has 64).
pub const MAX_DIGEST_SIZE: usize = 64;

/// The PCRs a PC Client TPM has: 0 to 23.
pub const PCR_COUNT: u32 = 24;

/// A hash algorithm of a PCR bank this crate can replay (`TPM_ALG_ID`, TPM 2.0 Part 2 table 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    /// SHA-1 (`TPM_ALG_SHA1`, 0x0004): the legacy log's only bank.
    Sha1,
    /// SHA-256 (`TPM_ALG_SHA256`, 0x000B).
    Sha256,
    /// SHA-384 (`TPM_ALG_SHA384`, 0x000C).
    Sha384,
    /// SHA-512 (`TPM_ALG_SHA512`, 0x000D).
    Sha512,
}

impl HashAlg {
    /// Every algorithm this crate knows, in `TPM_ALG_ID` order.
    pub const ALL: [HashAlg; 4] = [Self::Sha1, Self::Sha256, Self::Sha384, Self::Sha512];

    /// The `TPM_ALG_ID`.
    pub fn tpm_alg_id(self) -> u16 {
        match self {
            Self::Sha1 => 0x0004,
            Self::Sha256 => 0x000B,
            Self::Sha384 => 0x000C,
            Self::Sha512 => 0x000D,
        }
    }

    /// The algorithm of a `TPM_ALG_ID`, if it is one of the four.
    pub fn from_tpm_alg_id(id: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|alg| alg.tpm_alg_id() == id)
    }

    /// The digest size in bytes.
    pub fn size(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// The digest of `bytes`.
    pub fn digest(self, bytes: &[u8]) -> Vec<u8> {
        let alg = match self {
            // The event log's legacy bank: SHA-1 is what the firmware extended, not a choice.
            Self::Sha1 => &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
            Self::Sha256 => &aws_lc_rs::digest::SHA256,
            Self::Sha384 => &aws_lc_rs::digest::SHA384,
            Self::Sha512 => &aws_lc_rs::digest::SHA512,
        };
        aws_lc_rs::digest::digest(alg, bytes).as_ref().to_vec()
    }

    /// The lowercase name, as tpm2-tools spells it: `sha1`, `sha256`, `sha384`, `sha512`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }
}

impl std::fmt::Display for HashAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of the two log formats a log is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// `TCG_PCR_EVENT` entries with one SHA-1 digest each (TPM 1.2 firmware, and TPM 2.0
    /// firmware that only logs SHA-1, as older Windows machines and GCE's 2019 images did).
    Sha1Legacy,
    /// A `TCG_PCR_EVENT` header holding `Spec ID Event03`, then `TCG_PCR_EVENT2` entries.
    CryptoAgile,
}

/// An algorithm the `Spec ID Event03` header declares, and its digest size: every
/// `TCG_PCR_EVENT2` digest of that algorithm has this size, whether this crate knows the
/// algorithm (then the size must be the algorithm's) or not (SM3, say: then it is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgorithmSize {
    /// The `TPM_ALG_ID`.
    pub algorithm_id: u16,
    /// Its digest size in bytes.
    pub digest_size: u16,
}

/// A parsed, not yet trusted, event log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventLog {
    /// Every event in log order, the crypto-agile header included (`events[i].index == i`).
    pub events: Vec<Event>,
    /// The format.
    pub format: LogFormat,
    /// The algorithms the header declares (crypto-agile), or SHA-1 alone (legacy).
    pub algorithms: Vec<AlgorithmSize>,
    /// The locality `TPM2_Startup` was issued from, from a `StartupLocality` `EV_NO_ACTION` event
    /// in PCR 0 (then PCR 0 starts at `00..00 || locality`, not zero).
    pub startup_locality: Option<u8>,
    /// Zero bytes after the last event, tolerated and ignored (see `docs/event-log.md`).
    pub trailing_zeros: usize,
}

/// One event, not yet trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The 0-based position in the log, the crypto-agile header event included.
    pub index: usize,
    /// The PCR it was extended into: 0 to 23, checked when parsed, except for `EV_NO_ACTION`
    /// events, which extend nothing (Windows logs some with PCR `0xFFFFFFFF`).
    pub pcr: u32,
    /// The event type (`EV_*`, see [`event_type`]).
    pub event_type: u32,
    /// Its digests in the banks this crate knows, in log order (digests of algorithms this crate
    /// does not know are parsed and dropped).
    pub digests: Vec<(HashAlg, Vec<u8>)>,
    /// The event data.
    pub data: Vec<u8>,
}

impl Event {
    /// The digest in `alg`, if the event has one.
    pub fn digest(&self, alg: HashAlg) -> Option<&[u8]> {
        self.digests
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, digest)| digest.as_slice())
    }

    /// The event type's name, `EV_EFI_BOOT_SERVICES_APPLICATION` say, or `EV_UNKNOWN`.
    pub fn type_name(&self) -> &'static str {
        event_type::name(self.event_type)
    }

    /// How messages name the event: `event 14 (PCR 4, EV_EFI_BOOT_SERVICES_APPLICATION)`.
    pub fn describe(&self) -> String {
        let name = self.type_name();
        if name == "EV_UNKNOWN" {
            format!(
                "event {} (PCR {}, type {:#010x})",
                self.index, self.pcr, self.event_type
            )
        } else {
            format!("event {} (PCR {}, {name})", self.index, self.pcr)
        }
    }
}

impl EventLog {
    /// The banks this log can be replayed in: the declared algorithms this crate knows.
    pub fn banks(&self) -> Vec<HashAlg> {
        self.algorithms
            .iter()
            .filter_map(|a| HashAlg::from_tpm_alg_id(a.algorithm_id))
            .collect()
    }
}

/// Event types (TCG PC Client Platform Firmware Profile 1.05, table 9 and 10).
pub mod event_type {
    /// `EV_PREBOOT_CERT` (deprecated).
    pub const PREBOOT_CERT: u32 = 0x0000_0000;
    /// `EV_POST_CODE`: POST code, embedded firmware.
    pub const POST_CODE: u32 = 0x0000_0001;
    /// `EV_NO_ACTION`: logged, never extended.
    pub const NO_ACTION: u32 = 0x0000_0003;
    /// `EV_SEPARATOR`: the end of pre-OS measurements of a PCR.
    pub const SEPARATOR: u32 = 0x0000_0004;
    /// `EV_ACTION`: a string naming an action.
    pub const ACTION: u32 = 0x0000_0005;
    /// `EV_EVENT_TAG`: a `TCG_PCClientTaggedEvent` (the Linux EFI stub's initrd and load options).
    pub const EVENT_TAG: u32 = 0x0000_0006;
    /// `EV_S_CRTM_CONTENTS`.
    pub const S_CRTM_CONTENTS: u32 = 0x0000_0007;
    /// `EV_S_CRTM_VERSION`.
    pub const S_CRTM_VERSION: u32 = 0x0000_0008;
    /// `EV_CPU_MICROCODE`.
    pub const CPU_MICROCODE: u32 = 0x0000_0009;
    /// `EV_PLATFORM_CONFIG_FLAGS`.
    pub const PLATFORM_CONFIG_FLAGS: u32 = 0x0000_000A;
    /// `EV_TABLE_OF_DEVICES`.
    pub const TABLE_OF_DEVICES: u32 = 0x0000_000B;
    /// `EV_COMPACT_HASH`.
    pub const COMPACT_HASH: u32 = 0x0000_000C;
    /// `EV_IPL`: an IPL string (grub's commands and command line, systemd-stub's sections).
    pub const IPL: u32 = 0x0000_000D;
    /// `EV_IPL_PARTITION_DATA`.
    pub const IPL_PARTITION_DATA: u32 = 0x0000_000E;
    /// `EV_NONHOST_CODE`.
    pub const NONHOST_CODE: u32 = 0x0000_000F;
    /// `EV_NONHOST_CONFIG`.
    pub const NONHOST_CONFIG: u32 = 0x0000_0010;
    /// `EV_NONHOST_INFO`.
    pub const NONHOST_INFO: u32 = 0x0000_0011;
    /// `EV_OMIT_BOOT_DEVICE_EVENTS`.
    pub const OMIT_BOOT_DEVICE_EVENTS: u32 = 0x0000_0012;
    /// `EV_EFI_VARIABLE_DRIVER_CONFIG`: a Secure Boot policy variable (PCR 7) or other
    /// configuration; the digest covers the whole `UEFI_VARIABLE_DATA`.
    pub const EFI_VARIABLE_DRIVER_CONFIG: u32 = 0x8000_0001;
    /// `EV_EFI_VARIABLE_BOOT`: a boot variable (PCR 1).
    pub const EFI_VARIABLE_BOOT: u32 = 0x8000_0002;
    /// `EV_EFI_BOOT_SERVICES_APPLICATION`: a UEFI application loaded (PCR 4: shim, grub, kernel);
    /// the digest is the image's Authenticode digest.
    pub const EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
    /// `EV_EFI_BOOT_SERVICES_DRIVER`.
    pub const EFI_BOOT_SERVICES_DRIVER: u32 = 0x8000_0004;
    /// `EV_EFI_RUNTIME_SERVICES_DRIVER`.
    pub const EFI_RUNTIME_SERVICES_DRIVER: u32 = 0x8000_0005;
    /// `EV_EFI_GPT_EVENT`.
    pub const EFI_GPT_EVENT: u32 = 0x8000_0006;
    /// `EV_EFI_ACTION`: an action string ("Calling EFI Application from Boot Option").
    pub const EFI_ACTION: u32 = 0x8000_0007;
    /// `EV_EFI_PLATFORM_FIRMWARE_BLOB`.
    pub const EFI_PLATFORM_FIRMWARE_BLOB: u32 = 0x8000_0008;
    /// `EV_EFI_HANDOFF_TABLES`.
    pub const EFI_HANDOFF_TABLES: u32 = 0x8000_0009;
    /// `EV_EFI_PLATFORM_FIRMWARE_BLOB2`.
    pub const EFI_PLATFORM_FIRMWARE_BLOB2: u32 = 0x8000_000A;
    /// `EV_EFI_HANDOFF_TABLES2`.
    pub const EFI_HANDOFF_TABLES2: u32 = 0x8000_000B;
    /// `EV_EFI_VARIABLE_BOOT2`: a boot variable, digest over the whole `UEFI_VARIABLE_DATA`.
    pub const EFI_VARIABLE_BOOT2: u32 = 0x8000_000C;
    /// `EV_EFI_GPT_EVENT2`.
    pub const EFI_GPT_EVENT2: u32 = 0x8000_000D;
    /// `EV_EFI_HCRTM_EVENT`.
    pub const EFI_HCRTM_EVENT: u32 = 0x8000_0010;
    /// `EV_EFI_VARIABLE_AUTHORITY`: the `db` entry (or shim's vendor or MOK certificate) that
    /// verified an image (PCR 7).
    pub const EFI_VARIABLE_AUTHORITY: u32 = 0x8000_00E0;
    /// `EV_EFI_SPDM_FIRMWARE_BLOB`.
    pub const EFI_SPDM_FIRMWARE_BLOB: u32 = 0x8000_00E1;
    /// `EV_EFI_SPDM_FIRMWARE_CONFIG`.
    pub const EFI_SPDM_FIRMWARE_CONFIG: u32 = 0x8000_00E2;

    /// The name of an event type, or `EV_UNKNOWN`.
    pub fn name(event_type: u32) -> &'static str {
        match event_type {
            PREBOOT_CERT => "EV_PREBOOT_CERT",
            POST_CODE => "EV_POST_CODE",
            0x0000_0002 => "EV_UNUSED",
            NO_ACTION => "EV_NO_ACTION",
            SEPARATOR => "EV_SEPARATOR",
            ACTION => "EV_ACTION",
            EVENT_TAG => "EV_EVENT_TAG",
            S_CRTM_CONTENTS => "EV_S_CRTM_CONTENTS",
            S_CRTM_VERSION => "EV_S_CRTM_VERSION",
            CPU_MICROCODE => "EV_CPU_MICROCODE",
            PLATFORM_CONFIG_FLAGS => "EV_PLATFORM_CONFIG_FLAGS",
            TABLE_OF_DEVICES => "EV_TABLE_OF_DEVICES",
            COMPACT_HASH => "EV_COMPACT_HASH",
            IPL => "EV_IPL",
            IPL_PARTITION_DATA => "EV_IPL_PARTITION_DATA",
            NONHOST_CODE => "EV_NONHOST_CODE",
            NONHOST_CONFIG => "EV_NONHOST_CONFIG",
            NONHOST_INFO => "EV_NONHOST_INFO",
            OMIT_BOOT_DEVICE_EVENTS => "EV_OMIT_BOOT_DEVICE_EVENTS",
            EFI_VARIABLE_DRIVER_CONFIG => "EV_EFI_VARIABLE_DRIVER_CONFIG",
            EFI_VARIABLE_BOOT => "EV_EFI_VARIABLE_BOOT",
            EFI_BOOT_SERVICES_APPLICATION => "EV_EFI_BOOT_SERVICES_APPLICATION",
            EFI_BOOT_SERVICES_DRIVER => "EV_EFI_BOOT_SERVICES_DRIVER",
            EFI_RUNTIME_SERVICES_DRIVER => "EV_EFI_RUNTIME_SERVICES_DRIVER",
            EFI_GPT_EVENT => "EV_EFI_GPT_EVENT",
            EFI_ACTION => "EV_EFI_ACTION",
            EFI_PLATFORM_FIRMWARE_BLOB => "EV_EFI_PLATFORM_FIRMWARE_BLOB",
            EFI_HANDOFF_TABLES => "EV_EFI_HANDOFF_TABLES",
            EFI_PLATFORM_FIRMWARE_BLOB2 => "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
            EFI_HANDOFF_TABLES2 => "EV_EFI_HANDOFF_TABLES2",
            EFI_VARIABLE_BOOT2 => "EV_EFI_VARIABLE_BOOT2",
            EFI_GPT_EVENT2 => "EV_EFI_GPT_EVENT2",
            EFI_HCRTM_EVENT => "EV_EFI_HCRTM_EVENT",
            EFI_VARIABLE_AUTHORITY => "EV_EFI_VARIABLE_AUTHORITY",
            EFI_SPDM_FIRMWARE_BLOB => "EV_EFI_SPDM_FIRMWARE_BLOB",
            EFI_SPDM_FIRMWARE_CONFIG => "EV_EFI_SPDM_FIRMWARE_CONFIG",
            _ => "EV_UNKNOWN",
        }
    }
}
