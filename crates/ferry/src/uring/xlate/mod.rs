//! xlate: a registration cache that lets io_uring use *any* user buffer as a registered
//! (fixed) buffer, with a single-copy fallback on a miss (Schoinas & Hill's user-controlled
//! mappings).
//!
//! An [`Xlate`] owns one ring with a sparse registered-buffer table
//! (`IORING_REGISTER_BUFFERS2` with `IORING_RSRC_REGISTER_SPARSE`, updated slot by slot
//! with `IORING_REGISTER_BUFFERS_UPDATE`). Its kernel slots are laid out as:
//!
//! ```text
//! | bounce 0 .. bounce B-1 | scratch | cache 0 .. cache T-1 |
//!   pre-registered memfd     per-I/O   page-aligned ranges of user memory, LRU
//! ```
//!
//! Each I/O looks its buffer up in a user-level table of registered ranges
//! (`table::Table`). A hit runs `WRITE_FIXED` / `READ_FIXED` with the fixed buffer
//! straight from the caller's pages; so does a send, as `WRITE_FIXED` on the socket
//! ([`SendOp`]; `SEND_ZC` on request). A miss goes through a bounce buffer at once
//! (one copy) and the miss is *served later*: once the I/O is submitted, and only if at
//! least `rate_limit` bytes have moved since the last registration (the paper's
//! hysteresis), the range is registered so the next I/O on it hits. Replacement is LRU,
//! and a slot with I/O in flight is never evicted.
//!
//! # Unmapping and remapping (why userfaultfd)
//!
//! A registered buffer pins the pages that were mapped when it was registered. If the
//! application `munmap`s the range and maps new memory at the same address, a cache keyed
//! by address would keep sending the *old* pages. xlate watches every cached range with a
//! userfaultfd (`sys::uffd`) registered in write-protect mode with nothing
//! protected, so no access ever faults; it only asks for the unmap, remove
//! (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`) and remap events. The kernel makes the
//! thread that unmaps wait until the event has been read (checked on 6.18: the
//! `munmap` does not return before). One monitor thread per process polls the userfaultfd
//! *without* any lock, then takes the lock of every cache's table, reads the events and
//! drops the overlapping entries before releasing them. So by the time `munmap` (or
//! `mmap(MAP_FIXED)`, `madvise`, `mremap`) returns, the entry is gone, and any lookup
//! after that return sees it gone. A range is watched and registered under its table's
//! lock, so an event cannot slip between the two. The userfaultfd and the monitor are
//! shared by all caches of the process because a range can be watched by one userfaultfd
//! only; a forked child opens its own.
//!
//! Alternatives rejected: `/proc/self/pagemap` needs CAP_SYS_ADMIN for page frame numbers
//! and a read per lookup; hooking `munmap`/`mmap` with `LD_PRELOAD` misses raw syscalls and
//! other libraries' calls. Memory a userfaultfd cannot watch (a file mapping on ext4, for
//! example, which io_uring refuses to register anyway, or a range the application watches
//! with its own userfaultfd) never enters the cache: it always bounces, counted in
//! [`XlateStats::register_failures`]. If userfaultfd is unavailable (or
//! [`XlateConfig::watch_unmaps`] is off), the cache does not cache at all: every I/O
//! bounces and counts in [`XlateStats::uncached`], rather than risk stale data.
//!
//! Sends: `IORING_OP_SEND` refuses `IORING_RECVSEND_FIXED_BUF` (`EINVAL` on 6.18; only
//! `SEND_ZC` takes it), and `SEND_ZC` completes only when its notification arrives, which
//! on loopback means once the peer has read the data. `WRITE_FIXED` on a socket goes
//! through the socket's `write_iter` with the registered pages, completes once the data
//! is queued, and needs no notification; it is probed ([`Features::socket_write_fixed`])
//! and used by default. Like `send(2)` without `MSG_NOSIGNAL`, such a write to a closed
//! connection raises `SIGPIPE` (Rust programs ignore it by default); the `SEND` and
//! `SEND_ZC` paths pass `MSG_NOSIGNAL` and report `EPIPE` instead.
//!
//! Limits: an invalidated entry leaves its kernel slot registered until the slot is
//! reused or the [`Xlate`] is dropped, so the old pages stay pinned (and counted against
//! `RLIMIT_MEMLOCK` for unprivileged users) after the application freed them: up to
//! `table_slots` ranges of at most 1 GiB each. [`Xlate::recv`] reads straight into the caller's buffer with
//! `IORING_OP_RECV` ([`XlateStats::direct`]); `READ_FIXED` on a socket would be the
//! fixed-buffer receive, but the cache does not use it yet. Page-cache changes that
//! bypass the mapping raise no event: punching a hole in (or truncating) a memfd or tmpfs
//! file whose shared mapping is cached leaves the cache holding the old pages; drop the
//! [`Xlate`] (or do not cache such memory) around those calls. A thread that maps new memory at the address *while*
//! another thread's `munmap` of it is still waiting for the monitor is not covered; such
//! code is already racing on its own memory. An `Xlate` must not be used across `fork`.
//! Operations are synchronous: each call returns only once its completions (and a
//! zero-copy send's notification) arrived.
//!
//! ```
//! use ferry::uring::xlate::{Invalidation, Xlate, XlateConfig};
//! use std::io::{Read, Seek};
//!
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().sparse_buffers { return Ok(()); }
//! let mut x = Xlate::new(XlateConfig::default())?;
//! let mut file = tempfile()?;
//! let data = vec![7u8; 8192];
//! x.write_at(&file, &data, 0)?;   // a miss: bounced, then the range is registered
//! x.write_at(&file, &data, 8192)?; // a hit when unmaps are watched
//! let mut back = Vec::new();
//! file.rewind()?;
//! file.read_to_end(&mut back)?;
//! assert_eq!(back.len(), 16384);
//! assert!(back.iter().all(|&b| b == 7));
//! if *x.invalidation() == Invalidation::Userfaultfd {
//!     assert_eq!((x.stats().misses, x.stats().hits), (1, 1));
//! }
//! # Ok(()) }
//! # fn tempfile() -> std::io::Result<std::fs::File> {
//! #     let p = std::env::temp_dir().join(format!("xlate-doc-{}", std::process::id()));
//! #     let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p)?;
//! #     std::fs::remove_file(&p)?;
//! #     Ok(f)
//! # }
//! ```

mod engine;
pub(crate) mod table;

use engine::{cqe_result, Engine};

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use io_uring::{opcode, types};

use crate::error::{Error, Result};
use crate::sys::page_size;
use crate::sys::uffd::Watcher;
use crate::uring::ring::Ring;
use crate::uring::Features;

use table::Table;

/// Largest range one registered buffer may cover.
const MAX_REGISTER: usize = 1 << 30;
/// Most caching [`Xlate`]s one process may have at once (more are built, but bounce).
const MAX_CACHES: usize = 64;
/// Most kernel buffer slots a ring may have.
const MAX_SLOTS: u32 = 16384;

/// How an [`Xlate`] treats each I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Look the buffer up in the cache; on a miss, act as [`Miss`] says.
    Cache(Miss),
    /// Never register user memory: every I/O copies through a bounce buffer.
    BounceOnly,
    /// Register the caller's buffer into a scratch slot before every I/O, then use it.
    RegisterEveryIo,
}

/// What the cache does on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// Register the range first, then run the I/O from it (a miss costs a registration).
    RegisterFirst,
    /// Copy through a bounce buffer now; register the range while that I/O runs, but at
    /// most once per `rate_limit` bytes transferred (`None`: after every miss).
    Fallback {
        /// Bytes that must move between two registrations.
        rate_limit: Option<usize>,
    },
}

/// Which operation [`Xlate::send`] uses (see [`Xlate::send_op`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// `IORING_OP_WRITE_FIXED` on the socket, from the registered buffer: one completion,
    /// no notification (the kernel copies into the socket buffer, as a plain send does).
    WriteFixed,
    /// `IORING_OP_SEND_ZC` from the registered buffer, waiting for its notification (on
    /// loopback that comes only once the peer has read the data).
    SendZc,
    /// `IORING_OP_SEND` from the memory itself: the registered buffer is not used.
    Plain,
}

/// Configuration of an [`Xlate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XlateConfig {
    /// Cache slots (the table's reach). Default 256, the size of the paper's Myrinet table.
    pub table_slots: u32,
    /// Bounce buffers; a large file I/O runs in chunks, this many in flight at once (a
    /// socket send keeps one chunk in flight, as a chunk may go out short). Default 2.
    pub bounce_buffers: u32,
    /// Size of each bounce buffer in bytes, rounded up to pages. Default 64 KiB.
    pub bounce_size: usize,
    /// How I/O is served. Default: cache, single-copy fallback, one registration per
    /// 64 KiB (the paper's simulated threshold).
    pub mode: Mode,
    /// Watch cached ranges for unmap/remap with userfaultfd (default true). Off, or when
    /// userfaultfd is missing, [`Mode::Cache`] caches nothing and every I/O bounces.
    pub watch_unmaps: bool,
    /// Send with `SEND_ZC` from the fixed buffer and wait for each notification (default
    /// false), counting [`XlateStats::zc_copied`]. Off, sends use `WRITE_FIXED` on the
    /// socket when the kernel allows it ([`Features::socket_write_fixed`]).
    pub zero_copy_send: bool,
    /// Use `WRITE_FIXED` for sends when the kernel allows it (default true). Off forces
    /// the fallback that a kernel without it gets: `SEND_ZC` if present, else a plain
    /// `SEND`, counted in [`XlateStats::send_fallbacks`].
    pub socket_write_fixed: bool,
}

impl Default for XlateConfig {
    fn default() -> Self {
        XlateConfig {
            table_slots: 256,
            bounce_buffers: 2,
            bounce_size: 64 * 1024,
            mode: Mode::Cache(Miss::Fallback {
                rate_limit: Some(64 * 1024),
            }),
            watch_unmaps: true,
            zero_copy_send: false,
            socket_write_fixed: true,
        }
    }
}

/// Counters of an [`Xlate`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XlateStats {
    /// Calls made (each `write_at`, `read_at`, `send`, `recv`).
    pub ios: u64,
    /// Lookups that found the buffer registered.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// I/Os that went through a bounce buffer (one copy), for whatever reason.
    pub fallbacks: u64,
    /// Live entries replaced to make room.
    pub evictions: u64,
    /// Ranges installed in a kernel slot (cache and scratch).
    pub registrations: u64,
    /// Registrations refused (by userfaultfd or io_uring), or impossible because every slot
    /// had I/O in flight; the I/O bounced.
    pub register_failures: u64,
    /// Cache entries dropped because their memory was unmapped, removed or moved.
    pub invalidations: u64,
    /// Address-space events the monitor read.
    pub events: u64,
    /// I/Os that bounced because no unmap watcher runs, so nothing may be cached.
    pub uncached: u64,
    /// Socket receives made straight into the caller's buffer (no fixed-buffer receive).
    pub direct: u64,
    /// Zero-copy sends the kernel reported as copied (`IORING_NOTIF_USAGE_ZC_COPIED`).
    pub zc_copied: u64,
    /// Sends that could not use `WRITE_FIXED` (the kernel lacks it, or
    /// [`XlateConfig::socket_write_fixed`] is off) and went by `SEND_ZC` or a plain `SEND`
    /// instead ([`Xlate::send_op`]). Sends asked to be zero-copy do not count.
    pub send_fallbacks: u64,
    /// Bytes transferred.
    pub bytes: u64,
}

/// Whether unmaps are being watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// A userfaultfd monitor thread invalidates entries on unmap, remove and remap.
    Userfaultfd,
    /// Nothing watches, so nothing is cached; the string says why.
    Off(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write(u64),
    Read(u64),
    Send(SendOp),
}

impl Kind {
    fn is_socket(self) -> bool {
        matches!(self, Kind::Send(_))
    }
    /// The same kind, `at` bytes further into the file.
    fn at(self, at: usize) -> Kind {
        match self {
            Kind::Write(o) => Kind::Write(o + at as u64),
            Kind::Read(o) => Kind::Read(o + at as u64),
            Kind::Send(op) => Kind::Send(op),
        }
    }
}

/// State shared with the monitor thread.
struct Inner {
    table: Table,
    invalidations: u64,
    events: u64,
    /// The watcher failed: nothing may be cached any more.
    broken: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    /// The process's unmap watcher, if this cache may cache.
    hub: Option<Arc<Hub>>,
}

/// The one userfaultfd and monitor thread of this process, shared by every [`Xlate`]: a
/// range can be watched by only one userfaultfd at a time, so two caches holding the same
/// memory must share it.
struct Hub {
    /// The process that opened the userfaultfd (a forked child must open its own).
    pid: u32,
    watcher: Watcher,
    /// The tables to invalidate: a fixed array, so that neither the monitor nor a cache
    /// joining or leaving allocates or frees memory while holding the lock (see
    /// [`table`] on why).
    tables: Mutex<[Option<Arc<Shared>>; MAX_CACHES]>,
    /// The monitor stopped (its userfaultfd failed): make a new hub.
    dead: AtomicBool,
}

/// This process's hub, started on first use.
fn hub() -> std::result::Result<Arc<Hub>, String> {
    static HUB: Mutex<Option<Arc<Hub>>> = Mutex::new(None);
    let mut g = HUB.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some(h) = g.as_ref() {
        if h.pid == pid && !h.dead.load(Ordering::Acquire) {
            return Ok(Arc::clone(h));
        }
    }
    let watcher = Watcher::new().map_err(|e| format!("userfaultfd: {e}"))?;
    let h = Arc::new(Hub {
        pid,
        watcher,
        tables: Mutex::new([const { None }; MAX_CACHES]),
        dead: AtomicBool::new(false),
    });
    let m = Arc::clone(&h);
    std::thread::Builder::new()
        .name("ferry-xlate-uffd".into())
        .spawn(move || monitor(&m))
        .map_err(|e| format!("monitor thread: {e}"))?;
    *g = Some(Arc::clone(&h));
    Ok(h)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registration cache bound to its own io_uring. See the [module docs](self).
pub struct Xlate {
    io: Engine,
    cache: Cache,
    cfg: XlateConfig,
    invalidation: Invalidation,
    stats: XlateStats,
    /// How sends go out.
    send_op: SendOp,
}

/// This cache's side of the registration: its table (shared with the monitor), and the
/// kernel buffer slots from `base` up that hold its entries.
struct Cache {
    shared: Arc<Shared>,
    /// Our place in the hub's table list, if we cache.
    hub_slot: Option<usize>,
    /// Bytes moved since the last registration (starts full, so the first miss is served).
    credit: usize,
    /// Kernel buffer slot of table slot 0 (the bounce buffers and scratch lie below).
    base: u32,
}

impl std::fmt::Debug for Xlate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xlate")
            .field("cfg", &self.cfg)
            .field("invalidation", &self.invalidation)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Xlate {
    /// Builds the ring, its sparse buffer table and bounce buffers, and (in
    /// [`Mode::Cache`] with [`XlateConfig::watch_unmaps`]) the unmap watcher.
    ///
    /// [`Error::Unsupported`] if the kernel has no io_uring, fixed reads and writes or
    /// sparse buffer tables; a missing userfaultfd is not an error but shows in
    /// [`Xlate::invalidation`] and [`XlateStats::uncached`].
    pub fn new(cfg: XlateConfig) -> Result<Xlate> {
        let f = Features::probe();
        f.require(f.ring, "io_uring")?;
        f.require(f.fixed_rw, "READ_FIXED/WRITE_FIXED")?;
        f.require(f.sparse_buffers, "sparse registered buffers")?;
        if cfg.bounce_buffers == 0 || cfg.bounce_size == 0 {
            return Err(Error::InvalidArgument(
                "xlate needs at least one bounce buffer",
            ));
        }
        if cfg.bounce_size > MAX_REGISTER {
            return Err(Error::InvalidArgument(
                "bounce buffers are limited to 1 GiB",
            ));
        }
        let total = cfg
            .bounce_buffers
            .checked_add(1)
            .and_then(|n| n.checked_add(cfg.table_slots))
            .filter(|&n| n <= MAX_SLOTS)
            .ok_or(Error::InvalidArgument(
                "bounce buffers + table slots exceed 16383",
            ))?;
        let bounce_size = crate::sys::round_up_pages(cfg.bounce_size)
            .ok_or(Error::InvalidArgument("bounce size overflows"))?;
        let io = Engine::new(cfg.bounce_buffers, bounce_size, total)?;

        let send_op = if cfg.zero_copy_send {
            SendOp::SendZc
        } else if cfg.socket_write_fixed && f.socket_write_fixed {
            SendOp::WriteFixed
        } else if f.send_zc {
            SendOp::SendZc
        } else {
            SendOp::Plain
        };

        let wants_watch = matches!(cfg.mode, Mode::Cache(_));
        let (hub, invalidation) = if !wants_watch {
            (None, Invalidation::Off("this mode caches nothing".into()))
        } else if !cfg.watch_unmaps {
            (None, Invalidation::Off("watch_unmaps is off".into()))
        } else {
            match hub() {
                Ok(h) => (Some(h), Invalidation::Userfaultfd),
                Err(why) => (None, Invalidation::Off(why)),
            }
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                table: Table::new(cfg.table_slots),
                invalidations: 0,
                events: 0,
                broken: false,
            }),
            hub,
        });
        let mut invalidation = invalidation;
        let mut hub_slot = None;
        if let Some(h) = &shared.hub {
            let mut tables = h.tables.lock().unwrap_or_else(|e| e.into_inner());
            match tables.iter().position(Option::is_none) {
                Some(i) => {
                    tables[i] = Some(Arc::clone(&shared));
                    hub_slot = Some(i);
                }
                None => {
                    invalidation = Invalidation::Off(format!(
                        "more than {MAX_CACHES} caching Xlates in this process"
                    ))
                }
            }
        }
        let credit = match cfg.mode {
            Mode::Cache(Miss::Fallback {
                rate_limit: Some(n),
            }) => n,
            _ => 0,
        };
        Ok(Xlate {
            io,
            cache: Cache {
                shared,
                hub_slot,
                credit,
                base: cfg.bounce_buffers + 1,
            },
            cfg,
            invalidation,
            stats: XlateStats::default(),
            send_op,
        })
    }

    /// The configuration this cache was built with.
    pub fn config(&self) -> &XlateConfig {
        &self.cfg
    }

    /// Whether unmaps are watched (and so whether anything is cached).
    pub fn invalidation(&self) -> &Invalidation {
        &self.invalidation
    }

    /// The counters so far.
    pub fn stats(&self) -> XlateStats {
        let mut s = self.stats;
        s.fallbacks = self.io.fallbacks;
        s.zc_copied = self.io.zc_copied;
        let inner = self.cache.shared.lock();
        s.invalidations = inner.invalidations;
        s.events = inner.events;
        s
    }

    /// Number of ranges the cache holds right now.
    pub fn cached(&self) -> usize {
        self.cache.shared.lock().table.live()
    }

    /// Writes `buf` to `fd` at offset `off` (like `pwrite(2)`); returns the bytes written.
    pub fn write_at(&mut self, fd: impl AsFd, buf: &[u8], off: u64) -> Result<usize> {
        self.run(
            fd.as_fd(),
            Kind::Write(off),
            buf.as_ptr().cast_mut(),
            buf.len(),
        )
    }

    /// Reads into `buf` from `fd` at offset `off` (like `pread(2)`); returns the bytes read.
    pub fn read_at(&mut self, fd: impl AsFd, buf: &mut [u8], off: u64) -> Result<usize> {
        self.run(fd.as_fd(), Kind::Read(off), buf.as_mut_ptr(), buf.len())
    }

    /// Which operation [`Xlate::send`] uses: `WRITE_FIXED` on the socket where the kernel
    /// allows it, else (or with [`XlateConfig::zero_copy_send`]) `SEND_ZC`, else a plain
    /// `SEND`.
    pub fn send_op(&self) -> SendOp {
        self.send_op
    }

    /// Sends `buf` on the connected socket `fd`; returns the bytes sent.
    ///
    /// A hit, and every bounced chunk, goes out from its registered buffer by
    /// [`Xlate::send_op`]: by default `WRITE_FIXED` on the socket, which completes once
    /// the kernel has copied the data into the socket (plain `SEND` refuses fixed buffers).
    /// With [`XlateConfig::zero_copy_send`], `SEND_ZC`, waiting for its notification; on
    /// loopback and veth the kernel copies anyway ([`XlateStats::zc_copied`]). A stream
    /// socket gets all of `buf` unless an error stops it part way.
    pub fn send(&mut self, fd: impl AsFd, buf: &[u8]) -> Result<usize> {
        if self.cfg.zero_copy_send {
            let f = Features::probe();
            f.require(f.send_zc, "SEND_ZC")?;
        } else if self.send_op != SendOp::WriteFixed {
            self.stats.send_fallbacks += 1;
        }
        let kind = Kind::Send(self.send_op);
        self.run(fd.as_fd(), kind, buf.as_ptr().cast_mut(), buf.len())
    }

    /// Receives into `buf` from the socket `fd`; returns the bytes received.
    ///
    /// Straight into `buf` with `IORING_OP_RECV`: the cache plays no part
    /// ([`XlateStats::direct`]).
    pub fn recv(&mut self, fd: impl AsFd, buf: &mut [u8]) -> Result<usize> {
        self.io.check(buf.len())?;
        self.stats.ios += 1;
        self.stats.direct += 1;
        let e = opcode::Recv::new(
            types::Fd(fd.as_fd().as_raw_fd()),
            buf.as_mut_ptr(),
            buf.len() as u32,
        )
        .build();
        let mut res = [0i32; 1];
        // SAFETY: `buf` is borrowed mutably until `complete` has seen the completion.
        unsafe { self.io.submit(&[e], None, &mut res)? };
        let n = cqe_result(res[0])?;
        self.stats.bytes += n as u64;
        Ok(n)
    }

    fn run(&mut self, fd: BorrowedFd<'_>, kind: Kind, ptr: *mut u8, len: usize) -> Result<usize> {
        self.io.check(len)?;
        self.stats.ios += 1;
        let fd = fd.as_raw_fd();
        let n = match self.cfg.mode {
            Mode::BounceOnly => self.io.bounce(fd, kind, ptr, len, None)?,
            Mode::RegisterEveryIo => {
                let scratch = self.cfg.bounce_buffers;
                let iov = libc::iovec {
                    iov_base: ptr.cast(),
                    iov_len: len.max(1),
                };
                // SAFETY: the range is the caller's borrowed buffer; the registration pins
                // its pages, so the kernel never touches memory that is not mapped.
                match unsafe { self.io.ring().register_buffers_update(scratch, &[iov]) } {
                    Ok(()) => {
                        self.stats.registrations += 1;
                        self.io.fixed(fd, kind, ptr, len, scratch)?
                    }
                    Err(_) => {
                        self.stats.register_failures += 1;
                        self.io.bounce(fd, kind, ptr, len, None)?
                    }
                }
            }
            Mode::Cache(miss) => self.via_cache(fd, kind, ptr, len, miss)?,
        };
        self.stats.bytes += n as u64;
        Ok(n)
    }

    fn via_cache(
        &mut self,
        fd: RawFd,
        kind: Kind,
        ptr: *mut u8,
        len: usize,
        miss: Miss,
    ) -> Result<usize> {
        let Xlate {
            io, cache, stats, ..
        } = self;
        let base = cache.base;
        let hit = {
            let mut inner = cache.shared.lock();
            if cache.hub_slot.is_none() || inner.broken {
                None
            } else {
                Some(inner.table.lookup(ptr as usize, len))
            }
        };
        let Some(hit) = hit else {
            stats.uncached += 1;
            return io.bounce(fd, kind, ptr, len, None);
        };
        if let Some(h) = hit {
            stats.hits += 1;
            cache.credit = cache.credit.saturating_add(len);
            let r = io.fixed(fd, kind, ptr, len, base + h.slot);
            cache.shared.lock().table.done(h.slot);
            return r;
        }
        stats.misses += 1;
        match miss {
            Miss::RegisterFirst => match cache.install(io.ring(), stats, ptr as usize, len, 1) {
                Some(slot) => {
                    let r = io.fixed(fd, kind, ptr, len, base + slot);
                    cache.shared.lock().table.done(slot);
                    r
                }
                None => io.bounce(fd, kind, ptr, len, None),
            },
            Miss::Fallback { rate_limit } => {
                cache.credit = cache.credit.saturating_add(len);
                let serve = match rate_limit {
                    None => true,
                    Some(n) => cache.credit >= n,
                };
                if !serve {
                    return io.bounce(fd, kind, ptr, len, None);
                }
                let mut install = |ring: &mut Ring| {
                    let _ = cache.install(ring, stats, ptr as usize, len, 0);
                };
                io.bounce(fd, kind, ptr, len, Some(&mut install))
            }
        }
    }
}

impl Cache {
    /// Registers the pages around `[addr, addr + len)` on `ring` into a cache slot,
    /// watched for unmaps; returns the slot, with `inflight` I/Os counted on it. `None`
    /// (counted in `stats`) when the memory cannot be watched or registered, or every
    /// slot is busy.
    fn install(
        &mut self,
        ring: &mut Ring,
        stats: &mut XlateStats,
        addr: usize,
        len: usize,
        inflight: u32,
    ) -> Option<u32> {
        let p = page_size();
        let start = addr & !(p - 1);
        let end = addr
            .checked_add(len.max(1))
            .and_then(|e| e.checked_add(p - 1))?
            & !(p - 1);
        if end - start > MAX_REGISTER {
            stats.register_failures += 1;
            return None;
        }
        self.credit = 0;
        // Watch, install and insert under one lock, so the monitor cannot read an unmap
        // event for this range before the entry exists (it would then miss it).
        let mut inner = self.shared.lock();
        let Some(v) = inner.table.victim() else {
            stats.register_failures += 1;
            return None;
        };
        if v.evicted {
            stats.evictions += 1;
        }
        let hub = self.shared.hub.as_ref()?;
        if hub.watcher.watch(start, end - start).is_err() {
            stats.register_failures += 1;
            return None;
        }
        let iov = libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: end - start,
        };
        // SAFETY: registration pins the pages mapped at `[start, end)` now (the kernel
        // fails it if any is unmapped); those pages stay valid memory for as long as the
        // slot holds them, whatever the process later maps there.
        let r = unsafe { ring.register_buffers_update(self.base + v.slot, &[iov]) };
        if r.is_err() {
            stats.register_failures += 1;
            return None;
        }
        inner.table.insert(v.slot, start, end, inflight);
        stats.registrations += 1;
        Some(v.slot)
    }
}

impl Drop for Xlate {
    fn drop(&mut self) {
        if let (Some(h), Some(i)) = (&self.cache.shared.hub, self.cache.hub_slot) {
            // Take our entry out under the lock, drop it after: not the last reference
            // (`self.shared` is), and nothing is freed under the lock anyway.
            let mine = h.tables.lock().unwrap_or_else(|e| e.into_inner())[i].take();
            drop(mine);
        }
    }
}

/// The monitor thread: sleeps in `poll` without any lock; on events, takes the lock of
/// every registered table, reads the events (which lets the unmapping thread go on) and
/// drops the entries they touch, then releases the locks. It runs for the life of the
/// process, or until its userfaultfd fails. Its loop allocates and frees nothing (see
/// [`table`] on why).
fn monitor(hub: &Hub) {
    let w = &hub.watcher;
    let mut events = Vec::with_capacity(16);
    loop {
        let ok = w.wait().is_ok();
        // The registry stays locked until the events are read, so a cache that registers
        // meanwhile cannot have watched a range whose event this pass reads.
        let tables = hub.tables.lock().unwrap_or_else(|e| e.into_inner());
        // Lock order: registry, then tables in index order; nothing else takes a table
        // lock while holding another of these locks.
        let mut guards: [Option<MutexGuard<'_, Inner>>; MAX_CACHES] = [const { None }; MAX_CACHES];
        for (g, t) in guards.iter_mut().zip(tables.iter()) {
            *g = t.as_ref().map(|s| s.lock());
        }
        let mut failed = !ok;
        while !failed {
            events.clear();
            match w.read_events(&mut events, 16) {
                Ok(0) => break,
                Ok(_) => {
                    for g in guards.iter_mut().flatten() {
                        for ev in &events {
                            g.events += 1;
                            if let Some((s, e)) = ev.gone() {
                                let n = g.table.invalidate(s, e) as u64;
                                g.invalidations += n;
                            }
                        }
                    }
                }
                Err(_) => failed = true,
            }
        }
        if failed {
            // Without events nothing cached can be trusted.
            hub.dead.store(true, Ordering::Release);
            for g in guards.iter_mut().flatten() {
                g.broken = true;
                g.table.invalidate_all();
            }
            return;
        }
        drop(guards);
        drop(tables);
    }
}
