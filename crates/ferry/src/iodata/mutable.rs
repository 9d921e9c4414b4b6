//! The write phase: IoDataMut, and the allocator call that starts one.

use std::fmt;
use std::io;
use std::sync::Arc;

use bytes::BufMut;

use super::{Fragment, Frags, IoData};
use crate::error::{Error, Result};
use crate::segment::{LotSpan, Segment};

/// The write phase of an [`IoData`]: freshly allocated, writable segments that only this
/// value owns, plus a logical length (which may be less than the segments' total).
///
/// Fill it through [`fragments_mut`](IoDataMut::fragments_mut), [`write_at`](IoDataMut::write_at),
/// [`fill_from`](IoDataMut::fill_from), [`io::Write`] or [`bytes::BufMut`] (the last two
/// write at a cursor starting at 0), then [`freeze`](IoDataMut::freeze) it.
///
/// ```
/// use bytes::BufMut;
/// use ferry::IoDataMut;
///
/// let mut m = IoDataMut::with_capacity_heap(6);
/// m.put_u16(0xabcd);
/// m.put_slice(b"wxyz");
/// let d = m.freeze();
/// assert!(d.eq_bytes(b"\xab\xcdwxyz"));
/// ```
pub struct IoDataMut {
    // Each `Arc` is the only reference to its segment until `freeze` hands it to the
    // `IoData`: allocated here, so that freezing allocates nothing.
    pub(super) segs: Segs,
    pub(super) len: usize,
    // Write cursor for `io::Write`/`BufMut`: byte position, and the same position as a
    // segment index and offset within that segment.
    pub(super) pos: usize,
    pub(super) cur_seg: usize,
    pub(super) cur_off: usize,
}

impl IoDataMut {
    /// A buffer of `len` bytes over the given segments, used in order (the segments may
    /// hold more than `len` bytes in total; the excess is dropped on freeze).
    ///
    /// # Errors
    /// [`Error::NotWritable`] if a segment is read-only; [`Error::InvalidArgument`] if the
    /// segments hold fewer than `len` bytes.
    pub fn from_segments(mut segs: Vec<Segment>, len: usize) -> Result<IoDataMut> {
        let mut total = 0usize;
        for s in &mut segs {
            if s.as_mut_slice().is_none() {
                return Err(Error::NotWritable);
            }
            total = total.saturating_add(s.len());
        }
        if total < len {
            return Err(Error::InvalidArgument(
                "segments are shorter than the requested length",
            ));
        }
        Ok(IoDataMut {
            segs: Segs::Many(segs.into_iter().map(Arc::new).collect()),
            len,
            pos: 0,
            cur_seg: 0,
            cur_off: 0,
        })
    }

    /// A zeroed buffer of `len` bytes in one heap segment.
    pub fn with_capacity_heap(len: usize) -> IoDataMut {
        IoDataMut {
            segs: Segs::One(Arc::new(Segment::from_vec(vec![0; len]))),
            len,
            pos: 0,
            cur_seg: 0,
            cur_off: 0,
        }
    }

    /// Logical length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the logical length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Position of the write cursor used by [`io::Write`] and [`BufMut`].
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Shortens the logical length to `len` (no effect if `len >= self.len()`); the
    /// cursor moves back if it was past the new end.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            if self.pos > len {
                self.set_cursor(len);
            }
        }
    }

    /// The writable fragments in order, trimmed to the logical length (the initialization
    /// phase's "list of pointers to the physical buffers"). None is empty.
    pub fn fragments_mut(&mut self) -> impl Iterator<Item = &mut [u8]> + '_ {
        let mut rem = self.len;
        self.segs
            .iter_mut()
            .map_while(move |s| {
                if rem == 0 {
                    return None;
                }
                let sl = writable(s);
                let n = sl.len().min(rem);
                rem -= n;
                Some(&mut sl[..n])
            })
            .filter(|s| !s.is_empty())
    }

    /// Copies `data` into the buffer starting at byte `offset`. Does not move the cursor.
    ///
    /// # Panics
    /// If `offset + data.len() > self.len()`.
    #[track_caller]
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        let end = offset
            .checked_add(data.len())
            .expect("write_at bounds overflow");
        assert!(
            end <= self.len,
            "write of {}..{end} past the end of {} bytes",
            offset,
            self.len
        );
        let mut pos = 0;
        let mut written = 0;
        for frag in self.fragments_mut() {
            let (fs, fe) = (pos, pos + frag.len());
            pos = fe;
            if fe <= offset {
                continue;
            }
            if fs >= end {
                break;
            }
            let lo = offset.max(fs) - fs;
            let hi = end.min(fe) - fs;
            crate::copy::copy_bytes(&mut frag[lo..hi], &data[written..written + hi - lo]);
            written += hi - lo;
        }
    }

    /// Copies `data` to the start of the buffer and places the cursor just after it.
    ///
    /// # Panics
    /// If `data.len() > self.len()`.
    #[track_caller]
    pub fn fill_from(&mut self, data: &[u8]) {
        self.write_at(0, data);
        self.set_cursor(data.len());
    }

    /// Freezes the buffer into an immutable [`IoData`] of [`len`](IoDataMut::len) bytes.
    /// Bytes that were never written keep the allocator's contents (zeros for heap
    /// buffers). Segments beyond the logical length are dropped.
    pub fn freeze(self) -> IoData {
        let len = self.len;
        // The common case (one fbuf): no list to build.
        let one = |mut seg: Arc<Segment>| {
            unique(&mut seg).freeze();
            IoData::from_fragment(Fragment { seg, off: 0, len })
        };
        let mut segs = match self.segs {
            Segs::One(seg) => return one(seg),
            Segs::Many(v) => v,
        };
        if segs.len() == 1 {
            return one(segs.pop().expect("one segment"));
        }
        let mut rem = len;
        let mut list = Frags::None;
        for mut seg in segs {
            if rem == 0 {
                break;
            }
            let n = seg.len().min(rem);
            if n == 0 {
                continue;
            }
            rem -= n;
            unique(&mut seg).freeze();
            list.push(Fragment {
                seg,
                off: 0,
                len: n,
            });
        }
        IoData::from_frags(list)
    }

    /// The address of its one segment, if it has exactly one (read from this value, not
    /// from the segment): tells whether an `IoDataMut` still holds the segment it held.
    pub(crate) fn sole_segment(&self) -> Option<*const Segment> {
        match &self.segs {
            Segs::One(s) => Some(Arc::as_ptr(s)),
            Segs::Many(_) => None,
        }
    }

    /// The fragments [`freeze`](Self::freeze) would make, without making them: each one's
    /// place in a lot (`None` for a segment in no lot or one whose keeper wants to hear
    /// of sends) and length. Reads no reference count.
    pub(crate) fn frozen_spans(&self) -> impl Iterator<Item = (Option<LotSpan>, usize)> + '_ {
        let mut rem = self.len;
        self.segs.iter().filter_map(move |seg| {
            let n = seg.len().min(rem);
            rem -= n;
            let span = seg.lot_span().filter(|_| !seg.has_send_hook());
            (n > 0).then_some((span, n))
        })
    }

    fn set_cursor(&mut self, pos: usize) {
        self.pos = pos;
        self.cur_seg = 0;
        self.cur_off = 0;
        let mut left = pos;
        while left > 0 {
            let n = self.segs[self.cur_seg].len();
            if left < n {
                self.cur_off = left;
                return;
            }
            left -= n;
            self.cur_seg += 1;
        }
    }

    /// Writable bytes at the cursor, up to the logical end (empty only when full).
    fn cursor_chunk(&mut self) -> &mut [u8] {
        let rem = self.len - self.pos;
        while self.cur_seg < self.segs.len() && self.cur_off == self.segs[self.cur_seg].len() {
            self.cur_seg += 1;
            self.cur_off = 0;
        }
        if rem == 0 {
            return &mut [];
        }
        let off = self.cur_off;
        let sl = writable(&mut self.segs[self.cur_seg]);
        let n = (sl.len() - off).min(rem);
        &mut sl[off..off + n]
    }

    fn advance_cursor(&mut self, mut cnt: usize) {
        assert!(
            cnt <= self.len - self.pos,
            "cannot advance the cursor past the end"
        );
        self.pos += cnt;
        while cnt > 0 {
            let avail = self.segs[self.cur_seg].len() - self.cur_off;
            if cnt < avail {
                self.cur_off += cnt;
                return;
            }
            cnt -= avail;
            self.cur_seg += 1;
            self.cur_off = 0;
        }
    }
}

/// The segments of an `IoDataMut`: one held inline (an fbuf from a path: neither
/// allocating nor freezing it touches a list), or several.
pub(super) enum Segs {
    One(Arc<Segment>),
    Many(Vec<Arc<Segment>>),
}

impl std::ops::Deref for Segs {
    type Target = [Arc<Segment>];
    fn deref(&self) -> &[Arc<Segment>] {
        match self {
            Segs::One(s) => std::slice::from_ref(s),
            Segs::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Segs {
    fn deref_mut(&mut self) -> &mut [Arc<Segment>] {
        match self {
            Segs::One(s) => std::slice::from_mut(s),
            Segs::Many(v) => v,
        }
    }
}

/// The bytes of a segment of an `IoDataMut` (unique and writable until frozen).
fn writable(s: &mut Arc<Segment>) -> &mut [u8] {
    unique(s)
        .as_mut_slice()
        .expect("IoDataMut segments are writable")
}

/// The segment of an `IoDataMut`, which only that value references until it is frozen.
///
/// Not `Arc::get_mut`: that proves uniqueness with a locked compare-and-swap on the
/// count, and a locked instruction waits for every store still pending. Writing a
/// payload's header and freezing it right before a send would then wait for the
/// header's cache line (which the receiver read last) before the send could even start,
/// a transfer between cores on the hand-over's critical path.
#[allow(clippy::mut_from_ref)]
fn unique(s: &mut Arc<Segment>) -> &mut Segment {
    // Plain loads: no reference can appear while we hold `&mut` to the only one.
    debug_assert!(Arc::strong_count(s) == 1 && Arc::weak_count(s) == 0);
    // SAFETY: every `Arc` in an `IoDataMut` is made by it (`alloc`, `from_segments`) and
    // never cloned, downgraded or handed out before `freeze` moves it into the `IoData`
    // (the fields are private to this module and its parent, which keep that rule), so
    // this `Arc` is the only reference to its segment; `&mut` to it excludes any other
    // use for the returned lifetime. `Arc::as_ptr` points into the allocation with the
    // `Arc`'s own (writable) provenance, as `Arc::get_mut` does after its check.
    unsafe { &mut *Arc::as_ptr(s).cast_mut() }
}

impl fmt::Debug for IoDataMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoDataMut")
            .field("len", &self.len)
            .field("segments", &self.segs.len())
            .field("position", &self.pos)
            .finish()
    }
}

impl io::Write for IoDataMut {
    /// Copies as much of `buf` as fits at the cursor; `Ok(0)` once the buffer is full.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            let dst = self.cursor_chunk();
            if dst.is_empty() {
                break;
            }
            let k = dst.len().min(buf.len() - n);
            dst[..k].copy_from_slice(&buf[n..n + k]);
            self.advance_cursor(k);
            n += k;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// SAFETY: `chunk_mut` returns initialized, writable memory owned by this value (a
// `&mut [u8]` from `Segment::as_mut_slice`) starting at the cursor and no longer than
// `remaining_mut()`; it is empty exactly when `remaining_mut() == 0`. `advance_mut`
// panics rather than move the cursor past the logical end, so `remaining_mut` is exact.
unsafe impl BufMut for IoDataMut {
    fn remaining_mut(&self) -> usize {
        self.len - self.pos
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.advance_cursor(cnt);
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        bytes::buf::UninitSlice::new(self.cursor_chunk())
    }
}

impl crate::region::PathAllocator {
    /// Allocates an fbuf of at least `len` bytes and returns it in its write phase.
    ///
    /// The fbuf is recycled from this path when possible, so its bytes are whatever the
    /// path last wrote there (fresh spans read as zeros). Write, then
    /// [`freeze`](IoDataMut::freeze).
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] if `len` (rounded up to its span) is more than the
    /// path's quota, [`Error::QuotaExceeded`] if the path already holds its quota
    /// (receivers are not releasing), [`Error::LotExhausted`] if the lot has no span left.
    pub fn alloc(&self, len: usize) -> Result<IoDataMut> {
        if len == 0 {
            return IoDataMut::from_segments(Vec::new(), 0);
        }
        let seg = self.alloc_segment(len)?;
        Ok(IoDataMut {
            segs: Segs::One(Arc::new(seg)),
            len,
            pos: 0,
            cur_seg: 0,
            cur_off: 0,
        })
    }
}
