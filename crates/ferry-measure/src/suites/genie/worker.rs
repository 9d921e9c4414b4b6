//! The two processes of `ferry-bench genie`: a source that outputs each message under a
//! semantics through [`ferry::semantics::Passing`], and a sink that inputs it under the
//! same semantics. One pair of processes runs every semantics: per size, every round runs
//! one block of messages of each semantics, in an order rotated each round ([`blocks`]),
//! so that all semantics see the same machine state and per-round ratios to copy compare
//! like with like.
//!
//! Link-end specs are `SEMANTICS,...;FERRY-SPEC`: the semantics' kebab names, then the
//! spec of a ferry link ([`crate::transport::ferry`]). Stamp and CPU samples carry round
//! and semantics in `trial` ([`tag`]); counter samples carry semantics and counter
//! ([`counter_tag`]). Ping-pong: the sink signals on the return
//! pipe once it has input a message and dropped it, and the source prepares the next
//! message (untimed: its sequence number and one byte in every page) only after that
//! signal. Both sides stamp `CLOCK_MONOTONIC`: the
//! source just before the output call, the sink just after the input call returns; the
//! harness subtracts them. Each side also reports its thread's CPU time in the call.
//! The source reports the semantics layer's counters per size, so that conversions to
//! copy, fallbacks and TCOW faults show in the report. Over the channel, an
//! application-allocated input lands at the data's own page offset in a page-aligned
//! buffer (`Passing::preferred_offset`, input alignment), so copy and emulated copy
//! (converted or not) copy out between buffers that lie alike within their pages.

use anyhow::{bail, Context, Result};
use ferry::semantics::{
    AppBuffer, Calibration, Integrity, Passing, PassingConfig, Semantics, SemanticsStats,
    ThresholdSource,
};
use ferry::{Receiver, Sender};

use crate::protocol::{Plan, Role, Sample, SampleKind, Wait, WorkerArgs};
use crate::sys::{now_ns, thread_cpu_ns};
use crate::transport::ack::Ack;
use crate::transport::ferry::Ferry;
use crate::transport::Transport;

/// Largest buffer a TCP sink asks for per receive under a system-allocated semantics: a
/// stream delivers a large message in pieces, and a buffer sized for the whole message
/// per piece would hold many times its size.
const TCP_CHUNK: usize = 1 << 20;

/// The counters a source reports per size, in the order of their `trial` index.
pub const COUNTERS: &[&str] = &[
    "outputs",
    "converted-to-copy",
    "fallbacks",
    "copied-bytes",
    "tcow-pages-protected",
    "tcow-pages-moved",
    "tcow-faults",
    "tcow-pages-copied",
    "zc-sends",
    "zc-copied",
    "inputs-in-place",
    "thresholds-from-file",
];

/// Index of `inputs-in-place` in [`COUNTERS`]: the one counter the sink reports.
const IN_PLACE: usize = 10;

/// Reads [`COUNTERS`] of semantics `s` from a stats snapshot.
fn counters(st: &SemanticsStats, s: Semantics) -> [u64; 12] {
    let c = &st.per[s.index()];
    [
        c.outputs,
        c.converted_to_copy,
        c.total_fallbacks(),
        c.copied_bytes,
        st.tcow_pages_protected,
        st.tcow_pages_moved,
        st.tcow_faults,
        st.tcow_pages_copied,
        st.zc_sends,
        st.zc_copied,
        c.inputs_in_place,
        // The worker configures thresholds only from its calibration file.
        u64::from(st.threshold_source == ThresholdSource::Config),
    ]
}

fn names(sems: &[Semantics]) -> String {
    sems.iter().map(|s| s.name()).collect::<Vec<_>>().join(",")
}

/// `SEMANTICS,...;FERRY-SPEC` for one end of a genie link over a ferry channel.
pub fn spec(sems: &[Semantics], ferry_spec: &str) -> String {
    format!("{};{ferry_spec}", names(sems))
}

/// `SEMANTICS,...;tcp:GROUP,FD` for one end of a genie link over a connected TCP socket:
/// the worker joins GROUP for a lot of its own and talks on the inherited socket FD.
pub fn tcp_spec(sems: &[Semantics], group: &str, fd: i32) -> String {
    format!("{};tcp:{group},{fd}", names(sems))
}

fn parse(spec: &str) -> Result<(Vec<Semantics>, &str)> {
    let (s, rest) = spec
        .split_once(';')
        .with_context(|| format!("genie spec {spec:?} lacks `SEMANTICS;`"))?;
    let sems = s
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if sems.is_empty() {
        bail!("genie spec {spec:?} names no semantics");
    }
    Ok((sems, rest))
}

/// The `trial` of a stamp or CPU sample: round and semantics together.
pub fn tag(round: u32, s: Semantics) -> u32 {
    round * Semantics::ALL.len() as u32 + s.index() as u32
}

/// The round and semantics of a stamp or CPU sample's `trial`.
pub fn untag(trial: u32) -> (u32, Semantics) {
    let n = Semantics::ALL.len() as u32;
    (trial / n, Semantics::ALL[(trial % n) as usize])
}

/// The `trial` of a counter sample: semantics, then the counter's index in [`COUNTERS`].
pub fn counter_tag(s: Semantics, counter: usize) -> u32 {
    (s.index() * COUNTERS.len() + counter) as u32
}

/// The semantics and counter index of a counter sample's `trial`.
pub fn counter_untag(trial: u32) -> (Semantics, usize) {
    let t = trial as usize;
    (Semantics::ALL[t / COUNTERS.len()], t % COUNTERS.len())
}

/// The semantics in the order round `round` runs them: rotated every round, so that no
/// semantics always runs right after another.
pub fn order(round: u32, sems: &[Semantics]) -> Vec<Semantics> {
    let k = round as usize % sems.len();
    sems[k..].iter().chain(&sems[..k]).copied().collect()
}

/// One block of the schedule: `warm` untimed messages, then `timed` timed ones, of one
/// semantics at one size in one round. Both workers walk the same blocks in the same order.
pub struct Block {
    pub round: u32,
    pub size: usize,
    pub s: Semantics,
    pub warm: u32,
    pub timed: u32,
}

/// The schedule: per size (smallest first), per round, every semantics in that round's order.
pub fn blocks(plan: &Plan, sems: &[Semantics]) -> Vec<Block> {
    let mut out = Vec::new();
    for (i, &size) in plan.sizes.iter().enumerate() {
        for round in 0..plan.trials {
            for s in order(round, sems) {
                out.push(Block {
                    round,
                    size,
                    s,
                    warm: plan.warmup.get(i).copied().unwrap_or(0),
                    timed: plan.msgs.get(i).copied().unwrap_or(1).max(1),
                });
            }
        }
    }
    out
}

/// A TCP link: the connected socket and the io_uring ring output goes through.
struct TcpLink(std::net::TcpStream, ferry::uring::Uring);

fn open_tcp(spec: &str) -> Result<(ferry::Domain, TcpLink)> {
    let (group, fd) = spec
        .split_once(',')
        .with_context(|| format!("bad tcp spec {spec:?}"))?;
    let fd = crate::sys::inherited_fd(fd.parse().context("socket fd")?)?;
    let domain = ferry::Group::open(group)?.join()?;
    let ring = ferry::uring::Uring::new(&ferry::uring::RingConfig::new(16))?;
    Ok((domain, TcpLink(std::net::TcpStream::from(fd), ring)))
}

pub fn run(args: &WorkerArgs, plan: &Plan) -> Result<Vec<Sample>> {
    let mut ack = Ack::open(
        args.ack.as_deref().context("--ack is required")?,
        Wait::Spin,
    )
    .context("opening the return pipe")?;
    // The thresholds of the calibration file the harness names (this run's); the
    // library's defaults without one.
    let thresholds = match &args.calibration {
        Some(path) => Some(
            Calibration::load(path)
                .with_context(|| format!("loading the calibration {}", path.display()))?
                .with_context(|| format!("no calibration file at {}", path.display()))?
                .thresholds,
        ),
        None => None,
    };
    let config = PassingConfig {
        thresholds,
        ..PassingConfig::default()
    };
    match args.role {
        Role::GenieSource => {
            let (sems, spec) = parse(args.tx.as_deref().context("--tx is required")?)?;
            if let Some(t) = spec.strip_prefix("tcp:") {
                let (domain, mut link) = open_tcp(t)?;
                let passing = Passing::new(&domain, config)?;
                return source(plan, &sems, &passing, Out::Tcp(&mut link), &mut ack);
            }
            let (domain, tx) = Ferry::open_tx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            source(plan, &sems, &passing, Out::Channel(&tx), &mut ack)
        }
        Role::GenieSink => {
            let (sems, spec) = parse(args.rx.as_deref().context("--rx is required")?)?;
            if let Some(t) = spec.strip_prefix("tcp:") {
                let (domain, mut link) = open_tcp(t)?;
                let passing = Passing::new(&domain, config)?;
                return sink(plan, &sems, &passing, In::Tcp(&mut link), &mut ack);
            }
            let (domain, mut rx) = Ferry::open_rx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            sink(plan, &sems, &passing, In::Channel(&mut rx), &mut ack)
        }
        r => bail!("{r:?} is not a genie role"),
    }
}

fn samples(b: &Block, stamps: Vec<u64>, cpu: Vec<u64>) -> [Sample; 2] {
    let sample = |kind, ns| Sample {
        kind,
        size: b.size,
        trial: tag(b.round, b.s),
        bytes: b.size as u64,
        ns,
        syscalls: None,
    };
    [
        sample(SampleKind::Stamp, stamps),
        sample(SampleKind::CpuTime, cpu),
    ]
}

/// Writes `seq` at the start of `buf` and one byte in every later page.
fn produce(buf: &mut [u8], seq: [u8; 8]) {
    buf[..8].copy_from_slice(&seq);
    for at in (4096..buf.len()).step_by(4096) {
        buf[at] = seq[0];
    }
}

/// The sequence number of message `i` of a block: unique over the run.
fn seq_of(b: &Block, i: u32) -> [u8; 8] {
    (u64::from(tag(b.round, b.s)) << 32 | u64::from(i)).to_ne_bytes()
}

/// What a source outputs from, per size.
enum Buffer {
    Bytes(Vec<u8>),
    App(AppBuffer),
    Sys,
}

/// Where a source outputs.
enum Out<'a> {
    Channel(&'a Sender),
    Tcp(&'a mut TcpLink),
}

/// Where a sink inputs from.
enum In<'a> {
    Channel(&'a mut Receiver),
    Tcp(&'a mut TcpLink),
}

fn source(
    plan: &Plan,
    sems: &[Semantics],
    passing: &Passing,
    mut out_to: Out<'_>,
    ack: &mut Ack,
) -> Result<Vec<Sample>> {
    let collect = |o: &Out<'_>| -> Result<()> {
        if let Out::Channel(tx) = o {
            tx.collect_releases()?;
        }
        Ok(())
    };
    let mut out = Vec::new();
    // Per size: each semantics' buffer, and its counters summed over its blocks.
    let mut size = None;
    let mut bufs: Vec<Option<Buffer>> = Vec::new();
    let mut sums = [[0u64; COUNTERS.len()]; Semantics::ALL.len()];
    let flush = |size: usize, sums: &mut [[u64; COUNTERS.len()]], out: &mut Vec<Sample>| {
        for &s in sems {
            for (j, v) in sums[s.index()].iter().enumerate() {
                out.push(Sample {
                    kind: SampleKind::Counter,
                    size,
                    trial: counter_tag(s, j),
                    bytes: *v,
                    ns: Vec::new(),
                    syscalls: None,
                });
            }
            sums[s.index()] = [0; COUNTERS.len()];
        }
    };
    for b in blocks(plan, sems) {
        let s = b.s;
        if size != Some(b.size) {
            if let Some(n) = size {
                flush(n, &mut sums, &mut out);
            }
            size = Some(b.size);
            // Drop the last size's buffers before making this size's.
            bufs.clear();
            for s in Semantics::ALL {
                bufs.push(if !sems.contains(&s) {
                    None
                } else {
                    Some(match s {
                        Semantics::Copy => Buffer::Bytes(vec![0x5a; b.size]),
                        Semantics::EmulatedCopy | Semantics::Share | Semantics::EmulatedShare => {
                            let mut a = passing.app_buffer(b.size)?;
                            a.as_mut_slice().fill(0x5a);
                            Buffer::App(a)
                        }
                        _ => Buffer::Sys,
                    })
                });
            }
        }
        let buf = bufs[s.index()].as_mut().context("a buffer per semantics")?;
        collect(&out_to)?;
        let before = counters(&passing.stats(), s);
        let (mut stamps, mut cpu) = (Vec::new(), Vec::new());
        for i in 0..b.warm + b.timed {
            let seq = seq_of(&b, i);
            // Untimed: take back what the sink released (TCOW unprotects here), then
            // write the message as an application would produce it: the sequence number,
            // and one byte in every page.
            collect(&out_to)?;
            let sys = match buf {
                Buffer::Bytes(v) => {
                    produce(v, seq);
                    None
                }
                Buffer::App(a) => {
                    produce(a.as_mut_slice(), seq);
                    None
                }
                Buffer::Sys => {
                    let mut a = passing.sys_buffer(b.size)?;
                    produce(
                        a.as_mut_slice()
                            .context("a fresh system buffer is writable")?,
                        seq,
                    );
                    Some(a)
                }
            };
            let c0 = thread_cpu_ns();
            let t0 = now_ns();
            match (&mut out_to, &*buf, sys) {
                (Out::Channel(tx), Buffer::Bytes(v), _) => passing.send_bytes(tx, v)?,
                (Out::Channel(tx), Buffer::App(a), _) => {
                    passing.send_app(tx, a, 0..b.size, s)?;
                }
                (Out::Channel(tx), Buffer::Sys, Some(a)) => {
                    passing.send_sys(tx, a, s)?;
                }
                (Out::Tcp(TcpLink(sock, _)), Buffer::Bytes(v), _) => {
                    passing.tcp_send_bytes(sock, v)?
                }
                (Out::Tcp(TcpLink(sock, ring)), Buffer::App(a), _) => {
                    passing.tcp_send_app(ring, sock, a, 0..b.size, s)?;
                }
                (Out::Tcp(TcpLink(sock, ring)), Buffer::Sys, Some(a)) => {
                    passing.tcp_send_sys(ring, sock, a, s)?;
                }
                (_, Buffer::Sys, None) => unreachable!("a system buffer is made above"),
            }
            let c1 = thread_cpu_ns();
            if i >= b.warm {
                stamps.push(t0);
                cpu.push(c1 - c0);
            }
            ack.wait().context("waiting for the sink")?;
        }
        out.extend(samples(&b, stamps, cpu));
        // This block's counters (the sink has released everything: ping-pong).
        collect(&out_to)?;
        let now = counters(&passing.stats(), s);
        let sum = &mut sums[s.index()];
        for (j, (a, was)) in now.iter().zip(before).enumerate() {
            // The last is a state (1: thresholds from the file), the rest counts.
            sum[j] = if j == COUNTERS.len() - 1 {
                *a
            } else {
                sum[j] + (a - was)
            };
        }
    }
    if let Some(n) = size {
        flush(n, &mut sums, &mut out);
    }
    Ok(out)
}

/// Spins until `rx` has a message queued; an error after a minute without one.
fn spin_until_queued(rx: &mut Receiver) -> Result<()> {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut n = 0u32;
    while !rx.has_message()? {
        n = n.wrapping_add(1);
        if n % 4096 == 0 && std::time::Instant::now() > give_up {
            bail!("no message from the source for a minute");
        }
        std::hint::spin_loop();
    }
    Ok(())
}

fn sink(
    plan: &Plan,
    sems: &[Semantics],
    passing: &Passing,
    mut from: In<'_>,
    ack: &mut Ack,
) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    let mut dst: Vec<u8> = Vec::new();
    for b in blocks(plan, sems) {
        let (s, size) = (b.s, b.size);
        let in_place_before = passing.stats().of(s).inputs_in_place;
        let page = crate::sys::vm::page();
        if dst.len() != size + 2 * page {
            // Free the last size's buffer before making this one: room for a page-aligned
            // start and any page offset from it.
            dst.clear();
            dst.shrink_to_fit();
            dst.resize(size + 2 * page, 0);
        }
        let base = dst.as_ptr().align_offset(page);
        let (mut stamps, mut cpu) = (Vec::new(), Vec::new());
        for i in 0..b.warm + b.timed {
            let want = seq_of(&b, i);
            // Over the channel, busy-poll until the message is queued (the sink owns its
            // CPU), so the input call below never sleeps: a wake-up of a sleeping process
            // costs tens of µs on a VM, unevenly, and the model has no term for it.
            // A call that never waits uses its wall time in CPU, so it is timed with the
            // monotonic clock: the thread CPU clock is a system call of ~0.3 µs, which
            // would sit inside the measured latency. Over TCP the sink blocks in `recv`.
            let cpu_clock: fn() -> u64 = match &mut from {
                In::Channel(rx) => {
                    spin_until_queued(rx)?;
                    now_ns
                }
                In::Tcp(_) => thread_cpu_ns,
            };
            let c0 = cpu_clock();
            let (t1, c1, got) = match s.allocator() {
                // Share and emulated share promise no integrity: over a channel the
                // sink reads the sender's pages in place.
                ferry::semantics::Allocator::Application
                    if in_place(s) && matches!(from, In::Channel(_)) =>
                {
                    let In::Channel(rx) = &mut from else {
                        unreachable!("matched above")
                    };
                    let b = passing.recv_in_place(rx, s)?;
                    let (t1, c1) = (now_ns(), cpu_clock());
                    if b.len() != size {
                        bail!("{s}: received {} bytes, expected {size}", b.len());
                    }
                    (t1, c1, header(s, std::slice::from_ref(&b))?)
                }
                ferry::semantics::Allocator::Application => {
                    let (n, at) = match &mut from {
                        In::Channel(rx) => {
                            // Input alignment, as an application that cares does it: the
                            // bytes land at the page offset they had in the sender's
                            // memory (`preferred_offset`), so that the copy's source and
                            // destination lie alike within their pages. (From data at
                            // offset 0 into a heap `Vec` 16 bytes into its page, an
                            // emulated copy converted to copy ran 1.09x copy at 256 KiB,
                            // whose `Vec` source lined up. Likely, not isolated: the copy
                            // then takes `copy_bytes`' backward path, which avoids glibc's
                            // 4 KiB-aliasing case but costs about 9% more there (its docs:
                            // 6.0 against 5.5 µs).)
                            let data = rx.recv()?;
                            let at = base + passing.preferred_offset(&data);
                            (passing.input_into(&data, s, &mut dst[at..at + size])?, at)
                        }
                        In::Tcp(TcpLink(sock, _)) => {
                            // A stream: read until the whole message is in.
                            let mut got = 0;
                            while got < size {
                                match passing.tcp_recv_into(sock, s, &mut dst[got..size])? {
                                    0 => bail!("{s}: the source closed the socket"),
                                    n => got += n,
                                }
                            }
                            (got, 0)
                        }
                    };
                    let (t1, c1) = (now_ns(), cpu_clock());
                    if n != size {
                        bail!("{s}: received {n} bytes, expected {size}");
                    }
                    (
                        t1,
                        c1,
                        <[u8; 8]>::try_from(&dst[at..at + 8]).expect("8 bytes"),
                    )
                }
                ferry::semantics::Allocator::System => {
                    // Over TCP a message may come in many buffers, each of its size
                    // class however few bytes the stream gave it: keep the first (it
                    // holds the header) and drop the rest once counted, or a 64 MiB
                    // message read in small pieces would exhaust the path's quota.
                    let mut bufs = Vec::new();
                    let mut got = 0;
                    while got < size {
                        let b = match &mut from {
                            In::Channel(rx) => passing.recv_sys(rx, s)?,
                            In::Tcp(TcpLink(sock, ring)) => {
                                passing.tcp_recv_sys(ring, sock, s, (size - got).min(TCP_CHUNK))?
                            }
                        };
                        if b.is_empty() {
                            bail!("{s}: the source closed the socket");
                        }
                        // It holds some of the header if fewer than 8 bytes came before it.
                        let before = got;
                        got += b.len();
                        if before < 8 {
                            bufs.push(b);
                        }
                    }
                    let (t1, c1) = (now_ns(), cpu_clock());
                    if got != size {
                        bail!("{s}: received {got} bytes, expected {size}");
                    }
                    (t1, c1, header(s, &bufs)?)
                }
            };
            if got != want {
                bail!(
                    "{s}: message {i} of round {} carried the wrong sequence number",
                    b.round
                );
            }
            if i >= b.warm {
                stamps.push(t1);
                cpu.push(c1 - c0);
            }
            ack.signal().context("signalling the source")?;
        }
        out.extend(samples(&b, stamps, cpu));
        out.push(Sample {
            kind: SampleKind::Counter,
            size,
            trial: counter_tag(s, IN_PLACE),
            bytes: passing.stats().of(s).inputs_in_place - in_place_before,
            ns: Vec::new(),
            syscalls: None,
        });
    }
    Ok(out)
}

/// Whether the sink inputs `s` in place over a channel though it is application-allocated
/// (share and emulated share: weak integrity allows it).
pub fn in_place(s: Semantics) -> bool {
    s.allocator() == ferry::semantics::Allocator::Application && s.integrity() == Integrity::Weak
}

/// The first 8 bytes of a message received as system buffers.
fn header(s: Semantics, bufs: &[ferry::semantics::SysBuffer]) -> Result<[u8; 8]> {
    let mut head = [0u8; 8];
    let mut at = 0;
    for b in bufs {
        let Some(v) = b.as_slice() else {
            bail!("{s}: a received system buffer in several fragments");
        };
        let k = v.len().min(8 - at);
        head[at..at + k].copy_from_slice(&v[..k]);
        at += k;
        if at == 8 {
            break;
        }
    }
    Ok(head)
}
