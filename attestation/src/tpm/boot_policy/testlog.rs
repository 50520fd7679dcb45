//! Synthetic measured-boot logs for the judge's and the verifier's tests: the events shim, grub
//! and the Linux EFI stub write, built as a crypto-agile SHA-256 log (parsed by
//! [`crate::tpm::event_log::parse`] like any node's).

use crate::tpm::event_log::events::encode::{guid_bytes, variable_data};
use crate::tpm::event_log::events::{EFI_GLOBAL_VARIABLE, EFI_IMAGE_SECURITY_DATABASE, SHIM_LOCK};
use crate::tpm::event_log::{EventLog, HashAlg, event_type, parse};

/// A log being built, event by event, in the SHA-256 bank.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogBuilder {
    events: Vec<(u32, u32, Vec<u8>, Vec<u8>)>,
}

/// A fake DER certificate (a SEQUENCE holding `seed`): what authority events carry.
pub(crate) fn certificate(seed: u8) -> Vec<u8> {
    vec![0x30, 0x03, 0x02, 0x01, seed]
}

pub(crate) fn sha256(bytes: &[u8]) -> Vec<u8> {
    HashAlg::Sha256.digest(bytes)
}

/// Hex of the SHA-256 of `bytes`, as a policy writes it.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    crate::digest::hex(&sha256(bytes))
}

impl LogBuilder {
    /// An event with this digest.
    pub(crate) fn raw(mut self, pcr: u32, kind: u32, digest: Vec<u8>, data: Vec<u8>) -> Self {
        self.events.push((pcr, kind, digest, data));
        self
    }

    /// An event whose digest covers its data.
    pub(crate) fn measured(self, pcr: u32, kind: u32, data: &[u8]) -> Self {
        self.raw(pcr, kind, sha256(data), data.to_vec())
    }

    /// A PCR 7 Secure Boot variable.
    pub(crate) fn variable(self, guid: &str, name: &str, value: &[u8]) -> Self {
        self.measured(
            7,
            event_type::EFI_VARIABLE_DRIVER_CONFIG,
            &variable_data(guid, name, value),
        )
    }

    /// A PCR 7 authority: `db` (an `EFI_SIGNATURE_DATA`) or shim's `Shim` (bare).
    pub(crate) fn authority(self, name: &str, certificate: &[u8]) -> Self {
        let (guid, value) = if name == "db" {
            let mut value = guid_bytes("77fa9abd-0359-4d32-bd60-28f4e78f784b");
            value.extend(certificate);
            (EFI_IMAGE_SECURITY_DATABASE, value)
        } else {
            (SHIM_LOCK, certificate.to_vec())
        };
        self.measured(
            7,
            event_type::EFI_VARIABLE_AUTHORITY,
            &variable_data(guid, name, &value),
        )
    }

    /// Separators in `pcrs`.
    pub(crate) fn separators(mut self, pcrs: std::ops::RangeInclusive<u32>) -> Self {
        for pcr in pcrs {
            self = self.measured(pcr, event_type::SEPARATOR, &[0, 0, 0, 0]);
        }
        self
    }

    /// A PCR 4 boot application of this Authenticode digest.
    pub(crate) fn application(self, authenticode: &[u8]) -> Self {
        self.raw(
            4,
            event_type::EFI_BOOT_SERVICES_APPLICATION,
            authenticode.to_vec(),
            vec![0; 32],
        )
    }

    /// grub's PCR 8 string: `prefix + text + NUL`, the digest of `text`.
    pub(crate) fn grub(self, prefix: &str, text: &str) -> Self {
        let data = format!("{prefix}{text}\0").into_bytes();
        self.raw(8, event_type::IPL, sha256(text.as_bytes()), data)
    }

    /// grub's PCR 9 file: its name, the digest of its contents.
    pub(crate) fn file(self, path: &str, contents_digest: &[u8]) -> Self {
        self.raw(
            9,
            event_type::IPL,
            contents_digest.to_vec(),
            format!("{path}\0").into_bytes(),
        )
    }

    /// The Linux EFI stub's PCR 9 tagged event.
    pub(crate) fn stub(self, tag: u32, label: &str, digest: Vec<u8>) -> Self {
        let label = format!("{label}\0");
        let mut data = tag.to_le_bytes().to_vec();
        data.extend((label.len() as u32).to_le_bytes());
        data.extend(label.as_bytes());
        self.raw(9, event_type::EVENT_TAG, digest, data)
    }

    /// The log's bytes: the `Spec ID Event03` header, then the events.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend(0u32.to_le_bytes()); // platformClass
        spec.extend([0, 2, 0, 2]); // version 2.0, errata 0, uintnSize 2
        spec.extend(1u32.to_le_bytes());
        spec.extend(0x000Bu16.to_le_bytes());
        spec.extend(32u16.to_le_bytes());
        spec.push(0); // vendorInfoSize
        let mut out = Vec::new();
        out.extend(0u32.to_le_bytes());
        out.extend(event_type::NO_ACTION.to_le_bytes());
        out.extend([0u8; 20]);
        out.extend((spec.len() as u32).to_le_bytes());
        out.extend(spec);
        for (pcr, kind, digest, data) in &self.events {
            out.extend(pcr.to_le_bytes());
            out.extend(kind.to_le_bytes());
            out.extend(1u32.to_le_bytes());
            out.extend(0x000Bu16.to_le_bytes());
            out.extend(digest);
            out.extend((data.len() as u32).to_le_bytes());
            out.extend(data);
        }
        out
    }

    /// The log, parsed.
    pub(crate) fn log(&self) -> EventLog {
        match parse(&self.bytes()) {
            Ok(log) => log,
            Err(e) => panic!("the test log does not parse: {e}"),
        }
    }
}

/// The digests of a typical Secure Boot through shim, grub and a Debian kernel.
pub(crate) struct Boot {
    pub(crate) shim: Vec<u8>,
    pub(crate) grub: Vec<u8>,
    pub(crate) kernel: Vec<u8>,
    pub(crate) initrd: Vec<u8>,
    pub(crate) command_line: String,
    pub(crate) dbx: Vec<u8>,
}

impl Default for Boot {
    fn default() -> Self {
        Self {
            shim: sha256(b"shimx64.efi"),
            grub: sha256(b"grubx64.efi"),
            kernel: sha256(b"vmlinuz"),
            initrd: sha256(b"initrd.img"),
            command_line: "/vmlinuz-6.1.0-28-amd64 root=UUID=1234 ro quiet".into(),
            dbx: b"dbx contents".to_vec(),
        }
    }
}

impl Boot {
    /// The firmware's PCR 7 up to its separator, and PCR 4's action and separator.
    pub(crate) fn firmware(&self, secure_boot: u8) -> LogBuilder {
        LogBuilder::default()
            .variable(EFI_GLOBAL_VARIABLE, "SecureBoot", &[secure_boot])
            .variable(EFI_GLOBAL_VARIABLE, "PK", b"pk")
            .variable(EFI_GLOBAL_VARIABLE, "KEK", b"kek")
            .variable(EFI_IMAGE_SECURITY_DATABASE, "db", b"db")
            .variable(EFI_IMAGE_SECURITY_DATABASE, "dbx", &self.dbx)
            .measured(4, event_type::EFI_ACTION, b"Calling EFI Application from Boot Option")
            .separators(0..=7)
    }

    /// The whole boot, through grub.
    pub(crate) fn through_grub(&self) -> LogBuilder {
        self.firmware(1)
            .authority("db", &certificate(1))
            .application(&self.shim)
            .authority("Shim", &certificate(2))
            .application(&self.grub)
            .grub("grub_cmd: ", "linux /vmlinuz-6.1.0-28-amd64 root=UUID=1234 ro quiet")
            .file("/vmlinuz-6.1.0-28-amd64", &sha256(b"vmlinuz file"))
            .grub("kernel_cmdline: ", &self.command_line)
            .grub("grub_cmd: ", "initrd /initrd.img-6.1.0-28-amd64")
            .file("/initrd.img-6.1.0-28-amd64", &self.initrd)
            .application(&self.kernel)
    }

    /// The policy of this boot, YAML.
    pub(crate) fn policy(&self) -> String {
        format!(
            "apiVersion: node-attestation.cluster.x-k8s.io/v1\nkind: TpmBootPolicy\nauthorities: [{}, {}]\ndbx: [{}]\nimages:\n  - name: debian-12\n    bootloaders: [{}, {}]\n    kernel: {}\n    initrd: {}\n    commandLine: \"{}\"\n",
            sha256_hex(&certificate(1)),
            sha256_hex(&certificate(2)),
            sha256_hex(&self.dbx),
            crate::digest::hex(&self.shim),
            crate::digest::hex(&self.grub),
            crate::digest::hex(&self.kernel),
            crate::digest::hex(&self.initrd),
            self.command_line
        )
    }
}
