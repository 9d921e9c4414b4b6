//! Submission and completion: parking an operation's state, pushing entries, entering
//! the kernel (counted), reaping completions (SEND_ZC notifications included), waiting,
//! cancelling, and the cancel-and-wait that runs on close and drop.

use std::io;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types};

use super::values::{InFlight, Kind, Slot};
use super::{Completion, Ticket, Uring, UringStats};
use super::{CANCEL_UD, DROP_PATIENCE};
use crate::error::{Error, Result};
use crate::uring::notif_zc_copied;

impl Uring {
    /// Takes a free slot and parks the operation's owned state in it.
    pub(super) fn park(&mut self, op: InFlight) -> (u32, u32) {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot { gen: 0, op: None });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.gen = match s.gen.wrapping_add(1) {
            0 | u32::MAX => 1,
            g => g,
        };
        s.op = Some(op);
        self.in_flight += 1;
        (slot, s.gen)
    }

    /// Pushes `entry`, which points only into state parked in `slot`, and returns the
    /// ticket. On failure the parked state is removed and handed back.
    pub(super) fn push_parked<B>(
        &mut self,
        slot: u32,
        gen: u32,
        entry: squeue::Entry,
    ) -> Result<Ticket<B>> {
        let entry = entry.user_data((u64::from(gen) << 32) | u64::from(slot));
        self.push(&entry)?;
        self.stats.submitted += 1;
        Ok(Ticket {
            ring: self.id,
            slot,
            gen,
            _buf: PhantomData,
        })
    }

    /// Undoes `park` for an operation that never reached the kernel.
    pub(super) fn unpark(&mut self, slot: u32) -> Option<InFlight> {
        let op = self.slots[slot as usize].op.take();
        if op.is_some() {
            self.in_flight -= 1;
            self.free.push(slot);
        }
        op
    }

    /// Places one entry in the submission queue, flushing first if it is full.
    fn push(&mut self, entry: &squeue::Entry) -> Result<()> {
        for _ in 0..100_000 {
            // SAFETY: every pointer in `entry` points into state parked in `self.slots`
            // (buffer, msghdr, sockaddr) or into the pool region, which stays alive and in
            // place until the operation's last completion is reaped, or forever if `Drop`
            // gives up waiting.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.enter(0, None)?;
            if self.sqpoll && self.ring.submission().is_full() {
                // The kernel thread is awake but behind: block until it frees an entry
                // (IORING_ENTER_SQ_WAIT) rather than spin.
                self.stats.enters += 1;
                crate::sys::count();
                self.ring.submitter().squeue_wait()?;
            }
            self.reap();
        }
        Err(Error::Io(io::Error::new(
            io::ErrorKind::WouldBlock,
            "submission queue stayed full",
        )))
    }

    /// Makes queued entries visible to the kernel: `io_uring_enter` without SQPOLL, and
    /// under SQPOLL only when the kernel thread sleeps.
    pub fn flush(&mut self) -> Result<()> {
        self.enter(0, None)
    }

    /// Enters the kernel if needed to submit and, if `want > 0`, to wait for a completion.
    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Result<()> {
        let (pending, need_wakeup, kick) = {
            let sq = self.ring.submission();
            (
                !sq.is_empty(),
                sq.need_wakeup(),
                sq.cq_overflow() || sq.taskrun(),
            )
        };
        if self.sqpoll {
            // The kernel thread takes queued entries by itself unless it sleeps. The
            // SeqCst fence in need_wakeup() pairs with the kernel's barrier between
            // setting IORING_SQ_NEED_WAKEUP and re-reading the SQ tail.
            if want == 0 && !(pending && need_wakeup) && !kick {
                return Ok(());
            }
            if pending && need_wakeup {
                self.stats.sqpoll_wakeups += 1;
            }
        } else if want == 0 && !pending {
            return Ok(());
        }
        self.stats.enters += 1;
        crate::sys::count();
        let submitter = self.ring.submitter();
        let r = match timeout {
            None => submitter.submit_and_wait(want),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                submitter.submit_with_args(want, &args)
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::Io(e)),
        }
    }

    /// Takes every completion the kernel has posted and files it with its operation.
    /// Returns how many completion entries were seen. Never blocks, makes no syscall.
    pub fn reap(&mut self) -> usize {
        let mut seen = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            seen += 1;
            let ud = cqe.user_data();
            if ud == CANCEL_UD {
                continue;
            }
            let (slot, gen) = ((ud & 0xffff_ffff) as u32, (ud >> 32) as u32);
            let Some(s) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            if s.gen != gen {
                continue;
            }
            let Some(op) = s.op.as_mut() else { continue };
            let flags = cqe.flags();
            let res = cqe.result();
            if cqueue::notif(flags) {
                op.notif_pending = false;
                if notif_zc_copied(res) {
                    op.zc_copied = true;
                    self.stats.zc_copied += 1;
                }
            } else {
                op.result = Some(res);
                op.notif_pending = op.kind == Kind::SendZc && cqueue::more(flags);
                if op.kind == Kind::SendZc && res >= 0 {
                    self.stats.zc_sent += 1;
                }
                if res == -libc::ECANCELED {
                    self.stats.cancelled += 1;
                }
            }
            if op.done() {
                self.stats.completed += 1;
            }
        }
        seen
    }

    fn lookup<B>(&self, t: &Ticket<B>) -> Result<&InFlight> {
        if t.ring != self.id {
            return Err(Error::InvalidArgument("ticket from another ring"));
        }
        match self.slots.get(t.slot as usize) {
            Some(Slot { gen, op: Some(op) }) if *gen == t.gen => Ok(op),
            _ => Err(Error::InvalidArgument("stale ticket")),
        }
    }

    /// Whether the operation has finished (its buffer is ready to come back). Reaps
    /// first; makes no syscall.
    pub fn is_done<B>(&mut self, t: &Ticket<B>) -> Result<bool> {
        self.reap();
        Ok(self.lookup(t)?.done())
    }

    /// Asks the kernel to cancel the operation (`IORING_OP_ASYNC_CANCEL`); it then
    /// completes with `ECANCELED`, or normally if it was already done. Wait for it as usual.
    pub fn cancel<B>(&mut self, t: &Ticket<B>) -> Result<()> {
        self.lookup(t)?;
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::user_data(t.user_data()))
            .build()
            .user_data(CANCEL_UD);
        self.push(&e)?;
        self.flush()
    }

    /// Waits until the operation finishes and returns its result and buffer.
    ///
    /// Busy-polls the completion queue for the spin time (see [`Uring::set_spin`]), then
    /// blocks in `io_uring_enter`.
    pub fn wait<B: 'static>(&mut self, t: Ticket<B>) -> Result<Completion<B>> {
        self.lookup(&t)?;
        self.flush()?;
        let start = Instant::now();
        loop {
            self.reap();
            if self.lookup(&t)?.done() {
                break;
            }
            if !self.spin.is_zero() && start.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            self.enter(1, None)?;
        }
        let op = self.unpark(t.slot).expect("looked up above");
        Ok(finish(op))
    }

    /// Waits for the operation at most `timeout`; gives the ticket back if it is still
    /// running.
    pub fn wait_timeout<B: 'static>(
        &mut self,
        t: Ticket<B>,
        timeout: Duration,
    ) -> Result<std::result::Result<Completion<B>, Ticket<B>>> {
        self.lookup(&t)?;
        self.flush()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.reap();
            if self.lookup(&t)?.done() {
                let op = self.unpark(t.slot).expect("looked up above");
                return Ok(Ok(finish(op)));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Err(t));
            }
            self.enter(1, Some(deadline - now))?;
        }
    }
}

/// Turns a finished operation into the caller's completion.
fn finish<B: 'static>(op: InFlight) -> Completion<B> {
    let res = op.result.expect("finished operations have a result");
    let (peer, truncated) = match (&op.msg, op.kind) {
        (Some(m), Kind::RecvFrom) if res >= 0 => (m.peer(), m.truncated()),
        _ => (None, false),
    };
    let buf = *op
        .buf
        .downcast::<B>()
        .expect("a ticket's type matches the buffer it parked");
    Completion {
        result: if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        },
        buf,
        peer,
        truncated,
        zc_copied: op.zc_copied,
    }
}

impl Uring {
    /// Operations the kernel has not finished with (their buffers cannot be freed yet).
    fn running(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.op.as_ref().is_some_and(|op| !op.done()))
            .count()
    }

    /// Cancels everything still running (`IORING_OP_ASYNC_CANCEL` matching any request)
    /// and waits for every completion and every SEND_ZC notification, for at most
    /// `patience`. True when the kernel has answered for all of them.
    fn quiesce(&mut self, patience: Duration) -> bool {
        if self.running() == 0 {
            return true;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_UD);
        let _ = self.push(&cancel);
        let deadline = Instant::now() + patience;
        loop {
            self.reap();
            if self.running() == 0 {
                return true;
            }
            let now = Instant::now();
            let step = (deadline.saturating_duration_since(now)).min(Duration::from_millis(100));
            if now >= deadline || self.enter(1, Some(step)).is_err() {
                return false;
            }
        }
    }

    /// Cancels what is still running, waits for the kernel to let go of every buffer
    /// (as `Drop` does), and returns the final counters.
    pub fn close(mut self) -> UringStats {
        self.quiesce(DROP_PATIENCE);
        self.stats
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        if self.quiesce(DROP_PATIENCE) {
            return; // the slots (and buffers) drop normally after the ring is closed
        }
        // The kernel did not answer: it may still write into these buffers after the ring
        // fd is closed, so they must never be freed.
        for s in &mut self.slots {
            if let Some(op) = s.op.take() {
                if !op.done() {
                    std::mem::forget(op);
                }
            }
        }
        if let Some(pool) = self.pool.take() {
            std::mem::forget(pool);
        }
    }
}
