//! The application's side of an AF_XDP socket whose UMEM is a [`LotArea`]: the fill and
//! RX rings, and each frame's life, fill -> RX -> application (and whoever it forwards
//! the frame to) -> released -> fill.
//!
//! A received frame is lent as read-only [`IoData`] in place in the lot; it returns to
//! the fill ring only when its last reference in any process of the group is gone, which
//! ferry's release machinery reports (a receiver that dies gives its references back
//! too). A consumer that holds frames starves the fill ring: the kernel then drops new
//! frames for this socket (counted in [`XskStats::kernel_drops`]), it does not fall back to
//! the stack.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry::{AreaLender, AreaRelease, IoData, LotArea};

pub use crate::sys::TxFrame;
use crate::sys::{self, Ring, RingKind};

/// Frames whose last reference went, waiting to go back on the fill ring.
#[derive(Default)]
struct Returned(Mutex<Vec<u64>>);

impl AreaRelease for Returned {
    fn released(&self, tag: u64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(tag);
    }
}

/// The geometry both sides of the broker agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per frame (2048 or 4096).
    pub frame: u32,
    /// Entries of each ring (a power of two).
    pub ring: u32,
}

/// Counters of a socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames received.
    pub frames: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Frames currently lent out (received and not yet released everywhere).
    pub lent: u64,
    /// Frames the kernel dropped for this socket (no fill frame or a full RX ring).
    pub kernel_drops: u64,
}

/// A bound AF_XDP socket receiving into a lot area.
pub struct XskRx {
    fd: Arc<OwnedFd>,
    fill: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    area: LotArea,
    lender: AreaLender,
    returned: Arc<Returned>,
    /// Frames neither on the fill ring nor lent: ours to give to the kernel.
    spare: Vec<u64>,
    geometry: Geometry,
    frames: u64,
    bytes: u64,
    lent: u64,
    scratch: Vec<(u64, u32)>,
}

impl std::fmt::Debug for XskRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskRx")
            .field("area", &self.area)
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl XskRx {
    /// Takes a socket whose UMEM is `area` (registered with `geometry`, bound, by the
    /// broker or by [`crate::Broker`]-less setup), maps its rings and gives the kernel
    /// every frame the fill ring holds.
    pub fn new(fd: OwnedFd, area: LotArea, geometry: Geometry) -> io::Result<XskRx> {
        let n = area.len() as u64 / geometry.frame as u64;
        Self::with_frames(Arc::new(fd), area, geometry, 0..n)
    }

    /// As [`new`](Self::new), with the area's last `tx_frames` frames kept for sending
    /// through the same socket: the receiver and an [`XskTx`] over those frames.
    pub fn with_tx(
        fd: OwnedFd,
        area: LotArea,
        geometry: Geometry,
        tx_frames: u32,
    ) -> io::Result<(XskRx, XskTx)> {
        let n = area.len() as u64 / geometry.frame as u64;
        let tx_frames = (tx_frames as u64).min(n.saturating_sub(1));
        let fd = Arc::new(fd);
        let rx = Self::with_frames(fd.clone(), area, geometry, 0..n - tx_frames)?;
        let tx = XskTx::with_frames(fd, rx.lender.clone(), &rx.area, geometry, n - tx_frames..n)?;
        Ok((rx, tx))
    }

    fn with_frames(
        fd: Arc<OwnedFd>,
        area: LotArea,
        geometry: Geometry,
        frames: std::ops::Range<u64>,
    ) -> io::Result<XskRx> {
        let fill = Ring::map(fd.as_fd(), RingKind::Fill, geometry.ring)?;
        let rx = Ring::map(fd.as_fd(), RingKind::Rx, geometry.ring)?;
        let returned = Arc::new(Returned::default());
        let lender = area.lender(returned.clone());
        let spare: Vec<u64> = frames.rev().map(|i| i * geometry.frame as u64).collect();
        let mut x = XskRx {
            fd,
            fill,
            rx,
            area,
            lender,
            returned,
            spare,
            geometry,
            frames: 0,
            bytes: 0,
            lent: 0,
            scratch: Vec::new(),
        };
        x.refill();
        Ok(x)
    }

    /// Puts released and spare frames back on the fill ring.
    fn refill(&mut self) {
        {
            let mut r = self.returned.0.lock().unwrap_or_else(|p| p.into_inner());
            self.lent -= r.len() as u64;
            self.spare.append(&mut r);
        }
        let n = (self.fill.free() as usize).min(self.spare.len());
        if n > 0 {
            let at = self.spare.len() - n;
            self.fill.produce(self.spare.drain(at..));
        }
    }

    /// Receives up to `max` frames into `out`, waiting up to `timeout` for the first.
    /// Each is the whole Ethernet frame, read in place in the lot.
    pub fn recv(
        &mut self,
        out: &mut Vec<IoData>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.refill();
        if !self.rx.ready() {
            if timeout == Some(Duration::ZERO) {
                return Ok(0);
            }
            crate::wait_readable(self.fd.as_fd(), timeout)?;
        }
        let mut descs = std::mem::take(&mut self.scratch);
        descs.clear();
        let n = self.rx.consume(max, &mut descs);
        let frame = self.geometry.frame as u64;
        for &(addr, len) in &descs {
            let tag = addr - addr % frame;
            // An address outside the area (never expected from the kernel) keeps the
            // frame out of circulation rather than trusting it.
            if let Ok(d) = sys::lend_frame(&self.lender, addr as usize, len as usize, tag) {
                self.frames += 1;
                self.bytes += len as u64;
                self.lent += 1;
                out.push(d);
            }
        }
        self.scratch = descs;
        Ok(n)
    }

    /// The area the socket receives into.
    pub fn area(&self) -> &LotArea {
        &self.area
    }

    /// Counters.
    pub fn stats(&self) -> XskStats {
        let (drops, _) = sys::xsk_stats(self.fd.as_fd()).unwrap_or((0, 0));
        let pending = self.returned.0.lock().map(|r| r.len() as u64).unwrap_or(0);
        XskStats {
            frames: self.frames,
            bytes: self.bytes,
            lent: self.lent - pending,
            kernel_drops: drops,
        }
    }

    /// The socket.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Counters of a sending socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XskTxStats {
    /// Frames queued on the TX ring.
    pub queued: u64,
    /// Frames the kernel has sent and given back (completion ring).
    pub completed: u64,
    /// Frames free to send with now.
    pub free: u64,
}

/// The sending side of an AF_XDP socket: frames of its UMEM (the lot area) filled in
/// place and queued on the TX ring; the kernel gives each back on the completion ring
/// once sent, and it returns to the free list.
pub struct XskTx {
    fd: Arc<OwnedFd>,
    tx: Ring<libc::xdp_desc>,
    comp: Ring<u64>,
    lender: AreaLender,
    /// The area's first byte (an address in the lot mapping that `lender` keeps).
    base: usize,
    frame: u32,
    free: Vec<u64>,
    /// Frames handed out and dropped unsent.
    back: Arc<Mutex<Vec<u64>>>,
    queued: u64,
    completed: u64,
    scratch: Vec<u64>,
}

impl std::fmt::Debug for XskTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskTx").field("frame", &self.frame).finish()
    }
}

struct NoSink;

impl AreaRelease for NoSink {
    fn released(&self, _tag: u64) {}
}

impl XskTx {
    /// A sender over every frame of `area`, the UMEM of socket `fd` (registered with
    /// `geometry` and bound): for a socket that only sends.
    pub fn new(fd: OwnedFd, area: LotArea, geometry: Geometry) -> io::Result<XskTx> {
        let n = area.len() as u64 / geometry.frame as u64;
        let lender = area.lender(Arc::new(NoSink));
        Self::with_frames(Arc::new(fd), lender, &area, geometry, 0..n)
    }

    fn with_frames(
        fd: Arc<OwnedFd>,
        lender: AreaLender,
        area: &LotArea,
        geometry: Geometry,
        frames: std::ops::Range<u64>,
    ) -> io::Result<XskTx> {
        let tx = Ring::map(fd.as_fd(), RingKind::Tx, geometry.ring)?;
        let comp = Ring::map(fd.as_fd(), RingKind::Completion, geometry.ring)?;
        Ok(XskTx {
            fd,
            tx,
            comp,
            lender,
            base: area.as_ptr() as usize,
            frame: geometry.frame,
            free: frames.rev().map(|i| i * geometry.frame as u64).collect(),
            back: Arc::default(),
            queued: 0,
            completed: 0,
            scratch: Vec::new(),
        })
    }

    /// Takes back the frames the kernel has sent; returns how many.
    pub fn complete(&mut self) -> usize {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        let n = self.comp.consume_addrs(usize::MAX, &mut s);
        let frame = self.frame as u64;
        self.free.extend(s.iter().map(|a| a - a % frame));
        self.completed += n as u64;
        self.scratch = s;
        self.free
            .append(&mut self.back.lock().unwrap_or_else(|p| p.into_inner()));
        n
    }

    /// A free frame to fill (the whole frame, `geometry.frame` bytes), or `None` while
    /// every frame is on its way out.
    pub fn alloc(&mut self) -> Option<TxFrame> {
        if self.free.is_empty() {
            self.complete();
        }
        let addr = self.free.pop()?;
        Some(TxFrame::new(
            &self.lender,
            self.base,
            addr,
            self.frame as usize,
            self.back.clone(),
        ))
    }

    /// Queues frames (each with the length of its bytes to send, from its start) on the
    /// TX ring and asks the kernel to send. Returns how many were queued: a frame that
    /// does not fit the ring now is given back to the free list.
    pub fn send(
        &mut self,
        frames: impl IntoIterator<Item = (TxFrame, usize)>,
    ) -> io::Result<usize> {
        let mut room = self.tx.free() as usize;
        let mut descs = Vec::new();
        for (f, len) in frames {
            if room == 0 {
                drop(f);
                continue;
            }
            let len = len.min(self.frame as usize) as u32;
            descs.push(libc::xdp_desc {
                addr: f.into_addr(),
                len,
                options: 0,
            });
            room -= 1;
        }
        let n = descs.len();
        if n > 0 {
            self.tx.produce(descs);
            self.queued += n as u64;
        }
        self.kick()?;
        Ok(n)
    }

    /// Asks the kernel to send what the TX ring holds (copy mode needs it for every
    /// batch). A busy or full device is not an error: the frames stay queued.
    pub fn kick(&self) -> io::Result<()> {
        match rustix::net::send(&*self.fd, &[], rustix::net::SendFlags::DONTWAIT) {
            Ok(_) => Ok(()),
            Err(e)
                if [
                    rustix::io::Errno::AGAIN,
                    rustix::io::Errno::BUSY,
                    rustix::io::Errno::NOBUFS,
                    rustix::io::Errno::INTR,
                ]
                .contains(&e) =>
            {
                Ok(())
            }
            Err(e) => Err(io::Error::from_raw_os_error(e.raw_os_error())),
        }
    }

    /// Counters.
    pub fn stats(&self) -> XskTxStats {
        XskTxStats {
            queued: self.queued,
            completed: self.completed,
            free: self.free.len() as u64,
        }
    }

    /// The socket.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Makes a socket bound to `queue` of `ifindex` whose UMEM is `len` bytes at `offset` of
/// `memfd`, in copy mode unless `zerocopy` (which falls back to copy mode where the
/// driver has none). Returns the socket and whether it runs zero-copy. Needs
/// `CAP_NET_RAW` (the broker's side).
pub fn make_socket(
    ifindex: u32,
    queue: u32,
    memfd: std::os::fd::BorrowedFd<'_>,
    offset: u64,
    len: u64,
    geometry: Geometry,
    zerocopy: bool,
) -> io::Result<(OwnedFd, bool)> {
    let make = |flags: u16| -> io::Result<OwnedFd> {
        let fd = sys::xsk_socket()?;
        sys::umem_register(fd.as_fd(), memfd, offset, len, geometry.frame)?;
        sys::xsk_rings(fd.as_fd(), geometry.ring)?;
        sys::xsk_bind(fd.as_fd(), ifindex, queue, flags)?;
        Ok(fd)
    };
    // A failed zero-copy bind may leave the socket's rings given away: start afresh.
    if zerocopy {
        if let Ok(fd) = make(libc::XDP_ZEROCOPY) {
            return Ok((fd, true));
        }
    }
    Ok((make(libc::XDP_COPY)?, false))
}

/// The UDP payload's range in an Ethernet frame (IPv4 without options), if it is one.
pub fn udp_payload(frame: &[u8]) -> Option<std::ops::Range<usize>> {
    if frame.len() < 42 || frame[12..14] != [0x08, 0x00] || frame[14] != 0x45 || frame[23] != 17 {
        return None;
    }
    let ulen = u16::from_be_bytes([frame[38], frame[39]]) as usize;
    let end = (34 + ulen).min(frame.len());
    (ulen >= 8).then_some(42..end.max(42))
}

/// Writes Ethernet, IPv4 (no options, DF, TTL 64) and UDP headers for a datagram of
/// `payload` bytes from `src` to `dst` into `frame[..42]`; the UDP checksum is left zero
/// (none, which IPv4 allows). Returns the frame's length.
pub fn write_udp_headers(
    frame: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: usize,
) -> usize {
    let f = &mut frame[..42];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (20 + 8 + payload) as u16;
    let ip = &mut f[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let mut sum = 0u32;
    for w in ip.chunks(2) {
        sum += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    42 + payload
}

/// The MAC address the calling thread's network namespace has for neighbour `ip`
/// (`/proc/thread-self/net/arp`), if it has one.
pub fn neighbour(ip: std::net::Ipv4Addr) -> Option<[u8; 6]> {
    let t = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    let want = ip.to_string();
    for l in t.lines().skip(1) {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 4 && w[0] == want {
            let mut m = [0u8; 6];
            let parts: Vec<&str> = w[3].split(':').collect();
            if parts.len() != 6 {
                return None;
            }
            for (d, p) in m.iter_mut().zip(parts) {
                *d = u8::from_str_radix(p, 16).ok()?;
            }
            return (m != [0; 6]).then_some(m);
        }
    }
    None
}

/// The MAC and IPv4 addresses of interface `name` in the calling thread's namespace.
pub fn interface_addrs(name: &str) -> io::Result<([u8; 6], std::net::Ipv4Addr)> {
    sys::if_addrs(name)
}

/// The index of interface `name` in the calling thread's namespace.
pub fn interface_index(name: &str) -> io::Result<u32> {
    sys::ifindex(name)
}
