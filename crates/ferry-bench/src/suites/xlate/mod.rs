//! `ferry-bench xlate`: Schoinas & Hill's Figure 7 on io_uring. Latency and throughput of
//! one I/O against the number of distinct user buffers it cycles through, from 1 to far
//! beyond the registration cache, for O_DIRECT file writes (ext4 and tmpfs), for `/dev/null`,
//! and for TCP loopback and Unix stream socket sends.
//!
//! Five ways to serve each I/O, each on its own [`Xlate`] ring in this process:
//! registered buffers with the cache serving misses first ("registered (cache)"), single
//! copy through a registered bounce buffer, registration on every I/O, and the cache with
//! the single-copy fallback, with and without the rate limit on serving misses. The
//! socket's peer is a thread on the other CPU that drains the connection.

mod report;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry::uring::xlate::{Miss, Mode, Xlate, XlateConfig, XlateStats};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, BenchOutput};
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;
use crate::sys;
use report::{drained_note, markdown, plots, zc_note_for};

pub const BENCH: BenchDef = BenchDef {
    name: "xlate",
    about: "I/O latency and throughput vs distinct buffers: registration cache, single copy, register per I/O (Schoinas & Hill Figure 7)",
    run,
};

/// Cache slots: the paper's simulated table had 32 entries.
const SLOTS: u32 = 32;
/// The rate limit, in messages: one registration per this many messages' bytes. Serving
/// a miss here (watch + pin + evict) costs about ten single copies of a small message, so
/// one per 256 keeps it near 5% of the fallback's cost.
const RATE_MSGS: usize = 256;
/// Bytes of the O_DIRECT file the writes cycle through.
const FILE_LEN: u64 = 64 << 20;
/// Largest buffer region one point allocates.
const MAX_REGION: usize = 256 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Series {
    Registered,
    SingleCopy,
    EveryIo,
    RateLimited,
    NoLimit,
    /// Registered, socket sends by `SEND_ZC` (not in [`SERIES`]: measured on the socket
    /// only, for the loopback `ZC_COPIED` fact).
    RegisteredZc,
}

const SERIES: [Series; 5] = [
    Series::Registered,
    Series::SingleCopy,
    Series::EveryIo,
    Series::RateLimited,
    Series::NoLimit,
];

impl Series {
    fn label(self) -> &'static str {
        match self {
            Series::Registered => "registered (cache)",
            Series::SingleCopy => "single copy",
            Series::EveryIo => "register every I/O",
            Series::RateLimited => "cache + rate limit",
            Series::NoLimit => "cache, no rate limit",
            Series::RegisteredZc => "registered (cache), SEND_ZC",
        }
    }

    fn mode(self, size: usize) -> Mode {
        match self {
            Series::Registered | Series::RegisteredZc => Mode::Cache(Miss::RegisterFirst),
            Series::SingleCopy => Mode::BounceOnly,
            Series::EveryIo => Mode::RegisterEveryIo,
            Series::RateLimited => Mode::Cache(Miss::Fallback {
                rate_limit: Some(RATE_MSGS * size),
            }),
            Series::NoLimit => Mode::Cache(Miss::Fallback { rate_limit: None }),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    File,
    /// An O_DIRECT file on tmpfs: the file path without the disk's latency.
    Tmpfs,
    Socket,
    /// A Unix stream socket: a socket without the TCP stack's per-send cost.
    Unix,
    Null,
}

const TARGETS: [Target; 5] = [
    Target::Null,
    Target::Tmpfs,
    Target::File,
    Target::Socket,
    Target::Unix,
];

/// Where the tmpfs file goes.
const TMPFS_DIR: &str = "/dev/shm";

impl Target {
    fn label(self) -> &'static str {
        match self {
            Target::File => "file (O_DIRECT write)",
            Target::Tmpfs => "tmpfs file (O_DIRECT write)",
            Target::Socket => "socket (TCP loopback send)",
            Target::Unix => "Unix stream socket (send)",
            Target::Null => "/dev/null (write, no data movement)",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Target::File => "file",
            Target::Tmpfs => "tmpfs",
            Target::Socket => "socket",
            Target::Unix => "unix",
            Target::Null => "null",
        }
    }
}

/// One measured point.
struct Point {
    target: Target,
    size: usize,
    buffers: usize,
    series: Series,
    lat: Summary,
    /// MB/s at the median latency (one I/O is in flight at a time).
    mbps: f64,
    /// MB/s over the whole timed loop (mean), for the JSON records.
    mean_mbps: f64,
    ops: u64,
    syscalls_per_io: f64,
    stats: XlateStats,
}

/// Where the I/O goes.
enum Sink {
    File(File),
    Null(File),
    Socket {
        stream: std::os::fd::OwnedFd,
        drain: Option<std::thread::JoinHandle<u64>>,
    },
}

/// Reads `s` until it closes, busy-polling on `cpu` so the sender never waits for this
/// CPU to wake up (tens of µs on a VM); returns the bytes read.
fn drain(mut s: impl Read, cpu: usize) -> u64 {
    let _ = sys::pin_to(cpu);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(_) => break,
        }
    }
    total
}

fn open_unix(drain_cpu: usize) -> Result<Sink> {
    let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
    rx.set_nonblocking(true)?;
    let drain = std::thread::spawn(move || drain(rx, drain_cpu));
    Ok(Sink::Socket {
        stream: tx.into(),
        drain: Some(drain),
    })
}

fn open_file(dir: &std::path::Path) -> Result<(File, bool, PathBuf)> {
    let path = dir.join(format!("ferry-xlate-bench-{}", std::process::id()));
    {
        let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..FILE_LEN >> 20 {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
    }
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(&path);
    let (f, is_direct) = match direct {
        Ok(f) => (f, true),
        Err(_) => (OpenOptions::new().write(true).open(&path)?, false),
    };
    Ok((f, is_direct, path))
}

fn fs_name(dir: &std::path::Path) -> String {
    match rustix::fs::statfs(dir) {
        Ok(s) => match s.f_type as u64 {
            0xEF53 => "ext4".into(),
            0x0102_1994 => "tmpfs".into(),
            0x5846_5342 => "xfs".into(),
            0x9123_683E => "btrfs".into(),
            t => format!("filesystem magic {t:#x}"),
        },
        Err(e) => format!("unknown ({e})"),
    }
}

fn open_socket(drain_cpu: usize) -> Result<Sink> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let drain = std::thread::spawn(move || -> u64 {
        match l.accept() {
            Ok((s, _)) if s.set_nonblocking(true).is_ok() => drain(s, drain_cpu),
            _ => 0,
        }
    });
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    Ok(Sink::Socket {
        stream: stream.into(),
        drain: Some(drain),
    })
}

/// `count` page-aligned buffers of `size` bytes, each starting on its own page.
struct Buffers {
    region: Vec<u8>,
    base: usize,
    stride: usize,
    size: usize,
}

impl Buffers {
    fn new(count: usize, size: usize) -> Buffers {
        let stride = size.div_ceil(4096) * 4096;
        let mut region = vec![0u8; count * stride + 4096];
        let base = region.as_ptr().align_offset(4096);
        for (i, b) in region.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        Buffers {
            region,
            base,
            stride,
            size,
        }
    }
    fn get(&self, i: usize) -> &[u8] {
        let at = self.base + i * self.stride;
        &self.region[at..at + self.size]
    }
}

fn one_io(x: &mut Xlate, sink: &Sink, buf: &[u8], k: u64) -> Result<()> {
    match sink {
        Sink::Null(f) => {
            let n = x.write_at(f, buf, 0)?;
            anyhow::ensure!(n == buf.len(), "short write to /dev/null: {n}");
        }
        Sink::File(f) => {
            let slots = (FILE_LEN / buf.len() as u64).max(1);
            let off = (k % slots) * buf.len() as u64;
            let n = x.write_at(f, buf, off)?;
            anyhow::ensure!(n == buf.len(), "short O_DIRECT write: {n}");
        }
        Sink::Socket { stream, .. } => {
            let mut sent = 0;
            while sent < buf.len() {
                sent += x.send(stream, &buf[sent..])?;
            }
        }
    }
    Ok(())
}

/// Measures the five series on one sink, interleaved: each timed round gives every series
/// a slice of the time, starting with a different one each round, so a burst of noise
/// from the shared machine lands on all of them alike.
fn measure_all(
    ctx: &BenchCtx,
    target: Target,
    sink: &Sink,
    size: usize,
    bufs: &Buffers,
    count: usize,
) -> Result<Vec<Point>> {
    let mut xs = SERIES
        .iter()
        .map(|s| {
            Xlate::new(XlateConfig {
                table_slots: SLOTS,
                bounce_buffers: 2,
                bounce_size: size.max(4096),
                mode: s.mode(size),
                watch_unmaps: true,
                zero_copy_send: *s == Series::RegisteredZc,
                ..XlateConfig::default()
            })
        })
        .collect::<ferry::Result<Vec<Xlate>>>()?;
    let budget = Duration::from_millis(ctx.pick(50, 200));
    let warm = Duration::from_millis(ctx.pick(15, 60));
    let rounds = ctx.pick(5u32, 10);
    let max_ops: u64 = ctx.pick(20_000, 100_000);
    let mut k = 0u64;
    // Warm-up: at least one pass over every buffer, so the fitting case is registered.
    for x in xs.iter_mut() {
        let t0 = Instant::now();
        let mut n = 0usize;
        while n < count || t0.elapsed() < warm {
            one_io(x, sink, bufs.get(n % count), k)?;
            n += 1;
            k += 1;
        }
    }
    let before: Vec<XlateStats> = xs.iter().map(|x| x.stats()).collect();
    let n = xs.len();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut secs = vec![0f64; n];
    let mut ops = vec![0u64; n];
    let mut syscalls = vec![0u64; n];
    let mut next = vec![0usize; n];
    let slice = budget / rounds;
    for r in 0..rounds as usize {
        for j in 0..n {
            let i = (r + j) % n;
            let x = &mut xs[i];
            let sc0 = ferry::stats::thread_syscall_count();
            let start = Instant::now();
            let mut done = 0usize;
            while (done < count.min(64) || start.elapsed() < slice) && ops[i] < max_ops {
                let b = bufs.get(next[i] % count);
                let t = Instant::now();
                one_io(x, sink, b, k)?;
                lat[i].push(t.elapsed().as_secs_f64() * 1e6);
                next[i] += 1;
                k += 1;
                ops[i] += 1;
                done += 1;
            }
            secs[i] += start.elapsed().as_secs_f64();
            syscalls[i] += ferry::stats::thread_syscall_count() - sc0;
        }
    }
    let mut points = Vec::with_capacity(n);
    for (i, &series) in SERIES.iter().enumerate() {
        let (b, a) = (before[i], xs[i].stats());
        let stats = XlateStats {
            ios: a.ios - b.ios,
            hits: a.hits - b.hits,
            misses: a.misses - b.misses,
            fallbacks: a.fallbacks - b.fallbacks,
            evictions: a.evictions - b.evictions,
            registrations: a.registrations - b.registrations,
            register_failures: a.register_failures - b.register_failures,
            zc_copied: a.zc_copied - b.zc_copied,
            bytes: a.bytes - b.bytes,
            ..a
        };
        let summary = Summary::of(&lat[i]);
        points.push(Point {
            target,
            size,
            buffers: count,
            series,
            mbps: size as f64 / summary.median,
            lat: summary,
            mean_mbps: (ops[i] as f64 * size as f64) / secs[i] / 1e6,
            ops: ops[i],
            syscalls_per_io: syscalls[i] as f64 / ops[i].max(1) as f64,
            stats,
        });
    }
    Ok(points)
}

/// Registered sends by `SEND_ZC` from one buffer: the notification wait, and whether the
/// kernel copied (on loopback it does).
fn measure_zc(ctx: &BenchCtx, sink: &Sink, size: usize) -> Result<Point> {
    let mut x = Xlate::new(XlateConfig {
        table_slots: SLOTS,
        bounce_size: size.max(4096),
        mode: Series::RegisteredZc.mode(size),
        zero_copy_send: true,
        ..XlateConfig::default()
    })?;
    let bufs = Buffers::new(1, size);
    for k in 0..16 {
        one_io(&mut x, sink, bufs.get(0), k)?;
    }
    let before = x.stats();
    let budget = Duration::from_millis(ctx.pick(40, 120));
    let mut lat = Vec::new();
    let sc0 = ferry::stats::thread_syscall_count();
    let start = Instant::now();
    while lat.len() < 32 || (start.elapsed() < budget && lat.len() < 20_000) {
        let t = Instant::now();
        one_io(&mut x, sink, bufs.get(0), 0)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = start.elapsed().as_secs_f64();
    let syscalls = ferry::stats::thread_syscall_count() - sc0;
    let a = x.stats();
    let stats = XlateStats {
        ios: a.ios - before.ios,
        hits: a.hits - before.hits,
        zc_copied: a.zc_copied - before.zc_copied,
        bytes: a.bytes - before.bytes,
        ..XlateStats::default()
    };
    let summary = Summary::of(&lat);
    let ops = lat.len() as u64;
    Ok(Point {
        target: Target::Socket,
        size,
        buffers: 1,
        series: Series::RegisteredZc,
        mbps: size as f64 / summary.median,
        lat: summary,
        mean_mbps: (ops as f64 * size as f64) / secs / 1e6,
        ops,
        syscalls_per_io: syscalls as f64 / ops.max(1) as f64,
        stats,
    })
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let memcpy = ctx.memcpy()?.gbps.median;
    let sizes: Vec<usize> = if ctx.quick {
        vec![2048, 64 << 10]
    } else {
        vec![512, 2048, 64 << 10, 1 << 20]
    };
    let counts: Vec<usize> = if ctx.quick {
        vec![1, 4 * SLOTS as usize]
    } else {
        vec![
            1,
            8,
            SLOTS as usize,
            4 * SLOTS as usize,
            16 * SLOTS as usize,
        ]
    };
    let _ = sys::pin_to(ctx.cpu(0));
    let dir = std::env::temp_dir();
    let fs = fs_name(&dir);
    let (file, direct, path) = open_file(&dir)?;
    // The same writes to a tmpfs file, where the disk's latency does not hide the cost of
    // each path (tmpfs accepts O_DIRECT since Linux 6.6). Skipped where there is none.
    let tmpfs = match fs_name(std::path::Path::new(TMPFS_DIR)).as_str() {
        "tmpfs" => match open_file(std::path::Path::new(TMPFS_DIR)) {
            Ok((f, true, p)) => Some((f, p)),
            Ok((f, false, p)) => {
                drop(f);
                let _ = std::fs::remove_file(&p);
                None
            }
            Err(_) => None,
        },
        _ => None,
    };
    let mut points = Vec::new();
    let mut zc_note = String::new();
    for target in TARGETS {
        let sink = match target {
            Target::Null => Sink::Null(OpenOptions::new().write(true).open("/dev/null")?),
            Target::File => Sink::File(file.try_clone()?),
            Target::Tmpfs => match &tmpfs {
                Some((f, _)) => Sink::File(f.try_clone()?),
                None => continue,
            },
            Target::Socket => open_socket(ctx.cpu(1))?,
            Target::Unix => open_unix(ctx.cpu(1))?,
        };
        for &size in &sizes {
            for &count in &counts {
                let stride = size.div_ceil(4096) * 4096;
                if count * stride > MAX_REGION {
                    continue;
                }
                ctx.progress.phase(&format!(
                    "xlate: {}, {} messages, {count} distinct buffers",
                    target.key(),
                    bytes(size)
                ));
                let bufs = Buffers::new(count, size);
                points.extend(measure_all(ctx, target, &sink, size, &bufs, count)?);
            }
        }
        if target == Target::Socket {
            let mut zc = Vec::new();
            for &size in &sizes {
                ctx.progress.phase(&format!(
                    "xlate: socket, {} messages, registered, SEND_ZC",
                    bytes(size)
                ));
                zc.push(measure_zc(ctx, &sink, size)?);
            }
            zc_note.push_str(&zc_note_for(&zc, &points));
            points.extend(zc);
        }
        if let Sink::Socket { stream, drain } = sink {
            drop(stream);
            let drained = drain.map_or(0, |h| h.join().unwrap_or(0));
            zc_note.push_str(&drained_note(target, drained));
        }
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    let tmpfs_used = tmpfs.is_some();
    if let Some((f, p)) = tmpfs {
        drop(f);
        let _ = std::fs::remove_file(p);
    }

    let mut out = BenchOutput::default();
    for p in &points {
        let base = |r: Record| {
            r.param("target", p.target.key())
                .param("bytes", p.size)
                .param("buffers", p.buffers)
                .param("table_slots", SLOTS)
                .param("hits", p.stats.hits)
                .param("misses", p.stats.misses)
                .param("registrations", p.stats.registrations)
                .param("evictions", p.stats.evictions)
                .param("syscalls_per_io", p.syscalls_per_io)
                .param("ops", p.ops)
        };
        out.records.push(base(Record::new(
            "xlate",
            p.series.label(),
            "µs",
            p.lat,
            1,
            0.0,
        )));
        let tp = Summary::of(&[p.mbps]);
        out.records.push(
            base(Record::new("xlate", p.series.label(), "MB/s", tp, 1, 0.0))
                .param("mean_mbps", p.mean_mbps),
        );
    }
    let files = Files {
        fs,
        direct,
        tmpfs: tmpfs_used,
    };
    out.markdown = markdown(ctx, &points, &sizes, &counts, memcpy, &files, &zc_note);
    out.plots.extend(plots(&points, &sizes));
    Ok(out)
}

/// What the file targets turned out to be.
struct Files {
    /// Filesystem of the temporary directory.
    fs: String,
    /// Whether that file took O_DIRECT.
    direct: bool,
    /// Whether the tmpfs O_DIRECT file was measured.
    tmpfs: bool,
}
