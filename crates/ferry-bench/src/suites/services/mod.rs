//! `ferry-bench services`: what one publish costs the publisher, against the number of
//! subscribers (1 to 8) and the payload size (64 B to 16 MiB).
//!
//! The publisher (this process, pinned to the first CPU) offers a publish-subscribe
//! service with the blocking policy and a queue of 256 per subscriber. The subscribers
//! are N domains of one other process (`ferry-bench __drain`, pinned to the second CPU) that
//! busy-polls their queues in turn and drops each message at once, so releases flow back
//! as in a real consumer and every ring slot the publisher writes is a cache line the
//! other CPU last read. One message (written one byte per page before the run) is
//! published again and again: the publisher's cost is the descriptor per subscriber,
//! not the payload, and the table shows whether it stays flat across sizes. Each point
//! is the median over bursts of the mean time of one `publish` call in the burst; a
//! burst (200 publishes) starts with every queue drained and fits in the queues, so it
//! measures the publisher rather than how fast the subscriber process keeps up. The
//! column "per added subscriber" is the slope of a least-squares line through the
//! points of one size.
//!
//! A last point prices the drop policy's eviction: one subscriber, stopped (SIGSTOP)
//! with its queue full, so that every publish first takes back the oldest queued message
//! (a compare-and-swap of the ring head, and that message's fbufs returned) before it
//! queues the new one.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry::{Group, IoData, PathConfig, Publisher, ServiceConfig, SlowSubscriber};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, num, BenchOutput, Table};
use crate::harness::record::Record;
use crate::harness::stats::{linear_fit, spread, Summary};
use crate::harness::BenchDef;
use crate::sys;

pub const BENCH: BenchDef = BenchDef {
    name: "services",
    about: "publish-subscribe: the publisher's cost per publish vs subscribers (1..8, another process) and payload size (64 B..16 MiB)",
    run,
};

const SIZES: &[usize] = &[64, 4096, 64 << 10, 1 << 20, 16 << 20];
const QUICK_SIZES: &[usize] = &[64, 1 << 20];
const SUBS: &[usize] = &[1, 2, 4, 8];
const QUICK_SUBS: &[usize] = &[1, 4];
/// Publishes timed together: fewer than a queue holds, so the publisher never waits.
const BURST: usize = 200;
const WARMUP: usize = 5;

/// The subscriber process: `ferry-bench __drain GROUP SERVICE N CPU`.
pub fn drain_main(args: &[String]) -> Result<()> {
    let [group, service, n, cpu] = args else {
        anyhow::bail!("usage: ferry-bench __drain GROUP SERVICE N CPU");
    };
    let _ = sys::pin_to(cpu.parse()?);
    let group = Group::open(group)?;
    let mut subs = Vec::new();
    for _ in 0..n.parse::<usize>()? {
        let d = group.join()?;
        let s = ferry::Subscriber::open(&d, service, Duration::from_secs(30))?;
        subs.push((d, s));
    }
    let mut open = subs.len();
    while open > 0 {
        open = 0;
        for (_, s) in subs.iter_mut() {
            match s.try_recv() {
                Ok(_) => open += 1,
                Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let sizes = ctx.pick(QUICK_SIZES, SIZES);
    let subs_list = ctx.pick(QUICK_SUBS, SUBS);
    let rounds = ctx.pick(30, 300);
    let name = format!("bench-services-{}", std::process::id());
    let group = Group::open(&name)?;
    let domain = group.join()?;
    let path = domain.path(PathConfig::default())?;
    sys::pin_to(ctx.cpu(0))?;
    let mut records = Vec::new();
    // medians[size][subs] in µs.
    let mut medians = vec![vec![f64::NAN; subs_list.len()]; sizes.len()];
    for (si, &n) in subs_list.iter().enumerate() {
        ctx.progress
            .phase(&format!("services: publish to {n} subscribers"));
        let service = format!("bench/{n}");
        let config = ServiceConfig {
            depth: 256,
            slow: SlowSubscriber::Block,
            ..ServiceConfig::default()
        };
        let mut publisher = Publisher::offer(&domain, &service, config)?;
        let mut child = Drain(
            Command::new(std::env::current_exe()?)
                .args(["__drain", &name, &service, &n.to_string()])
                .arg(ctx.cpu(1).to_string())
                .spawn()
                .context("spawning the subscriber process")?,
        );
        publisher.wait_for_subscribers(n, Duration::from_secs(30))?;
        for (zi, &size) in sizes.iter().enumerate() {
            let data = touched(&path, size)?;
            let mut samples = Vec::with_capacity(rounds);
            for round in 0..rounds + WARMUP {
                // Start each burst with every queue drained, so that the burst measures
                // the publisher, not how fast the subscriber process keeps up.
                drained(&mut publisher)?;
                let t0 = Instant::now();
                for _ in 0..BURST {
                    publisher.publish(&data)?;
                }
                if round >= WARMUP {
                    samples.push(t0.elapsed().as_secs_f64() * 1e6 / BURST as f64);
                }
            }
            let s = Summary::of(&samples);
            medians[zi][si] = s.median;
            records.push(
                Record::new(
                    "services",
                    "publish",
                    "us",
                    s,
                    rounds as u32,
                    spread(&samples),
                )
                .param("subscribers", n)
                .param("size", size),
            );
        }
        drop(publisher);
        child.wait()?;
    }
    ctx.progress
        .phase("services: publish to a stopped subscriber (drop policy)");
    let evict = evicting(ctx, &name, &domain, &path, rounds)?;
    records.push(
        Record::new(
            "services",
            "publish_evicting",
            "us",
            Summary::of(&evict),
            rounds as u32,
            spread(&evict),
        )
        .param("subscribers", 1)
        .param("size", 64),
    );
    let mut headers: Vec<String> = vec!["payload".into()];
    headers.extend(subs_list.iter().map(|n| format!("{n} sub (µs)")));
    headers.push("per added subscriber (µs)".into());
    let hdr: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(&hdr);
    for (zi, &size) in sizes.iter().enumerate() {
        let pts: Vec<(f64, f64)> = subs_list
            .iter()
            .zip(&medians[zi])
            .map(|(&n, &m)| (n as f64, m))
            .collect();
        let slope = linear_fit(&pts).map_or(f64::NAN, |f| f.slope);
        let mut row = vec![bytes(size)];
        row.extend(medians[zi].iter().map(|&m| num(m)));
        row.push(num(slope));
        table.row(row);
    }
    let markdown = format!(
        "### services: the publisher's cost per publish\n\n\
         One publish to N subscribers in another process (pinned to the other CPU), \
         blocking policy, queues of 256; median over {rounds} bursts of {BURST} \
         publishes, each burst started with the queues drained. The payload is not copied: the cost should not grow with its size, \
         only with the number of subscribers (one descriptor and one ring slot each).\n\n{}\n\
         Drop policy, one subscriber stopped with its queue full (every publish evicts the \
         oldest queued message and takes its fbufs back), 64 B: {} µs per publish \
         (median over {rounds} bursts of {BURST}).\n",
        table.render(),
        num(Summary::of(&evict).median)
    );
    Ok(BenchOutput {
        records,
        markdown,
        plots: Vec::new(),
    })
}

/// Per-publish times (µs, one per burst) under the drop policy with one subscriber
/// stopped and its queue full, so that every publish evicts.
fn evicting(
    ctx: &BenchCtx,
    group: &str,
    domain: &ferry::Domain,
    path: &ferry::PathAllocator,
    rounds: usize,
) -> Result<Vec<f64>> {
    const DEPTH: u32 = 256;
    let service = "bench/evict";
    let config = ServiceConfig {
        depth: DEPTH,
        slow: SlowSubscriber::Drop,
        ..ServiceConfig::default()
    };
    let mut publisher = Publisher::offer(domain, service, config)?;
    let mut child = Drain(
        Command::new(std::env::current_exe()?)
            .args(["__drain", group, service, "1"])
            .arg(ctx.cpu(1).to_string())
            .spawn()
            .context("spawning the subscriber process")?,
    );
    publisher.wait_for_subscribers(1, Duration::from_secs(30))?;
    let pid = rustix::process::Pid::from_raw(child.0.id() as i32).context("child pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::STOP)?;
    let data = touched(path, 64)?;
    // Fill its queue (it may have taken a few before it stopped).
    while publisher.stats().dropped == 0 {
        publisher.publish(&data)?;
    }
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds + WARMUP {
        let before = publisher.stats().dropped;
        let t0 = Instant::now();
        for _ in 0..BURST {
            publisher.publish(&data)?;
        }
        let dt = t0.elapsed();
        anyhow::ensure!(
            publisher.stats().dropped - before == BURST as u64,
            "a publish to a full queue did not evict"
        );
        if round >= WARMUP {
            samples.push(dt.as_secs_f64() * 1e6 / BURST as f64);
        }
    }
    rustix::process::kill_process(pid, rustix::process::Signal::CONT)?;
    drop(publisher);
    child.wait()?;
    Ok(samples)
}

/// Waits until every subscriber released everything (untimed).
fn drained(p: &mut Publisher) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        p.collect_releases();
        if p.subscribers().iter().all(|s| s.in_flight == 0) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "subscribers stopped draining");
        std::thread::yield_now();
    }
}

/// A frozen message of `size` bytes with one byte written per page.
fn touched(path: &ferry::PathAllocator, size: usize) -> Result<IoData> {
    let mut m = path.alloc(size)?;
    for at in (0..size).step_by(4096) {
        m.write_at(at, &[at as u8 | 1]);
    }
    Ok(m.freeze())
}

/// The subscriber process, killed if the run fails before it ends by itself.
struct Drain(Child);

impl Drain {
    fn wait(&mut self) -> Result<()> {
        let st = self.0.wait()?;
        anyhow::ensure!(st.success(), "the subscriber process failed: {st}");
        Ok(())
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
