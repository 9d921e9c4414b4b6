//! `ferry-bench bridge`: the cost of carrying a service to another host through two
//! `ferry-bridge`s (crate `ferry-zenoh`), against zenoh's own publish-subscribe between
//! the same two hosts, and what an attached bridge costs the local subscribers.
//!
//! Two "hosts" are two network namespaces joined by a veth pair
//! (`ferry_xdp::testnet`; on loopback, with the reason printed, where namespaces cannot
//! be made), and two ferry groups (A and B). Every part is its own process
//! (`ferry-bench __bridge`, [`worker`]):
//!
//! - on A: the publisher (which drives the run), a process of local subscribers, a
//!   second plain subscriber, and A's bridge (listening);
//! - on B: B's bridge (connecting to A's), a subscriber, and zenoh's own subscriber,
//!   connected to a zenoh publisher in A's publisher process, and a second zenoh
//!   subscriber (its own key and publisher) that copies each message into an fbuf of a
//!   ferry path in B's group (`bench/zcopy`, denied by both bridges) and publishes it
//!   before it reports, as B's bridge does with what it imports.
//!
//! A's publisher offers one service per case, and the bridges' deny lists decide which
//! cross: `bench/alone` (A's bridge denies it: ferry's own hand-over, nothing else
//! attached), `bench/idle` (B's bridge denies it: A's bridge exports it but has no far
//! subscriber), `bench/two` (denied by A's bridge, with a second plain local
//! subscriber that copies every byte out, as the bridge's local half does) and
//! `bench/carry` (carried to B's subscriber; A's subscriber joined before the bridge)
//! and `bench/early` (the same, but A's subscriber joins after the bridge, which so comes
//! first in the publisher's list of subscribers), and `bench/zcarry` (denied by A's
//! bridge; with each message the publisher puts the same bytes to zenoh's subscriber on
//! B: the local hand-over while the far host's work shares the CPUs, without a bridge,
//! the fair floor of `bench/carry`). Latency: one message at a time, the
//! sender's `CLOCK_MONOTONIC` stamp in its header, each receiver's stamp on arrival; the
//! next message leaves once every receiver of the case has it and a pause (50 µs plus
//! 1 µs per KiB, at most 2 ms) has let what it left running end. The cases take turns
//! message by message (zenoh's reference among them, each turn in another of their
//! orders), so that a disturbance of the
//! shared machine falls on all alike. Every other turn runs back to back instead, with
//! no pause and only the latency bar's cases (no bridge, carrying, zenoh's, zenoh's
//! copying): the
//! report gives the latency both from idle CPUs and in a steady stream. Throughput: after a warm-up burst
//! (drained), back to back for a fixed time (blocking congestion control on both),
//! timed from the first send to the last arrival, bridge, zenoh and its copying
//! subscriber in turn (which goes first turns per round), on `bench/far`, which only B subscribes to (as only B
//! subscribes to zenoh's reference).
//!
//! The bars (issue 24): through the bridges at least 0.9x zenoh's throughput at 64 KiB
//! and above, at most 1.2x its latency at every size; the local hand-over with the
//! bridge attached at most 1.1x of without. The report prints floors measured in the
//! same rounds. Through the bridges: zenoh's publish-subscribe with the bridge's one
//! copy (into an fbuf, on B, before the message counts), which on two real hosts would
//! run on B's CPUs but here takes the CPUs that zenoh's threads and A's publisher use
//! too; for throughput that is the floor, for latency it is that plus two of ferry's
//! hand-overs (the bridge path's two more process hops: publisher to A's bridge, B's
//! bridge to the subscriber). (At 1 MiB B's bridge copies a message's chunks as they
//! arrive, the floor's subscriber the whole message once it came: there the latency
//! floor counts a copy the bridge mostly overlaps with the network.) For the local
//! cost, the higher of two: the hand-over with a second
//! plain subscriber instead of the bridge (what one more subscriber process costs,
//! bridge or not), and the hand-over while zenoh carries the same message to B
//! (`bench/zcarry`: the far host's work on the same CPUs, without a bridge).

pub mod worker;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_xdp::testnet::{self, Net};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;
use worker::{Plan, Results, Role, Spec, Who, ALONE, CARRY, EARLY, FAR, IDLE, TWO, ZCARRY, ZCOPY};

pub const BENCH: BenchDef = BenchDef {
    name: "bridge",
    about: "two hosts (network namespaces) through ferry-bridge (zenoh) vs zenoh pub/sub: latency, throughput, local hand-over with the bridge attached",
    run,
};

pub const BAR_THROUGHPUT: f64 = 0.9;
pub const BAR_LATENCY: f64 = 1.2;
pub const BAR_LOCAL: f64 = 1.1;

/// The second octet of the namespaces' addresses.
const NET: u8 = 83;

/// The run's processes: on drop, each still running gets SIGTERM, then SIGKILL.
struct Procs(Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_child(c),
                    rustix::process::Signal::TERM,
                );
            }
        }
        for (_, c) in &mut self.0 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// What is removed at the end, however the run ends: the FIFO, the namespaces, the
/// groups' files (after every process is gone; their names are this run's own).
struct Cleanup {
    fifo: String,
    groups: [String; 2],
    net: Option<Net>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.fifo);
        for g in &self.groups {
            let _ = std::fs::remove_file(format!("/dev/shm/ferry.{g}"));
        }
        self.net.take();
    }
}

fn spawn(procs: &mut Procs, what: &str, spec: &Spec, stdout: Stdio) -> Result<()> {
    let child = Command::new(std::env::current_exe()?)
        .arg("__bridge")
        .arg(serde_json::to_string(spec)?)
        .stdin(Stdio::null())
        .stdout(stdout)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    procs.0.push((what.to_owned(), child));
    Ok(())
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let plan = Plan {
        sizes: if ctx.quick {
            vec![64, 64 << 10, 1 << 20]
        } else {
            vec![64, 64 << 10, 1 << 20, 8 << 20]
        },
        rounds: if ctx.quick { 3 } else { 5 },
        lat_n: if ctx.quick { 300 } else { 2000 },
        tput_ms: if ctx.quick { 100 } else { 500 },
    };
    let id = std::process::id();
    let (ga, gb) = (format!("bbA-{id}"), format!("bbB-{id}"));
    let scope = format!("bb{id}");
    let fifo = std::env::temp_dir()
        .join(format!("ferry-bench-bridge-{id}.fifo"))
        .to_string_lossy()
        .into_owned();
    let mut cleanup = Cleanup {
        fifo: fifo.clone(),
        groups: [ga.clone(), gb.clone()],
        net: None,
    };
    let _ = std::fs::remove_file(&fifo);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        fifo.as_str(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .context("making the FIFO")?;

    // The two hosts.
    let prefix = format!("fbr-{id}");
    let why_not = match testnet::unavailable() {
        Some(why) => Some(why.to_owned()),
        None => match Net::new(&prefix, NET) {
            Ok(n) => {
                cleanup.net = Some(n);
                None
            }
            Err(e) => {
                testnet::cleanup(&prefix);
                Some(format!("making the namespaces failed: {e}"))
            }
        },
    };
    let (ns_a, ns_b, ip_a) = match &cleanup.net {
        Some(n) => (
            Some(n.rx.clone()),
            Some(n.tx.clone()),
            n.rx_ip().to_string(),
        ),
        None => {
            let why = why_not.as_deref().unwrap_or("unknown");
            eprintln!("bridge: on loopback, not across namespaces: {why}");
            (None, None, "127.0.0.1".to_owned())
        }
    };
    // In a namespace of its own the ports are free; on loopback, ask the kernel.
    let port = |n: u16| -> Result<u16> {
        if cleanup.net.is_some() {
            return Ok(7447 + n);
        }
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let bridge_ep = format!("tcp/{ip_a}:{}", port(0)?);
    let zenoh_ep = format!("tcp/{ip_a}:{}", port(1)?);
    // As the handover suite pins its two processes: the publisher on one CPU, and every
    // receiver whose arrival is compared (A's local subscribers, B's subscriber and
    // zenoh's receiving thread, not zenoh's own threads) on the other, so that no case gains or loses by where the scheduler put
    // its receiver. The bridges, and the second plain subscriber that stands in for
    // A's bridge, run where the scheduler puts them.
    let (pub_cpu, recv_cpu) = (ctx.cpu(0), ctx.cpu(1));
    let on = |ns: &Option<String>, group: &str, cpu: Option<usize>, role: Role| Spec {
        ns: ns.clone(),
        group: group.to_owned(),
        scope: scope.clone(),
        fifo: fifo.clone(),
        cpu,
        role,
    };

    let mut procs = Procs(Vec::new());
    let inherit = || Stdio::inherit();
    let publisher = on(
        &ns_a,
        &ga,
        Some(pub_cpu),
        Role::Pub {
            zenoh_listen: zenoh_ep.clone(),
            plan: plan.clone(),
        },
    );
    spawn(&mut procs, "A's publisher", &publisher, Stdio::piped())?;
    // Read as it comes, so that a long result line never fills the pipe.
    let stdout = procs.0[0]
        .1
        .stdout
        .take()
        .context("the publisher's stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stdout }, &mut s);
        s
    });
    let local = vec![
        (ALONE.to_owned(), Who::Alone, false),
        (IDLE.to_owned(), Who::Idle, false),
        (TWO.to_owned(), Who::Two, false),
        (CARRY.to_owned(), Who::Carry, false),
        (EARLY.to_owned(), Who::Early, false),
        (ZCARRY.to_owned(), Who::ZCarry, false),
    ];
    spawn(
        &mut procs,
        "A's subscribers",
        &on(&ns_a, &ga, Some(recv_cpu), Role::Subs { subs: local }),
        inherit(),
    )?;
    let second = vec![(TWO.to_owned(), Who::Second, true)];
    spawn(
        &mut procs,
        "A's second subscriber",
        &on(&ns_a, &ga, None, Role::Subs { subs: second }),
        inherit(),
    )?;
    let bridge_a = Role::Bridge {
        listen: vec![bridge_ep.clone()],
        connect: Vec::new(),
        deny: vec![
            ALONE.to_owned(),
            TWO.to_owned(),
            ZCARRY.to_owned(),
            ZCOPY.to_owned(),
        ],
    };
    spawn(
        &mut procs,
        "A's bridge",
        &on(&ns_a, &ga, None, bridge_a),
        inherit(),
    )?;
    let bridge_b = Role::Bridge {
        listen: Vec::new(),
        connect: vec![bridge_ep.clone()],
        // The copying zenoh subscriber's service in B's group stays on B.
        deny: vec![IDLE.to_owned(), ZCOPY.to_owned()],
    };
    spawn(
        &mut procs,
        "B's bridge",
        &on(&ns_b, &gb, None, bridge_b),
        inherit(),
    )?;
    let remote = vec![
        (CARRY.to_owned(), Who::Remote, false),
        (EARLY.to_owned(), Who::EarlyRemote, false),
        (FAR.to_owned(), Who::Far, false),
    ];
    spawn(
        &mut procs,
        "B's subscriber",
        &on(&ns_b, &gb, Some(recv_cpu), Role::Subs { subs: remote }),
        inherit(),
    )?;
    for (what, copy) in [
        ("zenoh's subscriber", false),
        ("zenoh's copying subscriber", true),
    ] {
        spawn(
            &mut procs,
            what,
            &on(
                &ns_b,
                &gb,
                Some(recv_cpu),
                Role::ZenohSub {
                    connect: zenoh_ep.clone(),
                    copy,
                },
            ),
            inherit(),
        )?;
    }
    ctx.progress
        .phase("bridge: measuring (the publisher reports its rounds)");

    // The publisher drives the run and ends with its results; the others run until
    // stopped.
    let limit = Duration::from_secs(if ctx.quick { 900 } else { 7200 });
    let start = Instant::now();
    loop {
        let (what, c) = &mut procs.0[0];
        if let Some(status) = c.try_wait()? {
            if !status.success() {
                bail!("{what} ended with {status}");
            }
            break;
        }
        // The subscribers end by themselves (status 0) once the publisher has gone.
        for (w, c) in &mut procs.0[1..] {
            if let Some(status) = c.try_wait()? {
                if !status.success() {
                    bail!("{w} ended early with {status}");
                }
            }
        }
        if start.elapsed() > limit {
            bail!("the run took longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader panicked"))?;
    let results: Results = serde_json::from_str(out.trim()).context("the publisher's results")?;
    drop(procs);
    drop(cleanup);
    let place = match why_not {
        None => "two network namespaces joined by veth".to_owned(),
        Some(why) => format!("loopback: {why}"),
    };
    Ok(report(&results, &place, ctx.quick))
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).median
}

fn report(r: &Results, place: &str, quick: bool) -> BenchOutput {
    let mut md = String::new();
    md.push_str(&format!(
        "## bridge: two hosts through ferry-bridge vs zenoh pub/sub ({place}{})\n\n",
        if quick { ", quick" } else { "" }
    ));
    let verdict = |ok: bool, floor: f64| {
        if ok {
            "ok".to_owned()
        } else {
            format!("MISSED (floor {floor:.2})")
        }
    };
    // Beside a bar missed against zenoh alone: whether the bridge is within the bar's
    // margin of its floor (zenoh with the bridge's copy), i.e. whether what is missing
    // is the copy's CPU time on shared CPUs rather than the bridge's own work.
    let against_floor = |missed: bool, at_floor: bool| match (missed, at_floor) {
        (false, _) => "",
        (true, true) => " (within the bar of the floor: the copy on shared CPUs)",
        (true, false) => " (short of the floor too)",
    };
    md.push_str("Through the bridges, A to B. Floor: zenoh's publish-subscribe whose subscriber on B first copies each message into an fbuf of a ferry path and publishes it (the bridge's one copy, on CPUs that both hosts share here), plus two of ferry's hand-overs (the bridge path's two more process hops), measured in the same rounds. From idle: each message after a pause (periodic traffic: every wake-up on the path starts from an idle CPU); back to back: every other turn, no pause, only these cases (a steady stream).\n\n");
    md.push_str("| size | turns | latency bridge µs | zenoh µs | zenoh copying µs | floor µs | bridge / zenoh (bar <= 1.2) | floor / zenoh | bridge / floor |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let mut records = Vec::new();
    for (size, s) in r.sizes.iter().zip(&r.series) {
        for (turns, remote, zenoh, zcopy, alone) in [
            ("from idle", &s.remote, &s.zenoh, &s.zcopy, &s.alone),
            (
                "back to back",
                &s.remote_b2b,
                &s.zenoh_b2b,
                &s.zcopy_b2b,
                &s.alone_b2b,
            ),
        ] {
            let (b, z, c, alone) = (median(remote), median(zenoh), median(zcopy), median(alone));
            let floor = c + 2.0 * alone;
            let lr = b / z;
            let missed = lr > BAR_LATENCY;
            md.push_str(&format!(
                "| {size} | {turns} | {b:.1} | {z:.1} | {c:.1} | {floor:.1} | {lr:.2} {}{} | {:.2} | {:.2} |\n",
                if missed { "MISSED" } else { "ok" },
                against_floor(missed, b / floor <= BAR_LATENCY),
                floor / z,
                b / floor,
            ));
        }
    }
    md.push_str("\nThroughput through the bridges, A to B (`bench/far`, subscribed on B only) against zenoh's own publish-subscribe, and its floor: zenoh's with the bridge's copy on B (as above). Each round a warm-up burst, drained, then back to back for a fixed time, timed from the first send to the last arrival, the three in turn; medians over rounds.\n\n");
    md.push_str("| size | MB/s bridge | zenoh | zenoh copying (floor) | bridge / zenoh (bar >= 0.9 at >= 64 KiB) | floor / zenoh | bridge / floor | msgs/round bridge | zenoh | zenoh copying |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size, s) in r.sizes.iter().zip(&r.series) {
        let (bm, zm, cm) = (
            median(&s.remote_mbs),
            median(&s.zenoh_mbs),
            median(&s.zcopy_mbs),
        );
        let tr = bm / zm;
        let tbar = if *size >= 64 << 10 {
            let missed = tr < BAR_THROUGHPUT;
            format!(
                "{}{}",
                if missed { "MISSED" } else { "ok" },
                against_floor(missed, bm / cm >= BAR_THROUGHPUT)
            )
        } else {
            "-".to_owned()
        };
        let count = |v: &[usize]| median(&v.iter().map(|&n| n as f64).collect::<Vec<_>>());
        md.push_str(&format!(
            "| {size} | {bm:.0} | {zm:.0} | {cm:.0} | {tr:.2} {tbar} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} |\n",
            cm / zm,
            bm / cm,
            count(&s.remote_n),
            count(&s.zenoh_n),
            count(&s.zcopy_n),
        ));
    }
    md.push_str("\nA's local subscriber's hand-over (µs). Floors, measured in the same rounds: the same subscriber with a second plain local subscriber process (it copies every byte out, as the bridge's local half does) instead of the bridge (what one more subscriber costs the publisher and the CPUs, bridge or not); and the same subscriber while zenoh's own publish-subscribe carries the same message from A's publisher to B, without a bridge (the far host's work on the same CPUs: the fair floor of carrying).\n\n");
    md.push_str("| size | without bridge | bridge, no far sub | ratio (bar <= 1.1) | bridge carrying to B | ratio (bar <= 1.1) | the bridge subscribed first | ratio (bar <= 1.1) | second plain sub | ratio (floor) | carrying / second sub | zenoh carrying to B | ratio (fair floor) | carrying / fair floor |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size, s) in r.sizes.iter().zip(&r.series) {
        let (alone, idle, carry, early, two, zcarry) = (
            median(&s.alone),
            median(&s.idle),
            median(&s.carry),
            median(&s.early),
            median(&s.two),
            median(&s.zcarry),
        );
        // Beside a missed bar, the higher of the two floors.
        let floor = (two / alone).max(zcarry / alone);
        md.push_str(&format!(
            "| {size} | {alone:.1} | {idle:.1} | {:.2} {} | {carry:.1} | {:.2} {} | {early:.1} | {:.2} {} | {two:.1} | {:.2} | {:.2} | {zcarry:.1} | {:.2} | {:.2} |\n",
            idle / alone,
            verdict(idle / alone <= BAR_LOCAL, floor),
            carry / alone,
            verdict(carry / alone <= BAR_LOCAL, floor),
            early / alone,
            verdict(early / alone <= BAR_LOCAL, floor),
            two / alone,
            carry / two,
            zcarry / alone,
            carry / zcarry,
        ));
        for (series, v, unit) in [
            ("bridge latency", &s.remote, "us"),
            ("zenoh latency", &s.zenoh, "us"),
            ("bridge latency back to back", &s.remote_b2b, "us"),
            ("zenoh latency back to back", &s.zenoh_b2b, "us"),
            ("zenoh copying latency", &s.zcopy, "us"),
            ("zenoh copying latency back to back", &s.zcopy_b2b, "us"),
            ("local without bridge", &s.alone, "us"),
            ("local with bridge, no far subscriber", &s.idle, "us"),
            ("local with bridge carrying", &s.carry, "us"),
            (
                "local with bridge carrying, bridge subscribed first",
                &s.early,
                "us",
            ),
            ("local with a second plain subscriber", &s.two, "us"),
            (
                "local while zenoh carries the same messages to B",
                &s.zcarry,
                "us",
            ),
            ("bridge throughput", &s.remote_mbs, "MB/s"),
            ("zenoh throughput", &s.zenoh_mbs, "MB/s"),
            ("zenoh copying throughput", &s.zcopy_mbs, "MB/s"),
        ] {
            let mut rec = Record::new("bridge", series, unit, Summary::of(v), 1, 0.0);
            rec.params.insert("size".into(), (*size).into());
            records.push(rec);
        }
    }
    md.push_str(&format!(
        "\nWith no far subscriber, A's bridge {} the service locally. Latency: medians of one-way stamps, one message at a time, the cases in turns; throughput: medians over rounds, back to back, blocking congestion control, a service subscribed on B only.\n",
        if r.idle_subscribers > 1 {
            "was subscribed to"
        } else {
            "was not subscribed to"
        }
    ));
    BenchOutput {
        records,
        markdown: md,
        plots: Vec::new(),
    }
}
