//! What every benchmark gets: the mode, progress output, the machine and
//! the CPUs to pin to, and the memcpy reference measured once per run.

use std::any::{Any, TypeId};
use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;

use anyhow::Result;

use super::machine::Machine;
use super::memcpy::Memcpy;
use super::progress::Progress;
use crate::sys;

pub struct BenchCtx {
    /// Fewer sizes and messages: each benchmark finishes within a few seconds.
    pub quick: bool,
    pub progress: Progress,
    pub machine: Machine,
    memcpy: OnceCell<Memcpy>,
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
            memcpy: OnceCell::new(),
            shared: RefCell::new(HashMap::new()),
        }
    }

    /// The CPU for process `i` of a chain: alternating between the two pinned CPUs.
    pub fn cpu(&self, i: usize) -> usize {
        self.machine.pinned_cpus[i % 2]
    }

    /// This run's memcpy bandwidth, measured on first use.
    pub fn memcpy(&self) -> Result<&Memcpy> {
        if let Some(m) = self.memcpy.get() {
            return Ok(m);
        }
        self.progress
            .phase("memcpy: 64 MiB copies (the physical reference)");
        let m = Memcpy::measure(self)?;
        Ok(self.memcpy.get_or_init(|| m))
    }

    /// The memcpy reference, if some benchmark has measured it.
    pub fn memcpy_if_measured(&self) -> Option<&Memcpy> {
        self.memcpy.get()
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

    /// Picks between the quick and the thorough value.
    pub fn pick<T>(&self, quick: T, thorough: T) -> T {
        if self.quick {
            quick
        } else {
            thorough
        }
    }
}
