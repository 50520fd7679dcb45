//! The `tpm/v1` boot policy (SPEC section 5, revision 5): what a Cluster allows its nodes to
//! have booted, judged on the events of the node's measured-boot log once its replay gave the
//! quoted PCRs.
//!
//! - This module: the format (a ConfigMap's `policy.yaml`, YAML or JSON), read strictly (unknown
//!   fields refused, digests checked for length and hex) into a [`BootPolicy`] that exists only
//!   valid, and [`PolicyState`], how the signer hands a Cluster's policy to the verifier.
//! - [`from_log`]: the policy a known-good boot's own measurements make.
//! - [`judge`]: the rules, pure, on a parsed log: each PCR the policy reads judged as a whole
//!   sequence (revision 6).
//!
//! `kubelet-authenticator boot-policy` prints a [`PolicyDocument`] with one image; rollouts list
//! the old and the new image together.

pub mod from_log;
pub mod judge;
#[cfg(test)]
pub(crate) mod testlog;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use judge::{BootRefusal, BootVerdict, judge, judged_pcrs};

/// `apiVersion` of format version 1.
pub const API_VERSION: &str = "node-attestation.cluster.x-k8s.io/v1";
/// `kind`.
pub const KIND: &str = "TpmBootPolicy";
/// The ConfigMap data key holding the policy.
pub const CONFIG_MAP_KEY: &str = "policy.yaml";
/// Largest policy text read: a ConfigMap holds at most 1 MiB, and a policy of a hundred images
/// is under 64 KiB.
pub const MAX_POLICY_BYTES: usize = 256 * 1024;

/// Whether Secure Boot must be on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SecureBoot {
    /// PCR 7's `SecureBoot` variable must say enabled (the default).
    #[default]
    Required,
    /// Not checked (the images' digests still are).
    Optional,
}

/// One image a node may have booted, as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageDocument {
    /// A name for messages (the image-builder's image name).
    pub name: String,
    /// SHA-256 Authenticode digests of the boot applications before the kernel (shim, grub), in
    /// the order the firmware and they load them.
    #[serde(default)]
    pub bootloaders: Vec<String>,
    /// SHA-256 Authenticode digest of the kernel: the last PCR 4 boot application.
    pub kernel: String,
    /// SHA-256 of the kernel file as grub reads it (its PCR 9 event): where grub loads the
    /// initrd, the file grub read after the kernel file is the initrd, so a file read (or
    /// extended) after the initrd cannot pass for it (revision 6; optional for older policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_file: Option<String>,
    /// SHA-256 of the initrd file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    /// The kernel command line, as grub measures it (`/vmlinuz-... root=... ro`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_line: Option<String>,
}

/// The policy as written (format version 1): what `policy.yaml` holds and what
/// `kubelet-authenticator boot-policy` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyDocument {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// Default `required`.
    #[serde(default)]
    pub secure_boot: SecureBoot,
    /// SHA-256 of the DER certificates allowed as PCR 7 `EV_EFI_VARIABLE_AUTHORITY`; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorities: Vec<String>,
    /// SHA-256 of the allowed `dbx` variable contents; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dbx: Vec<String>,
    /// At least one; a boot must match one entirely.
    pub images: Vec<ImageDocument>,
}

/// A SHA-256 digest, checked when read.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

impl Sha256Digest {
    /// Reads 64 hex digits (either case).
    pub fn from_hex(text: &str) -> Result<Self, String> {
        if text.len() != 64 {
            return Err(format!(
                "{text:?} is {} characters, not the 64 hex digits of a SHA-256",
                text.len()
            ));
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = text
                .get(2 * i..2 * i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("{text:?} is not hex"))?;
        }
        Ok(Self(out))
    }

    /// Whether `bytes` are this digest.
    pub fn is(&self, bytes: &[u8]) -> bool {
        bytes == self.0
    }

    /// The first 8 hex digits and an ellipsis, for messages.
    pub fn short(&self) -> String {
        short_hex(&self.0)
    }
}

impl std::fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::digest::hex(&self.0))
    }
}

impl std::fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// The first 8 hex digits of `bytes` and an ellipsis, as messages show digests.
pub(crate) fn short_hex(bytes: &[u8]) -> String {
    let hex = crate::digest::hex(bytes);
    match hex.get(..8) {
        Some(head) if hex.len() > 8 => format!("{head}…"),
        _ => hex,
    }
}

/// One image of a valid policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Its name.
    pub name: String,
    /// Boot applications before the kernel, in order.
    pub bootloaders: Vec<Sha256Digest>,
    /// The kernel's Authenticode digest.
    pub kernel: Sha256Digest,
    /// The kernel file's SHA-256, when the image gives it.
    pub kernel_file: Option<Sha256Digest>,
    /// The initrd's digest, when the image gives it.
    pub initrd: Option<Sha256Digest>,
    /// The command line, when the image gives it.
    pub command_line: Option<String>,
}

impl Image {
    /// Every boot application, bootloaders then kernel.
    pub fn chain(&self) -> impl Iterator<Item = &Sha256Digest> {
        self.bootloaders.iter().chain(std::iter::once(&self.kernel))
    }
}

/// A valid policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootPolicy {
    /// Whether Secure Boot must be on.
    pub secure_boot: SecureBoot,
    /// Allowed authority certificates; empty: any.
    pub authorities: Vec<Sha256Digest>,
    /// Allowed dbx contents; empty: any.
    pub dbx: Vec<Sha256Digest>,
    /// The images, at least one, names unique.
    pub images: Vec<Image>,
    /// Secure Boot is required by the signer's floor (`--tpm-require-secure-boot`), whatever
    /// the policy says: refusals name the floor rather than the policy's field.
    pub secure_boot_floor: bool,
}

impl BootPolicy {
    /// This policy under the signer's floor: Secure Boot required, whatever the Cluster's
    /// policy says (a Cluster's policy may tighten the floor, never loosen it).
    pub fn with_secure_boot_floor(mut self) -> Self {
        self.secure_boot = SecureBoot::Required;
        self.secure_boot_floor = true;
        self
    }
}

/// Why a policy text is not a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Larger than [`MAX_POLICY_BYTES`].
    #[error("the policy is {len} bytes, more than the {MAX_POLICY_BYTES} read")]
    TooLarge {
        /// Its size.
        len: usize,
    },
    /// Not YAML or JSON of the format (an unknown field, a missing one, a wrong type).
    #[error("the policy does not parse: {0}")]
    Syntax(String),
    /// Parsed, but says something the format does not allow.
    #[error("{field}: {message}")]
    Invalid {
        /// Which field (`images[1].kernel`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn digests(field: &str, values: &[String]) -> Result<Vec<Sha256Digest>, PolicyError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| Sha256Digest::from_hex(v).map_err(|m| invalid(format!("{field}[{i}]"), m)))
        .collect()
}

impl BootPolicy {
    /// Reads `policy.yaml` (YAML, or JSON, which YAML reads too).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge { len: text.len() });
        }
        let document: PolicyDocument = serde_yaml::from_str(text).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Self::try_from(document)
    }
}

impl TryFrom<PolicyDocument> for BootPolicy {
    type Error = PolicyError;

    fn try_from(document: PolicyDocument) -> Result<Self, PolicyError> {
        if document.api_version != API_VERSION {
            return Err(invalid(
                "apiVersion",
                format!("{:?} (this signer reads {API_VERSION:?})", document.api_version),
            ));
        }
        if document.kind != KIND {
            return Err(invalid("kind", format!("{:?} (must be {KIND:?})", document.kind)));
        }
        if document.images.is_empty() {
            return Err(invalid(
                "images",
                "lists no image: a policy allowing nothing is a mistake, not a policy",
            ));
        }
        let mut images: Vec<Image> = Vec::with_capacity(document.images.len());
        for (i, image) in document.images.iter().enumerate() {
            let at = |field: &str| format!("images[{i}].{field}");
            if image.name.trim().is_empty() {
                return Err(invalid(at("name"), "is empty"));
            }
            if images.iter().any(|other| other.name == image.name) {
                return Err(invalid(at("name"), format!("{:?} is listed twice", image.name)));
            }
            if image.command_line.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(invalid(at("commandLine"), "is empty (leave it out not to check it)"));
            }
            images.push(Image {
                name: image.name.clone(),
                bootloaders: digests(&at("bootloaders"), &image.bootloaders)?,
                kernel: Sha256Digest::from_hex(&image.kernel).map_err(|m| invalid(at("kernel"), m))?,
                kernel_file: image
                    .kernel_file
                    .as_deref()
                    .map(Sha256Digest::from_hex)
                    .transpose()
                    .map_err(|m| invalid(at("kernelFile"), m))?,
                initrd: image
                    .initrd
                    .as_deref()
                    .map(Sha256Digest::from_hex)
                    .transpose()
                    .map_err(|m| invalid(at("initrd"), m))?,
                command_line: image.command_line.clone(),
            });
        }
        Ok(Self {
            secure_boot: document.secure_boot,
            authorities: digests("authorities", &document.authorities)?,
            dbx: digests("dbx", &document.dbx)?,
            images,
            secure_boot_floor: false,
        })
    }
}

/// A Cluster's boot policy as the signer resolved it for a decision: the verifier's input.
/// Verification is pure, so reading the ConfigMap is the signer's: it hands the result here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PolicyState {
    /// No policy applies (no annotation, no signer default): revision 4 holds.
    #[default]
    None,
    /// The Cluster names a policy the signer has not read: its `tpm/v1` CSRs wait.
    Unresolved {
        /// `<namespace>/<name>` of the ConfigMap.
        source: String,
    },
    /// The policy, read and valid.
    Loaded {
        /// `<namespace>/<name>` of the ConfigMap.
        source: String,
        /// The policy.
        policy: Arc<BootPolicy>,
    },
    /// The signer requires a policy of every `tpm/v1` Cluster (`--tpm-require-boot-policy`) and
    /// this one names none (no annotation, no signer default): its `tpm/v1` CSRs wait, never
    /// approved.
    Required,
    /// The ConfigMap is missing, has no `policy.yaml`, or holds no valid policy: the Cluster's
    /// `tpm/v1` CSRs wait (never approved without the policy the Cluster asked for).
    Invalid {
        /// `<namespace>/<name>` of the ConfigMap.
        source: String,
        /// Why.
        message: String,
    },
}

impl PolicyState {
    /// The state of a Cluster whose annotation names `name` in `namespace`, before the signer
    /// read it. `None` without an annotation.
    pub fn named(namespace: &str, annotation: Option<&str>) -> Self {
        match annotation.map(str::trim) {
            None => Self::None,
            Some(name) => Self::Unresolved {
                source: format!("{namespace}/{name}"),
            },
        }
    }

    /// The ConfigMap this state came from, if any.
    pub fn source(&self) -> Option<&str> {
        match self {
            Self::None | Self::Required => None,
            Self::Unresolved { source } | Self::Loaded { source, .. } | Self::Invalid { source, .. } => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aa00000000000000000000000000000000000000000000000000000000000000";
    const B: &str = "BB00000000000000000000000000000000000000000000000000000000000000";

    fn yaml(images: &str) -> String {
        format!("apiVersion: {API_VERSION}\nkind: {KIND}\nimages:\n{images}")
    }

    #[test]
    fn the_documented_example_reads_with_its_defaults() {
        let policy = BootPolicy::parse(&yaml(&format!(
            "  - name: ubuntu-2404\n    bootloaders: [\"{A}\", \"{B}\"]\n    kernel: \"{A}\"\n    initrd: \"{B}\"\n    commandLine: \"/vmlinuz root=/dev/sda1 ro\"\n"
        )))
        .unwrap();
        assert_eq!(policy.secure_boot, SecureBoot::Required);
        assert!(policy.authorities.is_empty() && policy.dbx.is_empty());
        let image = &policy.images[0];
        assert_eq!(image.bootloaders[1].0[0], 0xbb, "either case");
        assert_eq!(image.chain().count(), 3);
        assert_eq!(image.command_line.as_deref(), Some("/vmlinuz root=/dev/sda1 ro"));
        assert_eq!(image.kernel.short(), "aa000000…");
    }

    #[test]
    fn json_reads_too_and_the_document_round_trips() {
        let json = format!(
            r#"{{"apiVersion": "{API_VERSION}", "kind": "{KIND}", "secureBoot": "optional", "dbx": ["{A}"], "images": [{{"name": "x", "kernel": "{A}"}}]}}"#
        );
        let policy = BootPolicy::parse(&json).unwrap();
        assert_eq!(policy.secure_boot, SecureBoot::Optional);
        assert_eq!(policy.dbx.len(), 1);
        let document: PolicyDocument = serde_yaml::from_str(&json).unwrap();
        let printed = serde_yaml::to_string(&document).unwrap();
        assert_eq!(BootPolicy::parse(&printed).unwrap(), policy, "{printed}");
        assert!(!printed.contains("initrd"), "absent fields are left out: {printed}");
    }

    #[test]
    fn malformed_policies_say_which_field() {
        let cases = [
            (
                yaml(&format!("  - name: x\n    kernel: \"{A}\"\n    extra: 1\n")),
                "unknown field `extra`",
            ),
            (
                format!("apiVersion: {API_VERSION}\nkind: {KIND}\nimages: []\n"),
                "images: lists no image",
            ),
            (
                format!("apiVersion: v2\nkind: {KIND}\nimages: []\n"),
                "apiVersion: \"v2\"",
            ),
            (
                format!("apiVersion: {API_VERSION}\nkind: Policy\nimages: []\n"),
                "kind: \"Policy\"",
            ),
            (
                yaml("  - name: x\n    kernel: abc\n"),
                "images[0].kernel: \"abc\" is 3 characters",
            ),
            (
                yaml(&format!("  - name: x\n    kernel: \"{}\"\n", "zz".repeat(32))),
                "images[0].kernel: ",
            ),
            (
                yaml(&format!(
                    "  - name: x\n    kernel: \"{A}\"\n    bootloaders: [\"{A}\", \"ab\"]\n"
                )),
                "images[0].bootloaders[1]",
            ),
            (
                yaml(&format!(
                    "  - name: x\n    kernel: \"{A}\"\n  - name: x\n    kernel: \"{A}\"\n"
                )),
                "images[1].name: \"x\" is listed twice",
            ),
            (
                yaml(&format!("  - name: x\n    kernel: \"{A}\"\n    commandLine: \" \"\n")),
                "images[0].commandLine",
            ),
            (
                yaml(&format!("  - name: \"\"\n    kernel: \"{A}\"\n")),
                "images[0].name: is empty",
            ),
            (
                format!("apiVersion: {API_VERSION}\nkind: {KIND}\nsecureBoot: maybe\nimages: []\n"),
                "maybe",
            ),
            (
                format!(
                    "apiVersion: {API_VERSION}\nkind: {KIND}\nauthorities: [\"1\"]\nimages: [{{name: x, kernel: \"{A}\"}}]\n"
                ),
                "authorities[0]",
            ),
        ];
        for (text, expected) in cases {
            let error = BootPolicy::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected:?} not in {error:?} for\n{text}");
        }
        assert!(matches!(
            BootPolicy::parse(&" ".repeat(MAX_POLICY_BYTES + 1)),
            Err(PolicyError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_cluster_naming_a_policy_waits_until_it_is_read() {
        assert_eq!(PolicyState::named("team-a", None), PolicyState::None);
        let state = PolicyState::named("team-a", Some("boot"));
        assert_eq!(state.source(), Some("team-a/boot"));
        assert!(matches!(state, PolicyState::Unresolved { .. }));
    }
}
