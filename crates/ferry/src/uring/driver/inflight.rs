//! What the driver keeps while the kernel owns an operation's memory: the operation's
//! state ([`InFlight`]: its buffer, its `msghdr`, its result so far), the slot that parks
//! it under a generation, and the boxed `msghdr` of a datagram operation.

use std::any::Any;
use std::mem;
use std::net::SocketAddr;

use crate::sys::sockaddr::{read_sockaddr, write_sockaddr};

/// A `msghdr` with its one `iovec` and its address, boxed so the kernel's pointers into it
/// stay valid while the operation runs.
pub(super) struct MsgState {
    hdr: libc::msghdr,
    iov: libc::iovec,
    addr: libc::sockaddr_storage,
}

// SAFETY: the raw pointers in `hdr` and `iov` point into this same box and into the
// operation's buffer, both owned by the operation; nothing else shares them.
unsafe impl Send for MsgState {}

impl MsgState {
    /// A boxed header for one buffer, with `addr` as destination (or room for the source).
    pub(super) fn boxed(ptr: *mut u8, len: usize, addr: Option<SocketAddr>) -> Box<MsgState> {
        // SAFETY: msghdr, iovec and sockaddr_storage are plain C structs; all-zero is valid.
        let mut m: Box<MsgState> = Box::new(unsafe { mem::zeroed() });
        m.iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        let addr_len = match addr {
            Some(a) => write_sockaddr(&mut m.addr, a),
            None => mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        };
        m.hdr.msg_name = (&mut m.addr as *mut libc::sockaddr_storage).cast();
        m.hdr.msg_namelen = addr_len;
        m.hdr.msg_iov = &mut m.iov;
        m.hdr.msg_iovlen = 1;
        m
    }

    /// The header, to hand to `SENDMSG` / `RECVMSG`.
    pub(super) fn hdr(&self) -> *const libc::msghdr {
        &self.hdr
    }

    /// The source address the kernel wrote, if it is IPv4 or IPv6.
    pub(super) fn peer(&self) -> Option<SocketAddr> {
        read_sockaddr(&self.addr, self.hdr.msg_namelen)
    }

    /// Whether the datagram did not fit (`MSG_TRUNC` in the returned flags).
    pub(super) fn truncated(&self) -> bool {
        self.hdr.msg_flags & libc::MSG_TRUNC != 0
    }
}

/// What kind of operation a slot holds, for completion handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Plain,
    SendZc,
    RecvFrom,
}

/// An operation the kernel may still be working on; owns everything the SQE points to.
pub(super) struct InFlight {
    pub(super) buf: Box<dyn Any + Send>,
    pub(super) msg: Option<Box<MsgState>>,
    pub(super) kind: Kind,
    pub(super) result: Option<i32>,
    pub(super) notif_pending: bool,
    pub(super) zc_copied: bool,
}

impl InFlight {
    pub(super) fn done(&self) -> bool {
        self.result.is_some() && !self.notif_pending
    }
}

pub(super) struct Slot {
    pub(super) gen: u32,
    pub(super) op: Option<InFlight>,
}
