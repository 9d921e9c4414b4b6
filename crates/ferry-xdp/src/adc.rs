//! The application's side: ask the broker for a device channel, and fall back to a
//! normal UDP socket (`recvmmsg` into fbufs of the lot) when it refuses or is not there.
//! Both paths give the same [`Packet`]s, and [`AdcRx::path`] says which one is in use.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry::{IoData, IoDataMut, PathAllocator};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::proto::{Reply, Request, Status, REPLY_MAX};
use crate::xsk::{udp_payload, Geometry, TxFrame, XskRx, XskTx};

/// What to ask for.
#[derive(Clone, Debug)]
pub struct AdcConfig {
    /// The broker's socket; `None` goes straight to the fallback.
    pub broker: Option<PathBuf>,
    /// The interface.
    pub interface: String,
    /// The queue wanted, or `None` for any the policy grants.
    pub queue: Option<u32>,
    /// The UDP port to receive.
    pub port: u16,
    /// The address the fallback socket binds to.
    pub bind: Ipv4Addr,
    /// UMEM frames (the area is `frames * geometry.frame` bytes of the lot).
    pub frames: u32,
    /// Frame size and ring entries.
    pub geometry: Geometry,
    /// How the fallback path receives.
    pub fallback: Fallback,
    /// UMEM frames kept for sending (of `frames`); 0: no sender ([`AdcRx::take_tx`]).
    pub tx_frames: u32,
}

/// How the fallback (UDP socket) path receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fallback {
    /// `recvmmsg` batches of up to 64 datagrams into fbufs of the lot.
    #[default]
    Recvmmsg,
    /// io_uring: 64 receive requests kept in flight, each into an fbuf of the lot,
    /// completions reaped in batches (feature `uring`).
    #[cfg(feature = "uring")]
    Uring,
}

impl AdcConfig {
    /// A configuration for `port` on `interface` through the broker at `broker`.
    pub fn new(broker: Option<PathBuf>, interface: &str, port: u16) -> AdcConfig {
        AdcConfig {
            broker,
            interface: interface.into(),
            queue: None,
            port,
            bind: Ipv4Addr::UNSPECIFIED,
            frames: 1024,
            geometry: Geometry {
                frame: 4096,
                ring: 512,
            },
            fallback: Fallback::default(),
            tx_frames: 0,
        }
    }
}

/// Which path the receiver is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RxPath {
    /// An AF_XDP socket into the lot, granted by the broker.
    Xdp {
        /// The queue.
        queue: u32,
        /// Whether the driver runs it zero-copy (copy mode otherwise: veth).
        zerocopy: bool,
    },
    /// A UDP socket, because the broker refused or could not be reached.
    Udp {
        /// Why.
        reason: String,
        /// The broker's refusal, if it answered.
        refused: Option<Status>,
    },
}

/// One received datagram.
#[derive(Clone, Debug)]
pub struct Packet {
    /// The bytes, in the lot: the whole Ethernet frame on the AF_XDP path, the UDP
    /// payload on the fallback.
    pub data: IoData,
    /// The UDP payload's range in `data`.
    pub payload: Range<usize>,
}

impl Packet {
    /// The UDP payload, in place.
    pub fn payload(&self) -> IoData {
        self.data.slice(self.payload.clone())
    }
}

/// Counters of a receiver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdcStats {
    /// "xdp", "udp" (`recvmmsg`) or "uring" (io_uring receives).
    pub path: &'static str,
    /// Datagrams delivered.
    pub packets: u64,
    /// Bytes delivered (frames on the AF_XDP path, payloads on the fallback).
    pub bytes: u64,
    /// Frames the kernel dropped for want of fill frames (AF_XDP path).
    pub kernel_drops: u64,
    /// Frames received that were not UDP for our port (queue steering), dropped here.
    pub other: u64,
    /// Frames lent out and not yet released everywhere (AF_XDP path).
    pub lent: u64,
}

enum Imp {
    Xdp {
        rx: Box<XskRx>,
        /// The broker connection: the grant lasts while it is open.
        _conn: Arc<OwnedFd>,
        frames: Vec<IoData>,
    },
    Udp {
        sock: UdpSocket,
        path: PathAllocator,
        lens: Vec<usize>,
    },
    #[cfg(feature = "uring")]
    Uring {
        ring: Box<crate::sys::UringRecv>,
        path: PathAllocator,
        bufs: Vec<IoData>,
    },
}

/// A receiver on one UDP port: AF_XDP into the lot when the broker grants it, UDP
/// otherwise.
pub struct AdcRx {
    imp: Imp,
    tx: Option<AdcTx>,
    path: RxPath,
    port: u16,
    packets: u64,
    bytes: u64,
    other: u64,
}

impl std::fmt::Debug for AdcRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdcRx").field("path", &self.path).finish()
    }
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Sends `req` with `memfd` to the broker at `socket`; the reply and, when granted, the
/// socket and the connection that keeps the grant.
pub fn ask(
    socket: &std::path::Path,
    req: &Request,
    memfd: std::os::fd::BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<(Reply, Option<(OwnedFd, OwnedFd)>)> {
    let conn = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(errno)?;
    rustix::net::connect(
        &conn,
        &rustix::net::SocketAddrUnix::new(socket).map_err(errno)?,
    )
    .map_err(errno)?;
    let bytes = req.encode();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let one = [memfd];
    control.push(SendAncillaryMessage::ScmRights(&one));
    rustix::net::sendmsg(
        &conn,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(errno)?;
    crate::wait_readable(conn.as_fd(), Some(timeout))?;
    let mut buf = [0u8; REPLY_MAX];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let m = rustix::net::recvmsg(
        &conn,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(errno)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in control.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = c {
            fds.extend(r);
        }
    }
    let reply = Reply::decode(&buf[..m.bytes])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if reply.status == Status::Ok && fds.len() == 1 {
        let xsk = fds.remove(0);
        return Ok((reply, Some((xsk, conn))));
    }
    Ok((reply, None))
}

impl AdcRx {
    /// Opens a receiver for `cfg.port`: asks the broker for a channel whose UMEM is an
    /// area of `path`'s lot, and falls back to a UDP socket receiving into fbufs of
    /// `path` if it refuses, is unreachable, or the area cannot be had.
    pub fn open(path: &PathAllocator, cfg: &AdcConfig) -> io::Result<AdcRx> {
        let reason = match &cfg.broker {
            None => ("no broker configured".to_string(), None),
            Some(b) => match Self::try_xdp(path, cfg, b) {
                Ok(Ok(rx)) => return Ok(rx),
                Ok(Err(reply)) => (
                    format!("the broker refused: {}", reply.message),
                    Some(reply.status),
                ),
                Err(e) => (format!("no channel from the broker: {e}"), None),
            },
        };
        Self::udp(path, cfg, reason.0, reason.1)
    }

    fn try_xdp(
        path: &PathAllocator,
        cfg: &AdcConfig,
        broker: &std::path::Path,
    ) -> io::Result<Result<AdcRx, Reply>> {
        let len = cfg.frames as usize * cfg.geometry.frame as usize;
        let area = path
            .area(len)
            .map_err(|e| io::Error::other(format!("no lot area for the UMEM: {e}")))?;
        let req = Request {
            queue: cfg.queue,
            port: cfg.port,
            frame: cfg.geometry.frame,
            ring: cfg.geometry.ring,
            offset: area.lot_offset(),
            len: len as u64,
            interface: cfg.interface.clone(),
        };
        let (reply, got) = ask(broker, &req, area.lot_fd(), Duration::from_secs(10))?;
        let Some((xsk, conn)) = got else {
            return Ok(Err(reply));
        };
        let (rx, tx) = if cfg.tx_frames > 0 {
            let (rx, tx) = XskRx::with_tx(xsk, area, cfg.geometry, cfg.tx_frames)?;
            (rx, Some(tx))
        } else {
            (XskRx::new(xsk, area, cfg.geometry)?, None)
        };
        // The fill ring is stocked: now the broker may steer the flow here.
        rustix::net::send(&conn, &[crate::proto::ARMED], SendFlags::NOSIGNAL).map_err(errno)?;
        if !crate::wait_readable(conn.as_fd(), Some(Duration::from_secs(10)))? {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the broker did not steer the flow",
            ));
        }
        let mut b = [0u8; 1];
        let (n, _) = rustix::net::recv(&conn, &mut b, RecvFlags::empty()).map_err(errno)?;
        if n != 1 || b[0] != crate::proto::ARMED {
            return Err(io::Error::other("the broker could not steer the flow"));
        }
        let conn = Arc::new(conn);
        let path = RxPath::Xdp {
            queue: reply.queue,
            zerocopy: reply.zerocopy,
        };
        let tx = match tx {
            Some(tx) => {
                let (mac, ip) = crate::xsk::interface_addrs(&cfg.interface)?;
                let ip = if cfg.bind.is_unspecified() {
                    ip
                } else {
                    cfg.bind
                };
                Some(AdcTx {
                    imp: TxImp::Xdp {
                        tx: Box::new(tx),
                        src_mac: mac,
                        src: SocketAddrV4::new(ip, cfg.port),
                        neighbours: Vec::new(),
                        _conn: conn.clone(),
                    },
                    path: path.clone(),
                    sent: 0,
                    bytes: 0,
                })
            }
            None => None,
        };
        Ok(Ok(AdcRx {
            imp: Imp::Xdp {
                rx: Box::new(rx),
                _conn: conn,
                frames: Vec::new(),
            },
            tx,
            path,
            port: cfg.port,
            packets: 0,
            bytes: 0,
            other: 0,
        }))
    }

    /// A receiver on the normal path only.
    pub fn udp(
        path: &PathAllocator,
        cfg: &AdcConfig,
        reason: String,
        refused: Option<Status>,
    ) -> io::Result<AdcRx> {
        let sock = UdpSocket::bind(SocketAddrV4::new(cfg.bind, cfg.port))?;
        sock.set_nonblocking(true)?;
        let path_now = RxPath::Udp {
            reason: reason.clone(),
            refused,
        };
        let tx = match cfg.tx_frames {
            0 => None,
            _ => Some(AdcTx {
                imp: TxImp::Udp {
                    sock: sock.try_clone()?,
                    path: path.clone(),
                },
                path: path_now,
                sent: 0,
                bytes: 0,
            }),
        };
        let imp = match cfg.fallback {
            Fallback::Recvmmsg => Imp::Udp {
                sock,
                path: path.clone(),
                lens: Vec::new(),
            },
            #[cfg(feature = "uring")]
            Fallback::Uring => Imp::Uring {
                ring: Box::new(crate::sys::UringRecv::new(sock, 64, 2048)?),
                path: path.clone(),
                bufs: Vec::new(),
            },
        };
        Ok(AdcRx {
            imp,
            tx,
            path: RxPath::Udp { reason, refused },
            port: cfg.port,
            packets: 0,
            bytes: 0,
            other: 0,
        })
    }

    /// The path in use.
    pub fn path(&self) -> &RxPath {
        &self.path
    }

    /// The sender on the same path (AF_XDP through the same socket, or the UDP socket),
    /// once; `None` when `AdcConfig::tx_frames` was 0 or it was taken already.
    pub fn take_tx(&mut self) -> Option<AdcTx> {
        self.tx.take()
    }

    /// Receives up to `max` (at most 64) datagrams into `out`, waiting up to `timeout`
    /// for the first. Returns how many were added.
    pub fn recv(
        &mut self,
        out: &mut Vec<Packet>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let max = max.clamp(1, 64);
        let before = out.len();
        match &mut self.imp {
            Imp::Xdp { rx, frames, .. } => {
                frames.clear();
                rx.recv(frames, max, timeout)?;
                for d in frames.drain(..) {
                    // The headers are read in place; a frame is one fragment.
                    let s = d.fragments()[0].as_slice();
                    let ours =
                        udp_payload(s).filter(|_| u16::from_be_bytes([s[36], s[37]]) == self.port);
                    match ours {
                        Some(payload) => {
                            self.bytes += d.len() as u64;
                            out.push(Packet { data: d, payload });
                        }
                        None => self.other += 1,
                    }
                }
            }
            Imp::Udp { sock, path, lens } => {
                if timeout != Some(Duration::ZERO) {
                    crate::wait_readable(sock.as_fd(), timeout)?;
                }
                let mut bufs = Vec::with_capacity(max);
                for _ in 0..max {
                    bufs.push(
                        path.alloc(2048)
                            .map_err(|e| io::Error::other(format!("fbuf: {e}")))?,
                    );
                }
                let n = {
                    let mut views: Vec<&mut [u8]> = bufs
                        .iter_mut()
                        .map(|b| b.fragments_mut().next().expect("one fragment"))
                        .collect();
                    match crate::sys::recvmmsg(sock.as_fd(), &mut views, lens) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                        Err(e) => return Err(e),
                    }
                };
                for (mut b, &len) in bufs.into_iter().zip(lens.iter()).take(n) {
                    b.truncate(len);
                    self.bytes += len as u64;
                    out.push(Packet {
                        data: b.freeze(),
                        payload: 0..len,
                    });
                }
            }
            #[cfg(feature = "uring")]
            Imp::Uring { ring, path, bufs } => {
                bufs.clear();
                ring.recv(path, bufs, max, timeout)?;
                for d in bufs.drain(..) {
                    let len = d.len();
                    self.bytes += len as u64;
                    out.push(Packet {
                        data: d,
                        payload: 0..len,
                    });
                }
            }
        }
        let n = out.len() - before;
        self.packets += n as u64;
        Ok(n)
    }

    /// Counters.
    pub fn stats(&self) -> AdcStats {
        let (path, kernel_drops, lent) = match &self.imp {
            Imp::Xdp { rx, .. } => {
                let s = rx.stats();
                ("xdp", s.kernel_drops, s.lent)
            }
            Imp::Udp { .. } => ("udp", 0, 0),
            #[cfg(feature = "uring")]
            Imp::Uring { .. } => ("uring", 0, 0),
        };
        AdcStats {
            path,
            packets: self.packets,
            bytes: self.bytes,
            kernel_drops,
            other: self.other,
            lent,
        }
    }

    /// The AF_XDP receiver, on that path.
    pub fn xsk(&self) -> Option<&XskRx> {
        match &self.imp {
            Imp::Xdp { rx, .. } => Some(&**rx),
            _ => None,
        }
    }
}

/// A buffer to send: on the AF_XDP path a frame of the UMEM (the lot area) with room for
/// the headers before the payload, on the fallback an fbuf of the lot.
pub struct TxBuf {
    imp: TxBufImp,
    len: usize,
}

enum TxBufImp {
    Frame(TxFrame),
    Fbuf(IoDataMut),
}

impl std::fmt::Debug for TxBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBuf").field("len", &self.len).finish()
    }
}

impl TxBuf {
    /// The payload's bytes, to fill in place.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match &mut self.imp {
            TxBufImp::Frame(f) => &mut f.as_mut_slice()[42..42 + self.len],
            TxBufImp::Fbuf(b) => b.fragments_mut().next().unwrap_or_default(),
        }
    }

    /// The payload's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

enum TxImp {
    Xdp {
        tx: Box<XskTx>,
        src_mac: [u8; 6],
        src: SocketAddrV4,
        /// Neighbours' MAC addresses looked up so far.
        neighbours: Vec<(Ipv4Addr, [u8; 6])>,
        /// The grant lasts while the receiver or the sender holds the connection.
        _conn: Arc<OwnedFd>,
    },
    Udp {
        sock: UdpSocket,
        path: PathAllocator,
    },
}

/// Counters of a sender.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdcTxStats {
    /// "xdp" or "udp".
    pub path: &'static str,
    /// Datagrams handed to the kernel.
    pub sent: u64,
    /// Payload bytes handed to the kernel.
    pub bytes: u64,
    /// Frames sent and given back to the free list (AF_XDP path).
    pub completed: u64,
    /// Frames free to send with (AF_XDP path).
    pub free: u64,
}

/// Sends UDP datagrams from the lot: on the AF_XDP path frames of the UMEM queued on the
/// socket's TX ring (each back on the free list once the kernel reports it sent), on the
/// fallback fbufs of the lot sent on the UDP socket. Get one with [`AdcRx::take_tx`].
pub struct AdcTx {
    imp: TxImp,
    path: RxPath,
    sent: u64,
    bytes: u64,
}

impl std::fmt::Debug for AdcTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdcTx").field("path", &self.path).finish()
    }
}

impl AdcTx {
    /// The path in use (the receiver's).
    pub fn path(&self) -> &RxPath {
        &self.path
    }

    /// A buffer for a payload of `len` bytes, or `None` while every frame is on its way
    /// out (AF_XDP path; call again after the kernel completes some).
    pub fn alloc(&mut self, len: usize) -> io::Result<Option<TxBuf>> {
        match &mut self.imp {
            TxImp::Xdp { tx, .. } => {
                let Some(f) = tx.alloc() else {
                    return Ok(None);
                };
                let mut f = f;
                if 42 + len > f.as_mut_slice().len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("a payload of {len} bytes does not fit a frame"),
                    ));
                }
                Ok(Some(TxBuf {
                    imp: TxBufImp::Frame(f),
                    len,
                }))
            }
            TxImp::Udp { path, .. } => {
                let b = path
                    .alloc(len.max(1))
                    .map_err(|e| io::Error::other(format!("fbuf: {e}")))?;
                let mut b = b;
                b.truncate(len);
                Ok(Some(TxBuf {
                    imp: TxBufImp::Fbuf(b),
                    len,
                }))
            }
        }
    }

    /// Sends `buf`'s payload to `to`. On the AF_XDP path the destination must be a
    /// neighbour on the interface's link with a known MAC address.
    pub fn send(&mut self, buf: TxBuf, to: SocketAddrV4) -> io::Result<()> {
        let len = buf.len;
        match (&mut self.imp, buf.imp) {
            (
                TxImp::Xdp {
                    tx,
                    src_mac,
                    src,
                    neighbours,
                    ..
                },
                TxBufImp::Frame(mut f),
            ) => {
                let ip = *to.ip();
                let mac = match neighbours.iter().find(|n| n.0 == ip) {
                    Some(n) => n.1,
                    None => {
                        let m = crate::xsk::neighbour(ip).ok_or_else(|| {
                            io::Error::new(
                                io::ErrorKind::NotFound,
                                format!("no neighbour entry for {ip}"),
                            )
                        })?;
                        neighbours.push((ip, m));
                        m
                    }
                };
                let n =
                    crate::xsk::write_udp_headers(f.as_mut_slice(), *src_mac, mac, *src, to, len);
                if tx.send([(f, n)])? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "the TX ring is full",
                    ));
                }
            }
            (TxImp::Udp { sock, .. }, TxBufImp::Fbuf(b)) => {
                let d = b.freeze();
                let frag = d.fragments().first().map(|f| f.as_slice()).unwrap_or(&[]);
                sock.send_to(frag, to)?;
            }
            _ => return Err(io::Error::other("a buffer from another sender")),
        }
        self.sent += 1;
        self.bytes += len as u64;
        Ok(())
    }

    /// Takes back the frames the kernel has sent (AF_XDP path); returns how many.
    pub fn complete(&mut self) -> usize {
        match &mut self.imp {
            TxImp::Xdp { tx, .. } => {
                let _ = tx.kick();
                tx.complete()
            }
            TxImp::Udp { .. } => 0,
        }
    }

    /// Counters.
    pub fn stats(&self) -> AdcTxStats {
        let (path, completed, free) = match &self.imp {
            TxImp::Xdp { tx, .. } => {
                let s = tx.stats();
                ("xdp", s.completed, s.free)
            }
            TxImp::Udp { .. } => ("udp", self.sent, 0),
        };
        AdcTxStats {
            path,
            sent: self.sent,
            bytes: self.bytes,
            completed,
            free,
        }
    }
}
