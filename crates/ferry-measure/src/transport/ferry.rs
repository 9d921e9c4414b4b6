//! ferry's own transport: fbufs allocated on a path, handed over a ferry
//! channel. The receiver reads the sender's pages in place (no copy); a stage
//! forwards the very same fbuf downstream.
//!
//! Rendezvous: every link of one chain shares one group (so a stage forwards
//! without copying). A link is a plain pipe used once: the receiving worker
//! joins the group, writes its [`DomainId`] into the pipe and accepts; the
//! sending worker reads that id and connects. The link end spec is
//! `GROUP,FD,FLAGS` with FLAGS a subset of `s` (secured fbufs, on the sender's
//! path) and `u` (uncached: the receiver maps every fragment afresh).

use std::fs::File;
use std::hint::spin_loop;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry::{Domain, DomainId, Group, IoData, PathAllocator, PathConfig, Receiver, Sender};
use rustix::pipe::{pipe_with, PipeFlags};

use super::{Link, LinkEnd, RxEnd, Transport, TxEnd};
use crate::protocol::Wait;
use crate::sys;

/// How long connect and accept wait for the peer worker.
const RENDEZVOUS: Duration = Duration::from_secs(30);
/// Fbufs one message size's path may have out at once: enough for 8 MiB in flight, at
/// least 4 and at most 256. A source that gets ahead spins on `QuotaExceeded` until the
/// sink releases one. This bounds the working set, so that the warm-up recycles every
/// fbuf the timed messages will use (the thesis's cached fbufs) instead of timing
/// first-touch page faults on fresh ones, while small messages still get a deep pipeline.
pub fn depth(size: usize) -> usize {
    ((8 << 20) / size.max(1)).clamp(4, 256)
}

/// Which fbuf flavour a link uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Secured fbufs: write-protected in the originator from send until release.
    pub secure: bool,
    /// Uncached: every received fragment is mapped afresh and unmapped on release.
    pub uncached: bool,
}

impl Variant {
    pub const CACHED_VOLATILE: Variant = Variant {
        secure: false,
        uncached: false,
    };
    pub const CACHED_SECURE: Variant = Variant {
        secure: true,
        uncached: false,
    };
    pub const UNCACHED_VOLATILE: Variant = Variant {
        secure: false,
        uncached: true,
    };
    pub const UNCACHED_SECURE: Variant = Variant {
        secure: true,
        uncached: true,
    };

    pub fn name(self) -> &'static str {
        match (self.uncached, self.secure) {
            (false, false) => "ferry",
            (false, true) => "ferry-secured",
            (true, false) => "ferry-uncached",
            (true, true) => "ferry-uncached-secured",
        }
    }

    pub fn label(self) -> &'static str {
        match (self.uncached, self.secure) {
            (false, false) => "ferry, cached + volatile",
            (false, true) => "ferry, cached + secured",
            (true, false) => "ferry, uncached + volatile",
            (true, true) => "ferry, uncached + secured",
        }
    }

    fn flags(self) -> String {
        let mut f = String::new();
        if self.secure {
            f.push('s');
        }
        if self.uncached {
            f.push('u');
        }
        f
    }
}

/// A group name unique to this harness process and chain.
fn fresh_group() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The control-block file of group `name`, for clean-up after a run.
pub fn group_file(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ferry.{name}"))
}

/// `n` links sharing one fresh group, and that group's file.
pub fn links(n: usize, v: Variant) -> io::Result<(Vec<Link>, PathBuf)> {
    let group = fresh_group();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        // The receiver writes its id into `w`; the sender reads it from `r`.
        let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
        let spec = |fd: &std::os::fd::OwnedFd| {
            format!(
                "{group},{},{}",
                std::os::fd::AsRawFd::as_raw_fd(fd),
                v.flags()
            )
        };
        out.push(Link {
            tx: LinkEnd {
                spec: spec(&r),
                fds: vec![r],
            },
            rx: LinkEnd {
                spec: spec(&w),
                fds: vec![w],
            },
            capacity: None,
        });
    }
    Ok((out, group_file(&group)))
}

struct Spec {
    group: String,
    fd: File,
    secure: bool,
    uncached: bool,
}

fn parse(spec: &str) -> io::Result<Spec> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("bad spec {spec:?}"));
    let mut it = spec.split(',');
    let (Some(group), Some(fd), flags) = (it.next(), it.next(), it.next().unwrap_or("")) else {
        return Err(bad());
    };
    let fd: i32 = fd.parse().map_err(|_| bad())?;
    let fd = sys::inherited_fd(fd)?;
    sys::set_nonblocking(&fd, false)?;
    Ok(Spec {
        group: group.to_string(),
        fd: File::from(fd),
        secure: flags.contains('s'),
        uncached: flags.contains('u'),
    })
}

/// This process's domain: one per worker, shared by its receiving and sending
/// ends so that a stage forwards fbufs it maps rather than copies.
static DOMAIN: Mutex<Option<Domain>> = Mutex::new(None);

fn domain(group: &str) -> io::Result<Domain> {
    let mut d = DOMAIN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = d.as_ref() {
        return Ok(d.clone());
    }
    let joined = Group::open(group).and_then(|g| g.join()).map_err(err)?;
    *d = Some(joined.clone());
    Ok(joined)
}

/// Drops this process's reference to its domain; the domain leaves the group
/// once every link end is dropped too (and the group file goes with the last).
pub fn leave() {
    DOMAIN.lock().unwrap_or_else(|p| p.into_inner()).take();
}

pub fn err(e: ferry::Error) -> io::Error {
    io::Error::other(e.to_string())
}

/// The sending end of link `spec`: joins its group, reads the receiver's id from the
/// link's pipe and connects. Also says whether the link asks for secured fbufs.
pub fn connect(spec: &str) -> io::Result<(Domain, Sender, bool)> {
    let mut s = parse(spec)?;
    let domain = domain(&s.group)?;
    let mut id = String::new();
    s.fd.read_to_string(&mut id)?;
    let peer: DomainId = id
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e} ({id:?})")))?;
    let tx = domain.connect(peer, RENDEZVOUS).map_err(err)?;
    Ok((domain, tx, s.secure))
}

/// The receiving end of link `spec`: joins its group, writes its id into the link's
/// pipe and accepts.
pub fn accept(spec: &str) -> io::Result<(Domain, Receiver)> {
    let mut s = parse(spec)?;
    let domain = domain(&s.group)?;
    writeln!(s.fd, "{}", domain.id())?;
    drop(s.fd);
    let mut rx = domain.accept(RENDEZVOUS).map_err(err)?;
    map_per_transfer(&mut rx, s.uncached)?;
    Ok((domain, rx))
}

/// Makes `rx` map every fragment afresh (`uncached`): the fbuf paper's baseline, a hook
/// of the library's `testing` feature, which only the benchmarks (feature `bench`) turn
/// on.
#[cfg(feature = "bench")]
fn map_per_transfer(rx: &mut Receiver, uncached: bool) -> io::Result<()> {
    ferry::testing::set_map_per_transfer(rx, uncached);
    Ok(())
}

/// Without the feature `bench` (`ferry calibrate`, which never asks for it) the uncached
/// baseline is refused.
#[cfg(not(feature = "bench"))]
fn map_per_transfer(_rx: &mut Receiver, uncached: bool) -> io::Result<()> {
    if uncached {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the uncached ferry link is a benchmark baseline: build with feature `bench`",
        ));
    }
    Ok(())
}

/// Worker side of ferry links.
pub struct Ferry;

pub struct FerryTx {
    domain: Domain,
    /// One path per message size, each with a quota of [`depth`] fbufs.
    paths: std::collections::HashMap<usize, PathAllocator>,
    secure: bool,
    tx: Sender,
    wait: Wait,
}

pub struct FerryRx {
    _domain: Domain,
    rx: Receiver,
    wait: Wait,
    /// The message last received, released when the next receive starts: the release
    /// (a push on the reverse ring) is then outside the measured hand-over.
    last: Option<IoData>,
}

impl FerryTx {
    /// This end's domain and channel, for a worker that drives the channel itself.
    pub fn into_parts(self) -> (Domain, Sender) {
        (self.domain, self.tx)
    }

    fn send(&self, data: &IoData) -> io::Result<()> {
        match self.wait {
            Wait::Block => self.tx.send(data).map_err(err),
            Wait::Spin => loop {
                match self.tx.try_send(data) {
                    Ok(()) => return Ok(()),
                    Err(ferry::Error::Full) => spin_loop(),
                    Err(e) => return Err(err(e)),
                }
            },
        }
    }
}

impl FerryRx {
    /// This end's domain and channel, for a worker that drives the channel itself.
    pub fn into_parts(self) -> (Domain, Receiver) {
        (self._domain, self.rx)
    }

    fn take(&mut self, len: usize) -> io::Result<IoData> {
        self.last = None;
        let data = match self.wait {
            Wait::Block => self.rx.recv().map_err(err)?,
            Wait::Spin => loop {
                if let Some(d) = self.rx.try_recv().map_err(err)? {
                    break d;
                }
                spin_loop();
            },
        };
        if data.len() != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a {len}-byte message, got {}", data.len()),
            ));
        }
        Ok(data)
    }
}

fn touch_all(data: &IoData, touch: &mut dyn FnMut(usize, &[u8])) {
    let mut off = 0;
    for frag in data.fragments() {
        let s = frag.as_slice();
        touch(off, s);
        off += s.len();
    }
}

impl Transport for Ferry {
    type Tx = FerryTx;
    type Rx = FerryRx;

    fn open_tx(spec: &str, wait: Wait) -> io::Result<FerryTx> {
        let (domain, tx, secure) = connect(spec)?;
        Ok(FerryTx {
            domain,
            paths: Default::default(),
            secure,
            tx,
            wait,
        })
    }

    fn open_rx(spec: &str, wait: Wait) -> io::Result<FerryRx> {
        let (domain, rx) = accept(spec)?;
        Ok(FerryRx {
            _domain: domain,
            rx,
            wait,
            last: None,
        })
    }

    fn forward(
        rx: &mut FerryRx,
        tx: &mut FerryTx,
        len: usize,
        touch: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        let data = rx.take(len)?;
        touch_all(&data, touch);
        tx.send(&data)
    }
}

impl TxEnd for FerryTx {
    fn send_new(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]),
        stamp: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<()> {
        let path = match self.paths.entry(len) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let fbuf = len.max(1).div_ceil(4096).next_power_of_two() * 4096;
                e.insert(
                    self.domain
                        .path(PathConfig {
                            quota: depth(len) * fbuf,
                            secure: self.secure,
                            ..PathConfig::default()
                        })
                        .map_err(err)?,
                )
            }
        };
        let mut m = loop {
            match path.alloc(len) {
                Ok(m) => break m,
                // The sink still holds `depth` of our fbufs: wait for a release.
                Err(ferry::Error::QuotaExceeded { .. }) => match self.wait {
                    Wait::Spin => spin_loop(),
                    Wait::Block => std::thread::yield_now(),
                },
                Err(e) => return Err(err(e)),
            }
        };
        let mut off = 0;
        for frag in m.fragments_mut() {
            fill(off, frag);
            off += frag.len();
        }
        if let Some(first) = m.fragments_mut().next() {
            stamp(first);
        }
        let data = m.freeze();
        self.send(&data)
    }

    fn syscalls(&self) -> Option<u64> {
        Some(ferry::stats::thread_syscall_count())
    }
}

impl RxEnd for FerryRx {
    fn recv(&mut self, len: usize, touch: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let data = self.take(len)?;
        touch_all(&data, touch);
        self.last = Some(data);
        Ok(())
    }

    fn syscalls(&self) -> Option<u64> {
        Some(ferry::stats::thread_syscall_count())
    }
}
