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

pub mod command;
pub mod datagram;
pub mod endpoint;
pub mod status;

pub use command::{BufRange, Command, CommandId, SockHandle, Vector};
pub use datagram::DatagramSocket;
pub use endpoint::{Endpoint, EndpointOptions, EndpointStats};
pub use status::{Status, StatusWord};
