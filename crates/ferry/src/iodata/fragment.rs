//! Fragments: the windows onto segments that an IoData is made of.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::segment::{LotSpan, Segment};

/// One contiguous piece of an [`IoData`](super::IoData): `len` bytes starting `offset` bytes into a
/// shared [`Segment`].
///
/// Cloning a fragment clones the `Arc`, not the bytes. Fragments held by an `IoData` are
/// never empty.
#[derive(Clone)]
pub struct Fragment {
    pub(super) seg: Arc<Segment>,
    pub(super) off: usize,
    pub(super) len: usize,
}

impl Fragment {
    /// A fragment covering `len` bytes of `seg` starting at `offset`.
    ///
    /// # Panics
    /// If `offset + len` overflows or exceeds the segment's length.
    #[track_caller]
    pub fn new(seg: Arc<Segment>, offset: usize, len: usize) -> Fragment {
        let end = offset.checked_add(len).expect("fragment bounds overflow");
        assert!(
            end <= seg.len(),
            "fragment {offset}+{len} lies outside a segment of {} bytes",
            seg.len()
        );
        Fragment {
            seg,
            off: offset,
            len,
        }
    }

    /// A fragment covering the whole segment.
    pub fn whole(seg: Arc<Segment>) -> Fragment {
        let len = seg.len();
        Fragment { seg, off: 0, len }
    }

    /// The fragment's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.seg.as_slice()[self.off..self.off + self.len]
    }

    /// The segment this fragment lies in.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// Byte offset of the fragment's first byte within its segment.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the fragment has no bytes (never the case inside an `IoData`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where exactly this fragment lies in a shared lot, if its segment lies in one: the
    /// segment's span moved forward by [`offset`](Fragment::offset).
    pub fn lot_span(&self) -> Option<LotSpan> {
        self.seg.lot_span().map(|s| LotSpan {
            lot: s.lot,
            offset: s.offset + self.off as u64,
        })
    }

    /// The sub-fragment `[from, from + len)` of this one. Caller checks bounds.
    pub(super) fn sub(&self, from: usize, len: usize) -> Fragment {
        debug_assert!(from + len <= self.len);
        Fragment {
            seg: Arc::clone(&self.seg),
            off: self.off + from,
            len,
        }
    }
}

impl AsRef<[u8]> for Fragment {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for Fragment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fragment")
            .field("segment", &self.seg.as_ptr())
            .field("offset", &self.off)
            .field("len", &self.len)
            .field("lot_span", &self.lot_span())
            .finish()
    }
}

/// Appends `f` to `list`, merging it into the last fragment when the two are adjacent
/// windows of the same segment (so split-then-concat does not grow the list). Empty
/// fragments are dropped.
pub(super) fn push_frag(list: &mut VecDeque<Fragment>, f: Fragment) {
    if f.len == 0 {
        return;
    }
    if let Some(last) = list.back_mut() {
        if Arc::ptr_eq(&last.seg, &f.seg) && last.off + last.len == f.off {
            last.len += f.len;
            return;
        }
    }
    list.push_back(f);
}
