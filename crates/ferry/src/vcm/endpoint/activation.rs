//! Arming a command's entries on the ring core and applying its completions to its status
//! word (SEND_ZC results and notifications, accept-multiple's probing, accept-stop's
//! cancels); and the drain that runs on drop.

use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use io_uring::types::CancelBuilder;
use io_uring::{opcode, squeue};

use super::sqe::{recv_entry, send_entry, split_user_data, user_data};
use super::sqe::{PART_CANCEL, PART_MAIN, PART_REPLY};
use super::Endpoint;
use crate::error::{Error, Result};
use crate::uring::ring::{self, Cqe, Drain, Ring};
use crate::vcm::command::Command;
use crate::vcm::status::Status;

impl Endpoint {
    /// Makes room for `n` submissions: flushes (or, under SQPOLL, lets the kernel thread
    /// drain) the submission ring, and fails with [`Error::TableFull`] if it stays full.
    pub(super) fn reserve(&mut self, n: usize) -> Result<()> {
        if n > self.ring.sq_capacity() {
            return Err(Error::TableFull {
                table: "submission queue",
            });
        }
        let start = Instant::now();
        loop {
            if self.ring.sq_free() >= n {
                return Ok(());
            }
            if !self.ring.is_sqpoll() {
                self.flush()?;
            } else if start.elapsed() > Duration::from_secs(1) {
                return Err(Error::TableFull {
                    table: "submission queue",
                });
            } else {
                self.flush()?;
                std::hint::spin_loop();
            }
        }
    }

    /// Hands pushed submissions to the kernel: `io_uring_enter` without SQPOLL, nothing
    /// under SQPOLL unless its thread sleeps (or the kernel asks for a completion flush).
    pub(super) fn flush(&mut self) -> Result<()> {
        self.ring.flush().map(drop)
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
            unsafe { self.ring.push(&e) }.expect("space was reserved");
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
        let cqe = Cqe {
            user_data: ud,
            result: res,
            flags,
        };
        // The result of a zero-copy send: its notification follows, and until then the
        // kernel may still read the buffer, so the submission stays outstanding.
        let more = cqe.more();
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
        if cqe.notif() {
            self.stats.zc_sends += 1;
            if cqe.zc_copied() {
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
                    s.source = s.msg.source();
                    s.last = if s.msg.truncated() {
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
                    s.source = s.msg.source();
                    if s.msg.truncated() {
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

impl Drain for Endpoint {
    fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    fn settled(&mut self) -> bool {
        let _ = self.poll();
        self.inflight == 0
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if ring::drain(self) {
            // SAFETY: no request into the region is left in the kernel, and the region is
            // not used after this point. With requests left (a kernel that would not cancel
            // within the ring core's patience), the mapping is leaked instead of unmapped
            // under the kernel.
            unsafe { ManuallyDrop::drop(&mut self.region) };
        } else {
            // The kernel may still write a receive's source address and flags into the
            // slots' boxed msghdrs: leak them with the region rather than free them.
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
}
