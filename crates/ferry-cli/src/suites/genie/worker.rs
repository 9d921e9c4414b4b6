//! The two processes of `ferry bench genie`: a source that outputs each message under one
//! semantics through [`ferry::semantics::Passing`], and a sink that inputs it under the
//! same semantics.
//!
//! Link-end specs are `SEMANTICS;FERRY-SPEC`: the semantics' kebab name, then the spec of
//! a ferry link ([`crate::transport::ferry`]). Ping-pong: the sink signals on the return
//! pipe once it has input a message and dropped it, and the source prepares the next
//! message (untimed: its sequence number and one byte in every page) only after that
//! signal. Both sides stamp `CLOCK_MONOTONIC`: the
//! source just before the output call, the sink just after the input call returns; the
//! harness subtracts them. Each side also reports its thread's CPU time in the call.
//! The source reports the semantics layer's counters per size, so that conversions to
//! copy, fallbacks and TCOW faults show in the report.

use anyhow::{bail, Context, Result};
use ferry::semantics::{
    AppBuffer, Passing, PassingConfig, Semantics, SemanticsStats, ThresholdSource,
};
use ferry::{Receiver, Sender};

use crate::protocol::{Plan, Role, Sample, SampleKind, Step, Wait, WorkerArgs};
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
    "tcow-faults",
    "tcow-pages-copied",
    "zc-sends",
    "zc-copied",
    "thresholds-from-file",
];

/// Reads `(outputs, converted, fallbacks, copied bytes, tcow protected, faults, copied)`
/// of semantics `s` from a stats snapshot.
fn counters(st: &SemanticsStats, s: Semantics) -> [u64; 10] {
    let c = &st.per[s.index()];
    [
        c.outputs,
        c.converted_to_copy,
        c.total_fallbacks(),
        c.copied_bytes,
        st.tcow_pages_protected,
        st.tcow_faults,
        st.tcow_pages_copied,
        st.zc_sends,
        st.zc_copied,
        u64::from(st.threshold_source == ThresholdSource::CalibrationFile),
    ]
}

/// `SEMANTICS;FERRY-SPEC` for one end of a genie link over a ferry channel.
pub fn spec(s: Semantics, ferry_spec: &str) -> String {
    format!("{};{ferry_spec}", s.name())
}

/// `SEMANTICS;tcp:GROUP,FD` for one end of a genie link over a connected TCP socket: the
/// worker joins GROUP for a lot of its own and talks on the inherited socket FD.
pub fn tcp_spec(s: Semantics, group: &str, fd: i32) -> String {
    format!("{};tcp:{group},{fd}", s.name())
}

fn parse(spec: &str) -> Result<(Semantics, &str)> {
    let (s, rest) = spec
        .split_once(';')
        .with_context(|| format!("genie spec {spec:?} lacks `SEMANTICS;`"))?;
    Ok((s.parse()?, rest))
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
    // The library reads the thresholds from the calibration file the harness names in
    // FERRY_CALIBRATION (this run's), and says so in its stats.
    let config = PassingConfig::default();
    match args.role {
        Role::GenieSource => {
            let (s, spec) = parse(args.tx.as_deref().context("--tx is required")?)?;
            if let Some(t) = spec.strip_prefix("tcp:") {
                let (domain, mut link) = open_tcp(t)?;
                let passing = Passing::new(&domain, config)?;
                return source(plan, s, &passing, Out::Tcp(&mut link), &mut ack);
            }
            let (domain, tx) = Ferry::open_tx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            source(plan, s, &passing, Out::Channel(&tx), &mut ack)
        }
        Role::GenieSink => {
            let (s, spec) = parse(args.rx.as_deref().context("--rx is required")?)?;
            if let Some(t) = spec.strip_prefix("tcp:") {
                let (domain, mut link) = open_tcp(t)?;
                let passing = Passing::new(&domain, config)?;
                return sink(plan, s, &passing, In::Tcp(&mut link), &mut ack);
            }
            let (domain, mut rx) = Ferry::open_rx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            sink(plan, s, &passing, In::Channel(&mut rx), &mut ack)
        }
        r => bail!("{r:?} is not a genie role"),
    }
}

fn samples(step: &Step, stamps: Vec<u64>, cpu: Vec<u64>) -> [Sample; 2] {
    let sample = |kind, ns| Sample {
        kind,
        size: step.size,
        trial: step.trial,
        bytes: step.size as u64,
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
    s: Semantics,
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
    let mut current: Option<(usize, Buffer)> = None;
    let mut before = counters(&passing.stats(), s);
    let steps: Vec<Step> = plan.steps().collect();
    for (k, step) in steps.iter().enumerate() {
        let size = step.size;
        if current.as_ref().map_or(true, |(n, _)| *n != size) {
            let b = match s {
                Semantics::Copy => Buffer::Bytes(vec![0x5a; size]),
                Semantics::EmulatedCopy | Semantics::Share | Semantics::EmulatedShare => {
                    let mut b = passing.app_buffer(size)?;
                    b.as_mut_slice().fill(0x5a);
                    Buffer::App(b)
                }
                _ => Buffer::Sys,
            };
            current = Some((size, b));
        }
        let buf = &mut current.as_mut().expect("set above").1;
        let (mut stamps, mut cpu) = (Vec::new(), Vec::new());
        for i in 0..step.total() {
            let seq = (u64::from(step.trial) << 32 | u64::from(i)).to_ne_bytes();
            // Untimed: take back what the sink released (TCOW unprotects here), then
            // write the message as an application would produce it: the sequence number,
            // and one byte in every page.
            collect(&out_to)?;
            let sys = match buf {
                Buffer::Bytes(v) => {
                    produce(v, seq);
                    None
                }
                Buffer::App(b) => {
                    produce(b.as_mut_slice(), seq);
                    None
                }
                Buffer::Sys => {
                    let mut b = passing.sys_buffer(size)?;
                    produce(
                        b.as_mut_slice()
                            .context("a fresh system buffer is writable")?,
                        seq,
                    );
                    Some(b)
                }
            };
            let c0 = thread_cpu_ns();
            let t0 = now_ns();
            match (&mut out_to, &*buf, sys) {
                (Out::Channel(tx), Buffer::Bytes(v), _) => passing.send_bytes(tx, v)?,
                (Out::Channel(tx), Buffer::App(b), _) => {
                    passing.send_app(tx, b, 0..size, s)?;
                }
                (Out::Channel(tx), Buffer::Sys, Some(b)) => {
                    passing.send_sys(tx, b, s)?;
                }
                (Out::Tcp(TcpLink(sock, _)), Buffer::Bytes(v), _) => {
                    passing.tcp_send_bytes(sock, v)?
                }
                (Out::Tcp(TcpLink(sock, ring)), Buffer::App(b), _) => {
                    passing.tcp_send_app(ring, sock, b, 0..size, s)?;
                }
                (Out::Tcp(TcpLink(sock, ring)), Buffer::Sys, Some(b)) => {
                    passing.tcp_send_sys(ring, sock, b, s)?;
                }
                (_, Buffer::Sys, None) => unreachable!("a system buffer is made above"),
            }
            let c1 = thread_cpu_ns();
            if i >= step.warmup {
                stamps.push(t0);
                cpu.push(c1 - c0);
            }
            ack.wait().context("waiting for the sink")?;
        }
        out.extend(samples(step, stamps, cpu));
        // Counters per size, once its last trial is done.
        if steps.get(k + 1).map_or(true, |n| n.size != size) {
            collect(&out_to)?;
            let now = counters(&passing.stats(), s);
            for (j, (a, b)) in now.iter().zip(before).enumerate() {
                out.push(Sample {
                    kind: SampleKind::Counter,
                    size,
                    trial: j as u32,
                    // The last is a state (1: thresholds from the file), the rest counts.
                    bytes: if j == COUNTERS.len() - 1 { *a } else { a - b },
                    ns: Vec::new(),
                    syscalls: None,
                });
            }
            before = now;
        }
    }
    Ok(out)
}

fn sink(
    plan: &Plan,
    s: Semantics,
    passing: &Passing,
    mut from: In<'_>,
    ack: &mut Ack,
) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    let mut dst: Vec<u8> = Vec::new();
    for step in plan.steps() {
        let size = step.size;
        if dst.len() != size {
            dst = vec![0u8; size];
        }
        let (mut stamps, mut cpu) = (Vec::new(), Vec::new());
        for i in 0..step.total() {
            let want = (u64::from(step.trial) << 32 | u64::from(i)).to_ne_bytes();
            let c0 = thread_cpu_ns();
            let (t1, c1, got) = match s.allocator() {
                ferry::semantics::Allocator::Application => {
                    let n = match &mut from {
                        In::Channel(rx) => passing.recv_into(rx, s, &mut dst)?,
                        In::Tcp(TcpLink(sock, _)) => {
                            // A stream: read until the whole message is in.
                            let mut got = 0;
                            while got < size {
                                match passing.tcp_recv_into(sock, s, &mut dst[got..])? {
                                    0 => bail!("{s}: the source closed the socket"),
                                    n => got += n,
                                }
                            }
                            got
                        }
                    };
                    let (t1, c1) = (now_ns(), thread_cpu_ns());
                    if n != size {
                        bail!("{s}: received {n} bytes, expected {size}");
                    }
                    (t1, c1, <[u8; 8]>::try_from(&dst[..8]).expect("8 bytes"))
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
                    let (t1, c1) = (now_ns(), thread_cpu_ns());
                    if got != size {
                        bail!("{s}: received {got} bytes, expected {size}");
                    }
                    let mut head = [0u8; 8];
                    let mut at = 0;
                    for b in &bufs {
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
                    (t1, c1, head)
                }
            };
            if got != want {
                bail!(
                    "{s}: message {i} of trial {} carried the wrong sequence number",
                    step.trial
                );
            }
            if i >= step.warmup {
                stamps.push(t1);
                cpu.push(c1 - c0);
            }
            ack.signal().context("signalling the source")?;
        }
        out.extend(samples(&step, stamps, cpu));
    }
    Ok(out)
}
