//! Transports: the ways a message can go from one worker process to another.
//!
//! A transport has two halves:
//! - the harness half, [`TransportKind`], creates a one-way [`Link`] whose two
//!   [`LinkEnd`]s are handed to two worker processes (as inherited
//!   descriptors and a short spec string);
//! - the worker half, the [`Transport`] trait, opens a link end from its spec
//!   and moves messages. Worker code (`ferry-bench`'s `harness::chain::roles`) is generic over
//!   it, so every transport runs the very same loops.
//!
//! Adding a transport (for example ferry's channels):
//! 1. add a variant to [`TransportKind`] and create its links in [`TransportKind::links`];
//! 2. add a variant to [`WorkerTransport`] (in [`crate::protocol`]) and implement [`Transport`] for a new
//!    type in its own file beside `stream.rs`;
//! 3. dispatch the new variant in `ferry-bench`'s `worker::run`.
//!
//! 4. add it to the `TRANSPORTS` list of each benchmark that should measure
//!    it (`ferry-bench`'s `suites/fbufs/mod.rs`, `suites/fbufs_path/mod.rs`,
//!    `suites/fbufs_path/latency/mod.rs`). A transport appears in the output only
//!    once it is in such a list, and only with what it actually measured.

pub mod ack;
pub mod ferry;
pub mod stream;

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::protocol::{Wait, WorkerTransport};

/// Harness-side choice of transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// `pipe(2)`: the sender's `write` copies into the kernel, the receiver's `read` copies out.
    Pipe,
    /// `socketpair(AF_UNIX, SOCK_STREAM)`: the same two copies through a socket.
    Unix,
    /// fbufs handed over a ferry channel: no copy, the receiver reads the sender's pages.
    Ferry(ferry::Variant),
}

impl TransportKind {
    /// Untimed messages every trial at `size` needs first, whatever the byte budget
    /// says: ferry's sender cycles through at most `ferry::depth(size)` fbufs, and the
    /// warm-up must have faulted them all in (on both sides) before timing starts.
    pub fn min_warmup(self, size: usize) -> u32 {
        match self {
            TransportKind::Ferry(_) => 2 * ferry::depth(size) as u32 + 2,
            _ => 0,
        }
    }

    /// Short name used in JSON records.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Pipe => "pipe",
            TransportKind::Unix => "unix",
            TransportKind::Ferry(v) => v.name(),
        }
    }

    /// Name used in tables and plot legends.
    pub fn label(self) -> &'static str {
        match self {
            TransportKind::Pipe => "pipe copy",
            TransportKind::Unix => "Unix socket copy",
            TransportKind::Ferry(v) => v.label(),
        }
    }

    /// Which worker-side implementation opens this kind's link ends.
    pub fn worker(self) -> WorkerTransport {
        match self {
            TransportKind::Pipe | TransportKind::Unix => WorkerTransport::FdStream,
            TransportKind::Ferry(_) => WorkerTransport::Ferry,
        }
    }

    /// Creates `n` fresh one-way links for one chain, and the files to remove
    /// once the chain's workers are gone (ferry's group control block, should
    /// a worker die before leaving the group).
    pub fn links(self, n: usize) -> io::Result<(Vec<Link>, Vec<PathBuf>)> {
        match self {
            TransportKind::Pipe => Ok((
                (0..n)
                    .map(|_| stream::pipe_link())
                    .collect::<io::Result<_>>()?,
                Vec::new(),
            )),
            TransportKind::Unix => Ok((
                (0..n)
                    .map(|_| stream::unix_link())
                    .collect::<io::Result<_>>()?,
                Vec::new(),
            )),
            TransportKind::Ferry(v) => {
                let (links, file) = ferry::links(n, v)?;
                Ok((links, vec![file]))
            }
        }
    }
}

/// A one-way link between two workers, before it is handed out.
pub struct Link {
    pub tx: LinkEnd,
    pub rx: LinkEnd,
    /// Bytes the link buffers in the kernel, where that is known.
    pub capacity: Option<usize>,
}

/// One end of a link: what its worker is told, and what it inherits.
pub struct LinkEnd {
    /// Passed to the worker as `--tx SPEC` or `--rx SPEC`.
    pub spec: String,
    /// Descriptors the worker must inherit.
    pub fds: Vec<OwnedFd>,
}

/// Worker-side transport: opens link ends and moves messages.
pub trait Transport {
    type Tx: TxEnd;
    type Rx: RxEnd;

    fn open_tx(spec: &str, wait: Wait) -> io::Result<Self::Tx>;
    fn open_rx(spec: &str, wait: Wait) -> io::Result<Self::Rx>;

    /// A stage's step: receive the next `len`-byte message, let `touch` read
    /// it in place, and pass the same bytes on through `tx`.
    fn forward(
        rx: &mut Self::Rx,
        tx: &mut Self::Tx,
        len: usize,
        touch: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()>;
}

/// The sending end of a link.
pub trait TxEnd {
    /// Builds a new `len`-byte message in memory the transport chooses and
    /// sends it. `fill` is called once per fragment with the fragment's offset
    /// in the message; `stamp` is then called with the first fragment (at
    /// least 64 bytes) right before the hand-over.
    fn send_new(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]),
        stamp: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<()>;

    /// System calls the transport's library has made on this thread so far,
    /// where it counts them (ferry does; the kernel-copy transports do not).
    fn syscalls(&self) -> Option<u64> {
        None
    }
}

/// The receiving end of a link.
pub trait RxEnd {
    /// Waits for the next `len`-byte message and lets `touch` read each
    /// fragment in place, with its offset in the message.
    fn recv(&mut self, len: usize, touch: &mut dyn FnMut(usize, &[u8])) -> io::Result<()>;

    /// As [`TxEnd::syscalls`].
    fn syscalls(&self) -> Option<u64> {
        None
    }
}
