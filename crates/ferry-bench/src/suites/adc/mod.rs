//! `ferry-bench adc`: application device channels (Druschel's thesis, chapter 6) on
//! AF_XDP. On one veth pair between two network namespaces, in the same run: packets
//! per second and one-way latency for 64 B and 1500 B frames received by AF_XDP into a
//! lot area against a UDP socket drained with `recvmmsg` (with and without the XDP
//! program attached), and the cost of handing a received frame to a second domain as a
//! ferry descriptor against copying it into a new fbuf.
//!
//! veth runs AF_XDP in copy mode (it has no zero-copy support): the kernel copies each
//! frame into the UMEM once, as the socket path copies into the socket buffer and
//! `recvmmsg` copies again into the application's buffer. The AF_XDP path saves the skb,
//! the IP and UDP layers, the socket queue and the second copy. io_uring receives are
//! not measured (a `recvmmsg` batch is the cheaper of the two on a socket).
//!
//! Needs root (namespaces, BPF, AF_XDP); otherwise the report says it was skipped.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use ferry::{Group, IoData, PathConfig};
use ferry_xdp::bpf::{AttachMode, Redirect, Steer};
use ferry_xdp::xsk::{Geometry, XskRx};
use ferry_xdp::{AdcConfig, AdcRx};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{num, ratio, verdict, BenchOutput, Table};
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;

pub const BENCH: BenchDef = BenchDef {
    name: "adc",
    about: "AF_XDP into a lot vs UDP recvmmsg on a veth pair: pps and latency at 64 B and 1500 B, and handing a frame on (descriptor vs copy)",
    run,
};

const PORT: u16 = 7900;
const RX_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);

fn sh(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if !out.status.success() {
        return Err(anyhow!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Two namespaces joined by a veth pair, deleted on drop.
struct Net {
    rx: String,
    tx: String,
}

impl Net {
    fn new() -> Result<Net> {
        let base = format!("ferrybench-adc-{}", std::process::id());
        let net = Net {
            rx: format!("{base}-rx"),
            tx: format!("{base}-tx"),
        };
        let (rx, tx) = (net.rx.as_str(), net.tx.as_str());
        for step in [
            vec!["ip", "netns", "add", rx],
            vec!["ip", "netns", "add", tx],
            vec![
                "ip", "-n", rx, "link", "add", "adc0", "type", "veth", "peer", "name", "adc1",
                "netns", tx,
            ],
            vec![
                "ip",
                "-n",
                rx,
                "link",
                "set",
                "adc0",
                "address",
                "02:00:00:78:00:01",
            ],
            vec!["ip", "-n", rx, "addr", "add", "10.78.0.1/24", "dev", "adc0"],
            vec!["ip", "-n", tx, "addr", "add", "10.78.0.2/24", "dev", "adc1"],
            vec!["ip", "-n", rx, "link", "set", "adc0", "up"],
            vec!["ip", "-n", tx, "link", "set", "adc1", "up"],
            vec![
                "ip",
                "-n",
                tx,
                "neigh",
                "add",
                "10.78.0.1",
                "lladdr",
                "02:00:00:78:00:01",
                "dev",
                "adc1",
                "nud",
                "permanent",
            ],
        ] {
            sh(&step)?;
        }
        Ok(net)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.rx]);
        let _ = sh(&["ip", "netns", "del", &self.tx]);
    }
}

/// Moves the calling thread into namespace `ns`.
fn enter(ns: &str) -> Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    rustix::thread::move_into_link_name_space(
        f.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}

fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The UDP payload for an Ethernet frame of `frame` bytes.
fn payload_len(frame: usize) -> usize {
    frame.saturating_sub(42).max(8)
}

/// A receiver under test.
enum Rx {
    Xdp(XskRx),
    Udp(AdcRx),
}

impl Rx {
    /// Receives a batch, returns how many, and the first one's 8 leading payload bytes.
    fn recv(
        &mut self,
        scratch: &mut Vec<IoData>,
        pk: &mut Vec<ferry_xdp::Packet>,
        wait: Duration,
    ) -> Result<(usize, Option<u64>)> {
        let mut first = None;
        let n = match self {
            Rx::Xdp(x) => {
                scratch.clear();
                let n = x.recv(scratch, 64, Some(wait))?;
                if let Some(f) = scratch.first() {
                    let s = f.fragments()[0].as_slice();
                    if s.len() >= 50 {
                        first = Some(u64::from_le_bytes(s[42..50].try_into().unwrap()));
                    }
                }
                scratch.clear();
                n
            }
            Rx::Udp(u) => {
                pk.clear();
                let n = u.recv(pk, 64, Some(wait))?;
                if let Some(p) = pk.first() {
                    let s = p.data.fragments()[0].as_slice();
                    if s.len() >= 8 {
                        first = Some(u64::from_le_bytes(s[..8].try_into().unwrap()));
                    }
                }
                pk.clear();
                n
            }
        };
        Ok((n, first))
    }
}

/// Blasts `frame`-byte frames from the tx namespace until `stop`; returns datagrams sent.
fn blaster(
    ns: String,
    frame: usize,
    stop: Arc<AtomicBool>,
    cpu: usize,
) -> std::thread::JoinHandle<Result<u64>> {
    std::thread::spawn(move || {
        enter(&ns)?;
        let _ = ferry_measure::sys::pin_to(cpu);
        let s = UdpSocket::bind("10.78.0.2:0")?;
        s.connect(SocketAddrV4::new(RX_IP, PORT))?;
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
    })
}

/// Receives for `dur` while the blaster runs; packets per second received.
fn pps(net: &Net, rx: &mut Rx, frame: usize, dur: Duration, ctx: &BenchCtx) -> Result<(f64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let h = blaster(net.tx.clone(), frame, stop.clone(), ctx.cpu(0));
    let (mut scratch, mut pk) = (Vec::new(), Vec::new());
    // Warm up, then count.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        rx.recv(&mut scratch, &mut pk, Duration::from_millis(10))?;
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < dur {
        n += rx.recv(&mut scratch, &mut pk, Duration::from_millis(10))?.0 as u64;
    }
    let el = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let sent = h.join().map_err(|_| anyhow!("blaster panicked"))??;
    // Drain what is queued so the next measurement starts empty.
    while rx.recv(&mut scratch, &mut pk, Duration::from_millis(20))?.0 > 0 {}
    Ok((n as f64 / el, sent as f64 / (el + 0.1)))
}

/// One-way latency samples (µs): one datagram at a time, stamped when sent.
fn latency(
    net: &Net,
    rx: &mut Rx,
    frame: usize,
    samples: usize,
    ctx: &BenchCtx,
) -> Result<Vec<f64>> {
    let got = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ns, g2, st2, cpu) = (net.tx.clone(), got.clone(), stop.clone(), ctx.cpu(0));
    let h = std::thread::spawn(move || -> Result<()> {
        enter(&ns)?;
        let _ = ferry_measure::sys::pin_to(cpu);
        let s = UdpSocket::bind("10.78.0.2:0")?;
        s.connect(SocketAddrV4::new(RX_IP, PORT))?;
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
    let (mut scratch, mut pk) = (Vec::new(), Vec::new());
    let mut out = Vec::with_capacity(samples);
    let t0 = Instant::now();
    while out.len() < samples && t0.elapsed() < Duration::from_secs(20) {
        let (n, first) = rx.recv(&mut scratch, &mut pk, Duration::from_millis(50))?;
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
    while rx.recv(&mut scratch, &mut pk, Duration::from_millis(20))?.0 > 0 {}
    Ok(out)
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    if !rustix::process::geteuid().is_root() {
        return Ok(BenchOutput {
            markdown: "## adc\n\nSkipped: needs root (network namespaces, BPF, AF_XDP).\n".into(),
            ..Default::default()
        });
    }
    let net = Net::new().context("making the veth pair")?;
    let dur = Duration::from_millis(ctx.pick(1500, 4000));
    let trials = ctx.pick(3, 5);
    let lat_n = ctx.pick(1000, 5000);
    // All receiving happens on this thread, inside the rx namespace.
    let main_ns = std::fs::File::open("/proc/self/ns/net")?;
    enter(&net.rx)?;
    let _ = ferry_measure::sys::pin_to(ctx.cpu(1));
    let result = measure(ctx, &net, dur, trials, lat_n);
    rustix::thread::move_into_link_name_space(
        main_ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    result
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Series {
    Xdp,
    UdpWithProg,
    UdpPlain,
}

impl Series {
    fn label(self) -> &'static str {
        match self {
            Series::Xdp => "AF_XDP into a lot (copy mode)",
            Series::UdpWithProg => "UDP recvmmsg (program attached, port not steered)",
            Series::UdpPlain => "UDP recvmmsg (no XDP program)",
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
    let ifindex = rustix::net::netdevice::name_to_index(
        rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::DGRAM,
            None,
        )?,
        "adc0",
    )?;
    let geometry = Geometry {
        frame: 4096,
        ring: 2048,
    };
    let frames = 4096usize;
    let mut records = Vec::new();
    let mut pps_tab = Table::new(&[
        "frame",
        "series",
        "pps received (median)",
        "min",
        "max",
        "offered pps",
        "vs recvmmsg (plain)",
    ]);
    let mut lat_tab = Table::new(&["frame", "series", "median µs", "p99 µs"]);
    let mut verdicts = Vec::new();
    for frame in [64usize, 1500] {
        let mut per: Vec<(Series, Vec<f64>, Vec<f64>)> = Vec::new();
        let mut lats: Vec<(Series, Vec<f64>)> = Vec::new();
        for series in [Series::Xdp, Series::UdpWithProg, Series::UdpPlain] {
            let redirect = match series {
                Series::UdpPlain => None,
                _ => Some(Redirect::attach(ifindex, Steer::UdpPort, AttachMode::Drv)?),
            };
            let mut rx = match series {
                Series::Xdp => {
                    let area = path.area(frames * geometry.frame as usize)?;
                    let (fd, _) = ferry_xdp::direct::make_socket(
                        ifindex,
                        0,
                        area.lot_fd(),
                        area.lot_offset(),
                        (frames * geometry.frame as usize) as u64,
                        geometry,
                        true,
                    )?;
                    let x = XskRx::new(fd, area, geometry)?;
                    redirect
                        .as_ref()
                        .expect("attached")
                        .insert(PORT as u32, x.fd())?;
                    Rx::Xdp(x)
                }
                _ => {
                    let mut cfg = AdcConfig::new(None, "adc0", PORT);
                    cfg.bind = RX_IP;
                    Rx::Udp(AdcRx::udp(&path, &cfg, "benchmark baseline".into(), None)?)
                }
            };
            let mut got = Vec::new();
            let mut offered = Vec::new();
            for _ in 0..trials {
                let (p, o) = pps(net, &mut rx, frame, dur, ctx)?;
                got.push(p);
                offered.push(o);
            }
            let l = latency(net, &mut rx, frame, lat_n, ctx)?;
            per.push((series, got, offered));
            lats.push((series, l));
            drop(rx);
            drop(redirect);
        }
        let plain = per
            .iter()
            .find(|p| p.0 == Series::UdpPlain)
            .map(|p| Summary::of(&p.1).median)
            .unwrap_or(f64::NAN);
        for (series, got, offered) in &per {
            let s = Summary::of(got);
            let spread = (s.max - s.min) / s.median;
            let mut r = Record::new("adc", series.label(), "pps", s, got.len() as u32, spread);
            r.params.insert("frame".into(), frame.into());
            records.push(r);
            pps_tab.row(vec![
                format!("{frame} B"),
                series.label().into(),
                num(s.median),
                num(s.min),
                num(s.max),
                num(Summary::of(offered).median),
                ratio(s.median / plain),
            ]);
            if *series == Series::Xdp && frame == 64 {
                verdicts.push((s.median / plain, s.median, plain));
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
    let handoff = handoff(ctx, &group, &domain, &path, net, ifindex)?;
    let mut md =
        String::from("## adc: application device channels on AF_XDP (veth, copy mode)\n\n");
    md.push_str(
        "One veth pair between two network namespaces; a UDP sender in one (pinned to the first CPU) sends as fast as it can, \
         the receiver in the other (pinned to the second) receives in batches of up to 64. AF_XDP: the redirect program in \
         driver mode steers the port to a socket whose UMEM is an area of the receiver's lot; veth has no zero-copy mode, so \
         the kernel copies each frame once into the lot. UDP: `recvmmsg` into fbufs of the same lot, with the program attached \
         (the port not steered, the fallback's situation) and with no program. Latency: one datagram in flight, stamped at \
         `send`, read from the lot (or the fbuf) after the receiver wakes from `poll`. io_uring receives: not measured.\n\n",
    );
    md.push_str("### Packets per second\n\n");
    md.push_str(&pps_tab.render());
    if let Some((r, x, p)) = verdicts.first() {
        md.push_str(&format!(
            "\nBar: AF_XDP at 64 B >= 2x the pps of recvmmsg (no program), same run: {} ({} against {}, {}). \
             The sender's CPU runs veth's transmit and the receive path up to the socket or the XSK; when the \
             offered rate is what AF_XDP receives, the sender is the floor, not the receiver.\n\n",
            verdict(*r >= 2.0),
            num(*x),
            num(*p),
            ratio(*r)
        ));
    }
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
    ifindex: u32,
) -> Result<(String, Vec<Record>)> {
    let geometry = Geometry {
        frame: 4096,
        ring: 512,
    };
    let frames = 1024usize;
    let redirect = Redirect::attach(ifindex, Steer::UdpPort, AttachMode::Drv)?;
    let area = path.area(frames * 4096)?;
    let (fd, _) = ferry_xdp::direct::make_socket(
        ifindex,
        0,
        area.lot_fd(),
        area.lot_offset(),
        (frames * 4096) as u64,
        geometry,
        true,
    )?;
    let mut x = XskRx::new(fd, area, geometry)?;
    redirect.insert(PORT as u32, x.fd())?;
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
        let h = blaster(net.tx.clone(), frame, stop.clone(), ctx.cpu(0));
        let t0 = Instant::now();
        while held.len() < 256 && t0.elapsed() < Duration::from_secs(10) {
            let mut got = Vec::new();
            x.recv(&mut got, 64, Some(Duration::from_millis(10)))?;
            held.extend(got.into_iter().map(|d| {
                let len = d.len();
                d.slice(42..len)
            }));
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
    let mut md = String::from(
        "The sender receives frames by AF_XDP and sends each on to a second domain (a thread here; the `adc` test checks the \
         same between processes): as a descriptor of the frame in place, or copied into a new fbuf first. Time per frame, \
         sender side, including the releases collected.\n\n",
    );
    md.push_str(&tab.render());
    Ok((md, recs))
}
