//! `ferry-bench container`: the container-shipping paper's Figure 6. Five domains (five
//! processes) pass a message down a chain; the middle one reads and writes a chosen
//! amount of it; throughput is bytes / (transfer + access time), first domain to last.
//!
//! Three methods run in the same crew, interleaved per access amount and trial:
//! container shipping (memfds over `SCM_RIGHTS`, only the accessed pallets mapped),
//! physical copy through pipes, and virtual move (every pallet mapped and populated in
//! every domain). The worker side is [`domain`];
//! both sides follow the [`schedule`].

pub mod domain;
mod report;
mod schedule;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{bail, Result};
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use rustix::pipe::{pipe_with, PipeFlags};

use crate::harness::crew::{Crew, WorkerSpec};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, BenchOutput};
use crate::harness::record::Record;
use crate::harness::stats::{median, spread, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Role, Sample, Touch, Wait};
use crate::transport::{stream, LinkEnd};
use report::{markdown, plot};
use schedule::{
    batches, pallet_layout, resolve, Method, ACCESSES, ACCESSOR, DOMAINS, METHODS, PALLETS,
};

pub const BENCH: BenchDef = BenchDef {
    name: "container",
    about: "5-domain pipeline throughput vs bytes accessed: container shipping, copy, virtual move (container shipping Figure 6)",
    run,
};

/// Longest one size's crew may run before its workers are killed.
const TIMEOUT: Duration = Duration::from_secs(300);

/// Harness-side configuration of one message size.
struct SizeRun {
    size: usize,
    trials: u32,
    warmup: u32,
    msgs: u32,
    /// All five domains on one CPU, like the paper's uniprocessor, instead of alternating
    /// between the two.
    one_cpu: bool,
}

impl SizeRun {
    /// The run's name in headings and bar lines: its size, and the placement if unusual.
    fn label(&self) -> String {
        if self.one_cpu {
            format!("{} on one CPU", bytes(self.size))
        } else {
            bytes(self.size)
        }
    }

    /// The placement, as recorded in JSON.
    fn placement(&self) -> &'static str {
        if self.one_cpu {
            "one-cpu"
        } else {
            "alternate"
        }
    }
}

/// One method at one access amount at one size.
struct Cell {
    method: Method,
    access: usize,
    /// Transfer + access time per timed message, µs.
    lat_us: Vec<f64>,
    /// Median latency of each trial, µs.
    per_trial_us: Vec<f64>,
}

impl Cell {
    fn median_us(&self) -> f64 {
        median(&self.lat_us)
    }

    /// MB/s at the median latency.
    fn mbps(&self, size: usize) -> f64 {
        size as f64 / self.median_us()
    }

    fn mbps_summary(&self, size: usize) -> Summary {
        let v: Vec<f64> = self.lat_us.iter().map(|us| size as f64 / us).collect();
        Summary::of(&v)
    }

    fn mbps_per_trial(&self, size: usize) -> Vec<f64> {
        self.per_trial_us
            .iter()
            .map(|us| size as f64 / us)
            .collect()
    }
}

struct Measured {
    run: SizeRun,
    cells: Vec<Cell>,
    fds_before: usize,
    fds_after: usize,
}

impl Measured {
    fn cell(&self, method: Method, access: usize) -> Option<&Cell> {
        let a = resolve(access, self.run.size);
        self.cells
            .iter()
            .find(|c| c.method == method && c.access == a)
    }

    fn mbps(&self, method: Method, access: usize) -> f64 {
        self.cell(method, access)
            .map_or(f64::NAN, |c| c.mbps(self.run.size))
    }

    fn ratio(&self, over: Method, access: usize) -> f64 {
        self.mbps(Method::Container, access) / self.mbps(over, access)
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn sock_pair() -> Result<(OwnedFd, OwnedFd)> {
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// `key=FD,key=FD`, and the descriptors to inherit.
fn link_end(fds: Vec<(&str, OwnedFd)>) -> LinkEnd {
    let spec = fds
        .iter()
        .map(|(k, fd)| format!("{k}={}", fd.as_raw_fd()))
        .collect::<Vec<_>>()
        .join(",");
    LinkEnd {
        spec,
        fds: fds.into_iter().map(|(_, fd)| fd).collect(),
    }
}

/// Runs the five domains for one message size and pairs first-domain and last-domain stamps.
fn measure(ctx: &BenchCtx, run: SizeRun) -> Result<Measured> {
    let plan = Plan {
        pattern: Pattern::PingPong,
        wait: Wait::Block,
        touch: Touch::Header,
        sizes: vec![run.size],
        msgs: vec![run.msgs],
        warmup: vec![run.warmup],
        trials: run.trials,
        hops: (DOMAINS - 2) as u32,
    };
    let fds_before = open_fds();
    let samples = {
        // Links between consecutive domains: a socket pair for containers, a pipe for copies.
        let mut into: Vec<Option<LinkEnd>> = (0..DOMAINS).map(|_| None).collect();
        let mut out_of: Vec<Option<LinkEnd>> = (0..DOMAINS).map(|_| None).collect();
        for i in 0..DOMAINS - 1 {
            let (a, b) = sock_pair()?;
            let pipe = stream::pipe_link()?;
            let mut wr = pipe.tx.fds;
            let mut rd = pipe.rx.fds;
            out_of[i] = Some(link_end(vec![("sock", a), ("pipe", wr.remove(0))]));
            into[i + 1] = Some(link_end(vec![("sock", b), ("pipe", rd.remove(0))]));
        }
        // The return socket: the last domain sends the container (or a byte) back.
        let (a, b) = sock_pair()?;
        out_of[DOMAINS - 1] = Some(link_end(vec![("sock", a)]));
        into[0] = Some(link_end(vec![("sock", b)]));

        // Lifelines: each domain inherits a read end; the harness keeps the write ends
        // (close-on-exec, so no other child gets them) until the crew is done.
        let mut lifelines = Vec::new();
        let mut crew = Crew::default();
        for i in 0..DOMAINS {
            let (r, w) = pipe_with(PipeFlags::CLOEXEC)?;
            lifelines.push(w);
            let cpu = if run.one_cpu { ctx.cpu(0) } else { ctx.cpu(i) };
            let mut spec = WorkerSpec::new(Role::Domain, cpu);
            spec.rx = into[i].take();
            spec.tx = out_of[i].take();
            let ack = link_end(vec![("lifeline", r)]);
            spec.ack = Some(LinkEnd {
                spec: format!("domain={i},{}", ack.spec),
                fds: ack.fds,
            });
            crew.spawn(spec, &plan)?;
        }
        let r = crew.finish(TIMEOUT);
        drop(lifelines);
        r?
    };
    let fds_after = open_fds();
    let (t0s, t1s) = (&samples[0], &samples[DOMAINS - 1]);
    let cells = pair(&plan, t0s, t1s)?;
    Ok(Measured {
        run,
        cells,
        fds_before,
        fds_after,
    })
}

/// Latencies per (method, access), from the schedule both domains followed.
fn pair(plan: &Plan, t0s: &[Sample], t1s: &[Sample]) -> Result<Vec<Cell>> {
    let gs = batches(plan);
    if t0s.len() != gs.len() || t1s.len() != gs.len() {
        bail!(
            "expected {} batches of stamps, got {} and {}",
            gs.len(),
            t0s.len(),
            t1s.len()
        );
    }
    let mut cells: BTreeMap<(usize, usize), Cell> = BTreeMap::new();
    for ((g, a), b) in gs.iter().zip(t0s).zip(t1s) {
        if a.trial != g.trial || b.trial != g.trial || a.bytes != g.access as u64 {
            bail!("stamps out of step with the schedule");
        }
        let lat: Vec<f64> =
            a.ns.iter()
                .zip(&b.ns)
                .map(|(&t0, &t1)| t1.saturating_sub(t0) as f64 / 1000.0)
                .collect();
        let m = METHODS.iter().position(|&m| m == g.method).unwrap_or(0);
        let cell = cells.entry((g.access, m)).or_insert_with(|| Cell {
            method: g.method,
            access: g.access,
            lat_us: Vec::new(),
            per_trial_us: Vec::new(),
        });
        cell.per_trial_us.push(median(&lat));
        cell.lat_us.extend(lat);
    }
    Ok(cells.into_values().collect())
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let memcpy = ctx.memcpy()?;
    let runs = [
        SizeRun {
            size: 10 << 20,
            trials: ctx.pick(3, 5),
            warmup: 1,
            msgs: ctx.pick(5, 20),
            one_cpu: false,
        },
        SizeRun {
            size: 1 << 30,
            trials: ctx.pick(1, 3),
            warmup: 0,
            msgs: ctx.pick(1, 3),
            one_cpu: false,
        },
        SizeRun {
            size: 10 << 20,
            trials: ctx.pick(3, 5),
            warmup: 1,
            msgs: ctx.pick(5, 20),
            one_cpu: true,
        },
    ];
    let mut measured = Vec::new();
    for run in runs {
        ctx.progress.phase(&format!(
            "container: {} in {PALLETS} pallets through {DOMAINS} domains ({} trials x {} messages per method and access amount)",
            run.label(),
            run.trials,
            run.msgs
        ));
        measured.push(measure(ctx, run)?);
    }

    ctx.progress
        .phase("container: one hop's calls in one process (the floor of a hop)");
    let floor = hop_floor(ctx.pick(2_000, 10_000))?;
    let mut out = BenchOutput::default();
    out.records.push(
        Record::new(
            "container",
            "hop floor (ship + receive in one process)",
            "µs",
            floor.us,
            floor.trials,
            floor.spread,
        )
        .param("pallets", PALLETS)
        .param("bytes", 10usize << 20)
        .param("syscalls_per_hop", floor.syscalls),
    );
    for m in &measured {
        let size = m.run.size;
        let (per, _) = pallet_layout(size);
        for c in &m.cells {
            let base = |r: Record| {
                r.param("method", c.method.name())
                    .param("bytes", size)
                    .param("pallets", PALLETS)
                    .param("pallet_bytes", per)
                    .param("domains", DOMAINS)
                    .param("accessor", ACCESSOR)
                    .param("access_bytes", c.access)
                    .param("messages_per_trial", m.run.msgs)
                    .param("placement", m.run.placement())
            };
            out.records.push(base(Record::new(
                "container",
                c.method.label(),
                "MB/s",
                c.mbps_summary(size),
                m.run.trials,
                spread(&c.mbps_per_trial(size)),
            )));
            out.records.push(base(Record::new(
                "container",
                &format!("{} T+A", c.method.label()),
                "µs",
                Summary::of(&c.lat_us),
                m.run.trials,
                spread(&c.per_trial_us),
            )));
        }
        for &a in &ACCESSES {
            for over in [Method::Copy, Method::VirtualMove] {
                let r = m.ratio(over, a);
                out.records.push(
                    Record::new(
                        "container",
                        &format!("container / {}", over.name()),
                        "x",
                        Summary::of(&[r]),
                        m.run.trials,
                        0.0,
                    )
                    .param("bytes", size)
                    .param("placement", m.run.placement())
                    .param("access_bytes", resolve(a, size)),
                );
            }
        }
    }
    out.markdown = markdown(ctx, &measured, memcpy.gbps.median, &floor);
    for m in &measured {
        out.plots.push(plot(m));
    }
    Ok(out)
}

/// The cost of one hop's unavoidable calls, with no process switch or wake-up.
struct Floor {
    /// Per hop, over all rounds; `median` is the headline.
    us: Summary,
    /// ferry's own syscalls per hop.
    syscalls: f64,
    trials: u32,
    /// Spread of the medians of the trials.
    spread: f64,
}

/// Ships a 10 MiB container of five pallets to itself over a socket pair and receives it,
/// `rounds` times in each of 3 trials, in this process: the calls every hop makes
/// (`sendmsg` and `recvmsg` with five descriptors, `fstat` and `F_GET_SEALS` per received
/// memfd, the sender's five `close`s) without the switch to another process.
fn hop_floor(rounds: u32) -> Result<Floor> {
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use ferry::containers::Container;

    let (a, b) = UnixStream::pair()?;
    let (per, _) = pallet_layout(10 << 20);
    let mut c = Container::alloc(&[per; PALLETS])?;
    let hop = |c: Container| -> Result<Container> {
        c.ship(&a).map_err(|e| e.error)?;
        Ok(Container::receive(&b)?)
    };
    for _ in 0..200 {
        c = hop(c)?;
    }
    let trials = 3;
    let (mut all, mut medians) = (Vec::new(), Vec::new());
    let calls0 = ferry::stats::syscall_count();
    for _ in 0..trials {
        let mut us = Vec::with_capacity(rounds as usize);
        for _ in 0..rounds {
            let t = Instant::now();
            c = hop(c)?;
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        medians.push(median(&us));
        all.extend(us);
    }
    let syscalls = (ferry::stats::syscall_count() - calls0) as f64 / f64::from(trials * rounds);
    Ok(Floor {
        us: Summary::of(&all),
        syscalls,
        trials,
        spread: spread(&medians),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_pairs_with_a_cell() {
        let plan = Plan {
            pattern: Pattern::PingPong,
            wait: Wait::Block,
            touch: Touch::Header,
            sizes: vec![1 << 30],
            msgs: vec![1],
            warmup: vec![0],
            trials: 2,
            hops: 3,
        };
        let gs = batches(&plan);
        // Copy only at 0 and all above 64 MiB: 4 x 3 - 2 batches per trial.
        assert_eq!(gs.len(), 2 * 10);
        let fake = |g: &schedule::Batch, t: u64| Sample {
            kind: crate::protocol::SampleKind::OneWay,
            size: 1 << 30,
            trial: g.trial,
            bytes: g.access as u64,
            ns: vec![t; (g.warmup + g.timed) as usize - g.warmup as usize],
            syscalls: None,
        };
        let a: Vec<_> = gs.iter().map(|g| fake(g, 1_000)).collect();
        let b: Vec<_> = gs.iter().map(|g| fake(g, 3_000)).collect();
        let cells = pair(&plan, &a, &b).unwrap();
        assert_eq!(cells.len(), 10);
        assert!(cells.iter().all(|c| c.median_us() == 2.0));
    }
}
