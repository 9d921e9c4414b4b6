//! The ring core: the one place in ferry that owns an [`io_uring::IoUring`] and drives it.
//!
//! The driver ([`crate::uring::driver`]), the registration cache ([`crate::uring::xlate`])
//! and the VCM [`Endpoint`](crate::vcm::Endpoint) each keep their own per-operation state; this
//! module does the part they share, once:
//!
//! - **push**: [`Ring::push`] places one entry and reports a full submission queue
//!   ([`SqFull`]); what to do about it (flush and retry, refuse, give up) is the caller's
//!   policy.
//! - **enter**: [`Ring::flush`] and [`Ring::wait`] are the only calls to
//!   `io_uring_enter(2)` (plus [`Ring::sq_wait`]); each one is counted with
//!   `crate::sys::count()` and in [`Ring::enters`], so the "no system call" figures are
//!   measured, not assumed.
//! - **SQPOLL**: [`Ring::flush`] enters only when the kernel thread sleeps
//!   (`IORING_SQ_NEED_WAKEUP`, counted in [`Ring::wakeups`]) or holds overflowed
//!   completions or task work.
//! - **reap**: [`Ring::reap`] copies completions out of the completion queue as [`Cqe`]s,
//!   which decode the SEND_ZC flags (`IORING_CQE_F_MORE`, `IORING_CQE_F_NOTIF`,
//!   `IORING_NOTIF_USAGE_ZC_COPIED`).
//! - **user_data**: [`user_data`] packs a slot index and a 32-bit tag; [`CANCEL`] is kept
//!   for the core's own cancel requests, whose completions [`Ring::reap`] swallows.
//! - **drain**: [`drain`] cancels everything in flight and waits, for at most
//!   [`DRAIN_PATIENCE`], until the owner says nothing is running. If the kernel never
//!   answers, the owner must leak the memory those operations point into, never free it.
//!
//! # Retry policy for `io_uring_enter`
//!
//! One policy for every caller: `EINTR` (a signal arrived) is retried at once, and counted
//! again, since nothing happened; `ETIME` (the wait's timeout passed), `EAGAIN` (the kernel
//! could not allocate request memory right now) and `EBUSY` (the completion queue is
//! overflowing) return `Ok(false)`: the entries stay queued, and the caller reaps
//! completions (which makes room) and enters again if it still has reason to. Every other
//! error is returned.

use std::io;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::probe::RingConfig;
use crate::error::{Error, Result};

/// `IORING_SEND_ZC_REPORT_USAGE`: asks a SEND_ZC notification to say whether the kernel
/// copied the data after all (the io-uring crate keeps its `sys` module private).
pub(crate) const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;

/// Whether a SEND_ZC notification's `res` carries `IORING_NOTIF_USAGE_ZC_COPIED`: the
/// kernel copied the data instead of sending the pages (always the case on loopback).
fn notif_zc_copied(res: i32) -> bool {
    res as u32 & (1 << 31) != 0
}

/// `user_data` of the core's own cancel requests; [`user_data`] never produces it for a
/// slot below `u32::MAX`, and [`Ring::reap`] never hands its completions on.
const CANCEL: u64 = u64::MAX;

/// How long [`drain`] waits for the kernel to answer for cancelled operations before the
/// owner leaks their memory. A cancel is normally answered within microseconds; what can
/// take longer is an operation the kernel cannot cancel once started (a read or write of
/// a regular file in an io-wq worker), which finishes when the device answers. Five
/// seconds covers a slow or loaded device on a noisy machine, so leaking stays the rare
/// case, while a drop that hangs on a stuck kernel still ends.
pub(crate) const DRAIN_PATIENCE: Duration = Duration::from_secs(5);

/// The longest single blocking enter while draining, so the deadline is checked.
const DRAIN_STEP: Duration = Duration::from_millis(100);

/// Packs a slot index and a 32-bit tag (a generation, or a generation and a part) into an
/// entry's `user_data`. Any slot below `u32::MAX` gives a value other than [`CANCEL`].
pub(crate) fn user_data(slot: u32, tag: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(tag)
}

/// The slot and tag packed by [`user_data`].
pub(crate) fn split_user_data(ud: u64) -> (u32, u32) {
    ((ud >> 32) as u32, ud as u32)
}

/// `IORING_OP_ASYNC_CANCEL` for the requests `which` matches, with [`CANCEL`] as its own
/// `user_data` (so its completion is swallowed by [`Ring::reap`]). It points to no memory.
pub(crate) fn cancel_entry(which: types::CancelBuilder) -> squeue::Entry {
    opcode::AsyncCancel2::new(which).build().user_data(CANCEL)
}

/// The submission queue had no free entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqFull;

/// One completion, copied out of the completion queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cqe {
    /// The `user_data` of the entry it completes.
    pub(crate) user_data: u64,
    /// The result: a count, or a negated errno.
    pub(crate) result: i32,
    /// The `IORING_CQE_F_*` flags.
    pub(crate) flags: u32,
}

impl Cqe {
    /// The operation's result, with its notification still to come (`IORING_CQE_F_MORE`
    /// on a SEND_ZC result): the kernel may still read the buffer.
    pub(crate) fn more(&self) -> bool {
        cqueue::more(self.flags)
    }

    /// A SEND_ZC notification (`IORING_CQE_F_NOTIF`): the kernel no longer uses the buffer.
    pub(crate) fn notif(&self) -> bool {
        cqueue::notif(self.flags)
    }

    /// A SEND_ZC notification whose `res` carries `IORING_NOTIF_USAGE_ZC_COPIED`: the
    /// kernel copied the data instead of sending the pages (always the case on loopback).
    pub(crate) fn zc_copied(&self) -> bool {
        self.notif() && notif_zc_copied(self.result)
    }

    /// The slot and tag of its `user_data` (see [`user_data`]).
    pub(crate) fn slot_tag(&self) -> (u32, u32) {
        split_user_data(self.user_data)
    }
}

/// An io_uring instance: the submission and completion queues, and the counters of every
/// `io_uring_enter` made on them. See the [module docs](self).
pub(crate) struct Ring {
    ring: IoUring,
    sqpoll: bool,
    enters: u64,
    wakeups: u64,
}

impl Ring {
    /// Builds a ring from `opts` (one `io_uring_setup(2)`).
    pub(crate) fn new(opts: &RingConfig) -> Result<Ring> {
        let ring = opts.build()?;
        let sqpoll = ring.params().is_setup_sqpoll();
        Ok(Ring {
            ring,
            sqpoll,
            enters: 0,
            wakeups: 0,
        })
    }

    /// Whether the ring has an SQPOLL kernel thread.
    pub(crate) fn is_sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// `io_uring_enter(2)` calls made on this ring so far.
    pub(crate) fn enters(&self) -> u64 {
        self.enters
    }

    /// Of those, the ones made to wake a sleeping SQPOLL thread.
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups
    }

    /// Whether the SQPOLL thread has gone to sleep (`IORING_SQ_NEED_WAKEUP`), so the next
    /// flush costs an `io_uring_enter`. Always false without SQPOLL.
    pub(crate) fn sq_thread_asleep(&mut self) -> bool {
        // need_wakeup() issues the SeqCst fence that pairs with the kernel's barrier
        // between setting IORING_SQ_NEED_WAKEUP and re-reading the SQ tail.
        self.sqpoll && self.ring.submission().need_wakeup()
    }

    /// Entries the submission queue holds in all.
    pub(crate) fn sq_capacity(&mut self) -> usize {
        self.ring.submission().capacity()
    }

    /// Entries free in the submission queue right now.
    pub(crate) fn sq_free(&mut self) -> usize {
        let mut sq = self.ring.submission();
        sq.sync();
        sq.capacity() - sq.len()
    }

    /// Whether the kernel holds completions that did not fit the completion queue
    /// (`IORING_SQ_CQ_OVERFLOW`); a [`Ring::flush`] moves them in.
    pub(crate) fn cq_overflow(&mut self) -> bool {
        self.ring.submission().cq_overflow()
    }

    /// Places one entry in the submission queue (not yet seen by the kernel without
    /// SQPOLL: see [`Ring::flush`]).
    ///
    /// # Safety
    ///
    /// Every pointer in `entry` (buffers, `msghdr`s, addresses) must stay valid, and the
    /// memory must not be used in a way the operation forbids, until the operation's last
    /// completion (for SEND_ZC, its notification) has been reaped, or for ever if the
    /// owner gives up waiting ([`drain`]).
    pub(crate) unsafe fn push(&mut self, entry: &squeue::Entry) -> std::result::Result<(), SqFull> {
        // SAFETY: the caller keeps what `entry` points to valid until its completion.
        unsafe { self.ring.submission().push(entry) }.map_err(|_| SqFull)
    }

    /// Makes queued entries visible to the kernel: one `io_uring_enter` without SQPOLL if
    /// any are queued; under SQPOLL only if the kernel thread sleeps with entries queued.
    /// Either way it also enters when the kernel holds overflowed completions or task
    /// work. Returns whether it entered and the kernel took the call (see the retry
    /// policy in the [module docs](self)).
    pub(crate) fn flush(&mut self) -> Result<bool> {
        let (pending, need_wakeup, kick) = {
            let sq = self.ring.submission();
            let pending = !sq.is_empty();
            (
                pending,
                self.sqpoll && pending && sq.need_wakeup(),
                sq.cq_overflow() || sq.taskrun(),
            )
        };
        let needed = if self.sqpoll {
            need_wakeup || kick
        } else {
            pending || kick
        };
        if !needed {
            return Ok(false);
        }
        if need_wakeup {
            self.wakeups += 1;
        }
        self.enter(0, None)
    }

    /// Submits what is queued and blocks until at least `want` completions are posted,
    /// or `timeout` passes. Always one `io_uring_enter` (more if interrupted). Returns
    /// whether the kernel took the call (see the retry policy in the
    /// [module docs](self)).
    pub(crate) fn wait(&mut self, want: usize, timeout: Option<Duration>) -> Result<bool> {
        self.enter(want, timeout)
    }

    /// Blocks until the SQPOLL thread has taken an entry (`IORING_ENTER_SQ_WAIT`): for a
    /// queue that stays full while the thread is awake but behind.
    pub(crate) fn sq_wait(&mut self) -> Result<()> {
        self.enters += 1;
        crate::sys::count();
        self.ring.submitter().squeue_wait()?;
        Ok(())
    }

    /// The one `io_uring_enter` of ferry, with its retry policy (module docs).
    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Result<bool> {
        loop {
            self.enters += 1;
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
            return match r {
                Ok(_) => Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
                {
                    Ok(false)
                }
                Err(e) => Err(Error::Io(e)),
            };
        }
    }

    /// Copies up to `out.len()` posted completions into `out`; returns how many it copied
    /// and how many it consumed. The completions of the core's own cancel requests
    /// ([`CANCEL`]) are consumed, not copied. Never blocks, makes no system call.
    pub(crate) fn reap_into(&mut self, out: &mut [Cqe]) -> (usize, usize) {
        let (mut n, mut seen) = (0, 0);
        let mut cq = self.ring.completion();
        while n < out.len() {
            let Some(c) = cq.next() else { break };
            seen += 1;
            if c.user_data() == CANCEL {
                continue;
            }
            out[n] = Cqe {
                user_data: c.user_data(),
                result: c.result(),
                flags: c.flags(),
            };
            n += 1;
        }
        (n, seen)
    }

    /// Hands every posted completion to `f` (the core's own cancel completions excepted)
    /// and returns how many completion entries it consumed, those included. Never blocks,
    /// makes no system call.
    pub(crate) fn reap(&mut self, mut f: impl FnMut(Cqe)) -> usize {
        let mut batch = [Cqe::default(); 32];
        let mut total = 0;
        loop {
            let (n, seen) = self.reap_into(&mut batch);
            batch[..n].iter().for_each(|&c| f(c));
            total += seen;
            if n < batch.len() {
                return total;
            }
        }
    }

    /// Queues [`cancel_entry`]`(which)`; a full queue is flushed once first.
    pub(crate) fn push_cancel(&mut self, which: types::CancelBuilder) -> Result<()> {
        let cancel = cancel_entry(which);
        // SAFETY: a cancel entry points to no memory.
        if unsafe { self.push(&cancel) }.is_ok() {
            return Ok(());
        }
        self.flush()?;
        // SAFETY: as above.
        unsafe { self.push(&cancel) }.map_err(|SqFull| {
            Error::Io(io::Error::new(
                io::ErrorKind::WouldBlock,
                "submission queue stayed full",
            ))
        })
    }

    /// Sets up a sparse registered-file table (`IORING_REGISTER_FILES2` with
    /// `IORING_RSRC_REGISTER_SPARSE`).
    pub(crate) fn register_files_sparse(&mut self, slots: u32) -> Result<()> {
        crate::sys::count();
        self.ring.submitter().register_files_sparse(slots)?;
        Ok(())
    }

    /// Replaces file-table entries from `index` on (`IORING_REGISTER_FILES_UPDATE`; -1
    /// empties a slot). The ring keeps its own reference to each file.
    pub(crate) fn register_files_update(&mut self, index: u32, fds: &[i32]) -> Result<()> {
        crate::sys::count();
        self.ring.submitter().register_files_update(index, fds)?;
        Ok(())
    }

    /// Registers `iovecs` as the buffer table (`IORING_REGISTER_BUFFERS`).
    ///
    /// # Safety
    ///
    /// The memory the iovecs cover must stay valid until the ring is dropped.
    pub(crate) unsafe fn register_buffers(&mut self, iovecs: &[libc::iovec]) -> io::Result<()> {
        crate::sys::count();
        // SAFETY: the caller keeps the memory valid for the ring's life.
        unsafe { self.ring.submitter().register_buffers(iovecs) }
    }

    /// Sets up a sparse buffer table of `slots` empty entries (`IORING_REGISTER_BUFFERS2`
    /// with `IORING_RSRC_REGISTER_SPARSE`).
    pub(crate) fn register_buffers_sparse(&mut self, slots: u32) -> Result<()> {
        crate::sys::count();
        self.ring.submitter().register_buffers_sparse(slots)?;
        Ok(())
    }

    /// Replaces buffer-table entries from `index` on (`IORING_REGISTER_BUFFERS_UPDATE`).
    ///
    /// # Safety
    ///
    /// The memory the iovecs cover must stay valid while the table holds it (until it is
    /// replaced or the ring is dropped); registration pins the pages.
    pub(crate) unsafe fn register_buffers_update(
        &mut self,
        index: u32,
        iovecs: &[libc::iovec],
    ) -> io::Result<()> {
        crate::sys::count();
        // SAFETY: the caller keeps the memory valid while the table holds it.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(index, iovecs, None)
        }
    }
}

/// An owner of a [`Ring`] whose in-flight operations point into memory it owns.
pub(crate) trait Drain {
    /// The owner's ring.
    fn ring(&mut self) -> &mut Ring;
    /// Reaps posted completions into the owner's state and says whether the kernel has
    /// answered for every operation (results and SEND_ZC notifications).
    fn settled(&mut self) -> bool;
}

/// Cancels everything still running on `owner`'s ring (`IORING_OP_ASYNC_CANCEL` matching
/// any request) and waits for every completion, for at most [`DRAIN_PATIENCE`]. True when
/// the kernel has answered for all of them; false when it has not, and then the owner must
/// leak (never free) the memory the unanswered operations point into.
pub(crate) fn drain(owner: &mut impl Drain) -> bool {
    if owner.settled() {
        return true;
    }
    let _ = owner.ring().push_cancel(types::CancelBuilder::any());
    let deadline = Instant::now() + DRAIN_PATIENCE;
    loop {
        if owner.settled() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let step = (deadline - now).min(DRAIN_STEP);
        if owner.ring().wait(1, Some(step)).is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips_and_never_collides_with_cancel() {
        for (slot, tag) in [
            (0, 0),
            (7, u32::MAX),
            (u32::MAX - 1, u32::MAX),
            (1 << 24, 5),
        ] {
            let ud = user_data(slot, tag);
            assert_ne!(ud, CANCEL);
            assert_eq!(split_user_data(ud), (slot, tag));
        }
    }

    #[test]
    fn zc_copied_needs_a_notification() {
        let notif = 1 << 3; // IORING_CQE_F_NOTIF
        let copied = i32::MIN; // bit 31: IORING_NOTIF_USAGE_ZC_COPIED
        let c = |result, flags| Cqe {
            user_data: 0,
            result,
            flags,
        };
        assert!(c(copied, notif).zc_copied());
        assert!(!c(0, notif).zc_copied());
        assert!(!c(copied, 0).zc_copied());
        assert!(c(0, 1 << 1).more()); // IORING_CQE_F_MORE
    }

    /// A plain ring of 4 entries, or `None` (said why) where there is no io_uring.
    fn ring4() -> Option<Ring> {
        super::super::probe::have_ring_or_skip().then(|| Ring::new(&RingConfig::new(4)).unwrap())
    }

    #[test]
    fn a_nop_costs_one_counted_enter_and_the_cancel_is_swallowed() {
        let Some(mut r) = ring4() else { return };
        assert!(!r.flush().unwrap(), "nothing queued, nothing entered");
        let nop = io_uring::opcode::Nop::new()
            .build()
            .user_data(user_data(3, 9));
        // SAFETY: a nop points to no memory.
        unsafe { r.push(&nop) }.unwrap();
        r.push_cancel(types::CancelBuilder::user_data(1)).unwrap();
        let before = crate::sys::thread_syscall_count();
        assert!(r.wait(2, None).unwrap());
        assert_eq!(crate::sys::thread_syscall_count(), before + 1);
        assert_eq!(r.enters(), 1);
        let mut seen = Vec::new();
        r.reap(|c| seen.push(c.slot_tag()));
        assert_eq!(seen, vec![(3, 9)]);
    }

    #[test]
    fn a_full_queue_is_reported_and_a_flush_empties_it() {
        let Some(mut r) = ring4() else { return };
        let cap = r.sq_capacity();
        let nop = io_uring::opcode::Nop::new()
            .build()
            .user_data(user_data(0, 0));
        for _ in 0..cap {
            // SAFETY: a nop points to no memory.
            unsafe { r.push(&nop) }.unwrap();
        }
        assert_eq!(r.sq_free(), 0);
        // SAFETY: as above.
        assert_eq!(unsafe { r.push(&nop) }, Err(SqFull));
        assert!(r.flush().unwrap());
        assert_eq!(r.sq_free(), cap);
        let mut done = 0;
        while done < cap {
            done += r.reap(|c| assert_eq!(c.result, 0));
            if done < cap {
                r.wait(1, None).unwrap();
            }
        }
        assert_eq!(done, cap);
    }
}
