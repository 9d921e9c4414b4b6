//! `ferry bench container`: the container-shipping paper's Figure 6. Five domains (five
//! processes) pass a message down a chain; the middle one reads and writes a chosen
//! amount of it; throughput is bytes / (transfer + access time), first domain to last.
//!
//! Three methods run in the same crew, interleaved per access amount and trial:
//! container shipping (memfds over `SCM_RIGHTS`, only the accessed pallets mapped),
//! physical copy through pipes, and virtual move (every pallet mapped and populated in
//! every domain). The worker side is [`crate::worker::domain`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use anyhow::{bail, Result};
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use rustix::pipe::{pipe_with, PipeFlags};

use super::crew::{Crew, WorkerSpec};
use super::ctx::BenchCtx;
use super::output::{bytes, num, ratio, BenchOutput, PlotSpec, Table};
use super::record::Record;
use super::stats::{median, spread, Summary};
use super::BenchDef;
use crate::transport::{stream, Endpoint};
use crate::worker::domain::{
    groups, pallet_layout, resolve, runs, Method, ACCESSES, ACCESSOR, ALL, CHEAP_MSGS,
    CHEAP_WARMUP, CHUNK, DOMAINS, METHODS, PALLETS,
};
use crate::worker::plan::{Pattern, Plan, Sample, Touch, Wait};
use crate::worker::Role;

pub const BENCH: BenchDef = BenchDef {
    name: "container",
    about: "5-domain pipeline throughput vs bytes accessed: container shipping, copy, virtual move (container shipping Figure 6)",
    run,
};

/// Longest one size's crew may run before its workers are killed.
const TIMEOUT: Duration = Duration::from_secs(300);

/// Figure 6 of the paper (DECstation 5000/200, Ultrix 4.2a; 10 MB in 5 pallets of 2 MB):
/// (access, method, MB/s) as the text states them; `None` where it gives no number.
const PAPER: &[(usize, [Option<f64>; 3])] = &[
    // container, copy, virtual move
    (0, [Some(15_000.0), Some(3.43), Some(234.0)]),
    (100 << 10, [Some(1_160.0), None, Some(201.0)]),
    (1 << 20, [None, None, None]),
    (ALL, [Some(13.9), Some(2.75), None]),
];

/// What the paper says about each access amount, in words.
fn paper_ratios(access: usize) -> (&'static str, &'static str) {
    match access {
        0 => ("~4,400x", "64x"),
        a if a == 100 << 10 => ("—", "~6x"),
        a if a == 1 << 20 => ("—", "1.57x (57% better)"),
        _ => ("~5x", "—"),
    }
}

fn access_label(a: usize, size: usize) -> String {
    if a >= size {
        format!("all ({})", bytes(size))
    } else if a == 0 {
        "0".into()
    } else {
        bytes(a)
    }
}

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
fn endpoint(fds: Vec<(&str, OwnedFd)>) -> Endpoint {
    let spec = fds
        .iter()
        .map(|(k, fd)| format!("{k}={}", fd.as_raw_fd()))
        .collect::<Vec<_>>()
        .join(",");
    Endpoint {
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
        let mut into: Vec<Option<Endpoint>> = (0..DOMAINS).map(|_| None).collect();
        let mut out_of: Vec<Option<Endpoint>> = (0..DOMAINS).map(|_| None).collect();
        for i in 0..DOMAINS - 1 {
            let (a, b) = sock_pair()?;
            let pipe = stream::pipe_link()?;
            let mut wr = pipe.tx.fds;
            let mut rd = pipe.rx.fds;
            out_of[i] = Some(endpoint(vec![("sock", a), ("pipe", wr.remove(0))]));
            into[i + 1] = Some(endpoint(vec![("sock", b), ("pipe", rd.remove(0))]));
        }
        // The return socket: the last domain sends the container (or a byte) back.
        let (a, b) = sock_pair()?;
        out_of[DOMAINS - 1] = Some(endpoint(vec![("sock", a)]));
        into[0] = Some(endpoint(vec![("sock", b)]));

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
            let ack = endpoint(vec![("lifeline", r)]);
            spec.ack = Some(Endpoint {
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
    let gs = groups(plan);
    if t0s.len() != gs.len() || t1s.len() != gs.len() {
        bail!(
            "expected {} groups of stamps, got {} and {}",
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

/// Bar checks: (description, measured, met).
fn verdicts(measured: &[Measured]) -> Vec<(String, String, bool)> {
    let mut v = Vec::new();
    for m in measured {
        let s = m.run.label();
        let rc = m.ratio(Method::Copy, 0);
        let rv = m.ratio(Method::VirtualMove, 0);
        v.push((
            format!("{s}, 0 B accessed: container >= 1000x copy"),
            ratio(rc),
            rc >= 1000.0,
        ));
        v.push((
            format!("{s}, 0 B accessed: container >= 10x virtual move"),
            ratio(rv),
            rv >= 10.0,
        ));
    }
    for m in measured {
        let r = m.ratio(Method::VirtualMove, 100 << 10);
        v.push((
            format!(
                "{}, 100 KiB accessed: container >= 3x virtual move",
                m.run.label()
            ),
            ratio(r),
            r >= 3.0,
        ));
    }
    let spread = |size: usize| {
        measured
            .iter()
            .find(|m| m.run.size == size && !m.run.one_cpu)
    };
    if let (Some(small), Some(big)) = (spread(10 << 20), spread(1 << 30)) {
        let t = |m: &Measured| {
            m.cell(Method::Container, 0)
                .map_or(f64::NAN, |c| c.median_us())
        };
        let (ts, tb) = (t(small), t(big));
        v.push((
            format!(
                "shipping {} takes <= 2x the time of {} ({PALLETS} pallets each, 0 B accessed)",
                bytes(big.run.size),
                bytes(small.run.size)
            ),
            format!("{} µs vs {} µs = {}", num(tb), num(ts), ratio(tb / ts)),
            tb <= 2.0 * ts,
        ));
    }
    v
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

    use ferry::container::Container;

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
    let calls0 = ferry::diagnostics::syscall_count();
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
    let syscalls =
        (ferry::diagnostics::syscall_count() - calls0) as f64 / f64::from(trials * rounds);
    Ok(Floor {
        us: Summary::of(&all),
        syscalls,
        trials,
        spread: spread(&medians),
    })
}

fn markdown(ctx: &BenchCtx, measured: &[Measured], memcpy_gbps: f64, floor: &Floor) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## container: five-domain pipeline throughput against bytes accessed (container shipping, Figure 6)\n"
    );
    let cpus: Vec<String> = (0..DOMAINS).map(|i| ctx.cpu(i).to_string()).collect();
    let _ = writeln!(
        md,
        "Five domains are five processes in a chain, pinned alternately to CPUs {} (domain 0 to 4); \
         the run marked \"on one CPU\" pins all five to CPU 0, as on the paper's uniprocessor, so each hop \
         is a switch on one CPU rather than a wake-up of the other. \
         The first domain owns the message; domain {ACCESSOR} (the middle) reads and writes the first N bytes \
         of it (each 8-byte word read and written back plus one). Time = transfer + access, from the first \
         domain starting a message to the last domain holding it; one message travels at a time (the last \
         domain sends the container, or a byte, back to the first before the next starts, outside the timing). \
         Throughput = message bytes / median time. The three methods run interleaved in one crew per size:\n",
        cpus.join(", ")
    );
    let _ = writeln!(
        md,
        "- **container shipping**: {PALLETS} memfd pallets shipped with `SCM_RIGHTS` over Unix socket pairs \
         between neighbours (`Container::ship`/`receive`, which checks each memfd); only the accessing domain \
         unloads (maps) the pallets holding its bytes;\n\
         - **physical copy**: each domain `read`s the whole message from a pipe into its own buffer and \
         `write`s it to the next pipe, {} at a time (the pipe capacity), so the domains copy in parallel: the \
         copy's best case;\n\
         - **virtual move**: the same shipping, but every domain, first and last included, unloads every pallet \
         and reads one word per page (maps and populates it) before passing it on.\n",
        bytes(CHUNK)
    );
    let _ = writeln!(
        md,
        "memcpy on this machine, this run: {memcpy_gbps:.2} GB/s (the physical limit a copy approaches).\n"
    );
    for m in measured {
        let size = m.run.size;
        let (per, _) = pallet_layout(size);
        let _ = writeln!(
            md,
            "### {} in {PALLETS} pallets of {} ({} trial{} x {} timed message{} per method and access amount, {} warm-up{}{})\n",
            m.run.label(),
            if per % (1 << 20) == 0 { bytes(per) } else { format!("{} pages", per / 4096) },
            m.run.trials,
            if m.run.trials == 1 { "" } else { "s" },
            m.run.msgs,
            if m.run.msgs == 1 { "" } else { "s" },
            m.run.warmup,
            if m.run.msgs < CHEAP_MSGS || m.run.warmup < CHEAP_WARMUP {
                format!("; container shipping below all accessed: {} messages after {} warm-up", m.run.msgs.max(CHEAP_MSGS), m.run.warmup.max(CHEAP_WARMUP))
            } else {
                String::new()
            },
            if runs(Method::Copy, 100 << 10, size) {
                ""
            } else {
                "; the copy only at 0 and all accessed: it takes seconds, which 100 KiB or 1 MiB of access would change by well under 1%"
            }
        );
        let mut t = Table::new(&[
            "bytes accessed",
            "container MB/s",
            "copy MB/s",
            "virtual move MB/s",
            "container T+A µs",
            "copy T+A µs",
            "virtual move T+A µs",
            "container / copy",
            "container / virtual move",
            "paper: / copy",
            "paper: / virtual move",
            "spread (c, p, v)",
        ]);
        for &a in &ACCESSES {
            let cell = |meth| m.cell(meth, a);
            let us = |meth| cell(meth).map_or(f64::NAN, |c| c.median_us());
            let sp = |meth| {
                cell(meth).map_or("—".to_string(), |c| {
                    format!("{:.0}%", 100.0 * spread(&c.per_trial_us))
                })
            };
            let (pc, pv) = paper_ratios(a);
            t.row(vec![
                access_label(resolve(a, size), size),
                num(m.mbps(Method::Container, a)),
                num(m.mbps(Method::Copy, a)),
                num(m.mbps(Method::VirtualMove, a)),
                num(us(Method::Container)),
                num(us(Method::Copy)),
                num(us(Method::VirtualMove)),
                ratio(m.ratio(Method::Copy, a)),
                ratio(m.ratio(Method::VirtualMove, a)),
                pc.into(),
                pv.into(),
                format!(
                    "{}, {}, {}",
                    sp(Method::Container),
                    sp(Method::Copy),
                    sp(Method::VirtualMove)
                ),
            ]);
        }
        md.push_str(&t.render());
        let _ = writeln!(
            md,
            "\nHarness descriptors: {} open before, {} after (every link end went to exactly one domain; \
             each domain checked at exit that it held no memfd).\n",
            m.fds_before, m.fds_after
        );
    }
    let _ = writeln!(
        md,
        "The paper (DECstation 5000/200, Ultrix 4.2a; 10 MB in 5 pallets of 2 MB; MB/s as its text gives them, \
         — where it gives none):\n"
    );
    let mut t = Table::new(&[
        "bytes accessed",
        "container MB/s",
        "copy MB/s",
        "virtual move MB/s",
        "container / copy",
        "container / virtual move",
    ]);
    for (a, v) in PAPER {
        let cellf = |x: Option<f64>| x.map_or("—".to_string(), num);
        let (pc, pv) = paper_ratios(*a);
        t.row(vec![
            if *a == ALL {
                "all (10 MB)".into()
            } else if *a == 0 {
                "0".into()
            } else {
                bytes(*a)
            },
            cellf(v[0]),
            cellf(v[1]),
            cellf(v[2]),
            pc.into(),
            pv.into(),
        ]);
    }
    md.push_str(&t.render());
    let _ = writeln!(md, "\nBars (issue 3):\n");
    for (what, got, ok) in verdicts(measured) {
        let _ = writeln!(md, "- {} {what}: {got}", if ok { "MET" } else { "NOT MET" });
    }
    let hops = DOMAINS - 1;
    let _ = writeln!(
        md,
        "\nThe floor of a hop, measured in this run: shipping a 10 MiB container of {PALLETS} pallets \
         and receiving it in one process, with no switch or wake-up, takes {} µs (median; p99 {} µs) \
         and {:.0} system calls through ferry's sys layer (`sendmsg`, `recvmsg` for the header and again for \
         the pallet entries, `fstat` and `F_GET_SEALS` per received memfd) plus the sender's {PALLETS} `close`s: \
         the move model and the receiver's checks need each one. \
         {hops} hops cost at least {} µs, so even with free scheduling container shipping could reach at most:\n",
        num(floor.us.median),
        num(floor.us.p99),
        floor.syscalls,
        num(hops as f64 * floor.us.median)
    );
    for m in measured.iter().filter(|m| m.run.size == 10 << 20) {
        let copy = m.cell(Method::Copy, 0).map_or(f64::NAN, |c| c.median_us());
        let _ = writeln!(
            md,
            "- {}: this run's copy ({} µs) / {} µs = {} over copy",
            m.run.label(),
            num(copy),
            num(hops as f64 * floor.us.median),
            ratio(copy / (hops as f64 * floor.us.median))
        );
    }
    md.push('\n');
    md
}

fn plot(m: &Measured) -> PlotSpec {
    let size = m.run.size;
    // Log x cannot show 0: like the paper's graph, the axis is cut and 0 drawn at 1 KiB.
    let x = |a: usize| if a == 0 { 1.0 } else { a as f64 / 1024.0 };
    let series = METHODS
        .iter()
        .map(|&meth| {
            let pts = ACCESSES
                .iter()
                .map(|&a| (x(resolve(a, size)), m.mbps(meth, a)))
                .collect();
            (meth.label().to_string(), pts)
        })
        .collect();
    PlotSpec {
        stem: format!("container-{}", m.run.label().replace(' ', "-")),
        title: format!(
            "{DOMAINS}-domain pipeline, {} in {PALLETS} pallets (cf. container shipping Fig. 6)",
            m.run.label()
        ),
        x_label: "KiB accessed by the middle domain (0 drawn at 1)".into(),
        y_label: "MB/s = bytes / (transfer + access)".into(),
        series,
        log_x: true,
        log_y: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_ratios_match_the_text() {
        let at = |a: usize| PAPER.iter().find(|p| p.0 == a).unwrap().1;
        let [c, p, v] = at(0).map(|x| x.unwrap());
        assert!((c / p - 4_400.0).abs() < 100.0);
        assert!((c / v - 64.0).abs() < 1.0);
        let r = at(100 << 10);
        assert!((r[0].unwrap() / r[2].unwrap() - 6.0).abs() < 0.3);
        let r = at(ALL);
        assert!((r[0].unwrap() / r[1].unwrap() - 5.0).abs() < 0.1);
    }

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
        let gs = groups(&plan);
        // Copy only at 0 and all above 64 MiB: 4 x 3 - 2 groups per trial.
        assert_eq!(gs.len(), 2 * 10);
        let fake = |g: &crate::worker::domain::Group, t: u64| Sample {
            kind: crate::worker::plan::SampleKind::OneWay,
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
