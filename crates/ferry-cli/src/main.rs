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
//! - [`sys`] holds the few system calls the tool makes itself;
//! - [`cli_util`] holds what the subcommands share at their edges: checked arguments,
//!   errors in plain words, a closed stdout taken quietly.
//!
//! No argument or environment makes the tool panic: errors end it with a message on
//! stderr and status 1 (2 for a bad command line), a closed stdout with status 0, and a
//! SIGINT or SIGTERM that `pub`, `sub` or `pipeline` caught with 128 + the signal's
//! number once they have cleaned up.
#![deny(unsafe_code)]

mod calibrate;
mod cli_util;
mod pipeline;
mod services;
mod sys;

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli_util::quiet_closed_stdout();
    // A panic unwinds to here, so the destructors on its way have run (a group left, a
    // temporary file removed) before the process ends.
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| run(cli.command)));
    let status = match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        // The reader of stdout has gone (`ferry stat | head -1`): it has what it wanted.
        Ok(Err(e)) if cli_util::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("ferry: {}", cli_util::describe(&e));
            ExitCode::FAILURE
        }
        Err(_) if cli_util::stdout_was_closed() => ExitCode::SUCCESS,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    match ferry::stop::signal() {
        Some(sig) => ExitCode::from((128 + sig) as u8),
        None => status,
    }
}

fn run(command: Command) -> Result<()> {
    match command {
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
