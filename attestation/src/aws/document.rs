//! The instance identity document: the fields the rules read, each checked against the shape
//! AWS gives it, since they end up inside a provider ID, an ARN comparison and the claim.

use serde::Deserialize;

/// What the rules read of the document; AWS's other fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdentityDocument {
    /// 12-digit account ID.
    #[serde(rename = "accountId")]
    pub account_id: String,
    /// `i-` and hex.
    #[serde(rename = "instanceId")]
    pub instance_id: String,
    /// e.g. `us-east-1`.
    pub region: String,
    /// e.g. `us-east-1a`.
    #[serde(rename = "availabilityZone")]
    pub availability_zone: String,
}

fn lowercase_dashed(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl IdentityDocument {
    /// Reads and checks the document's JSON.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        let doc: Self =
            serde_json::from_slice(json).map_err(|e| format!("the identity document does not decode: {e}"))?;
        let bad = |field: &str, value: &str| {
            Err(format!(
                "the identity document's {field} {:?} is malformed",
                crate::identity::truncate(value, 40)
            ))
        };
        if doc.account_id.len() != 12 || !doc.account_id.bytes().all(|b| b.is_ascii_digit()) {
            return bad("accountId", &doc.account_id);
        }
        let hex = doc.instance_id.strip_prefix("i-").unwrap_or_default();
        if !(8..=17).contains(&hex.len()) || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return bad("instanceId", &doc.instance_id);
        }
        if !lowercase_dashed(&doc.region) {
            return bad("region", &doc.region);
        }
        if !lowercase_dashed(&doc.availability_zone) {
            return bad("availabilityZone", &doc.availability_zone);
        }
        Ok(doc)
    }

    /// The provider ID Cluster API's AWS provider gives this instance.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.availability_zone, self.instance_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"accountId":"123456789012","architecture":"x86_64","availabilityZone":"us-east-1a",
        "imageId":"ami-1","instanceId":"i-0123456789abcdef0","instanceType":"m5.large","pendingTime":"2026-01-01T00:00:00Z",
        "privateIp":"10.0.0.1","region":"us-east-1","version":"2017-09-30"}"#;

    #[test]
    fn a_real_shaped_document_reads_and_names_its_provider_id() {
        let doc = IdentityDocument::parse(DOC.as_bytes()).unwrap();
        assert_eq!(doc.provider_id(), "aws:///us-east-1a/i-0123456789abcdef0");
    }

    #[test]
    fn malformed_fields_are_refused() {
        for (from, to) in [
            ("123456789012", "12345678901"),
            ("123456789012", "12345678901x"),
            ("i-0123456789abcdef0", "i-../../x"),
            ("i-0123456789abcdef0", "0123456789abcdef0"),
            ("\"us-east-1\"", "\"us/east\""),
            ("us-east-1a", "us-east-1a/i-1"),
        ] {
            let doc = DOC.replace(from, to);
            assert!(IdentityDocument::parse(doc.as_bytes()).is_err(), "{to}");
        }
        let twice = DOC.replace("\"region\"", "\"region\":\"eu-west-1\",\"region\"");
        assert!(IdentityDocument::parse(twice.as_bytes()).is_err());
    }
}
