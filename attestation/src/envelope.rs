//! The `spec.request` envelope: a PKCS#10 block, then optionally the attestation PROVIDER
//! and DATA blocks (SPEC section 2, rule 1).
//!
//! kube-apiserver only insists that the first PEM block is a `CERTIFICATE REQUEST`; this parser
//! is stricter, because everything after it is read by the signer: blocks in order, each label
//! once, no PEM headers, nothing but whitespace between or after blocks, 64 KiB at most.

use std::fmt;

use crate::names::{MAX_REQUEST_BYTES, PEM_CSR, PEM_DATA, PEM_PROVIDER};

/// Why a `spec.request` is not a well-formed envelope. Maps to `InvalidRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Larger than 64 KiB.
    #[error("request is {len} bytes, more than the {MAX_REQUEST_BYTES} allowed")]
    TooLarge {
        /// Its size.
        len: usize,
    },
    /// Not UTF-8 text.
    #[error("request is not UTF-8 PEM text")]
    NotText,
    /// Bytes outside PEM blocks.
    #[error("unexpected bytes at offset {offset}: only PEM blocks and whitespace are allowed")]
    StrayBytes {
        /// Where they start.
        offset: usize,
    },
    /// A BEGIN line with no matching END line, or a malformed block.
    #[error("malformed PEM block at offset {offset}: {why}")]
    MalformedBlock {
        /// Where the block starts.
        offset: usize,
        /// What is wrong with it.
        why: String,
    },
    /// A block in the wrong place, repeated, or of an unknown kind.
    #[error("unexpected PEM block {label:?} at position {position}: expected {expected}")]
    UnexpectedBlock {
        /// The block's label (truncated).
        label: String,
        /// 1-based position.
        position: usize,
        /// What was expected there.
        expected: &'static str,
    },
    /// PEM headers (`Proc-Type:` and the like) are not part of this format.
    #[error("PEM block {label:?} carries headers, which this format does not allow")]
    Headers {
        /// The block's label.
        label: String,
    },
    /// The PROVIDER block is not `<provider>/<version>`.
    #[error("attestation provider block {value:?} is not <provider>/<version>")]
    BadProvider {
        /// Its content (truncated).
        value: String,
    },
    /// No blocks at all.
    #[error("request holds no PEM block")]
    Empty,
}

/// `<provider>/<version>` from the PROVIDER block, e.g. `tpm/v1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderVersion {
    provider: String,
    version: String,
}

impl ProviderVersion {
    /// Parses `<provider>/<version>`: two non-empty parts of `[a-z0-9-]`.
    pub fn parse(value: &str) -> Result<Self, EnvelopeError> {
        let bad = || EnvelopeError::BadProvider {
            value: crate::identity::truncate(value, 64),
        };
        let (provider, version) = value.split_once('/').ok_or_else(bad)?;
        let part_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 32
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !part_ok(provider) || !part_ok(version) {
            return Err(bad());
        }
        Ok(Self {
            provider: provider.to_owned(),
            version: version.to_owned(),
        })
    }

    /// Builds one from known-good parts (attestors name themselves with this).
    pub fn new(provider: &str, version: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            version: version.to_owned(),
        }
    }

    /// The provider, e.g. `tpm`.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The version, e.g. `v1`.
    pub fn version(&self) -> &str {
        &self.version
    }
}

impl fmt::Display for ProviderVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.version)
    }
}

/// A parsed `spec.request`.
#[derive(Clone, PartialEq, Eq)]
pub struct RequestEnvelope {
    /// DER of the PKCS#10 request (block 1).
    pub csr_der: Vec<u8>,
    /// Block 2, when present.
    pub provider: Option<ProviderVersion>,
    /// Block 3, when present (never without block 2).
    pub data: Option<Vec<u8>>,
}

impl fmt::Debug for RequestEnvelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestEnvelope")
            .field("csr_der", &format_args!("{} bytes", self.csr_der.len()))
            .field("provider", &self.provider)
            .field("data", &self.data.as_ref().map(|d| format!("{} bytes", d.len())))
            .finish()
    }
}

impl RequestEnvelope {
    /// Parses `spec.request` strictly (see the module documentation).
    pub fn parse(request: &[u8]) -> Result<Self, EnvelopeError> {
        if request.len() > MAX_REQUEST_BYTES {
            return Err(EnvelopeError::TooLarge { len: request.len() });
        }
        let text = std::str::from_utf8(request).map_err(|_| EnvelopeError::NotText)?;
        let mut blocks = Vec::with_capacity(3);
        let mut pos = 0;
        loop {
            pos += leading_whitespace(&text[pos..]);
            if pos == text.len() {
                break;
            }
            let (block, end) = next_block(text, pos)?;
            blocks.push(block);
            pos = end;
        }
        let mut blocks = blocks.into_iter();
        let csr = blocks.next().ok_or(EnvelopeError::Empty)?;
        expect_label(&csr, PEM_CSR, 1, "CERTIFICATE REQUEST")?;
        let provider = match blocks.next() {
            None => None,
            Some(block) => {
                expect_label(&block, PEM_PROVIDER, 2, "the ATTESTATION PROVIDER block")?;
                let value = std::str::from_utf8(block.contents()).map_err(|_| EnvelopeError::BadProvider {
                    value: "<not UTF-8>".into(),
                })?;
                Some(ProviderVersion::parse(value)?)
            }
        };
        let data = match blocks.next() {
            None => None,
            Some(block) => {
                expect_label(&block, PEM_DATA, 3, "the ATTESTATION DATA block")?;
                Some(block.into_contents())
            }
        };
        if let Some(extra) = blocks.next() {
            return Err(EnvelopeError::UnexpectedBlock {
                label: crate::identity::truncate(extra.tag(), 64),
                position: 4,
                expected: "nothing after the ATTESTATION DATA block",
            });
        }
        Ok(Self {
            csr_der: csr.into_contents(),
            provider,
            data,
        })
    }

    /// Encodes the envelope as `spec.request` text.
    pub fn encode(&self) -> String {
        let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
        let mut blocks = vec![pem::Pem::new(PEM_CSR, self.csr_der.clone())];
        if let Some(provider) = &self.provider {
            blocks.push(pem::Pem::new(PEM_PROVIDER, provider.to_string().into_bytes()));
            if let Some(data) = &self.data {
                blocks.push(pem::Pem::new(PEM_DATA, data.clone()));
            }
        }
        blocks.iter().map(|block| pem::encode_config(block, config)).collect()
    }
}

fn leading_whitespace(s: &str) -> usize {
    s.len() - s.trim_start_matches([' ', '\t', '\r', '\n']).len()
}

/// Cuts one `-----BEGIN X-----` .. `-----END X-----` block starting exactly at `start`
/// and decodes it with the `pem` crate, which checks the labels match and the base64.
fn next_block(text: &str, start: usize) -> Result<(pem::Pem, usize), EnvelopeError> {
    const BEGIN: &str = "-----BEGIN ";
    let rest = &text[start..];
    if !rest.starts_with(BEGIN) {
        return Err(EnvelopeError::StrayBytes { offset: start });
    }
    let malformed = |why: &str| EnvelopeError::MalformedBlock {
        offset: start,
        why: why.to_owned(),
    };
    let label_end = rest[BEGIN.len()..]
        .find("-----")
        .ok_or_else(|| malformed("unterminated BEGIN line"))?;
    let label = &rest[BEGIN.len()..BEGIN.len() + label_end];
    let end_marker = format!("-----END {label}-----");
    let end = rest
        .find(&end_marker)
        .ok_or_else(|| malformed("no matching END line"))?
        + end_marker.len();
    let block = pem::parse(&rest[..end]).map_err(|e| malformed(&e.to_string()))?;
    if block.headers().iter().next().is_some() {
        return Err(EnvelopeError::Headers {
            label: crate::identity::truncate(label, 64),
        });
    }
    Ok((block, start + end))
}

fn expect_label(block: &pem::Pem, label: &str, position: usize, expected: &'static str) -> Result<(), EnvelopeError> {
    if block.tag() == label {
        Ok(())
    } else {
        Err(EnvelopeError::UnexpectedBlock {
            label: crate::identity::truncate(block.tag(), 64),
            position,
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(provider: Option<&str>, data: Option<&[u8]>) -> RequestEnvelope {
        RequestEnvelope {
            csr_der: vec![0x30, 0x03, 0x02, 0x01, 0x01],
            provider: provider.map(|p| ProviderVersion::parse(p).unwrap()),
            data: data.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn encode_then_parse_round_trips() {
        for e in [
            envelope(None, None),
            envelope(Some("insecure/v1"), None),
            envelope(Some("tpm/v1"), Some(b"{}")),
        ] {
            assert_eq!(RequestEnvelope::parse(e.encode().as_bytes()), Ok(e));
        }
    }

    #[test]
    fn blocks_out_of_order_or_repeated_are_refused() {
        let csr = pem::encode(&pem::Pem::new(PEM_CSR, vec![1]));
        let provider = pem::encode(&pem::Pem::new(PEM_PROVIDER, b"tpm/v1".to_vec()));
        let data = pem::encode(&pem::Pem::new(PEM_DATA, vec![2]));
        let key = pem::encode(&pem::Pem::new("PRIVATE KEY", vec![3]));
        for bad in [
            format!("{provider}{csr}"),
            format!("{csr}{data}"),
            format!("{csr}{provider}{provider}"),
            format!("{csr}{provider}{data}{data}"),
            format!("{csr}{key}"),
            key.clone(),
        ] {
            assert!(
                matches!(
                    RequestEnvelope::parse(bad.as_bytes()),
                    Err(EnvelopeError::UnexpectedBlock { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn stray_bytes_headers_and_size_are_refused() {
        let csr = pem::encode(&pem::Pem::new(PEM_CSR, vec![1]));
        assert!(matches!(
            RequestEnvelope::parse(format!("{csr}trailing").as_bytes()),
            Err(EnvelopeError::StrayBytes { .. })
        ));
        assert!(matches!(
            RequestEnvelope::parse(format!("junk\n{csr}").as_bytes()),
            Err(EnvelopeError::StrayBytes { offset: 0 })
        ));
        assert_eq!(RequestEnvelope::parse(b"  \n"), Err(EnvelopeError::Empty));
        let with_headers =
            "-----BEGIN CERTIFICATE REQUEST-----\nProc-Type: 4,ENCRYPTED\n\nAQ==\n-----END CERTIFICATE REQUEST-----\n";
        assert!(matches!(
            RequestEnvelope::parse(with_headers.as_bytes()),
            Err(EnvelopeError::Headers { .. })
        ));
        let big = vec![b' '; MAX_REQUEST_BYTES + 1];
        assert_eq!(
            RequestEnvelope::parse(&big),
            Err(EnvelopeError::TooLarge {
                len: MAX_REQUEST_BYTES + 1
            })
        );
        assert!(matches!(
            RequestEnvelope::parse(b"-----BEGIN CERTIFICATE REQUEST-----\nAQ==\n"),
            Err(EnvelopeError::MalformedBlock { .. })
        ));
        assert!(matches!(
            RequestEnvelope::parse(b"-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n"),
            Err(EnvelopeError::MalformedBlock { .. })
        ));
    }

    #[test]
    fn provider_versions_are_two_simple_parts() {
        assert_eq!(
            ProviderVersion::parse("tpm/v1").map(|p| p.to_string()),
            Ok("tpm/v1".into())
        );
        for bad in ["tpm", "/v1", "tpm/", "tpm/v1/x", "TPM/v1", "tpm/v 1", ""] {
            assert!(ProviderVersion::parse(bad).is_err(), "{bad}");
        }
    }
}
