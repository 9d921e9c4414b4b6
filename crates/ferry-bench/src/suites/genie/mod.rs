//! `ferry-bench genie`: Genie's Figures 3 to 7 between two pinned processes. End-to-end
//! latency against size, 64 B to 64 MiB (page multiples and odd sizes), for all eight
//! semantics through [`ferry::semantics::Passing`] over a ferry channel; CPU time per side
//! (Figure 4's utilization); the paper's numbers beside ours; ratios to copy; the bars of
//! issue 10 with verdicts; and the calibrated model's prediction against each measurement
//! (Table 7), using the calibration measured in the same run (`calibrate`).
//!
//! One source and one sink process ([`worker`]), pinned to the two CPUs, run every
//! semantics; the sink busy-polls the channel until a message is queued and only then
//! calls its input, so no wake-up of a sleeping process (4 to 25 µs here, and uneven
//! between runs) hides the semantics' own costs: per size, each round
//! runs a block of messages of every semantics in an order rotated each round, and a
//! semantics' ratio to copy is the median over rounds of its round's median over copy's
//! (as `ferry-bench handover` does), so that the machine's state at the time (CPU
//! wake-ups, other load) weighs on every semantics alike. The workers load their
//! thresholds from this run's calibration file, named by their `--calibration`.
//!
//! A second series runs the same over a TCP loopback connection through the io_uring
//! driver (`Passing::tcp_*`), where the kernel copies even zero-copy sends (counted as
//! `zc-copied`); the bars and the model are judged on the channel series.

mod report;

use anyhow::{Context, Result};
pub use ferry_measure::suites::genie::{measure, worker, Series};

use crate::harness::budget::Budget;
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::record::Record;
use crate::harness::stats::{spread, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Touch, Wait};
use crate::suites::calibrate::{self, Calibrated};

pub const BENCH: BenchDef = BenchDef {
    name: "genie",
    about: "end-to-end latency 64 B..64 MiB of Genie's eight semantics between 2 processes, CPU per side, model vs measurement, bars (Genie Figures 3-7, Table 7)",
    run,
};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;
/// Page multiples, odd sizes, the paper's 60 KB (the largest AAL5 page multiple), up to 64 MiB.
const SIZES: &[usize] = &[
    64,
    1000,
    2048,
    4 * KIB,
    5000,
    16 * KIB,
    60 * KIB,
    64 * KIB,
    100_000,
    256 * KIB,
    MIB,
    MIB + 12_345,
    4 * MIB,
    16 * MIB,
    64 * MIB,
];
const QUICK_SIZES: &[usize] = &[64, 5000, 60 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB];

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let cal = calibrate::calibrated(ctx)?;
    let sizes: Vec<usize> = ctx.pick(QUICK_SIZES, SIZES).to_vec();
    let budget = ctx.pick(
        // Per round and semantics.
        Budget {
            bytes: 16 * MIB,
            min: 1,
            max: 15,
            warm_bytes: MIB,
            warm_max: 2,
        },
        Budget {
            bytes: 32 * MIB,
            min: 2,
            max: 60,
            warm_bytes: 8 * MIB,
            warm_max: 10,
        },
    );
    let plan = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Block,
        touch: Touch::Header,
        msgs: budget.msgs(&sizes),
        warmup: budget.warmup(&sizes).iter().map(|&w| w.max(1)).collect(),
        sizes,
        // Rounds: every round runs every semantics at a size.
        trials: ctx.pick(3, 7),
        hops: 0,
    };
    // The workers read this run's thresholds from the file the library looks for.
    let file = std::env::temp_dir().join(format!("ferry-calibration-{}", std::process::id()));
    std::fs::write(&file, cal.calibration.to_text()).context("writing the run's calibration")?;
    let tcp = ferry::uring::Features::probe().ring;
    let measured = (|| -> Result<Vec<Series>> {
        ctx.progress.phase(&format!(
            "genie: the eight semantics between 2 pinned processes, {} interleaved rounds",
            plan.trials
        ));
        let mut all = measure(ctx, &plan, &cal.calibration, &file, false)?;
        if tcp {
            ctx.progress.phase(&format!(
                "genie: the eight semantics over TCP loopback, {} interleaved rounds",
                plan.trials
            ));
            all.extend(measure(ctx, &plan, &cal.calibration, &file, true)?);
        }
        Ok(all)
    })();
    let _ = std::fs::remove_file(&file);
    let series = measured?;
    Ok(output(ctx, cal, &plan, &series))
}

fn output(ctx: &BenchCtx, cal: &Calibrated, plan: &Plan, series: &[Series]) -> BenchOutput {
    let mut out = BenchOutput::default();
    for x in series {
        for p in &x.points {
            let name = if x.tcp {
                format!("{} (tcp)", x.s.name())
            } else {
                x.s.name().to_string()
            };
            let mut r = Record::new(
                "genie",
                &name,
                "ns",
                p.lat,
                plan.trials,
                spread(&p.per_trial),
            )
            .param("semantics", x.s.name())
            .param("bytes", p.size)
            .param(
                "transport",
                if x.tcp {
                    "TCP loopback through io_uring, 2 pinned processes"
                } else {
                    "ferry channel, 2 pinned processes"
                },
            )
            .param("cpu_output_ns", p.cpu_out)
            .param("cpu_input_ns", p.cpu_in)
            .param("predicted_ns", p.predicted)
            .param("ratio_to_copy", p.ratio())
            .param("ratio_rounds", p.ratios.len());
            for (k, v) in worker::COUNTERS.iter().zip(&p.counters) {
                r = r.param(k, *v);
            }
            out.records.push(r);
        }
    }
    let channel: Vec<&Series> = series.iter().filter(|x| !x.tcp).collect();
    for b in report::bars(cal, &channel) {
        out.records.push(
            Record::new("genie", "bar", "x", Summary::of(&[b.worst]), 1, 0.0)
                .value(b.worst)
                .param("bar", b.name.clone())
                .param("limit", b.limit)
                .param("met", b.met),
        );
    }
    out.markdown = report::markdown(ctx, cal, plan, series);
    out.plots = report::plots(series);
    out
}
