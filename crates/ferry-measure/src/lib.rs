//! What `ferry calibrate` (in the `ferry` tool) and `ferry-bench` both measure with.
//!
//! - [`harness`]: the context of a run (quick or thorough, the CPUs to pin to, the
//!   machine), budgets, statistics, records, tables, plots and the report folder, and
//!   [`harness::crew`], which spawns worker processes (`current_exe() __worker ...`: each
//!   binary that uses the crew has a hidden `__worker` command that calls [`worker::serve`]);
//! - [`protocol`]: what the harness tells a worker and what a worker reports back;
//! - [`transport`]: the links between worker processes (pipes, sockets, ferry channels);
//! - [`suites::calibrate`]: the cost of each data-passing primitive and the calibration
//!   file the semantics layer reads its thresholds from;
//! - [`suites::genie`]: Genie's semantics through `Passing` between two pinned worker
//!   processes, which the calibration's hand-over is measured with;
//! - [`sys`]: the few system calls these make themselves.
//!
//! The benchmark suites and their own workers are in `ferry-bench`; nothing here depends
//! on another IPC system.
#![deny(unsafe_code)]

pub mod harness;
pub mod protocol;
pub mod suites;
pub mod sys;
pub mod transport;
pub mod worker;
