//! `ferry calibrate`: the measurement and the file are `ferry-measure`'s
//! ([`ferry_measure::suites::calibrate`]), the same code `ferry-bench calibrate` runs.
//!
//! Its hand-over is timed between two pinned processes through `Passing`, by Genie's
//! source and sink workers: the harness spawns them as `ferry __worker genie-source|genie-sink`,
//! which [`worker`] serves. No other worker role runs in this binary.

use anyhow::{bail, Result};
pub use ferry_measure::protocol::WorkerArgs;
pub use ferry_measure::suites::calibrate::{command, CalibrateArgs};
use ferry_measure::worker::{own_role, serve};

/// `ferry __worker`: one of the calibration's worker processes.
pub fn worker(args: WorkerArgs) -> Result<()> {
    serve(args, |args, plan| match own_role(args, plan) {
        Some(samples) => samples,
        None => bail!("{:?} is not a worker role of `ferry`", args.role),
    })
}
