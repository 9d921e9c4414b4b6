//! The benchmark harness: what every suite in [`crate::suites`] measures with
//! and reports through. Nothing here knows any one benchmark.
//!
//! - running workers: [`crew`] spawns `ferry __worker` processes and collects
//!   their samples; [`chain`] runs a source, stages and a sink joined by one
//!   transport (and holds those roles' worker side);
//! - choosing how much to run: [`budget`], [`ctx`] (quick or thorough, the CPUs
//!   to pin to, the [`machine`] and the [`memcpy`] reference);
//! - summarising: [`points`], [`stats`], [`record`];
//! - reporting: [`output`] (tables, numbers, plot specs), [`plot`], [`report`]
//!   (the report folder) and [`progress`] (the terminal);
//! - not hanging: [`watchdog`] ends a run whose benchmark takes far longer than it should.

pub mod budget;
pub mod chain;
pub mod crew;
pub mod ctx;
pub mod machine;
pub mod memcpy;
pub mod output;
pub mod plot;
pub mod points;
pub mod progress;
pub mod record;
pub mod report;
pub mod stats;
pub mod watchdog;

use anyhow::Result;

pub use ctx::BenchCtx;
pub use output::BenchOutput;

/// One registered benchmark.
pub struct BenchDef {
    /// The name on the command line.
    pub name: &'static str,
    /// One line for `--help` and the report.
    pub about: &'static str,
    pub run: fn(&BenchCtx) -> Result<BenchOutput>,
}
