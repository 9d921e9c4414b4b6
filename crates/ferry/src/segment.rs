//! Segments: the spans of memory that IoData fragments point into.
//!
//! A [`Segment`] is a contiguous, readable span together with whatever keeps it alive: a
//! heap vector, an fbuf of this domain's lot (returned to its path's free list on drop), or
//! a span of another domain's lot (released back to that domain on drop). IoData never
//! looks at the keeper; it only reads the bytes and, for spans in a shared lot, the
//! [`LotSpan`] that lets a channel describe them to another domain without copying.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Identifies one lot: the group slot of the domain that owns it, and the generation of
/// that slot (a slot reused after its domain died gets a new generation).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LotId {
    /// Slot index in the group's control block.
    pub slot: u16,
    /// Generation of the slot when the lot was created.
    pub generation: u32,
}

/// Where a segment lies inside a shared lot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LotSpan {
    /// The lot.
    pub lot: LotId,
    /// Byte offset of the segment's first byte from the start of the lot.
    pub offset: u64,
}

/// A contiguous span of readable memory and the owner that keeps it valid.
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    span: Option<LotSpan>,
    writable: bool,
    /// Handed to `keep` when the segment goes (see [`Keep::segment_dropped`]).
    tag: Option<u64>,
    /// `keep` wants [`Keep::on_send`] (a secured fbuf); others skip the call, so that a
    /// send reads nothing of the keeper.
    send_hook: bool,
    // Dropped after the segment is no longer reachable; keeps `ptr..ptr+len` mapped.
    keep: Arc<dyn Keep>,
}

/// What keeps a segment's memory valid, and what happens to it when the segment goes.
pub(crate) trait Keep: Send + Sync {
    /// Write-protects the owner's pages until the memory is released (a no-op for memory
    /// that is not an fbuf of this domain). `tag` is the segment's (see
    /// [`Segment::with_tag`]).
    fn secure(&self, _tag: Option<u64>) -> crate::Result<()> {
        Ok(())
    }

    /// Called by a channel just before the segment is described to another domain.
    fn on_send(&self) -> crate::Result<()> {
        Ok(())
    }

    /// Called when a segment made by [`Segment::from_raw_tagged`] goes, with its tag.
    /// One keeper shared by many segments (a channel's receiving end) can so act for
    /// each segment, without a keeper allocated per segment.
    fn segment_dropped(&self, _tag: u64) {}
}

impl Keep for Vec<u8> {}

// SAFETY: the segment only hands out shared `&[u8]` views of memory that `keep` keeps
// mapped (and `&mut [u8]` only through `&mut Segment`), so moving or sharing it between
// threads is as safe as sharing a `Vec<u8>`.
unsafe impl Send for Segment {}
// SAFETY: see `Send`; `&Segment` gives read-only access.
unsafe impl Sync for Segment {}

impl Segment {
    /// Wraps a heap vector without copying it. The segment is writable and belongs to no lot,
    /// so a channel must copy it into an fbuf to send it (and counts that copy).
    pub fn from_vec(mut v: Vec<u8>) -> Self {
        let len = v.len();
        let ptr = NonNull::new(v.as_mut_ptr()).expect("Vec pointer is never null");
        Segment {
            ptr,
            len,
            span: None,
            writable: true,
            tag: None,
            send_hook: false,
            keep: Arc::new(v),
        }
    }

    /// Builds a segment over raw memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped and readable for as long as `keep` is alive, and if
    /// `writable` is true no one else may read or write that memory while this segment is
    /// reachable through a `&mut Segment`. If `span` is `Some`, the memory must be exactly
    /// that span of that lot.
    pub(crate) unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        span: Option<LotSpan>,
        writable: bool,
        keep: Arc<dyn Keep>,
    ) -> Self {
        Segment {
            ptr,
            len,
            span,
            writable,
            tag: None,
            send_hook: false,
            keep,
        }
    }

    /// Makes a channel call [`Keep::on_send`] before describing this segment.
    pub(crate) fn with_send_hook(mut self) -> Self {
        self.send_hook = true;
        self
    }

    /// Like [`from_raw`](Self::from_raw) for read-only memory, and `keep` is told
    /// [`segment_dropped(tag)`](Keep::segment_dropped) when this segment goes.
    ///
    /// # Safety
    /// As for [`from_raw`](Self::from_raw) with `writable` false.
    pub(crate) unsafe fn from_raw_tagged(
        ptr: NonNull<u8>,
        len: usize,
        span: Option<LotSpan>,
        keep: Arc<dyn Keep>,
        tag: u64,
    ) -> Self {
        Segment {
            ptr,
            len,
            span,
            writable: false,
            tag: Some(tag),
            send_hook: false,
            keep,
        }
    }

    /// Write-protects this segment's pages in the domain that owns them, until released.
    pub(crate) fn secure(&self) -> crate::Result<()> {
        self.keep.secure(self.tag)
    }

    /// Tags the segment: its keeper is told [`segment_dropped(tag)`](Keep::segment_dropped)
    /// when it goes, so that one keeper shared by many segments acts for each.
    pub(crate) fn with_tag(mut self, tag: u64) -> Self {
        self.tag = Some(tag);
        self
    }

    /// Whether sending this segment runs its keeper's [`Keep::on_send`].
    pub(crate) fn has_send_hook(&self) -> bool {
        self.send_hook
    }

    pub(crate) fn on_send(&self) -> crate::Result<()> {
        if self.send_hook {
            self.keep.on_send()?;
        }
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where this segment lies in a shared lot, if it does.
    pub fn lot_span(&self) -> Option<LotSpan> {
        self.span
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `from_vec`/`from_raw` guarantee the span is mapped and readable while
        // `keep` lives, and `keep` lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable, if this segment is writable (fresh fbufs and heap vectors).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if !self.writable {
            return None;
        }
        // SAFETY: the memory is mapped while `keep` lives; `writable` promises that no
        // one else touches it while we hold `&mut self`.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Marks the segment read-only (done when an aggregate is frozen).
    pub(crate) fn freeze(&mut self) {
        self.writable = false;
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(tag) = self.tag {
            self.keep.segment_dropped(tag);
        }
    }
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("span", &self.span)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_does_not_copy() {
        let v = vec![7u8; 100];
        let p = v.as_ptr();
        let s = Segment::from_vec(v);
        assert_eq!(s.as_ptr(), p);
        assert_eq!(s.as_slice(), &[7u8; 100][..]);
        assert!(s.lot_span().is_none());
    }

    #[test]
    fn frozen_segment_is_not_writable() {
        let mut s = Segment::from_vec(vec![1, 2, 3]);
        s.as_mut_slice().unwrap()[0] = 9;
        s.freeze();
        assert!(s.as_mut_slice().is_none());
        assert_eq!(s.as_slice(), &[9, 2, 3]);
    }
}
