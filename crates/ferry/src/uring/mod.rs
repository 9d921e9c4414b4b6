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

pub use driver::{Completion, FixedBuf, FixedPool, Target, Ticket, Uring, UringStats};
pub use probe::{Features, RingOptions};
