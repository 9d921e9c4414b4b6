//! `ferry-bench fbufs-path`: throughput against message size across one and
//! two domain crossings (Druschel thesis, Figures 5.3 to 5.5), with the same
//! chain inside one process as the single-domain reference, and the one-way
//! hand-over latency (see [`latency`]).
//!
//! A chain is source -> consumer (1 crossing) or source -> stage -> consumer
//! (2 crossings). The source writes one word per page; a stage reads one word
//! per page and passes the message on; the consumer reads one word per page,
//! or every byte.
//!
//! Extension point: ferry's cached fbufs become another entry in `TRANSPORTS`.

mod latency;
mod report;

use anyhow::Result;

use crate::harness::budget::Budget;
use crate::harness::chain::{run_chain, run_local};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::points::{stream_gbps, syscalls_per_msg, Point};
use crate::harness::record::Record;
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Touch, Wait};
use crate::transport::ferry::Variant;
use crate::transport::TransportKind;
use report::{markdown, throughput_plot};

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
    let base = budget.plan(Pattern::Stream, Wait::Block, sizes.clone(), ctx.pick(3, 5));

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
    let mut md = markdown(ctx, &curves, &sizes, base.trials, memcpy);
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
