//! Page-table probes for `ferry calibrate`: owned mappings of memfds and anonymous
//! memory, and the calls whose cost it measures on them (`mmap(2)` with `MAP_FIXED`,
//! `mprotect(2)`, `mremap(2)`, `munmap(2)`, `mlock(2)`, and userfaultfd write
//! protection, `ioctl_userfaultfd(2)`).
//!
//! These are measuring instruments, not ferry's mechanisms: the library's passing layer
//! has its own. Every call is the plain system call, so what is timed is the kernel's work.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{MapFlags, MprotectFlags, MremapFlags, ProtFlags};

/// The page size of this machine.
pub fn page() -> usize {
    rustix::param::page_size()
}

/// A memfd of `len` bytes (`memfd_create(2)` + `ftruncate(2)`).
pub fn memfd(len: usize) -> io::Result<OwnedFd> {
    let fd = memfd_create("ferry-calibrate", MemfdFlags::CLOEXEC)?;
    ftruncate(&fd, len as u64)?;
    Ok(fd)
}

/// Access to a mapping's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    Read,
    ReadWrite,
}

impl Prot {
    fn mprotect(self) -> MprotectFlags {
        match self {
            Prot::Read => MprotectFlags::READ,
            Prot::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        }
    }
    fn mmap(self) -> ProtFlags {
        match self {
            Prot::Read => ProtFlags::READ,
            Prot::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        }
    }
}

/// A range of address space this process owns: unmapped on drop.
///
/// Its contents may change under it (another mapping of the same memfd, `MAP_FIXED`
/// replacements, a hole left by [`Map::move_to`]), so it never hands out slices: bytes go
/// in and out through copies that the methods below check against its length, and the
/// caller keeps track of which pages are accessible.
pub struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Map` is a plain address range; the methods that read or write it are bound
// checked and touch it with raw copies, which are sound from any thread.
unsafe impl Send for Map {}
// SAFETY: as above; concurrent copies into the same range race on the bytes, never on
// the `Map` itself, and the probes only do that on purpose (a TCOW fault's writer and
// handler work on the page one after the other).
unsafe impl Sync for Map {}

impl Map {
    /// A private anonymous mapping, read-write, every page written once.
    pub fn anon(len: usize) -> io::Result<Map> {
        // SAFETY: a new mapping at an address the kernel picks overlaps nothing we hold.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )?
        };
        let m = Map::own(p, len);
        m.fill(0x11);
        Ok(m)
    }

    /// A shared mapping of `fd` from offset 0.
    pub fn shared(fd: BorrowedFd<'_>, len: usize, prot: Prot) -> io::Result<Map> {
        // SAFETY: a new mapping at an address the kernel picks overlaps nothing we hold.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot.mmap(),
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        Ok(Map::own(p, len))
    }

    fn own(p: *mut std::ffi::c_void, len: usize) -> Map {
        Map {
            ptr: NonNull::new(p.cast()).expect("mmap never returns null on success"),
            len,
        }
    }

    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "range {off}+{len} outside a {}-byte map",
            self.len
        );
    }

    /// Writes `v` to every byte (the pages must be writable).
    pub fn fill(&self, v: u8) {
        // SAFETY: the whole range is ours and mapped; the caller keeps it writable.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), v, self.len) }
    }

    /// Copies `src` to `off` (the pages must be writable).
    pub fn copy_in(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: bound checked above; `src` is not inside this map (it is a borrowed
        // slice, and this map never hands out slices).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        }
    }

    /// Copies bytes at `off` into `dst` (the pages must be readable).
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: bound checked above; `dst` is exclusively borrowed and outside this map.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Copies `len` bytes at `from` to `to` inside the map (the ranges must not overlap;
    /// the pages must be readable and writable).
    pub fn copy_within(&self, from: usize, to: usize, len: usize) {
        self.check(from, len);
        self.check(to, len);
        assert!(from + len <= to || to + len <= from, "overlapping ranges");
        // SAFETY: both ranges are inside the map (checked) and do not overlap; this map
        // hands out no references into itself.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(from),
                self.ptr.as_ptr().add(to),
                len,
            )
        }
    }

    /// Reads one byte of every page and returns their sum (so the reads are kept).
    pub fn touch(&self) -> u64 {
        let mut sum = 0u64;
        for off in (0..self.len).step_by(page()) {
            // SAFETY: `off` is inside the map; a volatile read of a mapped byte.
            sum += u64::from(unsafe { self.ptr.as_ptr().add(off).read_volatile() });
        }
        sum
    }

    /// Writes `v` to the first byte of the page at `off` (volatile, so it is not elided).
    pub fn poke(&self, off: usize, v: u8) {
        self.check(off, 1);
        // SAFETY: inside the map; the caller keeps the page writable or handled.
        unsafe { self.ptr.as_ptr().add(off).write_volatile(v) }
    }

    /// `mprotect(2)` of `len` bytes at `off`.
    pub fn protect(&self, off: usize, len: usize, prot: Prot) -> io::Result<()> {
        self.check(off, len);
        // SAFETY: the range is ours; changing its protection cannot free memory that Rust
        // references (this map hands out none).
        unsafe { rustix::mm::mprotect(self.ptr.as_ptr().add(off).cast(), len, prot.mprotect())? };
        Ok(())
    }

    /// `mmap(MAP_SHARED | MAP_FIXED)` of `len` bytes of `fd` at `fd_off` over this map's
    /// range at `off`: the swap of a lot span into an application buffer.
    pub fn replace_with(
        &self,
        off: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        fd_off: u64,
        prot: Prot,
    ) -> io::Result<()> {
        self.check(off, len);
        // SAFETY: the target range is ours and no Rust reference points into it.
        unsafe {
            rustix::mm::mmap(
                self.ptr.as_ptr().add(off).cast(),
                len,
                prot.mmap(),
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                fd_off,
            )?
        };
        Ok(())
    }

    /// Replaces the whole range by fresh anonymous read-write memory, every page written.
    pub fn replace_anon(&self) -> io::Result<()> {
        // SAFETY: the target range is ours and no Rust reference points into it.
        unsafe {
            rustix::mm::mmap_anonymous(
                self.ptr.as_ptr().cast(),
                self.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED,
            )?
        };
        self.fill(0x11);
        Ok(())
    }

    /// `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` of this map's pages onto `to`'s range
    /// (same length). This map's range is left unmapped: a hole until it is replaced.
    pub fn move_to(&self, to: &Map) -> io::Result<()> {
        assert_eq!(self.len, to.len);
        // SAFETY: both ranges are ours and no Rust reference points into either; the
        // pages of `to` are replaced, and this range becomes a hole that drop may unmap.
        unsafe {
            rustix::mm::mremap_fixed(
                self.ptr.as_ptr().cast(),
                self.len,
                self.len,
                MremapFlags::MAYMOVE,
                to.ptr.as_ptr().cast(),
            )?
        };
        Ok(())
    }

    /// `mlock(2)` (`on`) or `munlock(2)` of the whole map.
    pub fn lock(&self, on: bool) -> io::Result<()> {
        // SAFETY: the range is ours; locking changes residency, not contents.
        unsafe {
            if on {
                rustix::mm::mlock(self.ptr.as_ptr().cast(), self.len)?
            } else {
                rustix::mm::munlock(self.ptr.as_ptr().cast(), self.len)?
            }
        };
        Ok(())
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `Map::anon`/`Map::shared` and is released once;
        // nothing borrows into it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xC018_AA06;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const EVENT_PAGEFAULT: u8 = 0x12;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// A userfaultfd in write-protect mode (non-blocking reads).
pub struct Uffd(OwnedFd);

impl Uffd {
    /// `userfaultfd(2)` with shmem write protection, or the error that says why not.
    pub fn new() -> io::Result<Uffd> {
        // SAFETY: userfaultfd takes flags and returns a new fd or -1.
        let raw = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let u = Uffd(unsafe { OwnedFd::from_raw_fd(raw as i32) });
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_WP_HUGETLBFS_SHMEM,
            ioctls: 0,
        };
        u.ioctl(UFFDIO_API, &mut api)?;
        Ok(u)
    }

    fn ioctl<T>(&self, req: libc::c_ulong, arg: &mut T) -> io::Result<()> {
        // SAFETY: every request used here takes a pointer to the `#[repr(C)]` struct `T`
        // that matches it, which lives for the call.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), req, arg as *mut T) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Registers `m` for write-protect faults.
    pub fn register(&self, m: &Map) -> io::Result<()> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: m.addr() as u64,
                len: m.len() as u64,
            },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut r)
    }

    /// `UFFDIO_WRITEPROTECT` of `len` bytes at `addr`, on or off.
    pub fn write_protect(&self, addr: usize, len: usize, on: bool) -> io::Result<()> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut w)
    }

    /// `UFFDIO_WAKE`: lets the threads faulting in the range retry.
    pub fn wake(&self, addr: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_WAKE, &mut r)
    }

    /// The address of the next page fault, waiting at most `timeout_ms` (`None` when none
    /// came).
    pub fn next_fault(&self, timeout_ms: i32) -> io::Result<Option<usize>> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        let t = Timespec {
            tv_sec: (timeout_ms / 1000) as i64,
            tv_nsec: ((timeout_ms % 1000) as i64) * 1_000_000,
        };
        if poll(&mut fds, Some(&t))? == 0 {
            return Ok(None);
        }
        let mut msg = [0u8; 32];
        match rustix::io::read(self.0.as_fd(), &mut msg) {
            Ok(32) => {}
            Ok(n) => return Err(io::Error::other(format!("short userfaultfd read: {n}"))),
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        if msg[0] != EVENT_PAGEFAULT {
            return Err(io::Error::other(format!(
                "unexpected userfaultfd event {:#x}",
                msg[0]
            )));
        }
        let addr = u64::from_ne_bytes(msg[16..24].try_into().expect("8 bytes"));
        Ok(Some(addr as usize))
    }
}
