//! TPM 2.0 wire encoding (TPM 2.0 Part 2): big-endian integers and size-prefixed `TPM2B_*`
//! buffers. Everything a node sends is read through [`Reader`], which never reads past the
//! end and says where a structure broke.

/// Why a TPM structure did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The data ended inside `what`.
    #[error("{what}: truncated at byte {offset}")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where.
        offset: usize,
    },
    /// Bytes left over after `what`.
    #[error("{what}: {left} trailing bytes")]
    Trailing {
        /// The structure.
        what: &'static str,
        /// How many.
        left: usize,
    },
    /// A value this verifier does not accept.
    #[error("{what}: {value:#06x} is not supported")]
    Unsupported {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u32,
    },
    /// A structurally wrong value.
    #[error("{0}")]
    Invalid(String),
}

/// A cursor over TPM-encoded bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads `buf` from the start.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or(WireError::Truncated { what, offset: self.pos })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// A byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.bytes(1, what)?[0])
    }

    /// A big-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A big-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A big-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A `TPM2B_*`: a u16 size, then that many bytes.
    pub fn tpm2b(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let size = self.u16(what)?;
        self.bytes(usize::from(size), what)
    }

    /// Fails unless everything was read.
    pub fn finish(&self, what: &'static str) -> Result<(), WireError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            left => Err(WireError::Trailing { what, left }),
        }
    }
}

/// Reads a whole `TPM2B_*` whose content is one structure: the content, checked to be all of
/// `buf`.
pub fn unwrap_tpm2b<'a>(buf: &'a [u8], what: &'static str) -> Result<&'a [u8], WireError> {
    let mut r = Reader::new(buf);
    let inner = r.tpm2b(what)?;
    r.finish(what)?;
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_end_and_say_where() {
        let mut r = Reader::new(&[0, 3, 1, 2]);
        assert_eq!(r.tpm2b("x"), Err(WireError::Truncated { what: "x", offset: 2 }));
        let mut r = Reader::new(&[0, 1, 9, 7]);
        assert_eq!(r.tpm2b("x"), Ok(&[9u8][..]));
        assert_eq!(r.finish("s"), Err(WireError::Trailing { what: "s", left: 1 }));
        assert_eq!(unwrap_tpm2b(&[0, 2, 1, 2], "b"), Ok(&[1u8, 2][..]));
        assert!(Reader::new(&[]).u64("n").is_err());
    }
}
