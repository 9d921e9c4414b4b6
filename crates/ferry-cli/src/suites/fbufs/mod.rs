//! `ferry bench fbufs`: the incremental cost per 4 KiB page of handing a
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

use std::fmt::Write as _;

use anyhow::Result;

use crate::harness::budget::Budget;
use crate::harness::chain::run_chain;
use crate::harness::chain::touch::PAGE;
use crate::harness::ctx::BenchCtx;
use crate::harness::output::{num, ratio, BenchOutput, PlotSpec, Table};
use crate::harness::points::{pooled, syscalls_per_msg, Point};
use crate::harness::record::Record;
use crate::harness::stats::{linear_fit, spread, Fit, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Touch, Wait};
use crate::transport::ferry::Variant;
use crate::transport::TransportKind;

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

/// Table 5.1 of the thesis: DECstation 5000/200 (25 MHz MIPS R3000), Mach 3.0.
/// (mechanism, incremental µs per page, asymptotic Mbps).
const PAPER: &[(&str, f64, f64)] = &[
    ("fbufs, cached + volatile", 3.0, 10_922.0),
    ("fbufs, volatile", 21.0, 1_560.0),
    ("fbufs, cached", 29.0, 1_130.0),
    ("fbufs", 37.0, 886.0),
    ("Mach COW", 144.0, 228.0),
    ("copy", 316.0, 104.0),
];
const PAPER_COPY_US: f64 = 316.0;

/// Megabits per second when each 4 KiB page costs `us` microseconds (as the paper computes it).
fn mbps(us_per_page: f64) -> f64 {
    (PAGE * 8) as f64 / us_per_page
}

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
    let plan = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Spin,
        touch: Touch::Word,
        msgs: budget.msgs(&sizes),
        warmup: budget.warmup(&sizes),
        sizes,
        trials: ctx.pick(3, 5),
        hops: 0,
    };

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

fn markdown(ctx: &BenchCtx, measured: &[Measured], plan: &Plan) -> String {
    let memcpy = ctx.memcpy_if_measured();
    let page_copy_us = memcpy.map_or(f64::NAN, |m| m.ns_per_page() / 1000.0);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## fbufs: incremental cost per 4 KiB page (Druschel, Table 5.1)\n"
    );
    let _ = writeln!(
        md,
        "Each call: the originator writes one word per page and hands the buffer to another process, \
         which reads one word per page and answers on a return pipe. Both ends busy-poll and are pinned \
         (CPUs {} and {}). The call cost at {} sizes is fitted as cost = a * pages + b; a is the \
         incremental cost per page, b the fixed cost of a call.\n",
        ctx.cpu(0),
        ctx.cpu(1),
        plan.sizes.len()
    );
    let _ = writeln!(md, "This run:\n");
    let mut t = Table::new(&[
        "mechanism",
        "µs/page (a)",
        "trial range",
        "b (µs)",
        "r²",
        "Mbps (asymptotic)",
        "a / memcpy of a page",
        "paper's copy / a",
        "pipe copy / a",
        "ferry syscalls/call (sender, receiver)",
    ]);
    let pipe = measured
        .iter()
        .find(|m| m.kind == TransportKind::Pipe)
        .map_or(f64::NAN, |m| m.fit.slope);
    for m in measured {
        let s = Summary::of(&m.trial_slopes);
        let sys = match m.syscalls {
            (Some(a), Some(b)) => format!("{}, {}", num(a), num(b)),
            _ => "—".into(),
        };
        t.row(vec![
            m.kind.label().into(),
            num(m.fit.slope),
            format!("{}–{}", num(s.min), num(s.max)),
            num(m.fit.intercept),
            format!("{:.4}", m.fit.r2),
            num(mbps(m.fit.slope)),
            ratio(m.fit.slope / page_copy_us),
            ratio(PAPER_COPY_US / m.fit.slope),
            ratio(pipe / m.fit.slope),
            sys,
        ]);
    }
    md.push_str(&t.render());
    let _ = writeln!(
        md,
        "\nferry's variants: cached = the receiver reads through its one mapping of the sender's lot; \
         uncached = every received fbuf is mmapped afresh and unmapped on release; volatile = the \
         originator's pages stay writable; secured = they are write-protected (mprotect) from send to \
         release. Syscalls are those ferry itself makes (its own counter) per call in the timed loop; \
         the return pipe is not ferry's and is not counted.\n"
    );
    let _ = writeln!(
        md,
        "\nMbps is the paper's asymptotic rate, 32768 / a. A negative b means the per-page cost grows \
         with size (large buffers spill out of the caches), so the line undershoots at one page; r² \
         says how straight the points are.\n"
    );
    if let Some(m) = memcpy {
        let _ = writeln!(md, "{}\n", m.line());
    }
    let _ = writeln!(
        md,
        "The paper (DECstation 5000/200, 25 MHz R3000, Mach 3.0):\n"
    );
    let mut t = Table::new(&["mechanism", "µs/page", "Mbps (asymptotic)", "copy / this"]);
    for (name, us, mb) in PAPER {
        t.row(vec![
            (*name).into(),
            num(*us),
            num(*mb),
            ratio(PAPER_COPY_US / us),
        ]);
    }
    md.push_str(&t.render());
    let _ = writeln!(
        md,
        "\nCost of one call by size (µs; median and 99th percentile over all calls):\n"
    );
    let mut headers = vec!["pages".to_string()];
    for m in measured {
        headers.push(format!("{} median", m.kind.label()));
        headers.push(format!("{} p99", m.kind.label()));
    }
    let mut t = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    for (i, size) in plan.sizes.iter().enumerate() {
        let mut row = vec![(size / PAGE).to_string()];
        for m in measured {
            let p = &m.points[i];
            row.push(num(p.summary.median));
            row.push(num(p.summary.p99));
        }
        t.row(row);
    }
    md.push_str(&t.render());
    md.push('\n');
    md
}

fn plot(measured: &[Measured], page_copy_us: f64) -> PlotSpec {
    let mut series: Vec<_> = measured
        .iter()
        .map(|m| {
            let pts = m
                .points
                .iter()
                .map(|p| ((p.size / PAGE) as f64, p.summary.median))
                .collect();
            (
                format!("{} (a = {} µs/page)", m.kind.label(), num(m.fit.slope)),
                pts,
            )
        })
        .collect();
    if let Some(m) = measured.first() {
        let pts = m
            .points
            .iter()
            .map(|p| {
                let pages = (p.size / PAGE) as f64;
                (pages, pages * page_copy_us)
            })
            .collect();
        series.push(("memcpy of the same pages".to_string(), pts));
    }
    PlotSpec {
        stem: "fbufs".into(),
        title: "Cost of handing a buffer to another process (cf. Druschel Table 5.1)".into(),
        x_label: "buffer size (4 KiB pages)".into(),
        y_label: "µs per call (median)".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
