//! The subscriber process of `ferry-bench services` (`ferry-bench __drain`): N ferry
//! subscribers and N iceoryx2 subscribers in one process pinned to the other CPU,
//! busy-polled in turn. Each message's header is read (sequence number, burst), checked
//! to be the next of its subscriber, and the message dropped at once, so releases flow
//! back as in a real consumer. Once every subscriber of a system has the last message of
//! a burst, the process stamps `CLOCK_MONOTONIC` into the shared "done" line: the burst's
//! time to the last subscriber. It polls only the subscribers of the system whose bursts
//! run now (the publisher says which). On request it answers the cache-line probe: one
//! line bounced between the two processes, in a tight loop of its own.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::ice;
use crate::sys::{self, now_ns, SharedLines};

/// Lines of the shared file: control, the probe's ping and pong, the done line.
pub const LINES: usize = 4;
pub const CTL: usize = 0;
pub const PING: usize = 1;
pub const PONG: usize = 2;
pub const DONE: usize = 3;
/// Words of the control line.
pub const READY: usize = 0;
pub const STOP: usize = 1;
pub const FAILED: usize = 2;
/// The control line's word naming the system whose bursts run now: the subscriber
/// process polls only that system's subscribers, so that a burst's time holds its own
/// system's receives and no empty polls of the other's (an empty iceoryx2 receive costs
/// several times an empty ferry one).
pub const ACTIVE: usize = 3;
/// Values of [`ACTIVE`] (0, before the first burst: both systems): ferry's subscribers
/// only, iceoryx2's only.
pub const ACTIVE_FERRY: u64 = 1;
pub const ACTIVE_ICE: u64 = 2;
/// The ping line's second word: non-zero while the probe runs.
pub const PROBING: usize = 1;

/// The header every message starts with: its sequence number (per system, from 0) and
/// its burst (`burst << 1 | last`).
pub fn write_header(s: &mut [u8], seq: u64, burst: u64, last: bool) {
    s[0..8].copy_from_slice(&seq.to_ne_bytes());
    s[8..16].copy_from_slice(&(burst << 1 | last as u64).to_ne_bytes());
}

fn read_header(s: &[u8]) -> Result<(u64, u64, bool)> {
    if s.len() < 16 {
        bail!("a message of {} bytes has no header", s.len());
    }
    let w = |i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    Ok((w(0), w(8) >> 1, w(8) & 1 != 0))
}

/// One system's subscribers' progress.
struct Progress {
    next: Vec<u64>,
    /// The last burst whose last message each subscriber has.
    done: Vec<u64>,
}

impl Progress {
    fn new(n: usize) -> Progress {
        Progress {
            next: vec![0; n],
            done: vec![0; n],
        }
    }

    fn got(&mut self, i: usize, head: &[u8], lines: &SharedLines, who: &str) -> Result<()> {
        let (seq, burst, last) = read_header(head)?;
        if seq != self.next[i] {
            bail!(
                "{who} subscriber {i}: expected message {}, got {seq}",
                self.next[i]
            );
        }
        self.next[i] += 1;
        if last {
            self.done[i] = burst;
            if self.done.iter().all(|&b| b == burst) {
                lines.word(DONE, 1).store(now_ns(), Relaxed);
                // SYNC: pairs with the publisher's Acquire load; the stamp is visible with it.
                lines.word(DONE, 0).store(burst, Release);
            }
        }
        Ok(())
    }
}

/// `ferry-bench __drain GROUP SERVICE N CPU [LINES ICE_SERVICE PUBLISHERS DEPTH]`.
/// Without the last four: ferry's subscribers only, drained until the publisher goes.
pub fn main(args: &[String]) -> Result<()> {
    let (group, service, n, cpu, rest) = match args {
        [g, s, n, c, rest @ ..] if rest.is_empty() || rest.len() == 4 => (g, s, n, c, rest),
        _ => bail!(
            "usage: ferry-bench __drain GROUP SERVICE N CPU [LINES ICE_SERVICE PUBLISHERS DEPTH]"
        ),
    };
    let _ = sys::pin_to(cpu.parse()?);
    let n: usize = n.parse()?;
    let group = ferry::Group::open(group)?;
    let mut subs = Vec::new();
    for _ in 0..n {
        let d = group.join()?;
        let s = ferry::Subscriber::open(&d, service, Duration::from_secs(30))?;
        subs.push((d, s));
    }
    let [lines, ice_service, publishers, depth] = rest else {
        return drain_only(&mut subs);
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(lines)
        .context("the shared lines file")?;
    let lines = SharedLines::map(&file, LINES)?;
    let out = serve(
        &mut subs,
        &lines,
        ice_service,
        publishers.parse()?,
        depth.parse()?,
    );
    if out.is_err() {
        lines.word(CTL, FAILED).store(1, Release);
    }
    out
}

fn serve(
    subs: &mut [(ferry::Domain, ferry::Subscriber)],
    lines: &SharedLines,
    ice_service: &str,
    publishers: usize,
    depth: usize,
) -> Result<()> {
    let n = subs.len();
    let ice = ice::Subs::open(ice_service, n, publishers, depth)?;
    lines.word(CTL, READY).store(1, Release);
    let mut ferry_p = Progress::new(n);
    let mut ice_p = Progress::new(n);
    let mut last_ping = 0;
    loop {
        if lines.word(PING, PROBING).load(Acquire) != 0 {
            // The probe: nothing else until it ends.
            while lines.word(PING, PROBING).load(Acquire) != 0 {
                let v = lines.word(PING, 0).load(Acquire);
                if v != last_ping {
                    last_ping = v;
                    lines.word(PONG, 0).store(v, Release);
                }
                std::hint::spin_loop();
            }
        }
        if lines.word(CTL, STOP).load(Acquire) != 0 {
            return Ok(());
        }
        // The publisher switches systems only between bursts, once every message of the
        // last one was taken: a stale view costs one more turn, never a message.
        let active = lines.word(CTL, ACTIVE).load(Relaxed);
        for (i, (_, s)) in subs.iter_mut().enumerate() {
            if active == ACTIVE_ICE {
                break;
            }
            match s.try_recv() {
                Ok(Some(d)) => {
                    let first = d.fragments().first().context("an empty ferry message")?;
                    ferry_p.got(i, first.as_slice(), lines, "ferry")?;
                }
                Ok(None) => {}
                Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        for (i, s) in ice.subs.iter().enumerate() {
            if active == ACTIVE_FERRY {
                break;
            }
            match s.receive() {
                Ok(Some(m)) => ice_p.got(i, m.payload(), lines, "iceoryx2")?,
                Ok(None) => {}
                Err(e) => bail!("iceoryx2 receive: {e:?}"),
            }
        }
    }
}

/// Drops every message until the publisher goes (the drop-policy measurement).
fn drain_only(subs: &mut [(ferry::Domain, ferry::Subscriber)]) -> Result<()> {
    let mut open = subs.len();
    while open > 0 {
        open = 0;
        for (_, s) in subs.iter_mut() {
            match s.try_recv() {
                Ok(_) => open += 1,
                Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
