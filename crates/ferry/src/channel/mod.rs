//! Channels: a shared-memory ring pair between two domains that carries descriptors of
//! IoData, never payload, with releases flowing back on a reverse ring.
//!
//! What users need of it is in the docs of [`Sender`] and [`Receiver`].

pub(crate) mod desc;
mod layout;
pub(crate) mod ring;

mod handshake;
mod link;
mod loan;
mod receiver;
mod sender;

pub use link::{ChannelConfig, ChannelStats};
pub(crate) use loan::Draft;
pub use loan::Loan;
pub use receiver::Receiver;
pub(crate) use sender::FAN;
pub use sender::{SendSlot, Sender};
