//! Which io_uring features the running kernel has, probed once per process, and one
//! place that builds rings from [`RingConfig`].
//!
//! Probing makes real calls: `io_uring_setup(2)` for a plain and an SQPOLL ring,
//! `io_uring_register(2)` with `IORING_REGISTER_PROBE` for the opcode list, and
//! `IORING_REGISTER_BUFFERS2` with `IORING_RSRC_REGISTER_SPARSE` for a sparse buffer
//! table. A ring may be missing altogether (`kernel.io_uring_disabled`, seccomp); then
//! [`Features::ring`] is false and every constructor in [`crate::uring`] returns
//! [`Error::Unsupported`].

use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring, Probe};

use crate::error::{Error, Result};

/// What the running kernel's io_uring offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    /// `io_uring_setup` works at all. When false, `why_not` says what it returned.
    pub ring: bool,
    /// A ring with `IORING_SETUP_SQPOLL` can be created by this process.
    pub sqpoll: bool,
    /// `IORING_OP_READ_FIXED` / `WRITE_FIXED` (registered buffers).
    pub fixed_rw: bool,
    /// A sparse buffer table (`IORING_REGISTER_BUFFERS2` + `IORING_RSRC_REGISTER_SPARSE`),
    /// updated slot by slot with `IORING_REGISTER_BUFFERS_UPDATE`.
    pub sparse_buffers: bool,
    /// `IORING_OP_SEND_ZC` (zero-copy send with a notification completion).
    pub send_zc: bool,
    /// `IORING_OP_SENDMSG_ZC`.
    pub sendmsg_zc: bool,
    /// `IORING_OP_RECV` / `RECVMSG` (multishot receive needs kernel 6.0, the same release
    /// as SEND_ZC, so it is assumed with [`Features::send_zc`]).
    pub recv_multishot: bool,
    /// Registered (fixed) files.
    pub fixed_files: bool,
    /// `IORING_OP_WRITE_FIXED` on a socket sends from a registered buffer with one
    /// completion and no zero-copy notification (probed with a real write over an
    /// `AF_UNIX` socket pair whose bytes are read back). Plain `IORING_OP_SEND` refuses
    /// `IORING_RECVSEND_FIXED_BUF` (`EINVAL`, seen on 6.18), so this is the fixed-buffer
    /// send that does not wait for the peer.
    pub socket_write_fixed: bool,
    /// Why the ring or SQPOLL could not be set up, if it could not.
    pub why_not: Option<String>,
}

impl Features {
    /// Probes the kernel once; later calls return the cached answer.
    pub fn probe() -> &'static Features {
        static FEATURES: OnceLock<Features> = OnceLock::new();
        FEATURES.get_or_init(probe_now)
    }

    /// Returns `Ok` when `have` is true, or [`Error::Unsupported`] naming `feature`.
    pub fn require(&self, have: bool, feature: &'static str) -> Result<()> {
        if have {
            Ok(())
        } else {
            Err(Error::Unsupported {
                feature,
                why: self
                    .why_not
                    .clone()
                    .unwrap_or_else(|| "not offered by this kernel".into()),
            })
        }
    }
}

fn probe_now() -> Features {
    let mut f = Features {
        ring: false,
        sqpoll: false,
        fixed_rw: false,
        sparse_buffers: false,
        send_zc: false,
        sendmsg_zc: false,
        recv_multishot: false,
        fixed_files: false,
        socket_write_fixed: false,
        why_not: None,
    };
    crate::sys::count();
    let ring = match IoUring::new(4) {
        Ok(r) => r,
        Err(e) => {
            f.why_not = Some(format!("io_uring_setup: {e}"));
            return f;
        }
    };
    f.ring = true;
    let mut probe = Probe::new();
    crate::sys::count();
    if ring.submitter().register_probe(&mut probe).is_ok() {
        f.fixed_rw = probe.is_supported(opcode::ReadFixed::CODE)
            && probe.is_supported(opcode::WriteFixed::CODE);
        f.send_zc = probe.is_supported(opcode::SendZc::CODE);
        f.sendmsg_zc = probe.is_supported(opcode::SendMsgZc::CODE);
        f.recv_multishot = f.send_zc && probe.is_supported(opcode::RecvMsg::CODE);
    }
    crate::sys::count();
    f.sparse_buffers = ring.submitter().register_buffers_sparse(4).is_ok();
    crate::sys::count();
    f.fixed_files = ring.submitter().register_files_sparse(4).is_ok();
    f.socket_write_fixed = f.fixed_rw && socket_write_fixed();
    crate::sys::count();
    match IoUring::<io_uring::squeue::Entry, io_uring::cqueue::Entry>::builder()
        .setup_sqpoll(10)
        .build(4)
    {
        Ok(_) => f.sqpoll = true,
        Err(e) => f.why_not = Some(format!("SQPOLL ring: {e}")),
    }
    f
}

/// Writes 64 bytes from a registered buffer to one end of a socket pair with
/// `IORING_OP_WRITE_FIXED` and checks that one completion says 64 and that the other end
/// reads exactly those bytes.
fn socket_write_fixed() -> bool {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let Ok((a, mut b)) = std::os::unix::net::UnixStream::pair() else {
        return false;
    };
    let data: Box<[u8; 64]> = Box::new(std::array::from_fn(|i| (i * 7 + 3) as u8));
    // Declared after `data`, so dropped (and the registration gone) before it.
    crate::sys::count();
    let Ok(mut ring) = IoUring::new(2) else {
        return false;
    };
    let iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    crate::sys::count();
    // SAFETY: `data` outlives `ring` (see above), so the registered memory stays valid for
    // as long as it is registered; the kernel only reads it.
    if unsafe { ring.submitter().register_buffers(&[iov]) }.is_err() {
        return false;
    }
    let e = opcode::WriteFixed::new(types::Fd(a.as_raw_fd()), data.as_ptr(), 64, 0)
        .offset(0)
        .build();
    // SAFETY: the SQE names registered buffer 0 (`data`), which outlives the ring.
    if unsafe { ring.submission().push(&e) }.is_err() {
        return false;
    }
    crate::sys::count();
    if ring.submit_and_wait(1).is_err() {
        return false;
    }
    let cqes: Vec<(i32, u32)> = ring.completion().map(|c| (c.result(), c.flags())).collect();
    if cqes != [(64, 0)] {
        return false;
    }
    let mut back = [0u8; 64];
    crate::sys::count();
    b.read_exact(&mut back).is_ok() && back == *data
}

/// How to build a ring. The defaults are a plain 256-entry ring.
///
/// ```
/// use ferry::uring::RingConfig;
/// # fn main() -> ferry::Result<()> {
/// # if !ferry::uring::Features::probe().ring { return Ok(()); }
/// let ring = RingConfig::new(64).build()?;
/// assert!(ring.params().sq_entries() >= 64);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// Submission queue entries (rounded up to a power of two by the kernel).
    pub entries: u32,
    /// Completion queue entries; `None` lets the kernel pick twice `entries`.
    pub cq_entries: Option<u32>,
    /// Run a kernel thread that polls the submission queue (`IORING_SETUP_SQPOLL`),
    /// going to sleep after this many milliseconds without work.
    pub sqpoll_idle_ms: Option<u32>,
    /// Pin the SQPOLL thread to this CPU.
    pub sqpoll_cpu: Option<u32>,
}

impl RingConfig {
    /// A plain ring of `entries` submission entries.
    pub fn new(entries: u32) -> RingConfig {
        RingConfig {
            entries,
            cq_entries: None,
            sqpoll_idle_ms: None,
            sqpoll_cpu: None,
        }
    }

    /// Asks for an SQPOLL ring whose kernel thread sleeps after `idle_ms` without work.
    pub fn sqpoll(mut self, idle_ms: u32) -> RingConfig {
        self.sqpoll_idle_ms = Some(idle_ms);
        self
    }

    /// Builds the ring: one `io_uring_setup(2)`. A missing feature is
    /// [`Error::Unsupported`], any other failure [`Error::Io`].
    pub fn build(&self) -> Result<IoUring> {
        let f = Features::probe();
        f.require(f.ring, "io_uring")?;
        if self.sqpoll_idle_ms.is_some() {
            f.require(f.sqpoll, "SQPOLL")?;
        }
        if self.entries == 0 {
            return Err(Error::InvalidArgument("a ring needs at least one entry"));
        }
        let mut b = IoUring::builder();
        if let Some(idle) = self.sqpoll_idle_ms {
            b.setup_sqpoll(idle);
            if let Some(cpu) = self.sqpoll_cpu {
                b.setup_sqpoll_cpu(cpu);
            }
        }
        if let Some(cq) = self.cq_entries {
            b.setup_cqsize(cq);
        }
        crate::sys::count();
        Ok(b.build(self.entries)?)
    }
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig::new(256)
    }
}

/// For unit tests: whether this kernel has io_uring; if not, says the test is skipped.
#[cfg(test)]
pub(crate) fn have_ring_or_skip() -> bool {
    let have = Features::probe().ring;
    if !have {
        eprintln!("skipped: no io_uring here");
    }
    have
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_cached_and_consistent() {
        let a = Features::probe();
        let b = Features::probe();
        assert!(std::ptr::eq(a, b));
        if !a.ring {
            eprintln!("skipped: no io_uring here ({:?})", a.why_not);
            return;
        }
        // SEND_ZC and multishot receive arrived together (6.0).
        assert!(!a.recv_multishot || a.send_zc);
    }

    #[test]
    fn zero_entries_is_refused() {
        if !Features::probe().ring {
            eprintln!("skipped: no io_uring here");
            return;
        }
        assert!(matches!(
            RingConfig::new(0).build(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn missing_feature_is_a_clear_error() {
        let f = Features {
            ring: false,
            why_not: Some("disabled".into()),
            ..Features::probe().clone()
        };
        let e = f.require(f.ring, "io_uring").unwrap_err();
        assert!(e.to_string().contains("io_uring"), "{e}");
        assert!(e.to_string().contains("disabled"), "{e}");
    }
}
