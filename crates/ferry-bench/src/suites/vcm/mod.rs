//! `ferry-bench vcm`: the VCM paper's Figures 4 and 5. One-way latency (half the round
//! trip) from 4 B to 64 KiB and sender bandwidth over UDP on loopback, with VCM command
//! vectors on an SQPOLL ring against one system call per send and per receive.
//!
//! Both paths talk to the same echo peer: a process pinned to the second CPU that answers
//! each datagram with blocking `recv_from`/`send_to` ([`echo`]). The
//! measuring thread is pinned to the first CPU. On the VCM path it places one loop REQUEST command (a send linked to the
//! receive of the reply) and, per round trip, re-activates it with the message's length
//! and spins on its status word; the SQPOLL kernel thread is pinned to the peer's CPU,
//! since a machine of two CPUs has no third one for it. (Measured alternative: with the
//! SQPOLL thread on the measuring thread's CPU, or unpinned and so inheriting that CPU,
//! the spinning client and the kernel thread time-slice and the median one-way latency was
//! about 4 ms at every size; the peer's CPU is the only workable place here.) On the
//! syscall path it calls
//! `send` then `recv` on a blocking socket. Syscalls per message are counted: the
//! endpoint's own count of `io_uring_enter` calls (and ferry's per-thread syscall counter)
//! on the VCM path; two calls per round trip, by construction, on the other.

pub mod echo;
mod report;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry::uring::Features;
use ferry::vcm::{BufRange, Command, Endpoint, EndpointConfig, Status, Vector};

use crate::harness::crew::{Crew, WorkerSpec};
use crate::harness::ctx::BenchCtx;
use crate::harness::output::BenchOutput;
use crate::harness::record::Record;
use crate::harness::stats::{mean, spread, Summary};
use crate::harness::BenchDef;
use crate::protocol::{Pattern, Plan, Role, Touch, Wait};
use crate::sys;
use crate::transport::LinkEnd;
use echo::STOP;
use report::{markdown, plots, skipped};

pub const BENCH: BenchDef = BenchDef {
    name: "vcm",
    about: "one-way latency 4 B..64 KiB and sender bandwidth: VCM command vectors on SQPOLL vs one syscall per send/receive (VCM Figures 4 and 5)",
    run,
};

/// The largest UDP payload; the paper's 64 KiB point.
const MAX_UDP: usize = 65507;
const SIZES: &[usize] = &[4, 64, 512, 1024, 4096, 16384, 32768, MAX_UDP];
const QUICK_SIZES: &[usize] = &[4, 1024, 16384, MAX_UDP];
/// Messages per burst in the bandwidth test, as in the paper.
const BURST: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Vcm,
    Syscall,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Vcm => "VCM vectors, SQPOLL",
            Path::Syscall => "syscall per send/recv",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Path::Vcm => "vcm-sqpoll",
            Path::Syscall => "syscall",
        }
    }
}

/// One path at one size: one-way latencies in µs, syscalls, messages.
#[derive(Default)]
struct Lat {
    us: Vec<f64>,
    per_trial_median: Vec<f64>,
    syscalls: u64,
    messages: u64,
}

/// The echo peer: a `ferry-bench __worker vcm-echo` process pinned to the peer CPU, answering
/// on a socket the harness bound and handed over; and a sink socket that nobody reads (the
/// bandwidth test measures the sender, and once the sink's buffer is full the kernel drops
/// what arrives, after the sender's copy into an skb).
struct Peer {
    addr: SocketAddr,
    sink: SocketAddr,
    _sink: UdpSocket,
    crew: Option<Crew>,
}

impl Peer {
    fn start(cpu: usize) -> Result<Peer> {
        let echo = UdpSocket::bind("127.0.0.1:0")?;
        let sink = UdpSocket::bind("127.0.0.1:0")?;
        let (addr, sink_addr) = (echo.local_addr()?, sink.local_addr()?);
        let fd: OwnedFd = echo.into();
        let mut spec = WorkerSpec::new(Role::VcmEcho, cpu);
        spec.rx = Some(LinkEnd {
            spec: fd.as_raw_fd().to_string(),
            fds: vec![fd],
        });
        // The worker ignores its plan, but every worker is started with one.
        let plan = Plan {
            pattern: Pattern::PingPong,
            wait: Wait::Block,
            touch: Touch::Header,
            sizes: vec![4096],
            msgs: vec![1],
            warmup: vec![0],
            trials: 1,
            hops: 0,
        };
        let mut crew = Crew::default();
        crew.spawn(spec, &plan)?;
        Ok(Peer {
            addr,
            sink: sink_addr,
            _sink: sink,
            crew: Some(crew),
        })
    }

    /// Stops the echo process and checks that it exited cleanly.
    fn stop(mut self) -> Result<()> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.send_to(STOP, self.addr)?;
        if let Some(crew) = self.crew.take() {
            crew.finish(Duration::from_secs(10))?;
        }
        Ok(())
    }
}

fn vcm_endpoint(sqpoll_cpu: usize) -> Result<Endpoint> {
    let mut o = EndpointConfig::new(2 * 65536).sqpoll(100);
    o.ring.sqpoll_cpu = Some(sqpoll_cpu as u32);
    // Spin on the status word; never block in the kernel.
    o.spin = Duration::from_secs(3600);
    Ok(Endpoint::new(o)?)
}

const REPLY: BufRange = BufRange::new(65536, 65536);

/// How long a round trip may take before its request or reply counts as lost. UDP on
/// loopback drops a datagram only when a socket buffer is full, which a ping-pong should
/// never cause; but a lost datagram must cost one trial, not the whole run (the VCM path
/// spins and never blocks, so nothing else would end the wait).
const LOST_AFTER: Duration = Duration::from_secs(2);
/// Trials redone after a lost datagram before the benchmark gives up.
const MAX_REDONE: u32 = 3;

/// One trial of round trips: one-way µs per round trip and the syscalls made, or `None`
/// if a datagram was lost and the trial must be redone.
type Trial = Option<(Vec<f64>, u64)>;

/// Round trips on the VCM path.
fn vcm_round_trips(
    peer: SocketAddr,
    sq_cpu: usize,
    size: usize,
    warm: usize,
    n: usize,
) -> Result<Trial> {
    let mut ep = vcm_endpoint(sq_cpu)?;
    let sock = ep.add_socket(UdpSocket::bind("127.0.0.1:0")?.into())?;
    let send = BufRange::new(0, size as u32);
    ep.buf_mut(send)?.fill(0x5a);
    let mut v = Vector::new();
    v.push_dormant(Command::Request {
        sock,
        send,
        to: Some(peer),
        reply: REPLY,
    });
    let req = ep.submit(&v)?[0];
    let mut out = Vec::with_capacity(n);
    let mut sys0 = 0;
    let mut enters0 = 0;
    for i in 0..warm + n {
        if i == warm {
            sys0 = ferry::stats::thread_syscall_count();
            enters0 = ep.stats().enters;
        }
        let t0 = Instant::now();
        ep.activate(req, send)?;
        let st = match ep.wait(req, Some(LOST_AFTER)) {
            // Dropping the endpoint cancels the request that still waits for its reply.
            Err(ferry::Error::Timeout) => return Ok(None),
            r => r?,
        };
        let dt = t0.elapsed();
        if st != Status::Done(size as u32) {
            bail!("VCM request of {size} B ended as {st:?}");
        }
        if i >= warm {
            out.push(dt.as_secs_f64() * 1e6 / 2.0);
        }
    }
    let sys = ferry::stats::thread_syscall_count() - sys0;
    let enters = ep.stats().enters - enters0;
    // Both counters see the same calls; keep the larger to be safe.
    Ok(Some((out, sys.max(enters))))
}

fn syscall_round_trips(peer: SocketAddr, size: usize, warm: usize, n: usize) -> Result<Trial> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(peer)?;
    s.set_read_timeout(Some(LOST_AFTER))?;
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::with_capacity(n);
    let mut calls = 0;
    for i in 0..warm + n {
        let t0 = Instant::now();
        s.send(&msg)?;
        // io_uring task work from a ring this thread just closed can interrupt a recv
        // that has a timeout (EINTR); retry it.
        let got = loop {
            match s.recv(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                r => break r.context("echo reply")?,
            }
        };
        let dt = t0.elapsed();
        if got != size {
            bail!("reply of {got} B to {size} B");
        }
        if i >= warm {
            calls += 2;
            out.push(dt.as_secs_f64() * 1e6 / 2.0);
        }
    }
    Ok(Some((out, calls)))
}

/// Sender bandwidth of bursts of `BURST` messages: MB/s per burst.
fn vcm_bursts(
    sink: SocketAddr,
    sq_cpu: usize,
    size: usize,
    bursts: usize,
) -> Result<(Vec<f64>, u64, u64)> {
    let mut ep = vcm_endpoint(sq_cpu)?;
    let sock = ep.add_socket(UdpSocket::bind("127.0.0.1:0")?.into())?;
    ep.buf_mut(BufRange::new(0, size as u32))?.fill(0xa5);
    let mut v = Vector::new();
    for _ in 0..BURST {
        v.push(Command::Send {
            sock,
            buf: BufRange::new(0, size as u32),
            to: Some(sink),
        });
    }
    let mut out = Vec::new();
    let enters0 = ep.stats().enters;
    for _ in 0..bursts {
        let t0 = Instant::now();
        let ids = ep.submit(&v)?;
        let last = *ids.last().unwrap();
        let st = ep.wait(last, Some(Duration::from_secs(5)))?;
        let dt = t0.elapsed().as_secs_f64();
        for id in ids {
            ep.wait(id, Some(Duration::from_secs(5)))?;
            ep.release(id)?;
        }
        if st != Status::Done(size as u32) {
            bail!("VCM send of {size} B ended as {st:?}");
        }
        out.push((BURST * size) as f64 / dt / 1e6);
    }
    Ok((out, ep.stats().enters - enters0, (bursts * BURST) as u64))
}

fn syscall_bursts(sink: SocketAddr, size: usize, bursts: usize) -> Result<Vec<f64>> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(sink)?;
    let msg = vec![0xa5u8; size];
    let mut out = Vec::new();
    for _ in 0..bursts {
        let t0 = Instant::now();
        for _ in 0..BURST {
            s.send(&msg)?;
        }
        out.push((BURST * size) as f64 / t0.elapsed().as_secs_f64() / 1e6);
    }
    Ok(out)
}

/// Zero-copy sends of the largest size to the sink: (sends, reported copied by the kernel,
/// whether SEND_ZC was available).
fn zc_probe(sink: SocketAddr, sends: usize) -> Result<(u64, u64, bool)> {
    let mut o = EndpointConfig::new(65536);
    o.zero_copy_send = true;
    let mut ep = Endpoint::new(o)?;
    if ep.stats().zc_fallback {
        return Ok((0, 0, false));
    }
    let sock = ep.add_socket(UdpSocket::bind("127.0.0.1:0")?.into())?;
    let r = BufRange::new(0, MAX_UDP as u32);
    ep.buf_mut(r)?.fill(0x3c);
    let mut v = Vector::new();
    v.push_dormant(Command::Send {
        sock,
        buf: r,
        to: Some(sink),
    });
    let id = ep.submit(&v)?[0];
    for _ in 0..sends {
        ep.activate(id, r)?;
        let st = ep.wait(id, Some(Duration::from_secs(5)))?;
        if st != Status::Done(MAX_UDP as u32) {
            bail!("zero-copy send ended as {st:?}");
        }
    }
    let st = ep.stats();
    Ok((st.zc_sends, st.zc_copied, true))
}

struct Measured {
    zc: (u64, u64, bool),
    sizes: Vec<usize>,
    lat: Vec<[Lat; 2]>,
    bw: Vec<[Vec<f64>; 2]>,
    bw_syscalls: (u64, u64),
    /// Latency trials redone because a datagram was lost: (path, size) per redo.
    redone: Vec<(Path, usize)>,
}

fn measure(ctx: &BenchCtx) -> Result<Measured> {
    let (client_cpu, peer_cpu) = (ctx.cpu(0), ctx.cpu(1));
    let sizes: Vec<usize> = ctx.pick(QUICK_SIZES, SIZES).to_vec();
    let trials = ctx.pick(2, 3);
    let n = ctx.pick(400, 3000);
    let warm = ctx.pick(50, 200);
    let bursts = ctx.pick(100, 1000);
    let peer = Peer::start(peer_cpu)?;
    let (addr, sink) = (peer.addr, peer.sink);
    let sizes2 = sizes.clone();
    let progress = &ctx.progress;
    progress.phase(&format!(
        "vcm: {} sizes x {trials} trials x {n} round trips per path, then {bursts} bursts of {BURST}",
        sizes.len()
    ));
    let m = thread::scope(|sc| {
        sc.spawn(move || -> Result<Measured> {
            sys::pin_to(client_cpu)?;
            let mut lat: Vec<[Lat; 2]> = Vec::new();
            let mut bw = Vec::new();
            let mut bw_syscalls = (0, 0);
            let mut redone = Vec::new();
            for &size in &sizes2 {
                let mut pair = [Lat::default(), Lat::default()];
                for t in 0..trials {
                    // Alternate which path goes first, trial by trial.
                    let order = if t % 2 == 0 {
                        [Path::Vcm, Path::Syscall]
                    } else {
                        [Path::Syscall, Path::Vcm]
                    };
                    for p in order {
                        let (us, calls) = loop {
                            let trial = match p {
                                Path::Vcm => vcm_round_trips(addr, peer_cpu, size, warm, n)?,
                                Path::Syscall => syscall_round_trips(addr, size, warm, n)?,
                            };
                            if let Some(t) = trial {
                                break t;
                            }
                            redone.push((p, size));
                            if redone.len() > MAX_REDONE as usize {
                                bail!(
                                    "vcm: {} trials lost a datagram (no reply within {LOST_AFTER:?}); \
                                     the last at {size} B on the {} path",
                                    redone.len(),
                                    p.label()
                                );
                            }
                        };
                        let l = &mut pair[p as usize];
                        l.per_trial_median.push(Summary::of(&us).median);
                        l.us.extend(us);
                        l.syscalls += calls;
                        // A round trip is two messages: one sent, one received.
                        l.messages += 2 * n as u64;
                    }
                }
                lat.push(pair);
                let (v, e, msgs) = vcm_bursts(sink, peer_cpu, size, bursts)?;
                bw_syscalls.0 += e;
                bw_syscalls.1 += msgs;
                let s = syscall_bursts(sink, size, bursts)?;
                bw.push([v, s]);
            }
            let zc = zc_probe(sink, 100)?;
            Ok(Measured {
                zc,
                sizes: sizes2,
                lat,
                bw,
                bw_syscalls,
                redone,
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("vcm measuring thread panicked"))?
    })?;
    peer.stop()?;
    Ok(m)
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let f = Features::probe();
    let mut out = BenchOutput::default();
    if !f.ring || !f.sqpoll {
        out.markdown = skipped(f);
        return Ok(out);
    }
    let memcpy = ctx.memcpy()?.gbps.median;
    let m = measure(ctx)?;
    for (i, &size) in m.sizes.iter().enumerate() {
        let [v, s] = &m.lat[i];
        let (sv, ss) = (Summary::of(&v.us), Summary::of(&s.us));
        for (p, l, sum) in [(Path::Vcm, v, sv), (Path::Syscall, s, ss)] {
            out.records.push(
                Record::new(
                    "vcm",
                    &format!("latency-{}", p.key()),
                    "us",
                    sum,
                    l.per_trial_median.len() as u32,
                    spread(&l.per_trial_median),
                )
                .param("size", size)
                .param("mean", mean(&l.us))
                .param(
                    "syscalls_per_message",
                    l.syscalls as f64 / l.messages as f64,
                ),
            );
        }
    }
    for (i, &size) in m.sizes.iter().enumerate() {
        let [v, s] = &m.bw[i];
        let (sv, ss) = (Summary::of(v), Summary::of(s));
        for (p, x, sum) in [(Path::Vcm, v, sv), (Path::Syscall, s, ss)] {
            out.records.push(
                Record::new(
                    "vcm",
                    &format!("bandwidth-{}", p.key()),
                    "MB/s",
                    sum,
                    1,
                    0.0,
                )
                .param("size", size)
                .param("mean", mean(x)),
            );
        }
    }
    let (zs, zc, zok) = m.zc;
    out.records.push(
        Record::new(
            "vcm",
            "send-zc-loopback-copied",
            "sends",
            Summary::of(&[zc as f64]),
            1,
            0.0,
        )
        .param("zc_sends", zs)
        .param("available", zok),
    );
    out.markdown = markdown(ctx, &m, memcpy);
    out.plots = plots(&m);
    Ok(out)
}
