//! The operations a [`Uring`] runs: file reads and writes, stream sends and receives
//! (plain and zero-copy), and datagram `send_to` / `recv_from` through `sendmsg` /
//! `recvmsg` with a `msghdr` the ring owns until completion.

use std::io;
use std::net::SocketAddr;

use io_uring::{opcode, squeue, types};

use super::inflight::{InFlight, Kind, MsgState};
use super::{Completion, IoBuf, IoBufMut, Refused, Target, Ticket, Uring};
use crate::error::{Error, Result};
use crate::uring::ring::SEND_ZC_REPORT_USAGE;

fn fd_of(t: Target) -> FdArg {
    match t {
        Target::Fd(fd) => FdArg::Fd(types::Fd(fd)),
        Target::Fixed(i) => FdArg::Fixed(types::Fixed(i)),
    }
}

enum FdArg {
    Fd(types::Fd),
    Fixed(types::Fixed),
}

/// Builds an opcode whose first argument is a descriptor of either kind.
macro_rules! with_fd {
    ($t:expr, |$fd:ident| $build:expr) => {
        match fd_of($t) {
            FdArg::Fd($fd) => $build,
            FdArg::Fixed($fd) => $build,
        }
    };
}

/// Which way a positioned transfer goes.
#[derive(Clone, Copy)]
enum Rw {
    Read,
    Write,
}

fn len32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument("an operation moves at most 4 GiB - 1"))
}

fn to_io(e: Error) -> io::Error {
    match e {
        Error::Io(e) => e,
        other => io::Error::other(other),
    }
}

impl Uring {
    /// Parks `buf` (and an optional msghdr), builds the entry from the parked state and
    /// queues it. On refusal the buffer comes back untouched.
    fn submit_op<B: Send + 'static>(
        &mut self,
        target: Option<Target>,
        buf: B,
        msg: Option<Box<MsgState>>,
        kind: Kind,
        fixed: bool,
        build: impl FnOnce(Option<&MsgState>) -> Result<squeue::Entry>,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        if let Some(t) = target {
            if let Err(error) = self.check_target(t) {
                return Err(Refused { error, buf });
            }
        }
        let entry = match build(msg.as_deref()) {
            Ok(e) => e,
            Err(error) => return Err(Refused { error, buf }),
        };
        let (slot, gen) = self.park(InFlight {
            buf: Box::new(buf),
            msg,
            kind,
            result: None,
            notif_pending: false,
            zc_copied: false,
        });
        match self.push_parked(slot, gen, entry) {
            Ok(t) => {
                if fixed {
                    self.stats.fixed_ops += 1;
                }
                Ok(t)
            }
            Err(error) => {
                let op = self.unpark(slot).expect("parked above");
                let buf = *op.buf.downcast::<B>().expect("parked as B");
                Err(Refused { error, buf })
            }
        }
    }

    /// Queues a no-op (`IORING_OP_NOP`): a round trip through the rings.
    pub fn submit_nop(&mut self) -> Result<Ticket<()>> {
        Ok(self.submit_op(None, (), None, Kind::Plain, false, |_| {
            Ok(opcode::Nop::new().build())
        })?)
    }

    /// Queues a read of up to `buf.bytes_total()` bytes at `offset` (`IORING_OP_READ`, or
    /// `READ_FIXED` for a [`FixedBuf`](super::FixedBuf) of this ring).
    pub fn submit_read_at<B: IoBufMut>(
        &mut self,
        fd: impl Into<Target>,
        mut buf: B,
        offset: u64,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
        self.submit_rw(fd.into(), buf, ptr, len, offset, Rw::Read)
    }

    /// Queues a write of `buf.bytes_init()` bytes at `offset` (`IORING_OP_WRITE`, or
    /// `WRITE_FIXED` for a [`FixedBuf`](super::FixedBuf) of this ring).
    pub fn submit_write_at<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
        offset: u64,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let (ptr, len) = (buf.stable_ptr().cast_mut(), buf.bytes_init());
        self.submit_rw(fd.into(), buf, ptr, len, offset, Rw::Write)
    }

    /// Queues a positioned read or write of the `len` bytes at `ptr`, which lie in `buf`;
    /// with the fixed-buffer opcode when `buf` is a registered buffer of this ring.
    fn submit_rw<B: IoBuf>(
        &mut self,
        t: Target,
        buf: B,
        ptr: *mut u8,
        len: usize,
        offset: u64,
        rw: Rw,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let fixed = match self.fixed_index(&buf) {
            Ok(f) => f,
            Err(error) => return Err(Refused { error, buf }),
        };
        self.submit_op(Some(t), buf, None, Kind::Plain, fixed.is_some(), |_| {
            let len = len32(len)?;
            let c = ptr.cast_const();
            Ok(match (rw, fixed) {
                (Rw::Read, Some(i)) => {
                    with_fd!(t, |fd| opcode::ReadFixed::new(fd, ptr, len, i)
                        .offset(offset)
                        .build())
                }
                (Rw::Read, None) => with_fd!(t, |fd| opcode::Read::new(fd, ptr, len)
                    .offset(offset)
                    .build()),
                (Rw::Write, Some(i)) => {
                    with_fd!(t, |fd| opcode::WriteFixed::new(fd, c, len, i)
                        .offset(offset)
                        .build())
                }
                (Rw::Write, None) => with_fd!(t, |fd| opcode::Write::new(fd, c, len)
                    .offset(offset)
                    .build()),
            })
        })
    }

    /// Queues a send of `buf.bytes_init()` bytes on a connected socket (`IORING_OP_SEND`).
    pub fn submit_send<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let t = fd.into();
        let (ptr, len) = (buf.stable_ptr(), buf.bytes_init());
        self.submit_op(Some(t), buf, None, Kind::Plain, false, |_| {
            let len = len32(len)?;
            Ok(with_fd!(t, |fd| opcode::Send::new(fd, ptr, len)
                .flags(libc::MSG_NOSIGNAL)
                .build()))
        })
    }

    /// Queues a zero-copy send (`IORING_OP_SEND_ZC` with `IORING_SEND_ZC_REPORT_USAGE`).
    ///
    /// The buffer comes back only after the kernel's notification says the pages are no
    /// longer in use; [`Completion::zc_copied`](super::Completion::zc_copied) tells whether the kernel copied anyway (it
    /// does on loopback). Without SEND_ZC in the kernel this is a plain send, counted in
    /// [`UringStats::zc_fallbacks`](super::UringStats::zc_fallbacks).
    pub fn submit_send_zc<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        if !self.features.send_zc {
            self.stats.zc_fallbacks += 1;
            return self.submit_send(fd, buf);
        }
        let t = fd.into();
        let fixed = match self.fixed_index(&buf) {
            Ok(f) => f,
            Err(error) => return Err(Refused { error, buf }),
        };
        let (ptr, len) = (buf.stable_ptr(), buf.bytes_init());
        self.submit_op(Some(t), buf, None, Kind::SendZc, fixed.is_some(), |_| {
            let len = len32(len)?;
            Ok(with_fd!(t, |fd| opcode::SendZc::new(fd, ptr, len)
                .buf_index(fixed)
                .flags(libc::MSG_NOSIGNAL)
                .zc_flags(SEND_ZC_REPORT_USAGE)
                .build()))
        })
    }

    /// Queues a receive of up to `buf.bytes_total()` bytes (`IORING_OP_RECV`).
    pub fn submit_recv<B: IoBufMut>(
        &mut self,
        fd: impl Into<Target>,
        mut buf: B,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let t = fd.into();
        let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
        self.submit_op(Some(t), buf, None, Kind::Plain, false, |_| {
            let len = len32(len)?;
            Ok(with_fd!(t, |fd| opcode::Recv::new(fd, ptr, len).build()))
        })
    }

    /// Queues a datagram to `addr` (`IORING_OP_SENDMSG` with an owned `msghdr`).
    pub fn submit_send_to<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
        addr: SocketAddr,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let t = fd.into();
        let msg = MsgState::boxed(buf.stable_ptr().cast_mut(), buf.bytes_init(), Some(addr));
        self.submit_op(Some(t), buf, Some(msg), Kind::Plain, false, |m| {
            let hdr = m.expect("msg given").hdr();
            Ok(with_fd!(t, |fd| opcode::SendMsg::new(fd, hdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()))
        })
    }

    /// Queues a datagram receive (`IORING_OP_RECVMSG`); the completion carries the sender
    /// in [`Completion::peer`](super::Completion::peer) and sets [`Completion::truncated`](super::Completion::truncated) if it did not fit.
    pub fn submit_recv_from<B: IoBufMut>(
        &mut self,
        fd: impl Into<Target>,
        mut buf: B,
    ) -> std::result::Result<Ticket<B>, Refused<B>> {
        let t = fd.into();
        let msg = MsgState::boxed(buf.stable_mut_ptr(), buf.bytes_total(), None);
        self.submit_op(Some(t), buf, Some(msg), Kind::RecvFrom, false, |m| {
            let hdr = m.expect("msg given").hdr().cast_mut();
            Ok(with_fd!(t, |fd| opcode::RecvMsg::new(fd, hdr).build()))
        })
    }

    /// Waits for an operation just submitted: its completion, or the error and buffer of
    /// a refused submission.
    fn complete<B: 'static>(
        &mut self,
        submitted: std::result::Result<Ticket<B>, Refused<B>>,
    ) -> std::result::Result<Completion<B>, (io::Error, B)> {
        match submitted {
            Err(r) => Err((to_io(r.error), r.buf)),
            Ok(t) => match self.wait(t) {
                Ok(c) => Ok(c),
                // wait() fails only for a foreign or stale ticket, impossible here.
                Err(e) => panic!("waiting for a ticket this ring just issued: {e}"),
            },
        }
    }

    fn run<B: 'static>(
        &mut self,
        submitted: std::result::Result<Ticket<B>, Refused<B>>,
    ) -> (io::Result<usize>, B) {
        match self.complete(submitted) {
            Ok(c) => (c.result, c.buf),
            Err((e, buf)) => (Err(e), buf),
        }
    }

    /// Reads at `offset` into `buf` and waits: `(bytes read, buf)`.
    pub fn read_at<B: IoBufMut>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
        offset: u64,
    ) -> (io::Result<usize>, B) {
        let s = self.submit_read_at(fd, buf, offset);
        self.run(s)
    }

    /// Writes `buf` at `offset` and waits: `(bytes written, buf)`.
    pub fn write_at<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
        offset: u64,
    ) -> (io::Result<usize>, B) {
        let s = self.submit_write_at(fd, buf, offset);
        self.run(s)
    }

    /// Sends `buf` and waits: `(bytes sent, buf)`.
    pub fn send<B: IoBuf>(&mut self, fd: impl Into<Target>, buf: B) -> (io::Result<usize>, B) {
        let s = self.submit_send(fd, buf);
        self.run(s)
    }

    /// Sends `buf` with zero copy, waits for the notification too: `(bytes sent, buf)`.
    pub fn send_zc<B: IoBuf>(&mut self, fd: impl Into<Target>, buf: B) -> (io::Result<usize>, B) {
        let s = self.submit_send_zc(fd, buf);
        self.run(s)
    }

    /// Receives into `buf` and waits: `(bytes received, buf)`; 0 means the peer closed.
    pub fn recv<B: IoBufMut>(&mut self, fd: impl Into<Target>, buf: B) -> (io::Result<usize>, B) {
        let s = self.submit_recv(fd, buf);
        self.run(s)
    }

    /// Sends one datagram to `addr` and waits: `(bytes sent, buf)`.
    pub fn send_to<B: IoBuf>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
        addr: SocketAddr,
    ) -> (io::Result<usize>, B) {
        let s = self.submit_send_to(fd, buf, addr);
        self.run(s)
    }

    /// Receives one datagram and waits: `((bytes, sender), buf)`. A datagram longer than
    /// `buf` is an error of kind `InvalidData` (the excess is lost), never a silent cut.
    pub fn recv_from<B: IoBufMut>(
        &mut self,
        fd: impl Into<Target>,
        buf: B,
    ) -> (io::Result<(usize, SocketAddr)>, B) {
        let s = self.submit_recv_from(fd, buf);
        let c = match self.complete(s) {
            Ok(c) => c,
            Err((e, buf)) => return (Err(e), buf),
        };
        let r = match c.result {
            Err(e) => Err(e),
            Ok(_) if c.truncated => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "datagram longer than the buffer (truncated)",
            )),
            Ok(n) => c
                .peer
                .map(|p| (n, p))
                .ok_or_else(|| io::Error::other("datagram from a non-IP address")),
        };
        (r, c.buf)
    }
}
