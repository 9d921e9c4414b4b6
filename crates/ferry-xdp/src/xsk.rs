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
    fd: OwnedFd,
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
        let fill = Ring::map(fd.as_fd(), RingKind::Fill, geometry.ring)?;
        let rx = Ring::map(fd.as_fd(), RingKind::Rx, geometry.ring)?;
        let returned = Arc::new(Returned::default());
        let lender = area.lender(returned.clone());
        let n = area.len() as u64 / geometry.frame as u64;
        let spare: Vec<u64> = (0..n).rev().map(|i| i * geometry.frame as u64).collect();
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
