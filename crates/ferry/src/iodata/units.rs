//! Fixed-size units of an IoData, borrowed where they lie in one fragment.

use std::borrow::Cow;
use std::iter::FusedIterator;

use super::Fragment;

/// Iterator over consecutive fixed-size units of an [`IoData`](super::IoData); see [`IoData::units`](super::IoData::units).
#[derive(Clone, Debug)]
pub struct Units<'a> {
    pub(super) frags: &'a [Fragment],
    pub(super) idx: usize,
    pub(super) off: usize,
    pub(super) remaining: usize,
    pub(super) unit: usize,
    pub(super) borrowed: usize,
    pub(super) copied: usize,
    pub(super) copied_bytes: usize,
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
