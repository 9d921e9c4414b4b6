//! The command table: each placed command's slot and status word, arming a command's
//! submissions, and applying its completions to its status word (SEND_ZC results and
//! notifications, accept-multiple's probing, accept-stop's cancels). It builds entries and
//! reads completions; the [`Endpoint`](super::Endpoint) pushes them on its ring.

use std::net::SocketAddr;

use io_uring::types::CancelBuilder;
use io_uring::{opcode, squeue};

use super::sqe::{recv_entry, send_entry, split_user_data, user_data, MsgSpace};
use super::sqe::{PART_CANCEL, PART_MAIN, PART_REPLY};
use super::EndpointStats;
use crate::uring::ring::Cqe;
use crate::vcm::command::{BufRange, Command};
use crate::vcm::status::{Status, StatusWord};

/// The submissions of one activation (a request has two).
pub(super) type Entries = [Option<squeue::Entry>; 2];

/// Where an activation's buffers lie and how it sends.
#[derive(Clone, Copy)]
pub(super) struct Arming {
    /// Start of the endpoint's region.
    pub base: *mut u8,
    /// Send with SEND_ZC from the registered region.
    pub zc: bool,
    /// The command's socket is a datagram socket.
    pub dgram: bool,
}

/// The commands placed on an endpoint.
pub(super) struct Commands {
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    pub(super) status: Box<[StatusWord]>,
    /// Submissions in the kernel, over all slots.
    pub(super) inflight: u32,
}

/// One command's state.
pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) cmd: Option<Command>,
    pub(super) looped: bool,
    /// Submissions whose completions have not been reaped.
    pub(super) inflight: u8,
    pub(super) seq: u32,
    pub(super) stopping: bool,
    /// Errno of a request's failed send (its linked receive then reports ECANCELED).
    pub(super) send_err: i32,
    /// The range the current activation uses (send range for Send and Request, receive
    /// range for the accepts).
    pub(super) cur: BufRange,
    /// Source of the last message received.
    pub(super) source: Option<SocketAddr>,
    /// Accept-multiple: a message is in the buffer and a non-waiting receive is looking
    /// for a newer one.
    pub(super) probing: bool,
    /// Accept-multiple: the result of the message in the buffer.
    pub(super) last: Status,
    /// The result to publish once the last outstanding completion (a zero-copy send's
    /// notification) arrives.
    pub(super) stash: Option<Status>,
    pub(super) msg: Box<MsgSpace>,
}

impl Commands {
    /// A table of `n` free commands.
    pub(super) fn new(n: usize) -> Commands {
        Commands {
            slots: Vec::new(),
            free: (0..n as u32).rev().collect(),
            status: (0..n).map(|_| StatusWord::default()).collect(),
            inflight: 0,
        }
    }

    /// Starts slot `slot`'s current activation: returns the submissions to push (none
    /// for an accept-stop whose target is idle: it is done at once), counted in flight,
    /// and marks the command pending. `arm` says where its buffers lie.
    pub(super) fn activate(&mut self, slot: u32, link_next: bool, arm: Arming) -> Entries {
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
                return [None, None];
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
        let Arming { base, zc, dgram } = arm;
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
        for e in entries.iter_mut().flatten() {
            if link_next {
                *e = e.clone().flags(squeue::Flags::IO_LINK);
            }
            s.inflight += 1;
            self.inflight += 1;
        }
        self.status[slot as usize].store(Status::Pending, s.seq);
        entries
    }

    /// Ends a stopped loop command: its status word says Stopped.
    pub(super) fn finish_stop(&mut self, slot: u32) {
        let t = &mut self.slots[slot as usize];
        t.stopping = true;
        t.seq += 1;
        self.status[slot as usize].store(Status::Stopped, t.seq);
    }

    /// Applies one completion to its command's status word. Returns the slot of an
    /// accept-multiple that got a message and wants a non-waiting receive posted to look
    /// for a newer one: post it with [`activate`](Self::activate), or, if the ring has no
    /// room, call [`stop_probing`](Self::stop_probing).
    pub(super) fn complete(
        &mut self,
        stats: &mut EndpointStats,
        ud: u64,
        res: i32,
        flags: u32,
    ) -> Option<u32> {
        stats.completions += 1;
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
        let s = self.slots.get_mut(slot as usize)?;
        if s.generation & 0x00ff_ffff != generation || s.cmd.is_none() {
            return None;
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
            return None;
        }
        s.inflight = s.inflight.saturating_sub(1);
        if cqe.notif() {
            stats.zc_sends += 1;
            if cqe.zc_copied() {
                stats.zc_copied += 1;
            }
            if s.inflight > 0 {
                return None;
            }
            if s.stopping && !matches!(cmd, Command::AcceptStop { .. }) {
                // Stopped while the notification was outstanding: end as any stopped loop.
                s.stash = None;
                self.finish_stop(slot);
                return None;
            }
            let outcome = s.stash.take()?;
            match outcome {
                Status::Failed(_) => stats.failed += 1,
                Status::Truncated(_) => stats.truncated += 1,
                _ => {}
            }
            s.seq += 1;
            self.status[slot as usize].store(outcome, s.seq);
            return None;
        }
        let outcome = match (cmd, part) {
            (Command::AcceptStop { .. }, _) => {
                if s.inflight > 0 {
                    return None;
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
                return None;
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
                        stats.discarded += 1;
                    }
                    let _ = flags;
                    s.source = s.msg.source();
                    s.last = if s.msg.truncated() {
                        Status::Truncated(res as u32)
                    } else {
                        Status::Done(res as u32)
                    };
                    s.probing = true;
                    return Some(slot);
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
        self.publish(stats, slot, outcome);
        None
    }

    /// Publishes `outcome` in `slot`'s status word, unless the command is being stopped
    /// or a zero-copy notification is still to come.
    fn publish(&mut self, stats: &mut EndpointStats, slot: u32, outcome: Status) {
        let s = &mut self.slots[slot as usize];
        let cmd = s.cmd.expect("a live command");
        if s.stopping && !matches!(cmd, Command::AcceptStop { .. }) {
            if s.inflight == 0 {
                self.finish_stop(slot);
            }
            return;
        }
        if s.inflight > 0 {
            // A zero-copy send's notification is still to come.
            s.stash = Some(outcome);
            return;
        }
        match outcome {
            Status::Truncated(_) => stats.truncated += 1,
            Status::Failed(_) => stats.failed += 1,
            _ => {}
        }
        let s = &mut self.slots[slot as usize];
        s.seq += 1;
        self.status[slot as usize].store(outcome, s.seq);
    }

    /// Gives up looking for a newer message for accept-multiple `slot` (no room to post
    /// the receive): the message in its buffer is the result.
    pub(super) fn stop_probing(&mut self, stats: &mut EndpointStats, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.probing = false;
        let outcome = s.last;
        self.publish(stats, slot, outcome);
    }
}
