//! Runs one chain of worker processes: source, stages, sink, joined by links
//! of one transport, each process pinned; or the same chain in one process.
//! The harness side is here; the worker side is [`roles`], which moves and
//! [`touch`]es messages the same way whatever the transport.

pub mod roles;
pub mod touch;

use std::time::Duration;

use anyhow::Result;

use super::crew::{Crew, WorkerSpec};
use super::ctx::BenchCtx;
use crate::protocol::{Pattern, Plan, Role, Sample};
use crate::transport::{stream, TransportKind};

/// Longest a single run may take before its workers are killed.
const TIMEOUT: Duration = Duration::from_secs(180);

/// What the two ends of a chain reported.
pub struct ChainRun {
    /// Round trips (ping-pong only).
    pub source: Vec<Sample>,
    /// Stream trials or one-way latencies.
    pub sink: Vec<Sample>,
    /// Kernel buffering of one link, where known.
    pub capacity: Option<usize>,
}

/// Runs `plan` across `crossings` links of `kind` (`crossings + 1` processes).
pub fn run_chain(
    ctx: &BenchCtx,
    kind: TransportKind,
    crossings: usize,
    plan: &Plan,
) -> Result<ChainRun> {
    assert!(crossings >= 1);
    let mut plan = plan.clone();
    for (w, &size) in plan.warmup.iter_mut().zip(&plan.sizes) {
        *w = (*w).max(kind.min_warmup(size));
    }
    let plan = &plan;
    let (links, leftovers) = kind.links(crossings)?;
    // Declared before the crew, so dropped after it: the workers are gone
    // (finished or killed) by the time their files are removed.
    let _cleanup = Cleanup(leftovers);
    let capacity = links[0].capacity;
    let (mut ack_tx, mut ack_rx) = match plan.pattern {
        Pattern::PingPong => {
            let l = stream::pipe_link()?;
            (Some(l.tx), Some(l.rx))
        }
        Pattern::Stream => (None, None),
    };
    let procs = crossings + 1;
    let mut crew = Crew::default();
    let mut links = links.into_iter();
    let mut rx = None;
    for i in 0..procs {
        let role = match i {
            0 => Role::Source,
            i if i == procs - 1 => Role::Sink,
            _ => Role::Stage,
        };
        let mut spec = WorkerSpec::new(role, ctx.cpu(i));
        spec.transport = kind.worker();
        spec.rx = rx.take();
        if let Some(link) = links.next() {
            spec.tx = Some(link.tx);
            rx = Some(link.rx);
        }
        spec.ack = match role {
            Role::Source => ack_rx.take(),
            Role::Sink => ack_tx.take(),
            _ => None,
        };
        crew.spawn(spec, plan)?;
    }
    let mut reports = crew.finish(TIMEOUT)?;
    let sink = reports.pop().unwrap_or_default();
    let source = reports.into_iter().next().unwrap_or_default();
    Ok(ChainRun {
        source,
        sink,
        capacity,
    })
}

/// Files a chain may leave behind, removed when dropped.
struct Cleanup(Vec<std::path::PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Runs `plan` as function calls in one pinned process (`plan.hops` stages).
pub fn run_local(ctx: &BenchCtx, plan: &Plan) -> Result<Vec<Sample>> {
    let mut crew = Crew::default();
    crew.spawn(WorkerSpec::new(Role::Local, ctx.cpu(0)), plan)?;
    Ok(crew.finish(TIMEOUT)?.remove(0))
}
