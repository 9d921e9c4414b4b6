//! The report of `ferry-bench fbufs-path`'s throughput part: how the chains ran, the
//! tables beside what the thesis says of its Figures 5.3 to 5.5, and the plots. The
//! latency part has its own (`latency/report.rs`).

use std::fmt::Write as _;

use super::{plural, Curve, CROSSINGS, TOUCHES, TRANSPORTS};
use crate::harness::memcpy::Memcpy;
use crate::harness::output::{bytes, num, PlotSpec, Table};
use crate::harness::BenchCtx;
use crate::protocol::Touch;
use crate::transport::TransportKind;

/// What the thesis reports about its throughput figures (its figures are
/// plots; the text gives these numbers).
const PAPER: &str = "\
The paper (Druschel, Figures 5.3 to 5.5; DECstation 5000/200, Mach 3.0), in short:
- Figure 5.3, one domain crossing: at small sizes, throughput is set by the IPC latency, not by the buffer hand-over; cached and volatile fbufs beat Mach's own transfer at every size.
- Figure 5.4, UDP/IP loopback across three domains against the same stack in one domain: cached fbufs give more than twice the throughput of uncached ones at every size, and from 64 KB up they keep more than 90% of the single-domain throughput.
- Figure 5.5, end to end between two machines (cached, volatile fbufs): at most 285 Mbps, bounded by the I/O bus; above 256 KB the domain crossings cost almost nothing.
- Table 5.1, for scale: the asymptotic hand-over rate was 10,922 Mbps for cached, volatile fbufs and 104 Mbps for copying.
";

/// The throughput part of the report: how the chains ran, a table per touch, the paper.
pub(super) fn markdown(
    ctx: &BenchCtx,
    curves: &[Curve],
    sizes: &[usize],
    trials: u32,
    memcpy: &Memcpy,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## fbufs-path: throughput across domain crossings (Druschel, Figures 5.3 to 5.5)\n"
    );
    let _ = writeln!(
        md,
        "Messages stream from a source through 0 or 1 stages to a consumer. Across processes the links \
         are pipes (blocking; each hop copies into and out of the kernel) or ferry channels (blocking \
         send and recv; the source allocates cached, volatile fbufs on its path, a stage forwards the \
         same fbuf unchanged, the consumer reads the source's pages in place); in one process the same \
         steps are function calls on one reused buffer. The source writes one word per page, a stage \
         reads one word per page, the consumer reads one word per page or every byte. Throughput is \
         message bytes over the time from the first timed message's fill to the last one's receipt, \
         median of {} trials (GB/s = 10^9 bytes/s).\n",
        trials
    );
    let _ = writeln!(
        md,
        "Pinning: source on CPU {}, sink on CPU {} (1 crossing); with 2 crossings the stage has CPU {} \
         to itself and the sink shares CPU {} with the source. The single-process chain runs on CPU {}.\n",
        ctx.cpu(0),
        ctx.cpu(1),
        ctx.cpu(1),
        ctx.cpu(2),
        ctx.cpu(0)
    );
    let _ = writeln!(
        md,
        "{} The copy is of 64 MiB, so it is bound by memory, not caches: messages small enough to stay \
         in cache can move faster than this.\n",
        memcpy.line()
    );
    for &touch in TOUCHES {
        md.push_str(&throughput_table(curves, touch, sizes, memcpy.gbps.median));
    }
    md.push_str(PAPER);
    md.push('\n');
    md
}

fn find(
    curves: &[Curve],
    kind: Option<TransportKind>,
    crossings: usize,
    touch: Touch,
) -> Option<&Curve> {
    curves
        .iter()
        .find(|c| c.kind == kind && c.crossings == crossings && c.touch == touch)
}

fn throughput_table(curves: &[Curve], touch: Touch, sizes: &[usize], memcpy: f64) -> String {
    let mut headers = vec!["size".to_string()];
    let mut cols: Vec<(&Curve, Option<&Curve>)> = Vec::new();
    for &crossings in CROSSINGS {
        let Some(local) = find(curves, None, crossings, touch) else {
            continue;
        };
        headers.push(format!("one process, {crossings} hop{}", plural(crossings)));
        cols.push((local, None));
        for &kind in TRANSPORTS {
            if let Some(c) = find(curves, Some(kind), crossings, touch) {
                headers.push(format!(
                    "{}, {crossings} crossing{}",
                    kind.label(),
                    plural(crossings)
                ));
                headers.push("% of one process".into());
                headers.push("% of memcpy".into());
                cols.push((c, Some(local)));
            }
        }
    }
    let mut t = Table::new(&headers);
    for (i, &size) in sizes.iter().enumerate() {
        let mut row = vec![bytes(size)];
        for (c, local) in &cols {
            let v = c.points[i].summary.median;
            row.push(num(v));
            if let Some(local) = local {
                row.push(format!(
                    "{}%",
                    num(100.0 * v / local.points[i].summary.median)
                ));
                row.push(format!("{}%", num(100.0 * v / memcpy)));
            }
        }
        t.row(row);
    }
    format!(
        "Throughput in GB/s, consumer reads {}:\n\n{}\n",
        touch.label(),
        t.render()
    )
}

pub(super) fn throughput_plot(curves: &[Curve], touch: Touch, stem: &str, memcpy: f64) -> PlotSpec {
    let mut series: Vec<_> = curves
        .iter()
        .filter(|c| c.touch == touch)
        .map(|c| {
            let pts = c
                .points
                .iter()
                .map(|p| (p.size as f64, p.summary.median))
                .collect();
            (c.label(), pts)
        })
        .collect();
    if let Some(c) = curves.first() {
        let pts = c.points.iter().map(|p| (p.size as f64, memcpy)).collect();
        series.push(("memcpy bandwidth (this run)".into(), pts));
    }
    PlotSpec {
        stem: stem.into(),
        title: format!(
            "Throughput across domain crossings, consumer reads {} (cf. Druschel Fig. 5.3-5.5)",
            touch.label()
        ),
        x_label: "message size (bytes)".into(),
        y_label: "GB/s (median of trials)".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
