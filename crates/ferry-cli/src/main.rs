//! The `ferry` command-line tool.
//!
//! - [`bench`](mod@bench) (`ferry bench`) runs the [`suites`], one folder per benchmark suite
//!   (its plan, its worker role, its report text), on the [`harness`] (workers,
//!   budgets, statistics, tables, plots, the report folder);
//! - [`worker`] (`ferry __worker`) is one process of a benchmark; what the harness
//!   tells it and what it reports back is the [`protocol`], and it moves messages
//!   through a [`transport`];
//! - [`pipeline`] (`ferry pipeline`, `ferry __stage`) ships containers through stages;
//! - [`services`] (`ferry pub`, `ferry sub`, `ferry stat`, `ferry clean`) feeds and
//!   prints named services, lists groups, members and services, and removes stale
//!   group files;
//! - [`sys`] holds the few system calls the tool makes itself.
#![deny(unsafe_code)]

mod bench;
mod harness;
mod pipeline;
mod protocol;
mod services;
mod suites;
mod sys;
mod transport;
mod worker;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ferry",
    version,
    about = "Zero-copy data passing between Linux processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a benchmark (fbufs, fbufs-path, container, xlate, vcm, calibrate, genie) or all of
    /// them, with baselines and the papers' numbers.
    Bench(bench::BenchArgs),
    /// Measure the data-passing primitives, fit a*B + b to each, and write the calibration
    /// file the semantics layer reads its thresholds from.
    Calibrate(suites::calibrate::CalibrateArgs),
    /// One process of a benchmark; spawned by `ferry bench`, not for direct use.
    #[command(name = "__worker", hide = true)]
    Worker(protocol::WorkerArgs),
    /// Move a file, stdin or TCP stream through N stages to a file, stdout or TCP stream,
    /// shipping containers of memfd pallets between the stages.
    Pipeline(pipeline::PipelineArgs),
    /// One stage of a pipeline; spawned by `ferry pipeline`, not for direct use.
    #[command(name = "__stage", hide = true)]
    Stage(pipeline::StageArgs),
    /// The subscriber process of `ferry bench services`; not for direct use.
    #[command(name = "__drain", hide = true)]
    Drain { args: Vec<String> },
    /// Offer a publish-subscribe service and publish stdin to it (a message per line).
    Pub(services::PubArgs),
    /// Subscribe to a service and print its messages to stdout.
    Sub(services::SubArgs),
    /// List groups, their members and services, and each member's paths (fbufs out) and
    /// sending channels (messages in flight), from the control blocks in /dev/shm.
    Stat(services::StatArgs),
    /// Remove this user's group files in /dev/shm that no live member uses (left by
    /// killed processes), saying what was removed and what was left and why.
    Clean(services::CleanArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Calibrate(args) => suites::calibrate::command(args),
        Command::Worker(args) => worker::run(args),
        Command::Pipeline(args) => pipeline::run(args),
        Command::Stage(args) => pipeline::run_stage_process(args),
        Command::Drain { args } => suites::services::drain_main(&args),
        Command::Pub(args) => services::publish(args),
        Command::Sub(args) => services::subscribe(args),
        Command::Stat(args) => services::stat(args),
        Command::Clean(args) => services::clean(args),
    }
}
