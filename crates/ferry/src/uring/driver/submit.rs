//! The driver's submission and completion on the ring core: parking an operation's state
//! under a ticket, pushing its entry, filing completions (SEND_ZC notifications included)
//! with their operations, waiting, cancelling, and the drain that runs on close and drop.

use std::io;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use io_uring::{squeue, types};

use super::inflight::{InFlight, Kind, Slot};
use super::{Completion, Ticket, Uring, UringStats};
use crate::error::{Error, Result};
use crate::uring::ring::{self, Cqe, Drain, Ring};

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
        let entry = entry.user_data(ring::user_data(slot, gen));
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
            // gives up waiting. A cancel entry points nowhere.
            if unsafe { self.ring.push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.flush()?;
            if self.ring.is_sqpoll() && self.ring.sq_free() == 0 {
                // The kernel thread is awake but behind: block until it frees an entry
                // (IORING_ENTER_SQ_WAIT) rather than spin.
                self.ring.sq_wait()?;
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
        self.ring.flush().map(drop)
    }

    /// Takes every completion the kernel has posted and files it with its operation.
    /// Returns how many completion entries were seen. Never blocks, makes no syscall.
    pub fn reap(&mut self) -> usize {
        let Uring {
            ring, slots, stats, ..
        } = self;
        ring.reap(|c| file(slots, stats, c))
    }

    fn lookup<B>(&self, t: &Ticket<B>) -> Result<&InFlight> {
        if t.ring != self.id {
            return Err(Error::WrongRing);
        }
        match self.slots.get(t.slot as usize) {
            Some(Slot { gen, op: Some(op) }) if *gen == t.gen => Ok(op),
            _ => Err(Error::StaleTicket),
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
        self.push(&ring::cancel_entry(types::CancelBuilder::user_data(
            t.user_data(),
        )))?;
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
            self.ring.wait(1, None)?;
        }
        let op = self.unpark(t.slot).expect("looked up above");
        Ok(finish(op))
    }

    /// Waits at most `timeout` for the operation to finish. `Ok(())` means it is done:
    /// collect its result and buffer with [`Uring::wait`], which then returns at once.
    ///
    /// The ticket is borrowed rather than taken because it stands for the buffer the
    /// kernel may still be writing: on a timeout the caller keeps it, to wait again,
    /// [`cancel`](Uring::cancel) the operation, or drop it (the ring then keeps the buffer
    /// until the kernel lets go of it).
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` passes first; [`Error::WrongRing`] or
    /// [`Error::StaleTicket`] for a ticket this ring does not hold.
    pub fn wait_timeout<B>(&mut self, t: &Ticket<B>, timeout: Duration) -> Result<()> {
        self.lookup(t)?;
        self.flush()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.reap();
            if self.lookup(t)?.done() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout);
            }
            self.ring.wait(1, Some(deadline - now))?;
        }
    }
}

/// Files one completion with the operation its `user_data` names; a completion for a
/// slot that has moved on (another generation) is ignored.
fn file(slots: &mut [Slot], stats: &mut UringStats, c: Cqe) {
    let (slot, gen) = c.slot_tag();
    let Some(s) = slots.get_mut(slot as usize) else {
        return;
    };
    if s.gen != gen {
        return;
    }
    let Some(op) = s.op.as_mut() else { return };
    if c.notif() {
        op.notif_pending = false;
        if c.zc_copied() {
            op.zc_copied = true;
            stats.zc_copied += 1;
        }
    } else {
        op.result = Some(c.result);
        op.notif_pending = op.kind == Kind::SendZc && c.more();
        if op.kind == Kind::SendZc && c.result >= 0 {
            stats.zc_sent += 1;
        }
        if c.result == -libc::ECANCELED {
            stats.cancelled += 1;
        }
    }
    if op.done() {
        stats.completed += 1;
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

    /// Cancels what is still running, waits for the kernel to let go of every buffer
    /// (as `Drop` does), and returns the final counters.
    pub fn close(mut self) -> UringStats {
        ring::drain(&mut self);
        self.stats()
    }
}

impl Drain for Uring {
    fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }

    fn settled(&mut self) -> bool {
        self.reap();
        self.running() == 0
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        if ring::drain(self) {
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
