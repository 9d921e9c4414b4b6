//! Genie's eight data-passing semantics, over ferry channels and over TCP sockets.
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
//! API and promise and only changes the cost. [`Passing`] carries out the operations (its
//! docs have the table of what each semantics lets the application do with its buffer,
//! and what the receiver sees); [`SemanticsStats`] counts every conversion to copy and
//! every fallback.
//!
//! ```
//! use std::time::Duration;
//! use ferry::semantics::{Passing, PassingConfig, Semantics, Thresholds};
//!
//! # fn main() -> ferry::Result<()> {
//! # let name = format!("doc-sem-{}", std::process::id());
//! let group = ferry::Group::open(&name)?;
//! // Two domains; in real use, two processes.
//! let (a, b) = (group.join()?, group.join()?);
//! let to = b.id();
//! let a2 = a.clone();
//! let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
//! let mut rx = b.accept(Duration::from_secs(5))?;
//! let tx = connecting.join().unwrap()?;
//!
//! // Thresholds that never convert, so that 64 KiB uses TCOW (the default converts
//! // emulated copy below 1 MiB to copy, where copying is cheaper on today's machines).
//! let config = PassingConfig { thresholds: Some(Thresholds::NEVER_CONVERT), ..Default::default() };
//! let pass = Passing::new(&a, config)?;
//! let mut buf = pass.app_buffer(64 * 1024)?;
//! buf.as_mut_slice().fill(1);
//! pass.send_app(&tx, &buf, 0..64 * 1024, Semantics::EmulatedCopy)?;
//! buf.as_mut_slice().fill(2); // the application's buffer: lands on fresh pages
//! let got = rx.recv()?;
//! assert!(got.iter_bytes().all(|b| b == 1)); // exactly the bytes at output
//! let st = pass.stats();
//! assert_eq!(st.of(Semantics::EmulatedCopy).outputs, 1);
//! if pass.tcow_available() {
//!     assert_eq!(st.tcow_pages_copied, 16); // each page written during output, copied once
//! }
//! # Ok(()) }
//! ```
//!
//! | mechanism | semantics | module |
//! |---|---|---|
//! | TCOW: userfaultfd write protection, page replacement | emulated copy | `tcow` |
//! | application buffers in the lot, with their own view | emulated copy, share, emulated share | `app`, `pages` |
//! | pages moved out of the sender's mapping at output (`mremap`), back at release | move | `regions`, `takeout` |
//! | region hiding (pages moved out with `mremap`) and reinstatement | emulated move | `hide` |
//! | per-domain queues of output regions | weak move, emulated weak move | `cache` |
//! | input alignment, copyout, page swapping | every application-allocated input | `copyout` |
//! | short-data thresholds | every emulated form | `thresholds` |
//! | the cost model and calibration file | `ferry calibrate` | `calibration`, [`probe`] |
//! | TCP through the io_uring driver (with the `uring` feature) | all eight | `tcp` |

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

#[allow(unsafe_code)]
pub(crate) mod app;
pub(crate) mod cache;
pub(crate) mod calibration;
pub(crate) mod copyout;
#[allow(unsafe_code)]
pub(crate) mod hide;
#[allow(unsafe_code)]
pub(crate) mod pages;
pub(crate) mod passing;
#[allow(unsafe_code)]
pub mod probe;
#[allow(unsafe_code)]
pub(crate) mod regions;
pub(crate) mod stats;
#[allow(unsafe_code)]
pub(crate) mod takeout;
#[allow(unsafe_code)]
pub(crate) mod tcow;
#[cfg(feature = "uring")]
#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
#[allow(unsafe_code)]
pub(crate) mod tcp;
pub(crate) mod thresholds;

pub use app::AppBuffer;
pub use calibration::{primitive, Calibration, Fit, FitSegment, Term};
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

    /// Whether input may hand the receiver the sender's pages in place
    /// ([`Passing::recv_in_place`]): every system-allocated form, and the weak-integrity
    /// application-allocated ones (share, emulated share). Copy and emulated copy may not:
    /// their input lands in the application's own buffer.
    pub fn may_input_in_place(self) -> bool {
        self.allocator() == Allocator::System || self.integrity() == Integrity::Weak
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

    /// `Ok` if this semantics has allocator `a`, else [`Error::WrongSemantics`].
    pub(crate) fn expect(self, a: Allocator) -> Result<()> {
        if self.allocator() == a {
            return Ok(());
        }
        Err(Error::WrongSemantics {
            semantics: self.name(),
            needs: match a {
                Allocator::Application => "application-allocated",
                Allocator::System => "system-allocated",
            },
        })
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
