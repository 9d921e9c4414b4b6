//! The endpoint's kernel side: user data, the boxed `msghdr`s, making room in the
//! submission ring, arming commands, and turning completions into status words; and the
//! cancel-and-wait on drop.

use super::*;

use crate::uring::ring::{notif_zc_copied, SEND_ZC_REPORT_USAGE};

pub(super) const PART_MAIN: u64 = 0;
pub(super) const PART_REPLY: u64 = 1;
pub(super) const PART_CANCEL: u64 = 2;

pub(super) fn user_data(slot: u32, generation: u32, part: u64) -> u64 {
    (u64::from(slot) << 32) | (u64::from(generation & 0x00ff_ffff) << 8) | part
}

pub(super) fn split_user_data(ud: u64) -> (u32, u32, u64) {
    (
        (ud >> 32) as u32,
        ((ud >> 8) & 0x00ff_ffff) as u32,
        ud & 0xff,
    )
}

/// The `msghdr`, `iovec` and addresses one command hands the kernel. Boxed, so their
/// addresses stay put while the slot vector grows.
pub(super) struct MsgSpace {
    hdr: libc::msghdr,
    iov: libc::iovec,
    from: libc::sockaddr_storage,
    to: libc::sockaddr_storage,
    to_len: libc::socklen_t,
}

// SAFETY: the raw pointers inside point into this same box or into the endpoint's region;
// both move with the endpoint and are only used by the thread that owns it.
unsafe impl Send for MsgSpace {}

impl MsgSpace {
    pub(super) fn new() -> Box<MsgSpace> {
        // SAFETY: msghdr, iovec and sockaddr_storage are plain C structs for which all-zero
        // bytes are a valid (empty) value.
        Box::new(unsafe { std::mem::zeroed() })
    }
}

impl Endpoint {
    /// Makes room for `n` submissions: flushes (or, under SQPOLL, lets the kernel thread
    /// drain) the submission ring, and fails with [`Error::Full`] if it stays full.
    pub(super) fn reserve(&mut self, n: usize) -> Result<()> {
        let cap = self.ring.submission().capacity();
        if n > cap {
            return Err(Error::Full);
        }
        let start = Instant::now();
        loop {
            let mut sq = self.ring.submission();
            sq.sync();
            if cap - sq.len() >= n {
                return Ok(());
            }
            drop(sq);
            if !self.sqpoll {
                self.flush()?;
            } else if start.elapsed() > Duration::from_secs(1) {
                return Err(Error::Full);
            } else {
                self.flush()?;
                std::hint::spin_loop();
            }
        }
    }

    /// Hands pushed submissions to the kernel: `io_uring_enter` without SQPOLL, nothing
    /// under SQPOLL unless its thread sleeps (or the kernel asks for a completion flush).
    pub(super) fn flush(&mut self) -> Result<()> {
        let enter = if self.sqpoll {
            fence(Ordering::SeqCst);
            let sq = self.ring.submission();
            if sq.need_wakeup() {
                self.stats.wakeups += 1;
                true
            } else {
                sq.cq_overflow() || sq.taskrun()
            }
        } else {
            !self.ring.submission().is_empty()
        };
        if enter {
            crate::sys::count();
            self.stats.enters += 1;
            self.ring.submitter().submit()?;
        }
        Ok(())
    }

    /// Pushes the submissions of slot `slot`'s current activation. Space was reserved.
    pub(super) fn arm(&mut self, slot: u32, link_next: bool) {
        let cmd = self.slots[slot as usize]
            .cmd
            .expect("armed slot holds a command");
        let mut entries: [Option<squeue::Entry>; 2] = [None, None];
        if let Command::AcceptStop { target } = cmd {
            let t = &mut self.slots[target.slot as usize];
            if t.inflight == 0 {
                self.finish_stop(target.slot);
                let s = &mut self.slots[slot as usize];
                s.seq += 1;
                self.status[slot as usize].store(Status::Done(0), s.seq);
                return;
            }
            t.stopping = true;
            let t_gen = t.generation;
            let cancel = user_data(slot, self.slots[slot as usize].generation, PART_CANCEL);
            for part in [PART_MAIN, PART_REPLY] {
                let ud = user_data(target.slot, t_gen, part);
                entries[part as usize] = Some(
                    opcode::AsyncCancel2::new(CancelBuilder::user_data(ud).all())
                        .build()
                        .user_data(cancel),
                );
            }
        }
        let base = self.region.as_ptr();
        let zc = self.zero_copy;
        let dgram = cmd
            .socket()
            .is_some_and(|h| self.sockets[h.slot as usize].dgram);
        let s = &mut self.slots[slot as usize];
        s.stash = None;
        let main = user_data(slot, s.generation, PART_MAIN);
        match cmd {
            Command::Send { sock, to, .. } => {
                entries[0] =
                    Some(send_entry(&mut s.msg, base, s.cur, sock, to, zc).user_data(main));
            }
            Command::Accept { sock, .. } | Command::AcceptMultiple { sock, .. } => {
                let nowait = s.probing;
                entries[0] =
                    Some(recv_entry(&mut s.msg, base, s.cur, sock, nowait, dgram).user_data(main));
            }
            Command::Request {
                sock, to, reply, ..
            } => {
                // Send takes its buffer directly, so the receive may use the slot's msghdr.
                entries[0] = Some(
                    send_entry(&mut s.msg, base, s.cur, sock, to, zc)
                        .user_data(main)
                        .flags(squeue::Flags::IO_LINK),
                );
                entries[1] =
                    Some(
                        recv_entry(&mut s.msg, base, reply, sock, false, dgram)
                            .user_data(user_data(slot, s.generation, PART_REPLY)),
                    );
                s.send_err = 0;
            }
            Command::AcceptStop { .. } => {}
        }
        let mut sq = self.ring.submission();
        for e in entries.into_iter().flatten() {
            let e = if link_next {
                e.flags(squeue::Flags::IO_LINK)
            } else {
                e
            };
            // SAFETY: every pointer in the entry points into the endpoint's region (range
            // checked) or into this slot's boxed MsgSpace; both stay valid and untouched by
            // safe code until the completion is reaped (`busy` guards the region, a slot is
            // not reused while `inflight > 0`, and `Drop` drains the ring before unmapping).
            unsafe { sq.push(&e) }.expect("space was reserved");
            s.inflight += 1;
            self.inflight += 1;
        }
        self.status[slot as usize].store(Status::Pending, s.seq);
    }

    pub(super) fn finish_stop(&mut self, slot: u32) {
        let t = &mut self.slots[slot as usize];
        t.stopping = true;
        t.seq += 1;
        self.status[slot as usize].store(Status::Stopped, t.seq);
    }

    /// Applies one completion; returns true when it re-posted a receive.
    pub(super) fn complete(&mut self, ud: u64, res: i32, flags: u32) -> bool {
        self.stats.completions += 1;
        // The result of a zero-copy send: its notification follows, and until then the
        // kernel may still read the buffer, so the submission stays outstanding.
        let more = io_uring::cqueue::more(flags);
        if !more {
            self.inflight = self.inflight.saturating_sub(1);
        }
        let (slot, generation, part) = split_user_data(ud);
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return false;
        };
        if s.generation & 0x00ff_ffff != generation || s.cmd.is_none() {
            return false;
        }
        let cmd = s.cmd.unwrap();
        if more {
            if res < 0 {
                s.send_err = -res;
            }
            if matches!(cmd, Command::Send { .. }) {
                s.stash = Some(if res < 0 {
                    Status::Failed(-res)
                } else {
                    Status::Done(res as u32)
                });
            }
            return false;
        }
        s.inflight = s.inflight.saturating_sub(1);
        if io_uring::cqueue::notif(flags) {
            self.stats.zc_sends += 1;
            if notif_zc_copied(res) {
                self.stats.zc_copied += 1;
            }
            if s.inflight > 0 {
                return false;
            }
            if s.stopping && !matches!(cmd, Command::AcceptStop { .. }) {
                // Stopped while the notification was outstanding: end as any stopped loop.
                s.stash = None;
                self.finish_stop(slot);
                return false;
            }
            let Some(outcome) = s.stash.take() else {
                return false;
            };
            match outcome {
                Status::Failed(_) => self.stats.failed += 1,
                Status::Truncated(_) => self.stats.truncated += 1,
                _ => {}
            }
            s.seq += 1;
            self.status[slot as usize].store(outcome, s.seq);
            return false;
        }
        let outcome = match (cmd, part) {
            (Command::AcceptStop { .. }, _) => {
                if s.inflight > 0 {
                    return false;
                }
                if let Command::AcceptStop { target } = cmd {
                    // Only if the target still holds its slot: once it finished it may
                    // have been released and the slot given to another command.
                    let t = &self.slots[target.slot as usize];
                    if t.generation == target.generation && t.cmd.is_some() && t.inflight == 0 {
                        self.finish_stop(target.slot);
                    }
                }
                Status::Done(0)
            }
            (Command::Request { .. }, PART_MAIN) => {
                if res < 0 {
                    s.send_err = -res;
                }
                return false;
            }
            (Command::Send { .. }, _) => {
                if res < 0 {
                    Status::Failed(-res)
                } else {
                    Status::Done(res as u32)
                }
            }
            (Command::AcceptMultiple { .. }, _) if !s.stopping => {
                if res >= 0 {
                    // Something arrived. Remember it and probe, without waiting, for a
                    // newer datagram: one that arrives overwrites this one in the buffer.
                    if s.probing {
                        self.stats.discarded += 1;
                    }
                    let _ = flags;
                    s.source = read_sockaddr(&s.msg.from, s.msg.hdr.msg_namelen);
                    s.last = if s.msg.hdr.msg_flags & libc::MSG_TRUNC != 0 {
                        Status::Truncated(res as u32)
                    } else {
                        Status::Done(res as u32)
                    };
                    s.probing = true;
                    if self.reserve(1).is_ok() {
                        self.arm(slot, false);
                        return true;
                    }
                    self.slots[slot as usize].probing = false;
                    self.slots[slot as usize].last
                } else if s.probing && res == -libc::EAGAIN {
                    // Nothing newer is queued: the buffer holds the newest message.
                    s.probing = false;
                    s.last
                } else {
                    s.probing = false;
                    Status::Failed(-res)
                }
            }
            (_, _) => {
                if res < 0 {
                    if s.send_err != 0 {
                        Status::Failed(s.send_err)
                    } else {
                        Status::Failed(-res)
                    }
                } else {
                    s.source = read_sockaddr(&s.msg.from, s.msg.hdr.msg_namelen);
                    if s.msg.hdr.msg_flags & libc::MSG_TRUNC != 0 {
                        Status::Truncated(res as u32)
                    } else {
                        Status::Done(res as u32)
                    }
                }
            }
        };
        let s = &mut self.slots[slot as usize];
        if s.stopping && !matches!(cmd, Command::AcceptStop { .. }) {
            if s.inflight == 0 {
                self.finish_stop(slot);
            }
            return false;
        }
        if s.inflight > 0 {
            // A zero-copy send's notification is still to come.
            s.stash = Some(outcome);
            return false;
        }
        match outcome {
            Status::Truncated(_) => self.stats.truncated += 1,
            Status::Failed(_) => self.stats.failed += 1,
            _ => {}
        }
        let s = &mut self.slots[slot as usize];
        s.seq += 1;
        self.status[slot as usize].store(outcome, s.seq);
        false
    }
}

pub(super) fn send_entry(
    m: &mut MsgSpace,
    base: *mut u8,
    r: BufRange,
    sock: SockHandle,
    to: Option<SocketAddr>,
    zero_copy: bool,
) -> squeue::Entry {
    // `base + offset` stays inside the region: callers checked the range.
    let ptr = base.wrapping_add(r.offset as usize);
    if zero_copy {
        let mut op = opcode::SendZc::new(Fixed(sock.slot), ptr, r.len)
            .buf_index(Some(0))
            .zc_flags(SEND_ZC_REPORT_USAGE)
            .flags(libc::MSG_NOSIGNAL);
        if let Some(to) = to {
            m.to_len = write_sockaddr(&mut m.to, to);
            op = op
                .dest_addr(std::ptr::addr_of!(m.to).cast())
                .dest_addr_len(m.to_len);
        }
        return op.build();
    }
    let mut op = opcode::Send::new(Fixed(sock.slot), ptr, r.len).flags(libc::MSG_NOSIGNAL);
    if let Some(to) = to {
        m.to_len = write_sockaddr(&mut m.to, to);
        op = op
            .dest_addr(std::ptr::addr_of!(m.to).cast())
            .dest_addr_len(m.to_len);
    }
    op.build()
}

pub(super) fn recv_entry(
    m: &mut MsgSpace,
    base: *mut u8,
    r: BufRange,
    sock: SockHandle,
    nowait: bool,
    dgram: bool,
) -> squeue::Entry {
    m.iov = libc::iovec {
        iov_base: base.wrapping_add(r.offset as usize).cast(),
        iov_len: r.len as usize,
    };
    m.hdr.msg_name = std::ptr::addr_of_mut!(m.from).cast();
    m.hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m.hdr.msg_iov = std::ptr::addr_of_mut!(m.iov);
    m.hdr.msg_iovlen = 1;
    m.hdr.msg_control = std::ptr::null_mut();
    m.hdr.msg_controllen = 0;
    m.hdr.msg_flags = 0;
    // MSG_TRUNC: the result is the datagram's full length even when it did not fit. On a
    // stream socket it would discard the bytes instead, so only datagrams get it.
    let trunc = if dgram { libc::MSG_TRUNC } else { 0 };
    opcode::RecvMsg::new(Fixed(sock.slot), std::ptr::addr_of_mut!(m.hdr))
        .flags((trunc | if nowait { libc::MSG_DONTWAIT } else { 0 }) as u32)
        .build()
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.inflight > 0 {
            let cancel = opcode::AsyncCancel2::new(CancelBuilder::any())
                .build()
                .user_data(u64::MAX);
            let mut sq = self.ring.submission();
            // SAFETY: a cancel entry carries no pointer.
            let pushed = unsafe { sq.push(&cancel) }.is_ok();
            drop(sq);
            if pushed {
                self.inflight += 1;
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.inflight > 0 && Instant::now() < deadline {
                crate::sys::count();
                let ts = Timespec::from(Duration::from_millis(10));
                let args = SubmitArgs::new().timespec(&ts);
                let _ = self.ring.submitter().submit_with_args(1, &args);
                let _ = self.poll();
            }
        }
        if self.inflight == 0 {
            // SAFETY: no request into the region is left in the kernel, and the region is
            // not used after this point. With requests left (a kernel that would not cancel
            // within 2 s), the mapping is leaked instead of unmapped under the kernel.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        } else {
            // The kernel may still write a receive's source address and flags into the
            // slots' boxed msghdrs: leak them with the region rather than free them.
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}
