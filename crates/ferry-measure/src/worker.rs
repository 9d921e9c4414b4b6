//! The worker side of [`harness::crew`](crate::harness::crew): what a binary's hidden
//! `__worker` command runs.
//!
//! The harness spawns `current_exe() __worker <role> --plan JSON ...`
//! ([`WorkerArgs`]), hands it descriptors, and reads its [`Sample`]s, one JSON
//! line each, from its stdout once it exits.

use std::io::{self, Write};

use anyhow::{bail, Context, Result};

use crate::harness::memcpy;
use crate::protocol::{Header, Plan, Role, Sample, WorkerArgs};
use crate::suites::genie::worker as genie_worker;
use crate::sys;
use crate::transport::ferry as ferry_link;

/// Runs one worker to completion and prints its samples: parses and checks the plan,
/// pins the process, then runs `role` (the binary's own roles) and prints what it returns.
pub fn serve(
    args: WorkerArgs,
    role: impl FnOnce(&WorkerArgs, &Plan) -> Result<Vec<Sample>>,
) -> Result<()> {
    let plan: Plan = serde_json::from_str(&args.plan).context("parsing --plan")?;
    if let Some(s) = plan.sizes.iter().find(|&&s| s < Header::LEN) {
        bail!(
            "message size {s} is smaller than the {}-byte header",
            Header::LEN
        );
    }
    if let Some(cpu) = args.cpu {
        sys::pin_to(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    let samples = role(&args, &plan)?;
    let mut out = io::BufWriter::new(io::stdout().lock());
    for s in &samples {
        serde_json::to_writer(&mut out, s)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// The roles this crate's own measurements spawn ([`memcpy`] and [`genie_worker`]'s source
/// and sink), or `None` for a role that belongs to another crate.
pub fn own_role(args: &WorkerArgs, plan: &Plan) -> Option<Result<Vec<Sample>>> {
    Some(match args.role {
        Role::Memcpy => Ok(memcpy::worker(plan)),
        Role::GenieSource | Role::GenieSink => {
            let samples = genie_worker::run(args, plan);
            ferry_link::leave();
            samples
        }
        _ => return None,
    })
}
