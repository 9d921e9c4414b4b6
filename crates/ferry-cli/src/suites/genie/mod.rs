//! `ferry bench genie`: Genie's Figures 3 to 7 between two pinned processes. End-to-end
//! latency against size, 64 B to 64 MiB (page multiples and odd sizes), for all eight
//! semantics through [`ferry::semantics::Passing`] over a ferry channel; CPU time per side
//! (Figure 4's utilization); the paper's numbers beside ours; ratios to copy; the bars of
//! issue 10 with verdicts; and the calibrated model's prediction against each measurement
//! (Table 7), using the calibration measured in the same run (`calibrate`).
//!
//! One source and one sink process per semantics ([`worker`]), pinned to the two CPUs,
//! blocking in the channel's receive as an application would. The workers read their
//! thresholds from this run's calibration file, named in `FERRY_CALIBRATION`.
//!
//! A second series runs the same over a TCP loopback connection through the io_uring
//! driver (`Passing::tcp_*`), where the kernel copies even zero-copy sends (counted as
//! `zc-copied`); the bars and the model are judged on the channel series.

mod report;
pub mod worker;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry::semantics::{Calibration, Semantics};

use crate::harness::budget::Budget;
use crate::harness::crew::{Crew, WorkerSpec};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::record::Record;
use crate::harness::stats::{median, spread, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Role, Sample, SampleKind, Touch, Wait};
use crate::suites::calibrate::{self, Calibrated};
use crate::transport::ferry::{self as ferry_link, Variant};
use crate::transport::{stream, LinkEnd};

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

/// One semantics at one size.
pub struct Point {
    pub size: usize,
    /// One-way latency, ns, over every timed message.
    pub lat: Summary,
    pub per_trial: Vec<f64>,
    /// CPU time of the output call and of the input call (median ns per message).
    pub cpu_out: f64,
    pub cpu_in: f64,
    /// The semantics layer's counters at this size (see [`worker::COUNTERS`]).
    pub counters: Vec<u64>,
    /// The calibrated model's prediction, ns.
    pub predicted: Option<f64>,
}

pub struct Series {
    pub s: Semantics,
    /// Over TCP loopback through the io_uring driver, rather than a ferry channel.
    pub tcp: bool,
    pub points: Vec<Point>,
}

impl Series {
    pub fn at(&self, size: usize) -> Option<&Point> {
        self.points.iter().find(|p| p.size == size)
    }
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let cal = calibrate::calibrated(ctx)?;
    let sizes: Vec<usize> = ctx.pick(QUICK_SIZES, SIZES).to_vec();
    let budget = ctx.pick(
        Budget {
            bytes: 48 * MIB,
            min: 3,
            max: 40,
            warm_bytes: MIB,
            warm_max: 3,
        },
        Budget {
            bytes: 128 * MIB,
            min: 5,
            max: 300,
            warm_bytes: 8 * MIB,
            warm_max: 20,
        },
    );
    let plan = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Block,
        touch: Touch::Header,
        msgs: budget.msgs(&sizes),
        warmup: budget.warmup(&sizes).iter().map(|&w| w.max(1)).collect(),
        sizes,
        trials: ctx.pick(1, 2),
        hops: 0,
    };
    // The workers read this run's thresholds from the file the library looks for.
    let file = std::env::temp_dir().join(format!("ferry-calibration-{}", std::process::id()));
    std::fs::write(&file, cal.calibration.to_text()).context("writing the run's calibration")?;
    std::env::set_var("FERRY_CALIBRATION", &file);
    let tcp = ferry::uring::Features::probe().ring;
    let measured = (|| -> Result<Vec<Series>> {
        let mut all = Vec::new();
        for s in Semantics::ALL {
            ctx.progress
                .phase(&format!("genie: {s} between 2 pinned processes"));
            all.push(measure(ctx, s, &plan, &cal.calibration, false)?);
        }
        if tcp {
            for s in Semantics::ALL {
                ctx.progress.phase(&format!("genie: {s} over TCP loopback"));
                all.push(measure(ctx, s, &plan, &cal.calibration, true)?);
            }
        }
        Ok(all)
    })();
    let _ = std::fs::remove_file(&file);
    std::env::remove_var("FERRY_CALIBRATION");
    let series = measured?;
    Ok(output(ctx, cal, &plan, &series))
}

/// The two ends of one semantics' link: over a ferry channel, or over a connected TCP
/// loopback socket pair (each worker then joins the group only for a lot of its own).
fn ends(s: Semantics, tcp: bool) -> Result<(LinkEnd, LinkEnd, Cleanup)> {
    if !tcp {
        let (mut links, group_file) = ferry_link::links(1, Variant::CACHED_VOLATILE)?;
        let link = links.remove(0);
        let genie_end = |e: LinkEnd| LinkEnd {
            spec: worker::spec(s, &e.spec),
            fds: e.fds,
        };
        return Ok((genie_end(link.tx), genie_end(link.rx), Cleanup(group_file)));
    }
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let group = format!(
        "genie-tcp-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let client = std::net::TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let end = |sock: std::net::TcpStream| {
        let fd = std::os::fd::OwnedFd::from(sock);
        LinkEnd {
            spec: worker::tcp_spec(s, &group, std::os::fd::AsRawFd::as_raw_fd(&fd)),
            fds: vec![fd],
        }
    };
    Ok((
        end(client),
        end(server),
        Cleanup(ferry_link::group_file(&group)),
    ))
}

fn measure(
    ctx: &BenchCtx,
    s: Semantics,
    plan: &Plan,
    cal: &Calibration,
    tcp: bool,
) -> Result<Series> {
    let (tx, rx, _cleanup) = ends(s, tcp)?;
    let ack = stream::pipe_link()?;
    let mut crew = Crew::default();
    let mut src = WorkerSpec::new(Role::GenieSource, ctx.cpu(0));
    src.tx = Some(tx);
    src.ack = Some(ack.rx);
    crew.spawn(src, plan)?;
    let mut snk = WorkerSpec::new(Role::GenieSink, ctx.cpu(1));
    snk.rx = Some(rx);
    snk.ack = Some(ack.tx);
    crew.spawn(snk, plan)?;
    let mut reports = crew
        .finish(Duration::from_secs(300))
        .with_context(|| format!("semantics {s}{}", if tcp { " over TCP" } else { "" }))?;
    let sink = reports.pop().unwrap_or_default();
    let source = reports.pop().unwrap_or_default();
    let mut points = Vec::new();
    for &size in &plan.sizes {
        let of = |v: &[Sample], kind| -> Vec<Sample> {
            v.iter()
                .filter(|x| x.size == size && x.kind == kind)
                .cloned()
                .collect()
        };
        let (t0, t1) = (of(&source, SampleKind::Stamp), of(&sink, SampleKind::Stamp));
        if t0.len() != t1.len() {
            bail!(
                "{s} at {size} B: {} source trials, {} sink trials",
                t0.len(),
                t1.len()
            );
        }
        let mut all = Vec::new();
        let mut per_trial = Vec::new();
        for (a, b) in t0.iter().zip(&t1) {
            if a.ns.len() != b.ns.len() {
                bail!("{s} at {size} B: stamps do not pair up");
            }
            let v: Vec<f64> =
                a.ns.iter()
                    .zip(&b.ns)
                    .map(|(x, y)| y.saturating_sub(*x) as f64)
                    .collect();
            per_trial.push(median(&v));
            all.extend(v);
        }
        let cpu = |v: &[Sample]| {
            let ns: Vec<f64> = of(v, SampleKind::CpuTime)
                .iter()
                .flat_map(|x| x.ns.iter().map(|&n| n as f64))
                .collect();
            median(&ns)
        };
        let mut counters = vec![0u64; worker::COUNTERS.len()];
        for c in of(&source, SampleKind::Counter) {
            if let Some(slot) = counters.get_mut(c.trial as usize) {
                *slot += c.bytes;
            }
        }
        points.push(Point {
            size,
            lat: Summary::of(&all),
            per_trial,
            cpu_out: cpu(&source),
            cpu_in: cpu(&sink),
            counters,
            // The model covers the channel; TCP's kernel copies are not calibrated.
            predicted: if tcp { None } else { cal.predict(s, size) },
        });
    }
    Ok(Series { s, tcp, points })
}

/// Removes a group's control-block file once the workers are gone.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn output(ctx: &BenchCtx, cal: &Calibrated, plan: &Plan, series: &[Series]) -> BenchOutput {
    let mut out = BenchOutput::default();
    for x in series {
        let copy = series
            .iter()
            .find(|c| c.s == Semantics::Copy && c.tcp == x.tcp);
        for p in &x.points {
            let copy_us = copy.and_then(|c| c.at(p.size)).map(|c| c.lat.median);
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
            .param("ratio_to_copy", copy_us.map(|c| p.lat.median / c));
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
