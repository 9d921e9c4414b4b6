//! io_uring data path: a safe driver, the `xlate` registration cache, and the rings that
//! carry VCM command vectors.
//!
//! Everything here sits on the [`io_uring`] crate, through one ring core (`ring.rs`): the
//! only place that keeps an `IoUring`, pushes entries, enters the kernel (counted, with one
//! retry policy), reaps completions and drains on drop (`probe` only builds rings, to
//! probe them or for [`RingConfig::build`]). The driver, xlate and the VCM endpoint each
//! keep only their own per-operation state on top of it.
//! [`Features::probe`] finds out once per process what the running kernel offers; each
//! layer either refuses clearly ([`crate::Error::Unsupported`]) or falls back and counts
//! the fallback in its stats.
//!
//! | piece | paper | module |
//! |---|---|---|
//! | ring set-up, probing | - | `probe`: [`Features`], [`RingConfig`] |
//! | the ring core: push, counted enter, reap, `user_data`, drain on drop | - | `ring` (crate-private) |
//! | owned-buffer I/O on files and sockets, SEND_ZC | ADC (thesis ch. 6) | `driver`: [`Uring`] |
//! | registration cache with single-copy fallback | Schoinas & Hill | [`xlate`] |

pub(crate) mod driver;
pub(crate) mod probe;
pub(crate) mod ring;
pub mod xlate;

pub use driver::{
    AlignedBuf, Completion, FixedBuf, FixedPool, IoBuf, IoBufMut, Refused, Target, Ticket, Uring,
    UringStats,
};
pub use probe::{Features, RingConfig};
