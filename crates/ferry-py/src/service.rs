//! Named services: publish-subscribe and request-response.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ferry::Member;
use ferry::Request;
use ferry::{Client, Publisher, Server, ServiceConfig, SlowSubscriber, Subscriber, Until};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::channel::{spin_then_block, stats_dict, to_iodata};
use crate::errors::raise;
use crate::handle::{closable, Handle};
use crate::loan::{Deliver, PyLoan};
use crate::message::PyMessage;
use crate::path::PyPath;
use crate::region::{domain_of, member};
use crate::wait::{blocking, interruptible, timeout};

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn config(depth: Option<u32>, slow: &str, reply_timeout: Option<f64>) -> PyResult<ServiceConfig> {
    let mut c = ServiceConfig::default();
    if let Some(d) = depth {
        c.depth = d;
    }
    c.slow = match slow {
        "drop" => SlowSubscriber::Drop,
        "block" => SlowSubscriber::Block,
        other => {
            return Err(PyValueError::new_err(format!(
                "slow must be \"drop\" or \"block\", not {other:?}"
            )))
        }
    };
    if let Some(t) = timeout(reply_timeout)? {
        c.reply_timeout = t;
    }
    Ok(c)
}

/// Opens the using end of service `name` with `open` (`Subscriber::open_until`,
/// `Client::open_until`) on `domain`, waiting up to `timeout` seconds (`None`: no limit)
/// without the GIL, and honouring Ctrl-C.
fn open_on<T: Send>(
    py: Python<'_>,
    domain: &Bound<'_, PyAny>,
    name: &str,
    timeout: Option<f64>,
    open: fn(&ferry::Domain, &str, Until<'_>) -> ferry::Result<T>,
) -> PyResult<T> {
    let d = domain_of(domain)?;
    interruptible(py, timeout, |until| open(&d, name, until))
}

/// Publishes `data` from `p` to every subscriber, waiting at most `timeout` seconds
/// (`None`: no limit) for room under `slow="block"`, without the GIL and honouring Ctrl-C;
/// returns how many subscribers were handed it.
fn publish(
    py: Python<'_>,
    p: &Shared<Publisher>,
    data: &ferry::IoData,
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: Option<f64>,
) -> PyResult<usize> {
    let deadline = crate::wait::deadline(timeout)?;
    let mut publishing = py
        .detach(|| lock(p).begin_publish_with_fds(data, fds))
        .map_err(raise)?;
    if publishing.waiting() > 0 {
        // In slices (the lock is taken with the GIL held by `stats` and the like); the
        // queues still full at the deadline do not get the message.
        crate::wait::interruptible_until(py, deadline, |until| {
            match until.sliced(|slice| lock(p).wait_publish(&mut publishing, slice)) {
                // `end_publish` says so.
                Err(ferry::Error::Timeout) => Ok(()),
                other => other,
            }
        })?;
    }
    py.detach(|| lock(p).end_publish(publishing)).map_err(raise)
}

/// A publisher's loan, open until dropped: a second `Publisher.loan` is refused meanwhile,
/// as Rust's `Publisher::loan` borrows the publisher until the loan is sent or dropped.
struct OpenLoan {
    publisher: Shared<Publisher>,
    open: Arc<AtomicBool>,
}

impl Deliver for OpenLoan {
    fn deliver(
        &self,
        py: Python<'_>,
        data: &ferry::IoData,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        publish(py, &self.publisher, data, &[], timeout)
    }
}

impl Drop for OpenLoan {
    fn drop(&mut self) {
        self.open.store(false, Ordering::Release);
    }
}

/// The publishing end of a named publish-subscribe service.
#[pyclass(module = "ferry._ferry", name = "Publisher", frozen)]
pub struct PyPublisher {
    inner: Handle<Shared<Publisher>>,
    /// A loan is open (`loan` to the end of its block).
    loan_open: Arc<AtomicBool>,
}

closable! {
    PyPublisher {
        /// Offers publish-subscribe service `name` from `domain`. Each subscriber's queue
        /// holds `depth` messages; when one is full, `slow="drop"` makes it miss the message
        /// and `slow="block"` makes `publish` wait. Raises `ServiceExists` if a live domain
        /// offers `name` already.
        #[new]
        #[pyo3(signature = (domain, name, *, depth = None, slow = "drop"))]
        fn new(
            py: Python<'_>,
            domain: &Bound<'_, PyAny>,
            name: &str,
            depth: Option<u32>,
            slow: &str,
        ) -> PyResult<Self> {
            let d = domain_of(domain)?;
            let c = config(depth, slow, None)?;
            let p = py.detach(|| Publisher::offer(&d, name, c)).map_err(raise)?;
            Ok(PyPublisher {
                inner: Handle::new("Publisher", Arc::new(Mutex::new(p))),
                loan_open: Arc::new(AtomicBool::new(false)),
            })
        }

        /// A message of `size` bytes to write in place and publish to every subscriber,
        /// for a `with` block:
        ///
        ///     with publisher.loan(len(frame)) as buf:   # buf: a writable memoryview
        ///         buf[:] = frame                        # or numpy.frombuffer(buf, ...)
        ///
        /// The fbuf comes from the publisher's own path (or `path`), at once:
        /// `QuotaExceeded` while the subscribers hold its quota (allocation never waits).
        /// Leaving the block normally publishes the message as `publish` does (one fbuf,
        /// shared by every subscriber; under `slow="block"` waiting at most `timeout`
        /// seconds for room, `None`: no limit, interruptible by Ctrl-C); the loan's
        /// `delivered` then says how many subscribers got it. Leaving it with an
        /// exception publishes nothing and gives the fbuf back. One loan at a time: a
        /// second one while the first's block has not ended raises `RuntimeError`. Views
        /// made from the memoryview must be gone by the end of the block (`BufferError`,
        /// nothing published), as for `Sender.loan`.
        #[pyo3(signature = (size, *, path = None, timeout = None))]
        fn loan(
            &self,
            py: Python<'_>,
            size: usize,
            path: Option<&Bound<'_, PyPath>>,
            timeout: Option<f64>,
        ) -> PyResult<PyLoan> {
            crate::wait::timeout(timeout)?;
            let p = self.inner.get()?;
            if self.loan_open.swap(true, Ordering::AcqRel) {
                return Err(PyRuntimeError::new_err(
                    "this publisher has a loan open: end its with block (or drop it) first",
                ));
            }
            // From here on, dropping `open` (on any error too) ends the loan.
            let open = OpenLoan {
                publisher: p.clone(),
                open: self.loan_open.clone(),
            };
            let data = match path {
                Some(path) => path.get().inner.alloc(size),
                None => py.detach(|| lock(&p).path().alloc(size)),
            }
            .map_err(raise)?;
            PyLoan::new(py, Box::new(open), data, timeout)
        }

        /// Publishes `message` (a `Message`, or bytes-like data, copied once into the
        /// publisher's lot) to every subscriber; returns how many were handed it. Under
        /// `slow="block"`, waits at most `timeout` seconds for room (`None`: no limit).
        /// `fds` travel as cargo, as for `Sender.send` (each subscriber gets its own
        /// duplicates).
        #[pyo3(signature = (message, timeout = None, *, fds = None))]
        fn publish(
            &self,
            py: Python<'_>,
            message: &Bound<'_, PyAny>,
            timeout: Option<f64>,
            fds: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<usize> {
            let data = to_iodata(message)?;
            let p = self.inner.get()?;
            let given = crate::fds::given(fds)?;
            publish(py, &p, &data, &given.borrowed(), timeout)
        }

        /// Waits up to `timeout` seconds (`None`: no limit) until `n` subscribers are
        /// connected (`Timeout`).
        #[pyo3(signature = (n, timeout = 5.0))]
        fn wait_for_subscribers(&self, py: Python<'_>, n: usize, timeout: Option<f64>) -> PyResult<()> {
            let p = self.inner.get()?;
            blocking(py, timeout, |slice| lock(&p).wait_for_subscribers(n, slice))
        }

        /// Connected subscribers.
        #[getter]
        fn subscriber_count(&self) -> PyResult<usize> {
            Ok(lock(&*self.inner.get()?).subscriber_count())
        }

        /// Each subscriber as a dict: `id`, `pid`, `delivered`, `dropped`, `in_flight`.
        fn subscribers<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
            let subs = lock(&*self.inner.get()?).subscribers();
            subs.into_iter()
                .map(|s| {
                    let d = PyDict::new(py);
                    d.set_item("id", s.member.id.to_string())?;
                    d.set_item("pid", s.member.pid)?;
                    d.set_item("delivered", s.delivered)?;
                    d.set_item("dropped", s.dropped)?;
                    d.set_item("in_flight", s.in_flight)?;
                    Ok(d)
                })
                .collect()
        }

        /// Drains the subscribers' releases now (publishing does this too).
        fn collect_releases(&self) -> PyResult<()> {
            lock(&*self.inner.get()?).collect_releases();
            Ok(())
        }

        /// The publisher's counters.
        fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let s = lock(&*self.inner.get()?).stats();
            let d = PyDict::new(py);
            d.set_item("published", s.published)?;
            d.set_item("delivered", s.delivered)?;
            d.set_item("dropped", s.dropped)?;
            d.set_item("copied_bytes", s.copied_bytes)?;
            d.set_item("departed", s.departed)?;
            Ok(d)
        }

        /// The service's name.
        #[getter]
        fn name(&self) -> PyResult<String> {
            Ok(lock(&*self.inner.get()?).name().to_owned())
        }
    }
}

/// The subscribing end of a named publish-subscribe service.
#[pyclass(module = "ferry._ferry", name = "Subscriber", frozen)]
pub struct PySubscriber {
    inner: Handle<Shared<Subscriber>>,
    fd: i32,
    publisher: Member,
}

closable! {
    PySubscriber {
        /// Subscribes `domain` to service `name`, waiting up to `timeout` seconds for it to
        /// be offered and for the publisher to connect (`NoSuchService`, `Timeout`).
        #[new]
        #[pyo3(signature = (domain, name, timeout = 5.0))]
        fn new(
            py: Python<'_>,
            domain: &Bound<'_, PyAny>,
            name: &str,
            timeout: Option<f64>,
        ) -> PyResult<Self> {
            let s = open_on(py, domain, name, timeout, Subscriber::open_until)?;
            Ok(PySubscriber {
                fd: s.as_fd().as_raw_fd(),
                publisher: s.publisher(),
                inner: Handle::new("Subscriber", Arc::new(Mutex::new(s))),
            })
        }

        /// Receives the next message, waiting at most `timeout` seconds (`None`: no limit;
        /// then `Timeout`). Raises `PeerGone` once the publisher died and its queued
        /// messages were taken, `Disconnected` once it withdrew. `spin` (seconds, at most
        /// 1) polls for that long before sleeping, with the GIL released, as
        /// `Receiver.recv` does.
        #[pyo3(signature = (timeout = None, spin = 0.0))]
        fn recv(&self, py: Python<'_>, timeout: Option<f64>, spin: f64) -> PyResult<PyMessage> {
            let s = self.inner.get()?;
            let got = spin_then_block(
                py,
                timeout,
                spin,
                |d| lock(&s).recv_spin(d),
                |slice| lock(&s).recv_timeout(slice),
            )?;
            Ok(PyMessage::new(got))
        }

        /// Receives the next message and its descriptors, as `Receiver.recv_with_fds`.
        #[pyo3(signature = (timeout = None, *, kinds = None))]
        fn recv_with_fds(
            &self,
            py: Python<'_>,
            timeout: Option<f64>,
            kinds: Option<Vec<String>>,
        ) -> PyResult<(PyMessage, crate::fds::PyFds)> {
            let kinds = crate::fds::kinds(kinds)?;
            let s = self.inner.get()?;
            let (d, f) = blocking(py, timeout, |slice| {
                let mut s = lock(&s);
                s.set_fd_kinds(kinds);
                s.recv_with_fds_timeout(slice)
            })?;
            Ok((PyMessage::new(d), crate::fds::PyFds::new(f)))
        }

        /// The next queued message, or `None`; never blocks.
        fn try_recv(&self) -> PyResult<Option<PyMessage>> {
            let s = self.inner.get()?;
            let got = lock(&s).try_recv().map_err(raise)?;
            Ok(got.map(PyMessage::new))
        }

        /// Prepares to wait on `fileno()`; False if a message is already queued.
        fn arm(&self) -> PyResult<bool> {
            let s = self.inner.get()?;
            let armed = lock(&s).arm().map_err(raise)?;
            Ok(armed)
        }

        /// The eventfd that turns readable when a message arrives after `arm()`.
        fn fileno(&self) -> PyResult<i32> {
            self.inner.get()?;
            Ok(self.fd)
        }

        /// The publisher's `(domain id, pid)`.
        #[getter]
        fn publisher(&self) -> (String, u32) {
            member(self.publisher)
        }

        /// The publisher's process id (what `ferry.aio.recv` watches).
        #[getter]
        fn peer_pid(&self) -> u32 {
            self.publisher.pid
        }

        /// The queue's counters.
        fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let s = lock(&*self.inner.get()?).stats();
            stats_dict(py, s)
        }
    }
}

/// A request taken by a `Server`: answer it with `server.reply` or `server.fail`.
#[pyclass(module = "ferry._ferry", name = "Request", frozen)]
pub struct PyRequest {
    request: Request,
    data: Py<PyMessage>,
}

#[pymethods]
impl PyRequest {
    /// The request's payload (the client's pages, read-only).
    #[getter]
    fn data(&self, py: Python<'_>) -> Py<PyMessage> {
        self.data.clone_ref(py)
    }

    /// The client's id for this request.
    #[getter]
    fn id(&self) -> u64 {
        self.request.id
    }

    /// The client's `(domain id, pid)`.
    #[getter]
    fn client(&self) -> (String, u32) {
        member(self.request.client)
    }
}

/// The serving end of a named request-response service.
#[pyclass(module = "ferry._ferry", name = "Server", frozen)]
pub struct PyServer {
    inner: Handle<Shared<Server>>,
    fd: i32,
}

fn request(py: Python<'_>, r: Request) -> PyResult<PyRequest> {
    let data = Py::new(py, PyMessage::new(r.data.clone()))?;
    Ok(PyRequest { request: r, data })
}

closable! {
    PyServer {
        /// Offers request-response service `name` from `domain`; each client's queues hold
        /// `depth` messages, and a reply waits at most `reply_timeout` seconds for room.
        #[new]
        #[pyo3(signature = (domain, name, *, depth = None, reply_timeout = None))]
        fn new(
            py: Python<'_>,
            domain: &Bound<'_, PyAny>,
            name: &str,
            depth: Option<u32>,
            reply_timeout: Option<f64>,
        ) -> PyResult<Self> {
            let d = domain_of(domain)?;
            let c = config(depth, "drop", reply_timeout)?;
            let s = py.detach(|| Server::offer(&d, name, c)).map_err(raise)?;
            Ok(PyServer {
                fd: s.as_fd().as_raw_fd(),
                inner: Handle::new("Server", Arc::new(Mutex::new(s))),
            })
        }

        /// The next request from any client, waiting at most `timeout` seconds (`None`: no
        /// limit; then `Timeout`).
        #[pyo3(signature = (timeout = None))]
        fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyRequest> {
            let s = self.inner.get()?;
            let got = blocking(py, timeout, |slice| lock(&s).recv_timeout(slice))?;
            request(py, got)
        }

        /// The next request and the descriptors it carried, as `(Request, Fds)` (see
        /// `Receiver.recv_with_fds` for `kinds`).
        #[pyo3(signature = (timeout = None, *, kinds = None))]
        fn recv_with_fds(
            &self,
            py: Python<'_>,
            timeout: Option<f64>,
            kinds: Option<Vec<String>>,
        ) -> PyResult<(PyRequest, crate::fds::PyFds)> {
            let kinds = crate::fds::kinds(kinds)?;
            let s = self.inner.get()?;
            let (r, f) = blocking(py, timeout, |slice| {
                let mut s = lock(&s);
                s.set_fd_kinds(kinds);
                s.recv_with_fds_timeout(slice)
            })?;
            Ok((request(py, r)?, crate::fds::PyFds::new(f)))
        }

        /// The next request if one is queued, or `None`; never blocks.
        fn try_recv(&self, py: Python<'_>) -> PyResult<Option<PyRequest>> {
            let s = self.inner.get()?;
            let got = lock(&s).try_recv().map_err(raise)?;
            got.map(|r| request(py, r)).transpose()
        }

        /// Sends `response` (a `Message` or bytes-like data) to the client of `request`,
        /// with `fds` as cargo (as for `Sender.send`).
        /// Raises `PeerGone`/`Disconnected` if that client is gone (the server goes on).
        #[pyo3(signature = (request, response, *, fds = None))]
        fn reply(
            &self,
            py: Python<'_>,
            request: &Bound<'_, PyRequest>,
            response: &Bound<'_, PyAny>,
            fds: Option<&Bound<'_, PyAny>>,
        ) -> PyResult<()> {
            let data = to_iodata(response)?;
            let s = self.inner.get()?;
            let r = &request.get().request;
            let given = crate::fds::given(fds)?;
            let fds = given.borrowed();
            // Never waits: a client's response queue is lossy (`slow="drop"`).
            py.detach(|| lock(&s).reply_with_fds(r, &data, &fds))
                .map_err(raise)
        }

        /// Fails `request` with non-zero `status` (the client's call raises
        /// `RequestFailed`).
        fn fail(&self, py: Python<'_>, request: &Bound<'_, PyRequest>, status: u32) -> PyResult<()> {
            let s = self.inner.get()?;
            let r = &request.get().request;
            py.detach(|| lock(&s).fail(r, status)).map_err(raise)
        }

        /// Prepares to wait on `fileno()`; False if a request is already queued.
        fn arm(&self) -> PyResult<bool> {
            let s = self.inner.get()?;
            let armed = lock(&s).arm().map_err(raise)?;
            Ok(armed)
        }

        /// An epoll fd that turns readable when a request arrives after `arm()`.
        fn fileno(&self) -> PyResult<i32> {
            self.inner.get()?;
            Ok(self.fd)
        }

        /// Connected clients as `(domain id, pid)`.
        fn clients(&self) -> PyResult<Vec<(String, u32)>> {
            let c = lock(&*self.inner.get()?).clients();
            Ok(c.into_iter().map(member).collect())
        }

        /// The server's counters.
        fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let s = lock(&*self.inner.get()?).stats();
            let d = PyDict::new(py);
            d.set_item("requests", s.requests)?;
            d.set_item("responses", s.responses)?;
            d.set_item("failed", s.failed)?;
            d.set_item("malformed", s.malformed)?;
            d.set_item("departed", s.departed)?;
            Ok(d)
        }
    }
}

/// The calling end of a named request-response service.
#[pyclass(module = "ferry._ferry", name = "Client", frozen)]
pub struct PyClient {
    inner: Handle<Shared<Client>>,
    server: Member,
}

closable! {
    PyClient {
        /// Connects `domain` to service `name`, waiting up to `timeout` seconds for it to be
        /// offered and for the server to take the client in.
        #[new]
        #[pyo3(signature = (domain, name, timeout = 5.0))]
        fn new(
            py: Python<'_>,
            domain: &Bound<'_, PyAny>,
            name: &str,
            timeout: Option<f64>,
        ) -> PyResult<Self> {
            let c = open_on(py, domain, name, timeout, Client::open_until)?;
            Ok(PyClient {
                server: c.server(),
                inner: Handle::new("Client", Arc::new(Mutex::new(c))),
            })
        }

        /// Sends `request` (a `Message` or bytes-like data) and returns the response,
        /// waiting at most `timeout` seconds in all (`None`: no limit; then `Timeout`). Raises `RequestFailed`
        /// with the server's status if its handler failed, `PeerGone` if it died.
        #[pyo3(signature = (request, timeout = 5.0))]
        fn call(
            &self,
            py: Python<'_>,
            request: &Bound<'_, PyAny>,
            timeout: Option<f64>,
        ) -> PyResult<PyMessage> {
            let data = to_iodata(request)?;
            let c = self.inner.get()?;
            // The stop check runs under the client's lock: only `call` takes it, and
            // always without the GIL (see `crate::wait`).
            let got = interruptible(py, timeout, |until| lock(&c).call_until(&data, until))?;
            Ok(PyMessage::new(got))
        }

        /// Like `call`, with `fds` as the request's cargo; returns `(Message, Fds)`, the
        /// response and the descriptors it carried (see `Receiver.recv_with_fds` for
        /// `kinds`).
        #[pyo3(signature = (request, timeout = 5.0, *, fds = None, kinds = None))]
        fn call_with_fds(
            &self,
            py: Python<'_>,
            request: &Bound<'_, PyAny>,
            timeout: Option<f64>,
            fds: Option<&Bound<'_, PyAny>>,
            kinds: Option<Vec<String>>,
        ) -> PyResult<(PyMessage, crate::fds::PyFds)> {
            let data = to_iodata(request)?;
            let kinds = crate::fds::kinds(kinds)?;
            let c = self.inner.get()?;
            let given = crate::fds::given(fds)?;
            let fds = given.borrowed();
            // Under the client's lock, as `call`.
            let (d, f) = interruptible(py, timeout, |until| {
                let mut c = lock(&c);
                c.set_fd_kinds(kinds);
                c.call_with_fds_until(&data, &fds, until)
            })?;
            Ok((PyMessage::new(d), crate::fds::PyFds::new(f)))
        }

        /// The server's `(domain id, pid)`.
        #[getter]
        fn server(&self) -> (String, u32) {
            member(self.server)
        }
    }
}
