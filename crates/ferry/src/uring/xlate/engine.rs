//! How one I/O runs on xlate's ring: from a registered slot, or copied through the bounce
//! buffers, and the submit-and-wait that never returns before the kernel is done with the
//! caller's memory. [`Engine`] owns the ring and the bounce buffers; the cache in the
//! parent module decides which way an I/O goes and registers ranges on
//! [`Engine::ring`].

use std::io;
use std::os::fd::{AsFd, RawFd};

use io_uring::{opcode, squeue, types};

use super::{Kind, SendOp, MAX_REGISTER};
use crate::error::{Error, Result};
use crate::sys::fd::memfd;
use crate::sys::mem::{Access, Mapping};
use crate::uring::ring::{self, Ring};
use crate::uring::RingConfig;

/// Called once the first chunks of a bounced I/O are in the kernel, with the ring, to
/// register the caller's range while the copy runs.
pub(super) type Serve<'a> = &'a mut dyn FnMut(&mut Ring);

/// xlate's ring and bounce buffers: kernel buffer slots `0..bounce_buffers` hold the
/// bounce buffers, slot `bounce_buffers` is scratch, and the slots above it belong to
/// the cache.
pub(super) struct Engine {
    /// Declared before `bounce`: the ring (and with it the registration) goes first.
    ring: Ring,
    bounce: Mapping,
    bounce_size: usize,
    bounce_buffers: u32,
    /// A ring call failed with SQEs left unsubmitted: never enter the ring again.
    poisoned: bool,
    /// I/Os copied through the bounce buffers ([`XlateStats::fallbacks`](super::XlateStats::fallbacks)).
    pub(super) fallbacks: u64,
    /// Zero-copy sends the kernel copied anyway ([`XlateStats::zc_copied`](super::XlateStats::zc_copied)).
    pub(super) zc_copied: u64,
}

impl Engine {
    /// Builds a ring with `slots` sparse kernel buffer slots and registers
    /// `bounce_buffers` bounce buffers of `bounce_size` bytes (a page multiple) in the
    /// first of them.
    pub(super) fn new(bounce_buffers: u32, bounce_size: usize, slots: u32) -> Result<Engine> {
        let bounce_len = bounce_size
            .checked_mul(bounce_buffers as usize)
            .ok_or(Error::InvalidArgument("bounce region overflows"))?;
        let mut ring = Ring::new(&RingConfig::new((bounce_buffers * 2 + 2).max(8)))?;
        ring.register_buffers_sparse(slots)?;
        let mfd = memfd("ferry-xlate-bounce", bounce_len as u64)?;
        let bounce = Mapping::shared(mfd.as_fd(), bounce_len, Access::ReadWrite)?;
        let iovecs: Vec<libc::iovec> = (0..bounce_buffers as usize)
            .map(|i| libc::iovec {
                // SAFETY: `i * bounce_size` lies inside the mapping of `bounce_len` bytes.
                iov_base: unsafe { bounce.as_ptr().add(i * bounce_size) }.cast(),
                iov_len: bounce_size,
            })
            .collect();
        // SAFETY: the bounce mapping lives in the `Engine` and is declared after `ring`, so
        // it is unmapped only after the ring (and with it the registration) is gone.
        unsafe { ring.register_buffers_update(0, &iovecs)? };
        Ok(Engine {
            ring,
            bounce,
            bounce_size,
            bounce_buffers,
            poisoned: false,
            fallbacks: 0,
            zc_copied: 0,
        })
    }

    /// The ring, for registering buffers in its slots.
    pub(super) fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    /// Refuses I/O once the ring failed, and I/O larger than a registration may cover.
    pub(super) fn check(&self, len: usize) -> Result<()> {
        if self.poisoned {
            return Err(Error::Io(io::Error::other(
                "this xlate ring failed earlier and is no longer used",
            )));
        }
        if len > MAX_REGISTER {
            return Err(Error::InvalidArgument(
                "xlate I/O is limited to 1 GiB per call",
            ));
        }
        Ok(())
    }

    /// One I/O from the fixed buffer `index`, which covers `[ptr, ptr + len)`.
    pub(super) fn fixed(
        &mut self,
        fd: RawFd,
        kind: Kind,
        ptr: *mut u8,
        len: usize,
        index: u32,
    ) -> Result<usize> {
        let mut done = 0usize;
        loop {
            // SAFETY: `done < len`, so the pointer stays inside the caller's buffer.
            let at = unsafe { ptr.add(done) };
            let e = build(fd, kind, at, len - done, index as u16);
            let mut res = [0i32; 1];
            // SAFETY: the buffer is the caller's borrow, held until `submit` returns, which
            // is after every completion (and notification) of this I/O.
            unsafe { self.submit(&[e], None, &mut res)? };
            let n = match cqe_result(res[0]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => return Ok(done),
            };
            done += n;
            // `WRITE_FIXED` on a socket may stop short where `SEND` would carry on (a full
            // send buffer under the ring's non-blocking attempt): send the rest.
            if !kind.is_socket() || n == 0 || done >= len {
                return Ok(done);
            }
        }
    }

    /// Copies through the bounce buffers, in chunks of `bounce_size`, `bounce_buffers` in
    /// flight at a time (one for socket sends). `serve`, if given, runs once the first
    /// chunks are submitted, so that registering the caller's range overlaps the I/O.
    pub(super) fn bounce(
        &mut self,
        fd: RawFd,
        kind: Kind,
        ptr: *mut u8,
        len: usize,
        mut serve: Option<Serve<'_>>,
    ) -> Result<usize> {
        self.fallbacks += 1;
        let bs = self.bounce_size;
        // A send on a stream socket may complete short (`WRITE_FIXED`, and `SEND` /
        // `SEND_ZC` without `MSG_WAITALL`), and a short result does not break an io_uring
        // link: the chunks linked after it would still go out, leaving a gap in the stream.
        // So socket sends keep one chunk in flight and carry on from where it stopped.
        let nb = if kind.is_socket() {
            1
        } else {
            self.bounce_buffers as usize
        };
        let mut done = 0usize;
        loop {
            let mut chunks: Vec<(usize, usize, usize)> = Vec::with_capacity(nb);
            let mut pos = done;
            for b in 0..nb {
                let clen = bs.min(len - pos);
                chunks.push((b, pos, clen));
                pos += clen;
                if pos >= len {
                    break;
                }
            }
            let mut sqes = Vec::with_capacity(chunks.len());
            for (i, &(b, at, clen)) in chunks.iter().enumerate() {
                // SAFETY: `b < bounce_buffers`, so the bounce buffer lies in the mapping.
                let bp = unsafe { self.bounce.as_ptr().add(b * bs) };
                if !matches!(kind, Kind::Read(_)) {
                    // SAFETY: `[ptr + at, + clen)` is inside the caller's buffer and
                    // `[bp, + clen)` inside bounce buffer `b`; they cannot overlap.
                    unsafe { std::ptr::copy_nonoverlapping(ptr.add(at), bp, clen) };
                }
                let k = kind.at(at);
                let mut e = build(fd, k, bp, clen, b as u16).user_data(i as u64);
                if kind.is_socket() && i + 1 < chunks.len() {
                    // A stream must see the chunks in order.
                    e = e.flags(squeue::Flags::IO_LINK);
                }
                sqes.push(e);
            }
            let mut res = vec![0i32; chunks.len()];
            // SAFETY: the SQEs name only bounce buffers, which `self` owns and which stay
            // mapped until the ring is dropped.
            unsafe { self.submit(&sqes, serve.take(), &mut res)? };
            let mut short = false;
            for (&(b, at, clen), &r) in chunks.iter().zip(&res) {
                if r < 0 {
                    if done == 0 {
                        return Err(Error::Io(io::Error::from_raw_os_error(-r)));
                    }
                    short = true;
                    break;
                }
                let r = r as usize;
                if matches!(kind, Kind::Read(_)) {
                    // SAFETY: the kernel wrote `r <= clen` bytes into bounce buffer `b`;
                    // the caller's buffer has room for `clen` at `at`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.bounce.as_ptr().add(b * bs),
                            ptr.add(at),
                            r,
                        )
                    };
                }
                done += r;
                if r < clen {
                    // A lone stream chunk that moved some bytes: send the rest next pass.
                    short = !(kind.is_socket() && r > 0 && chunks.len() == 1);
                    break;
                }
            }
            if short || done >= len {
                return Ok(done);
            }
        }
    }

    /// Pushes `sqes`, submits, runs `serve` (if given) while they are in the kernel, and
    /// waits for every completion, writing results into `res` by `user_data` index.
    ///
    /// # Safety
    ///
    /// Every buffer the SQEs name must stay valid until this returns; this returns only
    /// after all their completions (and zero-copy notifications) arrived, or aborts.
    pub(super) unsafe fn submit(
        &mut self,
        sqes: &[squeue::Entry],
        serve: Option<Serve<'_>>,
        res: &mut [i32],
    ) -> Result<()> {
        for (i, e) in sqes.iter().enumerate() {
            let e = e.clone().user_data(ring::user_data(i as u32, 0));
            // SAFETY: the caller keeps every buffer valid until we return, and we return
            // only after the completions arrived.
            if unsafe { self.ring.push(&e) }.is_err() {
                // Nothing was submitted yet; drop what we queued by never entering the
                // ring again.
                self.poisoned = true;
                return Err(Error::Io(io::Error::other("xlate ring full")));
            }
        }
        let mut submitted = false;
        if let Some(serve) = serve {
            match self.ring.flush() {
                Ok(took) => submitted = took,
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
            serve(&mut self.ring);
        }
        let mut pending = sqes.len();
        let mut notifs: i64 = 0;
        while pending > 0 || notifs > 0 {
            match self.ring.wait(1, None) {
                Ok(took) => submitted |= took,
                Err(e) if !submitted => {
                    // io_uring_enter consumed nothing: the SQEs stay queued, and we never
                    // enter this ring again, so the kernel never sees them.
                    self.poisoned = true;
                    return Err(e);
                }
                Err(e) => {
                    // Some I/O is in flight on borrowed memory and we cannot wait for it:
                    // returning would let the caller free that memory under the kernel.
                    eprintln!("ferry xlate: io_uring_enter failed with I/O in flight: {e}");
                    std::process::abort();
                }
            }
            let zc_copied = &mut self.zc_copied;
            self.ring.reap(|c| {
                if c.notif() {
                    notifs -= 1;
                    if c.zc_copied() {
                        *zc_copied += 1;
                    }
                    return;
                }
                if let Some(r) = res.get_mut(c.slot_tag().0 as usize) {
                    *r = c.result;
                }
                pending = pending.saturating_sub(1);
                if c.more() {
                    notifs += 1;
                }
            });
        }
        Ok(())
    }
}

pub(super) fn cqe_result(r: i32) -> Result<usize> {
    if r < 0 {
        Err(Error::Io(io::Error::from_raw_os_error(-r)))
    } else {
        Ok(r as usize)
    }
}

/// The SQE for one fixed-buffer I/O.
pub(super) fn build(fd: RawFd, kind: Kind, ptr: *mut u8, len: usize, index: u16) -> squeue::Entry {
    let fd = types::Fd(fd);
    match kind {
        Kind::Write(off) => opcode::WriteFixed::new(fd, ptr.cast_const(), len as u32, index)
            .offset(off)
            .build(),
        Kind::Read(off) => opcode::ReadFixed::new(fd, ptr, len as u32, index)
            .offset(off)
            .build(),
        // Offset 0: a socket has no file position, and 0 leaves `f_pos` alone.
        Kind::Send(SendOp::WriteFixed) => {
            opcode::WriteFixed::new(fd, ptr.cast_const(), len as u32, index)
                .offset(0)
                .build()
        }
        // MSG_NOSIGNAL: a closed peer is an EPIPE result, not a signal.
        Kind::Send(SendOp::SendZc) => opcode::SendZc::new(fd, ptr.cast_const(), len as u32)
            .buf_index(Some(index))
            .flags(libc::MSG_NOSIGNAL)
            .zc_flags(ring::SEND_ZC_REPORT_USAGE)
            .build(),
        Kind::Send(SendOp::Plain) => opcode::Send::new(fd, ptr.cast_const(), len as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build(),
    }
}
