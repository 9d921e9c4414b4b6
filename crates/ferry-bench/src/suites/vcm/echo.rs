//! The echo peer of `ferry-bench vcm`: answers every datagram on an inherited UDP socket
//! with the same bytes, using blocking `recv_from`/`send_to`, until it receives [`STOP`].

use std::net::UdpSocket;

use anyhow::{Context, Result};

use crate::protocol::{Sample, WorkerArgs};
use crate::sys;

/// The datagram that ends the peer (no measured message has this length and content).
pub const STOP: &[u8] = b"\0ferry-vcm-stop\0";

/// Runs the echo loop on the socket whose descriptor number is `--rx`.
pub fn run(args: &WorkerArgs) -> Result<Vec<Sample>> {
    let spec = args.rx.as_deref().context("--rx FD is required")?;
    let fd = spec.parse().context("--rx must be a descriptor number")?;
    let sock = UdpSocket::from(sys::inherited_fd(fd)?);
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("echo receive"),
        };
        if &buf[..n] == STOP {
            return Ok(Vec::new());
        }
        // A reply lost to a full buffer shows up as a timeout at the measuring side.
        let _ = sock.send_to(&buf[..n], from);
    }
}
