//! Genie's eight data-passing semantics over ferry channels.
//!
//! An application picks, per operation, how its data is passed, along three axes:
//!
//! |  | strong integrity | weak integrity |
//! |---|---|---|
//! | application allocates | [`Copy`](Semantics::Copy), [`EmulatedCopy`](Semantics::EmulatedCopy) | [`Share`](Semantics::Share), [`EmulatedShare`](Semantics::EmulatedShare) |
//! | system allocates | [`Move`](Semantics::Move), [`EmulatedMove`](Semantics::EmulatedMove) | [`WeakMove`](Semantics::WeakMove), [`EmulatedWeakMove`](Semantics::EmulatedWeakMove) |
//!
//! *Strong integrity*: the receiver gets exactly the bytes the buffer held when output was
//! called, never partial data and never later writes. *Weak integrity* promises nothing
//! about writes the sender makes during output. An emulated form keeps its plain form's
//! API and promise and only changes the cost.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

#[allow(unsafe_code)]
pub(crate) mod app;
pub(crate) mod cache;
pub mod calibration;
pub(crate) mod copyout;
#[allow(unsafe_code)]
pub(crate) mod hide;
mod passing;
#[allow(unsafe_code)]
pub(crate) mod regions;
pub mod stats;
#[allow(unsafe_code)]
pub(crate) mod tcow;
#[allow(unsafe_code)]
mod tcp;
pub mod thresholds;

pub use app::AppBuffer;
pub use calibration::{Calibration, Fit};
pub(crate) use passing::Regions;
pub use passing::{InputAlignment, Passing, PassingConfig, Used};
pub use regions::SysBuffer;
pub use stats::{Fallback, SemanticsCounters, SemanticsStats, ThresholdSource};
pub use thresholds::Thresholds;

/// Who allocates the buffer an operation passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Allocator {
    /// The application owns the buffer before and after output; input fills a buffer the
    /// application names.
    Application,
    /// The application gives the buffer up on output; input returns a new buffer.
    System,
}

/// What a receiver is promised about writes the sender makes during output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Integrity {
    /// The receiver sees exactly the bytes at the time of output, never later or partial.
    Strong,
    /// No promise: the receiver may see writes made during output.
    Weak,
}

/// One of Genie's eight data-passing semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Application-allocated, strong integrity: the bytes are copied at output.
    Copy,
    /// Copy's API and promise; large outputs write-protect the application's pages (TCOW)
    /// instead of copying them.
    EmulatedCopy,
    /// Application-allocated, weak integrity: the receiver reads the application's pages.
    Share,
    /// Share's API and promise, passing references without pinning work.
    EmulatedShare,
    /// System-allocated, strong integrity: the region leaves the sender and is mapped at
    /// the receiver.
    Move,
    /// Move's API and promise; the region is hidden from the sender (no access) and reused.
    EmulatedMove,
    /// System-allocated, weak integrity: the region leaves the sender's hands by contract.
    WeakMove,
    /// Weak move's API and promise; output regions are cached and reused for input.
    EmulatedWeakMove,
}

impl Semantics {
    /// All eight, in Genie's order.
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

    /// Who allocates the buffer.
    pub fn allocator(self) -> Allocator {
        match self {
            Self::Copy | Self::EmulatedCopy | Self::Share | Self::EmulatedShare => {
                Allocator::Application
            }
            Self::Move | Self::EmulatedMove | Self::WeakMove | Self::EmulatedWeakMove => {
                Allocator::System
            }
        }
    }

    /// What is promised about writes during output.
    pub fn integrity(self) -> Integrity {
        match self {
            Self::Copy | Self::EmulatedCopy | Self::Move | Self::EmulatedMove => Integrity::Strong,
            Self::Share | Self::EmulatedShare | Self::WeakMove | Self::EmulatedWeakMove => {
                Integrity::Weak
            }
        }
    }

    /// Whether this is an emulated (optimized) form.
    pub fn emulated(self) -> bool {
        matches!(
            self,
            Self::EmulatedCopy | Self::EmulatedShare | Self::EmulatedMove | Self::EmulatedWeakMove
        )
    }

    /// The plain form with the same allocator and integrity.
    pub fn plain(self) -> Semantics {
        match self {
            Self::EmulatedCopy => Self::Copy,
            Self::EmulatedShare => Self::Share,
            Self::EmulatedMove => Self::Move,
            Self::EmulatedWeakMove => Self::WeakMove,
            s => s,
        }
    }

    /// Kebab-case name, e.g. `"emulated-copy"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::EmulatedCopy => "emulated-copy",
            Self::Share => "share",
            Self::EmulatedShare => "emulated-share",
            Self::Move => "move",
            Self::EmulatedMove => "emulated-move",
            Self::WeakMove => "weak-move",
            Self::EmulatedWeakMove => "emulated-weak-move",
        }
    }

    /// Index in [`Semantics::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Semantics {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Semantics::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or(Error::InvalidArgument("unknown semantics name"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_and_names() {
        for (i, s) in Semantics::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i);
            assert_eq!(s.name().parse::<Semantics>().unwrap(), s);
            assert_eq!(s.plain().allocator(), s.allocator());
            assert_eq!(s.plain().integrity(), s.integrity());
            assert!(!s.plain().emulated());
        }
        assert_eq!(Semantics::ALL.iter().filter(|s| s.emulated()).count(), 4);
        assert_eq!(Semantics::WeakMove.allocator(), Allocator::System);
        assert_eq!(Semantics::Share.integrity(), Integrity::Weak);
        assert!("copy ".parse::<Semantics>().is_err());
    }
}
