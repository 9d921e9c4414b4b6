//! Channels: a shared-memory ring pair between two domains that carries descriptors of
//! IoData, never payload, with releases flowing back on a reverse ring.
//!
//! What users need of it is in the docs of [`Sender`] and [`Receiver`].

pub(crate) mod desc;
mod fds;
mod layout;
pub(crate) mod ring;

mod handshake;
mod link;
mod loan;
mod receiver;
mod sender;

pub use desc::MAX_FDS;
pub(crate) use fds::check_count as check_fd_count;
pub use fds::{FdKind, FdKinds, Fds};
pub use link::{ChannelConfig, ChannelStats};
pub(crate) use loan::Draft;
pub use loan::Loan;
pub use receiver::Receiver;
pub(crate) use sender::{Claimed, FAN};
pub use sender::{SendSlot, Sender};
