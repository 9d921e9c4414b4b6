//! Application device channels for ferry (Druschel's ADCs on today's kernel): AF_XDP
//! sockets whose UMEM is an area of a ferry lot, granted by a privileged broker that
//! keeps the redirect program, the XSKMAP and the policy, with a normal UDP socket as
//! the fallback path.
//!
//! - [`bpf`]: the redirect programs, built from their instructions, and their XSKMAP.
//! - [`xsk`]: the application's rings, each received frame lent in place as ferry
//!   [`ferry::IoData`] and returned to the fill ring when released everywhere.
//! - [`broker`]: the `ferry-adc` broker (policy, grants, revocation by pidfd).
//! - [`proto`]: its wire protocol.
//! - [`AdcRx`]: the application API, AF_XDP or UDP (`recvmmsg`, or io_uring with the
//!   `uring` feature); [`AdcTx`]: sending from the lot on the same path.
//! - [`testnet`]: namespaces and a veth pair for tests and benchmarks.
//!
//! Every `unsafe` of the crate is in its private `sys` module.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod adc;
pub mod bpf;
pub mod broker;
pub mod proto;
#[allow(unsafe_code)]
mod sys;
pub mod testnet;
pub mod xsk;

pub use adc::{
    ask, AdcConfig, AdcRx, AdcStats, AdcTx, AdcTxStats, Fallback, Packet, RxPath, TxBuf,
};
pub use broker::{Broker, Policy};

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Waits until `fd` is readable or `timeout` passes (`None`: for ever).
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags};
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: t.subsec_nanos() as i64,
    });
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match rustix::event::poll(&mut fds, ts.as_ref()) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(io::Error::from_raw_os_error(e.raw_os_error())),
    }
}

/// Test and benchmark hooks: a socket made without a broker (needs `CAP_NET_RAW`).
pub mod direct {
    pub use crate::xsk::make_socket;
}
