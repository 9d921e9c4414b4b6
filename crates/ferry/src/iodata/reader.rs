//! A non-consuming reader over a borrowed IoData.

use std::io::{self, IoSlice};

use super::Fragment;
use bytes::Buf;

/// A non-consuming reader over a borrowed [`IoData`](super::IoData); see [`IoData::cursor`](super::IoData::cursor).
///
/// Implements [`io::Read`], [`io::BufRead`] and [`bytes::Buf`]; reading moves only the
/// reader's position, never touching the `IoData`.
#[derive(Clone, Debug)]
pub struct IoDataReader<'a> {
    pub(super) frags: &'a [Fragment],
    pub(super) idx: usize,
    pub(super) off: usize,
    pub(super) remaining: usize,
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
            crate::copy::copy_bytes(&mut buf[n..n + k], &c[..k]);
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
