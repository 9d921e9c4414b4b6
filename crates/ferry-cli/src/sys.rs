//! The few operating-system calls the tool makes itself: descriptors handed from
//! `ferry pipeline` to its stage processes (the same helpers as the measuring workers',
//! from ferry-measure), and the stop signals (ferry's own, as the bridge uses them).

pub use ferry::stop::{catch_signals as catch_stop_signals, signal as stop_signal};
pub use ferry_measure::sys::{inheritable, inherited_fd};
