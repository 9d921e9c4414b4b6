//! Thin, safe wrappers over the Linux calls ferry uses.
//!
//! Private to the crate: [`crate::diagnostics`] re-exports what callers outside it may
//! observe. The `unsafe` of syscalls lives here; the crate docs list the other modules
//! that need `unsafe` and why. Every wrapper names the call it makes. Each call made
//! through this layer is also counted (see [`syscall_count`]), so benchmarks can show that
//! the steady-state data path makes none.

pub mod fd;
pub mod fds;
pub mod futex;
pub mod mem;
#[cfg(feature = "containers")]
pub mod scm;
pub mod seal;
pub mod signal;
#[cfg(feature = "uring")]
pub mod sockaddr;
#[cfg(feature = "containers")]
pub mod splice;
#[cfg(any(feature = "uring", feature = "semantics"))]
pub mod uffd;

use std::sync::atomic::{AtomicU64, Ordering};

static SYSCALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_SYSCALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Records one system call made by ferry.
///
/// Called only beside a system call, which costs far more than these two relaxed
/// increments; the steady-state hand-over makes no system call, so this never runs there
/// and is not behind a feature.
#[inline]
pub(crate) fn count() {
    SYSCALLS.fetch_add(1, Ordering::Relaxed);
    THREAD_SYSCALLS.with(|c| c.set(c.get() + 1));
}

/// Number of system calls ferry has made on the calling thread so far.
pub fn thread_syscall_count() -> u64 {
    THREAD_SYSCALLS.with(|c| c.get())
}

/// Number of system calls ferry itself has made in this process so far.
///
/// This counts only calls made through ferry's `sys` layer (not the allocator's or the
/// caller's own); take the difference around a loop to check a path is syscall-free.
pub fn syscall_count() -> u64 {
    SYSCALLS.load(Ordering::Relaxed)
}

/// The system page size.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// Rounds `n` up to a multiple of the page size, or `None` on overflow.
pub fn round_up_pages(n: usize) -> Option<usize> {
    let p = page_size();
    n.checked_add(p - 1).map(|v| v & !(p - 1))
}
