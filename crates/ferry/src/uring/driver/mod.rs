//! A safe, owned-buffer driver over io_uring for files and TCP/UDP sockets: the user-level
//! half of an *application device channel* (thesis ch. 6).
//!
//! In the thesis, an application talks to the network adaptor through a pair of shared
//! queues of buffer descriptors, and the OS keeps control by having the adaptor validate
//! every request against what it set up when the channel was opened. Here the queues are
//! io_uring's submission and completion rings, the kernel does the validating (registered
//! files and buffers are set up once, then named by index), and with SQPOLL the data path
//! needs no system call at all.
//!
//! Every operation takes its buffer **by value** and hands it back only in its
//! [`Completion`], so nothing lets the caller free or reuse memory the kernel may still
//! touch. A zero-copy send ([`Uring::submit_send_zc`]) keeps its buffer until the
//! kernel's *notification* completion arrives, not just the first one. Dropping a
//! [`Uring`] with operations in flight cancels them and waits for every completion before
//! freeing their buffers; if the kernel does not answer in time, the buffers are leaked,
//! never freed early.
//!
//! ```
//! use std::io::Write;
//! use std::os::fd::AsRawFd;
//! use ferry::uring::{driver::Uring, RingOptions};
//!
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().ring { return Ok(()); }
//! let file = tempfile_in_tmp()?;
//! let mut ring = Uring::new(&RingOptions::new(8))?;
//! let (res, buf) = ring.write_at(file.as_raw_fd(), b"hello, ring".to_vec(), 0);
//! assert_eq!(res?, 11);
//! assert_eq!(buf.len(), 11);                       // the buffer comes back
//! let (res, back) = ring.read_at(file.as_raw_fd(), vec![0u8; 11], 0);
//! assert_eq!(&back[..res?], b"hello, ring");
//! assert!(ring.stats().enters >= 2);
//! # Ok(()) }
//! # fn tempfile_in_tmp() -> std::io::Result<std::fs::File> {
//! #     let p = std::env::temp_dir().join(format!("ferry-doc-{}", std::process::id()));
//! #     let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p)?;
//! #     std::fs::remove_file(&p)?;
//! #     Ok(f)
//! # }
//! ```
//!
//! Missing kernel features are found by [`Features::probe`]: registered files and buffers
//! and SQPOLL refuse with [`Error::Unsupported`]; a missing `SEND_ZC` falls back to a
//! plain send and counts [`UringStats::zc_fallbacks`].

mod buf;
mod ops;

pub use buf::{AlignedBuf, FixedBuf, FixedPool, IoBuf, IoBufMut};

use std::any::Any;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::probe::{Features, RingOptions};
use crate::error::{Error, Result};

/// `IORING_NOTIF_USAGE_ZC_COPIED`: set in a SEND_ZC notification's `res` when the kernel
/// copied the data after all (the io-uring crate keeps its `sys` module private).
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// `IORING_SEND_ZC_REPORT_USAGE`: ask for the flag above.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// user_data of ferry's own cancel requests; never a ticket (generations skip it).
const CANCEL_UD: u64 = u64::MAX;
/// How long `Drop` waits for cancelled operations before leaking their buffers.
const DROP_PATIENCE: Duration = Duration::from_secs(5);

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

/// Counters of one [`Uring`], read with [`Uring::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Operations placed in the submission queue (ferry's own cancel requests excluded).
    pub submitted: u64,
    /// Operations whose buffer came back (for SEND_ZC: after the notification).
    pub completed: u64,
    /// `io_uring_enter(2)` calls this ring made (each also counted by `sys::count`).
    pub enters: u64,
    /// Enters that had to wake a sleeping SQPOLL thread (`IORING_ENTER_SQ_WAKEUP`).
    pub sqpoll_wakeups: u64,
    /// Operations that used a registered buffer (`READ_FIXED`, `WRITE_FIXED`, fixed SEND_ZC).
    pub fixed_ops: u64,
    /// Operations that named a registered file.
    pub fixed_file_ops: u64,
    /// SEND_ZC operations that completed without error.
    pub zc_sent: u64,
    /// SEND_ZC notifications saying the kernel copied anyway (`IORING_NOTIF_USAGE_ZC_COPIED`);
    /// always the case on loopback and veth.
    pub zc_copied: u64,
    /// Zero-copy sends done as plain sends because the kernel lacks SEND_ZC.
    pub zc_fallbacks: u64,
    /// Operations that ended with `ECANCELED`.
    pub cancelled: u64,
}

/// Where an operation goes: a plain descriptor or a slot of the registered file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A file descriptor of this process.
    Fd(RawFd),
    /// An index into the table set up by [`Uring::register_files`].
    Fixed(u32),
}

impl From<RawFd> for Target {
    fn from(fd: RawFd) -> Target {
        Target::Fd(fd)
    }
}

impl<T: AsRawFd> From<&T> for Target {
    fn from(fd: &T) -> Target {
        Target::Fd(fd.as_raw_fd())
    }
}

/// A submitted operation; trade it for its [`Completion`] with [`Uring::wait`].
///
/// A ticket that is dropped unused leaves its buffer with the ring until the ring is
/// dropped (never freed while the kernel may use it).
#[must_use = "the buffer comes back only through Uring::wait"]
#[derive(Debug)]
pub struct Ticket<B> {
    ring: u64,
    slot: u32,
    gen: u32,
    _buf: PhantomData<fn() -> B>,
}

impl<B> Ticket<B> {
    fn user_data(&self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.slot)
    }
}

/// The end of an operation: its result and its buffer, returned to the caller.
#[derive(Debug)]
pub struct Completion<B> {
    /// Bytes transferred, or the error the kernel reported (e.g. `EBADF`, `ECANCELED`).
    pub result: io::Result<usize>,
    /// The buffer the operation owned.
    pub buf: B,
    /// For `recv_from`: the sender's address.
    pub peer: Option<SocketAddr>,
    /// For `recv_from`: the datagram was longer than the buffer (`MSG_TRUNC`); the excess
    /// was discarded.
    pub truncated: bool,
    /// For a zero-copy send: the kernel reported that it copied the data after all.
    pub zc_copied: bool,
}

/// An operation refused before submission, with its buffer handed back.
pub struct Refused<B> {
    /// Why it was refused.
    pub error: Error,
    /// The caller's buffer, untouched.
    pub buf: B,
}

impl<B> std::fmt::Debug for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<B> std::fmt::Display for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "operation refused: {}", self.error)
    }
}

impl<B> std::error::Error for Refused<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<Refused<B>> for Error {
    fn from(r: Refused<B>) -> Error {
        r.error
    }
}

/// What kind of operation a slot holds, for completion handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    SendZc,
    RecvFrom,
}

/// An operation the kernel may still be working on; owns everything the SQE points to.
struct InFlight {
    buf: Box<dyn Any + Send>,
    msg: Option<Box<ops::MsgState>>,
    kind: Kind,
    result: Option<i32>,
    notif_pending: bool,
    zc_copied: bool,
}

impl InFlight {
    fn done(&self) -> bool {
        self.result.is_some() && !self.notif_pending
    }
}

struct Slot {
    gen: u32,
    op: Option<InFlight>,
}

/// An io_uring instance with owned-buffer operations on files and sockets.
///
/// Not `Sync`: one thread drives a ring (several rings can run on several threads).
pub struct Uring {
    // Field order matters: the ring is closed before the pool's memory is freed.
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    id: u64,
    sqpoll: bool,
    spin: Duration,
    features: Features,
    files: Vec<bool>,
    pool: Option<Arc<buf::PoolInner>>,
    stats: UringStats,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("id", &self.id)
            .field("sqpoll", &self.sqpoll)
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Uring {
    /// Builds a ring (one `io_uring_setup(2)`); SQPOLL if the options ask for it.
    pub fn new(opts: &RingOptions) -> Result<Uring> {
        Uring::with_features(opts, Features::probe().clone())
    }

    /// As [`Uring::new`], but acting as if the kernel offered only `features`. Lets a
    /// program (or a test) take the fallback paths on a kernel that has everything.
    pub fn with_features(opts: &RingOptions, features: Features) -> Result<Uring> {
        let ring = opts.build()?;
        let sqpoll = ring.params().is_setup_sqpoll();
        Ok(Uring {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            id: NEXT_RING_ID.fetch_add(1, Ordering::Relaxed),
            sqpoll,
            spin: if sqpoll {
                Duration::from_micros(50)
            } else {
                Duration::ZERO
            },
            features,
            files: Vec::new(),
            pool: None,
            stats: UringStats::default(),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> UringStats {
        self.stats
    }

    /// The features this ring acts on.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Whether the ring has an SQPOLL kernel thread.
    pub fn is_sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// Operations whose buffers the ring still holds.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// How long [`Uring::wait`] busy-polls the completion queue before blocking in the
    /// kernel. Defaults: 50 µs with SQPOLL (so steady-state waits make no syscall), 0
    /// otherwise.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Whether the SQPOLL thread has gone to sleep (`IORING_SQ_NEED_WAKEUP`), so the next
    /// submission costs an `io_uring_enter`. Always false without SQPOLL.
    pub fn sq_thread_asleep(&mut self) -> bool {
        self.sqpoll && self.ring.submission().need_wakeup()
    }

    /// Sets up a sparse registered-file table of `slots` entries
    /// (`IORING_REGISTER_FILES2` with `IORING_RSRC_REGISTER_SPARSE`); fill it with
    /// [`Uring::set_file`], then name files as [`Target::Fixed`].
    pub fn register_files(&mut self, slots: u32) -> Result<()> {
        self.features
            .require(self.features.fixed_files, "registered files")?;
        if !self.files.is_empty() {
            return Err(Error::InvalidArgument(
                "the file table is already registered",
            ));
        }
        if slots == 0 {
            return Err(Error::InvalidArgument(
                "a file table needs at least one slot",
            ));
        }
        crate::sys::count();
        self.ring.submitter().register_files_sparse(slots)?;
        self.files = vec![false; slots as usize];
        Ok(())
    }

    /// Puts `fd` in slot `index` of the file table (`IORING_REGISTER_FILES_UPDATE`); the
    /// ring keeps its own reference, so the caller may close `fd` afterwards.
    pub fn set_file(&mut self, index: u32, fd: RawFd) -> Result<()> {
        if index as usize >= self.files.len() {
            return Err(Error::InvalidArgument("fixed file index out of range"));
        }
        if fd < 0 {
            return Err(Error::InvalidArgument("negative file descriptor"));
        }
        crate::sys::count();
        self.ring.submitter().register_files_update(index, &[fd])?;
        self.files[index as usize] = true;
        Ok(())
    }

    /// Empties slot `index` of the file table.
    pub fn clear_file(&mut self, index: u32) -> Result<()> {
        if index as usize >= self.files.len() {
            return Err(Error::InvalidArgument("fixed file index out of range"));
        }
        crate::sys::count();
        self.ring.submitter().register_files_update(index, &[-1])?;
        self.files[index as usize] = false;
        Ok(())
    }

    /// Registers a pool of `slots` buffers of `slot_size` bytes (a multiple of the page
    /// size) with this ring (`IORING_REGISTER_BUFFERS`). One pool per ring.
    pub fn register_pool(&mut self, slot_size: usize, slots: u16) -> Result<FixedPool> {
        self.features
            .require(self.features.fixed_rw, "registered buffers")?;
        if self.pool.is_some() {
            return Err(Error::InvalidArgument(
                "this ring already has a buffer pool",
            ));
        }
        let page = crate::sys::page_size();
        if slot_size == 0 || slot_size % page != 0 || slot_size > (1 << 30) {
            return Err(Error::InvalidArgument(
                "slot size must be a page multiple of at most 1 GiB",
            ));
        }
        if slots == 0 || slots > 16384 {
            return Err(Error::InvalidArgument("a pool has 1 to 16384 slots"));
        }
        let inner = Arc::new(buf::PoolInner::new(self.id, slot_size, slots));
        let base = inner.region.as_ptr() as usize;
        let iovecs: Vec<libc::iovec> = (0..slots as usize)
            .map(|i| libc::iovec {
                iov_base: (base + i * slot_size) as *mut libc::c_void,
                iov_len: slot_size,
            })
            .collect();
        crate::sys::count();
        // SAFETY: the iovecs cover `inner.region`, which `self.pool` keeps alive (and in
        // place) until after the ring is closed: `ring` is dropped before `pool`.
        unsafe { self.ring.submitter().register_buffers(&iovecs)? };
        self.pool = Some(Arc::clone(&inner));
        Ok(FixedPool { inner })
    }

    /// Checks a target before submission: a fixed index must name a filled slot.
    fn check_target(&mut self, t: Target) -> Result<()> {
        match t {
            Target::Fd(fd) if fd < 0 => Err(Error::InvalidArgument("negative file descriptor")),
            Target::Fd(_) => Ok(()),
            Target::Fixed(i) => match self.files.get(i as usize) {
                None => Err(Error::InvalidArgument("fixed file index out of range")),
                Some(false) => Err(Error::InvalidArgument("fixed file slot is empty")),
                Some(true) => {
                    self.stats.fixed_file_ops += 1;
                    Ok(())
                }
            },
        }
    }

    /// Checks that a buffer's registered slot, if it has one, belongs to this ring.
    fn fixed_index<B: IoBuf>(&self, b: &B) -> Result<Option<u16>> {
        match b.fixed_slot() {
            None => Ok(None),
            Some((ring, idx)) if ring == self.id => Ok(Some(idx)),
            Some(_) => Err(Error::InvalidArgument(
                "the FixedBuf was registered with another ring",
            )),
        }
    }

    /// Takes a free slot and parks the operation's owned state in it.
    fn park(&mut self, op: InFlight) -> (u32, u32) {
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
    fn push_parked<B>(&mut self, slot: u32, gen: u32, entry: squeue::Entry) -> Result<Ticket<B>> {
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
    fn unpark(&mut self, slot: u32) -> Option<InFlight> {
        let op = self.slots[slot as usize].op.take();
        if op.is_some() {
            self.in_flight -= 1;
            self.free.push(slot);
        }
        op
    }

    /// Places one entry in the submission queue, flushing first if it is full.
    fn push(&mut self, entry: &squeue::Entry) -> Result<()> {
        for _ in 0..1_000_000 {
            // SAFETY: every pointer in `entry` points into state parked in `self.slots`
            // (buffer, msghdr, sockaddr) or into the pool region, which stays alive and in
            // place until the operation's last completion is reaped, or forever if `Drop`
            // gives up waiting.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.enter(0, None)?;
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
                if res as u32 & NOTIF_USAGE_ZC_COPIED != 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Option<Uring> {
        if !Features::probe().ring {
            eprintln!("skipped: no io_uring here");
            return None;
        }
        Some(Uring::new(&RingOptions::new(8)).unwrap())
    }

    #[test]
    fn nop_round_trip_counts_one_enter() {
        let Some(mut r) = ring() else { return };
        let t = r.submit_nop().unwrap();
        let c = r.wait(t).unwrap();
        assert_eq!(c.result.unwrap(), 0);
        let s = r.stats();
        assert_eq!((s.submitted, s.completed), (1, 1));
        assert_eq!(s.enters, 1, "submit and wait share one io_uring_enter");
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn tickets_are_checked() {
        let Some(mut a) = ring() else { return };
        let mut b = Uring::new(&RingOptions::new(8)).unwrap();
        let t = a.submit_nop().unwrap();
        assert!(matches!(b.wait(t), Err(Error::InvalidArgument(_))));
        // The op stays with `a`, which drops cleanly with it in flight or done.
        drop(a);
    }

    #[test]
    fn fixed_file_index_out_of_range_is_refused_before_submission() {
        let Some(mut r) = ring() else { return };
        let before = r.stats().submitted;
        let err = r
            .submit_read_at(Target::Fixed(3), vec![0u8; 8], 0)
            .unwrap_err();
        assert!(
            matches!(err.error, Error::InvalidArgument(_)),
            "{:?}",
            err.error
        );
        assert_eq!(err.buf.len(), 8, "the buffer comes back");
        assert_eq!(r.stats().submitted, before);
    }
}
