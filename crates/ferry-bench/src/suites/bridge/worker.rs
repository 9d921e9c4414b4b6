//! The processes of `ferry-bench bridge` (`ferry-bench __bridge JSON`): each enters its
//! host's network namespace first (so every thread and socket it makes is there), then
//! plays one [`Role`].
//!
//! Receivers report a message whose header asks for it as one [`Arrival`] record
//! written to the run's FIFO (24 bytes, so concurrent writers never interleave); the
//! publisher reads them, paces the next message on them and computes the results.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ferry::{Group, Publisher, ServiceConfig, SlowSubscriber, Subscriber};
use ferry_xdp::testnet;
use serde::{Deserialize, Serialize};
use zenoh::bytes::ZBytes;
use zenoh::handlers::{FifoChannel, IntoHandler};
use zenoh::qos::CongestionControl;
use zenoh::sample::{Locality, Sample};
use zenoh::Wait;

use crate::sys::now_ns;

/// How long any set-up step (a subscriber finding its service, a match) may take.
pub const WAIT: Duration = Duration::from_secs(60);

/// The services of host A's publisher, one per measured case. The bridges' policies
/// decide which of them cross (see [`super`]).
pub const ALONE: &str = "bench/alone";
pub const IDLE: &str = "bench/idle";
pub const TWO: &str = "bench/two";
pub const CARRY: &str = "bench/carry";
/// As [`CARRY`], but A's local subscriber subscribes only once A's bridge has: the
/// bridge comes first in the publisher's list of subscribers.
pub const EARLY: &str = "bench/early";
/// The fair floor of [`CARRY`]: A's bridge denies it, and with each message the
/// publisher puts the same bytes to zenoh's subscriber on B, as the bridge would: the
/// local hand-over while the far host's work runs on the same CPUs, without the bridge.
pub const ZCARRY: &str = "bench/zcarry";
/// Throughput: subscribed on B only, as zenoh's reference is (no local subscriber on A
/// shares the CPUs with the path measured).
pub const FAR: &str = "bench/far";
/// The service in B's group into whose path zenoh's copying subscriber copies each
/// message (see [`Who::ZenohCopy`]); published with no subscriber.
pub const ZCOPY: &str = "bench/zcopy";

/// Who reports an arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u64)]
pub enum Who {
    /// A's subscriber of [`ALONE`] (no bridge: ferry's own hand-over).
    Alone = 0,
    /// A's subscriber of [`IDLE`] (bridge attached, exporting, no far subscriber).
    Idle = 1,
    /// A's subscriber of [`TWO`] (a second plain local subscriber beside it).
    Two = 2,
    /// The second plain subscriber of [`TWO`] (copies every byte out, as a bridge does).
    Second = 3,
    /// A's subscriber of [`CARRY`] (the bridge carrying every message to B).
    Carry = 4,
    /// B's subscriber of [`CARRY`], through both bridges.
    Remote = 5,
    /// zenoh's own subscriber on B.
    Zenoh = 6,
    /// A's subscriber of [`EARLY`], which joined after the bridge.
    Early = 7,
    /// B's subscriber of [`EARLY`].
    EarlyRemote = 8,
    /// B's subscriber of [`FAR`], the only one.
    Far = 9,
    /// A's subscriber of [`ZCARRY`] (zenoh carrying the same message to B meanwhile).
    ZCarry = 10,
    /// A second zenoh subscriber on B (its own key) that copies each message into an
    /// fbuf of a ferry path and publishes it before it reports, as B's bridge does with
    /// what it imports: zenoh's own publish-subscribe with the bridge's one copy, the
    /// floor of the path through the bridges on CPUs that both hosts share.
    ZenohCopy = 11,
}

impl Who {
    fn from(v: u64) -> Option<Who> {
        use Who::*;
        [
            Alone,
            Idle,
            Two,
            Second,
            Carry,
            Remote,
            Zenoh,
            Early,
            EarlyRemote,
            Far,
            ZCarry,
            ZenohCopy,
        ]
        .into_iter()
        .find(|w| *w as u64 == v)
    }
}

/// What one process does.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Role {
    /// A bridge (as the `ferry-bridge` binary runs it) until SIGTERM.
    Bridge {
        listen: Vec<String>,
        connect: Vec<String>,
        deny: Vec<String>,
    },
    /// Ferry subscribers, one thread each: (service, who, copy every byte out).
    Subs { subs: Vec<(String, Who, bool)> },
    /// zenoh's own subscriber, connecting to the publisher's endpoint; with `copy`, the
    /// copying one ([`Who::ZenohCopy`]).
    ZenohSub {
        connect: String,
        #[serde(default)]
        copy: bool,
    },
    /// Host A's publisher of every service and of zenoh's reference; drives the run and
    /// prints its [`Results`] as one JSON line.
    Pub { zenoh_listen: String, plan: Plan },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    /// The network namespace to enter; `None` on loopback.
    pub ns: Option<String>,
    pub group: String,
    pub scope: String,
    pub fifo: String,
    /// The CPU to pin to: the publisher and zenoh's subscriber once their zenoh
    /// session is up (zenoh's own threads stay free, as the bridges' do), a ferry
    /// receiver's process from the start.
    pub cpu: Option<usize>,
    pub role: Role,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    pub sizes: Vec<usize>,
    pub rounds: usize,
    /// Latency messages per case, size and round.
    pub lat_n: usize,
    /// How long each throughput measurement sends (per size, round and system), at
    /// least [`TPUT_MIN`] messages; a warm-up burst of a fifth of it comes first.
    pub tput_ms: u64,
}

/// The fewest messages of one throughput measurement.
pub const TPUT_MIN: usize = 64;

/// One case's latencies (µs) at one size, over every round.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Series {
    pub alone: Vec<f64>,
    pub idle: Vec<f64>,
    pub two: Vec<f64>,
    pub carry: Vec<f64>,
    pub remote: Vec<f64>,
    /// A's subscriber of [`EARLY`] (the bridge woken before it).
    pub early: Vec<f64>,
    /// A's subscriber of [`ZCARRY`] (zenoh carrying the same message to B meanwhile).
    #[serde(default)]
    pub zcarry: Vec<f64>,
    pub zenoh: Vec<f64>,
    /// zenoh's copying subscriber ([`Who::ZenohCopy`]).
    #[serde(default)]
    pub zcopy: Vec<f64>,
    /// As `alone`, `remote`, `zenoh` and `zcopy`, in the turns run back to back.
    #[serde(default)]
    pub alone_b2b: Vec<f64>,
    #[serde(default)]
    pub remote_b2b: Vec<f64>,
    #[serde(default)]
    pub zenoh_b2b: Vec<f64>,
    #[serde(default)]
    pub zcopy_b2b: Vec<f64>,
    /// MB/s, one per round.
    pub remote_mbs: Vec<f64>,
    pub zenoh_mbs: Vec<f64>,
    #[serde(default)]
    pub zcopy_mbs: Vec<f64>,
    /// Messages timed per round.
    pub remote_n: Vec<usize>,
    pub zenoh_n: Vec<usize>,
    #[serde(default)]
    pub zcopy_n: Vec<usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub sizes: Vec<usize>,
    pub series: Vec<Series>,
    /// Host A's subscribers of [`IDLE`] when it was measured (1: the bridge was not
    /// subscribed).
    pub idle_subscribers: usize,
}

/// `ferry-bench __bridge JSON`.
pub fn main(args: &[String]) -> Result<()> {
    let [json] = args else {
        bail!("usage: ferry-bench __bridge JSON");
    };
    let spec: Spec = serde_json::from_str(json)?;
    if let Some(ns) = &spec.ns {
        testnet::enter(ns).with_context(|| format!("entering namespace {ns}"))?;
    }
    match &spec.role {
        Role::Bridge {
            listen,
            connect,
            deny,
        } => {
            let mut c = ferry_zenoh::BridgeConfig::new(&spec.group);
            c.scope = Some(spec.scope.clone());
            c.listen = listen.clone();
            c.connect = connect.clone();
            c.policy.deny = deny.clone();
            c.log = std::env::var_os("FERRY_BENCH_BRIDGE_LOG").is_some();
            ferry::stop::catch_signals()?;
            ferry_zenoh::run(&c, ferry::stop::flag())
        }
        Role::Subs { subs } => {
            pin(&spec)?;
            run_subs(&spec, subs)
        }
        Role::ZenohSub { connect, copy } => run_zenoh_sub(&spec, connect, *copy),
        Role::Pub { zenoh_listen, plan } => {
            let r = run_pub(&spec, zenoh_listen, plan)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
    }
}

/// Pins the calling thread (and every thread it starts later) to the spec's CPU.
fn pin(spec: &Spec) -> Result<()> {
    if let Some(cpu) = spec.cpu {
        crate::sys::pin_to(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    Ok(())
}

/// The header of every message: its send stamp, then whether to report it.
fn header(stamp: u64, report: bool) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&stamp.to_le_bytes());
    h[8] = report as u8;
    h
}

fn parse_header(h: &[u8; 16]) -> (u64, bool) {
    (
        u64::from_le_bytes(h[..8].try_into().expect("8 bytes")),
        h[8] != 0,
    )
}

fn open_fifo_writer(path: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {path}"))
}

fn report(fifo: &mut std::fs::File, who: Who, stamp: u64, at: u64) -> Result<()> {
    let mut r = [0u8; 24];
    r[..8].copy_from_slice(&(who as u64).to_le_bytes());
    r[8..16].copy_from_slice(&stamp.to_le_bytes());
    r[16..].copy_from_slice(&at.to_le_bytes());
    fifo.write_all(&r)?;
    Ok(())
}

fn run_subs(spec: &Spec, subs: &[(String, Who, bool)]) -> Result<()> {
    let group = Group::open(&spec.group)?;
    let mut threads = Vec::new();
    for (service, who, copy) in subs.iter().cloned() {
        let domain = group.join()?;
        let mut fifo = open_fifo_writer(&spec.fifo)?;
        let group = group.clone();
        // Named, so that the scheduler's traces tell the cases apart.
        let name = format!("sub-{who:?}").to_lowercase();
        let body = move || -> Result<()> {
            if who == Who::Early {
                // After the bridge: once the service has a subscriber.
                let deadline = Instant::now() + WAIT;
                while !group
                    .services()
                    .iter()
                    .any(|s| s.name == service && !s.subscribers.is_empty())
                {
                    if Instant::now() > deadline {
                        bail!("A's bridge never subscribed to {service}");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let mut s = Subscriber::open(&domain, &service, WAIT)
                .with_context(|| format!("subscribing to {service}"))?;
            let mut out = Vec::new();
            loop {
                let d = match s.recv_timeout(Duration::from_millis(200)) {
                    Ok(d) => d,
                    Err(ferry::Error::Timeout) => continue,
                    Err(ferry::Error::PeerGone { .. } | ferry::Error::Disconnected) => {
                        return Ok(())
                    }
                    Err(e) => return Err(e.into()),
                };
                let mut h = [0u8; 16];
                d.copy_range_to_slice(0..16, &mut h);
                let at = now_ns();
                if copy {
                    // The local half of a bridge's work: every byte read out once.
                    out.resize(d.len(), 0);
                    d.copy_range_to_slice(0..d.len(), &mut out);
                }
                drop(d);
                let (stamp, wanted) = parse_header(&h);
                if wanted {
                    report(&mut fifo, who, stamp, at)?;
                }
            }
        };
        threads.push(std::thread::Builder::new().name(name).spawn(body)?);
    }
    for t in threads {
        t.join().map_err(|_| anyhow!("a subscriber panicked"))??;
    }
    Ok(())
}

fn zopen(listen: &[String], connect: &[String]) -> Result<zenoh::Session> {
    zenoh::open(ferry_zenoh::zenoh_config(listen, connect, false)?)
        .wait()
        .map_err(|e| anyhow!("opening a zenoh session: {e}"))
}

/// zenoh's reference key; with `copy`, the copying subscriber's.
fn zkey(spec: &Spec, copy: bool) -> String {
    if copy {
        format!("bench/{}/copy", spec.scope)
    } else {
        format!("bench/{}", spec.scope)
    }
}

fn run_zenoh_sub(spec: &Spec, connect: &str, copy: bool) -> Result<()> {
    let session = zopen(&[], &[connect.to_owned()])?;
    let declare = session
        .declare_subscriber(zkey(spec, copy))
        .allowed_origin(Locality::Remote);
    // The copying subscriber's path: an ordinary publisher's in B's group, as B's bridge
    // offers what it imports.
    let mut _domain = None;
    let sub = if copy {
        let domain = Group::open(&spec.group)?.join()?;
        let into = std::sync::Mutex::new(offer(&domain, ZCOPY)?);
        _domain = Some(domain);
        // It copies on zenoh's receiving thread, where B's bridge copies a blocking
        // service's messages (its callback), then hands the sample on through the same
        // channel as zenoh's reference.
        let (hand_on, samples) = FifoChannel::new(16).into_handler();
        declare
            .with((
                move |s: Sample| {
                    let mut p = into.lock().expect("only this callback locks it");
                    // An error (no room in the path) leaves the sample uncounted: the
                    // publisher's wait for it fails the run.
                    if copy_into_fbuf(&mut p, s.payload()).is_ok() {
                        hand_on.call(s);
                    }
                },
                samples,
            ))
            .wait()
    } else {
        declare.with(FifoChannel::new(16)).wait()
    }
    .map_err(|e| anyhow!("{e}"))?;
    // Only this thread, which receives and reports: zenoh's threads, started with the
    // session, run where the scheduler puts them, as B's bridge does.
    pin(spec)?;
    let mut fifo = open_fifo_writer(&spec.fifo)?;
    loop {
        let s = match sub.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(_) => return Ok(()),
        };
        let mut h = [0u8; 16];
        s.payload().reader().read_exact(&mut h)?;
        let at = now_ns();
        drop(s);
        let (stamp, wanted) = parse_header(&h);
        if wanted {
            let who = if copy { Who::ZenohCopy } else { Who::Zenoh };
            report(&mut fifo, who, stamp, at)?;
        }
    }
}

/// What B's bridge does with a message it imports: one copy from zenoh's buffers into an
/// fbuf of its path, slice by slice, then the publish (here to no subscriber).
fn copy_into_fbuf(p: &mut Publisher, payload: &ZBytes) -> Result<()> {
    let mut m = p.path().alloc(payload.len())?;
    let mut at = 0;
    for slice in payload.slices() {
        m.write_at(at, slice);
        at += slice.len();
    }
    p.publish(&m.freeze())?;
    Ok(())
}

/// The publisher's end of the FIFO: arrival records, read with a timeout.
struct Arrivals {
    fifo: std::fs::File,
    buf: Vec<u8>,
}

impl Arrivals {
    fn open(path: &str) -> Result<Arrivals> {
        // Read-write, so that opening does not wait for a writer and the FIFO never
        // reads as ended while receivers come and go.
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {path}"))?;
        Ok(Arrivals {
            fifo,
            buf: Vec::new(),
        })
    }

    /// The next record before `deadline`.
    fn next(&mut self, deadline: Instant) -> Result<(Who, u64, u64)> {
        while self.buf.len() < 24 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("a message did not arrive");
            }
            let ts = rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as i64,
            };
            let mut fds = [rustix::event::PollFd::new(
                &self.fifo,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
            let mut chunk = [0u8; 24 * 64];
            let n = rustix::io::read(self.fifo.as_fd(), &mut chunk)?;
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let r: Vec<u8> = self.buf.drain(..24).collect();
        let w = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
        let who = Who::from(w(0)).context("an unknown reporter")?;
        Ok((who, w(8), w(16)))
    }

    /// Waits until each of `whos` reported `stamp`; their latencies (µs), in order.
    /// Records of other stamps (an earlier message's second receiver) are skipped.
    fn wait(&mut self, whos: &[Who], stamp: u64, wait: Duration) -> Result<Vec<f64>> {
        let deadline = Instant::now() + wait;
        let mut got = vec![None; whos.len()];
        while got.iter().any(Option::is_none) {
            let (who, s, at) = self
                .next(deadline)
                .with_context(|| format!("waiting for {whos:?}"))?;
            if s != stamp {
                continue;
            }
            if let Some(i) = whos.iter().position(|w| *w == who) {
                got[i] = Some(at.saturating_sub(s) as f64 / 1e3);
            }
        }
        Ok(got.into_iter().map(|g| g.expect("all arrived")).collect())
    }
}

/// One publisher of host A's services.
fn offer(domain: &ferry::Domain, name: &str) -> Result<Publisher> {
    let config = ServiceConfig {
        depth: 16,
        slow: SlowSubscriber::Block,
        ..ServiceConfig::default()
    };
    Ok(Publisher::offer(domain, name, config)?)
}

/// Every message's body is written whole before it is stamped, by ferry's publisher and
/// by zenoh's alike, as a publisher of fresh data writes it: the bytes that the
/// exporting bridge or zenoh's `put` then copies are where a writer left them. (zenoh's
/// reference once put the same body every message, unwritten: a copy out of a warm
/// cache, while the bridge copied fbufs that no one had written since their last use.)
fn write_body(body: &mut [u8]) {
    body.fill(now_ns() as u8 | 1);
}

fn send_ferry(p: &mut Publisher, size: usize, report: bool) -> Result<u64> {
    let mut m = p.loan(size)?;
    write_body(&mut m.as_mut_slice()[16..]);
    let stamp = now_ns();
    m.as_mut_slice()[..16].copy_from_slice(&header(stamp, report));
    m.send()?;
    Ok(stamp)
}

/// zenoh's publisher with the same kind of message the bridge puts: the header, then a
/// body lent without a copy (the bridge lends its fbuf), written whole before each
/// message (see [`write_body`]).
struct ZPub<'a> {
    publisher: zenoh::pubsub::Publisher<'a>,
    body: bytes::Bytes,
}

impl ZPub<'_> {
    fn send(&mut self, size: usize, report: bool) -> Result<u64> {
        self.send_stamped(size, report, None)
    }

    /// As [`ZPub::send`], with the stamp of a message already sent elsewhere (whose body
    /// ferry's publisher wrote: this one is put as it is).
    fn send_stamped(&mut self, size: usize, report: bool, stamp: Option<u64>) -> Result<u64> {
        let len = size - 16;
        if stamp.is_none() || self.body.len() < len {
            // The body zenoh was lent last time, back if zenoh let it go (it copies a
            // message into its batches within `put`), else a new one.
            let mut b = std::mem::take(&mut self.body)
                .try_into_mut()
                .ok()
                .filter(|b| b.len() >= len)
                .unwrap_or_else(|| bytes::BytesMut::zeroed(len));
            if stamp.is_none() {
                write_body(&mut b[..len]);
            }
            self.body = b.freeze();
        }
        let stamp = stamp.unwrap_or_else(now_ns);
        let mut w = ZBytes::writer();
        w.append(ZBytes::from(header(stamp, report).to_vec()));
        w.append(ZBytes::from(self.body.slice(..size - 16)));
        self.publisher
            .put(w.finish())
            .wait()
            .map_err(|e| anyhow!("{e}"))?;
        Ok(stamp)
    }
}

/// The cases: the hand-overs on A (alone, idle, two, carry, early, zcarry), zenoh's,
/// and zenoh's with the bridge's copy (the floor).
const CASES: usize = 8;
/// The cases of the back-to-back turns: no bridge (for the floor), carrying (the
/// bridge's latency), zenoh's own and zenoh's copying.
const LATENCY_CASES: [usize; 4] = [0, 3, 6, 7];

/// An order of the [`CASES`] for turn `i`: successive turns take orders far apart in
/// the list of all 40320 (a Lehmer code; 1973 is prime to 40320), so that every case
/// comes first, and after every other, about as often.
fn order(i: usize) -> [usize; CASES] {
    let mut left: Vec<usize> = (0..CASES).collect();
    let mut code = i * 1973 % 40320;
    let mut out = [0; CASES];
    for (k, o) in out.iter_mut().enumerate() {
        let f = [5040, 720, 120, 24, 6, 2, 1, 1][k];
        *o = left.remove(code / f);
        code %= f;
    }
    out
}

/// A pause before each timed message, so that what the previous case left running (a
/// far receiver freeing its buffers, a bridge finishing its publish, zenoh's threads
/// winding down) is done before the next is timed: the receivers compared share their
/// CPU with all of it.
fn settle(size: usize) {
    let gap = Duration::from_micros(50 + (size as u64 >> 10));
    std::thread::sleep(gap.min(Duration::from_millis(2)));
}

fn run_pub(spec: &Spec, zenoh_listen: &str, plan: &Plan) -> Result<Results> {
    let group = Group::open(&spec.group)?;
    let domain = group.join()?;
    let mut alone = offer(&domain, ALONE)?;
    let mut idle = offer(&domain, IDLE)?;
    let mut two = offer(&domain, TWO)?;
    let mut carry = offer(&domain, CARRY)?;
    let mut early = offer(&domain, EARLY)?;
    let mut zcarry = offer(&domain, ZCARRY)?;
    let mut far = offer(&domain, FAR)?;
    let mut arrivals = Arrivals::open(&spec.fifo)?;
    let session = zopen(&[zenoh_listen.to_owned()], &[])?;
    let zpub_on = |copy: bool| -> Result<ZPub<'_>> {
        Ok(ZPub {
            publisher: session
                .declare_publisher(zkey(spec, copy))
                .congestion_control(CongestionControl::Block)
                .allowed_destination(Locality::Remote)
                .wait()
                .map_err(|e| anyhow!("{e}"))?,
            body: bytes::Bytes::new(),
        })
    };
    let mut zpub = zpub_on(false)?;
    let mut zcopy = zpub_on(true)?;
    let progress = |s: &str| eprintln!("bridge: {s}");

    // Set-up: every local subscriber, A's bridge on CARRY, then one message through
    // each path that must arrive before measuring.
    progress("waiting for the subscribers and both bridges");
    alone.wait_for_subscribers(1, WAIT)?;
    idle.wait_for_subscribers(1, WAIT)?;
    two.wait_for_subscribers(2, WAIT)?;
    carry.wait_for_subscribers(2, WAIT)?;
    early.wait_for_subscribers(2, WAIT)?;
    zcarry.wait_for_subscribers(1, WAIT)?;
    far.wait_for_subscribers(1, WAIT)?;
    let warm = |send: &mut dyn FnMut() -> Result<u64>, a: &mut Arrivals, who: Who| {
        let t0 = Instant::now();
        loop {
            let stamp = send()?;
            if a.wait(&[who], stamp, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if t0.elapsed() > WAIT {
                bail!("{who:?} never received");
            }
        }
    };
    warm(
        &mut || send_ferry(&mut carry, 64, true),
        &mut arrivals,
        Who::Remote,
    )?;
    warm(
        &mut || send_ferry(&mut early, 64, true),
        &mut arrivals,
        Who::EarlyRemote,
    )?;
    warm(
        &mut || send_ferry(&mut far, 64, true),
        &mut arrivals,
        Who::Far,
    )?;
    warm(&mut || zpub.send(64, true), &mut arrivals, Who::Zenoh)?;
    warm(&mut || zcopy.send(64, true), &mut arrivals, Who::ZenohCopy)?;
    let idle_subscribers = idle.subscriber_count();
    pin(spec)?;

    let mut series = vec![Series::default(); plan.sizes.len()];
    let one = |a: &mut Arrivals,
               whos: &[Who],
               send: &mut dyn FnMut() -> Result<u64>|
     -> Result<Vec<f64>> {
        let stamp = send()?;
        a.wait(whos, stamp, Duration::from_secs(30))
    };
    for round in 0..plan.rounds {
        for (si, &size) in plan.sizes.iter().enumerate() {
            progress(&format!("round {}/{}, {size} B", round + 1, plan.rounds));
            let s = &mut series[si];
            // The cases in turns, message by message, each turn in another of their
            // orders: a disturbance of the machine, or what a case leaves behind for the
            // one after it (zenoh's threads still winding down, its buffers in the
            // cache), falls on all of them alike.
            // Every other turn runs back to back, with no pause and only the cases the
            // latency bar needs (no bridge, carrying, zenoh's): the same latency for a
            // steady stream, where the CPUs stay busy, beside the one from idle CPUs.
            for i in 0..plan.lat_n {
                let paused = i % 2 == 0;
                for case in order(i) {
                    if !paused && !LATENCY_CASES.contains(&case) {
                        continue;
                    }
                    if paused {
                        settle(size);
                    }
                    match case {
                        0 => {
                            let l = one(&mut arrivals, &[Who::Alone], &mut || {
                                send_ferry(&mut alone, size, true)
                            })?;
                            if paused {
                                s.alone.push(l[0]);
                            } else {
                                s.alone_b2b.push(l[0]);
                            }
                        }
                        1 => {
                            let l = one(&mut arrivals, &[Who::Idle], &mut || {
                                send_ferry(&mut idle, size, true)
                            })?;
                            s.idle.push(l[0]);
                        }
                        2 => {
                            let l = one(&mut arrivals, &[Who::Two, Who::Second], &mut || {
                                send_ferry(&mut two, size, true)
                            })?;
                            s.two.push(l[0]);
                        }
                        3 => {
                            let l = one(&mut arrivals, &[Who::Carry, Who::Remote], &mut || {
                                send_ferry(&mut carry, size, true)
                            })?;
                            if paused {
                                s.carry.push(l[0]);
                                s.remote.push(l[1]);
                            } else {
                                s.remote_b2b.push(l[1]);
                            }
                        }
                        4 => {
                            let l =
                                one(&mut arrivals, &[Who::Early, Who::EarlyRemote], &mut || {
                                    send_ferry(&mut early, size, true)
                                })?;
                            s.early.push(l[0]);
                        }
                        5 => {
                            // As the bridge carries: the local subscriber woken first,
                            // then the same message put to B.
                            let l = one(&mut arrivals, &[Who::ZCarry, Who::Zenoh], &mut || {
                                let stamp = send_ferry(&mut zcarry, size, true)?;
                                zpub.send_stamped(size, true, Some(stamp))
                            })?;
                            s.zcarry.push(l[0]);
                        }
                        6 => {
                            let l =
                                one(&mut arrivals, &[Who::Zenoh], &mut || zpub.send(size, true))?;
                            if paused {
                                s.zenoh.push(l[0]);
                            } else {
                                s.zenoh_b2b.push(l[0]);
                            }
                        }
                        _ => {
                            let l = one(&mut arrivals, &[Who::ZenohCopy], &mut || {
                                zcopy.send(size, true)
                            })?;
                            if paused {
                                s.zcopy.push(l[0]);
                            } else {
                                s.zcopy_b2b.push(l[0]);
                            }
                        }
                    }
                }
            }
            // Throughput: both systems the same way. A warm-up burst, drained, then
            // back to back for the measurement's time (and at least TPUT_MIN
            // messages), timed from the first send to the last arrival.
            let span = Duration::from_millis(plan.tput_ms);
            let mbs = |a: &mut Arrivals,
                       who: Who,
                       send: &mut dyn FnMut(bool) -> Result<u64>|
             -> Result<(f64, usize)> {
                let burst = |span: Duration,
                             send: &mut dyn FnMut(bool) -> Result<u64>|
                 -> Result<(u64, u64, usize)> {
                    let t0 = Instant::now();
                    let first = send(false)?;
                    let mut n = 1;
                    while n + 1 < TPUT_MIN || t0.elapsed() < span {
                        send(false)?;
                        n += 1;
                    }
                    Ok((first, send(true)?, n + 1))
                };
                let (_, last, _) = burst(span / 5, send)?;
                a.wait(&[who], last, Duration::from_secs(60))?;
                let (first, last, n) = burst(span, send)?;
                let lat = a.wait(&[who], last, Duration::from_secs(60))?[0];
                let end = last as f64 + lat * 1e3;
                Ok(((n * size) as f64 / ((end - first as f64) / 1e9) / 1e6, n))
            };
            // Which goes first turns per round.
            let (mut b, mut z, mut c) = ((0.0, 0), (0.0, 0), (0.0, 0));
            for k in 0..3 {
                match (round + k) % 3 {
                    0 => {
                        b = mbs(&mut arrivals, Who::Far, &mut |r| {
                            send_ferry(&mut far, size, r)
                        })?
                    }
                    1 => z = mbs(&mut arrivals, Who::Zenoh, &mut |r| zpub.send(size, r))?,
                    _ => c = mbs(&mut arrivals, Who::ZenohCopy, &mut |r| zcopy.send(size, r))?,
                }
            }
            progress(&format!(
                "  throughput {size} B: bridge {:.0} MB/s ({} msgs), zenoh {:.0} MB/s ({} msgs), zenoh copying {:.0} MB/s ({} msgs)",
                b.0, b.1, z.0, z.1, c.0, c.1
            ));
            s.remote_n.push(b.1);
            s.zenoh_n.push(z.1);
            s.zcopy_n.push(c.1);
            s.remote_mbs.push(b.0);
            s.zenoh_mbs.push(z.0);
            s.zcopy_mbs.push(c.0);
        }
    }
    drop(zpub);
    drop(zcopy);
    let _ = session.close().wait();
    Ok(Results {
        sizes: plan.sizes.clone(),
        series,
        idle_subscribers,
    })
}
