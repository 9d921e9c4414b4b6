//! The two processes of `ferry bench genie`: a source that outputs each message under one
//! semantics through [`ferry::semantics::Passing`], and a sink that inputs it under the
//! same semantics.
//!
//! Endpoint specs are `SEMANTICS;FERRY-SPEC`: the semantics' kebab name, then the spec of
//! a ferry link ([`crate::transport::ferry`]). Ping-pong: the sink signals on the return
//! pipe once it has input a message and dropped it, and the source prepares the next
//! message (untimed: its sequence number and one byte in every page) only after that
//! signal. Both sides stamp `CLOCK_MONOTONIC`: the
//! source just before the output call, the sink just after the input call returns; the
//! harness subtracts them. Each side also reports its thread's CPU time in the call.
//! The source reports the semantics layer's counters per size, so that conversions to
//! copy, fallbacks and TCOW faults show in the report.

use anyhow::{bail, Context, Result};
use ferry::semantics::{AppBuffer, Passing, PassingConfig, Semantics, SemanticsStats};
use ferry::{Receiver, Sender};

use crate::protocol::{Plan, Role, Sample, SampleKind, Step, Wait, WorkerArgs};
use crate::sys::{now_ns, thread_cpu_ns};
use crate::transport::ack::Ack;
use crate::transport::ferry::Ferry;
use crate::transport::Transport;

/// The counters a source reports per size, in the order of their `trial` index.
pub const COUNTERS: &[&str] = &[
    "outputs",
    "converted-to-copy",
    "fallbacks",
    "copied-bytes",
    "tcow-pages-protected",
    "tcow-faults",
    "tcow-pages-copied",
];

/// Reads `(outputs, converted, fallbacks, copied bytes, tcow protected, faults, copied)`
/// of semantics `s` from a stats snapshot.
fn counters(st: &SemanticsStats, s: Semantics) -> [u64; 7] {
    let c = &st.per[s.index()];
    [
        c.outputs,
        c.converted_to_copy,
        c.total_fallbacks(),
        c.copied_bytes,
        st.tcow_pages_protected,
        st.tcow_faults,
        st.tcow_pages_copied,
    ]
}

/// `SEMANTICS;FERRY-SPEC` for one end of a genie link.
pub fn spec(s: Semantics, ferry_spec: &str) -> String {
    format!("{};{ferry_spec}", s.name())
}

fn parse(spec: &str) -> Result<(Semantics, &str)> {
    let (s, rest) = spec
        .split_once(';')
        .with_context(|| format!("genie spec {spec:?} lacks `SEMANTICS;`"))?;
    Ok((s.parse()?, rest))
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
            let (domain, tx) = Ferry::open_tx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            source(plan, s, &passing, &tx, &mut ack)
        }
        Role::GenieSink => {
            let (s, spec) = parse(args.rx.as_deref().context("--rx is required")?)?;
            let (domain, mut rx) = Ferry::open_rx(spec, Wait::Block)?.into_parts();
            let passing = Passing::new(&domain, config)?;
            sink(plan, s, &passing, &mut rx, &mut ack)
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

fn source(
    plan: &Plan,
    s: Semantics,
    passing: &Passing,
    tx: &Sender,
    ack: &mut Ack,
) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    let mut current: Option<(usize, Buffer)> = None;
    let mut before = counters(&passing.stats(), s);
    let steps: Vec<Step> = plan.steps().collect();
    for (k, step) in steps.iter().enumerate() {
        let size = step.size;
        if current.as_ref().is_none_or(|(n, _)| *n != size) {
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
            tx.collect_releases()?;
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
            match (&*buf, sys) {
                (Buffer::Bytes(v), _) => passing.send_bytes(tx, v)?,
                (Buffer::App(b), _) => {
                    passing.send_app(tx, b, 0..size, s)?;
                }
                (Buffer::Sys, Some(b)) => {
                    passing.send_sys(tx, b, s)?;
                }
                (Buffer::Sys, None) => unreachable!("made above"),
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
        if steps.get(k + 1).is_none_or(|n| n.size != size) {
            tx.collect_releases()?;
            let now = counters(&passing.stats(), s);
            for (j, (a, b)) in now.iter().zip(before).enumerate() {
                out.push(Sample {
                    kind: SampleKind::Counter,
                    size,
                    trial: j as u32,
                    bytes: a - b,
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
    rx: &mut Receiver,
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
                    let n = passing.recv_into(rx, s, &mut dst)?;
                    let (t1, c1) = (now_ns(), thread_cpu_ns());
                    if n != size {
                        bail!("{s}: received {n} bytes, expected {size}");
                    }
                    (t1, c1, <[u8; 8]>::try_from(&dst[..8]).expect("8 bytes"))
                }
                ferry::semantics::Allocator::System => {
                    let b = passing.recv_sys(rx, s)?;
                    let (t1, c1) = (now_ns(), thread_cpu_ns());
                    if b.len() != size {
                        bail!("{s}: received {} bytes, expected {size}", b.len());
                    }
                    let head = match b.as_slice() {
                        Some(v) => <[u8; 8]>::try_from(&v[..8]).expect("8 bytes"),
                        None => bail!("{s}: a received system buffer in several fragments"),
                    };
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
