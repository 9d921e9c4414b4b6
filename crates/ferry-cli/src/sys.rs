//! The few operating-system calls the benchmark harness needs: the clock,
//! CPU pinning, and descriptors handed from the harness to a worker.
//!
//! This is the only module of the CLI that contains `unsafe` code; [`vm`] holds the
//! page-table probes of `ferry calibrate`.
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
/// drop the parent's copy right after: every spawn happens on the harness's
/// main thread, so no other child can inherit it in between.
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

/// Takes ownership of a descriptor that this worker inherited from the harness.
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
    // the harness, which passes each inherited number to exactly one worker
    // argument; the worker claims each number once, so nothing else in this
    // process owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
