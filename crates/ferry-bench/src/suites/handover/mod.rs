//! `ferry-bench handover`: ferry's one-way hand-over against iceoryx2 0.10 and against
//! the cross-CPU cache-line floors, 64 B to 64 MiB, in one run with interleaved rounds.
//!
//! Two pinned processes ([`worker`]) hold all the systems at once and run, for every
//! round, every size, and every system (in an order rotated each round), a block of
//! ping-pong messages under one protocol: the payload written one byte per page, a
//! `CLOCK_MONOTONIC` stamp just before the hand-over, the receiver reading the header and
//! stamping again, an acknowledgement through a shared cache line. Three floors: one cache
//! line bounced between the two processes (half its round trip); two lines, a header line
//! then a descriptor line; and the page-writes floor, the same two lines after the
//! protocol's page writes into a private buffer of the payload's size (so it shows what
//! those writes, still in the store buffer when the hand-over's stores run, add at 16 and
//! 64 MiB).
//!
//! The bars: ferry's median one-way hand-over at most 0.8x iceoryx2's at every
//! size, as the median of per-round ratios; and within 1.5x of the floor at every size.
//! Besides the bars: ferry over the page-writes floor by stamps, the same way.

pub(crate) mod ice;
mod report;
pub mod stamp;
pub mod worker;

use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::Result;

use crate::harness::crew::{Crew, WorkerSpec};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::stats::{median, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Role, Sample, SampleKind, Touch, Wait};
use crate::sys::SharedLines;
use crate::transport::ferry::{links, Variant};
use crate::transport::LinkEnd;
use worker::{untag, System, LINES};

pub const BENCH: BenchDef = BenchDef {
    name: "handover",
    about: "one-way hand-over 64 B-64 MiB: ferry vs iceoryx2 vs the cache-line floors, interleaved rounds",
    run,
};

/// The bars.
pub const BAR_ICE: f64 = 0.8;
pub const BAR_FLOOR: f64 = 1.5;

/// What was measured at one size, in µs.
pub struct AtSize {
    pub size: usize,
    /// Half the floor's round trip, every message of every round.
    pub floor: Vec<f64>,
    /// The floor's one-way by stamps (the same protocol as the two systems).
    pub floor_stamped: Vec<f64>,
    /// Half the round trip of the two-line floor (descriptor line, then header line).
    pub floor2: Vec<f64>,
    /// The two-line floor's one-way by stamps.
    pub floor2_stamped: Vec<f64>,
    /// Half the round trip of the page-writes floor (the protocol's page writes, then the
    /// two-line floor).
    pub floorp: Vec<f64>,
    /// The page-writes floor's one-way by stamps.
    pub floorp_stamped: Vec<f64>,
    pub ferry: Vec<f64>,
    pub ferry_call: Vec<f64>,
    pub ice: Vec<f64>,
    pub ice_call: Vec<f64>,
    /// Per round: ferry's median over iceoryx2's, over the floor's, and over the
    /// page-writes floor's by stamps.
    pub ratio_ice: Vec<f64>,
    pub ratio_floor: Vec<f64>,
    pub ratio_floorp: Vec<f64>,
}

impl AtSize {
    pub fn ratio_ice(&self) -> f64 {
        median(&self.ratio_ice)
    }
    pub fn ratio_floor(&self) -> f64 {
        median(&self.ratio_floor)
    }
    pub fn ratio_floorp(&self) -> f64 {
        median(&self.ratio_floorp)
    }
}

pub struct Measured {
    pub sizes: Vec<AtSize>,
    pub rounds: u32,
    pub msgs: Vec<u32>,
    /// `Err(reason)` when iceoryx2 could not run here.
    pub ice: std::result::Result<(), String>,
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let sizes: Vec<usize> = vec![64, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
    // At least 40 timed messages per round at every size, quick or not: with fewer, the
    // "p99" of a quick run is the largest of a few dozen samples, which one timer
    // interrupt or preemption decides (see docs/benchmarks.md, huge pages).
    let msgs_at = |s: usize| -> u32 {
        match s {
            s if s >= 64 << 20 => 40,
            s if s >= 16 << 20 => ctx.pick(40, 100),
            _ => ctx.pick(200, 2000),
        }
    };
    let plan = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Spin,
        touch: Touch::Header,
        msgs: sizes.iter().map(|&s| msgs_at(s)).collect(),
        warmup: sizes
            .iter()
            .map(|&s| if s >= 16 << 20 { 3 } else { 20 })
            .collect(),
        sizes: sizes.clone(),
        trials: ctx.pick(5, 15),
        hops: 0,
    };
    let service = format!("ferry-bench-handover-{}", std::process::id());
    ctx.progress
        .phase("handover: checking that iceoryx2 runs here");
    let ice = ice::probe(&format!("{service}-probe")).map_err(|e| format!("{e:#}"));
    ctx.progress.phase(&format!(
        "handover: ferry{} and the floors, {} interleaved rounds",
        if ice.is_ok() { ", iceoryx2" } else { "" },
        plan.trials
    ));
    let samples = measure(ctx, &plan, ice.is_ok().then_some(service.as_str()))?;
    let m = summarise(&plan, &samples, ice);
    Ok(report::output(ctx, &m))
}

/// Removes the ferry group's file when the run ends, whatever happened.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Spawns the sender (first pinned CPU) and the receiver (second) and returns
/// (sender's samples, receiver's samples).
fn measure(
    ctx: &BenchCtx,
    plan: &Plan,
    service: Option<&str>,
) -> Result<(Vec<Sample>, Vec<Sample>)> {
    let (mut link, group_file) = links(1, Variant::CACHED_VOLATILE)?;
    let _cleanup = Cleanup(group_file);
    let link = link.remove(0);
    let lines = SharedLines::create(LINES)?;
    let ack = |fd: std::os::fd::OwnedFd| LinkEnd {
        spec: format!("{},{}", fd.as_raw_fd(), service.unwrap_or("-")),
        fds: vec![fd],
    };
    let mut crew = Crew::default();
    let mut tx = WorkerSpec::new(Role::HandoverSend, ctx.cpu(0));
    tx.tx = Some(link.tx);
    tx.ack = Some(ack(lines.try_clone()?));
    crew.spawn(tx, plan)?;
    let mut rx = WorkerSpec::new(Role::HandoverRecv, ctx.cpu(1));
    rx.rx = Some(link.rx);
    rx.ack = Some(ack(lines));
    crew.spawn(rx, plan)?;
    let mut out = crew.finish(Duration::from_secs(600))?;
    let rx = out.pop().unwrap_or_default();
    let tx = out.pop().unwrap_or_default();
    Ok((tx, rx))
}

fn us(ns: &[u64]) -> Vec<f64> {
    ns.iter().map(|&n| n as f64 / 1000.0).collect()
}

fn summarise(
    plan: &Plan,
    (tx, rx): &(Vec<Sample>, Vec<Sample>),
    ice: std::result::Result<(), String>,
) -> Measured {
    let pick = |from: &[Sample], kind: SampleKind, size: usize, sys: System, round: Option<u32>| {
        let mut v = Vec::new();
        for s in from.iter().filter(|s| s.kind == kind && s.size == size) {
            let (r, who) = untag(s.trial);
            if who == sys && round.map_or(true, |x| x == r) {
                v.extend(us(&s.ns));
            }
        }
        v
    };
    let sizes = plan
        .sizes
        .iter()
        .map(|&size| {
            let mut ratio_ice = Vec::new();
            let mut ratio_floor = Vec::new();
            let mut ratio_floorp = Vec::new();
            for r in 0..plan.trials {
                let f = median(&pick(rx, SampleKind::OneWay, size, System::Ferry, Some(r)));
                let i = median(&pick(
                    rx,
                    SampleKind::OneWay,
                    size,
                    System::Iceoryx2,
                    Some(r),
                ));
                let fl = median(&pick(
                    tx,
                    SampleKind::RoundTrip,
                    size,
                    System::Floor,
                    Some(r),
                )) / 2.0;
                if i.is_finite() {
                    ratio_ice.push(f / i);
                }
                ratio_floor.push(f / fl);
                let fp = median(&pick(
                    rx,
                    SampleKind::OneWay,
                    size,
                    System::FloorPages,
                    Some(r),
                ));
                ratio_floorp.push(f / fp);
            }
            AtSize {
                size,
                floor: pick(tx, SampleKind::RoundTrip, size, System::Floor, None)
                    .into_iter()
                    .map(|x| x / 2.0)
                    .collect(),
                floor_stamped: pick(rx, SampleKind::OneWay, size, System::Floor, None),
                floor2: pick(tx, SampleKind::RoundTrip, size, System::Floor2, None)
                    .into_iter()
                    .map(|x| x / 2.0)
                    .collect(),
                floor2_stamped: pick(rx, SampleKind::OneWay, size, System::Floor2, None),
                floorp: pick(tx, SampleKind::RoundTrip, size, System::FloorPages, None)
                    .into_iter()
                    .map(|x| x / 2.0)
                    .collect(),
                floorp_stamped: pick(rx, SampleKind::OneWay, size, System::FloorPages, None),
                ferry: pick(rx, SampleKind::OneWay, size, System::Ferry, None),
                ferry_call: pick(tx, SampleKind::SendCall, size, System::Ferry, None),
                ice: pick(rx, SampleKind::OneWay, size, System::Iceoryx2, None),
                ice_call: pick(tx, SampleKind::SendCall, size, System::Iceoryx2, None),
                ratio_ice,
                ratio_floor,
                ratio_floorp,
            }
        })
        .collect();
    Measured {
        sizes,
        rounds: plan.trials,
        msgs: plan.msgs.clone(),
        ice,
    }
}

/// Median and p99 of `v`.
pub fn summary(v: &[f64]) -> Summary {
    Summary::of(v)
}
