//! The submission entries a command hands the kernel: how their `user_data` names the
//! command's slot and part, and the boxed `msghdr`s and addresses they point into.

use std::net::SocketAddr;

use io_uring::types::Fixed;
use io_uring::{opcode, squeue};

use crate::sys::sockaddr::{read_sockaddr, write_sockaddr};
use crate::uring::ring::{self, SEND_ZC_REPORT_USAGE};
use crate::vcm::command::{BufRange, SockHandle};

pub(super) const PART_MAIN: u64 = 0;
pub(super) const PART_REPLY: u64 = 1;
pub(super) const PART_CANCEL: u64 = 2;

/// An entry's `user_data`: the ring core's slot and tag, the tag holding the low 24 bits
/// of the slot's generation and the part of the command (`PART_*`).
pub(super) fn user_data(slot: u32, generation: u32, part: u64) -> u64 {
    ring::user_data(slot, ((generation & 0x00ff_ffff) << 8) | part as u32)
}

/// The slot, generation (low 24 bits) and part packed by [`user_data`].
pub(super) fn split_user_data(ud: u64) -> (u32, u32, u64) {
    let (slot, tag) = ring::split_user_data(ud);
    (slot, tag >> 8, u64::from(tag & 0xff))
}

/// The `msghdr`, `iovec` and addresses one command hands the kernel. Boxed, so their
/// addresses stay put while the slot vector grows.
pub(super) struct MsgSpace {
    hdr: libc::msghdr,
    iov: libc::iovec,
    from: libc::sockaddr_storage,
    to: libc::sockaddr_storage,
    to_len: libc::socklen_t,
}

// SAFETY: the raw pointers inside point into this same box or into the endpoint's region;
// both move with the endpoint and are only used by the thread that owns it.
unsafe impl Send for MsgSpace {}

impl MsgSpace {
    pub(super) fn new() -> Box<MsgSpace> {
        // SAFETY: msghdr, iovec and sockaddr_storage are plain C structs for which all-zero
        // bytes are a valid (empty) value.
        Box::new(unsafe { std::mem::zeroed() })
    }

    /// Where the message a receive completed came from (IPv4 or IPv6).
    pub(super) fn source(&self) -> Option<SocketAddr> {
        read_sockaddr(&self.from, self.hdr.msg_namelen)
    }

    /// Whether the datagram a receive completed did not fit (`MSG_TRUNC`).
    pub(super) fn truncated(&self) -> bool {
        self.hdr.msg_flags & libc::MSG_TRUNC != 0
    }
}

pub(super) fn send_entry(
    m: &mut MsgSpace,
    base: *mut u8,
    r: BufRange,
    sock: SockHandle,
    to: Option<SocketAddr>,
    zero_copy: bool,
) -> squeue::Entry {
    // `base + offset` stays inside the region: callers checked the range.
    let ptr = base.wrapping_add(r.offset as usize);
    if zero_copy {
        let mut op = opcode::SendZc::new(Fixed(sock.slot), ptr, r.len)
            .buf_index(Some(0))
            .zc_flags(SEND_ZC_REPORT_USAGE)
            .flags(libc::MSG_NOSIGNAL);
        if let Some(to) = to {
            m.to_len = write_sockaddr(&mut m.to, to);
            op = op
                .dest_addr(std::ptr::addr_of!(m.to).cast())
                .dest_addr_len(m.to_len);
        }
        return op.build();
    }
    let mut op = opcode::Send::new(Fixed(sock.slot), ptr, r.len).flags(libc::MSG_NOSIGNAL);
    if let Some(to) = to {
        m.to_len = write_sockaddr(&mut m.to, to);
        op = op
            .dest_addr(std::ptr::addr_of!(m.to).cast())
            .dest_addr_len(m.to_len);
    }
    op.build()
}

pub(super) fn recv_entry(
    m: &mut MsgSpace,
    base: *mut u8,
    r: BufRange,
    sock: SockHandle,
    nowait: bool,
    dgram: bool,
) -> squeue::Entry {
    m.iov = libc::iovec {
        iov_base: base.wrapping_add(r.offset as usize).cast(),
        iov_len: r.len as usize,
    };
    m.hdr.msg_name = std::ptr::addr_of_mut!(m.from).cast();
    m.hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m.hdr.msg_iov = std::ptr::addr_of_mut!(m.iov);
    m.hdr.msg_iovlen = 1;
    m.hdr.msg_control = std::ptr::null_mut();
    m.hdr.msg_controllen = 0;
    m.hdr.msg_flags = 0;
    // MSG_TRUNC: the result is the datagram's full length even when it did not fit. On a
    // stream socket it would discard the bytes instead, so only datagrams get it.
    let trunc = if dgram { libc::MSG_TRUNC } else { 0 };
    opcode::RecvMsg::new(Fixed(sock.slot), std::ptr::addr_of_mut!(m.hdr))
        .flags((trunc | if nowait { libc::MSG_DONTWAIT } else { 0 }) as u32)
        .build()
}
