//! The `ferry` command-line tool.
//!
//! - [`calibrate`] (`ferry calibrate`) measures the data-passing primitives and writes the
//!   calibration file the semantics layer reads (the measurement is `ferry-measure`'s,
//!   shared with `ferry-bench calibrate`; its hand-over runs two `ferry __worker`
//!   processes);
//! - [`pipeline`] (`ferry pipeline`, `ferry __stage`) ships containers through stages;
//! - [`services`] (`ferry pub`, `ferry sub`, `ferry stat`, `ferry clean`) feeds and
//!   prints named services, lists groups, members and services, and removes stale
//!   group files;
//! - [`sys`] holds the few system calls the tool makes itself.
#![deny(unsafe_code)]

mod calibrate;
mod pipeline;
mod services;
mod sys;

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
    /// Measure the data-passing primitives, fit a*B + b to each, and write the calibration
    /// file the semantics layer reads its thresholds from.
    Calibrate(calibrate::CalibrateArgs),
    /// One process of `ferry calibrate`'s hand-over; spawned by it, not for direct use.
    #[command(name = "__worker", hide = true)]
    Worker(calibrate::WorkerArgs),
    /// Move a file, stdin or TCP stream through N stages to a file, stdout or TCP stream,
    /// shipping containers of memfd pallets between the stages.
    Pipeline(pipeline::PipelineArgs),
    /// One stage of a pipeline; spawned by `ferry pipeline`, not for direct use.
    #[command(name = "__stage", hide = true)]
    Stage(pipeline::StageArgs),
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
        Command::Calibrate(args) => calibrate::command(args),
        Command::Worker(args) => calibrate::worker(args),
        Command::Pipeline(args) => pipeline::run(args),
        Command::Stage(args) => pipeline::run_stage_process(args),
        Command::Pub(args) => services::publish(args),
        Command::Sub(args) => services::subscribe(args),
        Command::Stat(args) => services::stat(args),
        Command::Clean(args) => services::clean(args),
    }
}
