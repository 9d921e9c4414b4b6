//! Commands and command vectors: what an application asks an [`Endpoint`] to do.
//!
//! Buffers are named as ranges of the endpoint's own region ([`BufRange`]) and sockets by
//! the handles the endpoint issued ([`SockHandle`]); the endpoint checks both before
//! anything reaches the kernel, the way the VCM refused commands naming another
//! application's buffers or connections.
//!
//! ```
//! use ferry::vcm::{BufRange, Command, SockHandle, Vector};
//! # fn demo(sock: SockHandle, to: std::net::SocketAddr) {
//! let mut v = Vector::new();
//! v.push(Command::Send { sock, buf: BufRange::new(0, 64), to: Some(to) });
//! v.push(Command::Accept { sock, buf: BufRange::new(4096, 2048) });
//! assert_eq!(v.len(), 2);
//! # }
//! ```
//!
//! [`Endpoint`]: super::Endpoint

use std::net::SocketAddr;

/// A range of an endpoint's buffer region: `offset .. offset + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufRange {
    /// First byte, from the start of the region.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl BufRange {
    /// The range `offset .. offset + len`.
    pub const fn new(offset: u32, len: u32) -> BufRange {
        BufRange { offset, len }
    }

    /// One past the last byte, without overflow.
    pub fn end(self) -> u64 {
        u64::from(self.offset) + u64::from(self.len)
    }

    /// True when the two ranges share a byte.
    pub fn overlaps(self, other: BufRange) -> bool {
        u64::from(self.offset) < other.end() && u64::from(other.offset) < self.end()
    }
}

/// A socket registered with an endpoint (a slot of its registered-file table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SockHandle {
    pub(crate) endpoint: u32,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// A command placed with [`Endpoint::submit`](super::Endpoint::submit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommandId {
    pub(crate) endpoint: u32,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// One VCM command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Send the bytes of `buf` as one datagram (or stream write) on `sock`, to `to` or to
    /// the connected peer when `to` is `None`. Its status is `Done(bytes sent)`.
    Send {
        /// The socket.
        sock: SockHandle,
        /// The message body.
        buf: BufRange,
        /// Destination for an unconnected datagram socket.
        to: Option<SocketAddr>,
    },
    /// Receive one message into `buf`. Its status is `Done(len)`, or `Truncated(len)`
    /// when the datagram was larger than `buf`.
    Accept {
        /// The socket.
        sock: SockHandle,
        /// Where the message lands.
        buf: BufRange,
    },
    /// Receive into `buf`, keeping only the most recent message: after each datagram the
    /// endpoint posts a non-waiting receive (`MSG_DONTWAIT`) into the same buffer, so a
    /// newer queued datagram overwrites the older one; when none is left (`EAGAIN`) the
    /// status word reports the newest. Older ones are counted in
    /// [`EndpointStats::discarded`](super::EndpointStats::discarded). Always a loop
    /// command: dormant after each delivery until re-activated.
    AcceptMultiple {
        /// The socket.
        sock: SockHandle,
        /// Where the newest message lands.
        buf: BufRange,
    },
    /// Send `send`, then receive the reply into `reply` (two linked submissions: the
    /// receive is issued only after the send completed). The status is the reply's.
    Request {
        /// The socket.
        sock: SockHandle,
        /// The request body.
        send: BufRange,
        /// Destination for an unconnected datagram socket.
        to: Option<SocketAddr>,
        /// Where the reply lands.
        reply: BufRange,
    },
    /// Remove a loop command: it is cancelled if armed, and its status becomes `Stopped`.
    AcceptStop {
        /// The loop command to stop.
        target: CommandId,
    },
}

impl Command {
    /// The socket the command uses, if any.
    pub fn socket(&self) -> Option<SockHandle> {
        match *self {
            Command::Send { sock, .. }
            | Command::Accept { sock, .. }
            | Command::AcceptMultiple { sock, .. }
            | Command::Request { sock, .. } => Some(sock),
            Command::AcceptStop { .. } => None,
        }
    }

    /// The buffer ranges the command reads or writes.
    pub fn buffers(&self) -> Vec<BufRange> {
        match *self {
            Command::Send { buf, .. }
            | Command::Accept { buf, .. }
            | Command::AcceptMultiple { buf, .. } => vec![buf],
            Command::Request { send, reply, .. } => vec![send, reply],
            Command::AcceptStop { .. } => Vec::new(),
        }
    }

    /// True for commands that store into their buffer.
    pub fn receives(&self) -> bool {
        matches!(
            self,
            Command::Accept { .. } | Command::AcceptMultiple { .. } | Command::Request { .. }
        )
    }
}

/// A batch of commands activated together by one [`Endpoint::submit`] call.
///
/// Commands are handed to the kernel in vector order. Each run of consecutive `Send`s is
/// linked (`IOSQE_IO_LINK`), so they leave in order even if one has to wait for socket
/// buffer space; a `Request` is always a linked send-then-receive. On a *stream* socket a
/// send that goes out short (its status `Done(n)` with `n` below its length) does not
/// stop the sends linked after it (io_uring breaks a link on errors only), so the stream
/// has a gap: check each send's count, or place one send at a time on streams. Accepts are posted in
/// order and are not linked, so a receive that waits does not hold back the sends after it.
/// A loop command ([`Vector::push_loop`]) stays with the endpoint after it completes and
/// runs again when [`Endpoint::activate`] writes a new offset and length for it.
///
/// [`Endpoint::submit`]: super::Endpoint::submit
/// [`Endpoint::activate`]: super::Endpoint::activate
#[derive(Debug, Clone, Default)]
pub struct Vector {
    pub(crate) commands: Vec<Placed>,
}

/// A command in a vector, with how it is placed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) cmd: Command,
    /// Stays with the endpoint after completing.
    pub(crate) looped: bool,
    /// Handed to the kernel now (false: a dormant loop command).
    pub(crate) arm: bool,
}

impl Vector {
    /// An empty vector.
    pub fn new() -> Vector {
        Vector::default()
    }

    /// Appends a one-shot command.
    pub fn push(&mut self, c: Command) -> &mut Vector {
        let looped = matches!(c, Command::AcceptMultiple { .. });
        self.commands.push(Placed {
            cmd: c,
            looped,
            arm: true,
        });
        self
    }

    /// Appends a loop command: armed now, dormant after each completion, and re-armed by
    /// [`Endpoint::activate`](super::Endpoint::activate).
    pub fn push_loop(&mut self, c: Command) -> &mut Vector {
        self.commands.push(Placed {
            cmd: c,
            looped: true,
            arm: true,
        });
        self
    }

    /// Appends a loop command without arming it: it stays dormant until activated.
    pub fn push_dormant(&mut self, c: Command) -> &mut Vector {
        self.commands.push(Placed {
            cmd: c,
            looped: true,
            arm: false,
        });
        self
    }

    /// Number of commands.
    pub fn len(&self) -> usize {
        self.commands.len()
    }

    /// True when the vector holds no command.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_only_when_they_share_a_byte() {
        let a = BufRange::new(0, 10);
        assert!(a.overlaps(BufRange::new(9, 1)));
        assert!(!a.overlaps(BufRange::new(10, 5)));
        assert!(!BufRange::new(u32::MAX, u32::MAX).overlaps(a));
        assert_eq!(
            BufRange::new(u32::MAX, u32::MAX).end(),
            2 * u64::from(u32::MAX)
        );
    }
}
