//! The hidden `ferry-bench __worker` subcommand: one process of a benchmark.
//!
//! The harness spawns `current_exe() __worker <role> --plan JSON ...`
//! ([`WorkerArgs`]), hands it descriptors, and reads its [`Sample`]s, one JSON
//! line each, from its stdout once it exits.

use anyhow::{bail, Context, Result};
use ferry_measure::worker;

use crate::harness::chain::roles;
use crate::protocol::{Plan, Role, Sample, WorkerArgs, WorkerTransport};
use crate::suites::container::domain;
use crate::suites::handover;
use crate::suites::vcm::echo;
use crate::transport::ack::Ack;
use crate::transport::ferry::{self as ferry_link, Ferry};
use crate::transport::stream::FdStream;
use crate::transport::Transport;

/// Runs one worker to completion and prints its samples.
pub fn run(args: WorkerArgs) -> Result<()> {
    worker::serve(args, |args, plan| {
        if let Some(samples) = worker::own_role(args, plan) {
            return samples;
        }
        Ok(match args.role {
            Role::Local => roles::local(plan),
            Role::Domain => domain::run(args, plan)?,
            Role::VcmEcho => echo::run(args)?,
            Role::HandoverSend | Role::HandoverRecv => handover::worker::run(args, plan)?,
            _ => match args.transport {
                WorkerTransport::FdStream => run_with::<FdStream>(args, plan)?,
                WorkerTransport::Ferry => {
                    let samples = run_with::<Ferry>(args, plan);
                    ferry_link::leave();
                    samples?
                }
            },
        })
    })
}

fn run_with<T: Transport>(args: &WorkerArgs, plan: &Plan) -> Result<Vec<Sample>> {
    let wait = plan.wait;
    let ack = args
        .ack
        .as_deref()
        .map(|s| Ack::open(s, wait))
        .transpose()
        .context("opening the acknowledgement pipe")?;
    let tx = || -> Result<T::Tx> {
        let spec = args.tx.as_deref().context("--tx is required")?;
        T::open_tx(spec, wait).context("opening --tx")
    };
    let rx = || -> Result<T::Rx> {
        let spec = args.rx.as_deref().context("--rx is required")?;
        T::open_rx(spec, wait).context("opening --rx")
    };
    Ok(match args.role {
        Role::Source => roles::source::<T>(plan, &mut tx()?, ack)?,
        Role::Sink => roles::sink::<T>(plan, &mut rx()?, ack)?,
        Role::Stage => {
            roles::stage::<T>(plan, &mut rx()?, &mut tx()?)?;
            Vec::new()
        }
        Role::Local
        | Role::Memcpy
        | Role::Domain
        | Role::VcmEcho
        | Role::GenieSource
        | Role::GenieSink
        | Role::HandoverSend
        | Role::HandoverRecv => {
            bail!("{:?} takes no transport", args.role)
        }
    })
}
