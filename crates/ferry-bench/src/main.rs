//! `ferry-bench`: ferry's benchmarks between real processes, with their baselines and
//! the papers' numbers side by side.
//!
//! - `ferry-bench <suite>` runs one of the [`suites`], one folder per benchmark suite
//!   (its plan, its worker role, its report text), on the [`harness`] (workers,
//!   budgets, statistics, tables, plots, the report folder); `ferry-bench all` runs
//!   every suite and writes the report folder;
//! - [`worker`] (`ferry-bench __worker`) is one process of a benchmark; what the harness
//!   tells it and what it reports back is the [`protocol`], and it moves messages
//!   through a [`transport`].
//!
//! The harness, the protocol, the transports and the `calibrate` and `genie` measurements
//! are in `ferry-measure`, which the `ferry` tool's `calibrate` command uses too; this
//! crate adds the other suites, their workers and the baselines they compare with.
#![deny(unsafe_code)]

mod harness;
mod suites;
mod worker;

use ferry_measure::{protocol, sys, transport};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Arg, ArgAction, Args, Command, FromArgMatches};

use crate::harness::output::PlotSpec;
use crate::harness::report::{self, draw, write_json, Finished};
use crate::harness::watchdog::Watchdog;
use crate::harness::{BenchCtx, BenchDef};
use crate::protocol::WorkerArgs;
use crate::suites::BENCHES;

/// The options of a run, one suite or `all`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Fewer sizes and messages: under 30 s for everything.
    #[arg(long)]
    pub quick: bool,
    /// Write every measured point as JSON records to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the first plot to FILE.svg and any others beside it (`FILE-<plot>.svg`).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Write a report folder (report.md, results.json, SVG plots); `all` defaults to ferry-report/.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// End the run (status 1, workers killed) when one benchmark takes longer than this
    /// many seconds; a hang then names its benchmark and phase. Default: 600 with
    /// `--quick`, 7200 without.
    #[arg(long, value_name = "SECS")]
    pub stall_limit: Option<u64>,
}

/// The command line: one subcommand per suite in [`BENCHES`] (so `--help` lists exactly
/// the suites there are), `all`, and the hidden commands the harness spawns itself.
fn cli() -> Command {
    let mut cmd = Command::new("ferry-bench")
        .version(env!("CARGO_PKG_VERSION"))
        .about("ferry's benchmarks between real processes, with their baselines and the papers' numbers")
        .subcommand_required(true)
        .arg_required_else_help(true);
    // `about` after `augment_args`, which sets the argument struct's own doc comment.
    for def in BENCHES {
        cmd = cmd.subcommand(RunArgs::augment_args(Command::new(def.name)).about(def.about));
    }
    cmd.subcommand(
        RunArgs::augment_args(Command::new("all")).about(
            "Every suite above, in that order, and the report folder (default ferry-report/)",
        ),
    )
    .subcommand(
        WorkerArgs::augment_args(Command::new("__worker"))
            .about("One process of a benchmark; spawned by the harness, not for direct use")
            .hide(true),
    )
    .subcommand(
        Command::new("__huge")
            .about("The receiver of `ferry-bench hugepages`; not for direct use")
            .hide(true)
            .arg(Arg::new("args").num_args(0..).action(ArgAction::Append)),
    )
    .subcommand(
        Command::new("__frames")
            .about("A stage or display process of `ferry-bench frames`; not for direct use")
            .hide(true)
            .arg(Arg::new("args").num_args(0..).action(ArgAction::Append)),
    )
    .subcommand(
        Command::new("__bridge")
            .about("A process of `ferry-bench bridge`; not for direct use")
            .hide(true)
            .arg(Arg::new("args").num_args(0..).action(ArgAction::Append)),
    )
    .subcommand(
        Command::new("__drain")
            .about("The subscriber process of `ferry-bench services`; not for direct use")
            .hide(true)
            .arg(Arg::new("args").num_args(0..).action(ArgAction::Append)),
    )
}

fn main() -> Result<()> {
    let matches = cli().get_matches();
    let Some((name, sub)) = matches.subcommand() else {
        unreachable!("a subcommand is required");
    };
    // A hidden worker's positional arguments.
    let args = || -> Vec<String> {
        sub.get_many::<String>("args")
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    };
    match name {
        "__worker" => worker::run(WorkerArgs::from_arg_matches(sub).unwrap_or_else(|e| e.exit())),
        "__frames" => suites::frames::worker_main(&args()),
        "__drain" => suites::services::drain_main(&args()),
        "__bridge" => suites::bridge::worker::main(&args()),
        "__huge" => suites::hugepages::recv::main(&args()),
        _ => run(
            name,
            RunArgs::from_arg_matches(sub).unwrap_or_else(|e| e.exit()),
        ),
    }
}

/// Runs the suite `name` (one of [`BENCHES`]) or `all`.
pub fn run(name: &str, args: RunArgs) -> Result<()> {
    let selected: Vec<&'static BenchDef> = if name == "all" {
        BENCHES.iter().collect()
    } else {
        BENCHES.iter().filter(|b| b.name == name).collect()
    };
    let ctx = BenchCtx::new(args.quick);
    let limit = args
        .stall_limit
        .unwrap_or(if args.quick { 600 } else { 7200 });
    let watchdog = Watchdog::start(Duration::from_secs(limit), ctx.progress.last_phase());
    let mut done = Vec::new();
    let placement = sys::save_affinity().context("reading the run's CPU affinity")?;
    for def in selected {
        // Several suites pin this thread; the next one, and the processes it starts,
        // must not inherit that (its workers would all share one CPU).
        sys::restore_affinity(&placement).context("restoring the run's CPU affinity")?;
        let start = Instant::now();
        watchdog.begin(def.name);
        let output = (def.run)(&ctx).with_context(|| format!("benchmark {}", def.name))?;
        watchdog.end();
        let seconds = start.elapsed().as_secs_f64();
        ctx.progress
            .phase(&format!("{}: done in {seconds:.1} s", def.name));
        done.push(Finished {
            def,
            output,
            seconds,
        });
    }
    ctx.progress.finish();

    for f in &done {
        println!("{}", f.output.markdown);
    }
    let mut records: Vec<_> = ctx
        .memcpy_if_measured()
        .map(|m| m.record())
        .into_iter()
        .collect();
    records.extend(done.iter().flat_map(|f| f.output.records.iter().cloned()));
    if let Some(path) = &args.json {
        write_json(path, &records)?;
        eprintln!("wrote {} records to {}", records.len(), path.display());
    }
    if let Some(path) = &args.plot {
        let plots: Vec<&PlotSpec> = done.iter().flat_map(|f| &f.output.plots).collect();
        for (i, p) in plots.iter().enumerate() {
            let file = if i == 0 {
                path.clone()
            } else {
                beside(path, &p.stem)
            };
            draw(p, &file)?;
            eprintln!("wrote {}", file.display());
        }
    }
    let out = match (&args.out, name) {
        (Some(dir), _) => Some(dir.clone()),
        (None, "all") => Some(PathBuf::from("ferry-report")),
        _ => None,
    };
    if let Some(dir) = out {
        let total = ctx.progress.elapsed().as_secs_f64();
        report::write(&dir, &ctx, &done, &records, total)?;
        eprintln!("wrote the report to {}", dir.join("report.md").display());
    }
    Ok(())
}

/// `dir/name-<stem>.svg` for `dir/name.svg`.
fn beside(path: &Path, stem: &str) -> PathBuf {
    let base = path
        .file_stem()
        .map_or("plot".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{base}-{stem}.svg"))
}
