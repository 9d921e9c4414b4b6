//! One-way hand-over latency between two pinned processes, 64 B to 64 MiB.
//!
//! The sender stamps `CLOCK_MONOTONIC` into the message right before handing
//! it over; the receiver subtracts that stamp from the time at which it holds
//! the whole message (read one word per page), then acknowledges on a return
//! pipe so that messages never queue. Both ends either busy-poll
//! (nonblocking descriptors, retried) or block in the kernel.

use std::fmt::Write as _;

use anyhow::Result;

use super::budget::Budget;
use super::chain::run_chain;
use super::ctx::BenchCtx;
use super::output::{bytes, num, ratio, BenchOutput, PlotSpec, Table};
use super::points::{pooled, Point};
use super::record::Record;
use crate::transport::TransportKind;
use crate::worker::plan::{Pattern, Plan, Touch, Wait};

const TRANSPORTS: &[TransportKind] = &[TransportKind::Pipe];
const WAITS: &[Wait] = &[Wait::Spin, Wait::Block];

fn wait_label(w: Wait) -> &'static str {
    match w {
        Wait::Spin => "busy-poll",
        Wait::Block => "blocking",
    }
}

struct Curve {
    kind: TransportKind,
    wait: Wait,
    capacity: Option<usize>,
    points: Vec<Point>,
}

impl Curve {
    fn label(&self) -> String {
        format!("{}, {}", self.kind.label(), wait_label(self.wait))
    }
}

/// Measures every transport in both wait modes.
pub fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let sizes: Vec<usize> = ctx.pick(
        vec![64, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
        vec![
            64,
            512,
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
        ],
    );
    let budget = ctx.pick(
        Budget {
            bytes: 8 << 20,
            min: 1,
            max: 300,
            warm_bytes: 1 << 20,
            warm_max: 10,
        },
        Budget {
            bytes: 128 << 20,
            min: 4,
            max: 3000,
            warm_bytes: 8 << 20,
            warm_max: 50,
        },
    );
    let base = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Spin,
        touch: Touch::Word,
        msgs: budget.msgs(&sizes),
        warmup: budget.warmup(&sizes),
        sizes: sizes.clone(),
        trials: ctx.pick(3, 5),
        hops: 0,
    };
    let mut curves = Vec::new();
    for &kind in TRANSPORTS {
        for &wait in WAITS {
            ctx.progress.phase(&format!(
                "fbufs-path: one-way latency, {}, {}",
                kind.label(),
                wait_label(wait)
            ));
            let plan = Plan {
                wait,
                ..base.clone()
            };
            let run = run_chain(ctx, kind, 1, &plan)?;
            let points = pooled(&run.sink, |ns| ns / 1000.0);
            curves.push(Curve {
                kind,
                wait,
                capacity: run.capacity,
                points,
            });
        }
    }

    let mut out = BenchOutput::default();
    for c in &curves {
        for p in &c.points {
            out.records.push(
                Record::new(
                    "fbufs-path",
                    &format!("one-way latency, {}", c.label()),
                    "µs",
                    p.summary,
                    p.trials,
                    p.spread(),
                )
                .param("transport", c.kind.name())
                .param("wait", wait_label(c.wait))
                .param("bytes", p.size)
                .param("link_capacity", c.capacity)
                .param(
                    "measure",
                    "one-way: stamp before hand-over to whole message received",
                ),
            );
        }
    }
    out.markdown = markdown(ctx, &curves, &sizes, base.trials);
    out.plots.push(plot(&curves));
    Ok(out)
}

fn markdown(ctx: &BenchCtx, curves: &[Curve], sizes: &[usize], trials: u32) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### One-way hand-over latency\n");
    let _ = writeln!(
        md,
        "Sender on CPU {}, receiver on CPU {}. The sender stamps CLOCK_MONOTONIC into the message just \
         before handing it over; the receiver takes the difference once it holds the whole message, \
         then acknowledges, so messages never queue. µs, median and 99th percentile over all messages \
         of {trials} trials; \"trials\" is the range of the per-trial medians.\n",
        ctx.cpu(0),
        ctx.cpu(1)
    );
    let mut headers = vec!["size".to_string()];
    for c in curves {
        headers.push(format!("{} median", c.label()));
        headers.push("p99".into());
        headers.push("trials".into());
    }
    let both = |k| {
        let spin = curves
            .iter()
            .find(|c| c.kind == k && c.wait == Wait::Spin)?;
        let block = curves
            .iter()
            .find(|c| c.kind == k && c.wait == Wait::Block)?;
        Some((spin, block))
    };
    let pairs: Vec<_> = TRANSPORTS.iter().filter_map(|&k| both(k)).collect();
    for (spin, _) in &pairs {
        headers.push(format!("{}: blocking / busy-poll", spin.kind.label()));
    }
    let mut t = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    for (i, &size) in sizes.iter().enumerate() {
        let mut row = vec![bytes(size)];
        for c in curves {
            let p = &c.points[i];
            let lo = p.per_trial.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = p
                .per_trial
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            row.push(num(p.summary.median));
            row.push(num(p.summary.p99));
            row.push(format!("{}–{}", num(lo), num(hi)));
        }
        for (spin, block) in &pairs {
            row.push(ratio(
                block.points[i].summary.median / spin.points[i].summary.median,
            ));
        }
        t.row(row);
    }
    md.push_str(&t.render());
    md.push('\n');
    md
}

fn plot(curves: &[Curve]) -> PlotSpec {
    let mut series = Vec::new();
    for c in curves {
        let med = c
            .points
            .iter()
            .map(|p| (p.size as f64, p.summary.median))
            .collect();
        let p99 = c
            .points
            .iter()
            .map(|p| (p.size as f64, p.summary.p99))
            .collect();
        series.push((format!("{} (median)", c.label()), med));
        series.push((format!("{} (p99)", c.label()), p99));
    }
    PlotSpec {
        stem: "fbufs-path-latency".into(),
        title: "One-way hand-over latency between two pinned processes".into(),
        x_label: "message size (bytes)".into(),
        y_label: "µs".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
