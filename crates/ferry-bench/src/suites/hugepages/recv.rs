//! The receiving process of `ferry-bench hugepages` (`ferry-bench __huge`): joins the
//! ordinary group (and the hugetlb one), accepts the sender's channels, opens the
//! iceoryx2 subscriber, then serves the blocks the sender announces: for each message,
//! takes it, reads every byte, stamps, drops it and acknowledges. Prints one line per
//! block: its minor page faults, then the one-way times in ns.

use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{Sys, ACK, BLOCK, CTL, FAILED, LINES, READY, RX_ID_A};
use super::{RX_ID_B, STOP, SYSTEMS, WARM};
use crate::harness::chain::touch::read_all;
use crate::harness::probe::minor_faults;
use crate::suites::handover::ice;
use crate::sys::{self, now_ns, SharedLines};

/// `ferry-bench __huge GROUP_A GROUP_B|- CPU LINES ICE_SERVICE|-`.
pub fn main(args: &[String]) -> Result<()> {
    let [ga, gb, cpu, lines, ice_name] = args else {
        bail!("usage: ferry-bench __huge GROUP_A GROUP_B|- CPU LINES ICE_SERVICE|-");
    };
    let _ = sys::pin_to(cpu.parse()?);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(lines)
        .context("the shared lines file")?;
    let l = SharedLines::map(&file, LINES)?;
    let out = serve(&l, ga, gb, ice_name);
    if out.is_err() {
        l.word(CTL, FAILED).store(1, Release);
    }
    out
}

fn pack(id: ferry::DomainId) -> u64 {
    ((id.slot as u64) << 32 | id.generation as u64) + 1
}

fn spin(l: &SharedLines, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    let mut i = 0u32;
    while !done()? {
        i = i.wrapping_add(1);
        if i % 65536 == 0 && start.elapsed() > Duration::from_secs(60) {
            bail!("waited 60 s for {what}");
        }
        std::hint::spin_loop();
    }
    let _ = l;
    Ok(())
}

fn serve(l: &SharedLines, ga: &str, gb: &str, ice_name: &str) -> Result<()> {
    let t = Duration::from_secs(30);
    let group_a = ferry::Group::open(ga)?;
    let a = group_a.join()?;
    l.word(CTL, RX_ID_A).store(pack(a.id()), Release);
    let mut rx_a = a.accept(t)?;
    let mut hb = None;
    if gb != "-" {
        let g = ferry::Group::open(gb)?;
        let b = g.join()?;
        l.word(CTL, RX_ID_B).store(pack(b.id()), Release);
        let rx = b.accept(t)?;
        hb = Some((g, b, rx));
    }
    let ice = if ice_name != "-" {
        Some(ice::Rx::open(ice_name)?)
    } else {
        None
    };
    l.word(CTL, READY).store(1, Release);
    let mut last = 0u64;
    let mut out = String::new();
    loop {
        spin(l, "the next block", || {
            Ok(l.word(BLOCK, 0).load(Acquire) != last)
        })?;
        last = l.word(BLOCK, 0).load(Acquire);
        if last == STOP {
            break;
        }
        let sys = SYSTEMS[l.word(BLOCK, 1).load(Acquire) as usize];
        let size = l.word(BLOCK, 2).load(Acquire) as usize;
        let n = l.word(BLOCK, 3).load(Acquire);
        let mut f0 = 0;
        let mut ns = Vec::with_capacity(n as usize);
        for k in 0..n {
            // The sender's untimed messages come first.
            if k == WARM {
                f0 = minor_faults();
            }
            let (seq, t0, t1) = match sys {
                Sys::Iceoryx2 => ice
                    .as_ref()
                    .context("iceoryx2 scheduled")?
                    .recv_full(size, &mut || Ok(()))?,
                Sys::FerryHuge => {
                    let rx = &mut hb.as_mut().context("hugetlb scheduled")?.2;
                    recv_ferry(rx, size)?
                }
                _ => recv_ferry(&mut rx_a, size)?,
            };
            ns.push(t1.saturating_sub(t0));
            // SYNC: pairs with the sender's Acquire load; the message is dropped.
            l.word(ACK, 0).store(seq, Release);
        }
        let faults = minor_faults() - f0;
        out.push_str(&faults.to_string());
        for v in ns {
            out.push(' ');
            out.push_str(&v.to_string());
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// Takes the next message, reads all of it, stamps; returns (sequence, t0, t1).
fn recv_ferry(rx: &mut ferry::Receiver, size: usize) -> Result<(u64, u64, u64)> {
    let d = loop {
        if let Some(d) = rx.try_recv()? {
            break d;
        }
        std::hint::spin_loop();
    };
    let first = d.fragments().first().context("an empty message")?;
    let s = first.as_slice();
    if d.len() != size || s.len() != size {
        bail!("expected one run of {size} bytes, got {}", d.len());
    }
    std::hint::black_box(read_all(s));
    let seq = u64::from_ne_bytes(s[0..8].try_into()?);
    let t0 = u64::from_ne_bytes(s[8..16].try_into()?);
    if s[size - 1] != seq as u8 {
        bail!(
            "message {seq}: last byte {} is not {}",
            s[size - 1],
            seq as u8
        );
    }
    let t1 = now_ns();
    Ok((seq, t0, t1))
}
