//! One domain of `ferry-bench container` (the container-shipping paper's Figure 6): a
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
//! Both sides derive the same schedule from the [`Plan`] ([`batches`]).
//!
//! Link ends (the worker's `--rx`, `--tx`, `--ack`):
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
use ferry::containers::Container;

use super::schedule::{batches, pallet_layout, Method, ACCESSOR, CHUNK, DOMAINS, PALLETS};
use crate::harness::chain::touch::read_words;
use crate::protocol::{Plan, Sample, SampleKind, WorkerArgs};
use crate::sys;

/// Parsed `key=value,key=value` link end spec.
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
    for g in batches(plan) {
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
