//! Counters of the semantics layer: per semantics, how many operations ran, how many
//! bytes, how many converted to copy below a threshold, how many fell back and why; and
//! the mechanisms' own counts (TCOW faults and pages copied, regions hidden, reinstated,
//! cached and reused). `ferry-bench genie` prints them beside its timings, so that no
//! conversion or fallback is hidden.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Semantics, Thresholds};

/// Why an operation did not use its semantics' mechanism (and, except for
/// [`LockFailed`](Fallback::LockFailed), copied instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// userfaultfd write protection is unavailable (refused by the kernel, or disabled
    /// by [`PassingConfig::tcow`](super::PassingConfig::tcow)).
    NoUserfaultfd,
    /// Write-protecting the pages failed for this operation.
    ProtectFailed,
    /// Hiding or unmapping the region failed for this operation.
    HideFailed,
    /// The receiver is a domain of this same process: it reads through the sender's own
    /// mapping, so the region cannot be hidden or unmapped from the sender alone.
    SameProcess,
    /// Share could not lock the pages (`mlock` refused, e.g. by `RLIMIT_MEMLOCK`): they
    /// were passed unlocked (share promises no integrity, so nothing else changes).
    LockFailed,
}

impl Fallback {
    /// Every reason, in the order of [`SemanticsCounters::fallbacks`].
    pub const ALL: [Fallback; 5] = [
        Fallback::NoUserfaultfd,
        Fallback::ProtectFailed,
        Fallback::HideFailed,
        Fallback::SameProcess,
        Fallback::LockFailed,
    ];

    /// Kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::NoUserfaultfd => "no-userfaultfd",
            Fallback::ProtectFailed => "protect-failed",
            Fallback::HideFailed => "hide-failed",
            Fallback::SameProcess => "same-process",
            Fallback::LockFailed => "lock-failed",
        }
    }
}

/// Where the thresholds in use came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdSource {
    /// The defaults of [`Thresholds::default`]
    /// ([`PassingConfig::thresholds`](super::PassingConfig::thresholds) was `None`).
    Defaults,
    /// Given in [`PassingConfig::thresholds`](super::PassingConfig::thresholds) (from a
    /// calibration file, for instance).
    Config,
}

/// Counters of one semantics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SemanticsCounters {
    /// Output operations.
    pub outputs: u64,
    /// Bytes output.
    pub output_bytes: u64,
    /// Input operations.
    pub inputs: u64,
    /// Bytes input.
    pub input_bytes: u64,
    /// Inputs handed to the receiver as the sender's pages, read in place (no copy):
    /// every system-allocated input, and weak-integrity application-allocated input
    /// through [`Passing::recv_in_place`](super::Passing::recv_in_place). The others
    /// copied out (counted in [`copied_bytes`](Self::copied_bytes)).
    pub inputs_in_place: u64,
    /// Outputs of an emulated form below its threshold, done as copy.
    pub converted_to_copy: u64,
    /// Outputs that fell back to copy, per [`Fallback::ALL`] reason.
    pub fallbacks: [u64; 5],
    /// Bytes copied by this semantics' operations (copy itself, conversions, fallbacks,
    /// and input copied out into application buffers).
    pub copied_bytes: u64,
}

impl SemanticsCounters {
    /// Fallbacks for `why`.
    pub fn fallback(&self, why: Fallback) -> u64 {
        self.fallbacks[why as usize]
    }

    /// All fallbacks.
    pub fn total_fallbacks(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}

/// A snapshot of a [`Passing`](super::Passing)'s counters.
#[derive(Clone, Debug, PartialEq)]
pub struct SemanticsStats {
    /// Per semantics, indexed by [`Semantics::index`].
    pub per: [SemanticsCounters; 8],
    /// The thresholds in use and where they came from.
    pub thresholds: Thresholds,
    /// Where [`thresholds`](Self::thresholds) came from.
    pub threshold_source: ThresholdSource,
    /// Whether TCOW (userfaultfd write protection) is available; if not, why.
    pub tcow_unavailable: Option<String>,
    /// TCOW is available for user-mode writes only: a kernel write (e.g. `read(2)`) into a
    /// page under output fails with `EFAULT` instead of waiting for the copy.
    pub tcow_user_mode_only: bool,
    /// Pages write-protected for output.
    pub tcow_pages_protected: u64,
    /// Of those, pages protected by moving their page tables out (long runs), not one by
    /// one.
    pub tcow_pages_moved: u64,
    /// Write faults on pages under output that the handler served.
    pub tcow_faults: u64,
    /// Pages the handler copied to a fresh lot page and mapped under the application.
    pub tcow_pages_copied: u64,
    /// Faults the handler could not serve by copying (no lot page free): the writer waited
    /// until the receivers released the page.
    pub tcow_waits: u64,
    /// Regions hidden (their pages moved out of the buffer's address) at output (emulated
    /// move).
    pub regions_hidden: u64,
    /// Hidden regions reinstated when reused.
    pub regions_reinstated: u64,
    /// Regions taken out of the sender's mapping at output (move).
    pub regions_unmapped: u64,
    /// Output regions queued for reuse (emulated weak move).
    pub regions_cached: u64,
    /// Cached regions reused by an allocation.
    pub regions_reused: u64,
    /// Regions that could not be mapped back or reinstated and were kept out of
    /// circulation.
    pub regions_lost: u64,
    /// Pages swapped in on input (mapped privately from the sender's lot).
    pub pages_swapped: u64,
    /// Swapped-in pages copied into this domain's lot before an output named them.
    pub pages_settled: u64,
    /// Zero-copy sends on sockets (`IORING_OP_SEND_ZC`) that completed.
    pub zc_sends: u64,
    /// Of those, how many the kernel copied anyway (always on loopback).
    pub zc_copied: u64,
}

impl SemanticsStats {
    /// Counters of `s`.
    pub fn of(&self, s: Semantics) -> &SemanticsCounters {
        &self.per[s.index()]
    }
}

/// Atomic counters behind [`SemanticsStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    per: [PerCounters; 8],
    pub tcow_pages_protected: AtomicU64,
    pub tcow_pages_moved: AtomicU64,
    pub tcow_faults: AtomicU64,
    pub tcow_pages_copied: AtomicU64,
    pub tcow_waits: AtomicU64,
    pub regions_hidden: AtomicU64,
    pub regions_reinstated: AtomicU64,
    pub regions_unmapped: AtomicU64,
    pub regions_cached: AtomicU64,
    pub regions_reused: AtomicU64,
    pub regions_lost: AtomicU64,
    pub pages_swapped: AtomicU64,
    pub pages_settled: AtomicU64,
    pub zc_sends: AtomicU64,
    pub zc_copied: AtomicU64,
}

#[derive(Debug, Default)]
struct PerCounters {
    outputs: AtomicU64,
    output_bytes: AtomicU64,
    inputs: AtomicU64,
    input_bytes: AtomicU64,
    in_place: AtomicU64,
    converted: AtomicU64,
    fallbacks: [AtomicU64; 5],
    copied: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Counters {
    pub fn output(&self, s: Semantics, bytes: usize) {
        let p = &self.per[s.index()];
        add(&p.outputs, 1);
        add(&p.output_bytes, bytes as u64);
    }

    pub fn input(&self, s: Semantics, bytes: usize) {
        let p = &self.per[s.index()];
        add(&p.inputs, 1);
        add(&p.input_bytes, bytes as u64);
    }

    pub fn in_place(&self, s: Semantics) {
        add(&self.per[s.index()].in_place, 1);
    }

    pub fn converted(&self, s: Semantics) {
        add(&self.per[s.index()].converted, 1);
    }

    pub fn fallback(&self, s: Semantics, why: Fallback) {
        add(&self.per[s.index()].fallbacks[why as usize], 1);
    }

    pub fn copied(&self, s: Semantics, bytes: usize) {
        add(&self.per[s.index()].copied, bytes as u64);
    }

    pub fn snapshot(
        &self,
        thresholds: Thresholds,
        threshold_source: ThresholdSource,
        tcow_unavailable: Option<String>,
        tcow_user_mode_only: bool,
    ) -> SemanticsStats {
        let per = std::array::from_fn(|i| {
            let p = &self.per[i];
            SemanticsCounters {
                outputs: get(&p.outputs),
                output_bytes: get(&p.output_bytes),
                inputs: get(&p.inputs),
                input_bytes: get(&p.input_bytes),
                inputs_in_place: get(&p.in_place),
                converted_to_copy: get(&p.converted),
                fallbacks: std::array::from_fn(|j| get(&p.fallbacks[j])),
                copied_bytes: get(&p.copied),
            }
        });
        SemanticsStats {
            per,
            thresholds,
            threshold_source,
            tcow_unavailable,
            tcow_user_mode_only,
            tcow_pages_protected: get(&self.tcow_pages_protected),
            tcow_pages_moved: get(&self.tcow_pages_moved),
            tcow_faults: get(&self.tcow_faults),
            tcow_pages_copied: get(&self.tcow_pages_copied),
            tcow_waits: get(&self.tcow_waits),
            regions_hidden: get(&self.regions_hidden),
            regions_reinstated: get(&self.regions_reinstated),
            regions_unmapped: get(&self.regions_unmapped),
            regions_cached: get(&self.regions_cached),
            regions_reused: get(&self.regions_reused),
            regions_lost: get(&self.regions_lost),
            pages_swapped: get(&self.pages_swapped),
            pages_settled: get(&self.pages_settled),
            zc_sends: get(&self.zc_sends),
            zc_copied: get(&self.zc_copied),
        }
    }
}
