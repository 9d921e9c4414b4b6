//! `ferry-bench adc`: application device channels (Druschel's thesis, chapter 6) on
//! AF_XDP. On one veth pair between two network namespaces, in the same run: packets
//! per second and one-way latency for 64 B and 1500 B frames received by AF_XDP into a
//! lot area, granted by the `ferry-adc` broker as an application gets it, against a UDP
//! socket drained with `recvmmsg` (with and without the XDP program attached) and with
//! io_uring receives; and the cost of handing a received frame to a second domain as a
//! ferry descriptor against copying it into a new fbuf.
//!
//! Two senders offer the load from the other namespace: a UDP socket (`send` in a loop)
//! and an AF_XDP socket sending prebuilt frames from its TX ring (copy mode too, but no
//! UDP stack on the send side), so that the offered rate is reported beside each
//! receiver's and the floor is visible when the sender, not the receiver, bounds it.
//!
//! veth runs AF_XDP in copy mode (it has no zero-copy support): the kernel copies each
//! frame into the UMEM once, as the socket path copies into the socket buffer and
//! `recvmmsg` (or io_uring) copies again into the application's buffer. The AF_XDP path
//! saves the skb, the IP and UDP layers, the socket queue and the second copy.
//!
//! Needs root (namespaces, BPF, AF_XDP); otherwise the report says it was skipped.

use std::net::{SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use ferry::{Group, IoData, PathConfig};
use ferry_xdp::testnet::{self, Net};
use ferry_xdp::xsk::{Geometry, XskTx};
use ferry_xdp::{AdcConfig, AdcRx, Fallback, Policy, RxPath};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{num, ratio, verdict, BenchOutput, Table};
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;

pub const BENCH: BenchDef = BenchDef {
    name: "adc",
    about: "AF_XDP into a lot (through the ferry-adc broker) vs UDP recvmmsg vs io_uring receives on a veth pair: pps (UDP and AF_XDP senders, offered vs received) and latency at 64 B and 1500 B, and handing a frame on (descriptor vs copy)",
    run,
};

const PORT: u16 = 7900;
/// The second octet of the veth pair's addresses.
const NET: u8 = 78;

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The UDP payload for an Ethernet frame of `frame` bytes.
fn payload_len(frame: usize) -> usize {
    frame.saturating_sub(42).max(8)
}

/// The `ferry-adc` broker, in the rx namespace on its own thread, as an application
/// finds it: the program attached, the policy granting this user the benchmark's port.
struct BrokerThread {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<Result<()>>>,
}

impl BrokerThread {
    fn start(net: &Net) -> Result<BrokerThread> {
        let socket =
            std::env::temp_dir().join(format!("ferrybench-adc-{}.sock", std::process::id()));
        let uid = rustix::process::getuid().as_raw();
        let policy = Policy::parse(&format!(
            "interface adc0\nattach drv\nsteer udp-port\nmax-umem 64M\nmax-ring 4096\ngrant uid={uid} queues=0 ports={PORT}\n"
        ))
        .map_err(|e| anyhow!("policy: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, sock, st) = (net.rx.clone(), socket.clone(), stop.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || -> Result<()> {
            let made = testnet::enter(&ns).and_then(|()| ferry_xdp::Broker::new(policy, &sock));
            let mut b = match made {
                Ok(b) => {
                    let _ = ready_tx.send(Ok(()));
                    b
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("broker: {e}")));
                    return Ok(());
                }
            };
            b.run(|| st.load(Ordering::Relaxed))?;
            Ok(())
        });
        ready_rx
            .recv()
            .map_err(|_| anyhow!("the broker thread ended"))??;
        Ok(BrokerThread {
            socket,
            stop,
            h: Some(h),
        })
    }
}

impl Drop for BrokerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.h.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Receives a batch; returns how many, and the first one's 8 leading payload bytes.
fn recv_batch(
    rx: &mut AdcRx,
    pk: &mut Vec<ferry_xdp::Packet>,
    wait: Duration,
) -> Result<(usize, Option<u64>)> {
    pk.clear();
    let n = rx.recv(pk, 64, Some(wait))?;
    let first = pk.first().and_then(|p| {
        let d = p.payload();
        let s = d.fragments().first()?.as_slice();
        (s.len() >= 8).then(|| u64::from_le_bytes(s[..8].try_into().expect("8 bytes")))
    });
    pk.clear();
    Ok((n, first))
}

/// Which sender offers the load.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sender {
    /// A UDP socket, `send` in a loop.
    Udp,
    /// An AF_XDP socket on the peer end, prebuilt frames from its TX ring.
    Xdp,
}

impl Sender {
    fn label(self) -> &'static str {
        match self {
            Sender::Udp => "UDP send",
            Sender::Xdp => "AF_XDP TX",
        }
    }
}

/// Offers `frame`-byte frames from the tx namespace until `stop`; returns the datagrams
/// sent (for AF_XDP: frames the kernel completed).
fn blaster(
    net: &Net,
    sender: Sender,
    frame: usize,
    stop: Arc<AtomicBool>,
    cpu: usize,
    path: ferry::PathAllocator,
) -> std::thread::JoinHandle<Result<u64>> {
    let ns = net.tx.clone();
    let (src, dst) = (
        SocketAddrV4::new(net.tx_ip(), PORT + 1),
        SocketAddrV4::new(net.rx_ip(), PORT),
    );
    let (src_mac, dst_mac) = (net.tx_mac(), net.rx_mac());
    std::thread::spawn(move || {
        testnet::enter(&ns)?;
        let _ = ferry_measure::sys::pin_to(cpu);
        match sender {
            Sender::Udp => {
                let s = UdpSocket::bind(src)?;
                s.connect(dst)?;
                let buf = vec![0u8; payload_len(frame)];
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        if s.send(&buf).is_ok() {
                            sent += 1;
                        }
                    }
                }
                Ok(sent)
            }
            Sender::Xdp => {
                let geometry = Geometry {
                    frame: 2048,
                    ring: 1024,
                };
                let frames = 1024usize;
                let area = path.area(frames * 2048)?;
                let ifindex = ferry_xdp::xsk::interface_index("adc1")?;
                // The previous round's socket lets go of the queue in deferred kernel
                // work after it closed: a bind in between is refused with EBUSY.
                let t0 = std::time::Instant::now();
                let (fd, _) = loop {
                    match ferry_xdp::direct::make_socket(
                        ifindex,
                        0,
                        area.lot_fd(),
                        area.lot_offset(),
                        (frames * 2048) as u64,
                        geometry,
                        false,
                    ) {
                        Err(e)
                            if e.raw_os_error() == Some(libc::EBUSY)
                                && t0.elapsed() < std::time::Duration::from_secs(2) =>
                        {
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                        other => break other?,
                    }
                };
                let mut tx = XskTx::new(fd, area, geometry)?;
                let pl = payload_len(frame);
                let mut all = Vec::new();
                while let Some(mut f) = tx.alloc() {
                    let b = f.as_mut_slice();
                    b[42..42 + pl].fill(0);
                    let n = ferry_xdp::xsk::write_udp_headers(b, src_mac, dst_mac, src, dst, pl);
                    all.push((f, n));
                }
                let len = all.first().map(|x| x.1).unwrap_or(0);
                tx.send(all)?;
                // The frames keep their bytes: a completed frame is sent again as it is.
                while !stop.load(Ordering::Relaxed) {
                    tx.complete();
                    let mut batch = Vec::with_capacity(64);
                    while batch.len() < 64 {
                        match tx.alloc() {
                            Some(f) => batch.push((f, len)),
                            None => break,
                        }
                    }
                    if batch.is_empty() {
                        tx.kick()?;
                    } else {
                        tx.send(batch)?;
                    }
                }
                tx.complete();
                Ok(tx.stats().completed)
            }
        }
    })
}

/// Receives for `dur` while a sender offers load: (received pps, offered pps, frames per
/// second the kernel dropped for the AF_XDP socket: no fill frame or a full RX ring).
#[allow(clippy::too_many_arguments)]
fn pps(
    net: &Net,
    rx: &mut AdcRx,
    sender: Sender,
    frame: usize,
    dur: Duration,
    ctx: &BenchCtx,
    path: &ferry::PathAllocator,
) -> Result<(f64, f64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let drops0 = rx.stats().kernel_drops;
    let h = blaster(net, sender, frame, stop.clone(), ctx.cpu(0), path.clone());
    let mut pk = Vec::new();
    let t_start = Instant::now();
    // Warm up, then count.
    while t_start.elapsed() < Duration::from_millis(100) {
        recv_batch(rx, &mut pk, Duration::from_millis(10))?;
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < dur {
        n += recv_batch(rx, &mut pk, Duration::from_millis(10))?.0 as u64;
    }
    let el = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let sent = h.join().map_err(|_| anyhow!("sender panicked"))??;
    let all = t_start.elapsed().as_secs_f64();
    // Drain what is queued so the next measurement starts empty.
    while recv_batch(rx, &mut pk, Duration::from_millis(20))?.0 > 0 {}
    let drops = rx.stats().kernel_drops - drops0;
    Ok((n as f64 / el, sent as f64 / all, drops as f64 / all))
}

/// One-way latency samples (µs): one datagram at a time, stamped when sent.
fn latency(
    net: &Net,
    rx: &mut AdcRx,
    frame: usize,
    samples: usize,
    ctx: &BenchCtx,
) -> Result<Vec<f64>> {
    let got = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ns, g2, st2, cpu) = (net.tx.clone(), got.clone(), stop.clone(), ctx.cpu(0));
    let (src, dst) = (
        SocketAddrV4::new(net.tx_ip(), 0),
        SocketAddrV4::new(net.rx_ip(), PORT),
    );
    let h = std::thread::spawn(move || -> Result<()> {
        testnet::enter(&ns)?;
        let _ = ferry_measure::sys::pin_to(cpu);
        let s = UdpSocket::bind(src)?;
        s.connect(dst)?;
        let mut buf = vec![0u8; payload_len(frame)];
        let mut i = 0u64;
        while !st2.load(Ordering::Relaxed) {
            buf[..8].copy_from_slice(&now_ns().to_le_bytes());
            s.send(&buf)?;
            i += 1;
            let t = Instant::now();
            while g2.load(Ordering::Acquire) < i && t.elapsed() < Duration::from_millis(50) {
                std::thread::yield_now();
            }
            g2.store(i, Ordering::Release);
        }
        Ok(())
    });
    let mut pk = Vec::new();
    let mut out = Vec::with_capacity(samples);
    let t0 = Instant::now();
    while out.len() < samples && t0.elapsed() < Duration::from_secs(20) {
        let (n, first) = recv_batch(rx, &mut pk, Duration::from_millis(50))?;
        if let (1, Some(ts)) = (n, first) {
            let now = now_ns();
            if now > ts {
                out.push((now - ts) as f64 / 1e3);
            }
        }
        if n > 0 {
            got.fetch_add(n as u64, Ordering::AcqRel);
        }
    }
    stop.store(true, Ordering::Relaxed);
    h.join().map_err(|_| anyhow!("latency sender panicked"))??;
    while recv_batch(rx, &mut pk, Duration::from_millis(20))?.0 > 0 {}
    Ok(out)
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    if let Some(why) = testnet::unavailable() {
        return Ok(BenchOutput {
            markdown: format!("## adc\n\nSkipped: {why}.\n"),
            ..Default::default()
        });
    }
    let net = Net::new(&format!("ferrybench-adc-{}", std::process::id()), NET)
        .context("making the veth pair")?;
    let dur = Duration::from_millis(ctx.pick(1000, 3000));
    let trials = ctx.pick(3, 5);
    let lat_n = ctx.pick(1000, 5000);
    // All receiving happens on this thread, inside the rx namespace.
    let main_ns = std::fs::File::open("/proc/self/ns/net")?;
    testnet::enter(&net.rx)?;
    let _ = ferry_measure::sys::pin_to(ctx.cpu(1));
    let result = measure(ctx, &net, dur, trials, lat_n);
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&main_ns),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    result
}

/// The 64 B bar for one sender.
struct Verdict {
    sender: Sender,
    xdp: f64,
    plain: f64,
    offered: f64,
    plain_offered: f64,
    drops: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Series {
    Xdp,
    UdpWithProg,
    UdpPlain,
    Uring,
}

impl Series {
    fn label(self) -> &'static str {
        match self {
            Series::Xdp => "AF_XDP into a lot (broker grant, copy mode)",
            Series::UdpWithProg => "UDP recvmmsg (program attached, port not steered)",
            Series::UdpPlain => "UDP recvmmsg (no XDP program)",
            Series::Uring => "UDP io_uring receives (no XDP program)",
        }
    }
}

fn measure(
    ctx: &BenchCtx,
    net: &Net,
    dur: Duration,
    trials: usize,
    lat_n: usize,
) -> Result<BenchOutput> {
    let group = Group::open(&format!("bench-adc-{}", std::process::id()))?;
    let domain = group.join()?;
    let path = domain.path(PathConfig::default())?;
    let mut records = Vec::new();
    let mut pps_tab = Table::new(&[
        "frame",
        "sender",
        "receiver",
        "pps received (median)",
        "min",
        "max",
        "offered pps (median)",
        "received / offered",
        "XSK drops/s",
        "vs recvmmsg (plain)",
    ]);
    let mut lat_tab = Table::new(&["frame", "receiver", "median µs", "p99 µs"]);
    let mut verdicts = Vec::new();
    let senders = [Sender::Udp, Sender::Xdp];
    for frame in [64usize, 1500] {
        // (series, sender, received, offered, socket drops)
        #[allow(clippy::type_complexity)]
        let mut per: Vec<(Series, Sender, Vec<f64>, Vec<f64>, Vec<f64>)> = Vec::new();
        let mut lats: Vec<(Series, Vec<f64>)> = Vec::new();
        for series in [
            Series::Xdp,
            Series::UdpWithProg,
            Series::UdpPlain,
            Series::Uring,
        ] {
            let broker = match series {
                Series::Xdp | Series::UdpWithProg => Some(BrokerThread::start(net)?),
                _ => None,
            };
            let mut cfg = AdcConfig::new(
                (series == Series::Xdp).then(|| broker.as_ref().expect("started").socket.clone()),
                "adc0",
                PORT,
            );
            cfg.bind = net.rx_ip();
            cfg.frames = 4096;
            cfg.geometry = Geometry {
                frame: 4096,
                ring: 2048,
            };
            if series == Series::Uring {
                cfg.fallback = Fallback::Uring;
            }
            let mut rx = match series {
                Series::Xdp => AdcRx::open(&path, &cfg)?,
                _ => AdcRx::udp(&path, &cfg, "benchmark baseline".into(), None)?,
            };
            if series == Series::Xdp && !matches!(rx.path(), RxPath::Xdp { .. }) {
                return Err(anyhow!("the broker granted no channel: {:?}", rx.path()));
            }
            for &sender in &senders {
                let mut got = Vec::new();
                let mut offered = Vec::new();
                let mut dropped = Vec::new();
                for _ in 0..trials {
                    let (p, o, d) = pps(net, &mut rx, sender, frame, dur, ctx, &path)?;
                    got.push(p);
                    offered.push(o);
                    dropped.push(d);
                }
                per.push((series, sender, got, offered, dropped));
            }
            let l = latency(net, &mut rx, frame, lat_n, ctx)?;
            lats.push((series, l));
            drop(rx);
            drop(broker);
        }
        for &sender in &senders {
            let plain = per
                .iter()
                .find(|p| p.0 == Series::UdpPlain && p.1 == sender)
                .map(|p| Summary::of(&p.2).median)
                .unwrap_or(f64::NAN);
            for (series, _, got, offered, dropped) in per.iter().filter(|p| p.1 == sender) {
                let s = Summary::of(got);
                let o = Summary::of(offered).median;
                let spread = (s.max - s.min) / s.median;
                let mut r = Record::new(
                    "adc",
                    &format!("{} <- {}", series.label(), sender.label()),
                    "pps",
                    s,
                    got.len() as u32,
                    spread,
                );
                r.params.insert("frame".into(), frame.into());
                r.params.insert("offered_pps".into(), o.into());
                records.push(r);
                pps_tab.row(vec![
                    format!("{frame} B"),
                    sender.label().into(),
                    series.label().into(),
                    num(s.median),
                    num(s.min),
                    num(s.max),
                    num(o),
                    ratio(s.median / o),
                    if *series == Series::Xdp {
                        num(Summary::of(dropped).median)
                    } else {
                        "-".into()
                    },
                    ratio(s.median / plain),
                ]);
                if *series == Series::Xdp && frame == 64 {
                    let plain_offered = per
                        .iter()
                        .find(|p| p.0 == Series::UdpPlain && p.1 == sender)
                        .map(|p| Summary::of(&p.3).median)
                        .unwrap_or(f64::NAN);
                    verdicts.push(Verdict {
                        sender,
                        xdp: s.median,
                        plain,
                        offered: o,
                        plain_offered,
                        drops: Summary::of(dropped).median,
                    });
                }
            }
        }
        for (series, l) in &lats {
            let s = Summary::of(l);
            let mut r = Record::new(
                "adc",
                &format!("{} latency", series.label()),
                "us",
                s,
                1,
                0.0,
            );
            r.params.insert("frame".into(), frame.into());
            records.push(r);
            lat_tab.row(vec![
                format!("{frame} B"),
                series.label().into(),
                num(s.median),
                num(s.p99),
            ]);
        }
    }
    let handoff = handoff(ctx, &group, &domain, &path, net)?;
    let mut md =
        String::from("## adc: application device channels on AF_XDP (veth, copy mode)\n\n");
    md.push_str(
        "One veth pair between two network namespaces. A sender in one (pinned to the first CPU) offers as much as it can: \
         a UDP socket calling `send` in a loop, or an AF_XDP socket on the peer end sending prebuilt frames from its TX ring \
         (copy mode: no UDP stack on the send side). The receiver in the other namespace (pinned to the second CPU) receives \
         in batches of up to 64. AF_XDP: the application asks the `ferry-adc` broker (on a thread of this process, same \
         protocol and data path as the binary) for a channel, which attaches the redirect program in driver mode and steers \
         the port to a socket whose UMEM is an area of the receiver's lot; veth has no zero-copy mode, so the kernel copies \
         each frame once into the lot. UDP: `recvmmsg` into fbufs of the same lot, with the program attached (the port not \
         steered, the fallback's situation) and with no program; io_uring: 64 receive requests in flight, each into an fbuf \
         of the lot, completions reaped in batches. Offered: datagrams the sender got out (AF_XDP: frames the kernel \
         completed) per second; XSK drops: frames the kernel dropped at the AF_XDP socket (no fill frame or a full RX \
         ring); for AF_XDP the rest of the gap between offered and received is lost before the socket (veth's queue to the peer). Latency: one datagram in flight from the UDP sender, stamped at `send`, read from the lot \
         (or the fbuf) after the receiver wakes.\n\n",
    );
    md.push_str("### Packets per second\n\n");
    md.push_str(&pps_tab.render());
    md.push('\n');
    for v in &verdicts {
        let r = v.xdp / v.plain;
        md.push_str(&format!(
            "Bar, {} sender: AF_XDP at 64 B >= 2x the pps of recvmmsg (no program), same run: {} ({} against {}, {}).",
            v.sender.label(),
            verdict(r >= 2.0),
            num(v.xdp),
            num(v.plain),
            ratio(r)
        ));
        if r < 2.0 {
            md.push_str(&format!(
                " Floor: AF_XDP received {} of the {} pps offered to it (the kernel dropped {} pps at the socket for want \
                 of fill frames or RX ring room: the receiver's own per-frame cost; the rest was lost before the socket), \
                 recvmmsg {} of {}; 2x recvmmsg's rate is {} pps, {} the rate the sender offered AF_XDP{}.",
                ratio(v.xdp / v.offered),
                num(v.offered),
                num(v.drops),
                ratio(v.plain / v.plain_offered),
                num(v.plain_offered),
                num(2.0 * v.plain),
                if 2.0 * v.plain > v.offered { "above" } else { "within" },
                if 2.0 * v.plain > v.offered {
                    ": the sender bounds it"
                } else {
                    ", so what AF_XDP loses on the way bounds it"
                }
            ));
        }
        md.push_str("\n\n");
    }
    md.push_str(
        "On veth the sender's CPU runs the peer's receive path too (veth hands the frame to the other end in the sender's \
         context: the XDP program, or the IP and UDP layers up to the socket queue), so a receiver that keeps up with the \
         offered load shows the sender's floor, not its own ceiling.\n\n",
    );
    md.push_str("### One-way latency\n\n");
    md.push_str(&lat_tab.render());
    md.push_str("\n### Handing a received frame to a second domain\n\n");
    md.push_str(&handoff.0);
    records.extend(handoff.1);
    Ok(BenchOutput {
        records,
        markdown: md,
        plots: Vec::new(),
    })
}

/// Per frame: send it on a channel to a second domain (on another thread: the same ring,
/// descriptors and release path as between processes) which reads one byte and drops
/// it, against copying it into a new fbuf first and sending that.
fn handoff(
    ctx: &BenchCtx,
    group: &Arc<Group>,
    domain: &ferry::Domain,
    path: &ferry::PathAllocator,
    net: &Net,
) -> Result<(String, Vec<Record>)> {
    let broker = BrokerThread::start(net)?;
    let mut cfg = AdcConfig::new(Some(broker.socket.clone()), "adc0", PORT);
    cfg.bind = net.rx_ip();
    let mut x = AdcRx::open(path, &cfg)?;
    if !matches!(x.path(), RxPath::Xdp { .. }) {
        return Err(anyhow!("the broker granted no channel: {:?}", x.path()));
    }
    let second = group.join()?;
    let to = second.id();
    let cpu = ctx.cpu(0);
    let n_msgs = ctx.pick(2000usize, 20000);
    let sink = std::thread::spawn(move || -> Result<u64> {
        let _ = ferry_measure::sys::pin_to(cpu);
        let mut rx = second.accept(Duration::from_secs(10))?;
        let mut sum = 0u64;
        loop {
            match rx.recv() {
                Ok(d) => {
                    sum += d.fragments()[0].as_slice()[0] as u64;
                }
                Err(ferry::Error::Disconnected) => return Ok(sum),
                Err(e) => return Err(e.into()),
            }
        }
    });
    let tx = domain.connect(to, Duration::from_secs(10))?;
    let copy_path = domain.path(PathConfig::default())?;
    let mut tab = Table::new(&[
        "frame",
        "descriptor ns/frame",
        "copy ns/frame",
        "copy / descriptor",
    ]);
    let mut recs = Vec::new();
    for frame in [64usize, 1500] {
        // A batch of received frames to hand on, over and over.
        let mut held: Vec<IoData> = Vec::new();
        let stop = Arc::new(AtomicBool::new(false));
        let h = blaster(
            net,
            Sender::Udp,
            frame,
            stop.clone(),
            ctx.cpu(0),
            path.clone(),
        );
        let t0 = Instant::now();
        while held.len() < 256 && t0.elapsed() < Duration::from_secs(10) {
            let mut got = Vec::new();
            x.recv(&mut got, 64, Some(Duration::from_millis(10)))?;
            held.extend(got.iter().map(|p| p.payload()));
        }
        stop.store(true, Ordering::Relaxed);
        let _ = h.join();
        held.truncate(256);
        if held.is_empty() {
            return Err(anyhow!("no frames received for the hand-over"));
        }
        let send_all = |copy: bool| -> Result<f64> {
            let t0 = Instant::now();
            for i in 0..n_msgs {
                let d = &held[i % held.len()];
                let msg = if copy {
                    let mut m = copy_path.alloc(d.len())?;
                    m.fill_from(d.fragments()[0].as_slice());
                    m.freeze()
                } else {
                    d.clone()
                };
                loop {
                    match tx.send(&msg) {
                        Ok(()) => break,
                        Err(ferry::Error::Full) => {
                            tx.collect_releases()?;
                            std::thread::yield_now();
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            tx.collect_releases()?;
            Ok(t0.elapsed().as_nanos() as f64 / n_msgs as f64)
        };
        let mut desc = Vec::new();
        let mut copy = Vec::new();
        for _ in 0..ctx.pick(3, 5) {
            desc.push(send_all(false)?);
            copy.push(send_all(true)?);
        }
        let (d, c) = (Summary::of(&desc), Summary::of(&copy));
        tab.row(vec![
            format!("{frame} B"),
            num(d.median),
            num(c.median),
            ratio(c.median / d.median),
        ]);
        for (label, s, v) in [
            ("hand-over: descriptor", d, &desc),
            ("hand-over: copy", c, &copy),
        ] {
            let mut r = Record::new(
                "adc",
                label,
                "ns/frame",
                s,
                v.len() as u32,
                (s.max - s.min) / s.median,
            );
            r.params.insert("frame".into(), frame.into());
            recs.push(r);
        }
    }
    drop(tx);
    let _ = sink.join();
    drop(x);
    drop(broker);
    let mut md = String::from(
        "The sender receives frames by AF_XDP and sends each on to a second domain (a thread here; the `adc` test checks the \
         same between processes): as a descriptor of the frame in place, or copied into a new fbuf first. Time per frame, \
         sender side, including the releases collected.\n\n",
    );
    md.push_str(&tab.render());
    Ok((md, recs))
}
