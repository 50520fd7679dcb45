//! The Authenticode digest of a PE/COFF image: what UEFI firmware extends into PCR 4 for an
//! `EV_EFI_BOOT_SERVICES_APPLICATION` (shim, grub, an EFI-stub kernel), so the reference values
//! a boot policy lists are these digests of the image's files.
//!
//! The algorithm is Microsoft's "Windows Authenticode Portable Executable Signature Format",
//! step for step as EDK2 runs it (`SecurityPkg/Tcg/Tcg2Dxe/MeasureBootPeCoff.c`,
//! `MeasurePeImageAndExtend`, reached through `HashLogExtendEvent` with `PE_COFF_IMAGE`). The
//! firmware measures shim that way when its boot manager loads it
//! (`DxeTpm2MeasureBootLib`: an `EFI_IMAGE_SUBSYSTEM_EFI_APPLICATION` is PCR 4,
//! `EV_EFI_BOOT_SERVICES_APPLICATION`), and shim passes grub, and the kernel grub asks it to
//! verify, to the same firmware call (shim's `tpm_log_pe`, `PE_COFF_IMAGE` flag, PCR 4), so
//! the firmware's hashing decides all three:
//!
//! 1. the headers from the start to the `CheckSum` field, then past its 4 bytes to the
//!    Certificate Table data directory entry (index 4), then past its 8 bytes to
//!    `SizeOfHeaders` (with no such entry, past the checksum straight to `SizeOfHeaders`);
//! 2. each section with raw data, in ascending `PointerToRawData` order (a stable sort, as
//!    EDK2's insertion sort), `SizeOfRawData` bytes;
//! 3. if the file is longer than `SizeOfHeaders` plus those sizes, the bytes from there up to
//!    the file's size less the Certificate Table's size (the table is taken to be last, as the
//!    specification requires); a file shorter than that sum plus the table is refused, as
//!    EDK2 refuses it.
//!
//! Images are hostile input (a policy tool reads whatever files it is pointed at): every
//! offset is checked against the file, and anything EDK2's loader would reject, or where its
//! arithmetic would leave the file, is an [`AuthenticodeError`], never a panic.

use std::ops::Range;

use aws_lc_rs::digest;

/// Why an image has no Authenticode digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthenticodeError {
    /// The file ends inside `what`.
    #[error("not a PE/COFF image: the file ({len} bytes) ends inside the {what}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// The file's size.
        len: usize,
    },
    /// No `PE\0\0` where the DOS header points.
    #[error("not a PE/COFF image: no PE signature at offset {offset:#x}")]
    NoPeSignature {
        /// Where it was looked for.
        offset: usize,
    },
    /// An optional header that is neither PE32 (`0x10b`) nor PE32+ (`0x20b`).
    #[error("not a PE/COFF image: optional header magic {magic:#06x}")]
    UnknownMagic {
        /// The magic found.
        magic: u16,
    },
    /// Fields that contradict each other or point outside the file.
    #[error("malformed PE/COFF image: {0}")]
    Malformed(String),
}

/// PE32 or PE32+: where the optional header's fields sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeFormat {
    /// 32-bit (`0x10b`).
    Pe32,
    /// 64-bit (`0x20b`): x86-64 shim, grub and kernels.
    Pe32Plus,
}

/// The byte ranges of a file that its Authenticode digest covers, in hashing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedRanges {
    /// PE32 or PE32+.
    pub format: PeFormat,
    /// File ranges, hashed one after another.
    pub ranges: Vec<Range<usize>>,
}

/// The SHA-256 Authenticode digest of `image`, the value a boot policy lists.
pub fn sha256(image: &[u8]) -> Result<[u8; 32], AuthenticodeError> {
    let mut out = [0u8; 32];
    out.copy_from_slice(&digest_with(image, &digest::SHA256)?);
    Ok(out)
}

/// The SHA-1 Authenticode digest of `image` (a TPM with only a SHA-1 bank).
pub fn sha1(image: &[u8]) -> Result<[u8; 20], AuthenticodeError> {
    let mut out = [0u8; 20];
    out.copy_from_slice(&digest_with(image, &digest::SHA1_FOR_LEGACY_USE_ONLY)?);
    Ok(out)
}

/// The Authenticode digest of `image` under `algorithm` (SHA-1, SHA-256, SHA-384 or SHA-512:
/// the banks a TPM may have).
pub fn digest_with(image: &[u8], algorithm: &'static digest::Algorithm) -> Result<Vec<u8>, AuthenticodeError> {
    let layout = hashed_ranges(image)?;
    let mut context = digest::Context::new(algorithm);
    for range in layout.ranges {
        // Every range was checked against the file by `hashed_ranges`.
        context.update(image.get(range).unwrap_or_default());
    }
    Ok(context.finish().as_ref().to_vec())
}

/// Which bytes of `image` the digest covers (the pure core of [`digest_with`]).
pub fn hashed_ranges(image: &[u8]) -> Result<HashedRanges, AuthenticodeError> {
    let len = image.len();
    let read = Bytes(image);
    // EDK2 reads the PE header at e_lfanew behind an "MZ" DOS header, at 0 without one.
    let pe = if read.u16(0, "DOS header")? == 0x5a4d {
        read.u32(0x3c, "DOS header")? as usize
    } else {
        0
    };
    if read.slice(pe, 4, "PE signature")? != b"PE\0\0" {
        return Err(AuthenticodeError::NoPeSignature { offset: pe });
    }
    let file_header = checked_add(pe, 4)?;
    let number_of_sections = read.u16(checked_add(file_header, 2)?, "COFF file header")?;
    let size_of_optional_header = read.u16(checked_add(file_header, 16)?, "COFF file header")? as usize;
    let optional = checked_add(file_header, 20)?;
    let magic = read.u16(optional, "optional header")?;
    let (format, rva_count_at, directories_at) = match magic {
        0x10b => (PeFormat::Pe32, 92, 96),
        0x20b => (PeFormat::Pe32Plus, 108, 112),
        _ => return Err(AuthenticodeError::UnknownMagic { magic }),
    };
    let optional_end = checked_add(optional, size_of_optional_header)?;
    // CheckSum is at 64 and SizeOfHeaders at 60 in both formats.
    let checksum = checked_add(optional, 64)?;
    let size_of_headers = read.u32(checked_add(optional, 60)?, "optional header")? as usize;
    let rva_count = read.u32(checked_add(optional, rva_count_at)?, "optional header")?;
    if checked_add(optional, directories_at)? > optional_end {
        return Err(malformed(format!(
            "SizeOfOptionalHeader {size_of_optional_header} ends before the data directories"
        )));
    }
    if size_of_headers > len {
        return Err(malformed(format!(
            "SizeOfHeaders {size_of_headers} is past the end of the file ({len} bytes)"
        )));
    }

    let mut ranges = Vec::new();
    ranges.push(0..checksum);
    let after_checksum = checksum + 4;
    // The Certificate Table entry (index 4), present when NumberOfRvaAndSizes > 4.
    let certificate_entry = if rva_count > 4 {
        let entry = checked_add(optional, directories_at + 4 * 8)?;
        if checked_add(entry, 8)? > optional_end {
            return Err(malformed(format!(
                "the Certificate Table entry is outside the optional header \
                 (SizeOfOptionalHeader {size_of_optional_header})"
            )));
        }
        Some(entry)
    } else {
        None
    };
    let certificate_table_size = match certificate_entry {
        Some(entry) => {
            ranges.push(after_checksum..entry);
            ranges.push(entry + 8..size_of_headers);
            read.u32(entry + 4, "Certificate Table entry")? as usize
        }
        None => {
            ranges.push(after_checksum..size_of_headers);
            0
        }
    };
    if ranges.iter().any(|r| r.start > r.end) {
        return Err(malformed(format!(
            "SizeOfHeaders {size_of_headers} ends inside the optional header"
        )));
    }

    // The section table follows the optional header; EDK2 hashes every section with raw data
    // in PointerToRawData order.
    let table = optional_end;
    let table_len = usize::from(number_of_sections) * 40;
    let table_bytes = read.slice(table, table_len, "section table")?;
    let mut sections: Vec<Range<usize>> = table_bytes
        .chunks_exact(40)
        .map(|header| {
            let size = le_u32(&header[16..20]) as usize;
            let pointer = le_u32(&header[20..24]) as usize;
            pointer..pointer.saturating_add(size)
        })
        .filter(|r| !r.is_empty())
        .collect();
    sections.sort_by_key(|r| r.start);
    let mut sum_of_bytes_hashed = size_of_headers;
    for section in sections {
        if section.end > len {
            return Err(malformed(format!(
                "a section's raw data ({:#x}..{:#x}) is past the end of the file ({len} bytes)",
                section.start, section.end
            )));
        }
        sum_of_bytes_hashed = checked_add(sum_of_bytes_hashed, section.len())?;
        ranges.push(section);
    }

    // Whatever follows, less the attribute certificate table (taken to be last).
    if len > sum_of_bytes_hashed {
        let hashed_and_table = checked_add(sum_of_bytes_hashed, certificate_table_size)?;
        if len > hashed_and_table {
            ranges.push(sum_of_bytes_hashed..len - certificate_table_size);
        } else if len < hashed_and_table {
            return Err(malformed(format!(
                "the Certificate Table ({certificate_table_size} bytes) does not fit after the \
                 {sum_of_bytes_hashed} bytes of headers and sections ({len} bytes in the file)"
            )));
        }
    }
    ranges.retain(|r| !r.is_empty());
    Ok(HashedRanges { format, ranges })
}

/// Little-endian reads that name the structure they ran out in.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn slice(&self, at: usize, n: usize, what: &'static str) -> Result<&'a [u8], AuthenticodeError> {
        at.checked_add(n)
            .and_then(|end| self.0.get(at..end))
            .ok_or(AuthenticodeError::Truncated {
                what,
                len: self.0.len(),
            })
    }

    fn u16(&self, at: usize, what: &'static str) -> Result<u16, AuthenticodeError> {
        let b = self.slice(at, 2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, at: usize, what: &'static str) -> Result<u32, AuthenticodeError> {
        Ok(le_u32(self.slice(at, 4, what)?))
    }
}

/// A little-endian u32 from exactly four bytes (callers slice them).
fn le_u32(b: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(b);
    u32::from_le_bytes(word)
}

fn checked_add(a: usize, b: usize) -> Result<usize, AuthenticodeError> {
    a.checked_add(b)
        .ok_or_else(|| malformed("an offset overflows".to_owned()))
}

fn malformed(why: String) -> AuthenticodeError {
    AuthenticodeError::Malformed(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small PE image: DOS header pointing at 0x80, `format`'s optional header with
    /// `rva_count` data directories, two sections stored in reverse file order, and
    /// `certificate` appended as the attribute certificate table.
    fn image(format: PeFormat, rva_count: u32, certificate: &[u8]) -> Vec<u8> {
        let (magic, dirs_at): (u16, usize) = match format {
            PeFormat::Pe32 => (0x10b, 96),
            PeFormat::Pe32Plus => (0x20b, 112),
        };
        let opt_size = dirs_at + 16 * 8;
        let pe = 0x80;
        let optional = pe + 24;
        let table = optional + opt_size;
        let headers = 0x400;
        let mut f = vec![0u8; headers];
        f[0..2].copy_from_slice(b"MZ");
        f[0x3c..0x40].copy_from_slice(&(pe as u32).to_le_bytes());
        f[pe..pe + 4].copy_from_slice(b"PE\0\0");
        f[pe + 6..pe + 8].copy_from_slice(&2u16.to_le_bytes());
        f[pe + 20..pe + 22].copy_from_slice(&(opt_size as u16).to_le_bytes());
        f[optional..optional + 2].copy_from_slice(&magic.to_le_bytes());
        f[optional + 60..optional + 64].copy_from_slice(&(headers as u32).to_le_bytes());
        f[optional + 64..optional + 68].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        let rva_at = optional + dirs_at - 4;
        f[rva_at..rva_at + 4].copy_from_slice(&rva_count.to_le_bytes());
        // Sections: the first header's data is stored after the second's.
        for (i, (pointer, size)) in [(0x600u32, 0x100u32), (0x400, 0x200)].iter().enumerate() {
            let h = table + 40 * i;
            f[h..h + 8].copy_from_slice(if i == 0 { b".data\0\0\0" } else { b".text\0\0\0" });
            f[h + 16..h + 20].copy_from_slice(&size.to_le_bytes());
            f[h + 20..h + 24].copy_from_slice(&pointer.to_le_bytes());
        }
        f.resize(0x700, 0);
        for (i, b) in f.iter_mut().enumerate().skip(0x400) {
            *b = (i % 251) as u8;
        }
        f.extend_from_slice(b"trailing data");
        if !certificate.is_empty() {
            let entry = optional + dirs_at + 32;
            let at = f.len() as u32;
            f[entry..entry + 4].copy_from_slice(&at.to_le_bytes());
            f[entry + 4..entry + 8].copy_from_slice(&(certificate.len() as u32).to_le_bytes());
            f.extend_from_slice(certificate);
        }
        f
    }

    #[test]
    fn the_hashed_ranges_skip_checksum_certificate_entry_and_table_and_sort_sections() {
        let f = image(PeFormat::Pe32Plus, 16, &[0xAA; 24]);
        let layout = hashed_ranges(&f).expect("layout");
        let optional = 0x80 + 24;
        let entry = optional + 112 + 32;
        assert_eq!(layout.format, PeFormat::Pe32Plus);
        assert_eq!(
            layout.ranges,
            vec![
                0..optional + 64,
                optional + 68..entry,
                entry + 8..0x400,
                0x400..0x600,
                0x600..0x700,
                0x700..0x700 + 13,
            ]
        );
    }

    #[test]
    fn pe32_has_its_directories_sixteen_bytes_earlier() {
        let f = image(PeFormat::Pe32, 16, &[0xAA; 8]);
        let layout = hashed_ranges(&f).expect("layout");
        let entry = 0x80 + 24 + 96 + 32;
        assert_eq!(layout.format, PeFormat::Pe32);
        assert_eq!(layout.ranges[1].end, entry);
        assert_eq!(layout.ranges[2].start, entry + 8);
    }

    #[test]
    fn without_a_certificate_entry_the_headers_run_on_past_the_checksum() {
        let f = image(PeFormat::Pe32Plus, 4, &[]);
        let layout = hashed_ranges(&f).expect("layout");
        assert_eq!(layout.ranges[1], 0x80 + 24 + 68..0x400);
        assert_eq!(layout.ranges.last(), Some(&(0x700..0x70d)));
    }

    #[test]
    fn the_digest_ignores_checksum_and_signature_but_not_code() {
        let signed = image(PeFormat::Pe32Plus, 16, &[0xAA; 40]);
        let mut unsigned = image(PeFormat::Pe32Plus, 16, &[]);
        assert_eq!(sha256(&signed), sha256(&unsigned));
        unsigned[0x80 + 24 + 64] ^= 1; // the checksum
        assert_eq!(sha256(&signed), sha256(&unsigned));
        unsigned[0x500] ^= 1; // code
        assert_ne!(sha256(&signed), sha256(&unsigned));
    }

    #[test]
    fn the_digest_is_the_hash_of_the_ranges_concatenated() {
        let f = image(PeFormat::Pe32, 16, &[1; 16]);
        let layout = hashed_ranges(&f).expect("layout");
        let joined: Vec<u8> = layout.ranges.iter().flat_map(|r| f[r.clone()].to_vec()).collect();
        let expected = digest::digest(&digest::SHA256, &joined);
        assert_eq!(sha256(&f).expect("digest").as_slice(), expected.as_ref());
        let expected = digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, &joined);
        assert_eq!(sha1(&f).expect("digest").as_slice(), expected.as_ref());
    }

    #[test]
    fn a_certificate_table_larger_than_the_tail_is_refused() {
        let mut f = image(PeFormat::Pe32Plus, 16, &[0xAA; 8]);
        let entry = 0x80 + 24 + 112 + 32;
        f[entry + 4..entry + 8].copy_from_slice(&0x1000u32.to_le_bytes());
        assert!(matches!(hashed_ranges(&f), Err(AuthenticodeError::Malformed(_))));
    }

    #[test]
    fn not_pe_files_are_refused_by_name() {
        assert_eq!(
            hashed_ranges(b"MZ"),
            Err(AuthenticodeError::Truncated {
                what: "DOS header",
                len: 2
            })
        );
        let mut f = image(PeFormat::Pe32Plus, 16, &[]);
        f[0x80] = b'X';
        assert_eq!(
            hashed_ranges(&f),
            Err(AuthenticodeError::NoPeSignature { offset: 0x80 })
        );
        let mut f = image(PeFormat::Pe32Plus, 16, &[]);
        f[0x80 + 24] = 0x07;
        assert_eq!(hashed_ranges(&f), Err(AuthenticodeError::UnknownMagic { magic: 0x207 }));
    }

    #[test]
    fn sections_past_the_end_and_short_optional_headers_are_refused() {
        let mut f = image(PeFormat::Pe32Plus, 16, &[]);
        let table = 0x80 + 24 + 112 + 128;
        f[table + 16..table + 20].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        assert!(matches!(hashed_ranges(&f), Err(AuthenticodeError::Malformed(_))));
        let mut f = image(PeFormat::Pe32Plus, 16, &[]);
        f[0x80 + 20..0x80 + 22].copy_from_slice(&100u16.to_le_bytes());
        assert!(matches!(hashed_ranges(&f), Err(AuthenticodeError::Malformed(_))));
    }

    #[test]
    fn every_prefix_and_every_single_byte_change_is_an_answer_not_a_panic() {
        let f = image(PeFormat::Pe32Plus, 16, &[0xAA; 16]);
        for n in 0..f.len() {
            let _ = sha256(&f[..n]);
        }
        // Every header byte set to its extremes.
        for at in 0..0x400 {
            for value in [0x00, 0x7F, 0x80, 0xFF] {
                let mut g = f.clone();
                g[at] = value;
                let _ = sha256(&g);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = hashed_ranges(&bytes);
        }

        #[test]
        fn arbitrary_header_words_never_panic(
            writes in proptest::collection::vec((0usize..0x400, proptest::num::u32::ANY), 1..8)
        ) {
            let mut f = image(PeFormat::Pe32Plus, 16, &[0xAA; 16]);
            for (at, word) in writes {
                f[at..at + 4].copy_from_slice(&word.to_le_bytes());
            }
            if let Ok(layout) = hashed_ranges(&f) {
                proptest::prop_assert!(layout.ranges.iter().all(|r| r.start <= r.end && r.end <= f.len()));
            }
        }
    }
}
