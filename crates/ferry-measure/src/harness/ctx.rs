//! What every benchmark gets: the mode, progress output, the machine and
//! the CPUs to pin to, and what earlier suites of the run measured (such as the memcpy
//! reference, see `memcpy.rs`).

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::Result;

use super::machine::Machine;
use super::progress::Progress;
use crate::sys;

pub struct BenchCtx {
    /// Fewer sizes and messages: each benchmark finishes within a few seconds.
    pub quick: bool,
    pub progress: Progress,
    pub machine: Machine,
    /// Results one suite measures and later suites of the same run reuse, by type.
    shared: RefCell<HashMap<TypeId, &'static dyn Any>>,
}

impl BenchCtx {
    pub fn new(quick: bool) -> BenchCtx {
        let cpus = sys::allowed_cpus();
        let first = cpus.first().copied().unwrap_or(0);
        let pinned = [first, cpus.get(1).copied().unwrap_or(first)];
        BenchCtx {
            quick,
            progress: Progress::new(),
            machine: Machine::probe(pinned),
            shared: RefCell::new(HashMap::new()),
        }
    }

    /// The CPU for process `i` of a chain: alternating between the two pinned CPUs.
    pub fn cpu(&self, i: usize) -> usize {
        self.machine.pinned_cpus[i % 2]
    }

    /// The run's one value of type `T`, made by `make` on first use: how a suite shares
    /// what it measured (say, the calibration) with the suites after it in `bench all`.
    /// The value lives until the process exits.
    pub fn shared<T: Any>(&self, make: impl FnOnce(&Self) -> Result<T>) -> Result<&'static T> {
        if let Some(v) = self.shared.borrow().get(&TypeId::of::<T>()) {
            return Ok(v.downcast_ref().expect("keyed by its type"));
        }
        let v: &'static T = Box::leak(Box::new(make(self)?));
        self.shared.borrow_mut().insert(TypeId::of::<T>(), v);
        Ok(v)
    }

    /// The run's value of type `T` if a suite has made it.
    pub fn shared_if_made<T: Any>(&self) -> Option<&'static T> {
        let v: &'static dyn Any = *self.shared.borrow().get(&TypeId::of::<T>())?;
        v.downcast_ref()
    }

    /// Picks between the quick and the thorough value.
    pub fn pick<T>(&self, quick: T, thorough: T) -> T {
        if self.quick {
            quick
        } else {
            thorough
        }
    }
}
