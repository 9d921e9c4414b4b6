//! IoData: immutable, possibly fragmented byte strings that are edited without copying.
//!
//! The operations and their costs are described on [`IoData`].

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use bytes::{Buf, Bytes};

use crate::error::{Error, Result};
use crate::segment::Segment;

mod area;
mod fragment;
mod mutable;
mod reader;
mod shareable;
mod units;

pub use area::{AreaLender, AreaRelease, LotArea};
use fragment::push_frag;
pub use fragment::Fragment;
pub use mutable::IoDataMut;
pub use reader::IoDataReader;
pub use units::Units;

/// An immutable byte string made of zero or more [`Fragment`]s.
///
/// An [`IoData`] is a logical byte string stored as an ordered list of [`Fragment`]s, each a
/// window onto a [`Segment`] (a heap vector, an fbuf of this domain's lot, or a span of
/// another domain's lot). Once built, an `IoData` never changes its bytes; every editing
/// operation — [`clone`](Clone::clone) (share), [`slice`](IoData::slice) (clip),
/// [`split_at`](IoData::split_at), [`concat`](IoData::concat) — produces a new fragment list
/// that points at the same memory. Payload bytes are copied only by the operations that
/// say so ([`IoData::to_vec`], [`IoData::copy_range_to_slice`], [`std::io::Read`], a unit
/// of [`IoData::units`] that straddles two fragments).
///
/// Building new data happens in a separate write phase: an [`IoDataMut`] owns freshly
/// allocated, writable segments; its owner fills them and then [`IoDataMut::freeze`]s it
/// into an `IoData`, after which the memory is read-only. [`IoData::mutate`] combines the
/// two ("read the source, write a new aggregate") with memory from a caller-supplied
/// allocator.
///
/// Consumers that expect contiguous memory or standard traits can read an `IoData` in place:
/// it implements [`bytes::Buf`], [`std::io::Read`] and [`std::io::BufRead`] (all consuming
/// from the front), and [`IoData::cursor`] gives a non-consuming reader over a borrowed
/// `IoData`.
///
/// # Cost model
///
/// The fragment list is reference-counted, so cloning an `IoData` is O(1) (one atomic
/// increment) whatever its size. Operations that produce a different window (`slice`,
/// `split_at`, `concat`) build a new list in O(number of fragments) and never keep
/// segments outside their result alive. Consuming from the front (`Buf::advance`,
/// `Read::read`) and truncating work in place when this `IoData` is the only owner of its
/// list, and release every segment as soon as it has been fully consumed; on a shared list
/// the first such call makes a private copy of the list (not of the payload).
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
    // `Frags::None` exactly when `len == 0`. The fragments are never empty and their
    // lengths sum to `len`; a deque is always contiguous (its second `as_slices` half is
    // empty).
    pub(super) frags: Frags,
    pub(super) len: usize,
}

/// The fragment list of an [`IoData`]. A single fragment (the common case: one fbuf, one
/// received message) is held inline, so that making, sending and receiving such an
/// `IoData` allocates no list; longer lists are a shared deque.
#[derive(Clone, Default)]
pub(super) enum Frags {
    #[default]
    None,
    One(Fragment),
    Many(Arc<VecDeque<Fragment>>),
}

impl Frags {
    fn as_slice(&self) -> &[Fragment] {
        match self {
            Frags::None => &[],
            Frags::One(f) => std::slice::from_ref(f),
            Frags::Many(list) => {
                let (head, tail) = list.as_slices();
                debug_assert!(tail.is_empty());
                head
            }
        }
    }

    /// Appends `f`, merging it into the last fragment when the two are adjacent windows
    /// of the same segment; empty fragments are dropped. A shared deque is copied first
    /// (the list, not the payload).
    fn push(&mut self, f: Fragment) {
        if f.len == 0 {
            return;
        }
        match self {
            Frags::None => *self = Frags::One(f),
            Frags::One(last) => {
                if Arc::ptr_eq(&last.seg, &f.seg) && last.off + last.len == f.off {
                    last.len += f.len;
                    return;
                }
                let Frags::One(first) = std::mem::take(self) else {
                    unreachable!("matched One above")
                };
                let mut list = VecDeque::with_capacity(4);
                list.push_back(first);
                list.push_back(f);
                *self = Frags::Many(Arc::new(list));
            }
            Frags::Many(list) => push_frag(Arc::make_mut(list), f),
        }
    }

    /// Total length of the fragments.
    fn total(&self) -> usize {
        self.as_slice().iter().map(|f| f.len).sum()
    }
}

impl IoData {
    /// The empty `IoData`. Does not allocate.
    pub const fn new() -> IoData {
        IoData {
            frags: Frags::None,
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
        let mut list = Frags::None;
        for f in frags {
            list.push(f);
        }
        IoData::from_frags(list)
    }

    /// An `IoData` of the one fragment `f` (empty if `f` is).
    pub fn from_fragment(f: Fragment) -> IoData {
        if f.len == 0 {
            return IoData::new();
        }
        IoData {
            len: f.len,
            frags: Frags::One(f),
        }
    }

    /// Builds from a list made by [`Frags::push`].
    pub(super) fn from_frags(frags: Frags) -> IoData {
        let len = frags.total();
        IoData { frags, len }
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
        self.frags.as_slice()
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
        let mut list = Frags::None;
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
            list.push(f.sub(lo, hi - lo));
        }
        IoData {
            frags: list,
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
        let list = match &mut self.frags {
            Frags::One(f) => {
                f.len -= self.len - len;
                self.len = len;
                return;
            }
            Frags::Many(list) => Arc::get_mut(list),
            Frags::None => None,
        };
        let Some(list) = list else {
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
        let list = match &mut self.frags {
            Frags::One(f) => {
                f.off += cnt;
                f.len -= cnt;
                self.len -= cnt;
                return;
            }
            Frags::Many(list) => Arc::get_mut(list),
            Frags::None => None,
        };
        let Some(list) = list else {
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
        let mut list = Frags::None;
        for f in self.fragments().iter().chain(other.fragments()) {
            list.push(f.clone());
        }
        IoData {
            frags: list,
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
        // `push` copies our list first if it is shared (the list, not the payload).
        let list = &mut self.frags;
        match other.frags {
            Frags::None => {}
            Frags::One(f) => list.push(f),
            Frags::Many(theirs) => match Arc::try_unwrap(theirs) {
                Ok(owned) => owned.into_iter().for_each(|f| list.push(f)),
                Err(shared) => shared.iter().for_each(|f| list.push(f.clone())),
            },
        }
        if let Frags::Many(l) = list {
            Arc::make_mut(l).make_contiguous();
        }
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
            crate::copy::copy_bytes(&mut dst[out..out + hi - lo], &c[lo..hi]);
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
    /// A unit that lies inside one fragment is returned as [`Cow::Borrowed`](std::borrow::Cow::Borrowed) without
    /// copying; only a unit that straddles fragments is copied into a [`Cow::Owned`](std::borrow::Cow::Owned)
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
pub(super) fn out_of_bounds<R: RangeBounds<usize>>(range: &R, len: usize) -> ! {
    panic!(
        "range ({:?}, {:?}) out of bounds for IoData of length {len}",
        range.start_bound(),
        range.end_bound()
    )
}

/// Calls `alloc(len)` and checks/trims the result to exactly `len` bytes.
pub(super) fn alloc_exact(
    alloc: impl FnOnce(usize) -> Result<IoDataMut>,
    len: usize,
) -> Result<IoDataMut> {
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

#[cfg(test)]
mod tests;
