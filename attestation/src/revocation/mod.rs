//! Taking an identity back (SPEC section 7, revision 6): which certificates the signer issued
//! are revoked, and what the workload cluster's admission policy is given to refuse them.
//!
//! Kubernetes has no revocation of client certificates. kube-apiserver 1.32 and later names
//! each x509 client's certificate in the user's extra `authentication.kubernetes.io/credential-id`
//! (`X509SHA256=<hex>`), which a ValidatingAdmissionPolicy sees on every write. So the signer
//! keeps, in each workload cluster, a record of every certificate it issued ([`record`]: one
//! workload write per certificate, none in the management cluster), decides from the record and
//! the Cluster API objects which are revoked ([`triggers`]: pure, on a clock), and keeps the
//! policy's parameter object listing them until each would have expired ([`revoked_list`]).
//! Before 1.32 there is no credential ID: a revoked certificate's node name is listed instead,
//! only while no live Machine or pool instance uses that name.
//!
//! Admission never sees reads: a revoked certificate still reads what the Node authorizer grants
//! its node name until it expires (`docs/revocation.md`).

pub mod identity_expiry;
pub mod record;
pub mod revoked_list;
pub mod triggers;

use std::fmt;

/// SHA-256 of an issued certificate's DER, as kube-apiserver names it in `credential-id`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CredentialId([u8; 32]);

impl CredentialId {
    /// The ID of the certificate `der`.
    pub fn of_certificate(der: &[u8]) -> Self {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
        let mut id = [0u8; 32];
        id.copy_from_slice(digest.as_ref());
        Self(id)
    }

    /// Reads 64 lowercase hex digits (what [`fmt::Display`] writes); anything else is `None`.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 {
            return None;
        }
        let mut id = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let digit = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                _ => None,
            };
            id[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(Self(id))
    }

    /// `credential-id`'s value for this certificate: `X509SHA256=<hex>`.
    pub fn user_extra(&self) -> String {
        format!("X509SHA256={self}")
    }

    /// The first hex digit, 0 to 15: which record shard holds it.
    pub fn shard(&self) -> usize {
        usize::from(self.0[0] >> 4)
    }
}

impl fmt::Display for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CredentialId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CredentialId({self})")
    }
}

/// Why a certificate is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum RevokeReason {
    /// Its Machine is gone from the management cluster.
    MachineGone,
    /// Its Machine is being deleted and Cluster API is done with the node: drain and volume
    /// detach are over (the Machine's `Deleting` condition), or its Node is gone.
    MachineReleased,
    /// Its Machine now holds another node's identity (its providerID or claim changed).
    ClaimReplaced,
    /// Its instance left its MachinePool's `providerIDList`.
    PoolInstanceGone,
    /// Its MachinePool is gone.
    PoolGone,
    /// An operator revoked it (`node-attestation-signer revoke`).
    Operator,
}

impl RevokeReason {
    /// Every reason, for metrics that must clear each one.
    pub const ALL: [RevokeReason; 6] = [
        Self::MachineGone,
        Self::MachineReleased,
        Self::ClaimReplaced,
        Self::PoolInstanceGone,
        Self::PoolGone,
        Self::Operator,
    ];

    /// The word in metrics, Events and the parameter object.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MachineGone => "MachineGone",
            Self::MachineReleased => "MachineReleased",
            Self::ClaimReplaced => "ClaimReplaced",
            Self::PoolInstanceGone => "PoolInstanceGone",
            Self::PoolGone => "PoolGone",
            Self::Operator => "Operator",
        }
    }

    /// Reads [`RevokeReason::as_str`]'s word.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == word)
    }
}

impl fmt::Display for RevokeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_id_is_the_certificates_sha256_in_lowercase_hex() {
        let id = CredentialId::of_certificate(b"abc");
        assert_eq!(
            id.to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(CredentialId::from_hex(&id.to_string()), Some(id));
        assert_eq!(id.user_extra(), format!("X509SHA256={id}"));
        assert_eq!(id.shard(), 0xb);
        for bad in [
            "",
            "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
            &"g".repeat(64),
            &"a".repeat(63),
            "é",
        ] {
            assert_eq!(CredentialId::from_hex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reasons_read_back() {
        for reason in RevokeReason::ALL {
            assert_eq!(RevokeReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(RevokeReason::parse("Anything"), None);
    }
}
