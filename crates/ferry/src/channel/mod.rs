//! Channels: a shared-memory ring pair between two domains that carries descriptors of
//! IoData, never payload, with releases flowing back on a reverse ring.
//!
//! A [`Sender`] is made by [`Domain::connect`](crate::Domain::connect) and a
//! [`Receiver`] by [`Domain::accept`](crate::Domain::accept). Sending pins the message's
//! fbufs in the sender until the receiver drops every fragment; the drop pushes a release
//! on the reverse ring and the sender returns the fbufs to their path's free list the next
//! time it sends or allocates. When either process dies the other learns it through a
//! pidfd, and the sender reclaims everything the dead receiver held.

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
pub use sender::{SendSlot, Sender};
