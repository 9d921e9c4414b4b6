//! The `ferry` command-line tool.
#![deny(unsafe_code)]

mod bench;
mod harness;
mod pipeline;
mod protocol;
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
    /// Run a benchmark (fbufs, fbufs-path) or all of them, with baselines and the papers' numbers.
    Bench(bench::BenchArgs),
    /// One process of a benchmark; spawned by `ferry bench`, not for direct use.
    #[command(name = "__worker", hide = true)]
    Worker(protocol::WorkerArgs),
    /// Move a file, stdin or TCP stream through N stages to a file, stdout or TCP stream,
    /// shipping containers of memfd pallets between the stages.
    Pipeline(pipeline::PipelineArgs),
    /// One stage of a pipeline; spawned by `ferry pipeline`, not for direct use.
    #[command(name = "__stage", hide = true)]
    Stage(pipeline::StageArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Worker(args) => worker::run(args),
        Command::Pipeline(args) => pipeline::run(args),
        Command::Stage(args) => pipeline::run_stage_process(args),
    }
}
