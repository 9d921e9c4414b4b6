//! Channel endpoints.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry::stats::ChannelStats;
use ferry::IoData;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::raise;
use crate::handle::{closable, Handle};
use crate::loan::{Deliver, PyLoan};
use crate::message::PyMessage;
use crate::path::PyPath;
use crate::wait::{blocking, timeout};

pub(crate) fn stats_dict(py: Python<'_>, s: ChannelStats) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("messages", s.messages)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("copied_bytes", s.copied_bytes)?;
    d.set_item("wakeups", s.wakeups)?;
    d.set_item("sleeps", s.sleeps)?;
    d.set_item("releases", s.releases)?;
    d.set_item("bad_from_peer", s.bad_from_peer)?;
    Ok(d)
}

/// What `send` accepts: a `Message`, or any bytes-like object (copied).
pub(crate) fn to_iodata(obj: &Bound<'_, PyAny>) -> PyResult<IoData> {
    if let Ok(m) = obj.cast::<PyMessage>() {
        return m.get().data();
    }
    let b = crate::buffer::Borrowed::get(obj, false)?;
    Ok(IoData::from_vec(b.as_slice().to_vec()))
}

/// The longest `spin` a receive accepts: spinning runs with the GIL released and cannot
/// look for signals (Ctrl-C) meanwhile.
const MAX_SPIN: f64 = 1.0;

/// A receive that may spin before it sleeps: `spin_for(d)` (the library's `recv_spin`,
/// which busy-polls for `d`) runs with the GIL released for up to `spin` seconds (and
/// never past `timeout`), and only then, if nothing came, `wait` sleeps for what is left
/// of `timeout`. A consumer on a CPU of its own saves the wake-up of a sleeping process
/// (tens of µs on these VMs) this way.
pub(crate) fn spin_then_block<T: Send>(
    py: Python<'_>,
    timeout_s: Option<f64>,
    spin: f64,
    spin_for: impl FnOnce(Duration) -> ferry::Result<T> + Send,
    wait: impl FnMut(Duration) -> ferry::Result<T> + Send,
) -> PyResult<T> {
    if !(spin.is_finite() && (0.0..=MAX_SPIN).contains(&spin)) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "spin must be between 0 and {MAX_SPIN} seconds, not {spin}"
        )));
    }
    let limit = timeout(timeout_s)?;
    let start = Instant::now();
    if spin > 0.0 {
        let spin = Duration::from_secs_f64(spin).min(limit.unwrap_or(Duration::MAX));
        match py.detach(|| spin_for(spin)) {
            Err(ferry::Error::Timeout) => {}
            got => return got.map_err(raise),
        }
    }
    let left = limit.map(|l| l.saturating_sub(start.elapsed()).as_secs_f64());
    blocking(py, left, wait)
}

/// The sending end of a channel.
#[pyclass(module = "ferry._ferry", name = "Sender", frozen)]
pub struct PySender {
    inner: Handle<Arc<ferry::Sender>>,
    /// The domain it sends from: `loan` allocates from a path of it, made at the first
    /// loan.
    domain: ferry::Domain,
    path: OnceLock<ferry::PathAllocator>,
}

impl PySender {
    pub(crate) fn new(tx: ferry::Sender, domain: ferry::Domain) -> Self {
        PySender {
            inner: Handle::new("Sender", Arc::new(tx)),
            domain,
            path: OnceLock::new(),
        }
    }

    fn default_path(&self) -> ferry::Result<&ferry::PathAllocator> {
        if let Some(p) = self.path.get() {
            return Ok(p);
        }
        let p = self.domain.path(ferry::PathConfig::default())?;
        // Another thread's path may have won the race: this one is dropped.
        Ok(self.path.get_or_init(|| p))
    }
}

closable! {
    PySender {
        /// Sends `message` (a `Message`, or bytes-like data, which is copied into an fbuf),
        /// waiting while the ring is full: at most `timeout` seconds (`None`: no limit), then
        /// `Timeout`. Raises `PeerGone` if the receiver died, `Disconnected` if it closed.
        /// `fds` (ints, or objects with `fileno()`) travel as cargo: the receiver gets its
        /// own duplicates (`recv_with_fds`); the caller keeps its own. `TooManyFds` past
        /// `ferry.MAX_FDS`.
        #[pyo3(signature = (message, timeout = None, *, fds = None))]
        fn send(
            &self,
            py: Python<'_>,
            message: &Bound<'_, PyAny>,
            timeout: Option<f64>,
            fds: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<()> {
            let data = to_iodata(message)?;
            let tx = self.inner.get()?;
            let given = crate::fds::given(fds)?;
            let fds = given.borrowed();
            blocking(py, timeout, |slice| {
                tx.send_with_fds_until(&data, &fds, Some(Instant::now() + slice))
            })
        }

        /// A message of `size` bytes to write in place and send, for a `with` block:
        ///
        ///     with tx.loan(len(frame)) as buf:   # buf: a writable memoryview
        ///         buf[:] = frame                 # or numpy.frombuffer(buf, ...)
        ///
        /// The fbuf comes from `path` (default: a path of this sender's domain, made at
        /// the first loan), at once: `QuotaExceeded` if the path's receivers hold its
        /// quota (allocation never waits). Leaving the block normally sends the message,
        /// waiting for room as `send` does (`timeout` seconds, `None`: no limit); leaving
        /// it with an exception sends nothing and gives the fbuf back. Either way the
        /// memoryview is released: using it afterwards raises `ValueError`. Views made
        /// from it (numpy arrays) must be gone by the end of the block, or the message is
        /// not sent and `BufferError` is raised.
        #[pyo3(signature = (size, *, path = None, timeout = None))]
        fn loan(
            &self,
            py: Python<'_>,
            size: usize,
            path: Option<&Bound<'_, PyPath>>,
            timeout: Option<f64>,
        ) -> PyResult<PyLoan> {
            crate::wait::timeout(timeout)?;
            let tx = self.inner.get()?;
            let data = match path {
                Some(p) => p.get().inner.alloc(size),
                None => self.default_path().and_then(|p| p.alloc(size)),
            }
            .map_err(raise)?;
            PyLoan::new(py, Box::new(tx), data, timeout)
        }

        /// Sends `message` if the ring has room, never blocking; raises `Full` otherwise.
        fn try_send(&self, message: &Bound<'_, PyAny>) -> PyResult<()> {
            let data = to_iodata(message)?;
            self.inner.get()?.try_send(&data).map_err(raise)
        }

        /// Messages sent and not yet released by the receiver.
        #[getter]
        fn in_flight(&self) -> PyResult<usize> {
            Ok(self.inner.get()?.in_flight())
        }

        /// Drains pending releases now (sending and allocating do this too).
        fn collect_releases(&self) -> PyResult<()> {
            self.inner.get()?.collect_releases().map_err(raise)
        }

        /// Checks whether the receiver lives; if it died, takes back everything it held and
        /// raises `PeerGone`.
        fn check_peer(&self) -> PyResult<()> {
            self.inner.get()?.check_peer().map_err(raise)
        }

        /// The receiver's domain id.
        #[getter]
        fn peer(&self) -> PyResult<String> {
            Ok(self.inner.get()?.peer().to_string())
        }

        /// The receiver's process id.
        #[getter]
        fn peer_pid(&self) -> PyResult<u32> {
            Ok(self.inner.get()?.peer_pid())
        }

        /// The channel's counters at this end.
        fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            stats_dict(py, self.inner.get()?.stats())
        }

        fn __repr__(&self) -> String {
            match self.inner.get() {
                Ok(t) => format!("<ferry.Sender to {}>", t.peer()),
                Err(_) => "<ferry.Sender (closed)>".into(),
            }
        }
    }
}

/// The receiving end of a channel. Use it from one thread at a time.
#[pyclass(module = "ferry._ferry", name = "Receiver", frozen)]
pub struct PyReceiver {
    inner: Handle<Arc<Mutex<ferry::Receiver>>>,
    fd: i32,
    pid: u32,
}

impl PyReceiver {
    pub(crate) fn new(rx: ferry::Receiver) -> Self {
        PyReceiver {
            fd: rx.as_raw_fd(),
            pid: rx.peer_pid(),
            inner: Handle::new("Receiver", Arc::new(Mutex::new(rx))),
        }
    }

    fn rx(&self) -> PyResult<Arc<Mutex<ferry::Receiver>>> {
        self.inner.get()
    }
}

fn lock(m: &Mutex<ferry::Receiver>) -> std::sync::MutexGuard<'_, ferry::Receiver> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

closable! {
    PyReceiver {
        /// Receives the next message, waiting at most `timeout` seconds (`None`: no limit),
        /// then raising `Timeout`. Raises `PeerGone` once the sender died and everything it
        /// sent was received, `Disconnected` once it closed and the ring is drained.
        /// `spin` (seconds, at most 1) polls for that long before sleeping, with the GIL
        /// released: for a consumer on a CPU of its own, it saves the wake-up of a
        /// sleeping process.
        #[pyo3(signature = (timeout = None, spin = 0.0))]
        fn recv(&self, py: Python<'_>, timeout: Option<f64>, spin: f64) -> PyResult<PyMessage> {
            let rx = self.rx()?;
            let got = spin_then_block(
                py,
                timeout,
                spin,
                |d| lock(&rx).recv_spin(d),
                |slice| lock(&rx).recv_timeout(slice),
            )?;
            Ok(PyMessage::new(got))
        }

        /// Receives the next message and the descriptors it carried, as `(Message, Fds)`,
        /// waiting as `recv` does. `kinds` (names: "memfd", "dma-buf", "sync_file",
        /// "eventfd", "pipe", "socket", "other"; default all but "other") are the kinds
        /// accepted: a message carrying another raises `FdRefused` and is dropped.
        /// `FdsLost` if the sender died before they were taken.
        #[pyo3(signature = (timeout = None, *, kinds = None))]
        fn recv_with_fds(
            &self,
            py: Python<'_>,
            timeout: Option<f64>,
            kinds: Option<Vec<String>>,
        ) -> PyResult<(PyMessage, crate::fds::PyFds)> {
            let kinds = crate::fds::kinds(kinds)?;
            let rx = self.rx()?;
            let (d, f) = blocking(py, timeout, |slice| {
                let mut r = lock(&rx);
                r.set_fd_kinds(kinds);
                r.recv_with_fds_timeout(slice)
            })?;
            Ok((PyMessage::new(d), crate::fds::PyFds::new(f)))
        }

        /// The next message if one is ready, else `None`; never blocks.
        fn try_recv(&self) -> PyResult<Option<PyMessage>> {
            let rx = self.rx()?;
            let got = lock(&rx).try_recv().map_err(raise)?;
            Ok(got.map(PyMessage::new))
        }

        /// Prepares to wait on `fileno()`: returns False if a message is already waiting
        /// (call `try_recv`), True if the fd will turn readable when the next one arrives.
        fn arm(&self) -> PyResult<bool> {
            let rx = self.rx()?;
            let armed = lock(&rx).arm().map_err(raise)?;
            Ok(armed)
        }

        /// The eventfd that turns readable when a message arrives for an armed receiver
        /// (for `select`, `selectors`, `asyncio` `add_reader`).
        fn fileno(&self) -> PyResult<i32> {
            self.rx()?;
            Ok(self.fd)
        }

        /// The sender's process id.
        #[getter]
        fn peer_pid(&self) -> u32 {
            self.pid
        }

        /// Releases that could not be sent back yet.
        #[getter]
        fn pending_releases(&self) -> PyResult<usize> {
            let rx = self.rx()?;
            let n = lock(&rx).pending_releases();
            Ok(n)
        }

        /// The channel's counters at this end.
        fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let rx = self.rx()?;
            let s = lock(&rx).stats();
            stats_dict(py, s)
        }

        fn __repr__(&self) -> String {
            format!("<ferry.Receiver from pid {}>", self.pid)
        }
    }
}

impl Deliver for Arc<ferry::Sender> {
    fn deliver(&self, py: Python<'_>, data: &IoData, timeout: Option<f64>) -> PyResult<usize> {
        blocking(py, timeout, |slice| self.send_timeout(data, slice))?;
        Ok(1)
    }
}
