//! ferry: zero-copy data passing between Linux processes.
//!
//! Processes that join a [`Group`] each own a *lot*: a memfd mapped read-write in its
//! owner and read-only in every other member, at the same address everywhere. A
//! [`PathAllocator`] carves page-multiple *fbufs* from the lot; an [`IoData`] is an
//! immutable list of fragments of fbufs; a [`Sender`]/[`Receiver`] pair moves IoData
//! between two domains by passing small descriptors through a shared-memory ring. The
//! receiver reads the sender's pages in place; when it drops the data, the fbufs flow back
//! to the sender's path.
//!
//! ```
//! use std::time::Duration;
//! use ferry::{Group, PathConfig};
//!
//! # fn main() -> ferry::Result<()> {
//! # let name = format!("doc-{}", std::process::id());
//! let group = Group::open(&name)?;          // /dev/shm/ferry.<name>; no daemon
//! // Two domains; in real use, two processes. Here two threads of one process.
//! let producer = group.join()?;
//! let consumer = group.join()?;
//! let to = consumer.id();                   // hand this id to the producer somehow
//! let p = producer.clone();
//! let connecting = std::thread::spawn(move || p.connect(to, Duration::from_secs(5)));
//! let mut rx = consumer.accept(Duration::from_secs(5))?;
//! let tx = connecting.join().unwrap()?;
//!
//! let path = producer.path(PathConfig::default())?;
//! let mut buf = path.alloc(64 * 1024)?;    // write phase: exclusive access
//! buf.write_at(0, b"hello, ferry");
//! let data = buf.freeze();                  // immutable from here on
//! tx.send(&data)?;                          // a 128-byte descriptor crosses, not 64 KiB
//!
//! let got = rx.recv()?;                     // the same pages, read-only
//! assert!(got.slice(0..12).eq_bytes(b"hello, ferry"));
//! assert_eq!(got.fragments()[0].as_slice().as_ptr(), data.fragments()[0].as_slice().as_ptr());
//! drop((got, data));                        // the fbuf goes back to `path`
//! tx.collect_releases()?;
//! assert_eq!(path.outstanding(), 0);
//! # Ok(()) }
//! ```
//!
//! Layers, bottom up: [`sys`] (thin syscall wrappers), [`region`] (groups, domains, lots,
//! fbufs), [`segment`] and [`iodata`] (handles), [`channel`] (rings and endpoints).
//! Errors are one enum, [`Error`]; a descriptor that fails validation is
//! [`Error::BadDescriptor`], a dead peer [`Error::PeerGone`].
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod channel;
pub mod container;
pub mod error;
pub mod iodata;
pub mod region;
pub mod segment;
pub(crate) mod sync;
pub mod sys;
pub mod uring;
pub mod vcm;

pub use channel::{ChannelConfig, ChannelStats, Receiver, Sender};
pub use container::{Container, Pallet};
pub use error::{BadDescriptor, Error, Result};
pub use iodata::{Fragment, IoData, IoDataMut};
pub use region::{Domain, DomainId, Group, GroupConfig, PathAllocator, PathConfig, PathStats};
pub use segment::{LotId, LotSpan, Segment};
