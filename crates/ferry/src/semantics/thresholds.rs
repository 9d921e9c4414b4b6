//! PLACEHOLDER from branch `calib`: the `Thresholds` struct of the interface, so that
//! `calibration` compiles before branch `genie` (which owns this file) is merged.

/// Sizes below which the emulated forms convert to copy, and from which input swaps pages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Below this, emulated copy converts to copy.
    pub emulated_copy: usize,
    /// Below this, emulated share converts to copy.
    pub emulated_share: usize,
    /// Below this, emulated move converts to copy.
    pub emulated_move: usize,
    /// Below this, emulated weak move converts to copy.
    pub emulated_weak_move: usize,
    /// Input swaps whole pages only at or above this (`usize::MAX`: never).
    pub swap: usize,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            emulated_copy: 1 << 20,
            emulated_share: 0,
            emulated_move: 0,
            emulated_weak_move: 0,
            swap: usize::MAX,
        }
    }
}
