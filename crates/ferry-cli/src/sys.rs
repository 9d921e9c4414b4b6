//! The few operating-system calls the tool makes itself: descriptors handed from
//! `ferry pipeline` to its stage processes (the same helpers as the measuring workers',
//! from ferry-measure), and the stop signals (ferry's own, as the bridge uses them).

pub use ferry::{catch_stop_signals, stop_signal};
pub use ferry_measure::sys::{inheritable, inherited_fd};
