//! The second transport: the eight semantics on a connected TCP socket, through the
//! io_uring driver ([`Uring`]), to any ordinary TCP program on the other end.
//!
//! | semantics | output | input |
//! |---|---|---|
//! | copy | `IORING_OP_SEND` (the kernel copies into socket buffers during the call); from any `&[u8]`, `send(2)` | `recv` into the application's buffer |
//! | emulated copy | TCOW-protect the buffer's pages, `IORING_OP_SEND_ZC` of the lot pages behind them, unprotect after the kernel's notification | as copy |
//! | share, emulated share | `SEND_ZC` of the buffer's lot pages (share also `mlock`s them) | as copy |
//! | system-allocated forms | `SEND_ZC` of the region; after the notification it is freed (move, weak move), hidden and queued (emulated move) or queued mapped (emulated weak move) | `recv` into a region from the domain's queues (reused for input), else a fresh fbuf |
//!
//! Every call is synchronous: it returns once the kernel has sent everything and (for
//! `SEND_ZC`) has said it no longer uses the pages. During the call another thread may
//! write an application buffer: under emulated copy the write lands on a fresh page and
//! the kernel keeps sending the protected one. The zero-copy sends name the lot pages
//! behind the buffer (the lot's own mapping), never the application's view, so a page the
//! kernel pins late (an operation punted to a worker) is still the old one.
//!
//! On loopback (and veth) the kernel copies even a zero-copy send; the driver reports it
//! (`IORING_NOTIF_USAGE_ZC_COPIED`) and [`SemanticsStats::zc_copied`](super::SemanticsStats)
//! counts it, so a loopback benchmark shows that its "zero-copy" numbers include a
//! kernel copy. A kernel without `SEND_ZC` makes the driver send plainly, counted in
//! [`UringStats::zc_fallbacks`](crate::uring::UringStats).

use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use super::app::{AppBuffer, AppInner, Hold};
use super::passing::Used;
use super::regions::{describe, Afterwards, SysBuffer, SysKind};
use super::stats::add;
use super::{Allocator, Passing, Semantics};
use crate::error::{Error, Result};
use crate::iodata::IoData;
use crate::segment::Segment;
use crate::sys::page_size;
use crate::uring::driver::{IoBuf, IoBufMut};
use crate::uring::{Target, Uring};

/// One fragment of an output, owned by a send until the kernel is done with it.
struct Piece(IoData);

// SAFETY: the fragment's bytes live in a segment the IoData keeps alive (a lot span kept
// reserved by its guard); they do not move when the IoData is moved.
unsafe impl IoBuf for Piece {
    fn stable_ptr(&self) -> *const u8 {
        self.0.fragments()[0].as_slice().as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.len()
    }
}

/// The tail of an application buffer's view that a receive fills.
struct AppRange {
    _app: Arc<AppInner>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is into the application's view, which `_app` keeps mapped.
unsafe impl Send for AppRange {}

// SAFETY: `ptr..ptr+len` lies in the view, which `_app` keeps mapped at a fixed address.
unsafe impl IoBuf for AppRange {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: the caller of the receive holds `&mut AppBuffer` for the whole synchronous
// call, so nothing else in safe code reads or writes the range meanwhile.
unsafe impl IoBufMut for AppRange {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

/// A fresh or reused region a receive fills, up to `.1` bytes.
struct Region(Segment, usize);

// SAFETY: a segment's memory (an fbuf of our lot) does not move with the value.
unsafe impl IoBuf for Region {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.1
    }
}

// SAFETY: the segment is a writable fbuf this value owns alone.
unsafe impl IoBufMut for Region {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0
            .as_mut_slice()
            .expect("a local region is writable")
            .as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.1
    }
}

fn target(sock: &impl AsFd) -> Target {
    Target::Fd(sock.as_fd().as_raw_fd())
}

impl Passing {
    /// Sends every fragment of `data` on `sock`, zero-copy or not, each until the kernel
    /// returned its buffer.
    fn tcp_send_data(&self, ring: &mut Uring, sock: Target, data: &IoData, zc: bool) -> Result<()> {
        for f in data.fragments() {
            let mut at = 0;
            while at < f.len() {
                let piece = Piece(IoData::from_fragments([f.clone()]).slice(at..));
                let before = ring.stats();
                let (r, _piece) = if zc {
                    ring.send_zc(sock, piece)
                } else {
                    ring.send(sock, piece)
                };
                let after = ring.stats();
                add(&self.stats.zc_sends, after.zc_sent - before.zc_sent);
                add(&self.stats.zc_copied, after.zc_copied - before.zc_copied);
                match r? {
                    0 => return Err(Error::Disconnected),
                    n => at += n,
                }
            }
        }
        Ok(())
    }

    /// Copy output of any bytes on a connected stream socket (`send(2)`: the kernel
    /// copies them before this returns). The caller may reuse `bytes` at once.
    pub fn tcp_send_bytes(&self, sock: &impl AsFd, bytes: &[u8]) -> Result<()> {
        let mut at = 0;
        while at < bytes.len() {
            match rustix::net::send(sock, &bytes[at..], rustix::net::SendFlags::NOSIGNAL) {
                Ok(0) => return Err(Error::Disconnected),
                Ok(n) => at += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.stats.copied(Semantics::Copy, bytes.len());
        self.stats.output(Semantics::Copy, bytes.len());
        Ok(())
    }

    /// Output of `range` of an application buffer on a connected stream socket under an
    /// application-allocated semantics, through `ring`; returns once the kernel is done
    /// with the pages. Same promises as [`send_app`](Self::send_app).
    pub fn tcp_send_app(
        &self,
        ring: &mut Uring,
        sock: &impl AsFd,
        buf: &AppBuffer,
        range: Range<usize>,
        s: Semantics,
    ) -> Result<Used> {
        let t = target(sock);
        let (data, used) = self.plan_app(buf, &range, s)?;
        match data {
            Some(d) => self.tcp_send_data(ring, t, &d, true)?,
            None => {
                // The kernel copies from the lot pages during the operation.
                let d = buf.inner.describe(range.clone(), Hold::Plain);
                self.tcp_send_data(ring, t, &d, false)?;
                self.stats.copied(s, range.len());
            }
        }
        self.stats.output(s, range.len());
        Ok(used)
    }

    /// Output of a system buffer on a connected stream socket under a system-allocated
    /// semantics, through `ring` (`SEND_ZC`); returns once the kernel is done with the
    /// region, which then goes where the semantics says (see the module docs).
    pub fn tcp_send_sys(
        &self,
        ring: &mut Uring,
        sock: &impl AsFd,
        buf: SysBuffer,
        s: Semantics,
    ) -> Result<Used> {
        s.expect(Allocator::System)?;
        let SysKind::Local { seg, len } = buf.kind else {
            return Err(Error::ReceivedBuffer);
        };
        let npages = len.div_ceil(page_size());
        let t = target(sock);
        if self.thresholds.converts(s, len) {
            self.stats.converted(s);
            let d = describe(self.region_guard(seg, Afterwards::Free), len);
            self.tcp_send_data(ring, t, &d, false)?;
            self.stats.copied(s, len);
            self.stats.output(s, len);
            return Ok(Used::ConvertedToCopy);
        }
        let then = match s {
            Semantics::EmulatedMove => Afterwards::HideThenQueue { pages: npages },
            Semantics::EmulatedWeakMove => Afterwards::Cache,
            _ => Afterwards::Free,
        };
        // Dropped once sent: the guard then frees, hides or queues the region.
        let d = describe(self.region_guard(seg, then), len);
        self.tcp_send_data(ring, t, &d, true)?;
        self.stats.output(s, len);
        Ok(Used::Mechanism)
    }

    /// Input under an application-allocated semantics from a stream socket into the start
    /// of `dst` (`recv(2)`: the kernel copies). Returns the bytes received; 0 at end of
    /// stream.
    pub fn tcp_recv_into(&self, sock: &impl AsFd, s: Semantics, dst: &mut [u8]) -> Result<usize> {
        s.expect(Allocator::Application)?;
        let n = loop {
            match rustix::net::recv(sock, &mut *dst, rustix::net::RecvFlags::empty()) {
                Ok((n, _)) => break n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        self.stats.copied(s, n);
        self.stats.input(s, n);
        Ok(n)
    }

    /// Input under an application-allocated semantics from a stream socket into an
    /// application buffer at byte `at`, through `ring`. A page of `dst` still under an
    /// emulated-copy output is written through TCOW like any other write.
    pub fn tcp_recv_into_app(
        &self,
        ring: &mut Uring,
        sock: &impl AsFd,
        s: Semantics,
        dst: &mut AppBuffer,
        at: usize,
    ) -> Result<usize> {
        s.expect(Allocator::Application)?;
        if at >= dst.len() {
            return Err(Error::InvalidArgument("offset past the buffer"));
        }
        let range = AppRange {
            _app: dst.inner.clone(),
            ptr: dst.as_mut_ptr().wrapping_add(at),
            len: dst.len() - at,
        };
        let (r, _range) = ring.recv(target(sock), range);
        let n = r?;
        self.stats.copied(s, n);
        self.stats.input(s, n);
        Ok(n)
    }

    /// Input under a system-allocated semantics from a stream socket: up to `max` bytes
    /// in a new buffer, a region from the domain's queues (reused for input) or a fresh
    /// fbuf, through `ring`. An empty buffer means end of stream.
    pub fn tcp_recv_sys(
        &self,
        ring: &mut Uring,
        sock: &impl AsFd,
        s: Semantics,
        max: usize,
    ) -> Result<SysBuffer> {
        s.expect(Allocator::System)?;
        let max = max.max(1);
        let SysKind::Local { seg, .. } = self.sys_buffer(max)?.kind else {
            unreachable!("sys_buffer makes local buffers")
        };
        let (r, Region(seg, _)) = ring.recv(target(sock), Region(seg, max));
        let n = r?;
        self.stats.input(s, n);
        Ok(SysBuffer {
            kind: SysKind::Local { seg, len: n },
        })
    }
}
