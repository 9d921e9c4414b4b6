//! ferry: zero-copy data passing between Linux processes.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod channel;
pub mod error;
pub mod iodata;
pub mod region;
pub mod segment;
pub(crate) mod sync;
pub mod sys;

pub use channel::{ChannelConfig, ChannelStats, Receiver, Sender};
pub use error::{BadDescriptor, Error, Result};
pub use iodata::{Fragment, IoData, IoDataMut};
pub use region::{Domain, DomainId, Group, GroupConfig, PathAllocator, PathConfig, PathStats};
pub use segment::{LotId, LotSpan, Segment};
