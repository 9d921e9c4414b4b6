//! The benchmark harness: what every suite (here [`crate::suites`], and `ferry-bench`'s)
//! measures with and reports through. Nothing here knows any one benchmark.
//!
//! - running workers: [`crew`] spawns `__worker` processes of the running binary and
//!   collects their samples;
//! - choosing how much to run: [`budget`], [`ctx`] (quick or thorough, the CPUs
//!   to pin to, the [`machine`] and the [`memcpy`] reference);
//! - summarising: [`stats`], [`record`];
//! - reporting: [`output`] (tables, numbers, plot specs), [`plot`], [`report`]
//!   (the report folder) and [`progress`] (the terminal).

pub mod budget;
pub mod crew;
pub mod ctx;
pub mod machine;
pub mod memcpy;
pub mod output;
pub mod plot;
pub mod progress;
pub mod record;
pub mod report;
pub mod stats;

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
