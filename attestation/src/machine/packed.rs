//! The strings of one cached view, held in one text allocation and one span table (two `u16`
//! per field) instead of one heap allocation per field.
//!
//! A replica caches every Machine of the Clusters it serves. As `String` fields a fleet Machine
//! cost about 1.3 KB: a 500 B struct and a dozen 32 to 48 B allocations, most of them a name
//! the object repeats (the bootstrap config and infrastructure names are usually the Machine's,
//! the claim's provider ID is `spec.providerID`, its node name is `status.nodeRef`). Packing
//! stores each distinct string once and the well-known words (address types, the kubeadm
//! config's group and kind) not at all.

/// Where one field's text is.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The field is absent (`None`).
    const ABSENT: Self = Self {
        start: u32::MAX,
        end: u32::MAX,
    };
    /// `start` for a word of [`WORDS`]; `end` is its index.
    const WORD: u32 = u32::MAX - 1;
}

/// Words many objects carry, stored by index.
const WORDS: &[&str] = &[
    "bootstrap.cluster.x-k8s.io",
    "KubeadmConfig",
    "Hostname",
    "InternalDNS",
    "ExternalDNS",
    "InternalIP",
    "ExternalIP",
];

/// The span table: two `u16` per field when the text is under 64 KiB (every Cluster API
/// object in practice: half the table), two `u32` otherwise.
#[derive(Clone, PartialEq, Eq)]
enum Spans {
    Short(Box<[[u16; 2]]>),
    Long(Box<[Span]>),
}

impl Default for Spans {
    fn default() -> Self {
        Self::Short(Box::default())
    }
}

impl Spans {
    fn get(&self, index: usize) -> Option<Span> {
        match self {
            Self::Short(spans) => spans.get(index).map(|[start, end]| Span {
                start: widen(*start),
                end: widen(*end),
            }),
            Self::Long(spans) => spans.get(index).copied(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Short(spans) => spans.len(),
            Self::Long(spans) => spans.len(),
        }
    }
}

/// A short span's bound as a [`Span`]'s: the two highest values are the markers.
fn widen(bound: u16) -> u32 {
    match bound {
        u16::MAX => u32::MAX,
        WORD_SHORT => Span::WORD,
        bound => u32::from(bound),
    }
}

/// A [`Span`]'s bound as a short one, when it fits.
fn narrow(bound: u32) -> Option<u16> {
    match bound {
        u32::MAX => Some(u16::MAX),
        Span::WORD => Some(WORD_SHORT),
        bound => u16::try_from(bound).ok().filter(|b| *b < WORD_SHORT),
    }
}

/// [`Span::WORD`] in a short span.
const WORD_SHORT: u16 = u16::MAX - 1;

/// Fields by index, each `Some(&str)` or `None`.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct Packed {
    text: Box<str>,
    spans: Spans,
}

impl Packed {
    /// Field `index`; `None` when it was pushed as `None` or is past the end.
    pub(crate) fn get(&self, index: usize) -> Option<&str> {
        let span = self.spans.get(index)?;
        match span.start {
            Span::WORD => WORDS.get(span.end as usize).copied(),
            _ if span == Span::ABSENT => None,
            start => self.text.get(start as usize..span.end as usize),
        }
    }

    /// How many fields were pushed.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Bytes of text held (each distinct string once, known words not at all).
    #[cfg(test)]
    pub(crate) fn text_len(&self) -> usize {
        self.text.len()
    }

    /// Fields `from..from + count`, absent ones skipped.
    pub(crate) fn range(&self, from: usize, count: usize) -> impl Iterator<Item = &str> {
        (from..from.saturating_add(count)).filter_map(|i| self.get(i))
    }
}

/// Builds a [`Packed`], one field at a time.
#[derive(Default)]
pub(crate) struct Packer {
    text: String,
    spans: Vec<Span>,
}

impl Packer {
    /// Appends a field; returns its index. A string already pushed is not stored twice.
    pub(crate) fn push(&mut self, value: Option<&str>) -> usize {
        let span = match value {
            None => Span::ABSENT,
            Some(value) => self.find(value).unwrap_or_else(|| self.append(value)),
        };
        self.spans.push(span);
        self.spans.len() - 1
    }

    fn find(&self, value: &str) -> Option<Span> {
        if let Some(word) = WORDS.iter().position(|w| *w == value) {
            return Some(Span {
                start: Span::WORD,
                end: u32::try_from(word).ok()?,
            });
        }
        if value.is_empty() {
            return None;
        }
        self.spans
            .iter()
            .find(|s| s.start < Span::WORD && self.text.get(s.start as usize..s.end as usize) == Some(value))
            .copied()
    }

    fn append(&mut self, value: &str) -> Span {
        let start = self.text.len();
        self.text.push_str(value);
        match (u32::try_from(start), u32::try_from(self.text.len())) {
            // A view's text is bounded by the object's size (etcd keeps at most 1.5 MiB).
            (Ok(start), Ok(end)) if end < Span::WORD => Span { start, end },
            _ => Span::ABSENT,
        }
    }

    /// The packed fields, allocated to size.
    pub(crate) fn finish(self) -> Packed {
        let short: Option<Box<[[u16; 2]]>> = self
            .spans
            .iter()
            .map(|s| Some([narrow(s.start)?, narrow(s.end)?]))
            .collect();
        Packed {
            text: self.text.into_boxed_str(),
            spans: match short {
                Some(short) => Spans::Short(short),
                None => Spans::Long(self.spans.into_boxed_slice()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_pushed_with_repeats_and_words_stored_once() {
        let mut p = Packer::default();
        let fields = [
            Some("m-1"),
            None,
            Some(""),
            Some("m-1"),
            Some("InternalIP"),
            Some("10.0.0.1"),
            Some("ünïcode"),
        ];
        for f in fields {
            p.push(f);
        }
        let packed = p.finish();
        assert_eq!(packed.len(), fields.len());
        for (i, f) in fields.iter().enumerate() {
            assert_eq!(packed.get(i), *f, "field {i}");
        }
        assert_eq!(packed.get(fields.len()), None);
        assert_eq!(&*packed.text, "m-110.0.0.1ünïcode");
        assert_eq!(packed.range(0, 3).collect::<Vec<_>>(), ["m-1", ""]);
        assert!(matches!(packed.spans, Spans::Short(_)));
    }

    #[test]
    fn a_text_past_64_kib_keeps_wide_spans_and_reads_the_same() {
        let long = "x".repeat(70_000);
        let fields = [
            Some("a"),
            Some(long.as_str()),
            Some("InternalIP"),
            None,
            Some("b"),
            Some("a"),
        ];
        let mut p = Packer::default();
        for f in fields {
            p.push(f);
        }
        let packed = p.finish();
        assert!(matches!(packed.spans, Spans::Long(_)));
        for (i, f) in fields.iter().enumerate() {
            assert_eq!(packed.get(i), *f, "field {i}");
        }
        // The last short offset is the one below the markers.
        let near = "y".repeat(usize::from(WORD_SHORT) - 1);
        let mut p = Packer::default();
        p.push(Some(&near));
        p.push(Some("z"));
        let packed = p.finish();
        assert!(matches!(packed.spans, Spans::Long(_)));
        assert_eq!((packed.get(0), packed.get(1)), (Some(near.as_str()), Some("z")));
    }
}
