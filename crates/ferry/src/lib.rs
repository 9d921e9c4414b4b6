//! ferry: zero-copy data passing between Linux processes.
//!
//! # Start here
//!
//! A newcomer needs these types, in this order:
//!
//! | type | what it is |
//! |---|---|
//! | [`Group`] | a named place to meet (`/dev/shm/ferry.<name>`; no daemon): [`Group::open`] |
//! | [`Domain`] | one member of a group, owning a *lot* of shared memory: [`Group::join`]; its [`DomainId`] is how others name it |
//! | [`PathAllocator`] | carves page-multiple buffers (*fbufs*) from the domain's lot: [`Domain::path`] |
//! | [`IoDataMut`], [`IoData`] | a buffer being written, then frozen into immutable data that can be passed on |
//! | [`Sender`], [`Receiver`] | a point-to-point channel: [`Domain::connect`] and [`Domain::accept`] |
//! | [`Publisher`], [`Subscriber`]; [`Server`], [`Client`] | named services over channels: publish-subscribe, request-response |
//! | [`Error`], [`Result`] | every fallible call's error |
//!
//! Each member's lot is a memfd mapped read-write in its owner and read-only in every other
//! member, at the same address everywhere. An [`IoData`] is an immutable list of
//! [`Fragment`]s of fbufs; a channel moves it by passing a small descriptor through a
//! shared-memory ring. The receiver reads the sender's pages in place; when it drops the
//! data, the fbufs flow back to the sender's path.
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
//! # The rest of the crate
//!
//! Everything else a program passes or configures is also at the root: the settings
//! ([`GroupConfig`], [`PathConfig`], [`ChannelConfig`], [`ServiceConfig`]), loans written
//! in place before they are sent ([`Loan`], [`PublisherLoan`], [`SendSlot`]), the handles
//! under an [`IoData`] ([`Segment`], [`LotSpan`]), request-response's [`Request`],
//! [`Response`], [`Handler`] and [`run_server`], and [`Until`], the deadline a blocking
//! call takes. Beyond the root there are a few namespaces: [`stats`] (counters and
//! inspection: channel, path and server statistics, members' activity areas, what a
//! group's named file says, syscall counts), and one for each feature below.
//!
//! Errors are one enum, [`Error`], whichever call returns them (the reason is in
//! `docs/architecture.md`, "Errors"); a descriptor that fails validation is
//! [`Error::BadDescriptor`], a dead peer [`Error::PeerGone`].
//!
//! # Features
//!
//! The core above builds with no feature. Each subsystem is a Cargo feature, off by
//! default, so that a program that only passes data over channels and services compiles
//! no io_uring or userfaultfd code and does not depend on the `io-uring` crate:
//!
//! | feature | module | what it adds |
//! |---|---|---|
//! | `containers` | `containers` | containers and pallets: whole pages moved through memfds, pipes, `splice` and `SCM_RIGHTS` |
//! | `uring` | `uring`, `vcm` | the io_uring driver, xlate (page-remapping copies) and VCM endpoints; the only user of the `io-uring` crate |
//! | `semantics` | `semantics` | Genie's eight data-passing semantics over channels, with TCOW over userfaultfd; with `uring` as well, over TCP too (`semantics::tcp`) |
//! | `tokio` | `aio` | async endpoints over the endpoints' wait descriptors |
//! | `testing` | `testing` | the descriptor wire format and hooks for ferry's own tests, fuzz target, benchmarks and calibration; not part of the supported API |
//!
//! # Conventions
//!
//! - **Timeouts.** A call that blocks and takes a timeout (`recv_timeout`, `recv_spin`,
//!   `Uring::wait_timeout` and `vcm::Endpoint::wait` (feature `uring`),
//!   `connect`/`accept`) returns
//!   `Err(`[`Error::Timeout`]`)` when it expires. A `try_*` call never blocks: a receive
//!   with nothing ready gives `Ok(None)`, a send into a full ring `Err(`[`Error::Full`]`)`.
//!   An expired wait is an error because the caller asked for something that did not
//!   happen, while "nothing yet" is the ordinary answer of a poll; one rule for each
//!   lets callers use `?` on waits and a `match` on polls. Where a timed-out call must
//!   not lose what it was waiting for (an io_uring ticket owns its buffer), it borrows
//!   the handle instead of taking it. The handshakes and waits that cannot be cut into
//!   shorter calls (`connect_until`, `accept_until`, `Subscriber::open_until`,
//!   `Client::open_until`, `Client::call_until`) take an [`Until`]: a deadline and a
//!   stop check run between sleeps, for callers that must honour interrupts (the Python
//!   binding's Ctrl-C); a stopped wait is undone as an expired one and returns
//!   [`Error::Interrupted`].
//! - **Settings** structs are named `*Config` ([`PathConfig`], `uring::RingConfig`,
//!   `vcm::EndpointConfig`, ...).
//! - **Errors.** A state the operation cannot proceed in has its own [`Error`] variant;
//!   [`Error::InvalidArgument`] is kept for arguments out of range.
//!
//! # Where `unsafe` lives
//!
//! The crate root denies `unsafe_code`; only the modules below allow it, each on its
//! declaration in `lib.rs` (for `containers` and `semantics`, on their submodules), so
//! this list is the whole of it. Every `unsafe` block carries a `// SAFETY:` comment (clippy's
//! `undocumented_unsafe_blocks` denies one without) and every `unsafe fn` a `# Safety`
//! section.
//!
//! | module | why it needs `unsafe` |
//! |---|---|
//! | `sys` | the syscall wrappers that rustix leaves `unsafe`: `mmap`/`munmap`/`mprotect` and the `Mapping` they return, `userfaultfd` ioctls and event reads, socket address conversions, the SIGINT and SIGTERM handler (`sigaction`) |
//! | `region` | the group control block read and initialised in place through its mapping; fbufs of the domain's own lot made into [`Segment`]s; the `atexit` hook that leaves groups at exit |
//! | `segment` | a [`Segment`] is a pointer and length into a mapping, kept alive by its keeper: the one `unsafe` constructor and the slices over it |
//! | `iodata` | [`IoDataMut`] implements `bytes::BufMut`, an `unsafe` trait; it reaches its own segments, which only it references until frozen, without `Arc::get_mut`'s locked compare-and-swap; a [`LotArea`]'s pieces, which a device wrote, made into segments |
//! | `channel` | the SPSC ring and its slots in shared memory (volatile reads of what the peer writes), the channel mapping's layout, segments built from validated descriptors, a loan's segment address kept for comparison (`Send` for a raw pointer never dereferenced) |
//! | `containers` (feature `containers`) | `containers::unload` hands out slices over an unloaded pallet's mapping |
//! | `uring` (feature `uring`) | io_uring: pushing entries whose buffers the kernel uses until completion, registered buffers, the `IoBuf` traits, aligned allocations, xlate's bounce buffers |
//! | `vcm` (feature `uring`) | its io_uring ring (pushes, registered region), `msghdr` space, slices over the registered region |
//! | `semantics` (feature `semantics`; its `app`, `hide`, `regions`, `tcow` and `tcp` submodules) | slices over application buffers' views, segments over output regions, hiding, unmapping and moving out the pages of regions given up at output (and calibrate's probe of that), replacing a page under a writer (TCOW), buffers lent to io_uring sends and receives |
//! | `aio` (feature `tokio`) | registering an endpoint's descriptor with tokio's reactor (`AsyncFd::register_with_interest`), whose contract is that the descriptor stays open and the same while registered |
//!
//! `error`, [`stats`], `service`, `copy`, `testing` and the `sync` shim contain none.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![warn(unnameable_types)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// `unsafe` is denied at the root; each module below that needs it says so here (containers
// on its `unload` submodule), as listed under "Where `unsafe` lives" in the crate docs.
//
// Every layer is a private module; what a user needs is re-exported at the root, and a
// subsystem a user opts into (by feature, or by looking at counters) is one public
// namespace: `containers`, `uring` (with `uring::xlate`), `vcm`, `semantics`, `aio`,
// `stats`, and `testing` for the crate's own tests and tools.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[allow(unsafe_code)]
pub mod aio;
#[allow(unsafe_code)]
mod channel;
#[cfg(feature = "containers")]
#[cfg_attr(docsrs, doc(cfg(feature = "containers")))]
pub mod containers;
mod copy;
mod error;
#[allow(unsafe_code)]
mod iodata;
#[allow(unsafe_code)]
mod region;
#[allow(unsafe_code)]
mod segment;
#[cfg(feature = "semantics")]
#[cfg_attr(docsrs, doc(cfg(feature = "semantics")))]
pub mod semantics;
mod service;
pub mod stats;
mod sync;
#[allow(unsafe_code)]
mod sys;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod until;
#[cfg(feature = "uring")]
#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
#[allow(unsafe_code)]
pub mod uring;
#[cfg(feature = "uring")]
#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
#[allow(unsafe_code)]
pub mod vcm;

// Groups, domains and the fbufs of their lots.
pub use region::{
    Domain, DomainId, Group, GroupAccess, GroupConfig, Member, Pages, PathAllocator, PathConfig,
    HUGE_PAGE, SHARE_HUGE_FROM,
};
// Areas of a lot that a device writes (an AF_XDP UMEM), lent out piece by piece.
pub use iodata::{AreaLender, AreaRelease, LotArea};
// Data: immutable aggregates of fbuf fragments, and the writable form they are built in.
pub use iodata::{Fragment, IoData, IoDataMut, IoDataReader, Units};
pub use segment::{LotId, LotSpan, Segment};
// Point-to-point channels.
pub use channel::{ChannelConfig, FdKind, FdKinds, Fds, Loan, Receiver, SendSlot, Sender, MAX_FDS};
// Named services over channels: publish-subscribe and request-response.
pub use error::{BadDescriptor, Error, Result};
pub use service::{
    run_server, Caller, Client, Handler, Origin, Placement, Publisher, PublisherLoan, Publishing,
    Request, Response, Server, ServiceConfig, ServiceInfo, ServiceKind, SlowSubscriber, Subscriber,
    MAX_FAR, MAX_MEMBERS, MAX_NAME, MAX_SERVICES, STATUS_HANDLER_FAILED,
};
pub use sys::signal as stop;
pub use until::Until;
