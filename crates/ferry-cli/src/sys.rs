//! The few operating-system calls the tool makes itself: descriptors handed from
//! `ferry pipeline` to its stage processes (the same helpers as the measuring workers',
//! from ferry-measure). Stop signals are ferry's own (`ferry::stop`), as the bridge's.

pub use ferry_measure::sys::{inheritable, inherited_fd};
