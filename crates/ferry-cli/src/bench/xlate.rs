//! `ferry bench xlate`: Schoinas & Hill's Figure 7 on io_uring. Latency and throughput of
//! one I/O against the number of distinct user buffers it cycles through, from 1 to far
//! beyond the registration cache, for O_DIRECT file writes (ext4 and tmpfs), for `/dev/null`,
//! and for TCP loopback and Unix stream socket sends.
//!
//! Five ways to serve each I/O, each on its own [`Xlate`] ring in this process:
//! registered buffers with the cache serving misses first ("registered (cache)"), single
//! copy through a registered bounce buffer, registration on every I/O, and the cache with
//! the single-copy fallback, with and without the rate limit on serving misses. The
//! socket's peer is a thread on the other CPU that drains the connection.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry::uring::xlate::{Miss, Mode, Xlate, XlateConfig, XlateStats};

use super::ctx::BenchCtx;
use super::output::{bytes, num, ratio, BenchOutput, PlotSpec, Table};
use super::record::Record;
use super::stats::Summary;
use super::BenchDef;
use crate::sys;

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
/// CPU to wake up (about 25 µs here); returns the bytes read.
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
            let sc0 = ferry::diagnostics::thread_syscall_count();
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
            syscalls[i] += ferry::diagnostics::thread_syscall_count() - sc0;
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
    let sc0 = ferry::diagnostics::thread_syscall_count();
    let start = Instant::now();
    while lat.len() < 32 || (start.elapsed() < budget && lat.len() < 20_000) {
        let t = Instant::now();
        one_io(&mut x, sink, bufs.get(0), 0)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = start.elapsed().as_secs_f64();
    let syscalls = ferry::diagnostics::thread_syscall_count() - sc0;
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
            let (copied, sends): (u64, u64) = zc
                .iter()
                .fold((0, 0), |(c, s), p| (c + p.stats.zc_copied, s + p.stats.ios));
            let _ = writeln!(
                zc_note,
                "Measured fact, not a failure: on TCP loopback the kernel copies `SEND_ZC` payloads anyway: \
                 {copied} of {sends} timed registered `SEND_ZC` sends (one buffer, option `zero_copy_send`) \
                 had notifications reporting `IORING_NOTIF_USAGE_ZC_COPIED`. Each such send also waits for \
                 its notification, which on loopback arrives once the peer has read the data; median µs per \
                 send, `SEND_ZC` against the default `WRITE_FIXED` (registered, 1 buffer):\n"
            );
            let mut tab = Table::new(&["message", "SEND_ZC", "WRITE_FIXED", "ZC_COPIED / sends"]);
            for p in &zc {
                let wf = find(&points, Target::Socket, p.size, 1, Series::Registered)
                    .map_or("—".into(), |w| num(w.lat.median));
                tab.row(vec![
                    bytes(p.size),
                    num(p.lat.median),
                    wf,
                    format!("{} / {}", p.stats.zc_copied, p.stats.ios),
                ]);
            }
            zc_note.push_str(&tab.render());
            points.extend(zc);
        }
        if let Sink::Socket { stream, drain } = sink {
            drop(stream);
            let drained = drain.map_or(0, |h| h.join().unwrap_or(0));
            let _ = writeln!(
                zc_note,
                "\nThe {} drain thread read {} in all.",
                target.key(),
                bytes_f(drained)
            );
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
    for target in TARGETS.into_iter().filter(|&t| measured(&points, t)) {
        for &size in &sizes {
            let series = SERIES
                .iter()
                .map(|&s| {
                    let pts = points
                        .iter()
                        .filter(|p| p.target == target && p.size == size && p.series == s)
                        .map(|p| (p.buffers as f64, p.lat.median))
                        .collect();
                    (s.label().to_string(), pts)
                })
                .collect();
            out.plots.push(PlotSpec {
                stem: format!("xlate-{}-{}", target.key(), bytes(size).replace(' ', "")),
                title: format!(
                    "{}, {} messages: latency vs distinct buffers ({SLOTS}-slot table; cf. Schoinas & Hill Fig. 7)",
                    target.label(),
                    bytes(size)
                ),
                x_label: "distinct buffers".into(),
                y_label: "median µs per I/O".into(),
                series,
                log_x: true,
                log_y: true,
            });
        }
    }
    Ok(out)
}

fn send_op_note() -> String {
    if ferry::uring::Features::probe().socket_write_fixed {
        "`WRITE_FIXED` (probed)".into()
    } else {
        "the fallback, since this kernel refused `WRITE_FIXED` on a socket at the probe \
         (`SEND_ZC` if present, else plain `SEND`)"
            .into()
    }
}

fn bytes_f(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

/// Whether `t` was measured at all (the tmpfs file may be skipped).
fn measured(points: &[Point], t: Target) -> bool {
    points.iter().any(|p| p.target == t)
}

fn find(points: &[Point], t: Target, size: usize, count: usize, s: Series) -> Option<&Point> {
    points
        .iter()
        .find(|p| p.target == t && p.size == size && p.buffers == count && p.series == s)
}

/// The paper's Myrinet results (Figure 6 best case, Figure 7 worst case with the miss
/// rate controlled): latency change of minimal messaging against single copy.
const PAPER: &[(usize, &str, &str)] = &[(512, "-25%", "+9%"), (2048, "-40%", "+2%")];

/// Bar checks: (description, measured, met).
fn verdicts(points: &[Point], sizes: &[usize], counts: &[usize]) -> Vec<(String, String, bool)> {
    let mut v = Vec::new();
    let fits = counts
        .iter()
        .copied()
        .filter(|&c| c <= SLOTS as usize)
        .max();
    for t in TARGETS {
        for &size in sizes {
            if let Some(c) = fits {
                if let (Some(r), Some(e)) = (
                    find(points, t, size, c, Series::Registered),
                    find(points, t, size, c, Series::EveryIo),
                ) {
                    let q = r.mbps / e.mbps;
                    v.push((
                        format!(
                            "{}, {}, {c} buffer(s) (all fit): registered >= 1.2x the throughput of register-every-I/O",
                            t.key(),
                            bytes(size)
                        ),
                        format!("{} vs {} MB/s = {}", num(r.mbps), num(e.mbps), ratio(q)),
                        q >= 1.2,
                    ));
                }
            }
            let far = counts
                .iter()
                .copied()
                .filter(|&c| {
                    c >= 4 * SLOTS as usize
                        && find(points, t, size, c, Series::SingleCopy).is_some()
                })
                .max();
            if let Some(c) = far {
                let (Some(rl), Some(sc), Some(nl)) = (
                    find(points, t, size, c, Series::RateLimited),
                    find(points, t, size, c, Series::SingleCopy),
                    find(points, t, size, c, Series::NoLimit),
                ) else {
                    continue;
                };
                let q = rl.mbps / sc.mbps;
                v.push((
                    format!(
                        "{}, {}, {c} buffers ({}x the table): rate-limited within 10% of single copy",
                        t.key(),
                        bytes(size),
                        c / SLOTS as usize
                    ),
                    format!("{} vs {} MB/s = {}", num(rl.mbps), num(sc.mbps), ratio(q)),
                    q >= 0.9,
                ));
                v.push((
                    format!(
                        "{}, {}, {c} buffers: without the rate limit worse than with it (by 5% or more, beyond noise)",
                        t.key(),
                        bytes(size)
                    ),
                    format!(
                        "{} vs {} MB/s = {}",
                        num(nl.mbps),
                        num(rl.mbps),
                        ratio(nl.mbps / rl.mbps)
                    ),
                    nl.mbps <= 0.95 * rl.mbps,
                ));
            }
        }
    }
    v
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

fn markdown(
    ctx: &BenchCtx,
    points: &[Point],
    sizes: &[usize],
    counts: &[usize],
    memcpy_gbps: f64,
    files: &Files,
    zc_note: &str,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## xlate: I/O latency and throughput against distinct buffers (Schoinas & Hill, Figures 6 and 7)\n"
    );
    let _ = writeln!(
        md,
        "One thread pinned to CPU {} issues one I/O at a time through an `Xlate` ring (one ring per \
         series; the series take turns in short slices, so noise from the shared machine hits all alike), cycling through N \
         distinct page-aligned buffers (each on its own pages); the cache has {SLOTS} slots (the paper's \
         simulated table), LRU. Throughput is the message size over the median latency (one I/O in flight \
         at a time; the JSON records also hold the mean over the loop). Cycling through more buffers than slots makes every lookup miss. Targets: \
         writes to `/dev/null` (the kernel accepts and drops the data without touching it, so only the \
         host-side cost of each path shows: the analogue of the paper's simulator, whose network was never \
         the bottleneck); {}writes to a {} file in {} opened {} (cycling over {}; on this VM a virtio disk, \
         whose latency per write dwarfs every host-side cost); sends on a TCP loopback \
         connection; and sends on a Unix stream socket pair (a socket without the TCP stack's per-send cost); \
         each socket drained by a thread busy-polling on CPU {}. Series:\n",
        ctx.cpu(0),
        if files.tmpfs {
            format!("the same O_DIRECT writes to a file on tmpfs in {TMPFS_DIR} (no device: the kernel copies \
                     from the fixed or bounce buffer into the file's pages, so the path's own cost shows); ")
        } else {
            format!("(no O_DIRECT tmpfs file in {TMPFS_DIR} here, so that target is skipped); ")
        },
        files.fs,
        std::env::temp_dir().display(),
        if files.direct { "with O_DIRECT" } else { "WITHOUT O_DIRECT (refused here), so through the page cache" },
        bytes(FILE_LEN as usize),
        ctx.cpu(1)
    );
    let _ = writeln!(
        md,
        "- **registered (cache)**: hit = fixed-buffer I/O from the caller's pages; a miss registers the range \
         first (the paper's CPU miss handling);\n\
         - **single copy**: every I/O copied into a pre-registered bounce buffer;\n\
         - **register every I/O**: `IORING_REGISTER_BUFFERS_UPDATE` of the buffer, then the fixed I/O;\n\
         - **cache + rate limit**: a miss bounces at once; the range is registered while that I/O runs, at \
         most once per {RATE_MSGS} messages' bytes (the paper's hysteresis);\n\
         - **cache, no rate limit**: the same, registering after every miss.\n\
         File I/O is `WRITE_FIXED`; socket I/O is `WRITE_FIXED` on the socket from the registered (or bounce) \
         buffer: one completion, no notification. Plain `IORING_OP_SEND` refuses `IORING_RECVSEND_FIXED_BUF` \
         (Linux 6.18 answers `EINVAL`), and `SEND_ZC` (measured separately below) waits for a notification. \
         Send op here: {}.\n",
        send_op_note()
    );
    let _ = writeln!(
        md,
        "memcpy on this machine, this run: {memcpy_gbps:.2} GB/s (the physical limit of the copy).\n"
    );
    for t in TARGETS.into_iter().filter(|&t| measured(points, t)) {
        for &size in sizes {
            let _ = writeln!(
                md,
                "### {}, {} messages: median µs per I/O (MB/s)\n",
                t.label(),
                bytes(size)
            );
            let mut head = vec!["distinct buffers".to_string()];
            head.extend(SERIES.iter().map(|s| s.label().to_string()));
            head.push("rate-limited: hits / misses / registrations".into());
            let h: Vec<&str> = head.iter().map(String::as_str).collect();
            let mut tab = Table::new(&h);
            for &c in counts {
                if find(points, t, size, c, Series::SingleCopy).is_none() {
                    continue;
                }
                let mut row = vec![c.to_string()];
                for s in SERIES {
                    row.push(find(points, t, size, c, s).map_or("—".into(), |p| {
                        format!("{} ({})", num(p.lat.median), num(p.mbps))
                    }));
                }
                row.push(
                    find(points, t, size, c, Series::RateLimited).map_or("—".into(), |p| {
                        format!(
                            "{} / {} / {}",
                            p.stats.hits, p.stats.misses, p.stats.registrations
                        )
                    }),
                );
                tab.row(row);
            }
            md.push_str(&tab.render());
            md.push('\n');
        }
    }
    if !zc_note.is_empty() {
        md.push_str(zc_note);
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "The paper (Myrinet, 256-entry tables, 2 µs lookup, 100 µs miss with standard kernel interfaces; \
         threshold one miss per 16 KiB) against ours: latency of registered I/O relative to single copy, at \
         1 buffer (best case) and at the most buffers (worst case, rate-limited):\n"
    );
    let far = *counts.last().unwrap_or(&1);
    let mut tab = Table::new(&[
        "message",
        "paper best case",
        "ours best, tmpfs file",
        "ours best, file",
        "ours best, socket",
        "paper worst (rate-limited)",
        "ours worst, tmpfs file",
        "ours worst, file",
        "ours worst, socket",
    ]);
    for &size in sizes {
        let rel = |t: Target, c: usize, s: Series| {
            let c = counts
                .iter()
                .copied()
                .filter(|&k| k <= c && find(points, t, size, k, s).is_some())
                .max()
                .unwrap_or(c);
            match (
                find(points, t, size, c, s),
                find(points, t, size, c, Series::SingleCopy),
            ) {
                (Some(a), Some(b)) => {
                    format!("{:+.0}%", 100.0 * (a.lat.median / b.lat.median - 1.0))
                }
                _ => "—".into(),
            }
        };
        let (pb, pw) = PAPER
            .iter()
            .find(|p| p.0 == size)
            .map_or(("—", "—"), |p| (p.1, p.2));
        tab.row(vec![
            bytes(size),
            pb.into(),
            rel(Target::Tmpfs, 1, Series::Registered),
            rel(Target::File, 1, Series::Registered),
            rel(Target::Socket, 1, Series::Registered),
            pw.into(),
            rel(Target::Tmpfs, far, Series::RateLimited),
            rel(Target::File, far, Series::RateLimited),
            rel(Target::Socket, far, Series::RateLimited),
        ]);
    }
    md.push_str(&tab.render());
    let _ = writeln!(
        md,
        "\nThe paper's simulation: with one miss served per 64 KB, the fallback stays within 10% of single \
         copy; without the rate limit, performance plummets below single copy.\n"
    );
    let _ = writeln!(md, "Bars (issue 4):\n");
    for (what, got, ok) in verdicts(points, sizes, counts) {
        let _ = writeln!(md, "- {} {what}: {got}", if ok { "MET" } else { "NOT MET" });
    }
    md.push('\n');
    md
}
