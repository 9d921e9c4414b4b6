//! `ferry-bench hugepages`: the hand-over of large frames written whole and read whole,
//! 2 – 64 MiB, from fbufs of 4 KiB pages, of transparent huge pages and of hugetlb pages,
//! and through iceoryx2, in one run with interleaved rounds.
//!
//! Two pinned processes: this one sends, `ferry-bench __huge` ([`recv`]) receives. For
//! every message, whatever the system: the sender takes a buffer (an fbuf loaned from the
//! size's path of that kind, or iceoryx2's loaned slice), reads `CLOCK_MONOTONIC` (`t0`),
//! writes every byte of the frame, writes the header (sequence number and `t0`) and hands
//! it over; the receiver, busy-polling, takes it, reads every byte (summing its words),
//! reads the clock (`t1`) and records `t1 - t0`, drops the message and acknowledges
//! through a shared cache line; the sender waits for that before the next message. So
//! the time is what a camera frame costs from the first byte written to the last byte
//! read, and the page size shows in the TLB misses of both loops: a 16 MiB frame is 4096
//! pages of 4 KiB (each a TLB miss in the writer and again in the reader, more than the
//! second-level TLB holds) and 8 pages of 2 MiB.
//!
//! The hugetlb lots need huge pages reserved: run as root, the suite sets
//! `vm.nr_hugepages` to what its two lots need for the run and puts the old value back;
//! otherwise that column says why it is missing. Minor page faults (`getrusage`) are
//! counted per message on both sides.

pub mod recv;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry::{Domain, Group, GroupConfig, Pages, PathAllocator, PathConfig, Sender};

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, num, ratio, BenchOutput, Table};
use crate::harness::probe::minor_faults;
use crate::harness::record::Record;
use crate::harness::stats::{median, Summary};
use crate::harness::BenchDef;
use crate::suites::handover::ice;
use crate::sys::{now_ns, LinesFile, SharedLines};

pub const BENCH: BenchDef = BenchDef {
    name: "hugepages",
    about:
        "frames written and read whole, 2-64 MiB: fbufs of 4 KiB, THP and hugetlb pages vs iceoryx2",
    run,
};

/// The systems, by their index on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sys {
    Ferry4k,
    FerryThp,
    FerryHuge,
    Iceoryx2,
}

pub const SYSTEMS: [Sys; 4] = [Sys::Ferry4k, Sys::FerryThp, Sys::FerryHuge, Sys::Iceoryx2];

impl Sys {
    pub fn name(self) -> &'static str {
        match self {
            Sys::Ferry4k => "ferry 4k",
            Sys::FerryThp => "ferry thp",
            Sys::FerryHuge => "ferry hugetlb",
            Sys::Iceoryx2 => "iceoryx2",
        }
    }
    fn index(self) -> u64 {
        SYSTEMS.iter().position(|&s| s == self).expect("listed") as u64
    }
}

/// Lines of the shared file and their words.
pub const LINES: usize = 4;
/// The block the sender announces: (block number, system, size, messages).
pub const BLOCK: usize = 0;
pub const ACK: usize = 1;
pub const CTL: usize = 2;
/// Control words: the receiver's domain ids (packed, plus one), ready, failed.
pub const RX_ID_A: usize = 0;
pub const RX_ID_B: usize = 1;
pub const READY: usize = 2;
pub const FAILED: usize = 3;
/// Untimed messages at the start of every block.
pub const WARM: u64 = 2;
/// The last block: the receiver prints its samples and exits.
pub const STOP: u64 = u64::MAX;

const SIZES: [usize; 4] = [2 << 20, 4 << 20, 16 << 20, 64 << 20];
/// Each member's hugetlb lot: two fbufs of every size, and room for the channel's own.
const HUGE_LOT: usize = 256 << 20;
const POOL: &str = "/proc/sys/vm/nr_hugepages";

/// `vm.nr_hugepages`, put back when dropped if we changed it.
struct Pool {
    old: Option<String>,
}

impl Pool {
    /// Makes sure `need` huge pages are free, or says why not.
    fn reserve(need: u64) -> std::result::Result<Pool, String> {
        let free = ferry_free_huge();
        if free >= need {
            return Ok(Pool { old: None });
        }
        let old = std::fs::read_to_string(POOL).map_err(|e| format!("{POOL}: {e}"))?;
        let total: u64 = old.trim().parse().unwrap_or(0);
        let pool = Pool {
            old: Some(old.trim().to_owned()),
        };
        std::fs::write(POOL, (total + need - free).to_string())
            .map_err(|e| format!("setting {POOL} needs root ({e})"))?;
        let now = ferry_free_huge();
        if now < need {
            return Err(format!(
                "the kernel made only {now} of {need} huge pages free"
            ));
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(POOL, old);
        }
    }
}

fn ferry_free_huge() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// What one (round, system, size) block measured.
pub struct Block {
    pub round: u32,
    pub sys: Sys,
    pub size: usize,
    /// One-way, first byte written to last byte read, µs.
    pub us: Vec<f64>,
    pub tx_faults: u64,
    pub rx_faults: u64,
}

/// The receiver process, killed if still running when dropped.
struct Child(Option<std::process::Child>);

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spin(l: &SharedLines, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    let mut i = 0u32;
    while !done() {
        i = i.wrapping_add(1);
        if i % 4096 == 0 {
            if l.word(CTL, FAILED).load(Acquire) != 0 {
                bail!("the receiver failed while we waited for {what}");
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("waited 60 s for {what}");
            }
        }
        std::hint::spin_loop();
    }
    Ok(())
}

fn unpack(v: u64) -> ferry::DomainId {
    let v = v - 1;
    ferry::DomainId {
        slot: (v >> 32) as u16,
        generation: v as u32,
    }
}

/// The sender's ferry side: a channel and three paths per size (4 KiB and THP in the
/// ordinary group, hugetlb in the hugetlb group).
struct FerryTx {
    _a: Domain,
    _b: Option<Domain>,
    tx_a: Sender,
    tx_b: Option<Sender>,
    paths: Vec<(Sys, usize, PathAllocator)>,
}

impl FerryTx {
    fn send(&self, sys: Sys, size: usize, seq: u64) -> Result<()> {
        let (_, _, path) = self
            .paths
            .iter()
            .find(|(s, z, _)| *s == sys && *z == size)
            .context("a path for every system and size")?;
        let tx = match sys {
            Sys::FerryHuge => self.tx_b.as_ref().context("hugetlb scheduled")?,
            _ => &self.tx_a,
        };
        let m = loop {
            match path.alloc(size) {
                Ok(m) => break m,
                Err(ferry::Error::QuotaExceeded { .. }) => std::hint::spin_loop(),
                Err(e) => return Err(e.into()),
            }
        };
        // One message is out at a time (the receiver acknowledges each): the ring has room.
        let mut loan = tx.loan(m)?;
        let s = loan.as_mut_slice().context("an fbuf is one run")?;
        let t0 = now_ns();
        s.fill(seq as u8);
        s[0..8].copy_from_slice(&seq.to_ne_bytes());
        s[8..16].copy_from_slice(&t0.to_ne_bytes());
        loan.send()?;
        Ok(())
    }
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let rounds = ctx.pick(3, 10);
    let msgs = |s: usize| -> u32 {
        match s {
            s if s >= 64 << 20 => ctx.pick(6, 30),
            s if s >= 16 << 20 => ctx.pick(12, 60),
            _ => ctx.pick(30, 200),
        }
    };
    let warm = WARM as u32;
    let pid = std::process::id();
    ctx.progress.phase("hugepages: setting up");
    // Two hugetlb lots (ours and the receiver's), and a few pages to spare.
    let need = 2 * (HUGE_LOT >> 21) as u64 + 4;
    let pool = Pool::reserve(need);
    let name_a = format!("bench-huge-a-{pid}");
    let name_b = format!("bench-huge-b-{pid}");
    let ga = Group::open(&name_a)?;
    let a = ga.join()?;
    let (gb, b, huge_why) = match &pool {
        Ok(_) => {
            let gb = Group::open_with(
                &name_b,
                GroupConfig {
                    lot_size: HUGE_LOT,
                    pages: Pages::HugeTlb,
                    ..GroupConfig::default()
                },
            )?;
            match gb.join() {
                Ok(b) => (Some(gb), Some(b), None),
                Err(e) => (None, None, Some(e.to_string())),
            }
        }
        Err(why) => (None, None, Some(why.clone())),
    };
    let ice_name = format!("ferry-bench-hugepages-{pid}");
    let ice_ok = ice::probe(&format!("{ice_name}-probe")).map_err(|e| format!("{e:#}"));
    let lines = LinesFile::create(&format!("hugepages-{}", std::process::id()), LINES)?;
    let l = &lines.lines;
    let mut child = Child(Some(
        std::process::Command::new(std::env::current_exe()?)
            .arg("__huge")
            .arg(&name_a)
            .arg(if b.is_some() { name_b.as_str() } else { "-" })
            .arg(ctx.cpu(1).to_string())
            .arg(&lines.path)
            .arg(if ice_ok.is_ok() {
                ice_name.as_str()
            } else {
                "-"
            })
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("spawning the receiver")?,
    ));
    let _ = crate::sys::pin_to(ctx.cpu(0));
    let mut ice_tx = match &ice_ok {
        Ok(()) => Some(ice::Tx::open(&ice_name, 64 << 20)?),
        Err(_) => None,
    };
    spin(l, "the receiver's domain", || {
        l.word(CTL, RX_ID_A).load(Acquire) != 0
    })?;
    let tx_a = a.connect(
        unpack(l.word(CTL, RX_ID_A).load(Acquire)),
        Duration::from_secs(30),
    )?;
    let tx_b = match &b {
        Some(b) => {
            spin(l, "the receiver's hugetlb domain", || {
                l.word(CTL, RX_ID_B).load(Acquire) != 0
            })?;
            Some(b.connect(
                unpack(l.word(CTL, RX_ID_B).load(Acquire)),
                Duration::from_secs(30),
            )?)
        }
        None => None,
    };
    spin(l, "the receiver to be ready", || {
        l.word(CTL, READY).load(Acquire) != 0
    })?;
    let mut paths = Vec::new();
    for &size in &SIZES {
        let cfg = |pages| PathConfig {
            quota: 2 * size,
            pages,
            ..PathConfig::default()
        };
        paths.push((Sys::Ferry4k, size, a.path(cfg(Some(Pages::Normal)))?));
        paths.push((Sys::FerryThp, size, a.path(cfg(Some(Pages::Transparent)))?));
        if let Some(b) = &b {
            paths.push((Sys::FerryHuge, size, b.path(cfg(None))?));
        }
    }
    let ferry = FerryTx {
        _a: a,
        _b: b,
        tx_a,
        tx_b,
        paths,
    };
    let systems: Vec<Sys> = SYSTEMS
        .iter()
        .copied()
        .filter(|&s| match s {
            Sys::FerryHuge => ferry.tx_b.is_some(),
            Sys::Iceoryx2 => ice_tx.is_some(),
            _ => true,
        })
        .collect();
    ctx.progress.phase(&format!(
        "hugepages: {} systems, {rounds} interleaved rounds",
        systems.len()
    ));
    let mut blocks = Vec::new();
    let mut seq = 0u64;
    let mut block = 0u64;
    for round in 0..rounds {
        for &size in &SIZES {
            let k = round as usize % systems.len();
            for &sys in systems[k..].iter().chain(&systems[..k]) {
                let n = warm + msgs(size);
                block += 1;
                l.word(BLOCK, 1).store(sys.index(), Relaxed);
                l.word(BLOCK, 2).store(size as u64, Relaxed);
                l.word(BLOCK, 3).store(n as u64, Relaxed);
                // SYNC: pairs with the receiver's Acquire load of the block number.
                l.word(BLOCK, 0).store(block, Release);
                let mut f0 = 0;
                for k in 0..n {
                    if k == warm {
                        f0 = minor_faults();
                    }
                    seq += 1;
                    match sys {
                        Sys::Iceoryx2 => {
                            ice_tx
                                .as_mut()
                                .expect("scheduled only when open")
                                .send_full(size, seq)?;
                        }
                        _ => ferry.send(sys, size, seq)?,
                    }
                    spin(l, "an acknowledgement", || {
                        l.word(ACK, 0).load(Acquire) == seq
                    })?;
                }
                blocks.push(Block {
                    round,
                    sys,
                    size,
                    us: Vec::new(),
                    tx_faults: minor_faults() - f0,
                    rx_faults: 0,
                });
            }
        }
    }
    l.word(BLOCK, 0).store(STOP, Release);
    let out = child.0.take().expect("spawned above").wait_with_output()?;
    if !out.status.success() {
        bail!("the receiver failed: {}", out.status);
    }
    // The receiver's lines: one per block, in order: faults, then the one-way ns.
    let text = String::from_utf8(out.stdout)?;
    let mut got = text.lines();
    for bl in &mut blocks {
        let line = got.next().context("a line per block from the receiver")?;
        let mut it = line.split_whitespace().map(|v| v.parse::<u64>());
        bl.rx_faults = it.next().context("faults")??;
        let v: Vec<u64> = it.collect::<std::result::Result<_, _>>()?;
        bl.us = v
            .into_iter()
            .skip(warm as usize)
            .map(|ns| ns as f64 / 1000.0)
            .collect();
    }
    drop((ferry, ice_tx, gb, ga, pool));
    Ok(report(
        ctx,
        &blocks,
        rounds,
        warm,
        &systems,
        huge_why,
        ice_ok.err(),
    ))
}

fn report(
    ctx: &BenchCtx,
    blocks: &[Block],
    rounds: u32,
    warm: u32,
    systems: &[Sys],
    huge_why: Option<String>,
    ice_why: Option<String>,
) -> BenchOutput {
    let mut out = BenchOutput::default();
    let all = |sys: Sys, size: usize| -> Vec<f64> {
        blocks
            .iter()
            .filter(|b| b.sys == sys && b.size == size)
            .flat_map(|b| b.us.iter().copied())
            .collect()
    };
    // Median over rounds of the per-round ratio of medians.
    let per_round = |x: Sys, y: Sys, size: usize| -> f64 {
        let med = |s: Sys, r: u32| {
            let v: Vec<f64> = blocks
                .iter()
                .filter(|b| b.sys == s && b.size == size && b.round == r)
                .flat_map(|b| b.us.iter().copied())
                .collect();
            median(&v)
        };
        let v: Vec<f64> = (0..rounds)
            .map(|r| med(x, r) / med(y, r))
            .filter(|v| v.is_finite())
            .collect();
        median(&v)
    };
    let faults = |sys: Sys, size: usize| -> (f64, f64) {
        let bs: Vec<&Block> = blocks
            .iter()
            .filter(|b| b.sys == sys && b.size == size)
            .collect();
        let n: f64 = bs.iter().map(|b| b.us.len() as f64).sum();
        let tx: u64 = bs.iter().map(|b| b.tx_faults).sum();
        let rx: u64 = bs.iter().map(|b| b.rx_faults).sum();
        (tx as f64 / n, rx as f64 / n)
    };
    let mut md = String::from(
        "## Huge pages: frames written and read whole\n\n\
         One-way time from the sender's first byte written to the receiver's last byte read, \
         µs (median / p99), and minor page faults per timed message (sender, receiver).\n\n",
    );
    let mut headers = vec!["size".to_string()];
    for s in systems {
        headers.push(format!("{} med / p99", s.name()));
    }
    for s in systems {
        headers.push(format!("{} faults tx/rx", s.name()));
    }
    let mut t = Table::new(&headers);
    for &size in &SIZES {
        let mut row = vec![bytes(size)];
        for &s in systems {
            let sum = Summary::of(&all(s, size));
            row.push(format!("{} / {}", num(sum.median), num(sum.p99)));
            out.records.push(
                Record::new("hugepages", s.name(), "µs", sum, rounds, 0.0)
                    .param("system", s.name())
                    .param("bytes", size)
                    .param("measure", "first byte written to last byte read"),
            );
        }
        for &s in systems {
            let (tx, rx) = faults(s, size);
            row.push(format!("{tx:.2} / {rx:.2}"));
        }
        t.row(row);
    }
    md.push_str(&t.render());
    md.push_str(
        "\nRatios (median over rounds of the per-round ratio of medians; below 1 is faster):\n\n",
    );
    let pairs: Vec<(Sys, Sys)> = [
        (Sys::FerryThp, Sys::Ferry4k),
        (Sys::FerryHuge, Sys::Ferry4k),
        (Sys::Ferry4k, Sys::Iceoryx2),
        (Sys::FerryThp, Sys::Iceoryx2),
        (Sys::FerryHuge, Sys::Iceoryx2),
    ]
    .into_iter()
    .filter(|(x, y)| systems.contains(x) && systems.contains(y))
    .collect();
    let mut headers = vec!["size".to_string()];
    headers.extend(
        pairs
            .iter()
            .map(|(x, y)| format!("{} / {}", x.name(), y.name())),
    );
    let mut t = Table::new(&headers);
    for &size in &SIZES {
        let mut row = vec![bytes(size)];
        row.extend(pairs.iter().map(|&(x, y)| ratio(per_round(x, y, size))));
        t.row(row);
    }
    md.push_str(&t.render());
    if let Some(why) = huge_why {
        md.push_str(&format!("\nNo hugetlb column: {why}.\n"));
    }
    if let Some(why) = ice_why {
        md.push_str(&format!("\nNo iceoryx2 column: {why}.\n"));
    }
    md.push_str(&format!(
        "\n{rounds} rounds{}, {warm} untimed messages before each block; systems rotated \
         each round.\n",
        if ctx.quick { " (quick)" } else { "" }
    ));
    out.markdown = md;
    out
}
