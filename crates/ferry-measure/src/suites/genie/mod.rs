//! Genie's passing measured between two pinned processes: one source and one sink worker
//! ([`worker`]) run a list of semantics through [`ferry::semantics::Passing`] over a ferry
//! channel (or TCP loopback), and the stamps become a [`Series`] per semantics. `ferry-bench
//! genie` runs every semantics here; `ferry calibrate` runs weak move alone for its
//! hand-over ([`base_handover`]), so the model and the benchmark measure the same code.

pub mod worker;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry::semantics::{Calibration, Semantics};

use crate::harness::crew::{Crew, WorkerSpec};
use crate::harness::ctx::BenchCtx;
use crate::harness::stats::{median, Summary};
use crate::protocol::{Plan, Role, Sample, SampleKind};
use crate::transport::ferry::{self as ferry_link, Variant};
use crate::transport::{stream, LinkEnd};

/// One semantics at one size.
pub struct Point {
    pub size: usize,
    /// One-way latency, ns, over every timed message.
    pub lat: Summary,
    /// Median latency per round, ns.
    pub per_trial: Vec<f64>,
    /// Per round: this semantics' median over copy's median in the same round.
    pub ratios: Vec<f64>,
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

impl Point {
    /// The median of the per-round ratios to copy (none without copy in the run).
    pub fn ratio(&self) -> Option<f64> {
        (!self.ratios.is_empty()).then(|| median(&self.ratios))
    }

    /// How far this point's round medians lie from its median over every message:
    /// (lowest, highest) as fractions (-0.1 is 10% below). The measurement's own spread
    /// over the run: a calibration taken at another moment can be off by as much.
    pub fn round_range(&self) -> Option<(f64, f64)> {
        let m = self.lat.median;
        if self.per_trial.len() < 2 || m <= 0.0 {
            return None;
        }
        let lo = self.per_trial.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self
            .per_trial
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        Some((lo / m - 1.0, hi / m - 1.0))
    }

    /// The larger of [`round_range`](Self::round_range)'s two sides, as a fraction.
    pub fn round_deviation(&self) -> Option<f64> {
        self.round_range().map(|(lo, hi)| lo.abs().max(hi.abs()))
    }
}

/// The two ends of the semantics' link: over a ferry channel, or over a connected TCP
/// loopback socket pair (each worker then joins the group only for a lot of its own).
fn ends(s: &[Semantics], tcp: bool) -> Result<(LinkEnd, LinkEnd, Cleanup)> {
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

/// Genie's base latency, for `ferry calibrate`'s `handover`: weak move's hand-over through
/// `Passing` (`send_sys` of a system buffer the source wrote one word per page of;
/// `recv_sys` and the header read), between two pinned processes exactly as this
/// benchmark runs every semantics. Weak move adds nothing to the hand-over but the
/// semantics layer's own calls, which every semantics makes. Per size, the latency over
/// every timed message of every round.
pub fn base_handover(ctx: &BenchCtx, plan: &Plan) -> Result<Vec<(usize, Summary)>> {
    let series = measure_these(
        ctx,
        plan,
        &Calibration::default(),
        None,
        false,
        &[Semantics::WeakMove],
    )?;
    Ok(series
        .into_iter()
        .flat_map(|s| s.points)
        .map(|p| (p.size, p.lat))
        .collect())
}

/// Every semantics, with the thresholds of `cal`, which the workers load from `file`.
pub fn measure(
    ctx: &BenchCtx,
    plan: &Plan,
    cal: &Calibration,
    file: &Path,
    tcp: bool,
) -> Result<Vec<Series>> {
    measure_these(ctx, plan, cal, Some(file), tcp, &Semantics::ALL)
}

/// Runs `sems` (ratios to copy only if copy is among them).
fn measure_these(
    ctx: &BenchCtx,
    plan: &Plan,
    cal: &Calibration,
    cal_file: Option<&Path>,
    tcp: bool,
    sems: &[Semantics],
) -> Result<Vec<Series>> {
    let (tx, rx, _cleanup) = ends(sems, tcp)?;
    let ack = stream::pipe_link()?;
    let mut crew = Crew::default();
    let mut src = WorkerSpec::new(Role::GenieSource, ctx.cpu(0));
    src.tx = Some(tx);
    src.ack = Some(ack.rx);
    src.calibration = cal_file.map(Path::to_path_buf);
    crew.spawn(src, plan)?;
    let mut snk = WorkerSpec::new(Role::GenieSink, ctx.cpu(1));
    snk.rx = Some(rx);
    snk.ack = Some(ack.tx);
    snk.calibration = cal_file.map(Path::to_path_buf);
    crew.spawn(snk, plan)?;
    let mut reports = crew
        .finish(Duration::from_secs(if tcp { 900 } else { 600 }))
        .with_context(|| format!("the genie workers{}", if tcp { " over TCP" } else { "" }))?;
    let sink = reports.pop().unwrap_or_default();
    let source = reports.pop().unwrap_or_default();
    // Per (semantics, size, round): the one-way latencies of its block.
    let lat_of = |s: Semantics, size: usize, round: u32| -> Result<Vec<f64>> {
        let find = |v: &[Sample]| {
            v.iter()
                .find(|x| {
                    x.kind == SampleKind::Stamp
                        && x.size == size
                        && worker::untag(x.trial) == (round, s)
                })
                .cloned()
        };
        let (Some(a), Some(b)) = (find(&source), find(&sink)) else {
            bail!("{s} at {size} B: round {round} is missing a side's stamps");
        };
        if a.ns.len() != b.ns.len() {
            bail!("{s} at {size} B: stamps do not pair up");
        }
        Ok(a.ns
            .iter()
            .zip(&b.ns)
            .map(|(x, y)| y.saturating_sub(*x) as f64)
            .collect())
    };
    let mut out = Vec::new();
    let with_copy = sems.contains(&Semantics::Copy);
    for &s in sems {
        let mut points = Vec::new();
        for &size in &plan.sizes {
            let mut all = Vec::new();
            let mut per_trial = Vec::new();
            let mut ratios = Vec::new();
            for round in 0..plan.trials {
                let v = lat_of(s, size, round)?;
                let m = median(&v);
                per_trial.push(m);
                if with_copy {
                    let c = median(&lat_of(Semantics::Copy, size, round)?);
                    if c > 0.0 {
                        ratios.push(m / c);
                    }
                }
                all.extend(v);
            }
            let cpu = |v: &[Sample]| {
                let ns: Vec<f64> = v
                    .iter()
                    .filter(|x| {
                        x.kind == SampleKind::CpuTime
                            && x.size == size
                            && worker::untag(x.trial).1 == s
                    })
                    .flat_map(|x| x.ns.iter().map(|&n| n as f64))
                    .collect();
                median(&ns)
            };
            let mut counters = vec![0u64; worker::COUNTERS.len()];
            // The source's counters, and the sink's inputs in place.
            for c in source
                .iter()
                .chain(&sink)
                .filter(|x| x.kind == SampleKind::Counter && x.size == size)
            {
                let (cs, j) = worker::counter_untag(c.trial);
                if cs == s {
                    if let Some(slot) = counters.get_mut(j) {
                        *slot += c.bytes;
                    }
                }
            }
            points.push(Point {
                size,
                lat: Summary::of(&all),
                per_trial,
                ratios,
                cpu_out: cpu(&source),
                cpu_in: cpu(&sink),
                counters,
                // The model covers the channel; TCP's kernel copies are not calibrated.
                // Share and emulated share input in place over the channel (see worker).
                predicted: match tcp {
                    true => None,
                    false if worker::in_place(s) => cal.predict_in_place(s, size),
                    false => cal.predict(s, size),
                },
            });
        }
        out.push(Series { s, tcp, points });
    }
    Ok(out)
}

/// Removes a group's control-block file once the workers are gone.
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
