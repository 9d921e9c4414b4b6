//! userfaultfd (`userfaultfd(2)`, `ioctl_userfaultfd(2)`) as a watcher of address-space
//! changes: unmap, remove (`MADV_DONTNEED`) and remap events.
//!
//! ferry does not use userfaultfd to handle faults here. [`Watcher::watch`] registers a
//! range in `UFFDIO_REGISTER_MODE_WP` mode but never write-protects a page, so no access
//! ever traps. What the registration buys is the *non-cooperative events*: with
//! `UFFD_FEATURE_EVENT_UNMAP | EVENT_REMOVE | EVENT_REMAP`, every `munmap`, `mmap(MAP_FIXED)`
//! over, `madvise(MADV_DONTNEED)` or moving `mremap` of a watched range queues a message,
//! and the thread that changed the mapping sleeps until some thread *reads* that message
//! (`userfaultfd_event_wait_completion` in `fs/userfaultfd.c`). The `xlate` cache uses
//! that to invalidate a cached translation before the unmapping call returns.
//!
//! The watcher serves xlate (the `uring` feature), the write-protect [`Protector`] serves
//! TCOW (the `semantics` feature); each half is compiled only with its feature.
//!
//! The `userfaultfd` crate (0.9) lacks the write-protect flags, so these are raw ioctls.
//! See <https://man7.org/linux/man-pages/man2/userfaultfd.2.html>.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::count;

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;

#[cfg(feature = "uring")]
const FEATURE_EVENT_REMAP: u64 = 1 << 2;
#[cfg(feature = "uring")]
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
#[cfg(feature = "uring")]
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;

#[cfg(feature = "uring")]
const EVENT_REMAP: u8 = 0x14;
#[cfg(feature = "uring")]
const EVENT_REMOVE: u8 = 0x15;
#[cfg(feature = "uring")]
const EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffd_msg`: an event byte, padding, then a 24-byte union.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    arg: [u64; 3],
}

#[cfg(feature = "uring")]
/// A change to a watched address range, as the kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `[start, end)` was unmapped (`munmap`, or `mmap(MAP_FIXED)` over it).
    Unmap {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
    /// `[start, end)` lost its pages (`madvise(MADV_DONTNEED)` or `MADV_REMOVE`).
    Remove {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
    /// `len` bytes moved from `from` to `to` (`mremap`).
    Remap {
        /// Old address.
        from: usize,
        /// New address.
        to: usize,
        /// Length moved.
        len: usize,
    },
    /// Another event this wrapper does not interpret.
    Other(u8),
}

#[cfg(feature = "uring")]
impl Event {
    /// The old address range this event took away from its mapping, if any.
    pub fn gone(&self) -> Option<(usize, usize)> {
        match *self {
            Event::Unmap { start, end } | Event::Remove { start, end } => Some((start, end)),
            Event::Remap { from, len, .. } => Some((from, from.saturating_add(len))),
            Event::Other(_) => None,
        }
    }
}

#[cfg(feature = "uring")]
/// A userfaultfd that reports unmap, remove and remap events for registered ranges.
#[derive(Debug)]
pub struct Watcher {
    fd: OwnedFd,
}

#[cfg(feature = "uring")]
fn open_uffd() -> io::Result<OwnedFd> {
    open_flags(UFFD_USER_MODE_ONLY)
}

fn api(fd: BorrowedFd<'_>, features: u64) -> io::Result<u64> {
    let mut a = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    count();
    // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`, which `a` is.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut a as *mut UffdioApi) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(a.features)
}

/// `UFFDIO_REGISTER` of `[start, start + len)` in write-protect mode.
fn register_wp(fd: BorrowedFd<'_>, start: usize, len: usize) -> io::Result<()> {
    let mut r = UffdioRegister {
        range: UffdioRange {
            start: start as u64,
            len: len as u64,
        },
        mode: UFFDIO_REGISTER_MODE_WP,
        ioctls: 0,
    };
    count();
    // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`; the range is
    // only recorded by the kernel, no memory is accessed through it here.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            UFFDIO_REGISTER,
            &mut r as *mut UffdioRegister,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads queued messages without blocking into `msgs`; returns how many (0 if none).
fn read_msgs(fd: BorrowedFd<'_>, msgs: &mut [UffdMsg]) -> io::Result<usize> {
    count();
    // SAFETY: the kernel writes whole `uffd_msg`s into the buffer, which holds
    // `msgs.len()` of them.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            msgs.as_mut_ptr().cast(),
            std::mem::size_of_val(msgs),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize / std::mem::size_of::<UffdMsg>())
}

#[cfg(feature = "uring")]
impl Watcher {
    /// Opens a userfaultfd (non-blocking, user-mode faults only) with the unmap, remove and
    /// remap events enabled. Fails if the kernel lacks userfaultfd or any of those events,
    /// or if `vm.unprivileged_userfaultfd` forbids it to this process.
    pub fn new() -> io::Result<Watcher> {
        // The handshake fixes the features once per descriptor, so ask a throwaway
        // descriptor what is supported first.
        let supported = api(open_uffd()?.as_fd(), 0)?;
        let need = FEATURE_EVENT_UNMAP | FEATURE_EVENT_REMOVE | FEATURE_EVENT_REMAP;
        if supported & need != need {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("userfaultfd lacks unmap/remove/remap events (features {supported:#x})"),
            ));
        }
        let fd = open_uffd()?;
        api(fd.as_fd(), need | (supported & FEATURE_WP_HUGETLBFS_SHMEM))?;
        Ok(Watcher { fd })
    }

    /// Watches `[start, start + len)` (page-aligned, fully mapped): `UFFDIO_REGISTER` in
    /// write-protect mode, with nothing write-protected, so no access ever faults to us.
    ///
    /// Fails (`EINVAL`) for memory userfaultfd cannot watch, such as a file mapping on a
    /// disk filesystem, and (`EBUSY`) for a range another userfaultfd already watches.
    pub fn watch(&self, start: usize, len: usize) -> io::Result<()> {
        register_wp(self.fd.as_fd(), start, len)
    }

    /// Sleeps until events are queued (`poll(2)`); allocates nothing.
    pub fn wait(&self) -> io::Result<()> {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        loop {
            count();
            match poll(&mut fds, None) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads the queued events without blocking, at most `max`, appending them to `out`.
    /// Reading an event is what lets the thread that caused it continue.
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> io::Result<usize> {
        let mut msgs = [UffdMsg::default(); 16];
        let got = read_msgs(self.fd.as_fd(), &mut msgs[..max.min(16)])?;
        for m in &msgs[..got] {
            let [a, b, c] = m.arg;
            out.push(match m.event {
                EVENT_UNMAP => Event::Unmap {
                    start: a as usize,
                    end: b as usize,
                },
                EVENT_REMOVE => Event::Remove {
                    start: a as usize,
                    end: b as usize,
                },
                EVENT_REMAP => Event::Remap {
                    from: a as usize,
                    to: b as usize,
                    len: c as usize,
                },
                other => Event::Other(other),
            });
        }
        Ok(got)
    }
}

#[cfg(feature = "uring")]
impl AsFd for Watcher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

// ---------------------------------------------------------------- write protection

#[cfg(feature = "semantics")]
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xC018_AA06;
#[cfg(feature = "semantics")]
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
#[cfg(feature = "semantics")]
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
#[cfg(feature = "semantics")]
const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
#[cfg(feature = "semantics")]
const EVENT_PAGEFAULT: u8 = 0x12;
#[cfg(feature = "semantics")]
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[cfg(feature = "semantics")]
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[cfg(feature = "semantics")]
/// A write to a write-protected page, waiting for the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WpFault {
    /// The faulting address (not page-aligned).
    pub addr: usize,
}

#[cfg(feature = "semantics")]
/// A userfaultfd used for write protection (`UFFDIO_REGISTER_MODE_WP` and
/// `UFFDIO_WRITEPROTECT`): a write to a protected page of a registered range stops the
/// writing thread and queues a [`WpFault`] until [`Protector::unprotect`] or
/// [`Protector::wake`] lets it go.
#[derive(Debug)]
pub struct Protector {
    fd: OwnedFd,
    user_mode_only: bool,
}

#[cfg(feature = "semantics")]
impl Protector {
    /// Opens a non-blocking userfaultfd with write-protect faults on shmem (memfd)
    /// mappings enabled. Kernel-mode faults (a `read(2)` into a protected page) are
    /// handled too when the process may ask for them (root, `CAP_SYS_PTRACE` or
    /// `vm.unprivileged_userfaultfd = 1`); otherwise it falls back to user-mode faults
    /// only, and [`user_mode_only`](Self::user_mode_only) says so: a kernel write into a
    /// protected page then fails with `EFAULT` instead of waiting.
    pub fn new() -> io::Result<Protector> {
        let (probe, user_mode_only) = match open_flags(0) {
            Ok(fd) => (fd, false),
            Err(_) => (open_flags(UFFD_USER_MODE_ONLY)?, true),
        };
        let supported = api(probe.as_fd(), 0)?;
        let need = FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_HUGETLBFS_SHMEM;
        if supported & need != need {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("userfaultfd lacks write-protect on shmem (features {supported:#x})"),
            ));
        }
        let fd = open_flags(if user_mode_only {
            UFFD_USER_MODE_ONLY
        } else {
            0
        })?;
        api(fd.as_fd(), need)?;
        Ok(Protector { fd, user_mode_only })
    }

    /// True if kernel-mode writes into protected pages fail (`EFAULT`) rather than wait.
    pub fn user_mode_only(&self) -> bool {
        self.user_mode_only
    }

    /// Registers `[start, start + len)` (page-aligned, mapped) for write-protect faults.
    /// Registering a range this descriptor already covers again is allowed.
    pub fn register(&self, start: usize, len: usize) -> io::Result<()> {
        register_wp(self.fd.as_fd(), start, len)
    }

    fn writeprotect(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
        };
        count();
        // SAFETY: UFFDIO_WRITEPROTECT reads one `struct uffdio_writeprotect`; it changes
        // page protections of a registered range, never contents.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                UFFDIO_WRITEPROTECT,
                &mut w as *mut UffdioWriteprotect,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Write-protects `[start, start + len)` of a registered range: from now on a write
    /// through this process's mapping faults to the handler.
    pub fn protect(&self, start: usize, len: usize) -> io::Result<()> {
        self.writeprotect(start, len, UFFDIO_WRITEPROTECT_MODE_WP)
    }

    /// Removes write protection from `[start, start + len)` and wakes the threads waiting
    /// on faults there.
    pub fn unprotect(&self, start: usize, len: usize) -> io::Result<()> {
        self.writeprotect(start, len, 0)
    }

    /// Wakes the threads waiting on faults in `[start, start + len)` (`UFFDIO_WAKE`):
    /// they retry their access.
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        count();
        // SAFETY: UFFDIO_WAKE reads one `struct uffdio_range`.
        let rc =
            unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &mut r as *mut UffdioRange) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads queued write-protect faults without blocking, appending them to `out`
    /// (other events are dropped). Returns how many messages were read.
    pub fn read_faults(&self, out: &mut Vec<WpFault>) -> io::Result<usize> {
        let mut msgs = [UffdMsg::default(); 16];
        let got = read_msgs(self.fd.as_fd(), &mut msgs)?;
        for m in &msgs[..got] {
            if m.event == EVENT_PAGEFAULT && m.arg[0] & PAGEFAULT_FLAG_WP != 0 {
                out.push(WpFault {
                    addr: m.arg[1] as usize,
                });
            }
        }
        Ok(got)
    }
}

#[cfg(feature = "semantics")]
impl AsFd for Protector {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn open_flags(extra: libc::c_int) -> io::Result<OwnedFd> {
    count();
    // SAFETY: userfaultfd(2) takes only flags and returns a new descriptor or -1.
    let r = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | extra,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioApi>(), 24);
    }

    #[test]
    #[cfg(feature = "uring")]
    fn munmap_of_a_watched_range_is_reported() {
        let w = match Watcher::new() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("skipped: no userfaultfd here ({e})");
                return;
            }
        };
        let len = 4 * super::super::page_size();
        // SAFETY: a fresh anonymous private mapping, no MAP_FIXED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        w.watch(p as usize, len).unwrap();
        // The munmap below blocks until the event is read, so read it on another thread.
        let start = p as usize;
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut ev = Vec::new();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while ev.is_empty() && std::time::Instant::now() < deadline {
                    w.read_events(&mut ev, 16).unwrap();
                    std::thread::yield_now();
                }
                ev
            });
            // SAFETY: the mapping was made above and nothing refers to it any more.
            assert_eq!(unsafe { libc::munmap(start as *mut libc::c_void, len) }, 0);
            let ev = h.join().unwrap();
            assert_eq!(
                ev,
                vec![Event::Unmap {
                    start,
                    end: start + len
                }]
            );
        });
    }
}
