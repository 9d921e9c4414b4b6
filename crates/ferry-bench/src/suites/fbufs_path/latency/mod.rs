//! One-way hand-over latency between two pinned processes, 64 B to 64 MiB.
//!
//! The sender stamps `CLOCK_MONOTONIC` into the message right before handing
//! it over; the receiver subtracts that stamp from the time at which it holds
//! the whole message (read one word per page), then acknowledges on a return
//! pipe so that messages never queue. Both ends either busy-poll
//! (nonblocking descriptors, retried) or block in the kernel.

mod report;

use anyhow::Result;

use crate::harness::budget::Budget;
use crate::harness::chain::run_chain;
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::points::{pooled, syscalls_per_msg, Point};
use crate::harness::record::Record;
use crate::protocol::{Pattern, Plan, Touch, Wait};
use crate::transport::ferry::Variant;
use crate::transport::TransportKind;
use report::{markdown, plot};

const FERRY: TransportKind = TransportKind::Ferry(Variant::CACHED_VOLATILE);
const TRANSPORTS: &[TransportKind] = &[TransportKind::Pipe, FERRY];
const WAITS: &[Wait] = &[Wait::Spin, Wait::Block];
/// Sizes at which the copy/ferry ratio is stated explicitly.
const RATIO_AT: &[usize] = &[1 << 20, 64 << 20];

fn wait_label(w: Wait) -> &'static str {
    match w {
        Wait::Spin => "busy-poll",
        Wait::Block => "blocking",
    }
}

struct Curve {
    kind: TransportKind,
    wait: Wait,
    touch: Touch,
    capacity: Option<usize>,
    points: Vec<Point>,
    /// ferry's system calls per message in the timed loop: (sender, receiver).
    syscalls: (Option<f64>, Option<f64>),
}

impl Curve {
    fn label(&self) -> String {
        match self.touch {
            Touch::Word => format!("{}, {}", self.kind.label(), wait_label(self.wait)),
            Touch::All | Touch::Header | Touch::HeaderAfterWrites => format!(
                "{}, {}, reads {}",
                self.kind.label(),
                wait_label(self.wait),
                self.touch.label()
            ),
        }
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
    let base = budget.plan(Pattern::PingPong, Wait::Spin, sizes.clone(), ctx.pick(3, 5));
    let mut runs: Vec<(TransportKind, Wait, Touch)> = Vec::new();
    for &kind in TRANSPORTS {
        for &wait in WAITS {
            runs.push((kind, wait, Touch::Word));
        }
    }
    // The receiver reads every byte: bound by memory bandwidth, not the hand-over.
    for &kind in TRANSPORTS {
        runs.push((kind, Wait::Spin, Touch::All));
    }
    // The hand-over alone: the receiver reads only the header.
    runs.push((FERRY, Wait::Spin, Touch::Header));
    runs.push((FERRY, Wait::Block, Touch::Header));
    let mut curves = Vec::new();
    for (kind, wait, touch) in runs {
        ctx.progress.phase(&format!(
            "fbufs-path: one-way latency, {}, {}, reads {}",
            kind.label(),
            wait_label(wait),
            touch.label()
        ));
        let plan = Plan {
            wait,
            touch,
            ..base.clone()
        };
        let run = run_chain(ctx, kind, 1, &plan)?;
        let points = pooled(&run.sink, |ns| ns / 1000.0);
        curves.push(Curve {
            kind,
            wait,
            touch,
            capacity: run.capacity,
            points,
            syscalls: (syscalls_per_msg(&run.source), syscalls_per_msg(&run.sink)),
        });
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
                .param("touch", c.touch.label())
                .param("syscalls_per_msg_sender", c.syscalls.0)
                .param("syscalls_per_msg_receiver", c.syscalls.1)
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
