//! `ferry pub`, `ferry sub`, `ferry stat` and `ferry clean`: named services from a shell.
//!
//! `ferry pub GROUP SERVICE` offers SERVICE and publishes stdin, one message per line
//! (or per `--chunk` bytes); `ferry sub GROUP SERVICE` subscribes and writes each
//! message to stdout (a line each, unless `--raw`); both take `--group-access UNIX_GROUP`
//! to share the group with that Unix group's users. `ferry stat` lists the groups in
//! `/dev/shm`, their members and their services, read from the control blocks without
//! joining any group and without changing anything (it fails if a group it lists cannot
//! be read); `ferry clean` removes this user's named files that no live member uses.

use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ferry::stats::GroupFileState;
use ferry::{
    Domain, Group, GroupAccess, GroupConfig, PathConfig, Publisher, ServiceConfig, SlowSubscriber,
    Subscriber,
};
use ferry::{Origin, ServiceKind, MAX_MEMBERS};

use crate::cli_util::parse_secs;

/// How long a blocking step waits before it looks for a stop signal again.
const SLICE: Duration = Duration::from_millis(100);

/// How long `ferry sub` gives the publisher to connect once its service is listed.
const HANDSHAKE: Duration = Duration::from_secs(5);

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum Policy {
    /// A full subscriber's queue loses its oldest message; the publisher never waits, so
    /// a stopped subscriber holds up no one.
    Drop,
    /// The publisher waits for room in every subscriber's queue, so one stopped
    /// subscriber stops the publisher and every other subscriber.
    Block,
}

#[derive(Debug, Args)]
pub struct PubArgs {
    /// The group (`/dev/shm/ferry.GROUP`; created if absent).
    pub group: String,
    /// The service's name, e.g. `camera/front`.
    pub service: String,
    /// Publish stdin in chunks of this many bytes instead of one message per line (at
    /// most the path's quota, 512 MiB).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Wait for this many subscribers before publishing anything.
    #[arg(long, default_value_t = 0)]
    pub wait_subscribers: usize,
    /// What a full subscriber queue does to the publisher (the library's default, drop:
    /// a stuck subscriber must not stall the others).
    #[arg(long, value_enum, default_value_t = Policy::Drop)]
    pub policy: Policy,
    /// Messages each subscriber's queue holds (a power of two).
    #[arg(long, default_value_t = 64)]
    pub depth: u32,
    /// Share the group with this Unix group (a name or a gid): its file is mode 0660 and
    /// that group's. Every process of the group must pass the same.
    #[arg(long, value_name = "UNIX_GROUP")]
    pub group_access: Option<String>,
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
    /// Seconds to wait for the service to be offered (0 to 86400).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub timeout: Duration,
    /// Join a group shared with this Unix group (a name or a gid), as its publisher
    /// made it with `--group-access`.
    #[arg(long, value_name = "UNIX_GROUP")]
    pub group_access: Option<String>,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Only this group (default: every group in /dev/shm).
    pub group: Option<String>,
}

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Only this group (default: every group in /dev/shm).
    pub group: Option<String>,
}

/// The gid of Unix group `spec`: a number, or a name in /etc/group.
fn unix_group(spec: &str) -> Result<u32> {
    if let Ok(gid) = spec.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            Some((f.next()?, f.nth(1)?))
        })
        .find(|(name, _)| *name == spec)
        .and_then(|(_, gid)| gid.parse().ok())
        .with_context(|| format!("no Unix group named {spec:?} in /etc/group (give its gid)"))
}

/// Opens group `name` with the access policy `--group-access` asked for.
fn open_group(name: &str, access: Option<&str>) -> Result<Arc<Group>> {
    let config = GroupConfig {
        access: match access {
            Some(g) => GroupAccess::UnixGroup(unix_group(g)?),
            None => GroupAccess::Owner,
        },
        ..GroupConfig::default()
    };
    Group::open_with(name, config)
        .with_context(|| format!("opening group {name:?} (/dev/shm/ferry.{name})"))
}

/// One step of reading stdin.
enum Input {
    /// A message's bytes are in the buffer.
    Message,
    /// The input ended.
    End,
    /// SIGINT or SIGTERM arrived.
    Stopped,
}

/// Reads the next line of `input` into `line` (cleared first, newline dropped), refusing
/// a line longer than `max` bytes before it is all in memory.
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> Result<Input> {
    line.clear();
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                if ferry::stop::signal().is_some() {
                    return Ok(Input::Stopped);
                }
                continue;
            }
            Err(e) => return Err(e).context("reading stdin"),
        };
        if buf.is_empty() {
            return Ok(if line.is_empty() {
                Input::End
            } else {
                Input::Message
            });
        }
        let (take, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            bail!(
                "a line of more than {max} bytes: larger than the path's quota of {max} bytes, \
                 the most one message can hold (split it with --chunk)"
            );
        }
        line.try_reserve(take)
            .context("no memory for the line read so far")?;
        line.extend_from_slice(&buf[..take]);
        input.consume(take + newline as usize);
        if newline {
            return Ok(Input::Message);
        }
    }
}

/// Fills `buf` from `input` (fewer bytes only at the end of the input).
fn read_chunk(input: &mut impl Read, buf: &mut [u8]) -> Result<(usize, Input)> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => return Ok((got, Input::End)),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                if ferry::stop::signal().is_some() {
                    return Ok((got, Input::Stopped));
                }
            }
            Err(e) => return Err(e).context("reading stdin"),
        }
    }
    Ok((got, Input::Message))
}

pub fn publish(a: PubArgs) -> Result<()> {
    let quota = PathConfig::default().quota;
    match a.chunk {
        Some(0) => bail!("--chunk must be at least 1"),
        Some(n) if n > quota => bail!(
            "--chunk {n} is larger than the path's quota of {quota} bytes, the most one \
             message can hold"
        ),
        _ => {}
    }
    if a.wait_subscribers > MAX_MEMBERS {
        bail!(
            "--wait-subscribers {}: a service has at most {MAX_MEMBERS} subscribers",
            a.wait_subscribers
        );
    }
    ferry::stop::catch_signals().context("catching SIGINT and SIGTERM")?;
    let group = open_group(&a.group, a.group_access.as_deref())?;
    let domain = group.join().context("joining the group")?;
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
    while p.subscriber_count() < a.wait_subscribers {
        if ferry::stop::signal().is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let path = domain.path(PathConfig::default())?;
    let mut send = |bytes: &[u8]| -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut m = path.alloc(bytes.len())?;
        m.write_at(0, bytes);
        // Under --policy block this waits for room as long as it takes; a second signal
        // (the handler is reset by the first) ends the process then.
        p.publish(&m.freeze())?;
        Ok(())
    };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    match a.chunk {
        Some(n) => {
            let mut buf = Vec::new();
            buf.try_reserve_exact(n)
                .with_context(|| format!("no memory for a chunk of {n} bytes"))?;
            buf.resize(n, 0);
            loop {
                let (got, step) = read_chunk(&mut input, &mut buf)?;
                // A chunk cut short by a signal is not sent.
                if matches!(step, Input::Stopped) {
                    break;
                }
                send(&buf[..got])?;
                if matches!(step, Input::End) {
                    break;
                }
            }
        }
        None => {
            let mut line = Vec::new();
            while let Input::Message = read_line(&mut input, &mut line, quota)? {
                send(&line)?;
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

/// Waits up to `timeout` for publish-subscribe service `name` to be listed, looking for a
/// stop signal as it waits, then subscribes. `None` if a signal came first.
fn open_subscriber(
    group: &Group,
    domain: &Domain,
    name: &str,
    timeout: Duration,
) -> Result<Option<Subscriber>> {
    let deadline = Instant::now() + timeout;
    let listed = loop {
        if ferry::stop::signal().is_some() {
            return Ok(None);
        }
        if group
            .services()
            .iter()
            .any(|s| s.name == name && s.kind == ServiceKind::PubSub)
        {
            break true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    };
    // Listed: the publisher still has to connect, which takes it a moment. Not listed:
    // `open` says that no such service is offered.
    let wait = if listed {
        deadline
            .saturating_duration_since(Instant::now())
            .max(HANDSHAKE)
    } else {
        Duration::ZERO
    };
    let sub =
        Subscriber::open(domain, name, wait).with_context(|| format!("subscribing to {name:?}"))?;
    Ok(Some(sub))
}

pub fn subscribe(a: SubArgs) -> Result<()> {
    ferry::stop::catch_signals().context("catching SIGINT and SIGTERM")?;
    let group = open_group(&a.group, a.group_access.as_deref())?;
    let domain = group.join().context("joining the group")?;
    let Some(mut sub) = open_subscriber(&group, &domain, &a.service, a.timeout)? else {
        return Ok(());
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut n = 0;
    while a.count.map_or(true, |c| n < c) && ferry::stop::signal().is_none() {
        let msg = match sub.recv_timeout(SLICE) {
            Ok(m) => m,
            Err(ferry::Error::Timeout) => continue,
            // The publisher withdrew or exited: the stream ended.
            Err(ferry::Error::Disconnected | ferry::Error::PeerGone { .. }) => break,
            // A signal cut the wait short.
            Err(_) if ferry::stop::signal().is_some() => break,
            Err(e) => return Err(e.into()),
        };
        let written = msg
            .fragments()
            .iter()
            .try_for_each(|f| out.write_all(f.as_slice()))
            .and_then(|()| if a.raw { Ok(()) } else { out.write_all(b"\n") })
            .and_then(|()| out.flush());
        match written {
            Ok(()) => n += 1,
            // The reader of stdout has gone: nothing more to do, and nothing wrong.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
            Err(e) => return Err(e).context("writing to stdout"),
        }
    }
    Ok(())
}

/// Prints what each member publishes: one table of paths (fbufs and bytes out against
/// the quota) and one of sending channels (peer, messages in flight, sent), then any
/// entries that failed validation.
fn print_activity(all: &[ferry::stats::MemberActivity]) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if all.iter().any(|a| !a.paths.is_empty()) {
        println!("  paths:");
        println!(
            "    {:<10} {:>8} {:>5} {:>10} {:>16} {:>8}",
            "member", "pid", "path", "fbufs out", "MiB out/quota", "pages"
        );
        for a in all {
            for p in &a.paths {
                // Spans the kernel would not collapse stay 4 KiB: say how many.
                let pages = match p.collapse_fallbacks {
                    0 => p.pages.to_string(),
                    n => format!("{} ({n} spans 4k)", p.pages),
                };
                let out = format!("{:.2}/{:.0}", mib(p.bytes), mib(p.quota));
                println!(
                    "    {:<10} {:>8} {:>5} {:>10} {:>16} {:>8}",
                    a.member.id.to_string(),
                    a.member.pid,
                    p.entry,
                    p.fbufs,
                    out,
                    pages
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
    let files = match &a.group {
        Some(g) => vec![Group::inspect(g)],
        None => Group::inspect_all().context("listing /dev/shm")?,
    };
    if files.is_empty() {
        println!("no ferry groups in /dev/shm");
    }
    let mut unreadable = Vec::new();
    for f in &files {
        let name = &f.name;
        if !f.readable() {
            unreadable.push(name.clone());
        }
        let owner = match (f.foreign, f.owner) {
            (true, Some(uid)) => format!(" (owned by uid {uid}, another user)"),
            _ => String::new(),
        };
        let group = match &f.state {
            GroupFileState::Live(g) => g,
            GroupFileState::Stale { doors } => {
                println!(
                    "group {name}: stale{owner}: none of its {doors} door(s) is live \
                     (members killed); `ferry clean {name}` removes it"
                );
                continue;
            }
            GroupFileState::Empty => {
                println!(
                    "group {name}: empty file{owner}: a group being created, or its \
                     creator died"
                );
                continue;
            }
            GroupFileState::Missing => {
                println!(
                    "group {name}: no such group ({} does not exist)",
                    f.path.display()
                );
                continue;
            }
            GroupFileState::Garbage(why) => {
                println!("group {name}: garbage{owner}, left alone: {why}");
                continue;
            }
            GroupFileState::Unreadable(why) => {
                println!("group {name}: cannot read{owner}: {why}");
                continue;
            }
        };
        let members = group.members();
        println!(
            "group {name}: {} members{owner}, lots of {} MiB, {} pages",
            members.len(),
            group.lot_size() >> 20,
            group.pages()
        );
        for m in &members {
            println!("  member {} pid {}", m.id, m.pid);
        }
        for s in group.services() {
            let kind = match s.kind {
                ServiceKind::PubSub => format!("pub-sub ({:?} when full)", s.slow).to_lowercase(),
                ServiceKind::ReqResp => "req-resp".to_owned(),
            };
            let pids: Vec<String> = s.subscribers.iter().map(|m| m.pid.to_string()).collect();
            // What a bridge recorded: checked by the library (writer alive and entitled,
            // no control characters), still only the writer's claim.
            let origin = match &s.origin {
                Origin::Local => String::new(),
                Origin::Bridged { far } => format!(", bridged from {far:?} (by its owner)"),
                Origin::Carried { by, to } => {
                    format!(", carried to {to:?} by bridge {} pid {}", by.id, by.pid)
                }
                Origin::Damaged => ", bridge note damaged (fails validation)".to_owned(),
            };
            println!(
                "  service {:?}: {kind}, depth {}, owner {} pid {}, {} members [{}]{origin}",
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
    if !unreadable.is_empty() {
        bail!(
            "{} of the groups listed cannot be read: {}",
            unreadable.len(),
            unreadable.join(", ")
        );
    }
    Ok(())
}

/// `ferry clean`: removes this user's named files that no live member uses, and says
/// what it removed and what it left, and why.
pub fn clean(a: CleanArgs) -> Result<()> {
    let done = match &a.group {
        Some(g) => vec![Group::clean(g)],
        None => Group::clean_all().context("listing /dev/shm")?,
    };
    if done.is_empty() {
        println!("no ferry groups in /dev/shm");
    }
    for c in &done {
        let what = if c.removed { "removed" } else { "left" };
        println!("{what} {}: {}", c.path.display(), c.why);
    }
    Ok(())
}
