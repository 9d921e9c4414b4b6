//! Turning workers' raw samples into one summarised point per message size.

use super::stats::{median, spread, Summary};
use crate::protocol::{Sample, SampleKind};

/// One message size, summarised over all its trials.
#[derive(Debug, Clone)]
pub struct Point {
    pub size: usize,
    /// Over every sample of every trial.
    pub summary: Summary,
    /// The median of each trial.
    pub per_trial: Vec<f64>,
    pub trials: u32,
}

impl Point {
    /// (max - min) / median of the per-trial medians.
    pub fn spread(&self) -> f64 {
        spread(&self.per_trial)
    }
}

/// Sizes in the order they first appear.
fn sizes(samples: &[Sample]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for s in samples {
        if !out.contains(&s.size) {
            out.push(s.size);
        }
    }
    out
}

/// Per-message samples (ns), mapped through `f`, pooled over trials.
pub fn pooled(samples: &[Sample], f: impl Fn(f64) -> f64) -> Vec<Point> {
    sizes(samples)
        .into_iter()
        .map(|size| {
            let trials: Vec<Vec<f64>> = samples
                .iter()
                .filter(|s| s.size == size)
                .map(|s| s.ns.iter().map(|&ns| f(ns as f64)).collect())
                .collect();
            let all: Vec<f64> = trials.iter().flatten().copied().collect();
            Point {
                size,
                summary: Summary::of(&all),
                per_trial: trials.iter().map(|t| median(t)).collect(),
                trials: trials.len() as u32,
            }
        })
        .collect()
}

/// Stream samples as throughput in GB/s (bytes per ns), one value per trial.
pub fn stream_gbps(samples: &[Sample]) -> Vec<Point> {
    sizes(samples)
        .into_iter()
        .map(|size| {
            let per_trial: Vec<f64> = samples
                .iter()
                .filter(|s| s.size == size)
                .map(|s| s.bytes as f64 / s.ns.iter().sum::<u64>().max(1) as f64)
                .collect();
            Point {
                size,
                summary: Summary::of(&per_trial),
                trials: per_trial.len() as u32,
                per_trial,
            }
        })
        .collect()
}

/// System calls per timed message, over every sample that counted them
/// (`None` if the transport does not count).
pub fn syscalls_per_msg(samples: &[Sample]) -> Option<f64> {
    let mut calls = 0u64;
    let mut msgs = 0u64;
    let mut any = false;
    for s in samples {
        if let Some(c) = s.syscalls {
            any = true;
            calls += c;
            msgs += match s.kind {
                SampleKind::Stream => s.bytes / (s.size as u64).max(1),
                _ => s.ns.len() as u64,
            };
        }
    }
    any.then(|| calls as f64 / msgs.max(1) as f64)
}
