//! The atomics ferry's shared-memory structures use, routed through one place so that
//! `--cfg loom` can swap in loom's model-checked versions.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
