//! `ferry-bench services`: publish-subscribe fan-out, ferry against iceoryx2 0.10, with
//! 1, 2, 4 and 8 subscribers in another process and payloads of 64 B, 64 KiB and 1 MiB,
//! in one run of interleaved rounds, each round with its own cross-CPU cache-line probe.
//!
//! The publisher (this process, pinned to the first CPU) offers a ferry service and an
//! iceoryx2 service, both blocking when a queue is full, with queues of [`DEPTH`]. The
//! subscribers are N ferry and N iceoryx2 subscribers of one other process
//! ([`sub`], pinned to the second CPU) that busy-polls them in turn (only the subscribers
//! of the system whose bursts run), reads each message's header and drops it at once, so
//! releases flow back as in a real consumer. Three
//! systems publish in every round, in an order rotated from round to round: ferry's
//! [`Publisher::loan`] (loan, write, send), ferry's general [`Publisher::publish`] of an
//! [`IoData`] allocated from a path and written, and iceoryx2's loan, write, send. At
//! sizes of [`ferry::SHARE_HUGE_FROM`] and up a fourth, ferry's loan from a path of the
//! other pages ([`Publisher::loan_from`]; transparent huge pages where the loan's own
//! path has 4 KiB pages), says what the pages change; the report names both paths' pages.
//! Every message is written one byte per page, with a header (sequence number and burst)
//! that the subscribers check.
//!
//! Measured, per round, size and system: the publish call (the send alone: two clock
//! reads around it, their own cost measured once and taken off), median and p99 over
//! every call of the round's bursts; and the burst time to the last subscriber, from just
//! before the first message is written until the last subscriber has the last one
//! (stamped by the subscriber process). A burst ([`BURST`] messages, what a queue holds)
//! starts with every queue drained. Each round begins with the probe: one cache line
//! bounced between the two processes, half the round trip. On a VM whose two vCPUs land
//! either near each other or far apart, the probe says which placement the round had
//! (far above [`FAR_US`]), and every ratio is reported per placement: the median over
//! that placement's rounds of the per-round ratio. "Per added subscriber" is the slope
//! of a least-squares line through the medians of one placement and size against N.
//!
//! A last point prices ferry's drop policy's eviction: one subscriber, stopped (SIGSTOP)
//! with its queue full, so that every publish first takes back the oldest queued message
//! before it queues the new one.

mod ice;
mod report;
pub mod sub;

use std::process::{Child, Command};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry::{Group, IoData, Pages, PathConfig, Publisher, ServiceConfig, SlowSubscriber};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::stats::{median, Summary};
use crate::harness::BenchDef;
use crate::sys::{self, now_ns, LinesFile};
use sub::{
    ACTIVE, ACTIVE_FERRY, ACTIVE_ICE, CTL, DONE, FAILED, LINES, PING, PONG, PROBING, READY, STOP,
};

pub const BENCH: BenchDef = BenchDef {
    name: "services",
    about: "publish-subscribe fan-out to 1..8 subscribers (another process), ferry vs iceoryx2, interleaved rounds, per placement",
    run,
};

pub use sub::main as drain_main;

const SIZES: &[usize] = &[64, 64 << 10, 1 << 20];
const SUBS: &[usize] = &[1, 2, 4, 8];
/// Each subscriber's queue, both systems.
pub const DEPTH: usize = 32;
/// Messages per burst: what a queue holds, so that a burst from drained queues never
/// waits for room.
pub const BURST: usize = DEPTH;
/// The untimed pause between two fills of [`Block::fill_floor`] (ns): about what one
/// message's messaging takes in a burst.
const FILL_GAP_NS: u64 = 500;
/// A cache line: how far apart [`Block::fill_floor`] may start two fbufs' payloads.
const LINE: usize = 64;
/// Above this one-way cache-line time (µs) a round counts as "far".
pub const FAR_US: f64 = 0.17;
/// The bars.
pub const BAR_CALL: f64 = 0.8;
pub const BAR_BURST: f64 = 0.8;
pub const BAR_TAIL: f64 = 2.0;

/// The systems, in the order of round 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// ferry's `Publisher::loan`, written, `PublisherLoan::send`.
    Loan,
    /// The same from a path of the other pages than the loan's own (4 KiB pages if the
    /// loans' are transparent huge pages, and the reverse): `Publisher::loan_from`. Only
    /// at sizes of [`ferry::SHARE_HUGE_FROM`] and up, where the two differ.
    LoanAlt,
    /// ferry's `Publisher::publish` of an `IoData` from a path.
    Publish,
    /// iceoryx2's loan, written, send.
    Ice,
}

pub const SYSTEMS: [System; 4] = [System::Loan, System::LoanAlt, System::Publish, System::Ice];

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Loan => "ferry loan",
            System::LoanAlt => "ferry loan alt",
            System::Publish => "ferry publish",
            System::Ice => "iceoryx2",
        }
    }
}

/// One round's measurement of one system at one subscriber count and size.
#[derive(Debug, Clone)]
pub struct Point {
    pub subs: usize,
    pub size: usize,
    pub sys: System,
    /// The round (numbered across subscriber counts).
    pub round: usize,
    /// The round's cache-line probe: one-way, µs.
    pub floor: f64,
    /// Publish calls, µs.
    pub call: Summary,
    /// Median burst time to the last subscriber, µs.
    pub burst: f64,
    /// The round's fill floor at this size (the same for every system): the median time
    /// of a burst's writes alone into one fbuf, µs (see [`Block::fill_floor`]).
    pub fill: f64,
    /// The same into two fbufs in turn, µs.
    pub fill2: f64,
    /// The same into two fbufs in turn whose payloads start a cache line apart (the
    /// second 64 bytes into its span), µs: what the two-fbuf pattern costs without
    /// page-aligned payloads.
    pub fill2_skewed: f64,
}

impl Point {
    pub fn far(&self) -> bool {
        self.floor > FAR_US
    }
}

pub struct Measured {
    pub points: Vec<Point>,
    pub rounds: usize,
    pub bursts: usize,
    pub subs: Vec<usize>,
    pub sizes: Vec<usize>,
    /// The clock reads' own cost taken off each call, µs.
    pub clock: f64,
    /// Drop policy's eviction, µs per publish.
    pub evict: Vec<f64>,
    /// `uptime`'s load average when the run started.
    pub load: String,
    /// What pages back `Publisher::loan`'s fbufs, and `LoanAlt`'s.
    pub loan_pages: Pages,
    pub alt_pages: Pages,
    /// 2 MiB spans the loans' path of transparent huge pages (the publisher's own or the
    /// other) collapsed by the end of the last block (the most subscribers).
    pub collapsed: u64,
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let sizes = ctx.pick(SIZES, SIZES).to_vec();
    let subs_list = ctx.pick(SUBS, SUBS).to_vec();
    let rounds = ctx.pick(8, 40);
    let bursts = ctx.pick(2, 6);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let name = format!("bench-services-{}", std::process::id());
    let group = Group::open(&name)?;
    let domain = group.join()?;
    sys::pin_to(ctx.cpu(0))?;
    let clock = clock_cost();
    let mut points = Vec::new();
    let mut pages = (Pages::Normal, Pages::Normal);
    let mut collapsed = 0;
    for (k, &n) in subs_list.iter().enumerate() {
        ctx.progress.phase(&format!(
            "services: ferry and iceoryx2 to {n} subscribers, {rounds} rounds"
        ));
        let mut b = Block::start(ctx, &name, &domain, n, &sizes)?;
        pages = (b.publisher.path().stats().pages, b.alt_path.stats().pages);
        for r in 0..rounds {
            let round = k * rounds + r;
            let floor = b.probe(ctx.pick(100, 300))?;
            for &size in &sizes {
                let rot = round % SYSTEMS.len();
                for &sys in SYSTEMS[rot..].iter().chain(&SYSTEMS[..rot]) {
                    if sys == System::LoanAlt && size < ferry::SHARE_HUGE_FROM {
                        continue;
                    }
                    let (calls, times) = b.bursts(sys, size, 1 + bursts, clock)?;
                    points.push(Point {
                        subs: n,
                        size,
                        sys,
                        round,
                        floor,
                        call: Summary::of(&calls),
                        burst: median(&times),
                        fill: f64::NAN,
                        fill2: f64::NAN,
                        fill2_skewed: f64::NAN,
                    });
                }
                let fill = b.fill_floor(size, 1, 0, 1 + bursts, clock)?;
                let fill2 = b.fill_floor(size, 2, 0, 1 + bursts, clock)?;
                let fill2_skewed = b.fill_floor(size, 2, LINE, 1 + bursts, clock)?;
                for p in points
                    .iter_mut()
                    .rev()
                    .take_while(|p| p.round == round && p.size == size)
                {
                    p.fill = fill;
                    p.fill2 = fill2;
                    p.fill2_skewed = fill2_skewed;
                }
            }
        }
        collapsed = [b.publisher.path(), &b.alt_path]
            .iter()
            .map(|p| p.stats())
            .find(|s| s.pages == Pages::Transparent)
            .map_or(0, |s| s.collapsed);
        b.finish()?;
    }
    ctx.progress
        .phase("services: publish to a stopped subscriber (drop policy)");
    let path = domain.path(PathConfig::default())?;
    let evict = evicting(ctx, &name, &domain, &path, ctx.pick(10, 100))?;
    let m = Measured {
        points,
        rounds,
        bursts,
        subs: subs_list,
        sizes,
        clock: clock as f64 / 1000.0,
        evict,
        load,
        loan_pages: pages.0,
        alt_pages: pages.1,
        collapsed,
    };
    Ok(report::output(ctx, &m))
}

/// The median cost of the two clock reads around a call (ns).
fn clock_cost() -> u64 {
    let mut v: Vec<u64> = (0..2000)
        .map(|_| {
            let a = now_ns();
            now_ns() - a
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Both systems' publishers to N subscribers, and the subscriber process.
struct Block {
    publisher: Publisher,
    path: ferry::PathAllocator,
    alt_path: ferry::PathAllocator,
    ice: ice::Pub,
    lines: LinesFile,
    child: Drain,
    subs: usize,
    ferry_seq: u64,
    ice_seq: u64,
    burst: u64,
    ping: u64,
}

impl Block {
    fn start(
        ctx: &BenchCtx,
        group: &str,
        domain: &ferry::Domain,
        n: usize,
        sizes: &[usize],
    ) -> Result<Block> {
        let service = format!("bench/fan{n}");
        let config = ServiceConfig {
            depth: DEPTH as u32,
            slow: SlowSubscriber::Block,
            ..ServiceConfig::default()
        };
        let publisher = Publisher::offer(domain, &service, config)?;
        let ice_name = format!("ferry-bench-services-{}-{n}", std::process::id());
        let ice = ice::Pub::create(&ice_name, n, sizes, DEPTH)?;
        let lines = LinesFile::create(&format!("services-{}-{n}", std::process::id()), LINES)?;
        let child = Drain(
            Command::new(std::env::current_exe()?)
                .args(["__drain", group, &service, &n.to_string()])
                .arg(ctx.cpu(1).to_string())
                .arg(&lines.path)
                .args([
                    ice_name.as_str(),
                    &sizes.len().to_string(),
                    &DEPTH.to_string(),
                ])
                .spawn()
                .context("spawning the subscriber process")?,
        );
        let alt = match publisher.path().stats().pages {
            Pages::Transparent => Pages::Normal,
            _ => Pages::Transparent,
        };
        let b = Block {
            alt_path: domain.path(PathConfig {
                pages: Some(alt),
                ..PathConfig::default()
            })?,
            publisher,
            path: domain.path(PathConfig::default())?,
            ice,
            lines,
            child,
            subs: n,
            ferry_seq: 0,
            ice_seq: 0,
            burst: 0,
            ping: 0,
        };
        b.spin("the subscriber process", || {
            b.lines.lines.word(CTL, READY).load(Acquire) != 0
        })?;
        b.publisher
            .wait_for_subscribers(n, Duration::from_secs(30))?;
        Ok(b)
    }

    /// Spins until `done`, failing if the subscriber process failed or 30 s passed.
    fn spin(&self, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
        let start = Instant::now();
        let mut i = 0u32;
        while !done() {
            i = i.wrapping_add(1);
            if i % 4096 == 0 {
                if self.lines.lines.word(CTL, FAILED).load(Acquire) != 0 {
                    bail!("the subscriber process failed while we waited for {what}");
                }
                if start.elapsed() > Duration::from_secs(30) {
                    bail!("waited 30 s for {what}");
                }
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// The cache-line probe: half the median round trip of one line, µs.
    fn probe(&mut self, msgs: usize) -> Result<f64> {
        let l = &self.lines.lines;
        l.word(PING, PROBING).store(1, Release);
        let mut half = Vec::with_capacity(msgs);
        for i in 0..msgs + 10 {
            self.ping += 1;
            let v = self.ping;
            let t0 = now_ns();
            l.word(PING, 0).store(v, Release);
            self.spin("the probe's pong", || l.word(PONG, 0).load(Acquire) == v)?;
            let t1 = now_ns();
            if i >= 10 {
                half.push((t1 - t0) as f64 / 2000.0);
            }
        }
        l.word(PING, PROBING).store(0, Release);
        Ok(median(&half))
    }

    /// `count` bursts of `sys` at `size`, the first untimed: (every timed call's
    /// duration, each timed burst's time to the last subscriber), µs.
    fn bursts(
        &mut self,
        sys: System,
        size: usize,
        count: usize,
        clock: u64,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let mut calls = Vec::with_capacity(count * BURST);
        let mut times = Vec::with_capacity(count);
        // Every queue is drained (the last burst's last message was taken): from here on
        // the subscriber process polls only this system's subscribers.
        let active = match sys {
            System::Loan | System::LoanAlt | System::Publish => ACTIVE_FERRY,
            System::Ice => ACTIVE_ICE,
        };
        self.lines.lines.word(CTL, ACTIVE).store(active, Release);
        for k in 0..count {
            self.burst += 1;
            let burst = self.burst;
            let t0 = now_ns();
            for i in 0..BURST {
                let last = i + 1 == BURST;
                let ns = self.one(sys, size, burst, last)?;
                if k > 0 {
                    calls.push(ns.saturating_sub(clock) as f64 / 1000.0);
                }
            }
            let l = &self.lines.lines;
            self.spin("the burst's last message", || {
                l.word(DONE, 0).load(Acquire) == burst
            })?;
            let t1 = l.word(DONE, 1).load(Relaxed);
            if k > 0 {
                times.push(t1.saturating_sub(t0) as f64 / 1000.0);
            }
        }
        Ok((calls, times))
    }

    /// One message: written, then published; the publish call's duration (ns).
    fn one(&mut self, sys: System, size: usize, burst: u64, last: bool) -> Result<u64> {
        let n = self.subs;
        let (ns, got) = match sys {
            System::Loan => {
                let mut loan = self.publisher.loan(size)?;
                fill(loan.as_mut_slice(), self.ferry_seq, burst, last);
                self.ferry_seq += 1;
                let t0 = now_ns();
                let got = loan.send()?;
                (now_ns() - t0, got)
            }
            System::LoanAlt => {
                let mut loan = self.publisher.loan_from(&self.alt_path, size)?;
                fill(loan.as_mut_slice(), self.ferry_seq, burst, last);
                self.ferry_seq += 1;
                let t0 = now_ns();
                let got = loan.send()?;
                (now_ns() - t0, got)
            }
            System::Publish => {
                let mut m = self.path.alloc(size)?;
                let s = m
                    .fragments_mut()
                    .next()
                    .context("an fbuf from a path is one run")?;
                fill(s, self.ferry_seq, burst, last);
                self.ferry_seq += 1;
                let d: IoData = m.freeze();
                let t0 = now_ns();
                let got = self.publisher.publish(&d)?;
                (now_ns() - t0, got)
            }
            System::Ice => {
                let (seq, ice) = (self.ice_seq, &mut self.ice);
                self.ice_seq += 1;
                (ice.publish(size, |b| fill(b, seq, burst, last))?, n)
            }
        };
        if got != n {
            bail!("{}: delivered to {got} subscribers, not {n}", sys.name());
        }
        Ok(ns)
    }

    /// The fill floor: `count` times (the first untimed) a burst's writes with no
    /// messaging, [`BURST`] messages' worth of [`fill`] into `bufs` fbufs of the loans'
    /// path in turn, each fill followed by a SeqCst fence, the sum of those fills' times
    /// (less the clock reads' own cost `clock`, ns); the median, µs. A burst from
    /// drained queues takes one or two buffers in turn, in both systems (the one
    /// released last comes back): one fbuf refilled is the cheaper pattern (its lines
    /// are still in the caches), so one fbuf gives the floor, two say what the other
    /// pattern costs. Both systems' sends start with a locked instruction (ferry's
    /// record of the message, iceoryx2's used-chunk swap) that waits for the fill's
    /// stores to drain, so the fence's wait is part of what each message costs. Between
    /// two fills the loop spins [`FILL_GAP_NS`] untimed, as a burst's messaging spaces
    /// its fills (back to back, each fill costs more: the dirty lines of the last one
    /// are still on their way out).
    ///
    /// With `skew` > 0, fbuf `j`'s payload starts `j * skew` bytes into an fbuf of
    /// `size + 4096` bytes instead of at its first (page-aligned) byte: the layout of a
    /// system whose buffers are not page-aligned (iceoryx2's chunks are a payload and a
    /// 48-byte header apart), whose fills then land in other cache sets.
    fn fill_floor(
        &mut self,
        size: usize,
        bufs: usize,
        skew: usize,
        count: usize,
        clock: u64,
    ) -> Result<f64> {
        let path = self.publisher.path().clone();
        let span = if skew > 0 { size + 4096 } else { size };
        let mut fbufs = (0..bufs)
            .map(|_| path.alloc(span))
            .collect::<ferry::Result<Vec<_>>>()?;
        let mut times = Vec::with_capacity(count);
        for k in 0..count {
            let mut sum = 0;
            for i in 0..BURST {
                let gap = now_ns() + FILL_GAP_NS;
                while now_ns() < gap {
                    std::hint::spin_loop();
                }
                let j = i % bufs;
                let s = fbufs[j]
                    .fragments_mut()
                    .next()
                    .context("an fbuf from a path is one run")?;
                let s = &mut s[j * skew..j * skew + size];
                let t0 = now_ns();
                fill(s, i as u64, 0, false);
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                sum += (now_ns() - t0).saturating_sub(clock);
            }
            if k > 0 {
                times.push(sum as f64 / 1000.0);
            }
        }
        Ok(median(&times))
    }

    fn finish(mut self) -> Result<()> {
        self.lines.lines.word(CTL, STOP).store(1, Release);
        drop(self.publisher);
        self.child.wait()
    }
}

/// The payload touched: one byte per page, then the header.
fn fill(s: &mut [u8], seq: u64, burst: u64, last: bool) {
    for at in (4096..s.len()).step_by(4096) {
        s[at] = seq as u8 | 1;
    }
    sub::write_header(s, seq, burst, last);
}

/// Per-publish times (µs, one per burst) under the drop policy with one subscriber
/// stopped and its queue full, so that every publish evicts.
fn evicting(
    ctx: &BenchCtx,
    group: &str,
    domain: &ferry::Domain,
    path: &ferry::PathAllocator,
    rounds: usize,
) -> Result<Vec<f64>> {
    const EVICT_DEPTH: u32 = 256;
    const EVICT_BURST: usize = 200;
    let service = "bench/evict";
    let config = ServiceConfig {
        depth: EVICT_DEPTH,
        slow: SlowSubscriber::Drop,
        ..ServiceConfig::default()
    };
    let mut publisher = Publisher::offer(domain, service, config)?;
    let mut child = Drain(
        Command::new(std::env::current_exe()?)
            .args(["__drain", group, service, "1"])
            .arg(ctx.cpu(1).to_string())
            .spawn()
            .context("spawning the subscriber process")?,
    );
    publisher.wait_for_subscribers(1, Duration::from_secs(30))?;
    let pid = rustix::process::Pid::from_raw(child.0.id() as i32).context("child pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::STOP)?;
    let data = touched(path, 64)?;
    // Fill its queue (it may have taken a few before it stopped).
    while publisher.stats().dropped == 0 {
        publisher.publish(&data)?;
    }
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds + 5 {
        let before = publisher.stats().dropped;
        let t0 = Instant::now();
        for _ in 0..EVICT_BURST {
            publisher.publish(&data)?;
        }
        let dt = t0.elapsed();
        anyhow::ensure!(
            publisher.stats().dropped - before == EVICT_BURST as u64,
            "a publish to a full queue did not evict"
        );
        if round >= 5 {
            samples.push(dt.as_secs_f64() * 1e6 / EVICT_BURST as f64);
        }
    }
    rustix::process::kill_process(pid, rustix::process::Signal::CONT)?;
    drop(publisher);
    child.wait()?;
    Ok(samples)
}

/// A frozen message of `size` bytes with one byte written per page.
fn touched(path: &ferry::PathAllocator, size: usize) -> Result<IoData> {
    let mut m = path.alloc(size)?;
    for at in (0..size).step_by(4096) {
        m.write_at(at, &[at as u8 | 1]);
    }
    Ok(m.freeze())
}

/// The subscriber process, killed if the run fails before it ends by itself.
struct Drain(Child);

impl Drain {
    fn wait(&mut self) -> Result<()> {
        let st = self.0.wait()?;
        anyhow::ensure!(st.success(), "the subscriber process failed: {st}");
        Ok(())
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
