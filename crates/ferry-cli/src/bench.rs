//! `ferry bench`: benchmarks between real processes, with their baselines and
//! the papers' numbers side by side.
//!
//! The suites themselves are in [`crate::suites`], the harness they run on in
//! [`crate::harness`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::harness::output::PlotSpec;
use crate::harness::report::{self, draw, write_json, Finished};
use crate::harness::watchdog::Watchdog;
use crate::harness::{BenchCtx, BenchDef};
use crate::suites::BENCHES;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A benchmark (fbufs, fbufs-path, container, xlate, vcm, services, calibrate, genie)
    /// or `all`.
    pub name: String,
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

pub fn run(args: BenchArgs) -> Result<()> {
    let selected: Vec<&'static BenchDef> = if args.name == "all" {
        BENCHES.iter().collect()
    } else {
        match BENCHES.iter().find(|b| b.name == args.name) {
            Some(b) => vec![b],
            None => {
                let names: Vec<_> = BENCHES.iter().map(|b| b.name).collect();
                bail!(
                    "unknown benchmark {:?}; try one of: {}, all",
                    args.name,
                    names.join(", ")
                );
            }
        }
    };
    let ctx = BenchCtx::new(args.quick);
    let limit = args
        .stall_limit
        .unwrap_or(if args.quick { 600 } else { 7200 });
    let watchdog = Watchdog::start(Duration::from_secs(limit), ctx.progress.last_phase());
    let mut done = Vec::new();
    for def in selected {
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
    let out = match (&args.out, args.name.as_str()) {
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
