//! io_uring data path: a safe driver, the `xlate` registration cache, and the rings that
//! carry VCM command vectors.
//!
//! Everything here sits on the [`io_uring`] crate; ferry writes no ring code of its own.
//! [`Features::probe`] finds out once per process what the running kernel offers; each
//! layer either refuses clearly ([`crate::Error::Unsupported`]) or falls back and counts
//! the fallback in its stats.
//!
//! | piece | paper | module |
//! |---|---|---|
//! | ring set-up, probing | - | [`probe`] |
//! | owned-buffer I/O on files and sockets, SEND_ZC | ADC (thesis ch. 6) | [`driver`] |
//! | registration cache with single-copy fallback | Schoinas & Hill | [`xlate`] |

pub mod driver;
pub mod probe;
pub mod xlate;

/// `IORING_SEND_ZC_REPORT_USAGE`: asks a SEND_ZC notification to say whether the kernel
/// copied the data after all (the io-uring crate keeps its `sys` module private).
pub(crate) const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;

/// Whether a SEND_ZC notification's `res` carries `IORING_NOTIF_USAGE_ZC_COPIED`: the
/// kernel copied the data instead of sending the pages (always the case on loopback).
pub(crate) fn notif_zc_copied(res: i32) -> bool {
    res as u32 & (1 << 31) != 0
}

pub use driver::{Completion, FixedBuf, FixedPool, Target, Ticket, Uring, UringStats};
pub use probe::{Features, RingOptions};
