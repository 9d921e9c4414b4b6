//! Passing descriptors over a Unix socket with `SCM_RIGHTS`
//! ([sendmsg(2)](https://man7.org/linux/man-pages/man2/sendmsg.2.html),
//! [recvmsg(2)](https://man7.org/linux/man-pages/man2/recvmsg.2.html),
//! [unix(7)](https://man7.org/linux/man-pages/man7/unix.7.html)).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::count;

/// Most descriptors one message may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// Sends `bytes` with `fds` attached (`sendmsg(2)` with one `SCM_RIGHTS` message).
///
/// Returns the bytes sent; on a stream socket this may be fewer than `bytes.len()`, and the
/// descriptors then travel with the part that was sent. The caller keeps its own copies of
/// `fds`; the receiver gets new descriptors for the same open files.
pub fn send_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    loop {
        count();
        match rustix::net::sendmsg(
            sock,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// What [`recv_fds`] received.
#[derive(Debug)]
pub struct Received {
    /// Bytes written into the buffer (0 means the peer closed the socket).
    pub len: usize,
    /// Descriptors that arrived, close-on-exec.
    pub fds: Vec<OwnedFd>,
    /// True if the kernel dropped descriptors because `max_fds` was too small
    /// (`MSG_CTRUNC`); the ones dropped are closed by the kernel.
    pub truncated: bool,
}

/// Receives into `buf` and collects up to `max_fds` descriptors that came with it
/// (`recvmsg(2)` with `MSG_CMSG_CLOEXEC`).
pub fn recv_fds(sock: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize) -> io::Result<Received> {
    let max_fds = max_fds.clamp(1, MAX_FDS);
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        count();
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = msg {
            fds.extend(it);
        }
    }
    Ok(Received {
        len: r.bytes,
        fds,
        truncated: r.flags.contains(ReturnFlags::CTRUNC),
    })
}
