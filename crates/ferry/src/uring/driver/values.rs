//! The driver's public values: tickets, completions, refusals, targets and counters.

use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use crate::error::Error;

/// Counters of one [`Uring`](super::Uring), read with [`Uring::stats`](super::Uring::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Operations placed in the submission queue (ferry's own cancel requests excluded).
    pub submitted: u64,
    /// Operations whose buffer came back (for SEND_ZC: after the notification).
    pub completed: u64,
    /// `io_uring_enter(2)` calls this ring made (each also counted by `sys::count`).
    pub enters: u64,
    /// Enters that had to wake a sleeping SQPOLL thread (`IORING_ENTER_SQ_WAKEUP`).
    pub sqpoll_wakeups: u64,
    /// Operations that used a registered buffer (`READ_FIXED`, `WRITE_FIXED`, fixed SEND_ZC).
    pub fixed_ops: u64,
    /// Operations that named a registered file.
    pub fixed_file_ops: u64,
    /// SEND_ZC operations that completed without error.
    pub zc_sent: u64,
    /// SEND_ZC notifications saying the kernel copied anyway (`IORING_NOTIF_USAGE_ZC_COPIED`);
    /// always the case on loopback and veth.
    pub zc_copied: u64,
    /// Zero-copy sends done as plain sends because the kernel lacks SEND_ZC.
    pub zc_fallbacks: u64,
    /// Operations that ended with `ECANCELED`.
    pub cancelled: u64,
}

/// Where an operation goes: a plain descriptor or a slot of the registered file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A file descriptor of this process.
    Fd(RawFd),
    /// An index into the table set up by [`Uring::register_files`](super::Uring::register_files).
    Fixed(u32),
}

impl From<RawFd> for Target {
    fn from(fd: RawFd) -> Target {
        Target::Fd(fd)
    }
}

impl<T: AsRawFd> From<&T> for Target {
    fn from(fd: &T) -> Target {
        Target::Fd(fd.as_raw_fd())
    }
}

/// A submitted operation; trade it for its [`Completion`] with [`Uring::wait`](super::Uring::wait).
///
/// A ticket that is dropped unused leaves its buffer with the ring until the ring is
/// dropped (never freed while the kernel may use it).
#[must_use = "the buffer comes back only through Uring::wait"]
#[derive(Debug)]
pub struct Ticket<B> {
    pub(super) ring: u64,
    pub(super) slot: u32,
    pub(super) gen: u32,
    pub(super) _buf: PhantomData<fn() -> B>,
}

impl<B> Ticket<B> {
    pub(super) fn user_data(&self) -> u64 {
        crate::uring::ring::user_data(self.slot, self.gen)
    }
}

/// The end of an operation: its result and its buffer, returned to the caller.
#[derive(Debug)]
pub struct Completion<B> {
    /// Bytes transferred, or the error the kernel reported (e.g. `EBADF`, `ECANCELED`).
    pub result: io::Result<usize>,
    /// The buffer the operation owned.
    pub buf: B,
    /// For `recv_from`: the sender's address.
    pub peer: Option<SocketAddr>,
    /// For `recv_from`: the datagram was longer than the buffer (`MSG_TRUNC`); the excess
    /// was discarded.
    pub truncated: bool,
    /// For a zero-copy send: the kernel reported that it copied the data after all.
    pub zc_copied: bool,
}

/// An operation refused before submission, with its buffer handed back.
pub struct Refused<B> {
    /// Why it was refused.
    pub error: Error,
    /// The caller's buffer, untouched.
    pub buf: B,
}

impl<B> std::fmt::Debug for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<B> std::fmt::Display for Refused<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "operation refused: {}", self.error)
    }
}

impl<B> std::error::Error for Refused<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<Refused<B>> for Error {
    fn from(r: Refused<B>) -> Error {
        r.error
    }
}
