//! How one I/O runs: from a registered slot, or copied through the bounce buffers, and
//! the submit-and-wait that never returns before the kernel is done with the caller's
//! memory.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};

use super::{Kind, SendOp, Xlate};
use crate::error::{Error, Result};
use crate::uring::ring;

impl Xlate {
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
    /// flight at a time (one for socket sends). With `serve`, registers `[ptr, ptr + len)` once the first chunks
    /// are submitted, so the registration overlaps the I/O.
    pub(super) fn bounce(
        &mut self,
        fd: RawFd,
        kind: Kind,
        ptr: *mut u8,
        len: usize,
        mut serve: bool,
    ) -> Result<usize> {
        self.stats.fallbacks += 1;
        let bs = self.bounce_size;
        // A send on a stream socket may complete short (`WRITE_FIXED`, and `SEND` /
        // `SEND_ZC` without `MSG_WAITALL`), and a short result does not break an io_uring
        // link: the chunks linked after it would still go out, leaving a gap in the stream.
        // So socket sends keep one chunk in flight and carry on from where it stopped.
        let nb = if kind.is_socket() {
            1
        } else {
            self.cfg.bounce_buffers as usize
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
            unsafe { self.submit(&sqes, serve.then_some((ptr as usize, len)), &mut res)? };
            serve = false;
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

    /// Pushes `sqes`, submits, optionally serves the pending miss while they run, and
    /// waits for every completion, writing results into `res` by `user_data` index.
    ///
    /// # Safety
    ///
    /// Every buffer the SQEs name must stay valid until this returns; this returns only
    /// after all their completions (and zero-copy notifications) arrived, or aborts.
    pub(super) unsafe fn submit(
        &mut self,
        sqes: &[squeue::Entry],
        serve: Option<(usize, usize)>,
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
        if let Some((addr, len)) = serve {
            match self.ring.flush() {
                Ok(took) => submitted = took,
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
            let _ = self.install(addr, len, 0);
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
            let stats = &mut self.stats;
            self.ring.reap(|c| {
                if c.notif() {
                    notifs -= 1;
                    if c.zc_copied() {
                        stats.zc_copied += 1;
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
