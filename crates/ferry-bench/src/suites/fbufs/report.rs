//! The report of `ferry-bench fbufs`: the tables and prose beside the paper's Table 5.1,
//! and the plot.

use std::fmt::Write as _;

use super::Measured;
use crate::harness::chain::touch::PAGE;
use crate::harness::output::{num, ratio, PlotSpec, Table};
use crate::harness::stats::Summary;
use crate::harness::BenchCtx;
use crate::protocol::Plan;
use crate::transport::TransportKind;

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

pub(super) const PAPER_COPY_US: f64 = 316.0;

/// Megabits per second when each 4 KiB page costs `us` microseconds (as the paper computes it).
fn mbps(us_per_page: f64) -> f64 {
    (PAGE * 8) as f64 / us_per_page
}

pub(super) fn markdown(ctx: &BenchCtx, measured: &[Measured], plan: &Plan) -> String {
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
    let mut t = Table::new(&headers);
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

pub(super) fn plot(measured: &[Measured], page_copy_us: f64) -> PlotSpec {
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
