//! The two processes of `ferry-bench handover`: a sender and a receiver, each pinned,
//! each holding all the systems at once (the three floors, ferry and iceoryx2), so that
//! the rounds interleave them.
//!
//! For every message, whatever the system, the two follow one protocol:
//!
//! 1. The sender takes a buffer (ferry: an fbuf from the size's path; iceoryx2: a loaned
//!    slice; the page-writes floor: a private anonymous mapping of the fbuf's size; the
//!    one- and two-line floors: none) and writes one byte in every page of it.
//! 2. It reads `CLOCK_MONOTONIC` (`t0`), writes the header (sequence number and `t0`),
//!    and hands the buffer over (ferry: `Loan::send` of the fbuf loaned to the sender
//!    before step 1's writes, as iceoryx2 loans its slice, and written through
//!    `Loan::as_mut_slice`, the run found at the loan; iceoryx2: `send`; the
//!    floor: a release store of the sequence number into one shared cache line; the
//!    two-line and page-writes floors: the stamp and sequence number into a "header"
//!    line, then a release store of the sequence number into the "descriptor" line). It
//!    records how long the send call took.
//! 3. The receiver, busy-polling, takes the message, reads the header, reads the clock
//!    (`t1`) and records `t1 - t0`, the one-way hand-over. It drops the message and
//!    acknowledges by storing the sequence number into another shared cache line.
//! 4. The sender waits for that acknowledgement before the next message, so messages
//!    never queue. For the floors it records the round trip instead (`t0` to the
//!    acknowledgement seen): half of it is the floor.
//!
//! The page-writes floor ([`System::FloorPages`]) is the two-line floor after the same
//! page writes as the systems: under x86 TSO the descriptor store cannot become visible
//! before those stores (each a cache or TLB miss at 16 MiB and more), so it shows what
//! the protocol's page writes alone add to a hand-over.
//!
//! Samples carry the round and the system in `trial` (see [`tag`]).

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ferry::{Domain, IoData, IoDataMut, PathAllocator, PathConfig, Receiver, Sender};

use super::ice;
use super::stamp::{read_header, settle, write_header};
use crate::protocol::{Plan, Role, Sample, SampleKind, WorkerArgs};
use crate::sys::{self, now_ns, PrivateBuf, SharedLines};
use crate::transport::ferry::{accept, connect, err};

/// The systems, in the order of their index in [`tag`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// One cache line bounced between the two processes.
    Floor,
    /// Two lines, the second found through the first: the sender writes the "header"
    /// line, then the "descriptor" line (sequence number and where the header line is),
    /// which the receiver polls; the receiver then reads the header line at the place
    /// the descriptor names. Two transfers one after the other, as in any hand-over of a
    /// descriptor whose receiver reads the payload's header: the least it can cost. The
    /// header line is taken back from the receiver before the stamp ([`own_head`]), as a
    /// sender can do ahead of time (ferry's loan does).
    /// (Read from a fixed place instead, the header line's load starts while the
    /// descriptor line is still on its way and the two transfers overlap: about the
    /// one-line floor, which no descriptor hand-over can reach.)
    Floor2,
    /// The two-line floor preceded by the protocol's page writes (one byte in every page
    /// of a private buffer of the fbuf's size), as the systems do before their stamp.
    FloorPages,
    Ferry,
    Iceoryx2,
}

pub const SYSTEMS: [System; 5] = [
    System::Floor,
    System::Floor2,
    System::FloorPages,
    System::Ferry,
    System::Iceoryx2,
];

impl System {
    pub fn index(self) -> u32 {
        SYSTEMS.iter().position(|&s| s == self).expect("listed") as u32
    }
}

/// The `trial` field of a sample: round and system together.
pub fn tag(round: u32, system: System) -> u32 {
    round * SYSTEMS.len() as u32 + system.index()
}

/// The inverse of [`tag`].
pub fn untag(trial: u32) -> (u32, System) {
    let n = SYSTEMS.len() as u32;
    (trial / n, SYSTEMS[(trial % n) as usize])
}

/// Lines of the shared memfd: the floor's ping (sequence, stamp), the acknowledgement,
/// the start-up handshake, and the header line (sequence, stamp) of the two-line and
/// page-writes floors.
pub const LINES: usize = 4;
const PING: usize = 0;
const ACK: usize = 1;
const CTL: usize = 2;
const HEAD: usize = 3;
/// Words of the control line: each side's "ready" mark, and "failed" set by either.
const RX_READY: usize = 0;
const TX_READY: usize = 1;
const FAILED: usize = 2;

/// How long a spinning wait goes on before it gives up on the peer.
const PATIENCE: Duration = Duration::from_secs(30);

/// The systems in the order round `round` runs them: rotated every round, so that no
/// system always runs right after another.
pub fn order(round: u32, with_ice: bool) -> Vec<System> {
    let all: Vec<System> = SYSTEMS
        .iter()
        .copied()
        .filter(|&s| with_ice || s != System::Iceoryx2)
        .collect();
    let k = round as usize % all.len();
    all[k..].iter().chain(&all[..k]).copied().collect()
}

/// The worker's command line: `--ack FD,SERVICE` (the shared memfd, and the iceoryx2
/// service name or `-` for none); `--tx` / `--rx` the ferry link.
struct Spec {
    lines: SharedLines,
    service: Option<String>,
}

fn parse(args: &WorkerArgs) -> Result<Spec> {
    let ack = args
        .ack
        .as_deref()
        .context("--ack FD,SERVICE is required")?;
    let (fd, service) = ack.split_once(',').context("--ack is FD,SERVICE")?;
    let fd = sys::inherited_fd(fd.parse().context("--ack fd")?)?;
    let lines = SharedLines::map(&fd, LINES)?;
    let service = (service != "-").then(|| service.to_string());
    Ok(Spec { lines, service })
}

/// Spins until `done()` or the peer fails or stays silent for [`PATIENCE`].
fn spin_until(
    lines: &SharedLines,
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let mut n = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        if done()? {
            return Ok(());
        }
        n = n.wrapping_add(1);
        if n % 4096 == 0 {
            use std::sync::atomic::Ordering::Relaxed;
            if lines.word(CTL, FAILED).load(Relaxed) != 0 {
                bail!("the peer worker failed while we waited for {what}");
            }
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > PATIENCE {
                bail!("waited {PATIENCE:?} for {what}");
            }
        }
        spin_loop();
    }
}

pub fn run(args: &WorkerArgs, plan: &Plan) -> Result<Vec<Sample>> {
    let spec = parse(args)?;
    let out = match args.role {
        Role::HandoverSend => send(args, plan, &spec),
        Role::HandoverRecv => recv(args, plan, &spec),
        r => bail!("{r:?} is not a handover role"),
    };
    if out.is_err() {
        spec.lines
            .word(CTL, FAILED)
            .store(1, std::sync::atomic::Ordering::Release);
    }
    out
}

/// Writes one byte in every page of `s` (the payload "touched" before the send).
pub fn touch_pages(s: &mut [u8], v: u8) {
    for i in (0..s.len()).step_by(4096) {
        s[i] = v;
    }
}

/// The environment variable that makes ferry's sender use the plain `try_send` (no
/// loan before the payload writes): a diagnostic, to compare the two.
pub const TRY_SEND_VAR: &str = "FERRY_HANDOVER_TRY_SEND";

/// True when [`TRY_SEND_VAR`] is set (read once).
pub fn plain_try_send() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(TRY_SEND_VAR).is_some())
}

/// The environment variable naming a file to which both workers append, for every block,
/// the minor page faults their timed messages took (a diagnostic for the tail at large
/// sizes; counted per block, outside the messages, so as not to disturb them).
pub const FAULTS_VAR: &str = "FERRY_HANDOVER_FAULTS";

/// Involuntary context switches of this process so far (`/proc/self/status`).
fn involuntary_switches() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The file [`FAULTS_VAR`] names, if set (read once).
pub fn fault_log() -> Option<&'static std::path::Path> {
    static ON: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    ON.get_or_init(|| std::env::var_os(FAULTS_VAR).map(Into::into))
        .as_deref()
}

/// Fbuf paths of the sender, one per size, each with room for a few fbufs.
struct FerryTx {
    domain: Domain,
    tx: Sender,
    paths: Vec<(usize, PathAllocator)>,
}

impl FerryTx {
    fn path(&mut self, size: usize) -> Result<&PathAllocator> {
        if let Some(i) = self.paths.iter().position(|(s, _)| *s == size) {
            return Ok(&self.paths[i].1);
        }
        let fbuf = fbuf_len(size);
        let path = self
            .domain
            .path(PathConfig {
                quota: 4 * fbuf,
                secure: false,
                ..PathConfig::default()
            })
            .map_err(err)?;
        self.paths.push((size, path));
        Ok(&self.paths.last().expect("just pushed").1)
    }

    /// Steps 1 and 2 of the protocol; returns (t0, send call ns).
    fn send(&mut self, size: usize, seq: u64) -> Result<(u64, u64)> {
        let path = self.path(size)?.clone();
        let alloc = || -> Result<IoDataMut> {
            loop {
                match path.alloc(size) {
                    Ok(m) => return Ok(m),
                    // The receiver has not released yet: it does so before acknowledging,
                    // so this is rare (a release still on its way).
                    Err(ferry::Error::QuotaExceeded { .. }) => spin_loop(),
                    Err(e) => return Err(err(e).into()),
                }
            }
        };
        if plain_try_send() {
            let mut m = alloc()?;
            let t0 = fill(&mut m, seq)?;
            let d: IoData = m.freeze();
            loop {
                match self.tx.try_send(&d) {
                    Ok(()) => break,
                    Err(ferry::Error::Full) => spin_loop(),
                    Err(e) => return Err(err(e).into()),
                }
            }
            return Ok((t0, now_ns() - t0));
        }
        // Loaned before the payload is written (as iceoryx2 loans its sample): the ring
        // place and the descriptor are ready, and the send stores and publishes it.
        let mut loan = loop {
            match self.tx.loan(alloc()?) {
                Ok(l) => break l,
                Err(ferry::Error::Full) => spin_loop(),
                Err(e) => return Err(err(e).into()),
            }
        };
        // Written through the run found at the loan (iceoryx2's loaned slice too is
        // one run the sample knows).
        let t0 = fill_run(
            loan.as_mut_slice()
                .context("an fbuf from a path is one run")?,
            seq,
        );
        loan.send().map_err(err)?;
        Ok((t0, now_ns() - t0))
    }
}

/// Steps 1 and 2 up to the hand-over: one byte in every page, the stamp, the header.
/// Returns the stamp.
fn fill(m: &mut IoDataMut, seq: u64) -> Result<u64> {
    for s in m.fragments_mut() {
        touch_pages(s, seq as u8);
    }
    settle();
    let t0 = now_ns();
    let first = m.fragments_mut().next().context("a non-empty fbuf")?;
    write_header(first, seq, t0);
    Ok(t0)
}

/// [`fill`] for a message that is one run of bytes.
fn fill_run(s: &mut [u8], seq: u64) -> u64 {
    touch_pages(s, seq as u8);
    settle();
    let t0 = now_ns();
    write_header(s, seq, t0);
    t0
}

/// The size of ferry's fbuf for a `size`-byte message here: whole pages, a power of two.
fn fbuf_len(size: usize) -> usize {
    size.max(1).div_ceil(4096).next_power_of_two() * 4096
}

/// The page-writes floor's buffers, one per size: private anonymous mappings of the
/// size ferry's fbuf has, allocated at first use and pre-faulted.
#[derive(Default)]
struct FloorPagesTx {
    bufs: Vec<(usize, PrivateBuf)>,
}

impl FloorPagesTx {
    fn buf(&mut self, size: usize) -> Result<&mut [u8]> {
        let i = match self.bufs.iter().position(|(s, _)| *s == size) {
            Some(i) => i,
            None => {
                let len = fbuf_len(size);
                let b = PrivateBuf::new(len).context("the page-writes floor's buffer")?;
                self.bufs.push((size, b));
                self.bufs.len() - 1
            }
        };
        Ok(&mut self.bufs[i].1.as_mut_slice()[..size])
    }
}

/// Takes the header line back from the receiver (which read it last time) before the
/// hand-over, and waits until it is here: a store, then a fence. A sender can do that
/// ahead of its stamp (ferry's loan asks for its message's first line with `prefetchw`),
/// so the two-line floors leave it out, and stay floors. A word the receiver never reads.
fn own_head(l: &SharedLines) {
    use std::sync::atomic::{
        fence,
        Ordering::{Relaxed, SeqCst},
    };
    l.word(HEAD, 3).store(0, Relaxed);
    fence(SeqCst);
}

/// The sender's side of the two-line floors: stamps, writes the header line, then the
/// descriptor line naming it. Returns the stamp.
fn two_lines(l: &SharedLines, seq: u64) -> u64 {
    use std::sync::atomic::Ordering::{Relaxed, Release};
    let t0 = now_ns();
    l.word(HEAD, 1).store(t0, Relaxed);
    l.word(HEAD, 0).store(seq, Relaxed);
    l.word(PING, 2).store(HEAD as u64, Relaxed);
    // SYNC: pairs with the receiver's Acquire load of the ping, which makes the header
    // line's words and the descriptor's pointer to them visible.
    l.word(PING, 0).store(seq, Release);
    t0
}

/// One block of the schedule: `warm` untimed messages, then `timed` timed ones, of one
/// system at one size in one round. Both workers walk the same blocks in the same order.
struct Block {
    round: u32,
    size: usize,
    sys: System,
    warm: u32,
    timed: u32,
}

fn blocks(plan: &Plan, with_ice: bool) -> Vec<Block> {
    let mut out = Vec::new();
    for round in 0..plan.trials {
        for (i, &size) in plan.sizes.iter().enumerate() {
            for sys in order(round, with_ice) {
                out.push(Block {
                    round,
                    size,
                    sys,
                    warm: plan.warmup[i],
                    timed: plan.msgs[i],
                });
            }
        }
    }
    out
}

/// Says this worker is ready (word `mine` of the control line) and waits for the other.
fn meet(l: &SharedLines, mine: usize, theirs: usize) -> Result<()> {
    use std::sync::atomic::Ordering::{Acquire, Release};
    // SYNC: pairs with the other worker's Acquire load of its word `theirs`.
    l.word(CTL, mine).store(1, Release);
    spin_until(l, "the other worker to start", || {
        Ok(l.word(CTL, theirs).load(Acquire) != 0)
    })
}

/// Runs every block, calling `one(block, seq)` for each message; it returns the value to
/// record (kept for timed messages only). Returns one sample of `kind(system)` per block.
fn run_blocks(
    plan: &Plan,
    with_ice: bool,
    kind: impl Fn(System) -> SampleKind,
    mut one: impl FnMut(&Block, u64) -> Result<u64>,
) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    let mut seq = 0u64;
    for b in blocks(plan, with_ice) {
        let mut ns = Vec::with_capacity(b.timed as usize);
        let (mut f0, mut c0) = (0, 0);
        for k in 0..b.warm + b.timed {
            if k == b.warm && fault_log().is_some() {
                f0 = crate::harness::probe::minor_faults();
                c0 = involuntary_switches();
            }
            seq += 1;
            let v = one(&b, seq)?;
            if k >= b.warm {
                ns.push(v);
            }
        }
        if let Some(path) = fault_log() {
            use std::io::Write as _;
            let f = crate::harness::probe::minor_faults() - f0;
            let c = involuntary_switches() - c0;
            // Values over 5 µs: outliers of a hand-over (the receiver's one-way) or of a
            // send call (the sender's).
            let slow = ns.iter().filter(|&&v| v > 5_000).count();
            let max = ns.iter().max().copied().unwrap_or(0);
            let line = format!(
                "pid {} {:?} {} bytes round {}: {f} faults, {c} preemptions, {slow} over 5 us \
                 (max {max} ns) in {} timed messages\n",
                std::process::id(),
                b.sys,
                b.size,
                b.round,
                b.timed
            );
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut file| file.write_all(line.as_bytes()))
                .context("writing the fault log")?;
        }
        out.push(Sample {
            kind: kind(b.sys),
            size: b.size,
            trial: tag(b.round, b.sys),
            bytes: 0,
            ns,
            syscalls: None,
        });
    }
    Ok(out)
}

fn send(args: &WorkerArgs, plan: &Plan, spec: &Spec) -> Result<Vec<Sample>> {
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    let l = &spec.lines;
    let (domain, tx, _) = connect(args.tx.as_deref().context("--tx is required")?)?;
    let mut ferry = FerryTx {
        domain,
        tx,
        paths: Vec::new(),
    };
    let mut ice = match &spec.service {
        Some(name) => Some(ice::Tx::open(
            name,
            *plan.sizes.iter().max().unwrap_or(&64),
        )?),
        None => None,
    };
    let mut pages = FloorPagesTx::default();
    meet(l, TX_READY, RX_READY)?;
    let kind = |sys| match sys {
        System::Floor | System::Floor2 | System::FloorPages => SampleKind::RoundTrip,
        _ => SampleKind::SendCall,
    };
    let with_ice = ice.is_some();
    let samples = run_blocks(plan, with_ice, kind, |b, seq| {
        let (t0, call) = match b.sys {
            System::Floor => {
                let t0 = now_ns();
                l.word(PING, 1).store(t0, Relaxed);
                // SYNC: pairs with the receiver's Acquire load of the ping.
                l.word(PING, 0).store(seq, Release);
                (t0, 0)
            }
            System::Floor2 => {
                own_head(l);
                (two_lines(l, seq), 0)
            }
            System::FloorPages => {
                // Before the page writes, so that the fence does not drain them.
                own_head(l);
                touch_pages(pages.buf(b.size)?, seq as u8);
                settle();
                // Under TSO the two lines' stores come after the page writes: the cost
                // this floor shows.
                (two_lines(l, seq), 0)
            }
            System::Ferry => ferry.send(b.size, seq)?,
            System::Iceoryx2 => ice
                .as_mut()
                .expect("only scheduled when open")
                .send(b.size, seq)?,
        };
        spin_until(l, "an acknowledgement", || {
            Ok(l.word(ACK, 0).load(Acquire) == seq)
        })?;
        let rtt = now_ns() - t0;
        Ok(match b.sys {
            System::Floor | System::Floor2 | System::FloorPages => rtt,
            _ => call,
        })
    })?;
    let stats = ferry.tx.stats();
    if stats.copied_bytes != 0 {
        bail!(
            "ferry copied {} bytes: the zero-copy path fell back",
            stats.copied_bytes
        );
    }
    Ok(samples)
}

fn recv(args: &WorkerArgs, plan: &Plan, spec: &Spec) -> Result<Vec<Sample>> {
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    let l = &spec.lines;
    let (_domain, mut rx) = accept(args.rx.as_deref().context("--rx is required")?)?;
    let ice = match &spec.service {
        Some(name) => Some(ice::Rx::open(name)?),
        None => None,
    };
    meet(l, RX_READY, TX_READY)?;
    let ping = |seq: u64| {
        spin_until(l, "the floor's ping", || {
            Ok(l.word(PING, 0).load(Acquire) == seq)
        })
    };
    run_blocks(
        plan,
        ice.is_some(),
        |_| SampleKind::OneWay,
        |b, seq| {
            let (got, t0, t1) = match b.sys {
                System::Floor => {
                    ping(seq)?;
                    let t0 = l.word(PING, 1).load(Relaxed);
                    (seq, t0, now_ns())
                }
                System::Floor2 | System::FloorPages => {
                    ping(seq)?;
                    // Where the header line is, read from the descriptor line: the
                    // header's load cannot start before the descriptor arrived.
                    let at = l.word(PING, 2).load(Relaxed) as usize;
                    let got = l.word(at, 0).load(Relaxed);
                    let t0 = l.word(at, 1).load(Relaxed);
                    (got, t0, now_ns())
                }
                System::Ferry => recv_ferry(l, &mut rx, b.size)?,
                System::Iceoryx2 => ice
                    .as_ref()
                    .expect("only scheduled when open")
                    .recv(b.size, &mut || spin_check(l))?,
            };
            if got != seq {
                bail!("{:?}: expected message {seq}, got {got}", b.sys);
            }
            // SYNC: pairs with the sender's Acquire load of the acknowledgement; the message
            // was dropped (released) before this store.
            l.word(ACK, 0).store(seq, Release);
            Ok(t1.saturating_sub(t0))
        },
    )
}

/// Called now and then while busy-polling: fails if the sender failed.
fn spin_check(l: &SharedLines) -> Result<()> {
    if l.word(CTL, FAILED)
        .load(std::sync::atomic::Ordering::Acquire)
        != 0
    {
        return Err(anyhow!("the sender failed"));
    }
    Ok(())
}

/// Step 3 for ferry: (sequence, t0, t1); the message is dropped (released) on return.
fn recv_ferry(l: &SharedLines, rx: &mut Receiver, size: usize) -> Result<(u64, u64, u64)> {
    let mut n = 0u32;
    let d = loop {
        if let Some(d) = rx.try_recv().map_err(err)? {
            break d;
        }
        n = n.wrapping_add(1);
        if n % 65536 == 0 {
            spin_check(l)?;
        }
        spin_loop();
    };
    let first = d.fragments().first().context("an empty message")?;
    let (seq, t0) = read_header(first.as_slice());
    let t1 = now_ns();
    if d.len() != size {
        bail!("expected {size} bytes, got {}", d.len());
    }
    Ok((seq, t0, t1))
}
