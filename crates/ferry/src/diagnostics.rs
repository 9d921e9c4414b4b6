//! What tests, benchmarks and tools may observe of ferry's system layer.
//!
//! ferry's syscall wrappers are private to the crate; this module re-exports the little
//! that callers outside it need to measure: the count of system calls ferry has made (to
//! check that a steady-state path makes none) and the page size that fbuf, pallet and
//! region sizes are rounded to.
//!
//! ```
//! let before = ferry::diagnostics::thread_syscall_count();
//! let page = ferry::diagnostics::page_size();       // no ferry system call
//! assert!(page.is_power_of_two());
//! assert_eq!(ferry::diagnostics::thread_syscall_count(), before);
//! assert!(ferry::diagnostics::syscall_count() >= ferry::diagnostics::thread_syscall_count());
//! ```

pub use crate::sys::{page_size, syscall_count, thread_syscall_count};
