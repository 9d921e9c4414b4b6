//! `ferry bench fbufs-path`: throughput against message size across one and
//! two domain crossings (Druschel thesis, Figures 5.3 to 5.5), with the same
//! chain inside one process as the single-domain reference, and the one-way
//! hand-over latency (see `latency.rs`).
//!
//! A chain is source -> consumer (1 crossing) or source -> stage -> consumer
//! (2 crossings). The source writes one word per page; a stage reads one word
//! per page and passes the message on; the consumer reads one word per page,
//! or every byte.
//!
//! Extension point: ferry's cached fbufs become another entry in `TRANSPORTS`.

mod latency;

use std::fmt::Write as _;

use anyhow::Result;

use crate::harness::budget::Budget;
use crate::harness::chain::{run_chain, run_local};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, num, BenchOutput, PlotSpec, Table};
use crate::harness::points::{stream_gbps, syscalls_per_msg, Point};
use crate::harness::record::Record;
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Touch, Wait};
use crate::transport::ferry::Variant;
use crate::transport::TransportKind;

pub const BENCH: BenchDef = BenchDef {
    name: "fbufs-path",
    about: "throughput vs size over 1 and 2 crossings, and hand-over latency (Druschel Figures 5.3-5.5)",
    run,
};

/// Cross-process transports, in table order.
const TRANSPORTS: &[TransportKind] = &[
    TransportKind::Pipe,
    TransportKind::Ferry(Variant::CACHED_VOLATILE),
];
const CROSSINGS: &[usize] = &[1, 2];
const TOUCHES: &[Touch] = &[Touch::Word, Touch::All];

/// What the thesis reports about its throughput figures (its figures are
/// plots; the text gives these numbers).
const PAPER: &str = "\
The paper (Druschel, Figures 5.3 to 5.5; DECstation 5000/200, Mach 3.0), in short:
- Figure 5.3, one domain crossing: at small sizes, throughput is set by the IPC latency, not by the buffer hand-over; cached and volatile fbufs beat Mach's own transfer at every size.
- Figure 5.4, UDP/IP loopback across three domains against the same stack in one domain: cached fbufs give more than twice the throughput of uncached ones at every size, and from 64 KB up they keep more than 90% of the single-domain throughput.
- Figure 5.5, end to end between two machines (cached, volatile fbufs): at most 285 Mbps, bounded by the I/O bus; above 256 KB the domain crossings cost almost nothing.
- Table 5.1, for scale: the asymptotic hand-over rate was 10,922 Mbps for cached, volatile fbufs and 104 Mbps for copying.
";

/// One curve: a transport at a number of crossings, or the single process.
struct Curve {
    /// `None` for the single-process chain.
    kind: Option<TransportKind>,
    crossings: usize,
    touch: Touch,
    /// Kernel buffering of one link, where known.
    capacity: Option<usize>,
    points: Vec<Point>,
    /// ferry's system calls per message at the consumer, in the timed loop.
    syscalls: Option<f64>,
}

impl Curve {
    fn label(&self) -> String {
        let who = match self.kind {
            Some(k) => format!(
                "{}, {} crossing{}",
                k.label(),
                self.crossings,
                plural(self.crossings)
            ),
            None => format!(
                "one process, {} hop{}",
                self.crossings,
                plural(self.crossings)
            ),
        };
        format!("{who}, reads {}", self.touch.label())
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let memcpy = ctx.memcpy()?;
    let sizes: Vec<usize> = ctx
        .pick(
            vec![12, 16, 20, 24, 26],
            vec![12, 14, 16, 18, 20, 22, 24, 26],
        )
        .into_iter()
        .map(|shift| 1usize << shift)
        .collect();
    let budget = ctx.pick(
        Budget {
            bytes: 16 << 20,
            min: 1,
            max: 1000,
            warm_bytes: 4 << 20,
            warm_max: 16,
        },
        Budget {
            bytes: 128 << 20,
            min: 2,
            max: 10000,
            warm_bytes: 16 << 20,
            warm_max: 64,
        },
    );
    let base = Plan {
        pattern: Pattern::Stream,
        wait: Wait::Block,
        touch: Touch::Word,
        msgs: budget.msgs(&sizes),
        warmup: budget.warmup(&sizes),
        sizes: sizes.clone(),
        trials: ctx.pick(3, 5),
        hops: 0,
    };

    let mut curves = Vec::new();
    for &touch in TOUCHES {
        for &crossings in CROSSINGS {
            let plan = Plan {
                touch,
                hops: crossings as u32 - 1,
                ..base.clone()
            };
            ctx.progress.phase(&format!(
                "fbufs-path: one process, {crossings} hop(s), reads {}",
                touch.label()
            ));
            let points = stream_gbps(&run_local(ctx, &plan)?);
            curves.push(Curve {
                kind: None,
                crossings,
                touch,
                capacity: None,
                points,
                syscalls: None,
            });
            for &kind in TRANSPORTS {
                ctx.progress.phase(&format!(
                    "fbufs-path: {} over {crossings} crossing(s), reads {}",
                    kind.label(),
                    touch.label()
                ));
                let run = run_chain(ctx, kind, crossings, &plan)?;
                let points = stream_gbps(&run.sink);
                curves.push(Curve {
                    kind: Some(kind),
                    crossings,
                    touch,
                    capacity: run.capacity,
                    points,
                    syscalls: syscalls_per_msg(&run.sink),
                });
            }
        }
    }

    let mut out = BenchOutput::default();
    for c in &curves {
        for p in &c.points {
            out.records.push(
                Record::new(
                    "fbufs-path",
                    &c.label(),
                    "GB/s",
                    p.summary,
                    p.trials,
                    p.spread(),
                )
                .param("transport", c.kind.map_or("one-process", |k| k.name()))
                .param("crossings", if c.kind.is_some() { c.crossings } else { 0 })
                .param("stages", c.crossings - 1)
                .param("touch", c.touch.label())
                .param("bytes", p.size)
                .param("wait", "block")
                .param("syscalls_per_msg_consumer", c.syscalls)
                .param("link_capacity", c.capacity),
            );
        }
    }
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
        base.trials
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
        md.push_str(&throughput_table(
            &curves,
            touch,
            &sizes,
            memcpy.gbps.median,
        ));
    }
    md.push_str(PAPER);
    md.push('\n');
    for (touch, stem) in [(Touch::Word, "fbufs-path"), (Touch::All, "fbufs-path-all")] {
        out.plots
            .push(throughput_plot(&curves, touch, stem, memcpy.gbps.median));
    }

    let lat = latency::run(ctx)?;
    md.push_str(&lat.markdown);
    out.records.extend(lat.records);
    out.plots.extend(lat.plots);
    out.markdown = md;
    Ok(out)
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
    let mut t = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
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

fn throughput_plot(curves: &[Curve], touch: Touch, stem: &str, memcpy: f64) -> PlotSpec {
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
