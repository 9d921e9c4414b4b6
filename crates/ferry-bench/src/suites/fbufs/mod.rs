//! `ferry-bench fbufs`: the incremental cost per 4 KiB page of handing a
//! buffer to another process (Druschel thesis, Table 5.1).
//!
//! Each call: the originator writes one word in every page of a buffer and
//! hands it to the receiver; the receiver reads one word in every page and
//! answers on a return pipe. The cost of a call is timed at several sizes and
//! fitted as `cost = a * pages + b`: `a` is the per-page cost, free of the
//! fixed cost of a call, which lands in `b`.
//!
//! Extension point: ferry's fbuf variants (uncached, cached, volatile,
//! cached+volatile) become more entries in `TRANSPORTS` once the library's
//! transport is in `crate::transport`.

mod report;

use anyhow::Result;

use crate::harness::budget::Budget;
use crate::harness::chain::run_chain;
use crate::harness::chain::touch::PAGE;
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::points::{pooled, syscalls_per_msg, Point};
use crate::harness::record::Record;
use crate::harness::stats::{linear_fit, spread, Fit, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Wait};
use crate::transport::ferry::Variant;
use crate::transport::TransportKind;
use report::{markdown, plot, PAPER_COPY_US};

pub const BENCH: BenchDef = BenchDef {
    name: "fbufs",
    about: "incremental cost per 4 KiB page of a hand-over (Druschel Table 5.1)",
    run,
};

/// The mechanisms measured, in table order.
const TRANSPORTS: &[TransportKind] = &[
    TransportKind::Pipe,
    TransportKind::Unix,
    TransportKind::Ferry(Variant::CACHED_VOLATILE),
    TransportKind::Ferry(Variant::CACHED_SECURE),
    TransportKind::Ferry(Variant::UNCACHED_VOLATILE),
    TransportKind::Ferry(Variant::UNCACHED_SECURE),
];

struct Measured {
    kind: TransportKind,
    /// Kernel buffering of the link, where known.
    capacity: Option<usize>,
    points: Vec<Point>,
    fit: Fit,
    /// The per-page slope of each trial.
    trial_slopes: Vec<f64>,
    /// ferry's system calls per call in the timed loop: (originator, receiver).
    syscalls: (Option<f64>, Option<f64>),
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let memcpy = ctx.memcpy()?;
    let pages: Vec<usize> = ctx.pick(
        vec![1, 4, 16, 64, 256],
        vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
    );
    let sizes: Vec<usize> = pages.iter().map(|p| p * PAGE).collect();
    let budget = ctx.pick(
        Budget {
            bytes: 16 << 20,
            min: 30,
            max: 400,
            warm_bytes: 1 << 20,
            warm_max: 10,
        },
        Budget {
            bytes: 192 << 20,
            min: 200,
            max: 4000,
            warm_bytes: 8 << 20,
            warm_max: 50,
        },
    );
    let plan = budget.plan(Pattern::PingPong, Wait::Spin, sizes, ctx.pick(3, 5));

    let mut measured = Vec::new();
    for &kind in TRANSPORTS {
        ctx.progress
            .phase(&format!("fbufs: {} between 2 processes", kind.label()));
        let run = run_chain(ctx, kind, 1, &plan)?;
        let points = pooled(&run.source, |ns| ns / 1000.0);
        let fit_of = |ys: &dyn Fn(&Point) -> Option<f64>| {
            let pts: Vec<(f64, f64)> = points
                .iter()
                .filter_map(|p| Some(((p.size / PAGE) as f64, ys(p)?)))
                .collect();
            linear_fit(&pts)
        };
        let fit = fit_of(&|p| Some(p.summary.median)).ok_or_else(|| anyhow::anyhow!("no fit"))?;
        let trial_slopes = (0..plan.trials as usize)
            .filter_map(|t| fit_of(&|p| p.per_trial.get(t).copied()).map(|f| f.slope))
            .collect();
        measured.push(Measured {
            kind,
            capacity: run.capacity,
            points,
            fit,
            trial_slopes,
            syscalls: (syscalls_per_msg(&run.source), syscalls_per_msg(&run.sink)),
        });
    }

    let mut out = BenchOutput::default();
    for m in &measured {
        for p in &m.points {
            out.records.push(
                Record::new(
                    "fbufs",
                    m.kind.label(),
                    "µs",
                    p.summary,
                    p.trials,
                    p.spread(),
                )
                .param("transport", m.kind.name())
                .param("pages", p.size / PAGE)
                .param("bytes", p.size)
                .param("wait", "spin")
                .param("link_capacity", m.capacity)
                .param("measure", "call: fill, hand over, touch, acknowledge"),
            );
        }
        let slopes = Summary::of(&m.trial_slopes);
        out.records.push(
            Record::new(
                "fbufs",
                m.kind.label(),
                "µs/page",
                slopes,
                plan.trials,
                spread(&m.trial_slopes),
            )
            .value(m.fit.slope)
            .param("transport", m.kind.name())
            .param("fit", "per-page slope of call cost")
            .param("intercept_us", m.fit.intercept)
            .param("syscalls_per_call_sender", m.syscalls.0)
            .param("syscalls_per_call_receiver", m.syscalls.1)
            .param("r2", m.fit.r2)
            .param("paper_copy_us_per_page", PAPER_COPY_US),
        );
    }
    out.markdown = markdown(ctx, &measured, &plan);
    out.plots
        .push(plot(&measured, memcpy.ns_per_page() / 1000.0));
    Ok(out)
}
