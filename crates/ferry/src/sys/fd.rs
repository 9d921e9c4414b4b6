//! File descriptors ferry passes between domains: memfds, eventfds and pidfds, plus the
//! few file calls a group's named file needs (`flock`, `pread`, `pwrite`, `stat`).

use std::fs::File;
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
    Ok(fd)
}

/// Size of the file behind `fd` (`fstat(2)`).
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    count();
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// Opens another process's descriptor anew through `/proc/PID/fd/N` (`open(2)`).
///
/// Unlike `pidfd_getfd`, this creates a new open file description, so the access mode is
/// ours to choose: ferry opens peers' lots read-only and the kernel then refuses any
/// writable mapping of them. Needs the same rights as reading `/proc/PID/fd` (same user).
/// Fails with `ENXIO` for anonymous-inode files such as eventfds.
pub fn open_peer_fd(pid: u32, fd: RawFd, writable: bool) -> io::Result<OwnedFd> {
    count();
    let f = File::options()
        .read(true)
        .write(writable)
        .open(format!("/proc/{pid}/fd/{fd}"))?;
    Ok(f.into())
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
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates one, counter zero, non-blocking and close-on-exec.
    pub fn new() -> io::Result<Self> {
        count();
        Ok(EventFd(eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?))
    }

    /// Wraps a descriptor known to be an eventfd.
    pub fn from_owned(fd: OwnedFd) -> Self {
        EventFd(fd)
    }

    /// Adds one to the counter (`write(2)`), waking whoever polls it.
    pub fn notify(&self) {
        count();
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Resets the counter to zero (`read(2)`); a no-op if it already is.
    pub fn drain(&self) {
        let mut buf = [0u8; 8];
        count();
        let _ = rustix::io::read(&self.0, &mut buf);
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
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
