//! What a workload cluster's Kubernetes minor means for the identities the signer issues in it
//! (SPEC section 7, "Kubernetes minors").
//!
//! The signer issues the same certificate on every minor, but what that certificate can do,
//! and what the signer can take back, is the workload apiserver's: before v1.32 the Node
//! authorizer has no KEP-4601 field and label selectors (a node identity lists every pod and
//! every Node), and kube-apiserver names no x509 credential ID (revocation can refuse a node
//! name, not one certificate); ValidatingAdmissionPolicy, which bounds the signer's own
//! workload rights, is GA from v1.30. The signer reads each workload cluster's `/version` and
//! tells the operator which of these apply: pure here, reported by the signer and `explain`.

use std::fmt;

use serde::Serialize;

/// The first minor whose Node authorizer scopes a node's reads with KEP-4601's selectors
/// (`AuthorizeNodeWithSelectors`, beta and on by default from v1.32).
pub const SELECTORS_FROM: u32 = 32;
/// The first minor that puts an x509 client's certificate hash in the user's extra
/// `authentication.kubernetes.io/credential-id` (`X509SHA256=<hex>`).
pub const CREDENTIAL_ID_FROM: u32 = 32;
/// The first minor serving `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy.
pub const ADMISSION_POLICY_FROM: u32 = 30;

/// A workload apiserver's version, as its `/version` says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiserverVersion {
    /// Major, `1`.
    pub major: u32,
    /// Minor, `32` (a provider's `32+` read as 32).
    pub minor: u32,
    /// `gitVersion` as given (`v1.32.3-eks-...`), for people.
    pub git_version: String,
}

/// Why a `/version` answer cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the apiserver's /version names no Kubernetes version this signer can read (major {major:?}, minor {minor:?}, gitVersion {git_version:?})"
)]
pub struct VersionError {
    major: String,
    minor: String,
    git_version: String,
}

/// Something a minor lacks that changes what an issued identity means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Limitation {
    /// No KEP-4601 selectors: a node identity reads every pod and every Node.
    WiderNodeReads,
    /// No credential ID: a revoked certificate is refused by node name, only while no live
    /// Machine or pool instance uses that name.
    NoCredentialId,
    /// No ValidatingAdmissionPolicy: the policies bounding the signer's workload rights and
    /// enforcing revocation cannot be applied. Below the supported floor.
    NoAdmissionPolicy,
}

impl Limitation {
    /// Every limitation, for metrics that must clear each one.
    pub const ALL: [Limitation; 3] = [Self::WiderNodeReads, Self::NoCredentialId, Self::NoAdmissionPolicy];

    /// The metric label and Event word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WiderNodeReads => "WiderNodeReads",
            Self::NoCredentialId => "NoCredentialId",
            Self::NoAdmissionPolicy => "NoAdmissionPolicy",
        }
    }

    /// What it means, and what to do.
    pub fn describe(self) -> &'static str {
        match self {
            Self::WiderNodeReads => {
                "its Node authorizer has no KEP-4601 selectors (v1.32): each node identity can list every pod and every Node of the cluster; upgrade the control plane to v1.32 or later to scope them"
            }
            Self::NoCredentialId => {
                "its apiserver names no certificate in credential-id (v1.32): a revoked certificate is refused by node name, and only while no live Machine or pool instance uses that name; upgrade to v1.32 or later to refuse one certificate"
            }
            Self::NoAdmissionPolicy => {
                "it serves no ValidatingAdmissionPolicy (v1.30): the signer's workload rights are not bounded by its admission policy and nothing revoked is refused; this minor is below the supported floor, upgrade to v1.30 or later"
            }
        }
    }
}

impl fmt::Display for Limitation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ApiserverVersion {
    /// Reads `/version`'s `major`, `minor` and `gitVersion`. Providers write `minor` as `32+`;
    /// when `major` or `minor` is empty (some builds leave them so), `gitVersion`'s
    /// `v<major>.<minor>` is read instead.
    pub fn parse(major: &str, minor: &str, git_version: &str) -> Result<Self, VersionError> {
        let number = |s: &str| -> Option<u32> {
            let digits = s.trim_end_matches('+');
            (!digits.is_empty() && digits.len() <= 4 && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        };
        let from_git = || -> Option<(u32, u32)> {
            let rest = git_version.strip_prefix('v')?;
            let mut parts = rest.splitn(3, '.');
            let major = number(parts.next()?)?;
            let minor_part = parts.next()?;
            let end = minor_part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(minor_part.len());
            Some((major, number(&minor_part[..end])?))
        };
        let parsed = match (number(major), number(minor)) {
            (Some(major), Some(minor)) => Some((major, minor)),
            _ => from_git(),
        };
        match parsed {
            Some((major, minor)) => Ok(Self {
                major,
                minor,
                git_version: git_version.chars().take(64).collect(),
            }),
            None => Err(VersionError {
                major: major.chars().take(16).collect(),
                minor: minor.chars().take(16).collect(),
                git_version: git_version.chars().take(64).collect(),
            }),
        }
    }

    /// Whether its Node authorizer scopes node reads with selectors.
    pub fn has_node_selectors(&self) -> bool {
        self.at_least(SELECTORS_FROM)
    }

    /// Whether its apiserver names an x509 client's certificate in `credential-id`.
    pub fn has_credential_id(&self) -> bool {
        self.at_least(CREDENTIAL_ID_FROM)
    }

    /// Whether it serves ValidatingAdmissionPolicy v1.
    pub fn has_admission_policy(&self) -> bool {
        self.at_least(ADMISSION_POLICY_FROM)
    }

    /// What this minor lacks, in [`Limitation`] order; empty from v1.32.
    pub fn limitations(&self) -> Vec<Limitation> {
        Limitation::ALL
            .into_iter()
            .filter(|l| match l {
                Limitation::WiderNodeReads => !self.has_node_selectors(),
                Limitation::NoCredentialId => !self.has_credential_id(),
                Limitation::NoAdmissionPolicy => !self.has_admission_policy(),
            })
            .collect()
    }

    fn at_least(&self, minor: u32) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= minor)
    }
}

impl fmt::Display for ApiserverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (minor {}.{})", self.git_version, self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_versions_are_read() {
        let eks = ApiserverVersion::parse("1", "30+", "v1.30.4-eks-a737599").unwrap();
        assert_eq!((eks.major, eks.minor), (1, 30));
        let empty = ApiserverVersion::parse("", "", "v1.32.0-beta.0").unwrap();
        assert_eq!((empty.major, empty.minor), (1, 32));
        let gke = ApiserverVersion::parse("1", "33", "v1.33.3-gke.1136000").unwrap();
        assert_eq!(gke.minor, 33);
    }

    #[test]
    fn unreadable_versions_are_refused() {
        for (major, minor, git) in [
            ("", "", ""),
            ("one", "x", "latest"),
            ("1", "", "v1"),
            ("1", "99999999999", "v1.x"),
            ("", "", "v1.-3"),
        ] {
            assert!(
                ApiserverVersion::parse(major, minor, git).is_err(),
                "{major:?} {minor:?} {git:?}"
            );
        }
    }

    #[test]
    fn each_minor_names_what_it_lacks() {
        let at = |minor: u32| {
            ApiserverVersion::parse("1", &minor.to_string(), "")
                .unwrap()
                .limitations()
        };
        assert_eq!(
            at(29),
            vec![
                Limitation::WiderNodeReads,
                Limitation::NoCredentialId,
                Limitation::NoAdmissionPolicy
            ]
        );
        assert_eq!(at(30), vec![Limitation::WiderNodeReads, Limitation::NoCredentialId]);
        assert_eq!(at(31), vec![Limitation::WiderNodeReads, Limitation::NoCredentialId]);
        assert!(at(32).is_empty());
        assert!(at(35).is_empty());
        assert!(ApiserverVersion::parse("2", "0", "").unwrap().limitations().is_empty());
    }

    #[test]
    fn a_long_git_version_is_cut() {
        let long = format!("v1.32.0-{}", "x".repeat(10_000));
        assert_eq!(ApiserverVersion::parse("1", "32", &long).unwrap().git_version.len(), 64);
    }
}
