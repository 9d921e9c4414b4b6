//! The physical reference: how fast this machine copies memory, measured in
//! the same run as everything it is printed beside.

use std::hint::black_box;
use std::time::Duration;

use anyhow::Result;

use super::crew::{Crew, WorkerSpec};
use super::ctx::BenchCtx;
use super::record::Record;
use super::stats::{median, spread, Summary};
use crate::protocol::{Pattern, Plan, Role, Sample, SampleKind, Touch, Wait};
use crate::sys::now_ns;

/// Bytes per copy: far beyond the caches, so this is memory bandwidth.
pub const SIZE: usize = 64 << 20;

pub struct Memcpy {
    /// GB/s (10^9 bytes per second) over every timed copy.
    pub gbps: Summary,
    pub trials: u32,
    pub spread: f64,
    pub cpu: usize,
}

impl BenchCtx {
    /// This run's memcpy bandwidth, measured on first use.
    pub fn memcpy(&self) -> Result<&Memcpy> {
        self.shared(|ctx| {
            ctx.progress
                .phase("memcpy: 64 MiB copies (the physical reference)");
            Memcpy::measure(ctx)
        })
    }

    /// The memcpy reference, if some benchmark has measured it.
    pub fn memcpy_if_measured(&self) -> Option<&Memcpy> {
        self.shared_if_made()
    }
}

impl Memcpy {
    /// Runs a worker pinned to the first CPU that copies between two
    /// prefaulted 64 MiB buffers.
    pub fn measure(ctx: &BenchCtx) -> Result<Memcpy> {
        let trials = ctx.pick(3, 5);
        let plan = Plan {
            pattern: Pattern::Stream,
            wait: Wait::Block,
            touch: Touch::All,
            sizes: vec![SIZE],
            msgs: vec![ctx.pick(4, 10)],
            warmup: vec![1],
            trials,
            hops: 0,
        };
        let cpu = ctx.cpu(0);
        let mut crew = Crew::default();
        crew.spawn(WorkerSpec::new(Role::Memcpy, cpu), &plan)?;
        let samples = crew.finish(Duration::from_secs(60))?.remove(0);
        let rate = |ns: &u64| SIZE as f64 / *ns as f64;
        let all: Vec<f64> = samples.iter().flat_map(|s| s.ns.iter().map(rate)).collect();
        let per_trial: Vec<f64> = samples
            .iter()
            .map(|s| median(&s.ns.iter().map(rate).collect::<Vec<_>>()))
            .collect();
        Ok(Memcpy {
            gbps: Summary::of(&all),
            trials,
            spread: spread(&per_trial),
            cpu,
        })
    }

    /// Nanoseconds to copy one 4 KiB page at the median bandwidth.
    pub fn ns_per_page(&self) -> f64 {
        4096.0 / self.gbps.median
    }

    pub fn record(&self) -> Record {
        Record::new(
            "memcpy",
            "memcpy",
            "GB/s",
            self.gbps,
            self.trials,
            self.spread,
        )
        .param("bytes", SIZE)
        .param("cpu", self.cpu)
    }

    /// One line for Markdown output.
    pub fn line(&self) -> String {
        format!(
            "memcpy on this machine, this run: {:.2} GB/s median (64 MiB copies, {} trials, min {:.2}, max {:.2}); one 4 KiB page takes {:.2} µs to copy.",
            self.gbps.median,
            self.trials,
            self.gbps.min,
            self.gbps.max,
            self.ns_per_page() / 1000.0
        )
    }
}

/// The worker role ([`Role::Memcpy`]): times `msgs` copies of each size between two
/// prefaulted buffers.
pub fn worker(plan: &Plan) -> Vec<Sample> {
    let mut out = Vec::new();
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for step in plan.steps() {
        let size = step.size;
        if src.len() < size {
            src.resize(size, 0x5au8);
            dst.resize(size, 0xa5u8);
        }
        let mut ns = Vec::with_capacity(step.timed as usize);
        for i in 0..step.total() {
            let t = now_ns();
            dst[..size].copy_from_slice(black_box(&src[..size]));
            black_box(&mut dst);
            if i >= step.warmup {
                ns.push(now_ns() - t);
            }
        }
        out.push(Sample {
            kind: SampleKind::Memcpy,
            size,
            trial: step.trial,
            bytes: size as u64,
            ns,
            syscalls: None,
        });
    }
    out
}
