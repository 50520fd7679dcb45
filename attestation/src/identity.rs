//! Validated identities: a [`NodeName`] or [`ProviderId`] that exists is well-formed.

use std::fmt;

use crate::names::MAX_PROVIDER_ID_BYTES;

/// Why a string is not a valid identity value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Not a DNS-1123 subdomain.
    #[error("{value:?} is not a DNS-1123 subdomain: {why}")]
    NotDnsSubdomain {
        /// The offending value (truncated).
        value: String,
        /// What rule it breaks.
        why: &'static str,
    },
    /// Provider-ID extension value is not one DER UTF8String.
    #[error("provider-ID extension is not a DER UTF8String: {why}")]
    ProviderIdEncoding {
        /// The decoder's complaint.
        why: String,
    },
    /// Provider ID empty or longer than 512 bytes.
    #[error("provider ID is {len} bytes; it must be 1..={MAX_PROVIDER_ID_BYTES}")]
    ProviderIdLength {
        /// Its length in bytes.
        len: usize,
    },
}

/// A Kubernetes node name: a DNS-1123 subdomain (lowercase alphanumerics, `-` and `.`,
/// labels starting and ending alphanumeric, at most 253 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeName(String);

impl NodeName {
    /// Checks `value` and wraps it.
    pub fn new(value: &str) -> Result<Self, IdentityError> {
        let fail = |why| IdentityError::NotDnsSubdomain {
            value: truncate(value, 80),
            why,
        };
        if value.is_empty() {
            return Err(fail("empty"));
        }
        if value.len() > 253 {
            return Err(fail("longer than 253 characters"));
        }
        for label in value.split('.') {
            let bytes = label.as_bytes();
            let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
                return Err(fail("empty label"));
            };
            if !first.is_ascii_lowercase() && !first.is_ascii_digit()
                || !last.is_ascii_lowercase() && !last.is_ascii_digit()
            {
                return Err(fail("a label must start and end with a lowercase letter or digit"));
            }
            if !bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            {
                return Err(fail("only lowercase letters, digits, '-' and '.' are allowed"));
            }
        }
        Ok(Self(value.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Kubernetes username of this node, `system:node:<name>`.
    pub fn username(&self) -> String {
        format!("{}{}", crate::names::NODE_USER_PREFIX, self.0)
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cloud provider ID as Cluster API's `spec.providerID` spells it, 1..=512 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId(String);

impl ProviderId {
    /// Checks the length and wraps it.
    pub fn new(value: &str) -> Result<Self, IdentityError> {
        if value.is_empty() || value.len() > MAX_PROVIDER_ID_BYTES {
            return Err(IdentityError::ProviderIdLength { len: value.len() });
        }
        Ok(Self(value.to_owned()))
    }

    /// The provider ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The extension value: DER UTF8String of the provider ID.
    pub fn to_extension_value(&self) -> Vec<u8> {
        use der::Encode;
        // A String always encodes: the only failure is a length over 256 MiB.
        der::asn1::Utf8StringRef::new(&self.0)
            .and_then(|s| s.to_der())
            .unwrap_or_default()
    }

    /// Reads an extension value: exactly one DER UTF8String, nothing after it.
    pub fn from_extension_value(value: &[u8]) -> Result<Self, IdentityError> {
        use der::Decode;
        let s = der::asn1::Utf8StringRef::from_der(value)
            .map_err(|e| IdentityError::ProviderIdEncoding { why: e.to_string() })?;
        Self::new(s.as_str())
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Shortens attacker-controlled text for messages, events and logs, on a char boundary.
pub fn truncate(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_owned();
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_dns_1123_subdomain_rules() {
        for ok in ["a", "node-1", "ip-10-0-0-1.ec2.internal", &"a".repeat(253)] {
            assert!(NodeName::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Node",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a_b",
            "a b",
            &"a".repeat(254),
            "nöde",
        ] {
            assert!(NodeName::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn long_names_have_no_64_character_cap() {
        let name = format!("{}.{}", "a".repeat(63), "b".repeat(63));
        assert_eq!(NodeName::new(&name).map(|n| n.as_str().len()), Ok(127));
    }

    #[test]
    fn provider_id_length_is_bounded() {
        assert!(ProviderId::new("").is_err());
        assert!(ProviderId::new(&"x".repeat(512)).is_ok());
        assert!(ProviderId::new(&"x".repeat(513)).is_err());
    }

    #[test]
    fn provider_id_extension_round_trips_and_rejects_other_encodings() {
        let id = ProviderId::new("aws:///us-east-1a/i-0abc").unwrap();
        let der = id.to_extension_value();
        assert_eq!(der[0], 0x0c);
        assert_eq!(ProviderId::from_extension_value(&der), Ok(id));
        let mut printable = der.clone();
        printable[0] = 0x13;
        assert!(ProviderId::from_extension_value(&printable).is_err());
        let mut trailing = der;
        trailing.push(0);
        assert!(ProviderId::from_extension_value(&trailing).is_err());
        assert!(ProviderId::from_extension_value(&[0x0c, 0x00]).is_err());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
