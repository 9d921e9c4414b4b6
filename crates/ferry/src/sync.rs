//! The atomics ferry's shared-memory structures use, routed through one place so that
//! `--cfg loom` can swap in loom's model-checked versions.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Locks `m`, going on with its data if another thread panicked while holding it: every
/// mutex in ferry guards state that stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
