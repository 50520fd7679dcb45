//! The `spec.request` envelope: a PKCS#10 block, then optionally the attestation PROVIDER
//! and DATA blocks (SPEC section 2, rule 1).
//!
//! kube-apiserver only insists that the first PEM block is a `CERTIFICATE REQUEST`; this parser
//! is stricter, because everything after it is read by the signer: blocks in order, each label
//! once, 64 KiB at most (576 KiB for `tpm/v1`, whose phase 1 carries the event log), and every block in RFC 7468's strict form, so that no other PEM reader
//! (Go's `encoding/pem`, the `pem` crate, OpenSSL) can find a block, a byte or a boundary this
//! one did not:
//!
//! - The request is a sequence of lines, each ending in LF or CRLF, the last one included. A
//!   CR anywhere else is refused.
//! - A block starts with a line that is exactly `-----BEGIN <label>-----` (RFC 7468 label
//!   characters) and ends with a line that is exactly `-----END <label>-----`, same label: no
//!   data on either line, no second block on the same line, no spaces around them.
//! - Between them only base64 lines: `A-Z a-z 0-9 + /`, `=` padding at the very end of the
//!   data only; no PEM headers (`Name: value`), no blank line, no space, tab, form feed,
//!   vertical tab or non-ASCII whitespace anywhere. Line width is not checked (Go, OpenSSL and
//!   the `pem` crate write 64 columns; a different width changes no decoded byte).
//! - The base64 is canonical: padding present and correct, unused trailing bits zero. Data
//!   that decodes two ways is data two readers can disagree on.
//! - Outside blocks only empty lines. A line of spaces or tabs is refused: no producer writes
//!   one, and "whitespace" is exactly where lenient readers differ (the `pem` crate skips any
//!   Unicode whitespace, Go only ASCII spaces, tabs and line ends).

use std::fmt;

use base64::Engine;

use crate::names::{MAX_REQUEST_BYTES, MAX_TPM_REQUEST_BYTES, PEM_CSR, PEM_DATA, PEM_PROVIDER};

/// Why a `spec.request` is not a well-formed envelope. Maps to `InvalidRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// Larger than 64 KiB ([`MAX_REQUEST_BYTES`]), or than [`MAX_TPM_REQUEST_BYTES`] for `tpm/v1`.
    #[error("request is {len} bytes, more than the {limit} allowed")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The limit it passed.
        limit: usize,
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
    /// The last line does not end in LF or CRLF.
    #[error("the line at offset {offset} does not end in LF or CRLF")]
    UnterminatedLine {
        /// Where the line starts.
        offset: usize,
    },
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

/// What a controller's cache keeps in place of a request larger than `limit`, the most its
/// signer name allows (SPEC rule 1): a hostile workload cluster's megabyte requests then cost
/// the cache a few bytes each, and [`RequestEnvelope::parse`] still refuses the CSR as
/// [`EnvelopeError::TooLarge`], naming its real size. A NUL byte starts it, which no PEM text
/// holds; a requester writing it themselves only has their CSR refused as too large.
pub fn withheld_request(len: usize, limit: usize) -> Vec<u8> {
    format!("{WITHHELD}{len} {limit}\n").into_bytes()
}

/// The start of [`withheld_request`]'s text.
const WITHHELD: &str = "\u{0}withheld request, bytes and limit: ";

/// The size and limit a [`withheld_request`] records.
pub fn withheld_size(request: &[u8]) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(request.strip_prefix(WITHHELD.as_bytes())?).ok()?;
    let (len, limit) = text.strip_suffix('\n')?.split_once(' ')?;
    Some((len.parse().ok()?, limit.parse().ok()?))
}

impl RequestEnvelope {
    /// Parses `spec.request` strictly (see the module documentation).
    pub fn parse(request: &[u8]) -> Result<Self, EnvelopeError> {
        if let Some((len, limit)) = withheld_size(request) {
            return Err(EnvelopeError::TooLarge { len, limit });
        }
        // The largest any provider may send, before reading a byte; the provider's own limit
        // once its block is read.
        if request.len() > MAX_TPM_REQUEST_BYTES {
            return Err(EnvelopeError::TooLarge {
                len: request.len(),
                limit: MAX_TPM_REQUEST_BYTES,
            });
        }
        let text = std::str::from_utf8(request).map_err(|_| EnvelopeError::NotText)?;
        let blocks = blocks(text)?;
        let mut blocks = blocks.into_iter();
        let csr = blocks.next().ok_or(EnvelopeError::Empty)?;
        expect_label(&csr, PEM_CSR, 1, "CERTIFICATE REQUEST")?;
        let provider = match blocks.next() {
            None => None,
            Some(block) => {
                expect_label(&block, PEM_PROVIDER, 2, "the ATTESTATION PROVIDER block")?;
                let value = std::str::from_utf8(&block.contents).map_err(|_| EnvelopeError::BadProvider {
                    value: "<not UTF-8>".into(),
                })?;
                Some(ProviderVersion::parse(value)?)
            }
        };
        let data = match blocks.next() {
            None => None,
            Some(block) => {
                expect_label(&block, PEM_DATA, 3, "the ATTESTATION DATA block")?;
                Some(block.contents)
            }
        };
        let tpm = provider.as_ref().is_some_and(|p| p.provider() == "tpm");
        if request.len() > MAX_REQUEST_BYTES && !tpm {
            return Err(EnvelopeError::TooLarge {
                len: request.len(),
                limit: MAX_REQUEST_BYTES,
            });
        }
        if let Some(extra) = blocks.next() {
            return Err(EnvelopeError::UnexpectedBlock {
                label: crate::identity::truncate(extra.label, 64),
                position: 4,
                expected: "nothing after the ATTESTATION DATA block",
            });
        }
        Ok(Self {
            csr_der: csr.contents,
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

/// One PEM block: its label and its decoded contents.
struct Block<'a> {
    label: &'a str,
    contents: Vec<u8>,
}

/// One line of the request, without its line ending.
struct Line<'a> {
    text: &'a str,
    /// Where it starts in the request.
    offset: usize,
}

/// Cuts `text` into lines ending in LF or CRLF; the last one must end too.
fn lines(text: &str) -> Result<Vec<Line<'_>>, EnvelopeError> {
    let mut lines = Vec::new();
    let mut offset = 0;
    while offset < text.len() {
        let rest = &text[offset..];
        let Some(end) = rest.find('\n') else {
            return Err(EnvelopeError::UnterminatedLine { offset });
        };
        let line = &rest[..end];
        lines.push(Line {
            text: line.strip_suffix('\r').unwrap_or(line),
            offset,
        });
        offset += end + 1;
    }
    Ok(lines)
}

/// Every block of the request, in order (see the module documentation for the form).
fn blocks(text: &str) -> Result<Vec<Block<'_>>, EnvelopeError> {
    let mut blocks = Vec::with_capacity(3);
    let mut lines = lines(text)?.into_iter();
    while let Some(line) = lines.next() {
        if line.text.is_empty() {
            continue;
        }
        let start = line.offset;
        let malformed = |why: String| EnvelopeError::MalformedBlock { offset: start, why };
        if !line.text.starts_with("-----BEGIN ") {
            return Err(EnvelopeError::StrayBytes { offset: start });
        }
        let label = line
            .text
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .filter(|label| is_label(label))
            .ok_or_else(|| malformed("the BEGIN line must be exactly -----BEGIN <label>-----".into()))?;
        let mut base64 = String::new();
        loop {
            let Some(body) = lines.next() else {
                return Err(malformed(format!("no -----END {label}----- line")));
            };
            if body.text.starts_with("-----END ") {
                if body
                    .text
                    .strip_prefix("-----END ")
                    .and_then(|l| l.strip_suffix("-----"))
                    != Some(label)
                {
                    return Err(malformed(format!(
                        "the END line at offset {} must be exactly -----END {label}-----",
                        body.offset
                    )));
                }
                break;
            }
            if body.text.contains(':') {
                return Err(EnvelopeError::Headers {
                    label: crate::identity::truncate(label, 64),
                });
            }
            if body.text.is_empty() {
                return Err(malformed(format!(
                    "blank line at offset {} inside the block",
                    body.offset
                )));
            }
            if let Some(bad) = body
                .text
                .char_indices()
                .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=')))
            {
                return Err(malformed(format!(
                    "{:?} at offset {} is not base64",
                    bad.1,
                    body.offset + bad.0
                )));
            }
            base64.push_str(body.text);
        }
        // STANDARD decodes canonically: padding required and correct, unused bits zero, `=`
        // only at the end.
        let contents = base64::engine::general_purpose::STANDARD
            .decode(base64.as_bytes())
            .map_err(|e| malformed(format!("base64: {e}")))?;
        blocks.push(Block { label, contents });
    }
    Ok(blocks)
}

/// RFC 7468 `label`: printable ASCII but `-`, single spaces or hyphens between those.
fn is_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let labelchar = |b: u8| (0x21..=0x7e).contains(&b) && b != b'-';
    !bytes.is_empty()
        && labelchar(bytes[0])
        && labelchar(bytes[bytes.len() - 1])
        && bytes.windows(2).all(|w| labelchar(w[0]) || labelchar(w[1]))
        && bytes.iter().all(|b| labelchar(*b) || *b == b'-' || *b == b' ')
}

fn expect_label(block: &Block<'_>, label: &str, position: usize, expected: &'static str) -> Result<(), EnvelopeError> {
    if block.label == label {
        Ok(())
    } else {
        Err(EnvelopeError::UnexpectedBlock {
            label: crate::identity::truncate(block.label, 64),
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
    fn only_tpm_v1_may_pass_64_kib_for_its_event_log() {
        let log = vec![b'x'; 256 * 1024];
        let tpm = envelope(Some("tpm/v1"), Some(&log)).encode();
        assert!(tpm.len() > MAX_REQUEST_BYTES);
        assert!(RequestEnvelope::parse(tpm.as_bytes()).is_ok(), "{} bytes", tpm.len());
        let insecure = envelope(Some("insecure/v1"), Some(&log)).encode();
        assert_eq!(
            RequestEnvelope::parse(insecure.as_bytes()),
            Err(EnvelopeError::TooLarge {
                len: insecure.len(),
                limit: MAX_REQUEST_BYTES
            })
        );
    }

    #[test]
    fn a_withheld_request_is_refused_as_too_large_with_its_real_size() {
        let withheld = withheld_request(1_048_576, MAX_REQUEST_BYTES);
        assert!(withheld.len() < 64);
        assert_eq!(withheld_size(&withheld), Some((1_048_576, MAX_REQUEST_BYTES)));
        assert_eq!(
            RequestEnvelope::parse(&withheld),
            Err(EnvelopeError::TooLarge {
                len: 1_048_576,
                limit: MAX_REQUEST_BYTES
            })
        );
        assert_eq!(withheld_size(b"-----BEGIN CERTIFICATE REQUEST-----\n"), None);
        assert_eq!(withheld_size(&withheld[..withheld.len() - 1]), None);
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
            RequestEnvelope::parse(format!("{csr}trailing\n").as_bytes()),
            Err(EnvelopeError::StrayBytes { .. })
        ));
        assert!(matches!(
            RequestEnvelope::parse(format!("junk\n{csr}").as_bytes()),
            Err(EnvelopeError::StrayBytes { offset: 0 })
        ));
        assert_eq!(RequestEnvelope::parse(b""), Err(EnvelopeError::Empty));
        assert_eq!(RequestEnvelope::parse(b"\n\r\n"), Err(EnvelopeError::Empty));
        let with_headers =
            "-----BEGIN CERTIFICATE REQUEST-----\nProc-Type: 4,ENCRYPTED\n\nAQ==\n-----END CERTIFICATE REQUEST-----\n";
        assert!(matches!(
            RequestEnvelope::parse(with_headers.as_bytes()),
            Err(EnvelopeError::Headers { .. })
        ));
        let big = vec![b' '; MAX_TPM_REQUEST_BYTES + 1];
        assert_eq!(
            RequestEnvelope::parse(&big),
            Err(EnvelopeError::TooLarge {
                len: MAX_TPM_REQUEST_BYTES + 1,
                limit: MAX_TPM_REQUEST_BYTES
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

    /// The CSR block of `csr` (DER), the way Go's `pem.Encode` writes it: 64 columns, LF.
    fn go_encoded(label: &str, der: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let mut out = format!("-----BEGIN {label}-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap());
            out.push('\n');
        }
        out.push_str(&format!("-----END {label}-----\n"));
        out
    }

    /// A CSR-sized body: several base64 lines, padding on the last one.
    fn body() -> Vec<u8> {
        (0..=200u8).collect()
    }

    fn refused(text: &str) -> EnvelopeError {
        match RequestEnvelope::parse(text.as_bytes()) {
            Err(e) => e,
            Ok(parsed) => panic!("accepted {text:?} as {parsed:?}"),
        }
    }

    fn malformed(text: &str) {
        assert!(
            matches!(refused(text), EnvelopeError::MalformedBlock { .. }),
            "{text:?}: {:?}",
            refused(text)
        );
    }

    #[test]
    fn what_go_and_the_pem_crate_write_parses() {
        let go = format!(
            "{}{}{}",
            go_encoded(PEM_CSR, &body()),
            go_encoded(PEM_PROVIDER, b"tpm/v1"),
            go_encoded(PEM_DATA, b"{}")
        );
        let parsed = RequestEnvelope::parse(go.as_bytes()).unwrap();
        assert_eq!(parsed.csr_der, body());
        assert_eq!(parsed.data.as_deref(), Some(&b"{}"[..]));
        // The pem crate, both line endings; and Go's output of an empty body.
        for ending in [pem::LineEnding::LF, pem::LineEnding::CRLF] {
            let config = pem::EncodeConfig::new().set_line_ending(ending);
            let text = pem::encode_config(&pem::Pem::new(PEM_CSR, body()), config);
            assert_eq!(RequestEnvelope::parse(text.as_bytes()).unwrap().csr_der, body());
        }
        assert_eq!(
            RequestEnvelope::parse(go_encoded(PEM_CSR, b"").as_bytes())
                .unwrap()
                .csr_der,
            b""
        );
    }

    #[test]
    fn crlf_line_endings_and_blank_lines_between_blocks_are_accepted() {
        let lf = format!(
            "{}\n{}\n",
            go_encoded(PEM_CSR, &body()),
            go_encoded(PEM_PROVIDER, b"insecure/v1")
        );
        let crlf = lf.replace('\n', "\r\n");
        assert_eq!(
            RequestEnvelope::parse(crlf.as_bytes()),
            RequestEnvelope::parse(lf.as_bytes())
        );
        assert!(RequestEnvelope::parse(crlf.as_bytes()).is_ok());
        // Mixed endings are lines all the same.
        let mixed = lf.replacen('\n', "\r\n", 3);
        assert!(RequestEnvelope::parse(mixed.as_bytes()).is_ok());
    }

    #[test]
    fn headers_are_refused_wherever_they_are() {
        let csr = go_encoded(PEM_CSR, &body());
        let first = csr.replacen("-----\n", "-----\nProc-Type: 4,ENCRYPTED\n", 1);
        assert!(matches!(refused(&first), EnvelopeError::Headers { .. }));
        let (head, tail) = csr.split_at(csr.find("-----\n").unwrap() + 6 + 65);
        let middle = format!("{head}Comment: x\n{tail}");
        assert!(matches!(refused(&middle), EnvelopeError::Headers { .. }));
    }

    #[test]
    fn boundaries_stand_on_their_own_lines() {
        let csr = go_encoded(PEM_CSR, &body());
        let provider = go_encoded(PEM_PROVIDER, b"insecure/v1");
        // Data on the BEGIN line.
        malformed(&csr.replacen("REQUEST-----\n", "REQUEST-----", 1));
        // Two blocks on one line.
        malformed(&format!("{}{provider}", csr.trim_end_matches('\n')));
        // Data on the END line, before and after the boundary.
        let last_line_end = csr.rfind("\n-----END").unwrap();
        malformed(&format!("{}{}", &csr[..last_line_end], &csr[last_line_end + 1..]));
        malformed(&csr.replace(
            "-----END CERTIFICATE REQUEST-----",
            "-----END CERTIFICATE REQUEST-----AQ==",
        ));
        // Spaces around a boundary.
        assert!(matches!(
            refused(&csr.replacen("-----BEGIN", " -----BEGIN", 1)),
            EnvelopeError::StrayBytes { offset: 0 }
        ));
        malformed(&csr.replacen("REQUEST-----\n", "REQUEST----- \n", 1));
        malformed(&csr.replace(
            "-----END CERTIFICATE REQUEST-----",
            "-----END CERTIFICATE REQUEST----- ",
        ));
        malformed(&csr.replacen("-----\n", "-----\t\n", 1));
        // Not a label, or a label with a doubled space.
        malformed("-----BEGIN -----\nAQ==\n-----END -----\n");
        malformed("-----BEGIN CERTIFICATE  REQUEST-----\nAQ==\n-----END CERTIFICATE  REQUEST-----\n");
    }

    #[test]
    fn missing_and_mismatched_end_lines_are_refused() {
        let csr = go_encoded(PEM_CSR, &body());
        let no_end = csr.replace("-----END CERTIFICATE REQUEST-----\n", "");
        malformed(&no_end);
        malformed(&csr.replace("-----END CERTIFICATE REQUEST-----", "-----END CERTIFICATE-----"));
        // An END for another block before this one's: the first END line closes the block.
        let provider = go_encoded(PEM_PROVIDER, b"insecure/v1");
        let nested = csr.replacen("-----\n", &format!("-----\n{provider}"), 1);
        malformed(&nested);
        // No line ending after the last END line.
        assert!(matches!(
            refused(csr.trim_end_matches('\n')),
            EnvelopeError::UnterminatedLine { .. }
        ));
    }

    #[test]
    fn whitespace_inside_base64_is_refused() {
        let csr = go_encoded(PEM_CSR, &body());
        let at = csr.find("-----\n").unwrap() + 6 + 8;
        for odd in [
            " ", "\t", "\u{c}", "\u{b}", "\r", "\u{a0}", "\u{2003}", "\u{3000}", "\u{feff}", "\u{85}",
        ] {
            malformed(&format!("{}{odd}{}", &csr[..at], &csr[at..]));
        }
        // At the start or end of a base64 line, and a blank line inside the block.
        malformed(&csr.replacen("-----\n", "-----\n ", 1));
        malformed(&csr.replacen("\n-----END", " \n-----END", 1));
        malformed(&csr.replacen("\n-----END", "\n\n-----END", 1));
        // A stray CR (CR CR LF).
        malformed(&csr.replacen("\n-----END", "\r\r\n-----END", 1));
    }

    #[test]
    fn base64_must_be_canonical() {
        let wrap = |b64: &str| format!("-----BEGIN {PEM_CSR}-----\n{b64}\n-----END {PEM_CSR}-----\n");
        assert_eq!(RequestEnvelope::parse(wrap("AQ==").as_bytes()).unwrap().csr_der, [1]);
        for bad in [
            "AQ",       // padding missing
            "AQ=",      // padding short
            "AR==",     // non-zero trailing bits
            "AQ==AQ==", // padding in the middle
            "A===",     // too much padding
            "=AQ=",
        ] {
            malformed(&wrap(bad));
        }
        // Padding at the end of a line that is not the last.
        malformed(&wrap("AQ==\nAQ=="));
    }

    #[test]
    fn only_empty_lines_outside_blocks() {
        let csr = go_encoded(PEM_CSR, &body());
        assert!(RequestEnvelope::parse(format!("\n\r\n{csr}\n\n").as_bytes()).is_ok());
        for stray in [" \n", "\t\n", "\u{c}\n", "\u{a0}\n", "# comment\n", "\r\r\n"] {
            assert!(
                matches!(refused(&format!("{csr}{stray}")), EnvelopeError::StrayBytes { .. }),
                "{stray:?}"
            );
        }
        assert!(matches!(
            refused(&format!(" \n{csr}")),
            EnvelopeError::StrayBytes { offset: 0 }
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
