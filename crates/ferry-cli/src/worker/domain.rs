//! One domain of `ferry bench container` (the container-shipping paper's Figure 6): a
//! process in a chain of [`DOMAINS`] that moves one message, first domain to last, by
//! each of three [`Method`]s in turn.
//!
//! - **Container shipping**: the container's memfds go over a Unix socket with
//!   `SCM_RIGHTS`; only the accessing domain unloads (maps) the pallets it touches.
//! - **Physical copy**: each domain reads the message from a pipe into its own buffer
//!   and writes it into the next pipe, in pipe-sized chunks.
//! - **Virtual move**: the same container shipping, but every domain unloads every
//!   pallet and reads one word per page (maps and populates it) before shipping it on.
//!
//! One message travels at a time: the last domain returns the container (or, for the
//! copy, one byte) to the first over a return socket, and the first domain sends the
//! next message only then. The first domain stamps when it starts a message, the last
//! when it has received it; the harness pairs the stamps (the clock is system-wide).
//! Both sides derive the same schedule from the [`Plan`] ([`groups`]).
//!
//! Endpoints (the worker's `--rx`, `--tx`, `--ack`):
//! - `--rx sock=FD,pipe=FD`: from the previous domain (the first domain's `sock` is the
//!   return socket from the last);
//! - `--tx sock=FD,pipe=FD`: to the next domain (the last domain's `sock` is the return
//!   socket to the first);
//! - `--ack domain=I,lifeline=FD`: this domain's index, and the read end of a pipe whose
//!   write end only the harness holds. EOF on it means the harness is gone, and the
//!   domain exits at once.

use std::fs::File;
use std::hint::black_box;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use anyhow::{bail, Context, Result};
use ferry::container::Container;

use crate::harness::chain::touch::read_words;
use crate::protocol::{Plan, Sample, SampleKind, WorkerArgs};
use crate::sys;

/// Processes in the chain.
pub const DOMAINS: usize = 5;
/// The domain that reads and writes the accessed bytes: the middle one.
pub const ACCESSOR: usize = DOMAINS / 2;
/// Pallets per container.
pub const PALLETS: usize = 5;
/// Stands for "all of the message" in [`ACCESSES`].
pub const ALL: usize = usize::MAX;
/// Bytes the accessing domain reads and writes, from the start of the message.
pub const ACCESSES: [usize; 4] = [0, 100 << 10, 1 << 20, ALL];
/// Bytes a copying domain moves per `read`/`write`: the pipe capacity the harness asks for.
pub const CHUNK: usize = 1 << 20;
/// Page size the pallets are rounded to.
const PAGE: usize = 4096;

/// How the message moves from domain to domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Container,
    Copy,
    VirtualMove,
}

/// Every method, in the order each group of the schedule runs them.
pub const METHODS: [Method; 3] = [Method::Container, Method::Copy, Method::VirtualMove];

impl Method {
    /// Short name for JSON records.
    pub fn name(self) -> &'static str {
        match self {
            Method::Container => "container",
            Method::Copy => "copy",
            Method::VirtualMove => "virtual-move",
        }
    }

    /// Name for tables and plot legends.
    pub fn label(self) -> &'static str {
        match self {
            Method::Container => "container shipping",
            Method::Copy => "physical copy (pipes)",
            Method::VirtualMove => "virtual move",
        }
    }
}

/// Bytes accessed for an entry of [`ACCESSES`] in a message of `size` bytes.
pub fn resolve(access: usize, size: usize) -> usize {
    access.min(size)
}

/// Messages of one method at one access amount in one trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub trial: u32,
    /// Bytes accessed (resolved).
    pub access: usize,
    pub method: Method,
    pub warmup: u32,
    pub timed: u32,
}

/// Container shipping that does not access everything costs microseconds, so it always
/// gets at least this many timed messages, after at least [`CHEAP_WARMUP`] warm-ups.
pub const CHEAP_MSGS: u32 = 30;
/// Warm-up messages before the cheap groups' timed ones.
pub const CHEAP_WARMUP: u32 = 2;

/// Above this size the copy runs only with nothing and with everything accessed: it takes
/// seconds, and 100 KiB or 1 MiB of access changes that by well under 1%.
pub const COPY_ENDS_ONLY_ABOVE: usize = 64 << 20;

/// True if `method` runs at `access` bytes accessed of a `size`-byte message.
pub fn runs(method: Method, access: usize, size: usize) -> bool {
    !(method == Method::Copy && size > COPY_ENDS_ONLY_ABOVE && access != 0 && access < size)
}

/// The schedule: trials, then access amounts, then methods, so that the three methods
/// at one access amount run back to back. Uses the plan's first size, message count and
/// warm-up count (see [`CHEAP_MSGS`] and [`runs`] for the exceptions).
pub fn groups(plan: &Plan) -> Vec<Group> {
    let size = plan.sizes.first().copied().unwrap_or(0);
    let warmup = plan.warmup.first().copied().unwrap_or(0);
    let timed = plan.msgs.first().copied().unwrap_or(1).max(1);
    let mut out = Vec::new();
    for trial in 0..plan.trials {
        for &a in &ACCESSES {
            let access = resolve(a, size);
            for &method in &METHODS {
                if !runs(method, access, size) {
                    continue;
                }
                let cheap = method == Method::Container && access < size;
                out.push(Group {
                    trial,
                    access,
                    method,
                    warmup: if cheap {
                        warmup.max(CHEAP_WARMUP)
                    } else {
                        warmup
                    },
                    timed: if cheap { timed.max(CHEAP_MSGS) } else { timed },
                });
            }
        }
    }
    out
}

/// Size of every pallet for a `size`-byte message (equal page multiples), and the valid
/// length of each; the valid lengths add up to `size`.
pub fn pallet_layout(size: usize) -> (usize, Vec<usize>) {
    let per = size.div_ceil(PALLETS).div_ceil(PAGE).max(1) * PAGE;
    let valid = (0..PALLETS)
        .map(|i| size.saturating_sub(i * per).min(per))
        .collect();
    (per, valid)
}

/// Parsed `key=value,key=value` endpoint spec.
fn field(spec: &str, key: &str) -> Option<String> {
    spec.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

fn fd_field(spec: Option<&str>, key: &str) -> Result<Option<OwnedFd>> {
    let Some(v) = spec.and_then(|s| field(s, key)) else {
        return Ok(None);
    };
    let n: i32 = v
        .parse()
        .with_context(|| format!("bad fd {v:?} for {key}"))?;
    Ok(Some(sys::inherited_fd(n)?))
}

/// One side of a domain: a socket for containers and a pipe for copies.
struct Ends {
    sock: Option<UnixStream>,
    pipe: Option<File>,
}

impl Ends {
    fn open(spec: Option<&str>) -> Result<Ends> {
        Ok(Ends {
            sock: fd_field(spec, "sock")?.map(UnixStream::from),
            pipe: fd_field(spec, "pipe")?.map(File::from),
        })
    }

    fn sock(&self) -> Result<&UnixStream> {
        self.sock
            .as_ref()
            .context("this domain has no socket on that side")
    }

    fn pipe(&mut self) -> Result<&mut File> {
        self.pipe
            .as_mut()
            .context("this domain has no pipe on that side")
    }
}

/// Exits this process as soon as the harness is gone (EOF on the lifeline).
fn watch_lifeline(fd: OwnedFd) -> Result<()> {
    let mut f = File::from(fd);
    std::thread::Builder::new()
        .name("lifeline".into())
        .spawn(move || {
            let mut b = [0u8; 1];
            loop {
                match f.read(&mut b) {
                    Ok(n) if n > 0 => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // The harness is gone. No message: stderr went with it, and a
                    // failed `eprintln!` would panic this thread instead of exiting.
                    _ => std::process::exit(3),
                }
            }
        })
        .context("starting the lifeline thread")?;
    Ok(())
}

/// Reads and writes every byte of `b`: each 8-byte word is read and written back plus one.
pub fn read_write(b: &mut [u8]) {
    let mut words = b.chunks_exact_mut(8);
    for w in &mut words {
        let v = u64::from_ne_bytes((&*w).try_into().expect("8 bytes"));
        w.copy_from_slice(&v.wrapping_add(1).to_ne_bytes());
    }
    for x in words.into_remainder() {
        *x = x.wrapping_add(1);
    }
    black_box(b);
}

/// Accesses the message bytes `[0, access)` that fall in the part `[base, base + b.len())`
/// held by `b`.
fn access_part(b: &mut [u8], base: usize, access: usize) {
    if access > base {
        let n = (access - base).min(b.len());
        read_write(&mut b[..n]);
    }
}

/// Unloads every pallet, reads one word per page (maps and populates it), and, when this
/// is the accessing domain, reads and writes its share of the accessed bytes.
fn populate_all(c: &mut Container, valid: &[usize], access: Option<usize>) -> Result<()> {
    let mut base = 0;
    for (i, &len) in valid.iter().enumerate() {
        let mut p = c.unload(i)?;
        read_words(0, &p.as_slice()[..len]);
        if let Some(a) = access {
            access_part(&mut p.as_mut_slice()[..len], base, a);
        }
        drop(p);
        base += len;
    }
    Ok(())
}

/// Unloads only the pallets holding the accessed bytes, and reads and writes those bytes.
fn access_container(c: &mut Container, valid: &[usize], access: usize) -> Result<()> {
    let mut base = 0;
    for (i, &len) in valid.iter().enumerate() {
        if base >= access {
            break;
        }
        let mut p = c.unload(i)?;
        access_part(&mut p.as_mut_slice()[..len], base, access);
        drop(p);
        base += len;
    }
    Ok(())
}

/// Open descriptors of this process that are memfds.
pub fn memfds_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.to_string_lossy().starts_with("/memfd:"))
                .count()
        })
        .unwrap_or(0)
}

/// Runs this domain's part of every group and returns its stamps (first and last domain).
pub fn run(args: &WorkerArgs, plan: &Plan) -> Result<Vec<Sample>> {
    let ctl = args
        .ack
        .as_deref()
        .context("--ack domain=I,lifeline=FD is required")?;
    let index: usize = field(ctl, "domain")
        .context("--ack lacks domain=")?
        .parse()
        .context("bad domain index")?;
    if index >= DOMAINS {
        bail!("domain {index} out of range");
    }
    if let Some(l) = fd_field(Some(ctl), "lifeline")? {
        watch_lifeline(l)?;
    }
    let (first, last) = (index == 0, index == DOMAINS - 1);
    let mut rx = Ends::open(args.rx.as_deref())?;
    let mut tx = Ends::open(args.tx.as_deref())?;
    let size = *plan.sizes.first().context("no message size")?;
    let (per, valid) = pallet_layout(size);

    // The first domain owns the data: one container, filled once and recirculated. The
    // copy writes it into the first pipe from a read-only view of each pallet, so that no
    // domain holds a second copy of the message besides its chunk buffer.
    let mut container = None;
    if first {
        let mut c = Container::alloc(&[per; PALLETS])?;
        for (i, &len) in valid.iter().enumerate() {
            let mut p = c.unload(i)?;
            p.as_mut_slice()[..len].fill(0x5a);
            p.reload(0..len)?;
        }
        container = Some(c);
    }
    let mut buf = vec![0x5au8; CHUNK.min(size.max(1))];

    let mut out = Vec::new();
    for g in groups(plan) {
        let mut stamps = Vec::with_capacity(g.timed as usize);
        let accessor = (index == ACCESSOR && g.access > 0).then_some(g.access);
        for k in 0..g.warmup + g.timed {
            let t = match (g.method, first, last) {
                (Method::Copy, true, _) => {
                    let c = container.as_mut().context("no container")?;
                    let t0 = sys::now_ns();
                    for (i, &len) in valid.iter().enumerate() {
                        let v = c.view(i)?;
                        for chunk in v.as_slice()[..len].chunks(CHUNK) {
                            tx.pipe()?.write_all(chunk)?;
                        }
                    }
                    let mut b = [0u8; 1];
                    rx.sock()?.read_exact(&mut b)?;
                    t0
                }
                (Method::Copy, false, _) => {
                    let mut base = 0;
                    while base < size {
                        let n = CHUNK.min(size - base);
                        rx.pipe()?.read_exact(&mut buf[..n])?;
                        if let Some(a) = accessor {
                            access_part(&mut buf[..n], base, a);
                        }
                        if !last {
                            tx.pipe()?.write_all(&buf[..n])?;
                        }
                        base += n;
                    }
                    let t1 = sys::now_ns();
                    if last {
                        tx.sock()?.write_all(&[1])?;
                    }
                    t1
                }
                (m, true, _) => {
                    let mut c = container
                        .take()
                        .context("the container did not come back")?;
                    let t0 = sys::now_ns();
                    if m == Method::VirtualMove {
                        populate_all(&mut c, &valid, None)?;
                    }
                    c.ship(tx.sock()?)?;
                    container = Some(Container::receive(rx.sock()?)?);
                    t0
                }
                (m, false, _) => {
                    let mut c = Container::receive(rx.sock()?)?;
                    if m == Method::VirtualMove {
                        populate_all(&mut c, &valid, accessor)?;
                    } else if let Some(a) = accessor {
                        access_container(&mut c, &valid, a)?;
                    }
                    let t1 = sys::now_ns();
                    c.ship(tx.sock()?)?;
                    t1
                }
            };
            if k >= g.warmup {
                stamps.push(t);
            }
        }
        if first || last {
            out.push(Sample {
                kind: SampleKind::OneWay,
                size,
                trial: g.trial,
                bytes: g.access as u64,
                ns: stamps,
                syscalls: None,
            });
        }
    }
    drop(container);
    let left = memfds_open();
    if left != 0 {
        bail!("domain {index} still holds {left} memfds at exit");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_adds_up() {
        for size in [10 << 20, 1 << 30, 4096, 12345] {
            let (per, valid) = pallet_layout(size);
            assert_eq!(per % PAGE, 0);
            assert_eq!(valid.iter().sum::<usize>(), size);
            assert!(valid.iter().all(|&v| v <= per));
        }
        assert_eq!(pallet_layout(10 << 20).0, 2 << 20);
    }

    #[test]
    fn read_write_touches_only_its_part() {
        let mut b = vec![0u8; 100];
        access_part(&mut b, 50, 60);
        // Bytes 0..10: one word plus one, then two single bytes plus one.
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 1);
        assert_eq!(&b[8..10], &[1, 1]);
        assert!(b[10..].iter().all(|&x| x == 0));
        let mut b = vec![0u8; 16];
        access_part(&mut b, 0, 0);
        assert!(b.iter().all(|&x| x == 0));
    }
}
