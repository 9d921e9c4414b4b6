//! IoData: immutable, possibly fragmented byte strings that are edited without copying.
//!
//! An [`IoData`] is a logical byte string stored as an ordered list of [`Fragment`]s, each a
//! window onto a [`Segment`] (a heap vector, an fbuf of this domain's lot, or a span of
//! another domain's lot). Once built, an `IoData` never changes its bytes; every editing
//! operation — [`clone`](Clone::clone) (share), [`slice`](IoData::slice) (clip),
//! [`split_at`](IoData::split_at), [`concat`](IoData::concat) — produces a new fragment list
//! that points at the same memory. Payload bytes are copied only by the operations that
//! say so ([`IoData::to_vec`], [`IoData::copy_range_to_slice`], [`std::io::Read`], a unit
//! of [`IoData::units`] that straddles two fragments).
//!
//! Building new data happens in a separate write phase: an [`IoDataMut`] owns freshly
//! allocated, writable segments; its owner fills them and then [`IoDataMut::freeze`]s it
//! into an `IoData`, after which the memory is read-only. [`IoData::mutate`] combines the
//! two ("read the source, write a new aggregate") with memory from a caller-supplied
//! allocator.
//!
//! Consumers that expect contiguous memory or standard traits can read an `IoData` in place:
//! it implements [`bytes::Buf`], [`std::io::Read`] and [`std::io::BufRead`] (all consuming
//! from the front), and [`IoData::cursor`] gives a non-consuming reader over a borrowed
//! `IoData`.
//!
//! # Cost model
//!
//! The fragment list is reference-counted, so cloning an `IoData` is O(1) (one atomic
//! increment) whatever its size. Operations that produce a different window (`slice`,
//! `split_at`, `concat`) build a new list in O(number of fragments) and never keep
//! segments outside their result alive. Consuming from the front (`Buf::advance`,
//! `Read::read`) and truncating work in place when this `IoData` is the only owner of its
//! list, and release every segment as soon as it has been fully consumed; on a shared list
//! the first such call makes a private copy of the list (not of the payload).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::iter::FusedIterator;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};

use crate::error::{Error, Result};
use crate::segment::{LotSpan, Segment};

// ---------------------------------------------------------------------------------------
// Fragment
// ---------------------------------------------------------------------------------------

/// One contiguous piece of an [`IoData`]: `len` bytes starting `offset` bytes into a
/// shared [`Segment`].
///
/// Cloning a fragment clones the `Arc`, not the bytes. Fragments held by an `IoData` are
/// never empty.
#[derive(Clone)]
pub struct Fragment {
    seg: Arc<Segment>,
    off: usize,
    len: usize,
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
    fn sub(&self, from: usize, len: usize) -> Fragment {
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
fn push_frag(list: &mut VecDeque<Fragment>, f: Fragment) {
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

// ---------------------------------------------------------------------------------------
// IoData
// ---------------------------------------------------------------------------------------

/// An immutable byte string made of zero or more [`Fragment`]s.
///
/// See the [module documentation](self) for the operations and their costs.
///
/// ```
/// use ferry::IoData;
///
/// let a = IoData::from_vec(b"hello, ".to_vec());
/// let b = IoData::from_vec(b"world".to_vec());
/// let ab = a.concat(&b); // no bytes copied
/// assert_eq!(ab.num_fragments(), 2);
/// assert!(ab.eq_bytes(b"hello, world"));
/// let (hello, rest) = ab.split_at(5);
/// assert!(hello.eq_bytes(b"hello"));
/// assert!(rest.slice(2..).eq_bytes(b"world"));
/// ```
#[derive(Clone, Default)]
pub struct IoData {
    // `None` exactly when `len == 0`. The deque is always contiguous (its second
    // `as_slices` half is empty), holds no empty fragments, and its lengths sum to `len`.
    frags: Option<Arc<VecDeque<Fragment>>>,
    len: usize,
}

impl IoData {
    /// The empty `IoData`. Does not allocate.
    pub const fn new() -> IoData {
        IoData {
            frags: None,
            len: 0,
        }
    }

    /// The empty `IoData` (same as [`IoData::new`]).
    pub const fn empty() -> IoData {
        IoData::new()
    }

    /// An `IoData` of one fragment covering the whole segment. If this is the only
    /// reference to the segment, the segment is frozen (made read-only) first.
    pub fn from_segment(mut seg: Arc<Segment>) -> IoData {
        if let Some(s) = Arc::get_mut(&mut seg) {
            s.freeze();
        }
        IoData::from_fragments([Fragment::whole(seg)])
    }

    /// Wraps a heap vector without copying it.
    pub fn from_vec(v: Vec<u8>) -> IoData {
        let mut seg = Segment::from_vec(v);
        seg.freeze();
        IoData::from_fragments([Fragment::whole(Arc::new(seg))])
    }

    /// An `IoData` made of the given fragments in order. Empty fragments are dropped, and
    /// adjacent windows of the same segment are merged into one fragment.
    pub fn from_fragments(frags: impl IntoIterator<Item = Fragment>) -> IoData {
        let frags = frags.into_iter();
        let mut list = VecDeque::with_capacity(frags.size_hint().0);
        for f in frags {
            push_frag(&mut list, f);
        }
        IoData::from_list(list)
    }

    /// Builds from a list that holds no empty fragments and is contiguous.
    fn from_list(list: VecDeque<Fragment>) -> IoData {
        let len = list.iter().map(|f| f.len).sum();
        if len == 0 {
            return IoData::new();
        }
        debug_assert!(list.as_slices().1.is_empty());
        IoData {
            frags: Some(Arc::new(list)),
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The fragments, in order (the "retrieve" operation). None of them is empty.
    pub fn fragments(&self) -> &[Fragment] {
        match &self.frags {
            Some(list) => {
                let (head, tail) = list.as_slices();
                debug_assert!(tail.is_empty());
                head
            }
            None => &[],
        }
    }

    /// Number of fragments.
    pub fn num_fragments(&self) -> usize {
        self.fragments().len()
    }

    /// The bytes of each fragment, in order.
    pub fn chunks(&self) -> impl ExactSizeIterator<Item = &[u8]> + DoubleEndedIterator + '_ {
        self.fragments().iter().map(Fragment::as_slice)
    }

    /// Every byte, in order.
    pub fn iter_bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.chunks().flat_map(|c| c.iter().copied())
    }

    /// A cursor over these bytes that borrows `self` instead of consuming it; implements
    /// [`io::Read`], [`io::BufRead`] and [`bytes::Buf`], and moves only its own position.
    ///
    /// (Not called `reader`: with `Buf` in scope, `data.reader()` resolves to the consuming
    /// `Buf::reader(self)` before any `&self` method.)
    pub fn cursor(&self) -> IoDataReader<'_> {
        IoDataReader {
            frags: self.fragments(),
            idx: 0,
            off: 0,
            remaining: self.len,
        }
    }

    /// Resolves a range against `len`; `None` if it is out of bounds or decreasing.
    fn bounds<R: RangeBounds<usize>>(&self, range: &R) -> Option<(usize, usize)> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.checked_add(1)?,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1)?,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        (start <= end && end <= self.len).then_some((start, end))
    }

    /// Bytes `[a, b)` as a new list; `a <= b <= len`.
    fn window(&self, a: usize, b: usize) -> IoData {
        if a == b {
            return IoData::new();
        }
        if a == 0 && b == self.len {
            return self.clone();
        }
        let mut list = VecDeque::new();
        let mut pos = 0;
        for f in self.fragments() {
            let (fs, fe) = (pos, pos + f.len);
            pos = fe;
            if fe <= a {
                continue;
            }
            if fs >= b {
                break;
            }
            let lo = a.max(fs) - fs;
            let hi = b.min(fe) - fs;
            list.push_back(f.sub(lo, hi - lo));
        }
        IoData {
            frags: Some(Arc::new(list)),
            len: b - a,
        }
    }

    /// The bytes in `range` (the "clip" operation), sharing memory with `self`, or `None`
    /// if the range is out of bounds.
    pub fn try_slice(&self, range: impl RangeBounds<usize>) -> Option<IoData> {
        let (a, b) = self.bounds(&range)?;
        Some(self.window(a, b))
    }

    /// The bytes in `range` (the "clip" operation), sharing memory with `self`.
    ///
    /// # Panics
    /// If the range is out of bounds or decreasing, like slice indexing.
    #[track_caller]
    pub fn slice(&self, range: impl RangeBounds<usize>) -> IoData {
        match self.bounds(&range) {
            Some((a, b)) => self.window(a, b),
            None => out_of_bounds(&range, self.len),
        }
    }

    /// Splits into `[0, at)` and `[at, len)`, both sharing memory with `self`.
    ///
    /// # Panics
    /// If `at > len`.
    #[track_caller]
    pub fn split_at(&self, at: usize) -> (IoData, IoData) {
        self.check_at(at);
        (self.window(0, at), self.window(at, self.len))
    }

    /// Removes and returns bytes `[0, at)`; `self` keeps `[at, len)`.
    ///
    /// # Panics
    /// If `at > len`.
    #[track_caller]
    pub fn split_to(&mut self, at: usize) -> IoData {
        self.check_at(at);
        let front = self.window(0, at);
        self.consume(at);
        front
    }

    /// Removes and returns bytes `[at, len)`; `self` keeps `[0, at)`.
    ///
    /// # Panics
    /// If `at > len`.
    #[track_caller]
    pub fn split_off(&mut self, at: usize) -> IoData {
        self.check_at(at);
        let back = self.window(at, self.len);
        self.truncate(at);
        back
    }

    #[track_caller]
    fn check_at(&self, at: usize) {
        assert!(
            at <= self.len,
            "split point {at} out of bounds for IoData of length {}",
            self.len
        );
    }

    /// Shortens to the first `len` bytes; does nothing if `len >= self.len()`.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if len == 0 {
            *self = IoData::new();
            return;
        }
        let Some(list) = self.frags.as_mut().and_then(Arc::get_mut) else {
            *self = self.window(0, len);
            return;
        };
        let mut cut = self.len - len;
        while let Some(last) = list.back_mut() {
            if last.len > cut {
                last.len -= cut;
                break;
            }
            cut -= last.len;
            list.pop_back();
        }
        self.len = len;
    }

    /// Drops the first `cnt` bytes (`cnt <= len`), in place when the list is not shared.
    fn consume(&mut self, cnt: usize) {
        if cnt == 0 {
            return;
        }
        if cnt == self.len {
            *self = IoData::new();
            return;
        }
        let Some(list) = self.frags.as_mut().and_then(Arc::get_mut) else {
            *self = self.window(cnt, self.len);
            return;
        };
        let mut cut = cnt;
        while let Some(first) = list.front_mut() {
            if first.len > cut {
                first.off += cut;
                first.len -= cut;
                break;
            }
            cut -= first.len;
            list.pop_front();
        }
        self.len -= cnt;
    }

    /// `self` followed by `other` (the "concatenate" operation), sharing memory with both.
    pub fn concat(&self, other: &IoData) -> IoData {
        if self.is_empty() {
            return other.clone();
        }
        if other.is_empty() {
            return self.clone();
        }
        let mut list = VecDeque::with_capacity(self.num_fragments() + other.num_fragments());
        for f in self.fragments().iter().chain(other.fragments()) {
            push_frag(&mut list, f.clone());
        }
        IoData {
            frags: Some(Arc::new(list)),
            len: self.len + other.len,
        }
    }

    /// All the given `IoData`s one after another, sharing their memory.
    pub fn concat_all(parts: impl IntoIterator<Item = IoData>) -> IoData {
        let mut out = IoData::new();
        for p in parts {
            out.append(p);
        }
        out
    }

    /// Appends `other` to `self`, in place when `self`'s list is not shared.
    pub fn append(&mut self, other: IoData) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = other;
            return;
        }
        let total = self.len + other.len;
        if self.frags.as_mut().and_then(Arc::get_mut).is_none() {
            self.frags = Some(Arc::new(self.fragments().iter().cloned().collect()));
        }
        let list = self
            .frags
            .as_mut()
            .and_then(Arc::get_mut)
            .expect("list was just made unique");
        let theirs = other.frags.expect("non-empty IoData has a list");
        match Arc::try_unwrap(theirs) {
            Ok(owned) => owned.into_iter().for_each(|f| push_frag(list, f)),
            Err(shared) => shared.iter().for_each(|f| push_frag(list, f.clone())),
        }
        list.make_contiguous();
        self.len = total;
    }

    /// Copies all bytes into a new vector. This is the copying escape hatch for code that
    /// needs contiguous memory; it costs one pass over the payload.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        v
    }

    /// Copies the bytes in `range` into `dst` (which must have exactly the range's length).
    ///
    /// Named so as not to collide with [`Buf::copy_to_slice`], which consumes.
    ///
    /// # Panics
    /// If the range is out of bounds or `dst.len()` differs from its length.
    #[track_caller]
    pub fn copy_range_to_slice(&self, range: impl RangeBounds<usize>, dst: &mut [u8]) {
        let Some((a, b)) = self.bounds(&range) else {
            out_of_bounds(&range, self.len)
        };
        assert_eq!(
            dst.len(),
            b - a,
            "destination length differs from range length"
        );
        let mut pos = 0;
        let mut out = 0;
        for c in self.chunks() {
            let (cs, ce) = (pos, pos + c.len());
            pos = ce;
            if ce <= a {
                continue;
            }
            if cs >= b {
                break;
            }
            let lo = a.max(cs) - cs;
            let hi = b.min(ce) - cs;
            dst[out..out + hi - lo].copy_from_slice(&c[lo..hi]);
            out += hi - lo;
        }
    }

    /// True if the bytes equal `other`, whatever the fragmentation.
    pub fn eq_bytes(&self, other: &[u8]) -> bool {
        if self.len != other.len() {
            return false;
        }
        let mut rest = other;
        for c in self.chunks() {
            let (head, tail) = rest.split_at(c.len());
            if head != c {
                return false;
            }
            rest = tail;
        }
        true
    }

    /// Write-protects the originator's pages behind this aggregate until every
    /// receiver has released them (the thesis's *secured* fbufs): after this, a write by
    /// the originating domain to those pages faults instead of changing bytes a receiver
    /// may be reading. Only fbufs of the calling domain are affected; other memory is
    /// left alone. Paths made with `PathConfig { secure: true, .. }` do this on send.
    ///
    /// Costs one `mprotect(2)` per fbuf now and one when it is released.
    pub fn secure(&self) -> Result<()> {
        for f in self.fragments() {
            f.segment().secure()?;
        }
        Ok(())
    }

    /// Iterates over consecutive `n`-byte application units (the last may be shorter).
    ///
    /// A unit that lies inside one fragment is returned as [`Cow::Borrowed`] without
    /// copying; only a unit that straddles fragments is copied into a [`Cow::Owned`]
    /// vector. [`Units::borrowed_units`] and [`Units::copied_units`] count the two cases.
    ///
    /// # Panics
    /// If `n == 0`.
    #[track_caller]
    pub fn units(&self, n: usize) -> Units<'_> {
        assert!(n > 0, "unit size must be positive");
        Units {
            frags: self.fragments(),
            idx: 0,
            off: 0,
            remaining: self.len,
            unit: n,
            borrowed: 0,
            copied: 0,
            copied_bytes: 0,
        }
    }

    /// Reads `self` and writes a new aggregate (the "mutate" operation).
    ///
    /// Calls `alloc(self.len())` to get the new aggregate's memory — a path allocator of
    /// fbufs, or `|n| Ok(IoDataMut::with_capacity_heap(n))` — then `f(self, &mut out)` to
    /// fill it, and returns the frozen result. `f` may [`IoDataMut::truncate`] the output
    /// if the result is shorter; bytes it does not write keep the allocator's contents.
    /// `self` is unchanged.
    ///
    /// # Errors
    /// Whatever `alloc` or `f` returns; [`Error::InvalidArgument`] if `alloc` returns a
    /// buffer shorter than requested (a longer one is truncated).
    pub fn mutate<A, F>(&self, alloc: A, f: F) -> Result<IoData>
    where
        A: FnOnce(usize) -> Result<IoDataMut>,
        F: FnOnce(&IoData, &mut IoDataMut) -> Result<()>,
    {
        let mut out = alloc_exact(alloc, self.len)?;
        f(self, &mut out)?;
        Ok(out.freeze())
    }

    /// A same-length [`mutate`](IoData::mutate) driven by pointer pairs: `f(src, dst)` is
    /// called for consecutive, equal-length pieces of `self` and of the new aggregate
    /// (`src` in a source fragment, `dst` in a target buffer), covering every byte once.
    /// Suits byte-wise transformations (masking, XOR ciphers, case folding).
    ///
    /// # Errors
    /// As for [`mutate`](IoData::mutate).
    pub fn mutate_pairs<A, F>(&self, alloc: A, mut f: F) -> Result<IoData>
    where
        A: FnOnce(usize) -> Result<IoDataMut>,
        F: FnMut(&[u8], &mut [u8]),
    {
        let mut out = alloc_exact(alloc, self.len)?;
        let mut src = self.chunks();
        let mut s: &[u8] = &[];
        for mut d in out.fragments_mut() {
            while !d.is_empty() {
                if s.is_empty() {
                    s = src.next().expect("source and target lengths agree");
                }
                let k = s.len().min(d.len());
                let (dh, dt) = std::mem::take(&mut d).split_at_mut(k);
                f(&s[..k], dh);
                s = &s[k..];
                d = dt;
            }
        }
        Ok(out.freeze())
    }
}

#[cold]
#[track_caller]
fn out_of_bounds<R: RangeBounds<usize>>(range: &R, len: usize) -> ! {
    panic!(
        "range ({:?}, {:?}) out of bounds for IoData of length {len}",
        range.start_bound(),
        range.end_bound()
    )
}

/// Calls `alloc(len)` and checks/trims the result to exactly `len` bytes.
fn alloc_exact(alloc: impl FnOnce(usize) -> Result<IoDataMut>, len: usize) -> Result<IoDataMut> {
    let mut out = alloc(len)?;
    if out.len() < len {
        return Err(Error::InvalidArgument(
            "allocator returned a buffer shorter than requested",
        ));
    }
    out.truncate(len);
    Ok(out)
}

impl fmt::Debug for IoData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoData")
            .field("len", &self.len)
            .field("fragments", &self.num_fragments())
            .finish()
    }
}

impl PartialEq for IoData {
    /// Compares bytes, whatever the fragmentation of either side.
    fn eq(&self, other: &IoData) -> bool {
        if self.len != other.len {
            return false;
        }
        let mut a = self.chunks();
        let mut b = other.chunks();
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            if x.is_empty() {
                match a.next() {
                    Some(c) => x = c,
                    None => return true, // equal lengths: `b` is exhausted too
                }
            }
            if y.is_empty() {
                y = b.next().expect("equal lengths");
            }
            let k = x.len().min(y.len());
            if x[..k] != y[..k] {
                return false;
            }
            x = &x[k..];
            y = &y[k..];
        }
    }
}

impl Eq for IoData {}

impl PartialEq<[u8]> for IoData {
    fn eq(&self, other: &[u8]) -> bool {
        self.eq_bytes(other)
    }
}

impl From<Vec<u8>> for IoData {
    fn from(v: Vec<u8>) -> IoData {
        IoData::from_vec(v)
    }
}

impl From<Arc<Segment>> for IoData {
    fn from(seg: Arc<Segment>) -> IoData {
        IoData::from_segment(seg)
    }
}

impl From<IoDataMut> for IoData {
    fn from(m: IoDataMut) -> IoData {
        m.freeze()
    }
}

impl FromIterator<IoData> for IoData {
    fn from_iter<I: IntoIterator<Item = IoData>>(iter: I) -> IoData {
        IoData::concat_all(iter)
    }
}

impl Extend<IoData> for IoData {
    fn extend<I: IntoIterator<Item = IoData>>(&mut self, iter: I) {
        for d in iter {
            self.append(d);
        }
    }
}

impl Buf for IoData {
    fn remaining(&self) -> usize {
        self.len
    }

    /// The unread bytes of the first fragment.
    fn chunk(&self) -> &[u8] {
        self.fragments().first().map_or(&[], Fragment::as_slice)
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, c) in dst.iter_mut().zip(self.chunks()) {
            *slot = IoSlice::new(c);
            n += 1;
        }
        n
    }

    /// # Panics
    /// If `cnt > self.remaining()`.
    fn advance(&mut self, cnt: usize) {
        assert!(
            cnt <= self.len,
            "cannot advance {cnt} bytes past the end of {} bytes",
            self.len
        );
        self.consume(cnt);
    }

    /// Without copying when the bytes lie in the first fragment (the returned `Bytes`
    /// then keeps that segment alive); copies otherwise.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.len,
            "cannot take {len} bytes from {} bytes",
            self.len
        );
        if len == 0 {
            return Bytes::new();
        }
        let first = &self.fragments()[0];
        let out = if first.len >= len {
            Bytes::from_owner(first.sub(0, len))
        } else {
            let mut v = vec![0; len];
            self.copy_range_to_slice(..len, &mut v);
            Bytes::from(v)
        };
        self.consume(len);
        out
    }
}

impl io::Read for IoData {
    /// Copies up to `buf.len()` bytes out of the front and consumes them.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.len);
        self.copy_range_to_slice(..n, &mut buf[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl io::BufRead for IoData {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        Ok(Buf::chunk(&*self))
    }

    fn consume(&mut self, amt: usize) {
        self.advance(amt);
    }
}

// ---------------------------------------------------------------------------------------
// Units
// ---------------------------------------------------------------------------------------

/// Iterator over consecutive fixed-size units of an [`IoData`]; see [`IoData::units`].
#[derive(Clone, Debug)]
pub struct Units<'a> {
    frags: &'a [Fragment],
    idx: usize,
    off: usize,
    remaining: usize,
    unit: usize,
    borrowed: usize,
    copied: usize,
    copied_bytes: usize,
}

impl Units<'_> {
    /// Units returned so far without copying (inside one fragment).
    pub fn borrowed_units(&self) -> usize {
        self.borrowed
    }

    /// Units returned so far that straddled fragments and were copied.
    pub fn copied_units(&self) -> usize {
        self.copied
    }

    /// Payload bytes copied so far.
    pub fn copied_bytes(&self) -> usize {
        self.copied_bytes
    }

    /// Moves the position `k` bytes forward inside the current fragment.
    fn step(&mut self, k: usize) {
        self.off += k;
        self.remaining -= k;
        if self.off == self.frags[self.idx].len {
            self.idx += 1;
            self.off = 0;
        }
    }
}

impl<'a> Iterator for Units<'a> {
    type Item = Cow<'a, [u8]>;

    fn next(&mut self) -> Option<Cow<'a, [u8]>> {
        if self.remaining == 0 {
            return None;
        }
        let want = self.unit.min(self.remaining);
        let frag: &'a [u8] = self.frags[self.idx].as_slice();
        if frag.len() - self.off >= want {
            let unit = &frag[self.off..self.off + want];
            self.step(want);
            self.borrowed += 1;
            return Some(Cow::Borrowed(unit));
        }
        let mut v = Vec::with_capacity(want);
        while v.len() < want {
            let frag: &'a [u8] = self.frags[self.idx].as_slice();
            let k = (frag.len() - self.off).min(want - v.len());
            v.extend_from_slice(&frag[self.off..self.off + k]);
            self.step(k);
        }
        self.copied += 1;
        self.copied_bytes += want;
        Some(Cow::Owned(v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining.div_ceil(self.unit);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Units<'_> {}
impl FusedIterator for Units<'_> {}

// ---------------------------------------------------------------------------------------
// IoDataReader
// ---------------------------------------------------------------------------------------

/// A non-consuming reader over a borrowed [`IoData`]; see [`IoData::cursor`].
///
/// Implements [`io::Read`], [`io::BufRead`] and [`bytes::Buf`]; reading moves only the
/// reader's position, never touching the `IoData`.
#[derive(Clone, Debug)]
pub struct IoDataReader<'a> {
    frags: &'a [Fragment],
    idx: usize,
    off: usize,
    remaining: usize,
}

impl<'a> IoDataReader<'a> {
    /// Bytes not yet read.
    pub fn remaining_len(&self) -> usize {
        self.remaining
    }

    fn current(&self) -> &'a [u8] {
        match self.frags.get(self.idx) {
            Some(f) => &f.as_slice()[self.off..],
            None => &[],
        }
    }

    fn skip(&mut self, mut cnt: usize) {
        assert!(
            cnt <= self.remaining,
            "cannot advance past the end of the data"
        );
        self.remaining -= cnt;
        while cnt > 0 {
            let avail = self.frags[self.idx].len - self.off;
            if cnt < avail {
                self.off += cnt;
                return;
            }
            cnt -= avail;
            self.idx += 1;
            self.off = 0;
        }
    }
}

impl io::Read for IoDataReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() && self.remaining > 0 {
            let c = self.current();
            let k = c.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&c[..k]);
            self.skip(k);
            n += k;
        }
        Ok(n)
    }
}

impl io::BufRead for IoDataReader<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        Ok(self.current())
    }

    fn consume(&mut self, amt: usize) {
        self.skip(amt);
    }
}

impl Buf for IoDataReader<'_> {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.current()
    }

    fn chunks_vectored<'b>(&'b self, dst: &mut [IoSlice<'b>]) -> usize {
        if dst.is_empty() || self.remaining == 0 {
            return 0;
        }
        dst[0] = IoSlice::new(self.current());
        let rest = self.frags[self.idx + 1..].iter().map(Fragment::as_slice);
        let mut n = 1;
        for (slot, c) in dst[1..].iter_mut().zip(rest) {
            *slot = IoSlice::new(c);
            n += 1;
        }
        n
    }

    fn advance(&mut self, cnt: usize) {
        self.skip(cnt);
    }
}

// ---------------------------------------------------------------------------------------
// IoDataMut
// ---------------------------------------------------------------------------------------

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
    segs: Vec<Segment>,
    len: usize,
    // Write cursor for `io::Write`/`BufMut`: byte position, and the same position as a
    // segment index and offset within that segment.
    pos: usize,
    cur_seg: usize,
    cur_off: usize,
}

impl IoDataMut {
    /// A buffer of `len` bytes over the given segments, used in order (the segments may
    /// hold more than `len` bytes in total; the excess is dropped on freeze).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a segment is not writable or the segments hold fewer
    /// than `len` bytes.
    pub fn from_segments(mut segs: Vec<Segment>, len: usize) -> Result<IoDataMut> {
        let mut total = 0usize;
        for s in &mut segs {
            if s.as_mut_slice().is_none() {
                return Err(Error::InvalidArgument("segment is not writable"));
            }
            total = total.saturating_add(s.len());
        }
        if total < len {
            return Err(Error::InvalidArgument(
                "segments are shorter than the requested length",
            ));
        }
        Ok(IoDataMut {
            segs,
            len,
            pos: 0,
            cur_seg: 0,
            cur_off: 0,
        })
    }

    /// A zeroed buffer of `len` bytes in one heap segment.
    pub fn with_capacity_heap(len: usize) -> IoDataMut {
        IoDataMut {
            segs: vec![Segment::from_vec(vec![0; len])],
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
                let sl = s.as_mut_slice().expect("IoDataMut segments are writable");
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
            frag[lo..hi].copy_from_slice(&data[written..written + hi - lo]);
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
        let mut rem = self.len;
        let mut list = VecDeque::with_capacity(self.segs.len());
        for mut seg in self.segs {
            if rem == 0 {
                break;
            }
            let n = seg.len().min(rem);
            if n == 0 {
                continue;
            }
            rem -= n;
            seg.freeze();
            list.push_back(Fragment {
                seg: Arc::new(seg),
                off: 0,
                len: n,
            });
        }
        IoData::from_list(list)
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
        let sl = self.segs[self.cur_seg]
            .as_mut_slice()
            .expect("IoDataMut segments are writable");
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

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read, Write};

    fn n(big: usize, small: usize) -> usize {
        if cfg!(miri) {
            small
        } else {
            big
        }
    }

    /// Bytes 0..len (mod 251) split into pieces of the given sizes, each its own vector.
    fn pieces(sizes: &[usize]) -> (IoData, Vec<u8>) {
        let total: usize = sizes.iter().sum();
        let model: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut at = 0;
        let parts = sizes.iter().map(|&s| {
            let p = IoData::from_vec(model[at..at + s].to_vec());
            at += s;
            p
        });
        (IoData::concat_all(parts.collect::<Vec<_>>()), model)
    }

    #[test]
    fn types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<IoData>();
        check::<IoDataMut>();
        check::<Fragment>();
        check::<IoDataReader<'_>>();
        check::<Units<'_>>();
    }

    #[test]
    fn empty_has_no_fragments() {
        let e = IoData::new();
        assert!(e.is_empty());
        assert_eq!(e.num_fragments(), 0);
        assert_eq!(e.chunk(), &[] as &[u8]);
        assert_eq!(e, IoData::from_vec(Vec::new()));
        assert_eq!(IoData::from_vec(Vec::new()).num_fragments(), 0);
        assert_eq!(format!("{e:?}"), "IoData { len: 0, fragments: 0 }");
    }

    #[test]
    fn from_vec_does_not_copy() {
        let v = vec![1u8, 2, 3, 4];
        let p = v.as_ptr();
        let d = IoData::from_vec(v);
        assert_eq!(d.fragments()[0].as_slice().as_ptr(), p);
        assert!(d.fragments()[0].lot_span().is_none());
        assert_eq!(d.fragments()[0].offset(), 0);
        assert!(d.eq_bytes(&[1, 2, 3, 4]));
    }

    #[test]
    fn slice_split_concat_share_memory() {
        let (d, model) = pieces(&[3, 5, 7]);
        assert_eq!(d.num_fragments(), 3);
        for a in 0..=model.len() {
            for b in a..=model.len() {
                let s = d.slice(a..b);
                assert!(s.eq_bytes(&model[a..b]), "{a}..{b}");
                assert!(s.fragments().iter().all(|f| !f.is_empty()));
            }
            let (x, y) = d.split_at(a);
            assert_eq!(x.concat(&y), d);
            assert!(x.eq_bytes(&model[..a]) && y.eq_bytes(&model[a..]));
        }
        // A window inside the middle fragment points into it.
        let mid = d.slice(4..6);
        assert_eq!(mid.num_fragments(), 1);
        assert_eq!(mid.fragments()[0].offset(), 1);
        assert_eq!(
            mid.fragments()[0].as_slice().as_ptr(),
            d.fragments()[1].as_slice()[1..].as_ptr()
        );
    }

    #[test]
    fn adjacent_windows_coalesce() {
        let (d, _) = pieces(&[10]);
        let (a, b) = d.split_at(4);
        let back = a.concat(&b);
        assert_eq!(back.num_fragments(), 1);
        assert_eq!(back, d);
    }

    #[test]
    fn out_of_range() {
        let (d, _) = pieces(&[2, 2]);
        assert!(d.try_slice(0..5).is_none());
        assert!(d.try_slice(std::ops::Range { start: 3, end: 2 }).is_none());
        assert!(d.try_slice(..=4).is_none());
        assert!(d.try_slice(4..).unwrap().is_empty());
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.slice(1..9))).is_err());
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| d.split_at(5))).is_err());
    }

    #[test]
    fn split_to_split_off_truncate_append() {
        let (mut d, model) = pieces(&[3, 4, 5]);
        let shared = d.clone();
        let front = d.split_to(5);
        assert!(front.eq_bytes(&model[..5]));
        assert!(d.eq_bytes(&model[5..]));
        let back = d.split_off(3);
        assert!(d.eq_bytes(&model[5..8]));
        assert!(back.eq_bytes(&model[8..]));
        d.append(back);
        assert!(d.eq_bytes(&model[5..]));
        d.truncate(100);
        d.truncate(2);
        assert!(d.eq_bytes(&model[5..7]));
        // The clone taken first is unaffected.
        assert!(shared.eq_bytes(&model));
        let mut e = IoData::new();
        e.append(shared.clone());
        e.append(shared.clone());
        assert_eq!(e.len(), 2 * model.len());
        assert_eq!(IoData::from_iter([front, shared.slice(5..)]), shared);
    }

    #[test]
    fn clone_is_shared_and_advance_copies_only_the_list() {
        let (d, model) = pieces(&[4, 4, 4]);
        let mut c = d.clone();
        assert!(Arc::ptr_eq(
            d.frags.as_ref().unwrap(),
            c.frags.as_ref().unwrap()
        ));
        c.advance(6);
        assert!(c.eq_bytes(&model[6..]));
        assert!(d.eq_bytes(&model));
        assert_eq!(
            c.fragments()[0].as_slice().as_ptr(),
            d.fragments()[1].as_slice()[2..].as_ptr()
        );
        // Now unique: advancing again works in place and releases consumed segments.
        let seg0 = Arc::clone(c.fragments()[0].segment());
        let before = Arc::strong_count(&seg0);
        c.advance(2);
        assert_eq!(Arc::strong_count(&seg0), before - 1);
    }

    #[test]
    fn buf_reads_across_fragments() {
        let mut d = IoData::concat_all([
            IoData::from_vec(vec![0x12, 0x34]),
            IoData::from_vec(vec![0x56, 0x78, 0xaa]),
            IoData::from_vec(vec![0xbb, 1, 2, 3, 4, 5]),
        ]);
        assert_eq!(d.chunk(), &[0x12, 0x34]);
        let mut slots = [IoSlice::new(&[]); 8];
        assert_eq!(d.chunks_vectored(&mut slots), 3);
        assert_eq!(&*slots[1], &[0x56, 0x78, 0xaa]);
        assert_eq!(d.get_u32(), 0x1234_5678);
        assert_eq!(d.get_u16(), 0xaabb);
        let b = d.copy_to_bytes(2);
        assert_eq!(&b[..], &[1, 2]);
        assert_eq!(d.remaining(), 3);
        let mut r = d.cursor();
        assert_eq!(r.get_u8(), 3);
        assert_eq!(d.remaining(), 3);
        let mut rest = Vec::new();
        d.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, [3, 4, 5]);
        assert!(d.is_empty());
    }

    #[test]
    fn copy_to_bytes_is_zero_copy_within_a_fragment() {
        let (mut d, model) = pieces(&[8, 8]);
        let p = d.fragments()[0].as_slice().as_ptr();
        let b = d.copy_to_bytes(6);
        assert_eq!(b.as_ptr(), p);
        assert_eq!(&b[..], &model[..6]);
        let c = d.copy_to_bytes(4); // straddles: copied
        assert_eq!(&c[..], &model[6..10]);
        drop(d);
        assert_eq!(&b[..], &model[..6]); // `b` keeps its segment alive
    }

    #[test]
    fn read_and_bufread() {
        let (mut d, model) = pieces(&[3, 1, 6]);
        let mut buf = [0u8; 5];
        assert_eq!(d.read(&mut buf).unwrap(), 5);
        assert_eq!(buf, model[..5]);
        assert_eq!(d.fill_buf().unwrap(), &model[5..10]);
        BufRead::consume(&mut d, 2);
        let mut rest = Vec::new();
        d.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, model[7..]);
        assert_eq!(d.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn reader_does_not_consume() {
        let (d, model) = pieces(&[2, 3, 4]);
        let mut r = d.cursor();
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        assert_eq!(v, model);
        assert_eq!(d.len(), 9);
        let mut r = d.cursor();
        r.advance(3);
        assert_eq!(r.fill_buf().unwrap(), &model[3..5]);
        let mut slots = [IoSlice::new(&[]); 4];
        assert_eq!(r.chunks_vectored(&mut slots), 2);
        assert_eq!(&*slots[0], &model[3..5]);
        let mut lines = IoData::concat_all([
            IoData::from_vec(b"ab\nc".to_vec()),
            IoData::from_vec(b"d\n".to_vec()),
        ])
        .cursor()
        .lines()
        .map(|l| l.unwrap())
        .collect::<Vec<_>>();
        lines.reverse();
        assert_eq!(lines, ["cd", "ab"]);
    }

    #[test]
    fn units_borrow_inside_fragments() {
        let (d, model) = pieces(&[8, 6, 7]);
        let mut u = d.units(4);
        assert_eq!(u.len(), 6);
        let got: Vec<Cow<'_, [u8]>> = u.by_ref().collect();
        for (i, unit) in got.iter().enumerate() {
            // Only bytes 12..16 straddle (fragment 1 is 8..14).
            assert_eq!(matches!(unit, Cow::Borrowed(_)), i != 3, "unit {i}");
        }
        assert_eq!(got[5].len(), 1);
        assert_eq!(u.borrowed_units(), 5);
        assert_eq!(u.copied_units(), 1);
        assert_eq!(u.copied_bytes(), 4);
        assert_eq!(got.concat(), model);
        // Borrowed units point into the fragments, not into copies.
        assert_eq!(got[2].as_ptr(), d.fragments()[1].as_slice().as_ptr());
        for size in 1..=n(23, 7) {
            assert_eq!(
                d.units(size)
                    .flat_map(|c| c.into_owned())
                    .collect::<Vec<_>>(),
                model
            );
        }
    }

    #[test]
    fn mutate_writes_new_memory() {
        let (d, model) = pieces(&[5, 6]);
        let heap = |len| Ok(IoDataMut::with_capacity_heap(len));
        let up = d
            .mutate(heap, |src, out| {
                let mut r = src.cursor();
                let mut tmp = vec![0; src.len()];
                r.read_exact(&mut tmp).unwrap();
                tmp.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                out.fill_from(&tmp);
                out.truncate(10);
                Ok(())
            })
            .unwrap();
        let want: Vec<u8> = model[..10].iter().map(|b| b.wrapping_add(1)).collect();
        assert!(up.eq_bytes(&want));
        assert!(d.eq_bytes(&model));

        // Pairs: a target split into two segments of different sizes than the source.
        let two = |len: usize| {
            IoDataMut::from_segments(
                vec![
                    Segment::from_vec(vec![0; 3]),
                    Segment::from_vec(vec![0; len]),
                ],
                len,
            )
        };
        let mut calls = 0;
        let x = d
            .mutate_pairs(two, |s, t| {
                calls += 1;
                assert_eq!(s.len(), t.len());
                for (a, b) in s.iter().zip(t) {
                    *b = a ^ 0xff;
                }
            })
            .unwrap();
        assert_eq!(calls, 3); // [0,3) [3,5) [5,11)
        assert_eq!(
            x.to_vec(),
            model.iter().map(|b| b ^ 0xff).collect::<Vec<_>>()
        );
        assert_eq!(x.num_fragments(), 2);

        let short = |_| Ok(IoDataMut::with_capacity_heap(1));
        assert!(matches!(
            d.mutate(short, |_, _| Ok(())),
            Err(Error::InvalidArgument(_))
        ));
        let failing = d.mutate(heap, |_, _| Err(Error::Timeout));
        assert!(matches!(failing, Err(Error::Timeout)));
    }

    #[test]
    fn iodatamut_write_paths() {
        let segs = vec![
            Segment::from_vec(vec![0; 2]),
            Segment::from_vec(vec![]),
            Segment::from_vec(vec![0; 5]),
        ];
        let mut m = IoDataMut::from_segments(segs, 6).unwrap();
        assert_eq!(
            m.fragments_mut().map(|f| f.len()).collect::<Vec<_>>(),
            [2, 4]
        );
        m.put_u8(1);
        m.put_u16(0x0203);
        assert_eq!(m.position(), 3);
        assert_eq!(m.write(&[4, 5, 6, 7]).unwrap(), 3);
        assert_eq!(m.write(&[8]).unwrap(), 0);
        assert_eq!(m.remaining_mut(), 0);
        assert!(m.chunk_mut().len() == 0);
        m.write_at(1, &[9, 9]);
        let d = m.freeze();
        assert!(d.eq_bytes(&[1, 9, 9, 4, 5, 6]));
        assert_eq!(d.num_fragments(), 2);
        assert!(d
            .fragments()
            .iter()
            .all(|f| f.segment().as_slice().as_ptr() == f.as_slice().as_ptr()));

        let mut frozen = Segment::from_vec(vec![0; 4]);
        frozen.freeze();
        assert!(IoDataMut::from_segments(vec![frozen], 4).is_err());
        assert!(IoDataMut::from_segments(vec![Segment::from_vec(vec![0; 3])], 4).is_err());

        let mut h = IoDataMut::with_capacity_heap(4);
        h.fill_from(b"ab");
        h.write_all(b"cd").unwrap();
        assert!(h.write_all(b"e").is_err());
        assert!(IoData::from(h).eq_bytes(b"abcd"));
    }

    #[test]
    fn frozen_segments_are_read_only() {
        let d = IoDataMut::with_capacity_heap(3).freeze();
        let f = d.fragments()[0].clone();
        drop(d);
        let mut seg = Arc::clone(f.segment());
        drop(f);
        assert!(Arc::get_mut(&mut seg).unwrap().as_mut_slice().is_none());
    }

    #[test]
    fn equality_ignores_fragmentation() {
        let (a, model) = pieces(&[1, 2, 3, 4]);
        let (b, _) = pieces(&[4, 3, 2, 1]);
        let (c, _) = pieces(&[10]);
        assert_eq!(a, b);
        assert_eq!(b, c);
        assert!(a == *model.as_slice());
        assert_ne!(a, a.slice(1..));
        assert_ne!(a.slice(..9), b.slice(1..));
        assert_eq!(a.iter_bytes().collect::<Vec<_>>(), model);
        let mut dst = [0u8; 4];
        a.copy_range_to_slice(2..6, &mut dst);
        assert_eq!(dst, model[2..6]);
    }

    #[test]
    fn lot_span_adds_offset() {
        use crate::segment::LotId;
        let lot = LotId {
            slot: 3,
            generation: 7,
        };
        let mut v = vec![0u8; 16];
        let ptr = std::ptr::NonNull::new(v.as_mut_ptr()).unwrap();
        // SAFETY: `v` is moved into the keeper, which keeps its buffer alive as long as the
        // segment; nothing else touches it.
        let seg = unsafe {
            Segment::from_raw(
                ptr,
                16,
                Some(LotSpan { lot, offset: 4096 }),
                false,
                Arc::new(v),
            )
        };
        let d = IoData::from_segment(Arc::new(seg)).slice(5..9);
        assert_eq!(
            d.fragments()[0].lot_span(),
            Some(LotSpan { lot, offset: 4101 })
        );
    }

    #[test]
    fn many_fragments() {
        let k = n(500, 40);
        let mut d = IoData::concat_all((0..k).map(|i| IoData::from_vec(vec![i as u8; 3])));
        assert_eq!(d.num_fragments(), k);
        let s = d.clone();
        let mut sum = 0usize;
        while d.has_remaining() {
            sum += d.get_u8() as usize;
        }
        assert_eq!(sum, 3 * (0..k).map(|i| i % 256).sum::<usize>());
        assert_eq!(s.len(), 3 * k);
    }
}
