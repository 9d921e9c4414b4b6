//! Torture test: real processes killed or stopped at random points, a hostile group member,
//! and leak checks afterwards, written against ferry's public API only.
//!
//! One binary with its own harness (`harness = false`): it re-executes itself in a child
//! role named by `FERRY_TEST_ROLE`, children talk to the harness in lines over their stdin
//! and stdout, and every trial is reproducible from its seed (the timing is not).
//!
//! Sections (each trial picks one from its seed):
//!
//! * **chain** (most trials): `source -> stage -> sink`, three processes of one fresh group.
//!   The source sends fbufs of 1 B .. 4 MiB in 1..8 fragments (several fbufs, sliced, with
//!   gaps), each after a 32-byte header fragment with a sequence number and a hash of the
//!   payload, under a random path quota and random ring sizes (release rings down to 2). The
//!   stage forwards the received `IoData` as is (no copy), sometimes batching a few, in
//!   blocking, polling or timed receives. The sink checks every byte and the hash, holds
//!   some messages for a while and some until the end, and checks them again byte by byte
//!   after the source has re-allocated and scribbled over everything it could get. The
//!   harness SIGKILLs one member (early, mid-stream, or while the sink holds messages),
//!   or SIGSTOPs one for a while, and sometimes adds a hostile member that pushes garbage
//!   descriptors (`ferry::testing::push_raw`) at the stage or the sink, or that puts a FIFO, a
//!   socket, a directory, /dev/zero or an unsealed memfd it keeps resizing behind its lot
//!   descriptor and offers a channel: the target must refuse it, naming the member,
//!   without waiting on it.
//! * **containers**: source ships containers to a stage over a Unix socket, the stage to a
//!   sink; the stage is killed while it holds (maps) containers and while shipped ones wait
//!   unreceived in its socket.
//! * **uring**: a process with io_uring reads, receives, writes and sends in flight (on
//!   FIFOs and TCP) is killed, or drops its ring; its peer, waiting on its own ring, must
//!   see its operations complete.
//!
//! What counts as a failure:
//!
//! * TORN: a payload byte, hash, header or sequence number at the sink is not what the
//!   source sent (also after a hold), or a message went missing without a cause.
//! * HANG: a survivor does not end its stream within `FERRY_TORTURE_HANG_SECS` (5 s) of a
//!   death, a stream makes no progress for that long, a child misses its own deadline.
//! * CRASH: a child dies of a signal nobody sent it, panics or aborts.
//! * LEAK: after a survivor has dropped everything, its descriptor count, memfd count or
//!   ferry mappings differ from before it started; a dead peer's lot is still mapped after
//!   the channels and data that used it are gone; the source's path has bytes outstanding
//!   once everything came back; `/dev/shm/ferry.<group>` outlives every member.
//! * ERROR: an error from ferry that the situation does not explain.
//!
//! ```text
//! cargo test --release -p ferry --test torture                       # CI: about 60 s of trials
//! FERRY_TORTURE_TRIALS=1000 FERRY_TORTURE_SECS=100000 \
//!     cargo test --release -p ferry --test torture                   # the long run
//! FERRY_TEST_SEED=<trial seed> FERRY_TORTURE_TRIALS=1 \
//!     cargo test --release -p ferry --test torture                   # rerun one trial
//! cargo test --release -p ferry --test torture -- chain              # one section
//! ```

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ferry::containers::Container;
use ferry::testing::MAX_SLOTS;
use ferry::testing::{RawDesc, RawFrag, RawRef};
use ferry::uring::{Features, RingConfig, Uring};
use ferry::{
    ChannelConfig, Domain, DomainId, Error, Group, IoData, IoDataMut, PathAllocator, PathConfig,
    Receiver, Sender,
};

// ------------------------------------------------------------------------------ settings

/// How long a survivor may take to notice a death (or a stream may go without progress)
/// before it is a HANG. Generous on purpose: the machine is shared and has two cores.
fn hang_limit() -> Duration {
    Duration::from_secs_f64(env_f64("FERRY_TORTURE_HANG_SECS", 5.0))
}

/// Start-up (spawn, join, connect) of a trial's processes.
const SETUP: Duration = Duration::from_secs(15);
/// A child kills itself after this long, whatever it is doing.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);
/// The harness gives up on a trial after this long.
const TRIAL_CAP: Duration = Duration::from_secs(90);

/// Header fragment of a chain message: magic, sequence number, payload length, hash.
const HEADER: usize = 32;
const MAGIC: &[u8; 8] = b"FRYTORT1";
const MAX_MSG: u64 = 4 << 20;

/// Exit codes of children.
const EXIT_ERROR: i32 = 3;
const EXIT_ORPHAN: i32 = 4;
const EXIT_DEADLINE: i32 = 98;

fn env_f64(key: &str, default: f64) -> f64 {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// ------------------------------------------------------------------------ randomness

/// splitmix64: a good 64-bit mixer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    /// Roughly log-uniform in `lo..=hi` (`1 <= lo <= hi < 2^62`).
    fn log_range(&mut self, lo: u64, hi: u64) -> u64 {
        let lo_e = 63 - lo.max(1).leading_zeros() as u64;
        let hi_e = 63 - hi.leading_zeros() as u64;
        let e = self.range(lo_e, hi_e);
        let a = (1u64 << e).max(lo);
        let b = ((1u64 << (e + 1)) - 1).min(hi).max(a);
        self.range(a, b)
    }
    /// A non-empty random subset of the letters of `all`.
    fn subset(&mut self, all: &str) -> String {
        loop {
            let s: String = all.chars().filter(|_| self.pct(50)).collect();
            if !s.is_empty() {
                return s;
            }
        }
    }
    fn letter(&mut self, letters: &str) -> u8 {
        let b = letters.as_bytes();
        b[self.below(b.len() as u64) as usize]
    }
}

// ------------------------------------------------------------------- payload checks

/// Word `j` of the pattern of message (or pallet) `key`.
fn pattern_word(key: u64, j: u64) -> u64 {
    mix(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ j)
}

/// Writes bytes `off..off + out.len()` of the pattern of `key` into `out`.
fn fill_pattern(key: u64, off: usize, out: &mut [u8]) {
    let mut i = 0;
    while i < out.len() {
        let g = off + i;
        let w = pattern_word(key, (g / 8) as u64).to_le_bytes();
        let s = g % 8;
        let n = (8 - s).min(out.len() - i);
        out[i..i + n].copy_from_slice(&w[s..s + n]);
        i += n;
    }
}

/// Compares `got` with bytes `off..` of the pattern of `key`; returns the first
/// difference as (offset, got, want).
fn compare_pattern(key: u64, off: usize, got: &[u8]) -> Option<(usize, u8, u8)> {
    let mut scratch = [0u8; 4096];
    let mut at = 0;
    while at < got.len() {
        let n = (got.len() - at).min(scratch.len());
        fill_pattern(key, off + at, &mut scratch[..n]);
        let g = &got[at..at + n];
        if g != &scratch[..n] {
            let k = (0..n).find(|&k| g[k] != scratch[k]).unwrap_or(0);
            return Some((off + at + k, g[k], scratch[k]));
        }
        at += n;
    }
    None
}

/// A 64-bit hash over a byte stream, independent of how the stream is cut into chunks:
/// FNV-1a over little-endian 64-bit words, folded, with the length mixed in at the end.
struct Hasher {
    h: u64,
    carry: [u8; 8],
    n: usize,
    total: u64,
}

impl Hasher {
    fn new() -> Hasher {
        Hasher {
            h: 0xcbf2_9ce4_8422_2325,
            carry: [0; 8],
            n: 0,
            total: 0,
        }
    }
    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0x100_0000_01b3);
        self.h ^= self.h >> 29;
    }
    fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.n > 0 {
            let k = (8 - self.n).min(data.len());
            self.carry[self.n..self.n + k].copy_from_slice(&data[..k]);
            self.n += k;
            data = &data[k..];
            if self.n < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.carry));
            self.n = 0;
        }
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.n = rest.len();
    }
    fn finish(mut self) -> u64 {
        if self.n > 0 {
            self.carry[self.n..].fill(0);
            self.word(u64::from_le_bytes(self.carry));
        }
        let t = self.total;
        self.word(t);
        mix(self.h)
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks a chain message: header, every payload byte against its pattern, and the hash.
/// Returns the sequence number.
fn check_message(d: &IoData) -> Result<u64, String> {
    if d.len() < HEADER {
        return Err(format!(
            "message of {} bytes is shorter than its header",
            d.len()
        ));
    }
    let mut h = [0u8; HEADER];
    d.copy_range_to_slice(0..HEADER, &mut h);
    if &h[..8] != MAGIC {
        return Err(format!("header magic is {:02x?}", &h[..8]));
    }
    let (seq, len, hash) = (u64_at(&h, 8), u64_at(&h, 16), u64_at(&h, 24));
    if len as usize != d.len() - HEADER {
        return Err(format!(
            "message {seq}: header says {len} payload bytes, the message has {}",
            d.len() - HEADER
        ));
    }
    let mut hasher = Hasher::new();
    let mut pos = 0usize;
    for chunk in d.chunks() {
        let mut c = chunk;
        if pos < HEADER {
            let skip = (HEADER - pos).min(c.len());
            pos += skip;
            c = &c[skip..];
        }
        if let Some((off, got, want)) = compare_pattern(seq, pos - HEADER, c) {
            return Err(format!(
                "message {seq}: payload byte {off} of {len} is {got:#04x}, want {want:#04x} \
                 ({} fragments)",
                d.num_fragments()
            ));
        }
        hasher.update(c);
        pos += c.len();
    }
    let got = hasher.finish();
    if got != hash {
        return Err(format!(
            "message {seq}: payload hash {got:#018x}, header says {hash:#018x}"
        ));
    }
    Ok(seq)
}

/// Bytes a path accounts for an fbuf of `n` bytes: a power-of-two number of pages.
fn class_size(n: usize) -> usize {
    let p = rustix::param::page_size();
    p * n.div_ceil(p).max(1).next_power_of_two()
}

/// An upper bound of what a received message holds of its source's quota.
fn est_held(d: &IoData) -> usize {
    d.fragments()
        .iter()
        .map(|f| class_size(f.len() + 128))
        .sum()
}

// ----------------------------------------------------------------- process introspection

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn memfd_count() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| t.to_string_lossy().starts_with("/memfd:"))
                .unwrap_or(false)
        })
        .count()
}

/// Mappings of this process: (start, end, the rest of the line).
fn maps() -> Vec<(usize, usize, String)> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
                rest.to_owned(),
            ))
        })
        .collect()
}

/// Mappings that overlap `lo..hi`.
fn maps_in(lo: usize, hi: usize) -> usize {
    maps().iter().filter(|(a, b, _)| *a < hi && *b > lo).count()
}

fn pallet_maps() -> usize {
    maps()
        .iter()
        .filter(|(_, _, r)| r.contains("memfd:ferry-pallet"))
        .count()
}

/// Where each thread of `pid` is blocked, for HANG reports.
fn where_is(pid: u32) -> String {
    let name = |nr: &str| {
        match nr {
            "0" => "read",
            "7" => "poll",
            "35" => "nanosleep",
            "47" => "recvmsg",
            "61" => "wait4",
            "202" => "futex",
            "230" => "clock_nanosleep",
            "271" => "ppoll",
            "288" => "accept4",
            "426" => "io_uring_enter",
            "running" => "running",
            _ => "",
        }
        .to_owned()
    };
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "gone".into();
    };
    let mut out = Vec::new();
    for t in dir.flatten() {
        let tid = t.file_name().to_string_lossy().into_owned();
        let base = format!("/proc/{pid}/task/{tid}");
        let stat = std::fs::read_to_string(format!("{base}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("?")
            .to_owned();
        let wchan = std::fs::read_to_string(format!("{base}/wchan")).unwrap_or_default();
        let sys = std::fs::read_to_string(format!("{base}/syscall")).unwrap_or_default();
        let nr = sys.split_whitespace().next().unwrap_or("?").to_owned();
        let n = name(&nr);
        out.push(format!(
            "{tid}:{state}:{}:{}",
            if wchan.is_empty() { "-" } else { &wchan },
            if n.is_empty() { format!("sys{nr}") } else { n }
        ));
    }
    out.join(" ")
}

// ------------------------------------------------------------------------ child side

/// Prints one protocol line to the harness (stdout is line-buffered).
fn say(line: &str) {
    println!("{line}");
}

/// Reports an error the harness counts as ERROR, and exits.
fn die(msg: impl std::fmt::Display) -> ! {
    say(&format!("error {msg}"));
    std::process::exit(EXIT_ERROR)
}

/// A child's view of its trial: parameters, commands from the harness, a random stream,
/// and the descriptor counts it started with.
struct Ctx {
    role: String,
    params: Vec<(String, String)>,
    cmds: mpsc::Receiver<String>,
    rng: Rng,
    fds0: usize,
    memfds0: usize,
}

impl Ctx {
    fn start(role: &str) -> Ctx {
        let fds0 = fd_count();
        let memfds0 = memfd_count();
        // A panic on any thread (a receiving thread too) ends the whole process, the way
        // it would be noticed in a real program: the harness counts exit code 101.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default_hook(info);
            // SAFETY: _exit(2) ends the process at once; it has no preconditions.
            unsafe { libc::_exit(101) }
        }));
        std::thread::spawn(|| {
            std::thread::sleep(CHILD_DEADLINE);
            eprintln!("torture child: my own deadline of {CHILD_DEADLINE:?} passed");
            // SAFETY: _exit(2) ends the process at once; it has no preconditions.
            unsafe { libc::_exit(EXIT_DEADLINE) }
        });
        let (tx, cmds) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim().to_owned()).is_err() {
                    return;
                }
            }
            let _ = tx.send("eof".to_owned());
        });
        let p = std::env::var("FERRY_TORTURE_P").unwrap_or_default();
        let params: Vec<(String, String)> = p
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let seed: u64 = params
            .iter()
            .find(|(k, _)| k == "seed")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(1);
        let salt = role.bytes().fold(0u64, |h, b| mix(h ^ b as u64));
        Ctx {
            role: role.to_owned(),
            params,
            cmds,
            rng: Rng::new(seed ^ salt),
            fds0,
            memfds0,
        }
    }

    fn p(&self, key: &str) -> &str {
        match self.params.iter().find(|(k, _)| k == key) {
            Some((_, v)) => v,
            None => die(format!("{}: parameter {key} missing", self.role)),
        }
    }

    fn n(&self, key: &str) -> u64 {
        self.p(key)
            .parse()
            .unwrap_or_else(|_| die(format!("{}: parameter {key} is not a number", self.role)))
    }

    fn check_eof(line: String) -> String {
        if line == "eof" {
            // The harness went away: nobody will ever finish this trial.
            std::process::exit(EXIT_ORPHAN);
        }
        line
    }

    /// The next command, if one comes within `timeout`.
    fn cmd(&self, timeout: Duration) -> Option<String> {
        self.cmds.recv_timeout(timeout).ok().map(Self::check_eof)
    }

    /// Waits for a command starting with `prefix` (the watchdog bounds the wait).
    fn wait(&self, prefix: &str) -> String {
        loop {
            let Ok(line) = self.cmds.recv() else {
                std::process::exit(EXIT_ORPHAN)
            };
            let line = Self::check_eof(line);
            if line.starts_with(prefix) {
                return line;
            }
        }
    }
}

/// Slots of the members that died, from a harness command such as `finish 1,3` or
/// `finish -`.
fn dead_slots(cmd: &str) -> Vec<u16> {
    cmd.split_whitespace()
        .nth(1)
        .unwrap_or("-")
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// What a chain role hands to the common end-of-trial checks.
#[derive(Default)]
struct Finish {
    dead: Vec<u16>,
    outstanding: usize,
    parked: usize,
    note: String,
}

/// The end of every chain child: with its domain still alive and everything else
/// dropped, is a dead peer's lot still mapped? Then, with the group gone too, are its
/// descriptors, memfds and ferry mappings back to what they were?
fn chain_report(ctx: &Ctx, group: Arc<Group>, domain: Domain, f: Finish) {
    let own = domain.id().slot;
    let dead_lots: usize = f
        .dead
        .iter()
        .filter(|&&s| s != own && (s as usize) < MAX_SLOTS)
        .map(|&s| {
            let r = group.slot_range(s);
            maps_in(r.start, r.end)
        })
        .sum();
    let all = group.lots_range();
    let (lo, hi) = (all.start, all.end);
    drop(domain);
    drop(group);
    say(&format!(
        "report fds={}/{} memfds={}/{} maps={} deadlot={dead_lots} outstanding={} parked={} {}",
        fd_count(),
        ctx.fds0,
        memfd_count(),
        ctx.memfds0,
        maps_in(lo, hi),
        f.outstanding,
        f.parked,
        f.note
    ));
}

#[derive(Clone, Copy, Debug)]
struct Member {
    id: DomainId,
    pid: u32,
}

struct Peers {
    source: Member,
    stage: Member,
    sink: Member,
    hostile: Option<Member>,
}

fn parse_peers(line: &str) -> Peers {
    let w: Vec<&str> = line.split_whitespace().skip(1).collect();
    let m = |i: usize| -> Option<Member> {
        Some(Member {
            id: w.get(2 * i)?.parse().ok()?,
            pid: w.get(2 * i + 1)?.parse().ok()?,
        })
    };
    let need = |i| m(i).unwrap_or_else(|| die(format!("bad peers line: {line}")));
    Peers {
        source: need(0),
        stage: need(1),
        sink: need(2),
        hostile: m(3),
    }
}

fn chain_child(role: &str) {
    let mut ctx = Ctx::start(role);
    let name = ctx.p("group").to_owned();
    let group = Group::open(&name).unwrap_or_else(|e| die(format!("{role}: open group: {e}")));
    let domain = group
        .join()
        .unwrap_or_else(|e| die(format!("{role}: join group: {e}")));
    say(&format!("id {} {}", domain.id(), std::process::id()));
    let peers = parse_peers(&ctx.wait("peers"));
    let f = match role {
        "source" => source(&mut ctx, &domain, &peers),
        "stage" => stage(&mut ctx, &domain, &peers),
        "sink" => sink(&mut ctx, &domain, &peers),
        _ => hostile(&mut ctx, &domain, &peers),
    };
    chain_report(&ctx, group, domain, f);
}

fn channel_config(ctx: &Ctx, which: &str) -> ChannelConfig {
    ChannelConfig {
        capacity: ctx.n(&format!("cap{which}")) as u32,
        release_capacity: ctx.n(&format!("rel{which}")) as u32,
        // Only the stage's channel to the sink is ever lossy (see `chain_plan`).
        lossy: which == "2" && ctx.n("lossy2") == 1,
    }
}

/// Sends with one of the three ways a sender has: `b` blocking, `t` polling `try_send`,
/// `o` `send_timeout` in a loop.
fn send_with(tx: &Sender, d: &IoData, mode: u8, rng: &mut Rng) -> ferry::Result<()> {
    match mode {
        b'b' => tx.send(d),
        b't' => loop {
            match tx.try_send(d) {
                Err(Error::Full) => std::thread::sleep(Duration::from_micros(100)),
                r => return r,
            }
        },
        _ => loop {
            let t = Duration::from_millis(1 + rng.below(10));
            match tx.send_timeout(d, t) {
                Err(Error::Timeout) => {}
                r => return r,
            }
        },
    }
}

/// Receives with `b` blocking `recv`, `t` `try_recv`, or `o` `recv_timeout`.
fn recv_with(rx: &mut Receiver, mode: u8, timeout: Duration) -> ferry::Result<Option<IoData>> {
    match mode {
        b'b' => rx.recv().map(Some),
        b't' => rx.try_recv(),
        _ => match rx.recv_timeout(timeout) {
            Err(Error::Timeout) => Ok(None),
            r => r.map(Some),
        },
    }
}

fn gone(e: &Error) -> bool {
    matches!(e, Error::PeerGone { .. } | Error::Disconnected)
}

// ---------------------------------------------------------------- chain: the source

/// One fbuf of a message: its allocation size, and the payload pieces it holds as
/// (offset in the fbuf, offset in the payload, length).
struct FbufPlan {
    size: usize,
    pieces: Vec<(usize, usize, usize)>,
}

struct MsgPlan {
    seq: u64,
    len: usize,
    fbufs: Vec<FbufPlan>,
}

impl MsgPlan {
    /// What the message costs the path's quota.
    fn est(&self) -> usize {
        self.fbufs.iter().map(|f| class_size(f.size)).sum::<usize>() + class_size(HEADER)
    }
}

/// Lays out a payload of `len` bytes in `frags` pieces over 1..=frags fbufs, with random
/// leading pads, gaps between pieces of one fbuf (so slices never coalesce) and tails.
fn layout(rng: &mut Rng, seq: u64, len: usize, frags: usize) -> MsgPlan {
    let frags = frags.min(len).max(1);
    let mut cuts: Vec<usize> = Vec::new();
    while cuts.len() + 1 < frags {
        let c = 1 + rng.below(len as u64 - 1) as usize;
        if !cuts.contains(&c) {
            cuts.push(c);
        }
    }
    cuts.sort_unstable();
    cuts.push(len);
    let mut pieces = Vec::new();
    let mut at = 0;
    for c in cuts {
        pieces.push((at, c - at));
        at = c;
    }
    let mut fbufs = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        let k = (1 + rng.below(3) as usize).min(pieces.len() - i);
        let mut off = rng.below(64) as usize;
        let mut fp = FbufPlan {
            size: 0,
            pieces: Vec::new(),
        };
        for (j, &(po, pl)) in pieces[i..i + k].iter().enumerate() {
            if j > 0 {
                off += 1 + rng.below(64) as usize;
            }
            fp.pieces.push((off, po, pl));
            off += pl;
        }
        fp.size = off + rng.below(64) as usize;
        fbufs.push(fp);
        i += k;
    }
    MsgPlan { seq, len, fbufs }
}

/// A message plan whose quota cost is at most `quota / 2`.
fn plan_message(rng: &mut Rng, seq: u64, quota: usize) -> MsgPlan {
    let frags = 1 + rng.below(8) as usize;
    let mut len = rng.log_range(1, MAX_MSG) as usize;
    loop {
        let p = layout(rng, seq, len, frags);
        if p.est() <= quota / 2 || len == 1 {
            return p;
        }
        len = (len / 2).max(1);
    }
}

/// Runs `f` over the bytes of a fresh fbuf (in place when it is one slice).
fn write_fbuf(m: &mut IoDataMut, f: impl FnOnce(&mut [u8])) {
    let n = m.len();
    {
        let mut it = m.fragments_mut();
        if let (Some(s), None) = (it.next(), it.next()) {
            if s.len() == n {
                f(s);
                return;
            }
        }
    }
    let mut v = vec![0u8; n];
    f(&mut v);
    m.fill_from(&v);
}

/// Allocates and fills a message: a header fbuf, then the payload pieces sliced out of
/// their fbufs. Pads and gaps hold junk, so an off-by-one in slicing shows.
fn build_message(path: &PathAllocator, plan: &MsgPlan) -> ferry::Result<IoData> {
    let mut hasher = Hasher::new();
    let mut parts = Vec::new();
    for fb in &plan.fbufs {
        let mut m = path.alloc(fb.size)?;
        write_fbuf(&mut m, |b| {
            b.fill(0x5a);
            for &(off, po, pl) in &fb.pieces {
                fill_pattern(plan.seq, po, &mut b[off..off + pl]);
                hasher.update(&b[off..off + pl]);
            }
        });
        let whole = m.freeze();
        for &(off, _, pl) in &fb.pieces {
            parts.push(whole.slice(off..off + pl));
        }
    }
    let mut h = path.alloc(HEADER)?;
    let mut hdr = [0u8; HEADER];
    hdr[..8].copy_from_slice(MAGIC);
    hdr[8..16].copy_from_slice(&plan.seq.to_le_bytes());
    hdr[16..24].copy_from_slice(&(plan.len as u64).to_le_bytes());
    hdr[24..32].copy_from_slice(&hasher.finish().to_le_bytes());
    h.write_at(0, &hdr);
    Ok(IoData::concat_all(std::iter::once(h.freeze()).chain(parts)))
}

/// Re-allocates fbufs of the sizes the source used lately, as many as the quota allows,
/// fills them with 0xee, and lets them go. Any span the source got back while a sink
/// still holds it is overwritten here.
fn scribble(path: &PathAllocator, sizes: &VecDeque<usize>) -> (usize, usize) {
    let mut held = Vec::new();
    let mut bytes = 0;
    for &s in sizes.iter().rev() {
        match path.alloc(s) {
            Ok(mut m) => {
                write_fbuf(&mut m, |b| b.fill(0xee));
                held.push(m.freeze());
                bytes += s;
            }
            Err(Error::QuotaExceeded { .. }) => {}
            Err(e) => die(format!("source: scribble alloc: {e}")),
        }
    }
    (held.len(), bytes)
}

fn source(ctx: &mut Ctx, domain: &Domain, peers: &Peers) -> Finish {
    let quota = ctx.n("quota") as usize;
    let tx = domain
        .connect_with(peers.stage.id, channel_config(ctx, "1"), SETUP)
        .unwrap_or_else(|e| die(format!("source: connect to stage: {e}")));
    let path = domain
        .path(PathConfig {
            quota,
            secure: ctx.n("secure") == 1,
            ..PathConfig::default()
        })
        .unwrap_or_else(|e| die(format!("source: path: {e}")));
    say("ready");
    ctx.wait("go");
    let n = ctx.n("n");
    let modes = ctx.p("smodes").to_owned();
    let probe = ctx.n("probe") == 1;
    let mut sizes: VecDeque<usize> = VecDeque::new();
    let mut kept: VecDeque<IoData> = VecDeque::new();
    let mut sent = 0u64;
    let mut reason = "done".to_owned();
    'stream: for seq in 0..n {
        let plan = plan_message(&mut ctx.rng, seq, quota);
        let t0 = Instant::now();
        let (mut last_probe, mut last_note) = (t0, t0);
        let msg = loop {
            match build_message(&path, &plan) {
                Ok(m) => break m,
                Err(Error::QuotaExceeded { outstanding, quota }) => {
                    // Our own references count against the quota too: let them go first.
                    if !kept.is_empty() {
                        kept.clear();
                        continue;
                    }
                    let now = Instant::now();
                    // A source whose stage died cannot count on its quota coming back: the
                    // sink may still hold what the stage forwarded, and those fbufs stay
                    // charged until it lets go (here, not before the end of the trial).
                    // `alloc` cannot say which channel is gone, so a stalled source asks
                    // its channel, as a real one would; `probe` makes it ask from the start.
                    let stalled = now - t0 >= Duration::from_millis(200);
                    if (probe || stalled) && now - last_probe >= Duration::from_millis(50) {
                        last_probe = now;
                        if let Err(e) = tx.check_peer() {
                            reason = format!("probe: {e}");
                            break 'stream;
                        }
                    }
                    if now - last_note >= Duration::from_secs(1) {
                        last_note = now;
                        say(&format!(
                            "stall source: quota full for {:.1} s (outstanding {outstanding} \
                             of {quota}, {} in flight, {} parked)",
                            (now - t0).as_secs_f64(),
                            tx.in_flight(),
                            domain.parked_senders()
                        ));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => die(format!("source: alloc for message {seq}: {e}")),
            }
        };
        for fb in &plan.fbufs {
            sizes.push_back(fb.size);
        }
        sizes.push_back(HEADER);
        while sizes.len() > 4096 {
            sizes.pop_front();
        }
        let mode = ctx.rng.letter(&modes);
        match send_with(&tx, &msg, mode, &mut ctx.rng) {
            Ok(()) => {}
            Err(e) if gone(&e) => {
                reason = format!("send: {e}");
                break;
            }
            Err(e) => die(format!("source: send message {seq}: {e}")),
        }
        sent += 1;
        say(&format!("sent {seq}"));
        // Sometimes the source keeps its own message a while (a second reference).
        if ctx.rng.pct(10) {
            kept.push_back(msg);
            if kept.len() > 3 {
                kept.pop_front();
            }
        }
    }
    drop(kept);
    drop(tx);
    say(&format!("eos sent={sent} ({reason})"));
    let fin = loop {
        let c = ctx.wait("");
        if c == "scribble" {
            let (k, bytes) = scribble(&path, &sizes);
            say(&format!("scribbled {k} fbufs, {bytes} bytes"));
        } else if c.starts_with("finish") {
            break c;
        }
    };
    // Everything must come back: releases, or reclaims from dead receivers.
    let t0 = Instant::now();
    while (path.outstanding() != 0 || domain.parked_senders() != 0) && t0.elapsed() < hang_limit() {
        domain.collect_releases();
        std::thread::sleep(Duration::from_millis(2));
    }
    let f = Finish {
        dead: dead_slots(&fin),
        outstanding: path.outstanding(),
        parked: domain.parked_senders(),
        note: String::new(),
    };
    drop(path);
    f
}

// ----------------------------------------------------------------- chain: the stage

/// Drains a channel from the hostile member on a thread of its own.
struct Drain {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl Drain {
    fn start(mut rx: Receiver, who: &'static str) -> Drain {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut bad, mut ok) = (0u64, 0u64);
            while !s.load(Ordering::Relaxed) {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(d) => {
                        ok += 1;
                        drop(d);
                    }
                    Err(Error::Timeout) => {}
                    Err(Error::BadDescriptor(_)) => bad += 1,
                    Err(e) if gone(&e) => break,
                    Err(e) => {
                        say(&format!("error {who}: on the hostile channel: {e}"));
                        break;
                    }
                }
            }
            (bad, ok)
        });
        Drain { stop, thread }
    }

    fn finish(self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok((bad, ok)) => format!("hostile: {bad} refused, {ok} accepted"),
            Err(_) => "hostile drain panicked".into(),
        }
    }
}

/// Accepts the channel from `from` (and one from the hostile member if it targets us).
/// A hostile member with a sabotaged lot (`hlot`) must be refused, with an error that
/// names it and what its lot descriptor is.
fn accept_chain(
    ctx: &Ctx,
    domain: &Domain,
    from: Member,
    hostile: bool,
    peers: &Peers,
) -> (Receiver, Option<Receiver>) {
    if hostile && ctx.p("hlot") != "none" {
        let main = domain
            .accept_from(from.id, SETUP)
            .unwrap_or_else(|e| die(format!("{}: accept: {e}", ctx.role)));
        let h = peers
            .hostile
            .unwrap_or_else(|| die(format!("{}: no hostile member listed", ctx.role)));
        match domain.accept_from(h.id, SETUP) {
            Ok(_) => die(format!(
                "{}: accepted a channel from a hostile member whose lot is {}",
                ctx.role,
                ctx.p("hlot")
            )),
            Err(e @ Error::BadDescriptor(_))
                if e.to_string()
                    .contains(&format!("peer {} (pid {})", h.id, h.pid))
                    && e.to_string().contains("lot descriptor") =>
            {
                say(&format!(
                    "note {}: refused the hostile member: {e}",
                    ctx.role
                ))
            }
            Err(e) => die(format!(
                "{}: the hostile member's lot ({}): unexpected error {e}",
                ctx.role,
                ctx.p("hlot")
            )),
        }
        return (main, None);
    }
    let (mut main, mut other) = (None, None);
    for _ in 0..1 + hostile as usize {
        let rx = domain
            .accept(SETUP)
            .unwrap_or_else(|e| die(format!("{}: accept: {e}", ctx.role)));
        if rx.peer_pid() == from.pid {
            main = Some(rx);
        } else {
            other = Some(rx);
        }
    }
    let main = main.unwrap_or_else(|| die(format!("{}: no channel from upstream", ctx.role)));
    (main, other)
}

/// Forwards a batch downstream; Err when downstream is gone.
fn flush(ctx: &mut Ctx, tx: &Sender, batch: &mut Vec<IoData>, fwd: &mut u64) -> Result<(), String> {
    let modes = ctx.p("tmodes").to_owned();
    for d in batch.drain(..) {
        let mode = ctx.rng.letter(&modes);
        match send_with(tx, &d, mode, &mut ctx.rng) {
            Ok(()) => *fwd += 1,
            Err(e) if gone(&e) => return Err(format!("send: {e}")),
            Err(e) => die(format!("stage: forward: {e}")),
        }
    }
    say(&format!("fwd {fwd}"));
    Ok(())
}

fn stage(ctx: &mut Ctx, domain: &Domain, peers: &Peers) -> Finish {
    let (mut rx, hrx) = accept_chain(
        ctx,
        domain,
        peers.source,
        ctx.p("hostile") == "stage",
        peers,
    );
    let tx = domain
        .connect_with(peers.sink.id, channel_config(ctx, "2"), SETUP)
        .unwrap_or_else(|e| die(format!("stage: connect to sink: {e}")));
    say("ready");
    let drain = hrx.map(|r| Drain::start(r, "stage"));
    let rmodes = ctx.p("rmodes").to_owned();
    let max_batch = ctx.n("batch");
    let mut batch = Vec::new();
    let mut target = ctx.rng.range(1, max_batch) as usize;
    let mut fwd = 0u64;
    let reason = loop {
        let mode = ctx.rng.letter(&rmodes);
        // Never sleep in a blocking receive while holding upstream's buffers.
        if mode == b'b' && !batch.is_empty() {
            if let Err(why) = flush(ctx, &tx, &mut batch, &mut fwd) {
                break why;
            }
        }
        let t = Duration::from_millis(1 + ctx.rng.below(20));
        match recv_with(&mut rx, mode, t) {
            Ok(Some(d)) => {
                batch.push(d);
                if batch.len() >= target {
                    target = ctx.rng.range(1, max_batch) as usize;
                    if let Err(why) = flush(ctx, &tx, &mut batch, &mut fwd) {
                        break why;
                    }
                }
            }
            Ok(None) => {
                if !batch.is_empty() {
                    if let Err(why) = flush(ctx, &tx, &mut batch, &mut fwd) {
                        break why;
                    }
                }
                if mode == b't' {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Err(e) if gone(&e) => {
                let up = format!("recv: {e}");
                break match flush(ctx, &tx, &mut batch, &mut fwd) {
                    Ok(()) => up,
                    Err(down) => format!("{up}, then {down}"),
                };
            }
            Err(e) => die(format!("stage: receive from source: {e}")),
        }
    };
    drop(batch);
    drop(rx);
    // Forwarding must describe the source's fbufs, never copy them.
    let stats = tx.stats();
    if stats.copied_bytes > 0 {
        say(&format!(
            "error stage: forwarding copied {} bytes",
            stats.copied_bytes
        ));
    }
    drop(tx);
    say(&format!(
        "eos forwarded={fwd} evicted={} ({reason})",
        stats.evicted
    ));
    // Pass releases on (the sink may still hold the source's fbufs) until told to finish.
    let fin = loop {
        domain.collect_releases();
        if let Some(c) = ctx.cmd(Duration::from_millis(2)) {
            if c.starts_with("finish") {
                break c;
            }
        }
    };
    let t0 = Instant::now();
    while domain.parked_senders() != 0 && t0.elapsed() < hang_limit() {
        domain.collect_releases();
        std::thread::sleep(Duration::from_millis(2));
    }
    Finish {
        dead: dead_slots(&fin),
        outstanding: 0,
        parked: domain.parked_senders(),
        note: drain.map(Drain::finish).unwrap_or_default(),
    }
}

// ------------------------------------------------------------------ chain: the sink

fn sink(ctx: &mut Ctx, domain: &Domain, peers: &Peers) -> Finish {
    let (mut rx, hrx) = accept_chain(ctx, domain, peers.stage, ctx.p("hostile") == "sink", peers);
    say("ready");
    let drain = hrx.map(|r| Drain::start(r, "sink"));
    let rmodes = ctx.p("kmodes").to_owned();
    let short_pct = ctx.n("short_pct");
    let short_ms = ctx.n("short_ms");
    let long_pct = ctx.n("long_pct");
    let long_budget = ctx.n("quota") as usize / 4;
    let mut short: Vec<(Instant, u64, IoData)> = Vec::new();
    let mut long: Vec<(u64, IoData)> = Vec::new();
    let mut long_bytes = 0usize;
    let mut last: Option<u64> = None;
    let mut count = 0u64;
    let recheck = |seq: u64, d: &IoData, when: &str| match check_message(d) {
        Ok(s) if s == seq => {}
        Ok(s) => say(&format!(
            "torn sink: message {seq} became message {s} {when}"
        )),
        Err(e) => say(&format!("torn sink: {e} {when}")),
    };
    let reason = loop {
        let now = Instant::now();
        short.retain(|(t, seq, d)| {
            if *t > now {
                return true;
            }
            recheck(*seq, d, "after a short hold");
            false
        });
        let mut mode = ctx.rng.letter(&rmodes);
        let next_due = short.iter().map(|s| s.0).min();
        if mode == b'b' && next_due.is_some() {
            mode = b'o'; // a blocking receive would keep held buffers past their time
        }
        let mut t = Duration::from_millis(1 + ctx.rng.below(20));
        if let Some(d) = next_due {
            t = t.min(d.saturating_duration_since(now));
        }
        match recv_with(&mut rx, mode, t) {
            Ok(Some(d)) => {
                count += 1;
                let seq = match check_message(&d) {
                    Ok(s) => s,
                    Err(e) => {
                        say(&format!("torn sink: {e}"));
                        continue;
                    }
                };
                if let Some(l) = last {
                    if seq <= l {
                        say(&format!(
                            "torn sink: message {seq} arrived after message {l}"
                        ));
                    }
                }
                last = Some(seq);
                let est = est_held(&d);
                let hold = if ctx.rng.pct(short_pct) {
                    let t = Instant::now() + Duration::from_millis(ctx.rng.range(1, short_ms));
                    short.push((t, seq, d));
                    "s"
                } else if ctx.rng.pct(long_pct) && long_bytes + est <= long_budget {
                    long_bytes += est;
                    long.push((seq, d));
                    "l"
                } else {
                    "-"
                };
                say(&format!("got {seq} {hold}"));
            }
            Ok(None) => {
                if mode == b't' {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Err(e) if gone(&e) => break format!("{e}"),
            Err(Error::BadDescriptor(e)) => say(&format!("refused {e}")),
            Err(e) => die(format!("sink: receive: {e}")),
        }
    };
    say(&format!(
        "eos received={count} holding={} ({reason})",
        short.len() + long.len()
    ));
    // Hold on until the source has had every chance to reuse what it got back.
    let fin = ctx.wait("reverify");
    for (_, seq, d) in &short {
        recheck(*seq, d, "at the end of the stream (short hold)");
    }
    for (seq, d) in &long {
        recheck(*seq, d, "at the end of the stream (held since it arrived)");
    }
    drop(short);
    drop(long);
    drop(rx);
    Finish {
        dead: dead_slots(&fin),
        note: drain.map(Drain::finish).unwrap_or_default(),
        ..Finish::default()
    }
}

// --------------------------------------------------------------- chain: the hostile

/// Continuation blocks the hostile member writes in its own lot (offsets from the start
/// of one 8-page fbuf): see `hostile`.
const BLOCKS: usize = 8;

fn frag_bytes(f: &RawFrag, out: &mut [u8]) {
    out[0..2].copy_from_slice(&f.slot.to_le_bytes());
    out[2..4].fill(0);
    out[4..8].copy_from_slice(&f.generation.to_le_bytes());
    out[8..16].copy_from_slice(&f.offset.to_le_bytes());
    out[16..24].copy_from_slice(&f.len.to_le_bytes());
}

fn ref_bytes(r: &RawRef, out: &mut [u8]) {
    out[0..2].copy_from_slice(&r.slot.to_le_bytes());
    out[2..4].fill(0);
    out[4..8].copy_from_slice(&r.generation.to_le_bytes());
    out[8..16].copy_from_slice(&r.offset.to_le_bytes());
}

/// A garbage descriptor: lots that do not exist (slots >= 64 too), stale generations,
/// spans out of bounds or overflowing, bad counts, cyclic or broken continuation chains,
/// and a few valid ones pointing into real lots.
fn garbage(
    rng: &mut Rng,
    known: &[DomainId],
    own: DomainId,
    data: u64,
    blocks: u64,
    lot: u64,
) -> RawDesc {
    let k = known[rng.below(known.len() as u64) as usize];
    let valid = RawFrag {
        slot: own.slot,
        pad: 0,
        generation: own.generation,
        offset: data + rng.below(4096),
        len: 1 + rng.below(4096),
    };
    let frag = RawFrag::new;
    let mut d = RawDesc {
        token: rng.next(),
        nfrags: 1,
        ninline: 1,
        ..RawDesc::default()
    };
    match rng.below(13) {
        0 => d.inline[0] = frag(rng.range(64, 65535) as u16, k.generation, 0, 4096),
        1 => {
            d.nfrags = 4;
            d.ninline = 3;
            d.inline = [valid; 3];
            d.next = RawRef {
                slot: rng.range(64, 65534) as u16,
                pad: 0,
                generation: 0,
                offset: 0,
            };
        }
        2 => {
            d.inline[0] = frag(
                k.slot,
                k.generation.wrapping_add(1 + rng.below(5) as u32),
                0,
                4096,
            )
        }
        3 => {
            d.inline[0] = frag(
                k.slot,
                k.generation,
                lot - rng.below(4096),
                4096 + rng.below(1 << 20),
            )
        }
        4 => d.inline[0] = frag(k.slot, k.generation, u64::MAX - rng.below(100), 200),
        5 => d.inline[0] = frag(k.slot, k.generation, 0, 0),
        6 => {
            d.nfrags = 4097 + rng.below(1 << 31) as u32;
            d.ninline = 3;
            d.inline = [valid; 3];
        }
        7 => {
            d.ninline = 4 + rng.below(1000) as u16;
            d.nfrags = rng.below(8) as u32;
        }
        8 => {
            d.nfrags = 3 + rng.range(1, 12) as u32;
            d.ninline = 3;
            d.inline = [valid; 3];
            let b = rng.below(BLOCKS as u64);
            d.next = RawRef {
                slot: own.slot,
                pad: 0,
                generation: own.generation,
                offset: blocks + b * 4096 + if rng.pct(20) { 3 } else { 0 },
            };
        }
        9 => d.inline[0] = valid,
        10 => d.inline[0] = frag(k.slot, k.generation, 0, 1 + rng.below(8192)),
        11 => {
            d.nfrags = rng.below(8) as u32;
            d.ninline = rng.below(5) as u16;
            for f in d.inline.iter_mut() {
                *f = frag(rng.next() as u16, rng.next() as u32, rng.next(), rng.next());
            }
            d.next = RawRef {
                slot: rng.next() as u16,
                pad: 0,
                generation: rng.next() as u32,
                offset: rng.next(),
            };
        }
        _ => {
            d.nfrags = 2;
            d.ninline = 2;
            d.inline[0] = frag(own.slot, own.generation, data, u64::MAX / 2 + 1);
            d.inline[1] = d.inline[0];
        }
    }
    d
}

fn hostile(ctx: &mut Ctx, domain: &Domain, peers: &Peers) -> Finish {
    let target = match ctx.p("hostile") {
        "stage" => peers.stage,
        _ => peers.sink,
    };
    if ctx.p("hlot") != "none" {
        return hostile_lot(ctx, domain, target);
    }
    let tx = domain
        .connect_with(
            target.id,
            ChannelConfig {
                capacity: 64,
                release_capacity: 64,
                ..Default::default()
            },
            SETUP,
        )
        .unwrap_or_else(|e| die(format!("hostile: connect: {e}")));
    let path = domain
        .path(PathConfig::default())
        .unwrap_or_else(|e| die(format!("hostile: path: {e}")));
    let own = domain.id();
    let lot = domain.group().lot_size() as u64;
    // Some plain data, and crafted continuation blocks, in the hostile's own lot.
    let mut m = path
        .alloc(8192)
        .unwrap_or_else(|e| die(format!("hostile: alloc: {e}")));
    write_fbuf(&mut m, |b| b.fill(0x77));
    let data = m.freeze();
    let data_off = data.fragments()[0]
        .lot_span()
        .map(|s| s.offset)
        .unwrap_or(0);
    let valid = RawFrag {
        slot: own.slot,
        pad: 0,
        generation: own.generation,
        offset: data_off,
        len: 100,
    };
    // Eight crafted continuation blocks, 4 KiB apart; their links need the lot offset of
    // the fbuf that will hold them.
    let mut image = vec![0u8; BLOCKS * 4096];
    let write_blocks = |image: &mut [u8], base: u64| {
        let none = RawRef::NONE;
        let at = |i: usize| RawRef {
            slot: own.slot,
            pad: 0,
            generation: own.generation,
            offset: base + (i * 4096) as u64,
        };
        let mut block = |i: usize, count: u32, next: RawRef, frags: &[RawFrag]| {
            let b = &mut image[i * 4096..(i + 1) * 4096];
            b[0..4].copy_from_slice(&count.to_le_bytes());
            ref_bytes(&next, &mut b[8..24]);
            for (j, f) in frags.iter().enumerate() {
                frag_bytes(f, &mut b[24 + j * 24..48 + j * 24]);
            }
        };
        block(0, 1, at(0), &[valid]); // a cycle of one block
        block(1, 0, none, &[]); // an empty block
        block(2, 60_000, none, &[valid]); // a count far too large
        block(3, 2, none, &[valid, valid]); // valid for nfrags = 5
        let mut far = valid;
        far.slot = 300;
        block(4, 1, none, &[far]); // a slot past the group's 64
        let out = RawRef {
            offset: lot - 8,
            ..at(0)
        };
        block(5, 1, out, &[valid]); // a link out of the lot
        block(6, 1, at(7), &[valid]); // a cycle of two blocks
        block(7, 1, at(6), &[valid]);
    };
    // The lot offset of an fbuf shows only once it is frozen: allocate one, freeze it,
    // read its offset and drop it; the path's free list is LIFO, so the next allocation
    // of that size gets the same span.
    let probe = {
        let mut m = path
            .alloc(BLOCKS * 4096)
            .unwrap_or_else(|e| die(format!("hostile: alloc: {e}")));
        write_fbuf(&mut m, |b| b.fill(0));
        m.freeze()
    };
    let base = probe.fragments()[0]
        .lot_span()
        .map(|s| s.offset)
        .unwrap_or(0);
    drop(probe);
    let mut m = path
        .alloc(BLOCKS * 4096)
        .unwrap_or_else(|e| die(format!("hostile: alloc: {e}")));
    write_blocks(&mut image, base);
    write_fbuf(&mut m, |b| b.copy_from_slice(&image));
    let blocks = m.freeze();
    let real_base = blocks.fragments()[0]
        .lot_span()
        .map(|s| s.offset)
        .unwrap_or(0);
    if real_base != base {
        say("note hostile: the block fbuf moved; its links point at the wrong place");
    }
    say("ready");
    ctx.wait("go");
    let known = [peers.source.id, peers.stage.id, peers.sink.id, own];
    let count = ctx.n("hcount");
    let mut pushed = 0u64;
    'push: for _ in 0..count {
        let d = garbage(&mut ctx.rng, &known, own, data_off, real_base, lot);
        let mut tries = 0;
        loop {
            match ferry::testing::push_raw(&tx, d) {
                Ok(()) => {
                    pushed += 1;
                    break;
                }
                Err(Error::Full) if tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(Error::Full) => break,
                Err(_) => break 'push,
            }
        }
        if ctx.rng.pct(30) {
            std::thread::sleep(Duration::from_micros(ctx.rng.below(2000)));
        }
    }
    drop(tx);
    drop((data, blocks, path));
    Finish {
        note: format!("pushed={pushed}"),
        ..Finish::default()
    }
}

/// The hostile member with something else behind its lot descriptor (`hlot`: "fifo",
/// "socket", "dir", "devzero", or "growing", an unsealed memfd resized all the while):
/// its channel to `target` must be refused, promptly and saying why.
fn hostile_lot(ctx: &mut Ctx, domain: &Domain, target: Member) -> Finish {
    use rustix::fs::{ftruncate, memfd_create, mkfifoat, open, MemfdFlags, Mode, OFlags};
    let mode = ctx.p("hlot").to_owned();
    let lot_size = domain.group().lot_size() as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let mut resizer = None;
    let mut other_end = None;
    let bad: std::os::fd::OwnedFd = match mode.as_str() {
        "fifo" => {
            let path =
                std::env::temp_dir().join(format!("ferry-torture-fifo-{}", std::process::id()));
            let _ = std::fs::remove_file(&path);
            mkfifoat(rustix::fs::CWD, &path, Mode::RUSR | Mode::WUSR)
                .unwrap_or_else(|e| die(format!("hostile: mkfifo: {e}")));
            let fd = open(
                &path,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap_or_else(|e| die(format!("hostile: open fifo: {e}")));
            let _ = std::fs::remove_file(&path);
            fd
        }
        "socket" => {
            let (a, b) =
                UnixStream::pair().unwrap_or_else(|e| die(format!("hostile: socketpair: {e}")));
            other_end = Some(b);
            a.into()
        }
        "dir" => open(
            "/",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap_or_else(|e| die(format!("hostile: open /: {e}"))),
        "devzero" => open("/dev/zero", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .unwrap_or_else(|e| die(format!("hostile: open /dev/zero: {e}"))),
        _ => {
            let fd = memfd_create("ferry-lot", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .unwrap_or_else(|e| die(format!("hostile: memfd: {e}")));
            let dup = fd
                .try_clone()
                .unwrap_or_else(|e| die(format!("hostile: dup: {e}")));
            let s = stop.clone();
            resizer = Some(std::thread::spawn(move || {
                let mut k = 0u64;
                while !s.load(Ordering::Relaxed) {
                    let _ = ftruncate(&dup, if k % 2 == 0 { 2 * lot_size } else { 4096 });
                    k += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }));
            fd
        }
    };
    let want = "/memfd:ferry-lot (deleted)";
    let lot_fd: i32 = std::fs::read_dir("/proc/self/fd")
        .unwrap_or_else(|e| die(format!("hostile: /proc/self/fd: {e}")))
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_str() == Some(want)))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| die("hostile: no lot descriptor"));
    // SAFETY: dup2(2) onto this process's own lot descriptor, which ferry keeps open only
    // for peers to reopen (the lot's mapping stays); the number stays owned by the lot.
    if unsafe { libc::dup2(bad.as_raw_fd(), lot_fd) } < 0 {
        die(format!(
            "hostile: dup2: {}",
            std::io::Error::last_os_error()
        ));
    }
    drop(bad);
    let t0 = Instant::now();
    let r = domain.connect(target.id, SETUP);
    let note = match r {
        Ok(_) => die(format!("hostile: a channel with a {mode} lot was accepted")),
        Err(e @ Error::Refused { .. }) => format!("lot={mode} refused in {:?}: {e}", t0.elapsed()),
        Err(e) => die(format!(
            "hostile: a channel with a {mode} lot: unexpected error {e}"
        )),
    };
    say("ready");
    ctx.wait("go");
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = resizer {
        let _ = t.join();
    }
    drop(other_end);
    Finish {
        note,
        ..Finish::default()
    }
}

// --------------------------------------------------------------- containers: children

/// The pattern key of pallet `i` of container `seq`.
fn pallet_key(seq: u64, i: usize) -> u64 {
    (seq << 8) | i as u64 | (1 << 63)
}

fn check_container(c: &mut Container, seq: u64) -> Result<(), String> {
    for i in 0..c.len() {
        let v = c
            .view(i)
            .map_err(|e| format!("container {seq}: view pallet {i}: {e}"))?;
        let valid = v.valid();
        if let Some((off, got, want)) = compare_pattern(
            pallet_key(seq, i),
            valid.start,
            &v.as_slice()[valid.clone()],
        ) {
            return Err(format!(
                "container {seq}: pallet {i} byte {off} is {got:#04x}, want {want:#04x}"
            ));
        }
    }
    Ok(())
}

fn container_report(ctx: &Ctx, note: &str) {
    say(&format!(
        "report fds={}/{} memfds={}/{} maps={} deadlot=0 outstanding=0 parked=0 {note}",
        fd_count(),
        ctx.fds0,
        memfd_count(),
        ctx.memfds0,
        pallet_maps()
    ));
}

fn connect_unix(path: &Path) -> UnixStream {
    let t0 = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return s,
            Err(e) if t0.elapsed() > SETUP => die(format!("connect {}: {e}", path.display())),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

fn container_child(role: &str) {
    let mut ctx = Ctx::start(role);
    let dir = PathBuf::from(ctx.p("dir"));
    let n = ctx.n("n");
    match role {
        "csource" => {
            let sock = connect_unix(&dir.join("stage.sock"));
            say("ready");
            ctx.wait("go");
            let mut reason = "done".to_owned();
            let mut shipped = 0;
            for seq in 0..n {
                let np = ctx.rng.range(1, 4) as usize;
                let sizes: Vec<usize> = (0..np)
                    .map(|_| 4096 * ctx.rng.log_range(1, 64) as usize)
                    .collect();
                let mut c = Container::alloc(&sizes)
                    .unwrap_or_else(|e| die(format!("csource: alloc: {e}")));
                for (i, &size) in sizes.iter().enumerate() {
                    let a = ctx.rng.below(size as u64 / 2) as usize;
                    let b = ctx.rng.range(a as u64 + 1, size as u64) as usize;
                    let mut u = c
                        .unload(i)
                        .unwrap_or_else(|e| die(format!("csource: unload: {e}")));
                    fill_pattern(pallet_key(seq, i), a, &mut u.as_mut_slice()[a..b]);
                    u.reload(a..b)
                        .unwrap_or_else(|e| die(format!("csource: reload: {e}")));
                }
                if ctx.rng.pct(50) {
                    c.seal()
                        .unwrap_or_else(|e| die(format!("csource: seal: {e}")));
                }
                match c.ship(&sock) {
                    Ok(()) => {
                        shipped += 1;
                        say(&format!("shipped {seq}"));
                    }
                    Err(e) => {
                        reason = format!("ship: {}", e.error);
                        drop(e.container);
                        break;
                    }
                }
            }
            drop(sock);
            say(&format!("eos shipped={shipped} ({reason})"));
            ctx.wait("finish");
            container_report(&ctx, "");
        }
        "cstage" => {
            let listener = UnixListener::bind(dir.join("stage.sock"))
                .unwrap_or_else(|e| die(format!("cstage: bind: {e}")));
            let down = connect_unix(&dir.join("sink.sock"));
            say("ready");
            let (up, _) = listener
                .accept()
                .unwrap_or_else(|e| die(format!("cstage: accept: {e}")));
            drop(listener);
            let hold = ctx.n("hold");
            let delay = ctx.n("delay_us");
            let mut held: Vec<(u64, Container)> = Vec::new();
            let mut seq = 0;
            let mut reason;
            'stream: loop {
                // Receive slowly, so that shipped containers pile up in the socket.
                std::thread::sleep(Duration::from_micros(ctx.rng.below(delay + 1)));
                match Container::receive(&up) {
                    Ok(mut c) => {
                        if let Err(e) = check_container(&mut c, seq) {
                            say(&format!("torn cstage: {e}"));
                        }
                        say(&format!("recv {seq}"));
                        held.push((seq, c));
                        seq += 1;
                    }
                    Err(e) => {
                        reason = format!("receive: {e}");
                        break 'stream;
                    }
                }
                if held.len() as u64 >= ctx.rng.range(1, hold) {
                    {
                        // Hold a mapping of one pallet while we dawdle.
                        let k = held.len();
                        let v = held[0].1.view(0).ok();
                        say(&format!("holding {k}"));
                        std::thread::sleep(Duration::from_millis(ctx.rng.range(1, 20)));
                        drop(v);
                    }
                    for (s, c) in held.drain(..) {
                        if let Err(e) = c.ship(&down) {
                            reason = format!("ship {s}: {}", e.error);
                            break 'stream;
                        }
                    }
                }
            }
            for (_, c) in held.drain(..) {
                if let Err(e) = c.ship(&down) {
                    reason = format!("{reason}, then ship: {}", e.error);
                    break;
                }
            }
            drop((up, down));
            say(&format!("eos received={seq} ({reason})"));
            ctx.wait("finish");
            container_report(&ctx, "");
        }
        _ => {
            let listener = UnixListener::bind(dir.join("sink.sock"))
                .unwrap_or_else(|e| die(format!("csink: bind: {e}")));
            say("ready");
            let (up, _) = listener
                .accept()
                .unwrap_or_else(|e| die(format!("csink: accept: {e}")));
            drop(listener);
            let mut held: VecDeque<Container> = VecDeque::new();
            let mut seq = 0;
            let reason = loop {
                match Container::receive(&up) {
                    Ok(mut c) => {
                        if let Err(e) = check_container(&mut c, seq) {
                            say(&format!("torn csink: {e}"));
                        }
                        say(&format!("got {seq}"));
                        seq += 1;
                        held.push_back(c);
                        if held.len() as u64 > ctx.rng.below(4) {
                            held.pop_front();
                        }
                    }
                    Err(Error::BadDescriptor(e)) => {
                        say(&format!("refused {e}"));
                        if seq > n + 10 {
                            break "too many refusals".to_owned();
                        }
                        seq += 1;
                    }
                    Err(e) => break format!("receive: {e}"),
                }
            };
            drop(held);
            drop(up);
            say(&format!("eos received={seq} ({reason})"));
            ctx.wait("finish");
            container_report(&ctx, "");
        }
    }
}

// ------------------------------------------------------------------ uring: children

fn open_fifo(path: &Path, write: bool, nonblock: bool) -> File {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(if nonblock { libc::O_NONBLOCK } else { 0 })
        .open(path)
        .unwrap_or_else(|e| die(format!("open {}: {e}", path.display())))
}

/// Clears O_NONBLOCK, so that io_uring waits for data instead of failing with EAGAIN.
fn set_blocking(f: &File) {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl(F_GETFL/F_SETFL) on a descriptor we own; no memory is involved.
    let ok = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) == 0
    };
    if !ok {
        die(format!(
            "fcntl O_NONBLOCK: {}",
            std::io::Error::last_os_error()
        ));
    }
}

fn uring_child(role: &str) {
    let ctx = Ctx::start(role);
    let dir = PathBuf::from(ctx.p("dir"));
    if role == "upeer" {
        let b = open_fifo(&dir.join("b"), false, true);
        let c = open_fifo(&dir.join("c"), false, true);
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(format!("bind: {e}")));
        let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
        say(&format!("ready {port}"));
        ctx.wait("open");
        let a = open_fifo(&dir.join("a"), true, true);
        let (s1, _) = l.accept().unwrap_or_else(|e| die(format!("accept: {e}")));
        let (s2, _) = l.accept().unwrap_or_else(|e| die(format!("accept: {e}")));
        set_blocking(&c);
        let mut ring =
            Uring::new(&RingConfig::new(8)).unwrap_or_else(|e| die(format!("upeer: ring: {e}")));
        let tc = ring
            .submit_read_at(&c, vec![0u8; 4096], 0)
            .unwrap_or_else(|e| die(format!("upeer: read: {e}")));
        let ts = ring
            .submit_recv(&s2, vec![0u8; 4096])
            .unwrap_or_else(|e| die(format!("upeer: recv: {e}")));
        ring.flush()
            .unwrap_or_else(|e| die(format!("upeer: flush: {e}")));
        say("armed");
        ctx.wait("check");
        let deadline = Instant::now() + hang_limit();
        for (what, t) in [("read on a FIFO", tc), ("recv on TCP", ts)] {
            let left = deadline.saturating_duration_since(Instant::now());
            match ring.wait_timeout(&t, left) {
                Ok(()) => match ring.wait(t).map(|c| c.result) {
                    Ok(Ok(0)) => {}
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNRESET) => {}
                    Ok(r) => say(&format!(
                        "error upeer: {what} ended with {r:?}, want 0 (end of file)"
                    )),
                    Err(e) => die(format!("upeer: wait: {e}")),
                },
                Err(Error::Timeout) => {
                    say(&format!(
                        "hang upeer: {what} not complete {:?} after its peer went away",
                        hang_limit()
                    ));
                    drop(t);
                }
                Err(e) => die(format!("upeer: wait: {e}")),
            }
        }
        let t0 = Instant::now();
        drop(ring);
        let dt = t0.elapsed();
        drop((a, b, c, s1, s2, l));
        container_report(&ctx, &format!("ring_drop_ms={}", dt.as_millis()));
        return;
    }
    // The victim: operations in flight that never complete by themselves.
    let port = ctx.n("port");
    let a = open_fifo(&dir.join("a"), false, true);
    let b = open_fifo(&dir.join("b"), true, false);
    let c = open_fifo(&dir.join("c"), true, false);
    let addr = format!("127.0.0.1:{port}");
    let t1 = TcpStream::connect(&addr).unwrap_or_else(|e| die(format!("connect: {e}")));
    let t2 = TcpStream::connect(&addr).unwrap_or_else(|e| die(format!("connect: {e}")));
    say("opened");
    let go = ctx.wait("go");
    let fate_drop = go.contains("drop");
    set_blocking(&a);
    let (fds0, memfds0) = (fd_count(), memfd_count());
    let mut rng = ctx.rng.clone();
    let mut ring = Uring::new(&RingConfig::new(rng.pick(&[8, 16, 32])))
        .unwrap_or_else(|e| die(format!("uvictim: ring: {e}")));
    let mut tickets = Vec::new();
    let mut push = |r: Result<_, ferry::uring::Refused<Vec<u8>>>| match r {
        Ok(t) => tickets.push(t),
        Err(e) => die(format!("uvictim: submit: {}", e.error)),
    };
    push(ring.submit_read_at(&a, vec![0u8; 65536], 0));
    push(ring.submit_recv(&t2, vec![0u8; 65536]));
    for _ in 0..rng.range(1, 8) {
        push(ring.submit_write_at(&b, vec![0x11u8; 65536], 0));
    }
    for _ in 0..rng.range(1, 12) {
        push(ring.submit_send(&t1, vec![0x22u8; 1 << 20]));
    }
    // Zero-copy sends keep their buffers until the socket lets go of the pages, which a
    // peer that never reads delays forever: only when we will be killed anyway.
    if !fate_drop && Features::probe().send_zc {
        for _ in 0..rng.range(0, 3) {
            push(ring.submit_send_zc(&t1, vec![0x33u8; 1 << 20]));
        }
    }
    ring.flush()
        .unwrap_or_else(|e| die(format!("uvictim: flush: {e}")));
    say(&format!("inflight {}", ring.in_flight()));
    if !fate_drop {
        ctx.wait("never"); // the harness kills us
    }
    std::thread::sleep(Duration::from_millis(rng.below(20)));
    let t0 = Instant::now();
    drop(tickets);
    drop(ring);
    let dt = t0.elapsed();
    say(&format!(
        "report fds={}/{fds0} memfds={}/{memfds0} maps=0 deadlot=0 outstanding=0 parked=0 \
         ring_drop_ms={}",
        fd_count(),
        memfd_count(),
        dt.as_millis()
    ));
    drop((a, b, c, t1, t2));
}

// ---------------------------------------------------------------------- harness: kids

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Torn,
    Hang,
    Crash,
    Leak,
    Error,
}

impl Kind {
    const ALL: [Kind; 5] = [Kind::Torn, Kind::Hang, Kind::Crash, Kind::Leak, Kind::Error];
    fn name(self) -> &'static str {
        match self {
            Kind::Torn => "torn",
            Kind::Hang => "hang",
            Kind::Crash => "crash",
            Kind::Leak => "leak",
            Kind::Error => "error",
        }
    }
}

enum Ev {
    Line(usize, String),
    Eof(usize),
}

struct Kid {
    role: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    status: Option<ExitStatus>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    lines: Vec<String>,
    /// We sent it SIGKILL.
    killed: bool,
    /// We killed it because it hung (not part of the trial's plan).
    cleaned_up: bool,
    stopped: bool,
    eof: bool,
    died_at: Option<Instant>,
}

/// The children of one trial, and the lines they print.
struct Kids {
    v: Vec<Kid>,
    tx: mpsc::Sender<Ev>,
    rx: mpsc::Receiver<Ev>,
}

impl Kids {
    fn new() -> Kids {
        let (tx, rx) = mpsc::channel();
        Kids {
            v: Vec::new(),
            tx,
            rx,
        }
    }

    fn spawn(&mut self, role: &'static str, params: &str) -> usize {
        let i = self.v.len();
        let mut child = Command::new(std::env::current_exe().expect("own executable"))
            .env("FERRY_TEST_ROLE", role)
            .env("FERRY_TORTURE_P", params)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a child");
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(Ev::Line(i, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Ev::Eof(i));
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let keep = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut q = keep.lock().unwrap_or_else(|p| p.into_inner());
                q.push_back(line);
                if q.len() > 40 {
                    q.pop_front();
                }
            }
        });
        self.v.push(Kid {
            role,
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
            status: None,
            stderr,
            lines: Vec::new(),
            killed: false,
            cleaned_up: false,
            stopped: false,
            eof: false,
            died_at: None,
        });
        i
    }

    fn tell(&mut self, i: usize, line: &str) {
        if let Some(s) = self.v[i].stdin.as_mut() {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    /// One event, or None at `until`.
    fn pump(&mut self, until: Instant) -> Option<Ev> {
        let left = until.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(Ev::Line(i, l)) => {
                self.v[i].lines.push(l.clone());
                Some(Ev::Line(i, l))
            }
            Ok(Ev::Eof(i)) => {
                self.v[i].eof = true;
                if !self.v[i].killed {
                    self.reap(i, Duration::from_secs(3));
                }
                Some(Ev::Eof(i))
            }
            Err(_) => None,
        }
    }

    /// Waits (up to `limit`) for a line of kid `i` that starts with `prefix`, at or after
    /// line number `from`. Gives up early if the kid exits.
    fn wait_line(
        &mut self,
        i: usize,
        prefix: &str,
        from: usize,
        limit: Duration,
    ) -> Option<String> {
        let until = Instant::now() + limit;
        loop {
            if let Some(l) = self.v[i].lines[from.min(self.v[i].lines.len())..]
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return Some(l.clone());
            }
            if self.v[i].eof || self.v[i].status.is_some() {
                // Lines may still be queued behind the EOF: drain what is there.
                while let Ok(ev) = self.rx.try_recv() {
                    if let Ev::Line(k, l) = ev {
                        self.v[k].lines.push(l);
                    }
                }
                return self.v[i].lines[from.min(self.v[i].lines.len())..]
                    .iter()
                    .find(|l| l.starts_with(prefix))
                    .cloned();
            }
            self.pump(until)?;
        }
    }

    /// Waits (up to `limit`) for kid `i`'s "report" line; without one, a hang saying
    /// `what` and where the kid's threads are.
    fn report_or_hang(&mut self, i: usize, limit: Duration, what: &str) -> Option<(Kind, String)> {
        self.wait_line(i, "report", 0, limit).is_none().then(|| {
            (
                Kind::Hang,
                format!("{what} (threads {})", where_is(self.v[i].pid)),
            )
        })
    }

    /// Neither exited nor killed (a killed child may not be reaped yet).
    fn alive(&self, i: usize) -> bool {
        self.v[i].status.is_none() && !self.v[i].killed
    }

    /// Reaps kid `i` if it exits within `limit`.
    fn reap(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        let k = &mut self.v[i];
        while k.status.is_none() {
            if let Ok(Some(s)) = k.child.try_wait() {
                k.status = Some(s);
                k.died_at.get_or_insert_with(Instant::now);
                break;
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        k.status
    }

    fn signal(&mut self, i: usize, sig: i32) {
        let k = &mut self.v[i];
        if k.status.is_none() && !k.killed {
            // SAFETY: kill(2) on our own child, which is not reaped yet (so its pid
            // cannot have been reused); no memory is involved.
            unsafe { libc::kill(k.pid as i32, sig) };
        }
    }

    /// SIGKILL, and reap at once.
    fn kill(&mut self, i: usize) {
        self.kill_late(i);
        let k = &mut self.v[i];
        if k.status.is_none() {
            k.status = k.child.wait().ok();
        }
    }

    /// SIGKILL, leaving the child a zombie until something reaps it.
    fn kill_late(&mut self, i: usize) {
        let k = &mut self.v[i];
        if k.status.is_none() && !k.killed {
            k.killed = true;
            let _ = k.child.kill();
            // Wait until it has died (a zombie), without reaping it: SIGKILL takes a while
            // to tear a large address space down, and a member that is still exiting when
            // the others leave is a live member to them, not the zombie this case is about.
            // SAFETY: waitid(2) on our own unreaped child, into a zeroed siginfo we own.
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                while libc::waitid(libc::P_PID, k.pid, &mut info, libc::WEXITED | libc::WNOWAIT)
                    != 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                }
            }
            k.died_at = Some(Instant::now());
        }
    }

    /// Kills whatever still runs (it hung) and reaps everything: every trial ends with
    /// no child left.
    fn kill_all(&mut self) {
        for i in 0..self.v.len() {
            if self.alive(i) {
                self.v[i].cleaned_up = true;
                if self.v[i].stopped {
                    self.signal(i, libc::SIGCONT);
                }
            }
            self.kill(i);
        }
    }

    /// Whether the child that died last left by itself (exit code 0): only then must the
    /// group's control block be gone.
    fn last_left_cleanly(&self) -> bool {
        self.v
            .iter()
            .filter_map(|k| Some((k.died_at?, k)))
            .max_by_key(|(t, _)| *t)
            .is_some_and(|(_, k)| !k.killed && k.status.is_some_and(|s| s.success()))
    }

    fn stderr_tail(&self, i: usize) -> String {
        let q = self.v[i].stderr.lock().unwrap_or_else(|p| p.into_inner());
        let lines: Vec<&String> = q.iter().collect();
        let start = lines
            .iter()
            .position(|l| l.contains("panicked at"))
            .unwrap_or(lines.len().saturating_sub(3));
        lines[start..]
            .iter()
            .take(4)
            .map(|s| s.trim())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    fn last_line(&self, i: usize) -> String {
        self.v[i]
            .lines
            .iter()
            .rev()
            .find(|l| !l.starts_with("stall"))
            .cloned()
            .unwrap_or_default()
    }

    /// Why kid `i` ended, if that is a failure.
    fn judge(&mut self, i: usize) -> Option<(Kind, String)> {
        let status = self.reap(i, Duration::from_secs(2))?;
        let k = &self.v[i];
        if let Some(sig) = status.signal() {
            if sig == libc::SIGKILL && k.killed {
                return None;
            }
            return Some((
                Kind::Crash,
                format!(
                    "{} (pid {}) died of signal {sig}, which nobody sent it; stderr: {}",
                    k.role,
                    k.pid,
                    self.stderr_tail(i)
                ),
            ));
        }
        match status.code() {
            Some(0) | Some(EXIT_ERROR) => None,
            Some(EXIT_DEADLINE) => Some((
                Kind::Hang,
                format!("{} missed its own {CHILD_DEADLINE:?} deadline", k.role),
            )),
            Some(101) => Some((
                Kind::Crash,
                format!("{} panicked: {}", k.role, self.stderr_tail(i)),
            )),
            c => Some((
                Kind::Crash,
                format!("{} exited with {c:?}: {}", k.role, self.stderr_tail(i)),
            )),
        }
    }
}

impl Drop for Kids {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Checks a `report` line: descriptors, memfds and mappings back to their baseline, no
/// dead lot mapped, nothing outstanding or parked.
fn judge_report(role: &str, line: &str) -> Vec<(Kind, String)> {
    let mut out = Vec::new();
    let field = |k: &str| -> Option<&str> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
    };
    let pair = |k: &str| -> Option<(u64, u64)> {
        let (a, b) = field(k)?.split_once('/')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    };
    let num = |k: &str| -> Option<u64> { field(k)?.parse().ok() };
    for k in ["fds", "memfds"] {
        match pair(k) {
            Some((a, b)) if a == b => {}
            Some((a, b)) => out.push((
                Kind::Leak,
                format!("{role}: {a} {k} after dropping everything, {b} at start ({line})"),
            )),
            None => out.push((Kind::Error, format!("{role}: bad report line {line:?}"))),
        }
    }
    let what = [
        ("maps", "ferry mappings left after dropping everything"),
        (
            "deadlot",
            "mappings of a dead peer's lot left once nothing used it",
        ),
        (
            "outstanding",
            "bytes still outstanding on the source's path",
        ),
        ("parked", "closed senders still parked"),
    ];
    for (k, msg) in what {
        match num(k) {
            Some(0) => {}
            Some(n) => out.push((Kind::Leak, format!("{role}: {n} {msg} ({line})"))),
            None => out.push((Kind::Error, format!("{role}: bad report line {line:?}"))),
        }
    }
    if let Some(ms) = num("ring_drop_ms") {
        if ms >= 4500 {
            out.push((
                Kind::Leak,
                format!("{role}: dropping the ring took {ms} ms (it gave up and leaked buffers)"),
            ));
        }
    }
    out
}

/// Lines every child may print that are failures by themselves.
fn scan_lines(kids: &Kids, out: &mut Vec<(Kind, String)>) {
    for k in &kids.v {
        for l in &k.lines {
            if let Some(r) = l.strip_prefix("torn ") {
                out.push((Kind::Torn, r.to_owned()));
            } else if let Some(r) = l.strip_prefix("error ") {
                out.push((Kind::Error, r.to_owned()));
            } else if let Some(r) = l.strip_prefix("hang ") {
                out.push((Kind::Hang, r.to_owned()));
            } else if l.starts_with("report ") {
                out.extend(judge_report(k.role, l));
            }
        }
    }
}

/// The outcome of one trial.
#[derive(Default)]
struct Outcome {
    what: String,
    failures: Vec<(Kind, String)>,
    kills: u32,
    stops: u32,
    hostile: bool,
    /// Every line the children printed (shown with FERRY_TORTURE_VERBOSE=1).
    lines: Vec<String>,
}

impl Outcome {
    /// Ends a trial: judges every kid, scans their lines for failures, keeps the lines,
    /// records `fails` with the rest, and removes the trial's directory.
    fn close_trial(&mut self, kids: &mut Kids, mut fails: Vec<(Kind, String)>, dir: &Path) {
        for i in 0..kids.v.len() {
            if let Some(f) = kids.judge(i) {
                fails.push(f);
            }
        }
        scan_lines(kids, &mut fails);
        self.keep_lines(kids);
        self.failures.append(&mut fails);
        let _ = std::fs::remove_dir_all(dir);
    }

    fn keep_lines(&mut self, kids: &Kids) {
        for k in &kids.v {
            for l in &k.lines {
                self.lines.push(format!("{}: {l}", k.role));
            }
            let q = k.stderr.lock().unwrap_or_else(|p| p.into_inner());
            for l in q.iter() {
                self.lines.push(format!("{} stderr: {l}", k.role));
            }
        }
    }
}

fn new_dir(tag: &str, seed: u64) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ferry-torture-{}-{tag}-{seed:x}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a temporary directory");
    d
}

// --------------------------------------------------------------------- harness: chain

const SOURCE: usize = 0;
const STAGE: usize = 1;
const SINK: usize = 2;
const ROLES: [&str; 3] = ["source", "stage", "sink"];

#[derive(Clone, Copy, Debug)]
enum Moment {
    /// Microseconds after the source is told to go.
    Early(u64),
    /// Once the sink has this many messages.
    Mid(u64),
    /// Once the sink has this many messages and holds one until the end.
    Holding(u64),
}

#[derive(Clone, Copy, Debug)]
enum Action {
    None,
    Kill(usize, Moment),
    Stop(usize, Moment, u64),
}

struct ChainPlan {
    params: String,
    action: Action,
    /// Leave the killed victim a zombie until every other member has exited, as a busy
    /// parent would: it is dead (its pidfd says so) but /proc still lists it.
    reap_late: bool,
    hostile: Option<&'static str>,
    what: String,
}

fn chain_plan(rng: &mut Rng, seed: u64) -> ChainPlan {
    let group = format!("torture-{}-{seed:x}", std::process::id());
    let n = rng.log_range(10, 300);
    let quota = rng.pick(&[128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20, 128 << 20]);
    let pow = |rng: &mut Rng, lo: u32, hi: u32| 1u64 << rng.range(lo as u64, hi as u64);
    let (cap1, rel1, cap2, rel2) = (
        pow(rng, 1, 8),
        pow(rng, 1, 10),
        pow(rng, 1, 8),
        pow(rng, 1, 10),
    );
    let secure = rng.pct(20) as u64;
    let probe = rng.pct(50) as u64;
    let smodes = rng.subset("bto");
    let rmodes = rng.subset("bto");
    let tmodes = rng.subset("bto");
    let kmodes = rng.subset("bto");
    let batch = rng.range(1, 4);
    let short_pct = rng.pick(&[0, 10, 30]);
    let short_ms = rng.range(1, 100);
    let r = rng.range(1, n);
    let moment = match rng.below(3) {
        0 => Moment::Early(rng.below(3000)),
        1 => Moment::Mid(r),
        _ => Moment::Holding(r / 2),
    };
    let long_pct = match moment {
        Moment::Holding(_) => rng.range(10, 40),
        _ => rng.pick(&[0, 5, 20]),
    };
    let victim = rng.below(3) as usize;
    let action = match rng.below(100) {
        0..=64 => Action::Kill(victim, moment),
        65..=84 => Action::Stop(victim, moment, rng.range(200, 2000)),
        _ => Action::None,
    };
    let reap_late = matches!(action, Action::Kill(..)) && rng.pct(25);
    let hostile = if rng.pct(25) {
        Some(if rng.pct(50) { "stage" } else { "sink" })
    } else {
        None
    };
    let hcount = rng.range(20, 200);
    // Half the hostile members sabotage their lot descriptor instead of pushing garbage.
    let hlot = if rng.pct(50) {
        "none"
    } else {
        rng.pick(&["fifo", "socket", "dir", "devzero", "growing"])
    };
    // A lossy stage-to-sink channel: the stage evicts the sink's oldest queued messages
    // when its ring is full, and reports how many.
    let lossy2 = rng.pct(20) as u64;
    let params = format!(
        "seed={seed} group={group} n={n} quota={quota} secure={secure} probe={probe} \
         cap1={cap1} rel1={rel1} cap2={cap2} rel2={rel2} smodes={smodes} rmodes={rmodes} \
         tmodes={tmodes} kmodes={kmodes} batch={batch} short_pct={short_pct} \
         short_ms={short_ms} long_pct={long_pct} hostile={} hcount={hcount} hlot={hlot} \
         lossy2={lossy2}",
        hostile.unwrap_or("none")
    );
    let act = match action {
        Action::None => "no kill".to_owned(),
        Action::Kill(v, m) => format!(
            "kill {} at {m:?}{}",
            ROLES[v],
            if reap_late { " (reaped late)" } else { "" }
        ),
        Action::Stop(v, m, ms) => format!("stop {} at {m:?} for {ms} ms", ROLES[v]),
    };
    let what = format!(
        "chain n={n} quota={}K{} rings={cap1}/{rel1},{cap2}/{rel2}{} modes={smodes}/{rmodes}/\
         {tmodes}/{kmodes} {act}{}",
        quota >> 10,
        if secure == 1 { " secure" } else { "" },
        if lossy2 == 1 { " lossy" } else { "" },
        hostile
            .map(|h| if hlot == "none" {
                format!(" hostile->{h}")
            } else {
                format!(" hostile({hlot} lot)->{h}")
            })
            .unwrap_or_default()
    );
    ChainPlan {
        params,
        action,
        reap_late,
        hostile,
        what,
    }
}

/// A running chain trial.
struct ChainRun {
    kids: Kids,
    plan: ChainPlan,
    hostile: Option<usize>,
    slots: Vec<u16>,
    got: Vec<u64>,
    long_held: usize,
    refused: Vec<String>,
    eos: [bool; 3],
    sent: Option<u64>,
    /// The stage-to-sink channel is lossy.
    lossy: bool,
    /// Messages the stage evicted from that channel, once it said so.
    evicted: Option<u64>,
    failures: Vec<(Kind, String)>,
    hung: bool,
}

impl ChainRun {
    fn on_event(&mut self, ev: Ev) -> bool {
        match ev {
            Ev::Line(i, l) => {
                if i == SINK {
                    if let Some(r) = l.strip_prefix("got ") {
                        let mut w = r.split_whitespace();
                        if let Some(s) = w.next().and_then(|s| s.parse().ok()) {
                            self.got.push(s);
                        }
                        if w.next() == Some("l") {
                            self.long_held += 1;
                        }
                    }
                    if let Some(r) = l.strip_prefix("refused ") {
                        self.refused.push(r.to_owned());
                    }
                }
                if i < 3 && l.starts_with("eos") {
                    self.eos[i] = true;
                    if i == STAGE {
                        self.evicted = l
                            .split_whitespace()
                            .find_map(|w| w.strip_prefix("evicted="))
                            .and_then(|s| s.parse().ok());
                    }
                    if i == SOURCE {
                        self.sent = l
                            .strip_prefix("eos sent=")
                            .and_then(|r| r.split_whitespace().next())
                            .and_then(|s| s.parse().ok());
                    }
                }
                !l.starts_with("stall")
            }
            Ev::Eof(_) => true,
        }
    }

    fn pump(&mut self, until: Instant) -> bool {
        match self.kids.pump(until) {
            Some(ev) => self.on_event(ev),
            None => false,
        }
    }

    fn dead(&self, i: usize) -> bool {
        !self.kids.alive(i)
    }

    fn hang(&mut self, i: usize, why: &str) {
        let k = &self.kids.v[i];
        let msg = format!(
            "{} {why} (last line {:?}; threads {})",
            k.role,
            self.kids.last_line(i),
            where_is(k.pid)
        );
        self.failures.push((Kind::Hang, msg));
        self.hung = true;
    }

    /// Slots of chain members that have died, as a command argument.
    fn dead_arg(&self) -> String {
        let d: Vec<String> = (0..3)
            .filter(|&i| self.dead(i))
            .map(|i| self.slots[i].to_string())
            .collect();
        if d.is_empty() {
            "-".into()
        } else {
            d.join(",")
        }
    }

    fn run(&mut self, out: &mut Outcome) {
        let t_start = Instant::now();
        let hang = hang_limit();
        for r in ROLES {
            self.kids.spawn(r, &self.plan.params);
        }
        if self.plan.hostile.is_some() {
            self.hostile = Some(self.kids.spawn("hostile", &self.plan.params));
            out.hostile = true;
        }
        let all: Vec<usize> = (0..self.kids.v.len()).collect();
        // Start-up: ids, then channels.
        let mut ids = Vec::new();
        for &i in &all {
            match self.kids.wait_line(i, "id ", 0, SETUP) {
                Some(l) => {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    ids.push(format!("{} {}", w[1], w[2]));
                    self.slots.push(
                        w[1].split('.')
                            .next()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(u16::MAX),
                    );
                }
                None => {
                    let role = self.kids.v[i].role;
                    if self.kids.alive(i) {
                        self.hang(i, "did not join its group");
                    }
                    self.failures
                        .push((Kind::Error, format!("{role}: no domain id at start-up")));
                    return;
                }
            }
        }
        let peers = format!("peers {}", ids.join(" "));
        for &i in &all {
            self.kids.tell(i, &peers);
        }
        for &i in &all {
            if self.kids.wait_line(i, "ready", 0, SETUP).is_none() {
                if self.kids.alive(i) {
                    self.hang(i, "did not connect its channels");
                }
                return;
            }
        }
        // The stream.
        let go_at = Instant::now();
        self.kids.tell(SOURCE, "go");
        if let Some(h) = self.hostile {
            self.kids.tell(h, "go");
        }
        let mut fired = matches!(self.plan.action, Action::None);
        let mut cont_at: Option<(usize, Instant)> = None;
        let mut last_progress = Instant::now();
        let mut death: Option<(usize, Instant)> = None;
        loop {
            let now = Instant::now();
            for i in 0..3 {
                if death.is_none() && self.dead(i) {
                    death = Some((i, self.kids.v[i].died_at.unwrap_or(now)));
                }
            }
            if (0..3).all(|i| self.dead(i) || self.eos[i]) {
                break;
            }
            if !fired {
                let (victim, moment) = match self.plan.action {
                    Action::Kill(v, m) | Action::Stop(v, m, _) => (v, m),
                    Action::None => unreachable!(),
                };
                let due = match moment {
                    Moment::Early(us) => now >= go_at + Duration::from_micros(us),
                    Moment::Mid(r) => self.got.len() as u64 >= r,
                    Moment::Holding(r) => self.long_held > 0 && self.got.len() as u64 >= r,
                } || self.eos[SINK]
                    || self.dead(SINK);
                if due {
                    fired = true;
                    if !self.dead(victim) {
                        match self.plan.action {
                            Action::Kill(..) if self.plan.reap_late => {
                                self.kids.kill_late(victim);
                                out.kills += 1;
                            }
                            Action::Kill(..) => {
                                self.kids.kill(victim);
                                out.kills += 1;
                            }
                            Action::Stop(_, _, ms) => {
                                self.kids.signal(victim, libc::SIGSTOP);
                                self.kids.v[victim].stopped = true;
                                cont_at = Some((victim, now + Duration::from_millis(ms)));
                                out.stops += 1;
                            }
                            Action::None => {}
                        }
                    }
                    continue;
                }
            }
            if let Some((v, at)) = cont_at {
                if now >= at {
                    self.kids.signal(v, libc::SIGCONT);
                    self.kids.v[v].stopped = false;
                    cont_at = None;
                    last_progress = now;
                }
            }
            if let Some((d, at)) = death {
                if now > at + hang {
                    for i in 0..3 {
                        if !self.dead(i) && !self.eos[i] {
                            let why = format!(
                                "did not end its stream within {hang:?} of the death of the {}",
                                ROLES[d]
                            );
                            self.hang(i, &why);
                        }
                    }
                    return;
                }
            } else if cont_at.is_none() && now > last_progress + hang {
                for i in 0..3 {
                    if !self.dead(i) && !self.eos[i] {
                        self.hang(i, &format!("made no progress for {hang:?}"));
                    }
                }
                return;
            }
            if now > t_start + TRIAL_CAP {
                for i in 0..3 {
                    if !self.dead(i) && !self.eos[i] {
                        self.hang(i, "still streaming at the trial's time cap");
                    }
                }
                return;
            }
            if self.pump(now + Duration::from_millis(10)) {
                last_progress = Instant::now();
            }
        }
        if let Some((v, _)) = cont_at.take() {
            self.kids.signal(v, libc::SIGCONT);
            self.kids.v[v].stopped = false;
        }
        // Let the source reuse everything it can, then have the sink look again.
        if !self.dead(SOURCE) {
            let from = self.kids.v[SOURCE].lines.len();
            self.kids.tell(SOURCE, "scribble");
            if self
                .kids
                .wait_line(SOURCE, "scribbled", from, hang)
                .is_none()
                && !self.dead(SOURCE)
            {
                self.hang(SOURCE, "did not scribble");
                return;
            }
        }
        for (i, cmd) in [(SINK, "reverify"), (STAGE, "finish"), (SOURCE, "finish")] {
            if self.dead(i) {
                continue;
            }
            let from = self.kids.v[i].lines.len();
            let c = format!("{cmd} {}", self.dead_arg());
            self.kids.tell(i, &c);
            // Twice the limit: a child first waits up to `hang` for its fbufs to come back,
            // and then reports whatever is still out as a leak.
            if self.kids.wait_line(i, "report", from, 2 * hang).is_none() && !self.dead(i) {
                self.hang(i, &format!("did not finish after '{c}'"));
                return;
            }
            if self.kids.reap(i, hang).is_none() {
                self.hang(i, "did not exit after its report");
                return;
            }
        }
        if let Some(h) = self.hostile {
            if self.kids.wait_line(h, "report", 0, 2 * hang).is_none() && !self.dead(h) {
                self.hang(h, "did not finish");
                return;
            }
            self.kids.reap(h, hang);
        }
    }

    /// Checks after the trial: sequence at the sink, refusals, the control block.
    fn judge(&mut self, group_path: &Path) {
        while let Ok(ev) = self.kids.rx.try_recv() {
            if let Ev::Line(i, l) = ev {
                self.kids.v[i].lines.push(l.clone());
                self.on_event(Ev::Line(i, l));
            }
        }
        let source_died = self.dead(SOURCE) && !self.kids.v[SOURCE].cleaned_up;
        let anyone_died = (0..3).any(|i| {
            self.kids.v[i].killed || {
                let s = self.kids.v[i].status;
                s.is_some_and(|s| !s.success())
            }
        });
        // Messages must arrive as 0, 1, 2, ...: a gap is a lost message, allowed only
        // for messages refused because their (dead) source's lot could not be mapped.
        let mut missing = Vec::new();
        let mut expect = 0u64;
        for &s in &self.got {
            if s > expect {
                missing.extend(expect..s);
            }
            expect = expect.max(s + 1);
        }
        let mut excused = if source_died { self.refused.len() } else { 0 };
        if self.lossy {
            // What the stage evicted never reaches the sink: a gap, but in order. A stage
            // that died did not say how many, so any gap is then excused.
            excused += self.evicted.map_or(usize::MAX / 2, |e| e as usize);
        }
        if missing.len() > excused {
            self.failures.push((
                Kind::Torn,
                format!(
                    "sink: messages {:?} never arrived ({} received, {} refused)",
                    &missing[..missing.len().min(8)],
                    self.got.len(),
                    self.refused.len()
                ),
            ));
        }
        if !anyone_died && !self.hung {
            if let Some(sent) = self.sent {
                let evicted = if self.lossy {
                    self.evicted.unwrap_or(0)
                } else {
                    0
                };
                if self.got.len() as u64 + evicted != sent {
                    self.failures.push((
                        Kind::Torn,
                        format!(
                            "sink: {} messages arrived (and {evicted} evicted) of {sent} \
                             sent, and nobody died",
                            self.got.len()
                        ),
                    ));
                }
            }
        }
        if !source_died && !self.refused.is_empty() {
            self.failures.push((
                Kind::Error,
                format!(
                    "sink refused {} messages from a live source, first: {}",
                    self.refused.len(),
                    self.refused[0]
                ),
            ));
        }
        let cleaned = self.kids.v.iter().any(|k| k.cleaned_up);
        let last_clean = self.kids.last_left_cleanly();
        for i in 0..self.kids.v.len() {
            if let Some(f) = self.kids.judge(i) {
                self.failures.push(f);
            }
        }
        // When the member that left last left by itself, the control block must be gone
        // (when the last one died, nobody was left to remove it).
        if !self.hung && !cleaned && last_clean {
            let t0 = Instant::now();
            while group_path.exists() && t0.elapsed() < Duration::from_millis(300) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if group_path.exists() {
                self.failures.push((
                    Kind::Leak,
                    format!(
                        "control block {} outlived every member{}",
                        group_path.display(),
                        if self.plan.reap_late {
                            " (the killed member was still a zombie when the others left)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
    }
}

fn chain_trial(seed: u64, out: &mut Outcome) {
    let mut rng = Rng::new(seed);
    let plan = chain_plan(&mut rng, seed);
    out.what = plan.what.clone();
    let group = plan
        .params
        .split_whitespace()
        .find_map(|w| w.strip_prefix("group="))
        .unwrap_or_default()
        .to_owned();
    let group_path = PathBuf::from(format!("/dev/shm/ferry.{group}"));
    let lossy = plan.params.contains(" lossy2=1");
    let mut run = ChainRun {
        kids: Kids::new(),
        plan,
        hostile: None,
        slots: Vec::new(),
        got: Vec::new(),
        long_held: 0,
        refused: Vec::new(),
        eos: [false; 3],
        lossy,
        evicted: None,
        sent: None,
        failures: Vec::new(),
        hung: false,
    };
    run.run(out);
    run.kids.kill_all();
    run.judge(&group_path);
    scan_lines(&run.kids, &mut run.failures);
    out.keep_lines(&run.kids);
    out.failures.append(&mut run.failures);
    let _ = std::fs::remove_file(&group_path);
}

// ---------------------------------------------------------------- harness: containers

fn container_trial(seed: u64, out: &mut Outcome) {
    let mut rng = Rng::new(seed);
    let dir = new_dir("ct", seed);
    let n = rng.range(5, 40);
    let victim = match rng.below(10) {
        0 => 0,
        1 => 2,
        _ => 1,
    };
    let moment = rng.below(3);
    let delay_us = rng.pick(&[0, 500, 3000]);
    let hold = rng.range(1, 4);
    let early_us = rng.below(5000);
    let names = ["csource", "cstage", "csink"];
    out.what = format!(
        "containers n={n} hold={hold} delay={delay_us}us kill {} {}",
        names[victim],
        ["early", "while holding", "with containers unreceived"][moment as usize]
    );
    let params = format!(
        "seed={seed} dir={} n={n} hold={hold} delay_us={delay_us}",
        dir.display()
    );
    let hang = hang_limit();
    let mut kids = Kids::new();
    let mut fails = Vec::new();
    // Order: the sink listens first, then the stage (which connects to it), then the
    // source (which connects to the stage).
    let mut order = Vec::new();
    for role in ["csink", "cstage", "csource"] {
        let i = kids.spawn(role, &params);
        order.push(i);
        if kids.wait_line(i, "ready", 0, SETUP).is_none() {
            fails.push((Kind::Error, format!("{role}: not ready")));
            kids.kill_all();
            scan_lines(&kids, &mut fails);
            out.failures.append(&mut fails);
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    }
    let (sink, stage, source) = (order[0], order[1], order[2]);
    let by_role = [source, stage, sink];
    let victim = by_role[victim];
    kids.tell(source, "go");
    let go_at = Instant::now();
    let count = |kids: &Kids, i: usize, p: &str| {
        kids.v[i].lines.iter().filter(|l| l.starts_with(p)).count()
    };
    let mut killed_at = None;
    let t0 = Instant::now();
    loop {
        let now = Instant::now();
        let eos = |kids: &Kids, i: usize| kids.v[i].lines.iter().any(|l| l.starts_with("eos"));
        if killed_at.is_none() {
            let due = match moment {
                0 => now >= go_at + Duration::from_micros(early_us),
                1 => count(&kids, stage, "holding") > 0,
                _ => count(&kids, source, "shipped") >= count(&kids, stage, "recv") + 2,
            } || eos(&kids, source);
            if due {
                kids.kill(victim);
                out.kills += 1;
                killed_at = Some(now);
            }
        }
        if by_role.iter().all(|&i| !kids.alive(i) || eos(&kids, i)) {
            break;
        }
        let limit = killed_at.map(|k| k + hang).unwrap_or(t0 + TRIAL_CAP);
        if now > limit {
            for &i in &by_role {
                if kids.alive(i) && !eos(&kids, i) {
                    fails.push((
                        Kind::Hang,
                        format!(
                            "{} did not end its stream within {hang:?} of the kill (last line \
                             {:?}; threads {})",
                            kids.v[i].role,
                            kids.last_line(i),
                            where_is(kids.v[i].pid)
                        ),
                    ));
                }
            }
            break;
        }
        kids.pump(now + Duration::from_millis(10));
    }
    let hung = !fails.is_empty();
    if !hung {
        for &i in &by_role {
            if kids.alive(i) {
                let from = kids.v[i].lines.len();
                kids.tell(i, "finish");
                if kids.wait_line(i, "report", from, hang).is_none() && kids.alive(i) {
                    fails.push((Kind::Hang, format!("{} did not report", kids.v[i].role)));
                }
                kids.reap(i, hang);
            }
        }
    }
    kids.kill_all();
    let stage_died = !kids.alive(stage) && kids.v[stage].killed;
    for l in &kids.v[sink].lines {
        if let Some(r) = l.strip_prefix("refused ") {
            if !stage_died {
                fails.push((
                    Kind::Error,
                    format!("csink refused a container from a live stage: {r}"),
                ));
            }
        }
    }
    out.close_trial(&mut kids, fails, &dir);
}

// --------------------------------------------------------------------- harness: uring

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in path");
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn uring_trial(seed: u64, out: &mut Outcome) {
    let mut rng = Rng::new(seed);
    let dir = new_dir("ur", seed);
    for f in ["a", "b", "c"] {
        mkfifo(&dir.join(f));
    }
    let fate_drop = rng.pct(30);
    let after_inflight = rng.pct(60);
    let delay_us = rng.below(20_000);
    out.what = format!(
        "uring victim {} {}",
        if fate_drop {
            "drops its ring"
        } else {
            "is killed"
        },
        if after_inflight {
            format!("{delay_us} us after its operations are in flight")
        } else {
            format!("{delay_us} us after go (maybe while submitting)")
        }
    );
    let hang = hang_limit();
    let mut kids = Kids::new();
    let mut fails = Vec::new();
    let base = format!("seed={seed} dir={}", dir.display());
    let peer = kids.spawn("upeer", &base);
    let ready = kids.wait_line(peer, "ready", 0, SETUP);
    let port = ready
        .as_deref()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("0")
        .to_owned();
    let victim = kids.spawn("uvictim", &format!("{base} port={port}"));
    let ok = ready.is_some() && kids.wait_line(victim, "opened", 0, SETUP).is_some() && {
        kids.tell(peer, "open");
        kids.wait_line(peer, "armed", 0, SETUP).is_some()
    };
    if ok {
        kids.tell(victim, if fate_drop { "go drop" } else { "go kill" });
        if after_inflight && kids.wait_line(victim, "inflight", 0, hang).is_none() {
            fails.push((
                Kind::Hang,
                format!("uvictim: no operations in flight after {hang:?}"),
            ));
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        if fate_drop {
            if let Some(f) = kids.report_or_hang(
                victim,
                hang + Duration::from_secs(6),
                "uvictim: dropping a ring with operations in flight did not return",
            ) {
                fails.push(f);
            }
            kids.reap(victim, hang);
        } else {
            kids.kill(victim);
            out.kills += 1;
        }
        if kids.alive(victim) {
            kids.kill_all();
        } else {
            kids.tell(peer, "check");
            if let Some(f) =
                kids.report_or_hang(peer, hang + Duration::from_secs(2), "upeer did not report")
            {
                fails.push(f);
            }
            kids.reap(peer, hang);
        }
    } else {
        fails.push((Kind::Error, "uring set-up failed".into()));
    }
    kids.kill_all();
    out.close_trial(&mut kids, fails, &dir);
}

// ---------------------------------------------------------------------------- main

#[derive(Copy, Clone, PartialEq, Eq)]
enum Section {
    Chain,
    Containers,
    Uring,
}

fn main() {
    if let Ok(role) = std::env::var("FERRY_TEST_ROLE") {
        match role.as_str() {
            "source" | "stage" | "sink" | "hostile" => chain_child(&role),
            "csource" | "cstage" | "csink" => container_child(&role),
            "upeer" | "uvictim" => uring_child(&role),
            _ => die(format!("unknown role {role}")),
        }
        return;
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut sections = Vec::new();
    for (name, s) in [
        ("chain", Section::Chain),
        ("containers", Section::Containers),
        ("uring", Section::Uring),
    ] {
        if filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())) {
            sections.push(s);
        }
    }
    if sections.contains(&Section::Uring) && !Features::probe().ring {
        println!(
            "torture: uring section skipped: {}",
            Features::probe().why_not.clone().unwrap_or_default()
        );
        sections.retain(|&s| s != Section::Uring);
    }
    if sections.is_empty() {
        println!("torture: no section matches {filter:?}");
        return;
    }
    let secs = env_f64("FERRY_TORTURE_SECS", 60.0);
    let max_trials: u64 = std::env::var("FERRY_TORTURE_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let seed: u64 = std::env::var("FERRY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!(
        "torture: seed {seed}; up to {secs} s{}; rerun one trial with \
         FERRY_TEST_SEED=<its seed> FERRY_TORTURE_TRIALS=1",
        if max_trials < u64::MAX {
            format!(" or {max_trials} trials")
        } else {
            String::new()
        }
    );
    let verbose = std::env::var("FERRY_TORTURE_VERBOSE").is_ok_and(|v| v == "1");
    let start = Instant::now();
    let mut master = Rng::new(seed);
    let (mut trials, mut kills, mut stops, mut hostile) = (0u64, 0u64, 0u64, 0u64);
    let mut counts = [0u64; 5];
    let mut failures: Vec<(Kind, u64, String, String)> = Vec::new();
    while trials < max_trials && start.elapsed().as_secs_f64() < secs {
        let tseed = if trials == 0 {
            seed
        } else {
            master.next() >> 1
        };
        let mut pick = Rng::new(tseed ^ 0x5ec7_10a5);
        let r = pick.below(8);
        let wanted = match r {
            0 => Section::Containers,
            1 => Section::Uring,
            _ => Section::Chain,
        };
        let section = if sections.contains(&wanted) {
            wanted
        } else {
            sections[pick.below(sections.len() as u64) as usize]
        };
        let mut out = Outcome::default();
        let t0 = Instant::now();
        match section {
            Section::Chain => chain_trial(tseed, &mut out),
            Section::Containers => container_trial(tseed, &mut out),
            Section::Uring => uring_trial(tseed, &mut out),
        }
        trials += 1;
        kills += out.kills as u64;
        stops += out.stops as u64;
        hostile += out.hostile as u64;
        let mut kinds: Vec<Kind> = out.failures.iter().map(|f| f.0).collect();
        kinds.sort();
        kinds.dedup();
        for &k in &kinds {
            counts[k as usize] += 1;
        }
        let verdict = if kinds.is_empty() {
            "ok".to_owned()
        } else {
            let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            format!("FAILED ({})", names.join(", "))
        };
        println!(
            "trial {trials} seed {tseed}: {} ... {verdict} ({:.1} s)",
            out.what,
            t0.elapsed().as_secs_f64()
        );
        if verbose {
            for l in &out.lines {
                println!("    | {l}");
            }
        }
        for (k, msg) in out.failures {
            println!("    {}: {msg}", k.name());
            failures.push((k, tseed, out.what.clone(), msg));
        }
    }
    println!();
    if !failures.is_empty() {
        // The same bug fails many trials: group messages with their numbers blanked.
        let mut sigs: Vec<(String, u64)> = Vec::new();
        for (k, _, _, msg) in &failures {
            let msg = msg.split("; threads").next().unwrap_or(msg);
            let words: Vec<&str> = msg
                .split_whitespace()
                .map(|w| {
                    if w.chars().any(|c| c.is_ascii_digit()) {
                        "N"
                    } else {
                        w
                    }
                })
                .collect();
            let sig = format!("[{}] {}", k.name(), words.join(" "));
            match sigs.iter_mut().find(|(s, _)| *s == sig) {
                Some((_, n)) => *n += 1,
                None => sigs.push((sig, 1)),
            }
        }
        sigs.sort_by_key(|s| std::cmp::Reverse(s.1));
        println!("failures by message (words with digits blanked):");
        for (sig, n) in &sigs {
            println!("  {n:5}  {sig}");
        }
        println!();
        println!("first failures of each kind:");
        for k in Kind::ALL {
            for (_, tseed, what, msg) in failures.iter().filter(|f| f.0 == k).take(3) {
                println!("  [{}] seed {tseed} ({what}): {msg}", k.name());
            }
        }
        println!();
    }
    let mut line = String::new();
    let _ = write!(
        line,
        "torture: {trials} trials ({kills} kills, {stops} stops, {hostile} hostile): "
    );
    let parts: Vec<String> = [
        (Kind::Torn, "torn"),
        (Kind::Hang, "hangs"),
        (Kind::Crash, "crashes"),
        (Kind::Leak, "leaks"),
        (Kind::Error, "errors"),
    ]
    .iter()
    .map(|(k, n)| format!("{n} {}", counts[*k as usize]))
    .collect();
    line.push_str(&parts.join(", "));
    println!("{line}");
    println!("torture: seed {seed}");
    if counts.iter().any(|&c| c > 0) {
        std::process::exit(1);
    }
}
