//! `DatagramSocket`: `std::net::UdpSocket`'s interface on an [`Endpoint`].
//!
//! Like the datagram library of the VCM paper, it hides command vectors: each socket keeps
//! one dormant loop accept for receiving, and a small cache of loop sends, one per recent
//! destination, so a steady stream of `send_to`/`recv_from` calls only re-activates
//! commands that are already placed. Payloads are copied between the caller's slice and
//! the endpoint's registered region (one copy, as with a plain socket).
//!
//! ```
//! use ferry::vcm::DatagramSocket;
//! # fn main() -> ferry::Result<()> {
//! # if !ferry::uring::Features::probe().ring { return Ok(()); }
//! let mut a = DatagramSocket::bind("127.0.0.1:0")?;
//! let mut b = DatagramSocket::bind("127.0.0.1:0")?;
//! a.connect(b.local_addr()?)?;
//! a.send(&[7; 3000])?;
//! let mut small = [0u8; 100];
//! let err = b.recv(&mut small).unwrap_err();      // truncation is an error, not silent
//! assert!(err.to_string().contains("truncated"), "{err}");
//! # Ok(()) }
//! ```

use std::io;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use super::command::{BufRange, Command, CommandId, SockHandle, Vector};
use super::endpoint::{Endpoint, EndpointConfig, EndpointStats};
use super::status::Status;
use crate::error::{Error, Result};

/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: u32 = 65507;

/// How many destinations keep an armed loop send.
const SEND_CACHE: usize = 8;

/// A UDP socket whose sends and receives are VCM commands on its own endpoint.
#[derive(Debug)]
pub struct DatagramSocket {
    ep: Endpoint,
    udp: UdpSocket,
    sock: SockHandle,
    recv_cmd: CommandId,
    recv_armed: bool,
    recv_cap: u32,
    send_off: u32,
    /// (destination, loop send, last use).
    sends: Vec<(Option<SocketAddr>, CommandId, u64)>,
    uses: u64,
    read_timeout: Option<Duration>,
}

fn to_addr(a: impl ToSocketAddrs) -> Result<SocketAddr> {
    a.to_socket_addrs()?
        .next()
        .ok_or(Error::InvalidArgument("no socket address given"))
}

fn truncated(len: u32, cap: usize) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("datagram of {len} bytes truncated to the {cap}-byte buffer"),
    ))
}

impl DatagramSocket {
    /// Binds a socket on a plain ring (one `io_uring_enter` per operation), receiving
    /// datagrams up to the UDP maximum.
    pub fn bind(addr: impl ToSocketAddrs) -> Result<DatagramSocket> {
        let opts = EndpointConfig {
            max_commands: 16,
            max_sockets: 1,
            ..EndpointConfig::new(0)
        };
        Self::bind_with(addr, opts, MAX_DATAGRAM)
    }

    /// Binds with the given endpoint options (for example SQPOLL); datagrams longer than
    /// `recv_capacity` bytes are reported as truncated. The region is sized here: the
    /// caller's `region_len` is ignored.
    pub fn bind_with(
        addr: impl ToSocketAddrs,
        mut opts: EndpointConfig,
        recv_capacity: u32,
    ) -> Result<DatagramSocket> {
        if recv_capacity == 0 {
            return Err(Error::InvalidArgument("recv_capacity must not be 0"));
        }
        let addr = to_addr(addr)?;
        crate::sys::count();
        let udp = UdpSocket::bind(addr)?;
        crate::sys::count();
        let dup = udp.try_clone()?;
        let recv_cap = recv_capacity;
        let page = crate::sys::page_size() as u32;
        let send_off = recv_cap
            .div_ceil(page)
            .checked_mul(page)
            .filter(|&o| o.checked_add(MAX_DATAGRAM).is_some())
            .ok_or(Error::InvalidArgument(
                "recv_capacity leaves no room for the send area in 4 GiB",
            ))?;
        opts.region_len = send_off as usize + MAX_DATAGRAM as usize;
        let mut ep = Endpoint::new(opts)?;
        let sock = ep.add_socket(dup.into())?;
        let mut v = Vector::new();
        v.push_dormant(Command::Accept {
            sock,
            buf: BufRange::new(0, recv_cap),
        });
        let recv_cmd = ep.submit(&v)?[0];
        Ok(DatagramSocket {
            ep,
            udp,
            sock,
            recv_cmd,
            recv_armed: false,
            recv_cap,
            send_off,
            sends: Vec::new(),
            uses: 0,
            read_timeout: None,
        })
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.udp.local_addr()?)
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        Ok(self.udp.peer_addr()?)
    }

    /// Connects: `send` goes to `addr`, and only datagrams from `addr` are received.
    pub fn connect(&mut self, addr: impl ToSocketAddrs) -> Result<()> {
        crate::sys::count();
        Ok(self.udp.connect(to_addr(addr)?)?)
    }

    /// Limits how long `recv`/`recv_from` wait; `None` waits for ever. On expiry they
    /// return [`Error::Timeout`] and the receive stays armed for the next call.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Joins an IPv4 multicast group on the interface with address `interface`.
    pub fn join_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> Result<()> {
        crate::sys::count();
        Ok(self.udp.join_multicast_v4(group, interface)?)
    }

    /// Leaves an IPv4 multicast group.
    pub fn leave_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> Result<()> {
        crate::sys::count();
        Ok(self.udp.leave_multicast_v4(group, interface)?)
    }

    /// The std socket underneath, for other socket options.
    pub fn std_socket(&self) -> &UdpSocket {
        &self.udp
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> EndpointStats {
        self.ep.stats()
    }

    /// Sends `buf` to `addr` as one datagram.
    pub fn send_to(&mut self, buf: &[u8], addr: impl ToSocketAddrs) -> Result<usize> {
        let to = to_addr(addr)?;
        self.send_inner(buf, Some(to))
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&mut self, buf: &[u8]) -> Result<usize> {
        self.send_inner(buf, None)
    }

    fn send_inner(&mut self, buf: &[u8], to: Option<SocketAddr>) -> Result<usize> {
        if buf.len() > MAX_DATAGRAM as usize {
            return Err(Error::Io(io::Error::from_raw_os_error(libc::EMSGSIZE)));
        }
        let range = BufRange::new(self.send_off, buf.len() as u32);
        self.ep.buf_mut(range)?.copy_from_slice(buf);
        let cmd = self.send_command(to)?;
        self.ep.activate(cmd, range)?;
        match self.ep.wait(cmd, None)? {
            Status::Done(n) => Ok(n as usize),
            Status::Failed(e) => Err(Error::Io(io::Error::from_raw_os_error(e))),
            other => Err(Error::Io(io::Error::other(format!(
                "send ended as {other:?}"
            )))),
        }
    }

    /// The cached loop send for `to`, placing one (and evicting the least recently used)
    /// on a miss.
    fn send_command(&mut self, to: Option<SocketAddr>) -> Result<CommandId> {
        self.uses += 1;
        if let Some(e) = self.sends.iter_mut().find(|e| e.0 == to) {
            e.2 = self.uses;
            return Ok(e.1);
        }
        if self.sends.len() >= SEND_CACHE {
            let (i, _) = self
                .sends
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.2)
                .expect("cache is full");
            let (_, old, _) = self.sends.swap_remove(i);
            // A send is never left in flight (send_inner waits), so this cannot fail.
            self.ep.release(old)?;
        }
        let mut v = Vector::new();
        v.push_dormant(Command::Send {
            sock: self.sock,
            buf: BufRange::new(self.send_off, 0),
            to,
        });
        let id = self.ep.submit(&v)?[0];
        self.sends.push((to, id, self.uses));
        Ok(id)
    }

    /// Receives one datagram into `buf`, returning its length and source. A datagram
    /// longer than `buf` (or than the socket's receive capacity) is an error that says so;
    /// the socket stays usable.
    pub fn recv_from(&mut self, buf: &mut [u8]) -> Result<(usize, SocketAddr)> {
        if !self.recv_armed {
            self.ep
                .activate(self.recv_cmd, BufRange::new(0, self.recv_cap))?;
            self.recv_armed = true;
        }
        let st = self.ep.wait(self.recv_cmd, self.read_timeout)?;
        self.recv_armed = false;
        let from = self.ep.source(self.recv_cmd)?;
        match st {
            Status::Done(n) => {
                let data = self.ep.buf(BufRange::new(0, n))?;
                let k = data.len().min(buf.len());
                buf[..k].copy_from_slice(&data[..k]);
                if k < data.len() {
                    return Err(truncated(n, buf.len()));
                }
                let from = from.ok_or_else(|| {
                    Error::Io(io::Error::other(
                        "datagram from a non-IP address (no source)",
                    ))
                })?;
                Ok((k, from))
            }
            Status::Truncated(n) => Err(truncated(n, self.recv_cap as usize)),
            Status::Failed(e) => Err(Error::Io(io::Error::from_raw_os_error(e))),
            other => Err(Error::Io(io::Error::other(format!(
                "receive ended as {other:?}"
            )))),
        }
    }

    /// Receives one datagram into `buf` (from the connected peer, if connected).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    /// Closes the socket (the same as dropping it): armed commands are cancelled first.
    pub fn close(self) {}
}
