//! The few operating-system calls the benchmark harness needs: the clock,
//! CPU pinning, and descriptors handed from the harness to a worker.
//!
//! This module and [`vm`] (the page-table probes of the calibration) are the only ones of
//! this crate that contain `unsafe` code.
#![allow(unsafe_code)]

pub mod vm;

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

use rustix::io::FdFlags;
use rustix::thread::CpuSet;
use rustix::time::{clock_gettime, ClockId};

/// `CLOCK_MONOTONIC` in nanoseconds. The clock is system-wide, so a stamp
/// taken in one process can be subtracted from one taken in another.
pub fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time the calling thread has used, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Pins the calling thread to one CPU (`sched_setaffinity(2)`).
pub fn pin_to(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// The calling thread's CPU affinity, to be put back with [`restore_affinity`]: a run of
/// several suites gives each the placement the run started with, whatever the suite
/// before it pinned (the processes a suite starts inherit it).
pub fn save_affinity() -> io::Result<CpuSet> {
    Ok(rustix::thread::sched_getaffinity(None)?)
}

/// Puts back an affinity [`save_affinity`] returned.
pub fn restore_affinity(set: &CpuSet) -> io::Result<()> {
    rustix::thread::sched_setaffinity(None, set)?;
    Ok(())
}

/// The CPUs this process may run on (`sched_getaffinity(2)`), in order.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => vec![0],
    }
}

/// Lets the next spawned child inherit `fd` by clearing `FD_CLOEXEC`.
///
/// Call it right before spawning the one child that should get `fd`, and
/// drop the parent's copy right after: every spawn happens on the spawning process's
/// main thread (the harness's, `ferry pipeline`'s), so no other child can inherit it in
/// between.
pub fn inheritable(fd: impl AsFd) -> io::Result<()> {
    rustix::io::fcntl_setfd(fd, FdFlags::empty())?;
    Ok(())
}

/// Sets or clears `O_NONBLOCK` on a descriptor.
pub fn set_nonblocking(fd: impl AsFd, on: bool) -> io::Result<()> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let fd = fd.as_fd();
    let mut flags = fcntl_getfl(fd)?;
    flags.set(OFlags::NONBLOCK, on);
    fcntl_setfl(fd, flags)?;
    Ok(())
}

/// Takes ownership of a descriptor that this process inherited from its parent (a worker
/// from the harness, a pipeline stage from `ferry pipeline`).
///
/// Fails, rather than claiming a number that nothing holds, if `fd` is not open.
pub fn inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is a standard stream, not an inherited endpoint"),
        ));
    }
    std::fs::symlink_metadata(format!("/proc/self/fd/{fd}"))
        .map_err(|e| io::Error::new(e.kind(), format!("inherited fd {fd} is not open: {e}")))?;
    // SAFETY: `fd` is open (checked above) and was placed in this process by
    // its parent, which passes each inherited number to exactly one argument;
    // this process claims each number once, so nothing else in this process
    // owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A few cache lines shared by two workers: a memfd the harness creates and
/// hands to both, mapped `MAP_SHARED` in each (`mmap(2)`), used only through
/// atomics. Each line holds eight 64-bit words.
pub struct SharedLines {
    ptr: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    lines: usize,
}

// SAFETY: the mapping is only reached through `&AtomicU64`, which may be
// shared between threads; `SharedLines` owns it until drop.
unsafe impl Send for SharedLines {}
// SAFETY: as above.
unsafe impl Sync for SharedLines {}

impl SharedLines {
    /// A fresh zeroed memfd of `lines` cache lines (`memfd_create(2)`), to be
    /// mapped by each worker with [`SharedLines::map`].
    pub fn create(lines: usize) -> io::Result<OwnedFd> {
        use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
        let fd = memfd_create("ferry-bench-lines", MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, (lines * 64) as u64)?;
        Ok(fd)
    }

    /// Maps `lines` cache lines of `fd` shared, read-write.
    pub fn map(fd: impl AsFd, lines: usize) -> io::Result<SharedLines> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        // SAFETY: a fresh mapping chosen by the kernel (no address given), so it
        // replaces nothing; the memory is accessed only as atomics.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                lines * 64,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        Ok(SharedLines {
            ptr: std::ptr::NonNull::new(p.cast()).expect("mmap never returns null"),
            lines,
        })
    }

    /// Word `i` (0..8) of line `line`.
    pub fn word(&self, line: usize, i: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(
            line < self.lines && i < 8,
            "word {line}.{i} is outside the mapping"
        );
        // SAFETY: inside the mapping (checked above), which lives as long as
        // `self`; the memory is 8-byte aligned (page-aligned base) and only
        // ever accessed atomically, by both processes.
        unsafe { &*self.ptr.as_ptr().add(line * 8 + i) }
    }
}

/// [`SharedLines`] in a named file of this run's own, `/dev/shm/ferry-bench-TAG-lines`,
/// for a worker started with its path rather than an inherited descriptor; the file is
/// removed when this is dropped.
pub struct LinesFile {
    pub path: std::path::PathBuf,
    pub lines: SharedLines,
}

impl LinesFile {
    /// Creates the file afresh (a stale one of the same name is replaced), `lines`
    /// cache lines long, and maps it.
    pub fn create(tag: &str, lines: usize) -> io::Result<LinesFile> {
        let path = std::path::PathBuf::from(format!("/dev/shm/ferry-bench-{tag}-lines"));
        let _ = std::fs::remove_file(&path);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.set_len((lines * 64) as u64)?;
        let lines = SharedLines::map(&f, lines)?;
        Ok(LinesFile { path, lines })
    }
}

impl Drop for LinesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for SharedLines {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it
        // outlives `self` (`word` borrows `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.lines * 64) };
    }
}

/// A private anonymous mapping (`mmap(2)`, `MAP_PRIVATE | MAP_ANONYMOUS`), read-write,
/// in 4 KiB pages (`MADV_NOHUGEPAGE`, as a memfd's are unless shmem huge pages are on),
/// every page written once at creation so that later writes take no page fault. Unlike
/// [`vm::Map`] nothing else maps it, so it hands out a plain slice.
pub struct PrivateBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: an owned, private address range, reached only through `&self` / `&mut self`.
unsafe impl Send for PrivateBuf {}
// SAFETY: as above; shared access is read-only (`&[u8]`).
unsafe impl Sync for PrivateBuf {}

impl PrivateBuf {
    /// `len` bytes (more than 0), every page pre-faulted.
    pub fn new(len: usize) -> io::Result<PrivateBuf> {
        use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
        assert!(len > 0, "an empty mapping");
        // SAFETY: a fresh mapping chosen by the kernel (no address given), so it
        // replaces nothing we hold.
        let p = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )?
        };
        let mut b = PrivateBuf {
            ptr: std::ptr::NonNull::new(p.cast()).expect("mmap never returns null"),
            len,
        };
        // SAFETY: advice on the mapping just made, which nothing else uses yet.
        unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::LinuxNoHugepage)? };
        b.as_mut_slice().fill(0x11);
        Ok(b)
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` mapped, readable and writable bytes owned by `self`, private to
        // this process; the borrow of `self` keeps the slice unique and within its life.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PrivateBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice into it outlives
        // `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A suite that pins its thread leaves the next one the placement saved before it.
    #[test]
    fn restore_affinity_undoes_a_pin() {
        let all = allowed_cpus();
        let saved = save_affinity().unwrap();
        // In a thread of its own, so that the test harness's other threads keep theirs.
        std::thread::spawn(move || {
            pin_to(all[all.len() - 1]).unwrap();
            assert_eq!(allowed_cpus(), [all[all.len() - 1]]);
            restore_affinity(&saved).unwrap();
            assert_eq!(allowed_cpus(), all);
        })
        .join()
        .unwrap();
    }
}
