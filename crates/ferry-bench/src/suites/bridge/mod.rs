//! `ferry-bench bridge`: the cost of carrying a service to another host through two
//! `ferry-bridge`s (crate `ferry-zenoh`), against zenoh's own publish-subscribe between
//! the same two endpoints, and what an attached bridge costs the local subscribers.
//!
//! One process holds everything, each part on its own thread: host A is ferry group A
//! with its bridge (listening on a loopback port), host B is group B with its bridge
//! (connecting to it); a publisher on A, a subscriber on A and one on B. The baseline is
//! two zenoh sessions on another loopback port, one putting and one subscribing (FIFO
//! channel, read by its own thread as an application would), both remote-only.
//!
//! - Latency: one message at a time, the sender's `CLOCK_MONOTONIC` stamp in its first
//!   8 bytes, the receiver's stamp on arrival; the next message leaves once it arrived.
//!   Each wait is for the message with the stamp just sent: messages of an earlier phase
//!   that the bridges still carry are skipped (counting them as the awaited one made
//!   1 MiB look like ~17 ms).
//! - Throughput: as many messages as fit in the budget, back to back (blocking
//!   congestion control on both, so none is lost), timed from the first send to the last
//!   arrival of this phase's messages.
//! - Local hand-over on A: the latency above, A's publisher to A's subscriber, before
//!   the bridges start; with A's bridge attached but no far subscriber (B's bridge not
//!   yet started); and with B's subscriber, the bridge carrying every message (the next
//!   message leaves once it reached both subscribers).
//!
//! The bars (issue 24): through the bridges at least 0.9x zenoh's throughput at 64 KiB
//! and above, at most 1.2x its latency at every size; the local hand-over with the
//! bridge attached at most 1.1x of without.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use ferry::{Group, Publisher, ServiceConfig, SlowSubscriber, Subscriber};
use ferry_zenoh::{run_in, zenoh_config, BridgeConfig};
use zenoh::handlers::FifoChannel;
use zenoh::qos::CongestionControl;
use zenoh::sample::Locality;
use zenoh::Wait;

use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;

pub const BENCH: BenchDef = BenchDef {
    name: "bridge",
    about: "two hosts through ferry-bridge (zenoh) vs zenoh pub/sub: latency, throughput, local hand-over with the bridge attached",
    run,
};

pub const BAR_THROUGHPUT: f64 = 0.9;
pub const BAR_LATENCY: f64 = 1.2;
pub const BAR_LOCAL: f64 = 1.1;

const SERVICE: &str = "bench/stream";
const WAIT: Duration = Duration::from_secs(30);

fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn stamp_of(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// A thread that receives with `recv` until stopped, reporting each message's send
/// stamp and its arrival (ns).
fn receiver(
    stop: Arc<AtomicBool>,
    mut recv: impl FnMut() -> Option<u64> + Send + 'static,
) -> (Receiver<(u64, u64)>, JoinHandle<()>) {
    let (tx, rx): (Sender<(u64, u64)>, _) = channel();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Some(stamp) = recv() {
                if tx.send((stamp, now_ns())).is_err() {
                    break;
                }
            }
        }
    });
    (rx, h)
}

/// Waits on `rx` for the message stamped `stamp`: its one-way latency in ns. Messages
/// of earlier phases still in flight (a backlog the bridges are still carrying) are
/// skipped, never counted as this one.
fn arrival(rx: &Receiver<(u64, u64)>, stamp: u64) -> Result<u64> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (s, at) = rx.recv_timeout(left).context("a message did not arrive")?;
        if s == stamp {
            return Ok(at.saturating_sub(s));
        }
    }
}

/// Latencies (µs) on `rxs[0]` of `n` messages sent one at a time by `send`, each waited
/// for on every one of `rxs` before the next leaves.
fn latencies(
    n: usize,
    rxs: &[&Receiver<(u64, u64)>],
    mut send: impl FnMut(u64) -> Result<()>,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let stamp = now_ns();
        send(stamp)?;
        out.push(arrival(rxs[0], stamp)? as f64 / 1e3);
        for rx in &rxs[1..] {
            arrival(rx, stamp)?;
        }
    }
    Ok(out)
}

/// MB/s of `n` messages of `size` bytes sent back to back by `send`, all counted on `rx`
/// (earlier phases' messages still in flight are not).
fn throughput(
    n: usize,
    size: usize,
    rx: &Receiver<(u64, u64)>,
    mut send: impl FnMut(u64) -> Result<()>,
) -> Result<f64> {
    let t0 = Instant::now();
    let first = now_ns();
    for _ in 0..n {
        send(now_ns())?;
    }
    let deadline = Instant::now() + WAIT;
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let (s, _) = rx.recv_timeout(left).context("a message did not arrive")?;
        if s >= first {
            got += 1;
        }
    }
    Ok((n * size) as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Row {
    size: usize,
    bridge_lat: Summary,
    zenoh_lat: Summary,
    bridge_mbs: f64,
    zenoh_mbs: f64,
    local_without: Summary,
    /// The bridge attached and exporting, no far subscriber.
    local_idle: Summary,
    /// A far subscriber on B, the bridge carrying every message.
    local_with: Summary,
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let sizes: &[usize] = if ctx.quick {
        &[64, 64 << 10, 1 << 20]
    } else {
        &[64, 64 << 10, 1 << 20, 8 << 20]
    };
    let lat_n = if ctx.quick { 200 } else { 2000 };
    let bytes_budget: usize = if ctx.quick { 64 << 20 } else { 512 << 20 };
    let count = |size: usize| (bytes_budget / size).clamp(200, 20_000);
    let id = std::process::id();
    let (ga, gb, scope) = (format!("bbA-{id}"), format!("bbB-{id}"), format!("bb{id}"));
    let stop = Arc::new(AtomicBool::new(false));

    // Host A's publisher and local subscriber.
    let group_a = Group::open(&ga)?;
    let (pd, sd) = (group_a.join()?, group_a.join()?);
    let config = ServiceConfig {
        depth: 16,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    let mut publisher = Publisher::offer(&pd, SERVICE, config)?;
    let mut local = Subscriber::open(&sd, SERVICE, WAIT)?;
    publisher.wait_for_subscribers(1, WAIT)?;
    let (local_rx, local_h) = receiver(stop.clone(), move || {
        let d = local.recv_timeout(Duration::from_millis(50)).ok()?;
        let mut b = [0u8; 8];
        d.copy_range_to_slice(0..8, &mut b);
        Some(stamp_of(&b))
    });
    let send = |size: usize| {
        move |p: &mut Publisher, stamp: u64| -> Result<()> {
            let mut m = p.loan(size)?;
            m.as_mut_slice()[..8].copy_from_slice(&stamp.to_le_bytes());
            m.send()?;
            Ok(())
        }
    };
    let mut local_without = Vec::new();
    for &size in sizes {
        ctx.progress.phase(&format!(
            "bridge: local hand-over without the bridge, {size} B"
        ));
        let s = send(size);
        local_without.push(latencies(lat_n, &[&local_rx], |t| s(&mut publisher, t))?);
    }

    // A's bridge alone: attached, exporting the service, but with no far subscriber.
    ctx.progress.phase("bridge: starting A's bridge");
    let port = free_port()?;
    let ep = format!("tcp/127.0.0.1:{port}");
    let group_b = Group::open(&gb)?;
    let bridge = |g: Arc<Group>, listen: bool| {
        let mut c = BridgeConfig::new(g.name());
        c.scope = Some(scope.clone());
        c.log = std::env::var_os("FERRY_BENCH_BRIDGE_LOG").is_some();
        if listen {
            c.listen.push(ep.clone());
        } else {
            c.connect.push(ep.clone());
        }
        let s = stop.clone();
        std::thread::spawn(move || run_in(g, &c, &s))
    };
    let mut bridges = vec![bridge(group_a.clone(), true)];
    // Time for the bridge to find the service and export it (it scans every 100 ms).
    std::thread::sleep(Duration::from_millis(1000));
    let idle_subscribed = publisher.subscriber_count() > 1;
    let mut local_idle = Vec::new();
    for &size in sizes {
        ctx.progress.phase(&format!(
            "bridge: local hand-over, bridge attached, no far subscriber, {size} B"
        ));
        let s = send(size);
        local_idle.push(latencies(lat_n, &[&local_rx], |t| s(&mut publisher, t))?);
    }

    // Host B's bridge, then its subscriber (which waits for the import).
    ctx.progress.phase("bridge: starting B's bridge");
    bridges.push(bridge(group_b.clone(), false));
    let bd = group_b.join()?;
    let mut remote = Subscriber::open(&bd, SERVICE, WAIT).context("the service never reached B")?;
    publisher.wait_for_subscribers(2, WAIT)?;
    let (remote_rx, remote_h) = receiver(stop.clone(), move || {
        let d = remote.recv_timeout(Duration::from_millis(50)).ok()?;
        let mut b = [0u8; 8];
        d.copy_range_to_slice(0..8, &mut b);
        Some(stamp_of(&b))
    });
    let mut bridged = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        ctx.progress
            .phase(&format!("bridge: through the bridges, {size} B"));
        let s = send(size);
        let lat = latencies(lat_n, &[&remote_rx], |t| s(&mut publisher, t))?;
        let with = latencies(lat_n, &[&local_rx, &remote_rx], |t| s(&mut publisher, t))?;
        let mbs = throughput(count(size), size, &remote_rx, |t| s(&mut publisher, t))?;
        bridged.push((i, lat, with, mbs));
    }
    drop(publisher);

    // zenoh's own publish-subscribe between two sessions, as the bridges are joined.
    ctx.progress.phase("bridge: zenoh's own publish-subscribe");
    let port = free_port()?;
    let ep = vec![format!("tcp/127.0.0.1:{port}")];
    let za = zenoh::open(zenoh_config(&ep, &[], false)?)
        .wait()
        .map_err(|e| anyhow!("{e}"))?;
    let zb = zenoh::open(zenoh_config(&[], &ep, false)?)
        .wait()
        .map_err(|e| anyhow!("{e}"))?;
    let key = format!("bench/{scope}");
    let zsub = zb
        .declare_subscriber(&key)
        .allowed_origin(Locality::Remote)
        .with(FifoChannel::new(16))
        .wait()
        .map_err(|e| anyhow!("{e}"))?;
    let zpub = za
        .declare_publisher(&key)
        .congestion_control(CongestionControl::Block)
        .allowed_destination(Locality::Remote)
        .wait()
        .map_err(|e| anyhow!("{e}"))?;
    let (z_rx, z_h) = receiver(stop.clone(), move || {
        let s = zsub
            .recv_timeout(Duration::from_millis(50))
            .ok()
            .flatten()?;
        let mut b = [0u8; 8];
        let mut r = s.payload().reader();
        std::io::Read::read_exact(&mut r, &mut b).ok()?;
        Some(stamp_of(&b))
    });
    let zsend = |size: usize| {
        let zpub = &zpub;
        move |stamp: u64| -> Result<()> {
            let mut v = vec![0u8; size];
            v[..8].copy_from_slice(&stamp.to_le_bytes());
            zpub.put(v).wait().map_err(|e| anyhow!("{e}"))
        }
    };
    // The subscription reaches the publisher's session asynchronously: wait for it.
    let t0 = Instant::now();
    loop {
        zsend(64)(now_ns())?;
        if z_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        if t0.elapsed() > WAIT {
            anyhow::bail!("zenoh's subscriber never matched");
        }
    }
    let mut rows = Vec::new();
    for (i, lat, with, mbs) in bridged {
        let size = sizes[i];
        ctx.progress
            .phase(&format!("bridge: zenoh alone, {size} B"));
        let zl = latencies(lat_n, &[&z_rx], zsend(size))?;
        let zt = throughput(count(size), size, &z_rx, zsend(size))?;
        rows.push(Row {
            size,
            bridge_lat: Summary::of(&lat),
            zenoh_lat: Summary::of(&zl),
            bridge_mbs: mbs,
            zenoh_mbs: zt,
            local_without: Summary::of(&local_without[i]),
            local_idle: Summary::of(&local_idle[i]),
            local_with: Summary::of(&with),
        });
    }
    stop.store(true, Ordering::Relaxed);
    for h in [local_h, remote_h, z_h] {
        let _ = h.join();
    }
    for b in bridges {
        b.join().map_err(|_| anyhow!("a bridge panicked"))??;
    }
    drop((zpub, za, zb));
    Ok(report(&rows, idle_subscribed, ctx.quick))
}

fn report(rows: &[Row], idle_subscribed: bool, quick: bool) -> BenchOutput {
    let mut md = String::new();
    md.push_str(&format!(
        "## bridge: two hosts through ferry-bridge vs zenoh pub/sub (loopback{})\n\n",
        if quick { ", quick" } else { "" }
    ));
    md.push_str("| size | latency bridge µs | zenoh µs | ratio (bar <= 1.2) | MB/s bridge | zenoh | ratio (bar >= 0.9 at >= 64 KiB) | local hand-over µs without bridge | bridge, no far sub | ratio (bar <= 1.1) | bridge carrying to B | ratio (bar <= 1.1) |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut records = Vec::new();
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    for r in rows {
        let lr = r.bridge_lat.median / r.zenoh_lat.median;
        let tr = r.bridge_mbs / r.zenoh_mbs;
        let loc = r.local_with.median / r.local_without.median;
        let idle = r.local_idle.median / r.local_without.median;
        let tbar = if r.size >= 64 << 10 {
            verdict(tr >= BAR_THROUGHPUT)
        } else {
            "-"
        };
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {lr:.2} {} | {:.0} | {:.0} | {tr:.2} {tbar} | {:.1} | {:.1} | {idle:.2} {} | {:.1} | {loc:.2} {} |\n",
            r.size,
            r.bridge_lat.median,
            r.zenoh_lat.median,
            verdict(lr <= BAR_LATENCY),
            r.bridge_mbs,
            r.zenoh_mbs,
            r.local_without.median,
            r.local_idle.median,
            verdict(idle <= BAR_LOCAL),
            r.local_with.median,
            verdict(loc <= BAR_LOCAL),
        ));
        for (series, s) in [
            ("bridge latency", r.bridge_lat),
            ("zenoh latency", r.zenoh_lat),
            ("local without bridge", r.local_without),
            ("local with bridge, no far subscriber", r.local_idle),
            ("local with bridge", r.local_with),
        ] {
            let mut rec = Record::new("bridge", series, "us", s, 1, 0.0);
            rec.params.insert("size".into(), r.size.into());
            records.push(rec);
        }
    }
    md.push_str(&format!(
        "\nWith no far subscriber, A's bridge {} the service locally.\n",
        if idle_subscribed {
            "was subscribed to"
        } else {
            "was not subscribed to"
        }
    ));
    md.push_str("\nLatency: medians of one-way stamps, one message at a time. Throughput: back to back, blocking congestion control.\n");
    BenchOutput {
        records,
        markdown: md,
        plots: Vec::new(),
    }
}
