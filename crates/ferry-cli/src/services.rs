//! `ferry pub`, `ferry sub` and `ferry stat`: named services from a shell.
//!
//! `ferry pub GROUP SERVICE` offers SERVICE and publishes stdin, one message per line
//! (or per `--chunk` bytes); `ferry sub GROUP SERVICE` subscribes and writes each
//! message to stdout (a line each, unless `--raw`); `ferry stat` lists the groups in
//! `/dev/shm`, their members and their services, read from the control blocks without
//! joining any group as a member.

use std::io::{BufRead, Read, Write};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ferry::service::Kind;
use ferry::{Group, PathConfig, Publisher, ServiceConfig, SlowSubscriber, Subscriber};

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum Policy {
    /// A full subscriber misses the message; the publisher never waits.
    Drop,
    /// The publisher waits for room in every subscriber's queue.
    Block,
}

#[derive(Debug, Args)]
pub struct PubArgs {
    /// The group (`/dev/shm/ferry.GROUP`; created if absent).
    pub group: String,
    /// The service's name, e.g. `camera/front`.
    pub service: String,
    /// Publish stdin in chunks of this many bytes instead of one message per line.
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Wait for this many subscribers before publishing anything.
    #[arg(long, default_value_t = 0)]
    pub wait_subscribers: usize,
    /// What a full subscriber queue does to the publisher.
    #[arg(long, value_enum, default_value_t = Policy::Block)]
    pub policy: Policy,
    /// Messages each subscriber's queue holds (a power of two).
    #[arg(long, default_value_t = 64)]
    pub depth: u32,
}

#[derive(Debug, Args)]
pub struct SubArgs {
    /// The group.
    pub group: String,
    /// The service's name.
    pub service: String,
    /// Write messages back to back, without a newline after each.
    #[arg(long)]
    pub raw: bool,
    /// Exit after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
    /// Seconds to wait for the service to be offered.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Only this group (default: every group in /dev/shm).
    pub group: Option<String>,
}

pub fn publish(a: PubArgs) -> Result<()> {
    let group = Group::open(&a.group)?;
    let domain = group.join()?;
    let config = ServiceConfig {
        depth: a.depth,
        slow: match a.policy {
            Policy::Drop => SlowSubscriber::Drop,
            Policy::Block => SlowSubscriber::Block,
        },
        ..ServiceConfig::default()
    };
    let mut p = Publisher::offer(&domain, &a.service, config)
        .with_context(|| format!("offering {:?}", a.service))?;
    if a.wait_subscribers > 0 {
        p.wait_for_subscribers(a.wait_subscribers, Duration::from_secs(3600))?;
    }
    let path = domain.path(PathConfig::default())?;
    let mut send = |bytes: &[u8]| -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut m = path.alloc(bytes.len())?;
        m.write_at(0, bytes);
        p.publish(&m.freeze())?;
        Ok(())
    };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    match a.chunk {
        Some(0) => bail!("--chunk must be at least 1"),
        Some(n) => {
            let mut buf = vec![0u8; n];
            loop {
                let mut got = 0;
                while got < n {
                    let k = input.read(&mut buf[got..])?;
                    if k == 0 {
                        break;
                    }
                    got += k;
                }
                send(&buf[..got])?;
                if got < n {
                    break;
                }
            }
        }
        None => {
            let mut line = Vec::new();
            while input.read_until(b'\n', &mut line)? > 0 {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                send(&line)?;
                line.clear();
            }
        }
    }
    let s = p.stats();
    eprintln!(
        "ferry pub: {} messages, {} deliveries, {} dropped, {} subscribers",
        s.published,
        s.delivered,
        s.dropped,
        p.subscriber_count()
    );
    Ok(())
}

pub fn subscribe(a: SubArgs) -> Result<()> {
    let group = Group::open(&a.group)?;
    let domain = group.join()?;
    let mut sub = Subscriber::open(&domain, &a.service, Duration::from_secs_f64(a.timeout))
        .with_context(|| format!("subscribing to {:?}", a.service))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut n = 0;
    while a.count.map_or(true, |c| n < c) {
        let msg = match sub.recv() {
            Ok(m) => m,
            // The publisher withdrew or exited: the stream ended.
            Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        for f in msg.fragments() {
            out.write_all(f.as_slice())?;
        }
        if !a.raw {
            out.write_all(b"\n")?;
        }
        out.flush()?;
        n += 1;
    }
    Ok(())
}

/// Prints what each member publishes: one table of paths (fbufs and bytes out against
/// the quota) and one of sending channels (peer, messages in flight, sent), then any
/// entries that failed validation.
fn print_activity(all: &[ferry::MemberActivity]) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if all.iter().any(|a| !a.paths.is_empty()) {
        println!("  paths:");
        println!(
            "    {:<10} {:>8} {:>5} {:>10} {:>16}",
            "member", "pid", "path", "fbufs out", "MiB out/quota"
        );
        for a in all {
            for p in &a.paths {
                println!(
                    "    {:<10} {:>8} {:>5} {:>10} {:>10.2}/{:.0}",
                    a.member.id.to_string(),
                    a.member.pid,
                    p.entry,
                    p.fbufs,
                    mib(p.bytes),
                    mib(p.quota)
                );
            }
        }
    }
    if all.iter().any(|a| !a.channels.is_empty()) {
        println!("  channels (sending side):");
        println!(
            "    {:<10} {:>8} {:>5} {:>10} {:>10} {:>10}",
            "member", "pid", "chan", "to", "in flight", "sent"
        );
        for a in all {
            for c in &a.channels {
                println!(
                    "    {:<10} {:>8} {:>5} {:>10} {:>10} {:>10}",
                    a.member.id.to_string(),
                    a.member.pid,
                    c.entry,
                    c.peer.to_string(),
                    c.in_flight,
                    c.sent
                );
            }
        }
    }
    for a in all {
        if a.unlisted_paths > 0 || a.unlisted_channels > 0 {
            println!(
                "  member {}: {} paths and {} channels not listed (no free entry)",
                a.member.id, a.unlisted_paths, a.unlisted_channels
            );
        }
        for d in &a.damage {
            println!(
                "  member {}: {} fails validation: {}",
                a.member.id, d.entry, d.why
            );
        }
    }
}

pub fn stat(a: StatArgs) -> Result<()> {
    let names: Vec<String> = match a.group {
        Some(g) => vec![g],
        None => {
            let mut v: Vec<String> = std::fs::read_dir("/dev/shm")?
                .filter_map(|e| {
                    let n = e.ok()?.file_name().into_string().ok()?;
                    n.strip_prefix("ferry.").map(str::to_owned)
                })
                .collect();
            v.sort();
            v
        }
    };
    if names.is_empty() {
        println!("no ferry groups in /dev/shm");
    }
    for name in names {
        // Opening reads the control block through the door table; it claims no slot.
        let group = match Group::open(&name) {
            Ok(g) => g,
            Err(e) => {
                println!("group {name}: cannot open: {e}");
                continue;
            }
        };
        let members = group.members();
        println!("group {name}: {} members", members.len());
        for m in &members {
            println!("  member {} pid {}", m.id, m.pid);
        }
        for s in group.services() {
            let kind = match s.kind {
                Kind::PubSub => format!("pub-sub ({:?} when full)", s.slow).to_lowercase(),
                Kind::ReqResp => "req-resp".to_owned(),
            };
            let pids: Vec<String> = s.subscribers.iter().map(|m| m.pid.to_string()).collect();
            println!(
                "  service {:?}: {kind}, depth {}, owner {} pid {}, {} members [{}]",
                s.name,
                s.depth,
                s.owner.id,
                s.owner.pid,
                s.subscribers.len(),
                pids.join(" ")
            );
        }
        let damage = group.service_table_damage();
        if damage > 0 {
            println!("  service table: {damage} entries fail validation");
        }
        print_activity(&group.activity());
    }
    Ok(())
}
