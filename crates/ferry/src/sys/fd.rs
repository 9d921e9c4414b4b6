//! File descriptors ferry passes between domains: memfds, eventfds and pidfds, plus the
//! few file calls a group's named file needs (`flock`, `pread`, `pwrite`, `stat`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::fs::{flock, fstat, fstatfs, lstat, memfd_create, FlockOperation, MemfdFlags};
use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};

use super::count;

/// Creates an anonymous memory file of `len` bytes (`memfd_create(2)` + `ftruncate(2)`).
/// Its pages read as zeros until written. Sealing is allowed, close-on-exec is set.
pub fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    count();
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    count();
    rustix::fs::ftruncate(&fd, len)?;
    // Learn the shmem mount's device from the first memfd (a joiner's lot, say), so that
    // checking a peer's descriptor later needs no descriptor of its own: short of
    // descriptors, that check would fail and blame the peer.
    if MEMFD_DEV.get().is_none() {
        let st = statx_cached(fd.as_fd())?;
        let _ = MEMFD_DEV.set((st.stx_dev_major, st.stx_dev_minor));
    }
    Ok(fd)
}

/// See [`memfd_dev`].
static MEMFD_DEV: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Creates an anonymous hugetlbfs file of `len` bytes (a multiple of 2 MiB) backed by
/// 2 MiB huge pages (`memfd_create(2)` with `MFD_HUGETLB | MFD_HUGE_2MB`, then
/// `ftruncate(2)`). Its pages come from the pool the administrator reserved
/// (`vm.nr_hugepages`), taken when it is first mapped shared. Sealing is allowed,
/// close-on-exec is set.
pub fn memfd_huge(name: &str, len: u64) -> io::Result<OwnedFd> {
    count();
    let fd = memfd_create(
        name,
        MemfdFlags::CLOEXEC
            | MemfdFlags::ALLOW_SEALING
            | MemfdFlags::HUGETLB
            | MemfdFlags::HUGE_2MB,
    )?;
    count();
    rustix::fs::ftruncate(&fd, len)?;
    if HUGE_DEV.get().is_none() {
        let st = statx_cached(fd.as_fd())?;
        let _ = HUGE_DEV.set((st.stx_dev_major, st.stx_dev_minor));
    }
    Ok(fd)
}

/// See [`huge_dev`].
static HUGE_DEV: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Device number of the kernel's internal hugetlbfs mount of 2 MiB pages, on which every
/// memfd made with `MFD_HUGETLB | MFD_HUGE_2MB` lives: learnt once from one of our own
/// (making an empty one needs no huge page).
fn huge_dev() -> io::Result<(u32, u32)> {
    if let Some(d) = HUGE_DEV.get() {
        return Ok(*d);
    }
    memfd_huge("ferry-probe", 0)?;
    Ok(*HUGE_DEV.get().expect("memfd_huge records the device"))
}

/// Huge pages of the default size free in the pool (`HugePages_Free` of
/// `/proc/meminfo`), 0 if that cannot be read.
pub fn free_huge_pages() -> u64 {
    count();
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Size of the file behind `fd` (`fstat(2)`).
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    count();
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// What kind of file a `st_mode` names, for messages about descriptors that are not
/// what they should be ("a FIFO", "a directory", ...).
pub fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "an anonymous inode",
    }
}

/// Device number (major, minor) of the kernel's internal shmem mount, on which every
/// memfd made without `MFD_HUGETLB` lives: learnt once from a memfd of our own.
fn memfd_dev() -> io::Result<(u32, u32)> {
    if let Some(d) = MEMFD_DEV.get() {
        return Ok(*d);
    }
    // `memfd` records it.
    memfd("ferry-probe", 0)?;
    Ok(*MEMFD_DEV.get().expect("memfd records the device"))
}

/// `statx(2)` of `fd` itself, from the attributes the kernel has cached
/// (`AT_STATX_DONT_SYNC`): a network or FUSE file system is not asked, so a file whose
/// server another process runs cannot make this wait.
pub(crate) fn statx_cached(fd: BorrowedFd<'_>) -> io::Result<rustix::fs::Statx> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    count();
    Ok(statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        StatxFlags::TYPE | StatxFlags::SIZE | StatxFlags::INO,
    )?)
}

/// Checks that a descriptor another process handed over (or an `O_PATH` descriptor of
/// one) is a memfd on shmem: a regular file on the kernel's internal shmem mount, so
/// that opening, mapping or reading it can neither block (as a FIFO's open does, or any
/// call on a file whose server another process runs) nor fault with `SIGBUS` for want
/// of huge pages. Returns its size, or what it is instead ("a FIFO, not a memfd").
///
/// Only the file's cached attributes are read (see [`statx_cached`]); nothing is opened.
pub fn check_memfd(fd: BorrowedFd<'_>) -> Result<u64, String> {
    check_memfd_of(fd, false)
}

/// [`check_memfd`], or with `huge` the same check for a hugetlb memfd of 2 MiB pages
/// instead (a regular file on the kernel's internal hugetlbfs mount of that size): what
/// a group of hugetlb lots (`Pages::HugeTlb`) accepts, and only it. A
/// hugetlb memfd's owner can make a reader's fault find no huge page (`SIGBUS`) by
/// punching a hole once the pool is empty: only members who chose such a group take
/// that risk.
pub fn check_memfd_of(fd: BorrowedFd<'_>, huge: bool) -> Result<u64, String> {
    if huge {
        let st = statx_cached(fd).map_err(|e| format!("cannot be examined ({e})"))?;
        let mode = st.stx_mode as u32;
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("{}, not a hugetlb memfd", kind_of(mode)));
        }
        let dev = huge_dev().map_err(|e| format!("cannot be compared with a memfd ({e})"))?;
        if (st.stx_dev_major, st.stx_dev_minor) != dev {
            return Err(
                "a file that is not a hugetlb memfd of 2 MiB pages, in a group of \
                 hugetlb lots"
                    .into(),
            );
        }
        return Ok(st.stx_size);
    }
    let st = statx_cached(fd).map_err(|e| format!("cannot be examined ({e})"))?;
    let mode = st.stx_mode as u32;
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{}, not a memfd", kind_of(mode)));
    }
    let dev = memfd_dev().map_err(|e| format!("cannot be compared with a memfd ({e})"))?;
    let found = (st.stx_dev_major, st.stx_dev_minor);
    if found != dev {
        if huge_dev().is_ok_and(|h| h == found) {
            return Err("a hugetlb memfd, which only a group of hugetlb lots \
                 (Pages::HugeTlb) accepts, not a memfd on shmem"
                .into());
        }
        return Err("a file on another file system, not a memfd on shmem".into());
    }
    Ok(st.stx_size)
}

/// A close-on-exec duplicate of `fd` (`fcntl(F_DUPFD_CLOEXEC)`): a new number for the same
/// open file description.
pub fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    count();
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, 0)?)
}

/// How opening another process's descriptor through `/proc` went.
#[derive(Debug)]
pub enum PeerOpen {
    /// A memfd on shmem, opened anew read-only.
    Opened(OwnedFd),
    /// The descriptor is open in that process but is not a memfd on shmem: what it is.
    NotMemfd(String),
}

/// Opens another process's memfd anew, read-only, through `/proc/PID/fd/N`.
///
/// Unlike `pidfd_getfd`, this creates a new open file description, so the access mode is
/// ours to choose: ferry opens peers' lots read-only and the kernel then refuses any
/// writable mapping of them. Needs the same rights as reading `/proc/PID/fd` (same user).
///
/// Nothing the other process put behind that number can make this block: the number is
/// first resolved with `O_PATH` (which opens nothing: a FIFO's open would wait for a
/// writer, a device's or a FUSE file's could wait on anything), checked with
/// [`check_memfd`], and only then is that very file (not whatever the number names by
/// now) opened, through `/proc/self/fd` of the `O_PATH` descriptor, with
/// `O_NONBLOCK | O_NOCTTY`.
///
/// # Errors
/// The `/proc` lookup's error: `ENOENT` if the process is gone or has no such
/// descriptor.
///
/// With `huge`, the descriptor must be a hugetlb memfd instead (see [`check_memfd_of`]).
pub fn open_peer_memfd(pid: u32, fd: RawFd, huge: bool) -> io::Result<PeerOpen> {
    use rustix::fs::{open, Mode, OFlags};
    count();
    let path = open(
        format!("/proc/{pid}/fd/{fd}"),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if let Err(why) = check_memfd_of(path.as_fd(), huge) {
        return Ok(PeerOpen::NotMemfd(why));
    }
    count();
    let file = open(
        format!("/proc/self/fd/{}", path.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(PeerOpen::Opened(file))
}

/// Checks that a descriptor another process handed over is an eventfd in non-blocking
/// mode (its `/proc/self/fd` link reads `anon_inode:[eventfd]`); `Err` says what it is
/// instead. [`EventFd`] never waits in a read whatever the mode, but a write to a
/// blocking eventfd whose counter is full would.
pub fn check_eventfd(fd: BorrowedFd<'_>) -> Result<(), String> {
    count();
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("cannot be examined ({e})"))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        let what = match statx_cached(fd) {
            Ok(st) => kind_of(st.stx_mode as u32).to_owned(),
            Err(_) => link.to_string_lossy().into_owned(),
        };
        return Err(format!("{what}, not an eventfd"));
    }
    count();
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| format!("cannot be examined ({e})"))?;
    if !flags.contains(rustix::fs::OFlags::NONBLOCK) {
        return Err("an eventfd in blocking mode".into());
    }
    Ok(())
}

/// A pidfd for `pid` (`pidfd_open(2)`): readable once the process has exited.
///
/// A pid of 0 or above `i32::MAX` (say, read from memory another process scribbled on)
/// fails with `ESRCH` without a call.
pub fn pidfd(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    count();
    Ok(pidfd_open(pid, PidfdFlags::empty())?)
}

/// Duplicates descriptor `target` of the process behind `pidfd` into this one
/// (`pidfd_getfd(2)`; needs ptrace access to that process, which the same user has unless
/// Yama restricts it). The copy shares the original's open file description.
pub fn dup_from(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    count();
    Ok(pidfd_getfd(pidfd, target, PidfdGetfdFlags::empty())?)
}

/// Tries to take an exclusive `flock(2)` lock on `fd` without blocking
/// (`LOCK_EX | LOCK_NB`): `Ok(false)` if another open file description holds it. The
/// kernel drops the lock when the last descriptor of this open file description closes,
/// so a holder that dies cannot leave it behind.
pub fn try_lock(fd: BorrowedFd<'_>) -> io::Result<bool> {
    count();
    match flock(fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Drops a lock taken with [`try_lock`] (`flock(2)` `LOCK_UN`).
pub fn unlock(fd: BorrowedFd<'_>) {
    count();
    let _ = flock(fd, FlockOperation::Unlock);
}

/// True if `path` names the file open as `fd` (`fstat(2)` and `lstat(2)`, comparing
/// device and inode); false if `path` is gone, names another file, or is a symbolic
/// link (never followed).
pub fn same_file(fd: BorrowedFd<'_>, path: &Path) -> io::Result<bool> {
    count();
    let open = fstat(fd)?;
    count();
    match lstat(path) {
        Ok(named) => Ok(named.st_dev == open.st_dev && named.st_ino == open.st_ino),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// True if the file behind `fd` lives on shmem (`fstatfs(2)` reports `TMPFS_MAGIC`), as
/// memfds made without `MFD_HUGETLB` do: their pages never fail to fault in.
pub fn is_shmem(fd: BorrowedFd<'_>) -> io::Result<bool> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    count();
    Ok(fstatfs(fd)?.f_type as i64 == TMPFS_MAGIC)
}

/// The name a memfd was created with (`readlink(2)` of `/proc/self/fd/N`, which reads
/// `/memfd:NAME (deleted)`), or `None` if `fd` is not a memfd.
pub fn memfd_name(fd: BorrowedFd<'_>) -> io::Result<Option<String>> {
    count();
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let target = target.to_string_lossy();
    Ok(target
        .strip_prefix("/memfd:")
        .map(|t| t.strip_suffix(" (deleted)").unwrap_or(t).to_owned()))
}

/// Reads up to `buf.len()` bytes at `offset` (`pread(2)`), stopping early only at end of
/// file; returns the count read.
pub fn read_at(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        count();
        match rustix::io::pread(fd, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Writes all of `buf` at `offset` (`pwrite(2)`), extending the file if needed.
pub fn write_at(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        count();
        match rustix::io::pwrite(fd, &buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// True if the process behind `pidfd` has exited (polls it with a zero timeout).
pub fn exited(pidfd: BorrowedFd<'_>) -> bool {
    matches!(wait_readable(&[pidfd], Some(Duration::ZERO)), Ok(Some(0)))
}

/// Waits until one of `fds` is readable (`poll(2)`); returns its index, or `None` on
/// timeout. `None` as timeout waits forever.
pub fn wait_readable(
    fds: &[BorrowedFd<'_>],
    timeout: Option<Duration>,
) -> io::Result<Option<usize>> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: t.subsec_nanos() as _,
    });
    loop {
        count();
        match poll(&mut pfds, ts.as_ref()) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(pfds.iter().position(|p| !p.revents().is_empty())),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// An epoll descriptor, level triggered, that turns readable while any of `fds` is
/// readable: one descriptor an event loop (or an async runtime) can wait on for several.
/// It can itself sit in an edge- or level-triggered epoll set.
pub fn wait_set(fds: &[BorrowedFd<'_>]) -> io::Result<OwnedFd> {
    use rustix::event::epoll;
    count();
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    for (i, fd) in fds.iter().enumerate() {
        count();
        epoll::add(
            &ep,
            fd,
            epoll::EventData::new_u64(i as u64),
            epoll::EventFlags::IN,
        )?;
    }
    Ok(ep)
}

/// A non-blocking eventfd (`eventfd(2)`), used to wake a sleeping sender or receiver.
///
/// One shared with another process (a channel's) shares its file description, flags
/// included, with that process, which could switch it to blocking mode and fill its
/// counter, so that our next write would wait until someone reads. Such an eventfd is
/// *guarded*: each [`notify`](Self::notify) first checks that it is still non-blocking,
/// and does not write to one that is not (only the process that changed it then misses
/// its wake-ups). That narrows the window to the two calls of one notify; reads never
/// wait (see [`drain`](Self::drain)).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
    guarded: bool,
}

impl EventFd {
    /// Creates one, counter zero, non-blocking and close-on-exec, for this process only.
    pub fn new() -> io::Result<Self> {
        Self::make(false)
    }

    /// Like [`new`](Self::new), for one another process will share: guarded.
    pub fn new_shared() -> io::Result<Self> {
        Self::make(true)
    }

    fn make(guarded: bool) -> io::Result<Self> {
        count();
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventFd { fd, guarded })
    }

    /// Wraps a descriptor known to be an eventfd that another process shares (checked
    /// with [`check_eventfd`]): guarded.
    pub fn from_owned(fd: OwnedFd) -> Self {
        EventFd { fd, guarded: true }
    }

    /// Adds one to the counter (`write(2)`), waking whoever polls it; for a guarded
    /// eventfd, only if it is still non-blocking (`fcntl(F_GETFL)` first).
    pub fn notify(&self) {
        if self.guarded {
            count();
            match rustix::fs::fcntl_getfl(&self.fd) {
                Ok(f) if f.contains(rustix::fs::OFlags::NONBLOCK) => {}
                _ => return,
            }
        }
        count();
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Resets the counter to zero (`preadv2(2)` with `RWF_NOWAIT`); a no-op if it already
    /// is. `RWF_NOWAIT` keeps this from waiting even if the eventfd came from another
    /// process that has since switched its (shared) file description to blocking mode.
    pub fn drain(&self) {
        let mut buf = [0u8; 8];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        count();
        // SAFETY: `iov` describes `buf`, which outlives the call; offset -1 reads at the
        // file position, as read(2) does (an eventfd has none).
        let _ = unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Start time of a process in clock ticks since boot (field 22 of `/proc/PID/stat`), used
/// with the pid to tell a live domain from a new process that reused a dead one's pid.
pub fn process_start_time(pid: u32) -> io::Result<u64> {
    count();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces and parentheses; fields resume after
    // the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat"))?;
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat"))
}
