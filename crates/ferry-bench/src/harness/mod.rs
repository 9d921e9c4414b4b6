//! The benchmark harness: what every suite in [`crate::suites`] measures with and reports
//! through. Most of it is `ferry-measure`'s (re-exported here: workers, budgets, the
//! context, statistics, records, tables, plots, the report folder); this crate adds what
//! only the benchmarks use:
//!
//! - [`chain`] runs a source, stages and a sink joined by one transport (and holds those
//!   roles' worker side);
//! - [`points`] summarises a chain's samples;
//! - [`probe`] reads this process's counters (page faults);
//! - [`watchdog`] ends a run whose benchmark takes far longer than it should.

pub mod chain;
pub mod points;
pub mod probe;
pub mod watchdog;

pub use ferry_measure::harness::*;
