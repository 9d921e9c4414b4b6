//! Copying transports over byte-stream descriptors: pipes and Unix stream
//! sockets. The sender's `write(2)` copies the message into the kernel and the
//! receiver's `read(2)` copies it out into the receiver's own buffer.

use std::fs::File;
use std::hint::spin_loop;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use rustix::pipe::{fcntl_setpipe_size, pipe_with, PipeFlags};

use super::{Link, LinkEnd, RxEnd, Transport, TxEnd};
use crate::protocol::Wait;
use crate::sys;

/// Pipe capacity we ask for: the largest an unprivileged process gets by
/// default (`/proc/sys/fs/pipe-max-size`), so the copy baseline gets its best case.
const PIPE_CAPACITY: usize = 1 << 20;

/// A pipe, enlarged to [`PIPE_CAPACITY`] where the kernel allows it.
pub fn pipe_link() -> io::Result<Link> {
    let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
    let capacity = fcntl_setpipe_size(&w, PIPE_CAPACITY)
        .or_else(|_| rustix::pipe::fcntl_getpipe_size(&w))
        .ok();
    Ok(Link {
        tx: fd_link_end(w),
        rx: fd_link_end(r),
        capacity,
    })
}

/// A connected pair of Unix stream sockets with default buffer sizes.
pub fn unix_link() -> io::Result<Link> {
    let (a, b) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    Ok(Link {
        tx: fd_link_end(a),
        rx: fd_link_end(b),
        capacity: None,
    })
}

fn fd_link_end(fd: OwnedFd) -> LinkEnd {
    LinkEnd {
        spec: format!("{}", std::os::fd::AsRawFd::as_raw_fd(&fd)),
        fds: vec![fd],
    }
}

/// Opens an inherited descriptor named by `spec` and sets its wait mode.
pub fn open_fd(spec: &str, wait: Wait) -> io::Result<File> {
    let n: i32 = spec.parse().map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("bad fd spec {spec:?}"))
    })?;
    let fd = sys::inherited_fd(n)?;
    sys::set_nonblocking(&fd, wait == Wait::Spin)?;
    Ok(File::from(fd))
}

/// Writes all of `buf`, spinning on `EAGAIN` for a nonblocking descriptor.
pub fn write_all(file: &mut File, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match file.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills all of `buf`, spinning on `EAGAIN` for a nonblocking descriptor.
pub fn read_exact(file: &mut File, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Worker side of every byte-stream descriptor.
pub struct FdStream;

/// Sending end: the message is built in a private buffer, then written.
pub struct StreamTx {
    file: File,
    buf: Vec<u8>,
}

/// Receiving end: the message is read into a private buffer, then touched.
pub struct StreamRx {
    file: File,
    buf: Vec<u8>,
}

/// Grows `buf` to `len` bytes, writing every new page so that page faults
/// stay out of the timed loop (the buffer is reused for every message).
fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0x5a);
    }
}

impl Transport for FdStream {
    type Tx = StreamTx;
    type Rx = StreamRx;

    fn open_tx(spec: &str, wait: Wait) -> io::Result<StreamTx> {
        Ok(StreamTx {
            file: open_fd(spec, wait)?,
            buf: Vec::new(),
        })
    }

    fn open_rx(spec: &str, wait: Wait) -> io::Result<StreamRx> {
        Ok(StreamRx {
            file: open_fd(spec, wait)?,
            buf: Vec::new(),
        })
    }

    fn forward(
        rx: &mut StreamRx,
        tx: &mut StreamTx,
        len: usize,
        touch: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        rx.recv(len, touch)?;
        write_all(&mut tx.file, &rx.buf[..len])
    }
}

impl TxEnd for StreamTx {
    fn send_new(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]),
        stamp: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<()> {
        ensure_len(&mut self.buf, len);
        let msg = &mut self.buf[..len];
        fill(0, msg);
        stamp(msg);
        write_all(&mut self.file, msg)
    }
}

impl RxEnd for StreamRx {
    fn recv(&mut self, len: usize, touch: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        ensure_len(&mut self.buf, len);
        read_exact(&mut self.file, &mut self.buf[..len])?;
        touch(0, &self.buf[..len]);
        Ok(())
    }
}
