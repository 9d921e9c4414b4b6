//! The `ferry` command-line tool.
#![deny(unsafe_code)]

mod bench;
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
    Worker(worker::WorkerArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => bench::run(args),
        Command::Worker(args) => worker::run(args),
    }
}
