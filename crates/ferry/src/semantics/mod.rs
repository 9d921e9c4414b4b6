//! PLACEHOLDER from branch `calib`: the minimal `Semantics` enum so that
//! `calibration` compiles before branch `genie` (which owns this module) is merged.
//! Merging `genie` replaces this file with the real passing layer.

pub mod calibration;
pub mod thresholds;

use std::str::FromStr;

pub use calibration::{Calibration, Fit};
pub use thresholds::Thresholds;

/// One of Genie's eight data-passing semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Copy.
    Copy,
    /// Emulated copy.
    EmulatedCopy,
    /// Share.
    Share,
    /// Emulated share.
    EmulatedShare,
    /// Move.
    Move,
    /// Emulated move.
    EmulatedMove,
    /// Weak move.
    WeakMove,
    /// Emulated weak move.
    EmulatedWeakMove,
}

/// Who allocates the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// The application.
    Application,
    /// The system.
    System,
}

/// What the receiver is promised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integrity {
    /// Exactly the bytes at output time.
    Strong,
    /// No promise.
    Weak,
}

impl Semantics {
    /// All eight, copy first.
    pub const ALL: [Semantics; 8] = [
        Semantics::Copy,
        Semantics::EmulatedCopy,
        Semantics::Share,
        Semantics::EmulatedShare,
        Semantics::Move,
        Semantics::EmulatedMove,
        Semantics::WeakMove,
        Semantics::EmulatedWeakMove,
    ];

    /// Who allocates.
    pub fn allocator(self) -> Allocator {
        match self {
            Semantics::Copy
            | Semantics::EmulatedCopy
            | Semantics::Share
            | Semantics::EmulatedShare => Allocator::Application,
            _ => Allocator::System,
        }
    }

    /// What integrity is promised.
    pub fn integrity(self) -> Integrity {
        match self {
            Semantics::Copy
            | Semantics::EmulatedCopy
            | Semantics::Move
            | Semantics::EmulatedMove => Integrity::Strong,
            _ => Integrity::Weak,
        }
    }

    /// Whether this is an emulated form.
    pub fn emulated(self) -> bool {
        matches!(
            self,
            Semantics::EmulatedCopy
                | Semantics::EmulatedShare
                | Semantics::EmulatedMove
                | Semantics::EmulatedWeakMove
        )
    }

    /// Kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Semantics::Copy => "copy",
            Semantics::EmulatedCopy => "emulated-copy",
            Semantics::Share => "share",
            Semantics::EmulatedShare => "emulated-share",
            Semantics::Move => "move",
            Semantics::EmulatedMove => "emulated-move",
            Semantics::WeakMove => "weak-move",
            Semantics::EmulatedWeakMove => "emulated-weak-move",
        }
    }
}

impl FromStr for Semantics {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Semantics> {
        Semantics::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or(crate::Error::InvalidArgument("unknown semantics"))
    }
}
