//! Short-data thresholds: below these sizes an emulated semantics converts to its plain
//! copy form, because the page-table work it saves costs more than copying the bytes.
//!
//! Genie converts short data to copy for the same reason; what changed since the paper is
//! where the crossover lies. On the 2-vCPU VM this crate is developed on (medians from
//! docs/semantics.md, "Measured costs behind the design"): a hot 4 KiB `memcpy` takes
//! 0.07–0.15 µs while arming and disarming userfaultfd write protection on the same page
//! takes 1.7–2.25 µs, and at 1 MiB the copy (29–44 µs) and TCOW arm + disarm (37–50 µs)
//! tie; at 16 MiB TCOW wins 3–4x. So the default emulated-copy threshold is 1 MiB. Page swapping on input
//! never beat a hot copy up to 1 MiB and only tied it at 16 MiB, so the default swap
//! threshold is "never" (`usize::MAX`).
//!
//! The share forms pass references whatever the size and have no per-byte work, so they
//! need no threshold (0). Emulated move (region hiding, `mprotect(PROT_NONE)` and back:
//! 5.9–8.3 µs at 4 KiB, 40–57 µs at 1 MiB) pays per page like TCOW, so it gets the same
//! default; emulated weak move (region caching) keeps the region mapped, costs nothing per
//! byte, and has no threshold.
//!
//! `ferry calibrate` measures these crossovers on the running machine and writes them to a
//! calibration file (see the `calibration` module, owned by the calibration work); an
//! application that loads it passes its thresholds in `PassingConfig::thresholds`, else
//! the semantics layer uses these defaults, and records which in its stats.

/// Sizes (bytes) below which each emulated semantics converts to copy, and at or above
/// which input swaps whole pages instead of copying them.
///
/// An operation of `len` bytes uses the emulated mechanism when `len >= threshold`; a
/// threshold of 0 means "always emulate", `usize::MAX` means "never".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Emulated copy (TCOW) output below this converts to copy.
    pub emulated_copy: usize,
    /// Emulated share below this converts to copy.
    pub emulated_share: usize,
    /// Emulated move (region hiding) below this converts to copy.
    pub emulated_move: usize,
    /// Emulated weak move (region caching) below this converts to copy.
    pub emulated_weak_move: usize,
    /// Input swaps whole pages in only at or above this size (`usize::MAX`: never).
    pub swap: usize,
}

/// Default emulated-copy threshold: TCOW ties a hot copy at about 1 MiB on the VM the
/// defaults were measured on (see the module docs).
pub const DEFAULT_EMULATED_COPY: usize = 1 << 20;

/// Default emulated-move threshold: region hiding pays per page about what TCOW does.
pub const DEFAULT_EMULATED_MOVE: usize = 1 << 20;

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            emulated_copy: DEFAULT_EMULATED_COPY,
            emulated_share: 0,
            emulated_move: DEFAULT_EMULATED_MOVE,
            emulated_weak_move: 0,
            swap: usize::MAX,
        }
    }
}

impl Thresholds {
    /// Thresholds that never convert: every emulated form always uses its mechanism and
    /// input swaps whole pages whenever it can. For tests and for measuring the mechanisms.
    pub const NEVER_CONVERT: Thresholds = Thresholds {
        emulated_copy: 0,
        emulated_share: 0,
        emulated_move: 0,
        emulated_weak_move: 0,
        swap: 0,
    };

    /// The threshold for `semantics`, or `None` for the plain forms, which never convert.
    pub fn for_semantics(&self, semantics: super::Semantics) -> Option<usize> {
        use super::Semantics as S;
        match semantics {
            S::EmulatedCopy => Some(self.emulated_copy),
            S::EmulatedShare => Some(self.emulated_share),
            S::EmulatedMove => Some(self.emulated_move),
            S::EmulatedWeakMove => Some(self.emulated_weak_move),
            S::Copy | S::Share | S::Move | S::WeakMove => None,
        }
    }

    /// Whether an operation of `len` bytes with `semantics` converts to copy.
    pub fn converts(&self, semantics: super::Semantics, len: usize) -> bool {
        self.for_semantics(semantics).is_some_and(|t| len < t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantics::Semantics;

    #[test]
    fn edges() {
        let t = Thresholds::default();
        assert!(t.converts(Semantics::EmulatedCopy, DEFAULT_EMULATED_COPY - 1));
        assert!(!t.converts(Semantics::EmulatedCopy, DEFAULT_EMULATED_COPY));
        assert!(!t.converts(Semantics::EmulatedShare, 1));
        assert!(!t.converts(Semantics::Copy, 0));
        assert!(!t.converts(Semantics::Move, 0));
        assert!(!Thresholds::NEVER_CONVERT.converts(Semantics::EmulatedMove, 1));
        assert_eq!(t.swap, usize::MAX);
    }
}
