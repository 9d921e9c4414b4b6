//! VCM command vectors over io_uring, and datagram sockets built on them.
//!
//! Rosu's Virtual Communication Machine let an application place a batch of commands
//! (send, accept, accept-multiple, request, loop commands) in memory it shared with the
//! network adapter, activate the batch with one store, and poll a status word per command.
//! Here the adapter is the kernel: an [`Endpoint`] owns one io_uring (SQPOLL optional, so
//! activation needs no system call), a registered buffer region, and a registered-file
//! table of sockets. Commands name buffers as ranges of the region and sockets by
//! endpoint-issued handles, and the endpoint refuses anything else before submission.
//! [`DatagramSocket`] mirrors `std::net::UdpSocket` on top, keeping armed loop commands
//! cached the way the paper's socket library did.
//!
//! Where the kernel differs from the paper's adapter:
//!
//! - Activation. The VCM's processor watched status words; the kernel watches only its
//!   submission ring. So activating a vector or re-activating a loop command
//!   ([`Endpoint::activate`], a new offset and length) is a store of submission entries into
//!   that shared ring: no system call under SQPOLL while the kernel thread is awake, one
//!   `io_uring_enter` to wake it after it idled, one per activation without SQPOLL. Every
//!   enter is counted in [`EndpointStats`] and by [`crate::stats::thread_syscall_count`].
//! - Status words are written by [`Endpoint::poll`], which moves completions from the
//!   completion ring (shared memory) into them; neither polling nor reading them makes a
//!   system call.
//! - Order: commands are issued in vector order; runs of sends are linked
//!   (`IOSQE_IO_LINK`) so they leave in order; a request's receive is linked after its send.
//! - Accept-multiple: UDP receives do not report whether more data is queued
//!   (`IORING_CQE_F_SOCK_NONEMPTY` stays clear), so after each datagram the endpoint posts a
//!   non-waiting receive into the same buffer until the socket is empty, and reports the
//!   newest.
//! - Protection: buffers are ranges of the endpoint's own region and sockets are
//!   endpoint-issued handles; both are checked before submission. The region is also
//!   registered (`IORING_REGISTER_BUFFERS`), and zero-copy sends name it by index, so the
//!   kernel checks those ranges too.
//!
//! ```
//! use ferry::vcm::DatagramSocket;
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().ring { return Ok(()); }
//! let mut a = DatagramSocket::bind("127.0.0.1:0")?;
//! let mut b = DatagramSocket::bind("127.0.0.1:0")?;
//! a.send_to(b"ping", b.local_addr()?)?;
//! let mut buf = [0u8; 16];
//! let (n, from) = b.recv_from(&mut buf)?;
//! assert_eq!((&buf[..n], from), (&b"ping"[..], a.local_addr()?));
//! # Ok(()) }
//! ```

pub(crate) mod command;
pub(crate) mod datagram;
pub(crate) mod endpoint;
pub(crate) mod status;

pub use command::{BufRange, Command, CommandId, SockHandle, Vector};
pub use datagram::DatagramSocket;
pub use endpoint::{Endpoint, EndpointConfig, EndpointStats};
pub use status::{Status, StatusWord};
