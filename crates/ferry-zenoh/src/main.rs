//! `ferry-bridge`: carries a ferry group's named services to other hosts over zenoh.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ferry_zenoh::policy::{parse_file, parse_size};
use ferry_zenoh::BridgeConfig;

/// Bridges the named services of a ferry group to the bridges of other hosts (zenoh,
/// TCP). Run one per host and group; flags add to what the configuration file says.
#[derive(Parser, Debug)]
#[command(name = "ferry-bridge", version)]
struct Args {
    /// The local ferry group.
    #[arg(long)]
    group: Option<String>,
    /// Bridges with the same scope see each other's services (default: the group's name).
    #[arg(long)]
    scope: Option<String>,
    /// zenoh endpoint to listen on, e.g. tcp/0.0.0.0:7447 (repeatable).
    #[arg(long)]
    listen: Vec<String>,
    /// zenoh endpoint of another bridge, e.g. tcp/10.0.0.2:7447 (repeatable; retried).
    #[arg(long)]
    connect: Vec<String>,
    /// Glob of services to carry (repeatable; none: all).
    #[arg(long)]
    allow: Vec<String>,
    /// Glob of services never carried (repeatable; wins over --allow).
    #[arg(long)]
    deny: Vec<String>,
    /// Largest message carried (bytes, K/M/G suffixes); larger ones are counted and
    /// skipped.
    #[arg(long)]
    max_message: Option<String>,
    /// How long a bridged request waits for the far end, in milliseconds.
    #[arg(long)]
    call_timeout_ms: Option<u64>,
    /// Also find peers by zenoh's multicast scouting (off: only the endpoints given).
    #[arg(long)]
    multicast_scouting: bool,
    /// A configuration file: `key value` lines (group, scope, listen, connect, allow,
    /// deny, max-message, call-timeout-ms).
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let file = match &a.config {
        Some(p) => parse_file(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("in {}", p.display()))?,
        None => Default::default(),
    };
    let Some(group) = a.group.or(file.group) else {
        bail!("no group: give --group or `group` in the configuration file");
    };
    let mut c = BridgeConfig::new(&group);
    c.scope = a.scope.or(file.scope);
    c.listen = [file.listen, a.listen].concat();
    c.connect = [file.connect, a.connect].concat();
    c.policy.allow = [file.policy.allow, a.allow].concat();
    c.policy.deny = [file.policy.deny, a.deny].concat();
    if let Some(m) = a
        .max_message
        .as_deref()
        .map(parse_size)
        .transpose()?
        .or(file.max_message)
    {
        c.max_message = m;
    }
    if let Some(t) = a
        .call_timeout_ms
        .map(Duration::from_millis)
        .or(file.call_timeout)
    {
        c.call_timeout = t;
    }
    c.multicast_scouting = a.multicast_scouting;
    ferry::stop::catch_signals().context("catching SIGINT and SIGTERM")?;
    ferry_zenoh::run(&c, ferry::stop::flag())
}
