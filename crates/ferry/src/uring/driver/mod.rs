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
//! use ferry::uring::{RingConfig, Uring};
//!
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().ring { return Ok(()); }
//! let file = tempfile_in_tmp()?;
//! let mut ring = Uring::new(&RingConfig::new(8))?;
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
mod inflight;
mod ops;
mod submit;
mod values;

pub use buf::{AlignedBuf, FixedBuf, FixedPool, IoBuf, IoBufMut};
pub use values::{Completion, Refused, Target, Ticket, UringStats};

use inflight::Slot;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::probe::{Features, RingConfig};
use super::ring::Ring;
use crate::error::{Error, Result};

static NEXT_RING_ID: AtomicU64 = AtomicU64::new(1);

/// An io_uring instance with owned-buffer operations on files and sockets.
///
/// Not `Sync`: one thread drives a ring (several rings can run on several threads).
pub struct Uring {
    // Field order matters: the ring is closed before the pool's memory is freed.
    ring: Ring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    id: u64,
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
            .field("sqpoll", &self.ring.is_sqpoll())
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Uring {
    /// Builds a ring (one `io_uring_setup(2)`); SQPOLL if the options ask for it.
    pub fn new(opts: &RingConfig) -> Result<Uring> {
        Uring::with_features(opts, Features::probe().clone())
    }

    /// As [`Uring::new`], but acting as if the kernel offered only `features`. Lets a
    /// program (or a test) take the fallback paths on a kernel that has everything.
    pub fn with_features(opts: &RingConfig, features: Features) -> Result<Uring> {
        let ring = Ring::new(opts)?;
        let sqpoll = ring.is_sqpoll();
        Ok(Uring {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            id: NEXT_RING_ID.fetch_add(1, Ordering::Relaxed),
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
        UringStats {
            enters: self.ring.enters(),
            sqpoll_wakeups: self.ring.wakeups(),
            ..self.stats
        }
    }

    /// The features this ring acts on.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// Whether the ring has an SQPOLL kernel thread.
    pub fn is_sqpoll(&self) -> bool {
        self.ring.is_sqpoll()
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
        self.ring.sq_thread_asleep()
    }

    /// Sets up a sparse registered-file table of `slots` entries
    /// (`IORING_REGISTER_FILES2` with `IORING_RSRC_REGISTER_SPARSE`); fill it with
    /// [`Uring::set_file`], then name files as [`Target::Fixed`].
    pub fn register_files(&mut self, slots: u32) -> Result<()> {
        self.features
            .require(self.features.fixed_files, "registered files")?;
        if !self.files.is_empty() {
            return Err(Error::AlreadyRegistered { what: "file table" });
        }
        if slots == 0 {
            return Err(Error::InvalidArgument(
                "a file table needs at least one slot",
            ));
        }
        self.ring.register_files_sparse(slots)?;
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
        self.ring.register_files_update(index, &[fd])?;
        self.files[index as usize] = true;
        Ok(())
    }

    /// Empties slot `index` of the file table.
    pub fn clear_file(&mut self, index: u32) -> Result<()> {
        if index as usize >= self.files.len() {
            return Err(Error::InvalidArgument("fixed file index out of range"));
        }
        self.ring.register_files_update(index, &[-1])?;
        self.files[index as usize] = false;
        Ok(())
    }

    /// Registers a pool of `slots` buffers of `slot_size` bytes (a multiple of the page
    /// size) with this ring (`IORING_REGISTER_BUFFERS`). One pool per ring.
    pub fn register_pool(&mut self, slot_size: usize, slots: u16) -> Result<FixedPool> {
        self.features
            .require(self.features.fixed_rw, "registered buffers")?;
        if self.pool.is_some() {
            return Err(Error::AlreadyRegistered {
                what: "buffer pool",
            });
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
        // SAFETY: the iovecs cover `inner.region`, which `self.pool` keeps alive (and in
        // place) until after the ring is closed: `ring` is dropped before `pool`.
        unsafe { self.ring.register_buffers(&iovecs)? };
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
                Some(false) => Err(Error::EmptySlot { index: i }),
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
            Some(_) => Err(Error::WrongRing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Option<Uring> {
        crate::uring::probe::have_ring_or_skip().then(|| Uring::new(&RingConfig::new(8)).unwrap())
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
    fn more_ops_than_ring_entries_all_complete() {
        if !Features::probe().ring {
            eprintln!("skipped: no io_uring here");
            return;
        }
        // 4 SQ entries (8 CQ entries) and 100 operations in flight: pushing flushes a full
        // submission queue, and completions beyond the CQ size wait in the kernel's
        // overflow list until reaped.
        let mut opts = vec![RingConfig::new(4)];
        if Features::probe().sqpoll {
            opts.push(RingConfig::new(4).sqpoll(10));
        } else {
            eprintln!("skipped part: no SQPOLL");
        }
        for o in opts {
            let mut r = Uring::new(&o).unwrap();
            let tickets: Vec<_> = (0..100).map(|_| r.submit_nop().unwrap()).collect();
            assert_eq!(r.in_flight(), 100);
            for t in tickets.into_iter().rev() {
                assert_eq!(r.wait(t).unwrap().result.unwrap(), 0);
            }
            let s = r.stats();
            assert_eq!((s.submitted, s.completed), (100, 100), "{o:?}");
            assert_eq!(r.in_flight(), 0);
        }
    }

    #[test]
    fn tickets_are_checked() {
        let Some(mut a) = ring() else { return };
        let mut b = Uring::new(&RingConfig::new(8)).unwrap();
        let t = a.submit_nop().unwrap();
        assert!(matches!(b.wait(t), Err(Error::WrongRing)));
        // The op stays with `a`, which drops cleanly with it in flight or done.
        drop(a);
        // A ticket whose operation was collected already (here a copy of one; the public
        // API moves tickets, so only a forged one can be stale).
        let t = b.submit_nop().unwrap();
        let copy = Ticket::<()> {
            ring: t.ring,
            slot: t.slot,
            gen: t.gen,
            _buf: std::marker::PhantomData,
        };
        b.wait(t).unwrap();
        assert!(matches!(b.is_done(&copy), Err(Error::StaleTicket)));
        assert!(matches!(
            b.wait_timeout(&copy, Duration::ZERO),
            Err(Error::StaleTicket)
        ));
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
