//! Descriptors as cargo: the `Fds` a received message carried, and the descriptors a
//! send is given (ints, or objects with `fileno()`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use ferry::{FdKind, FdKinds};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

/// Our own duplicates of the descriptors a send was given, made while the caller (who
/// holds the GIL) vouches that the numbers are open: the send then uses these, so that
/// another thread closing a number meanwhile cannot make it send some other file.
pub(crate) struct Given(Vec<OwnedFd>);

impl Given {
    pub(crate) fn borrowed(&self) -> Vec<BorrowedFd<'_>> {
        self.0.iter().map(|f| f.as_fd()).collect()
    }
}

fn number(obj: &Bound<'_, PyAny>) -> PyResult<RawFd> {
    if let Ok(n) = obj.extract::<RawFd>() {
        return Ok(n);
    }
    obj.call_method0("fileno")?.extract::<RawFd>()
}

/// Duplicates each of `fds` (ints, or objects with `fileno()`).
pub(crate) fn given(fds: Option<&Bound<'_, PyAny>>) -> PyResult<Given> {
    let Some(fds) = fds else {
        return Ok(Given(Vec::new()));
    };
    let mut out = Vec::new();
    for obj in fds.try_iter()? {
        let n = number(&obj?)?;
        if n < 0 {
            return Err(PyValueError::new_err(format!("{n} is not a descriptor")));
        }
        // SAFETY: the number is used for one `fcntl(F_DUPFD_CLOEXEC)` at once and not
        // kept; one that is not open makes that call fail with EBADF (raised as OSError).
        let b = unsafe { BorrowedFd::borrow_raw(n) };
        out.push(b.try_clone_to_owned()?);
    }
    Ok(Given(out))
}

/// The kinds named in `kinds` (`"memfd"`, `"dma-buf"`, `"sync_file"`, `"eventfd"`,
/// `"pipe"`, `"socket"`, `"other"`), or the default (all but other) for `None`.
pub(crate) fn kinds(kinds: Option<Vec<String>>) -> PyResult<FdKinds> {
    let Some(names) = kinds else {
        return Ok(FdKinds::default());
    };
    let mut out: Option<FdKinds> = None;
    for n in names {
        let k = match n.as_str() {
            "memfd" => FdKind::Memfd,
            "dma-buf" => FdKind::DmaBuf,
            "sync_file" => FdKind::SyncFile,
            "eventfd" => FdKind::EventFd,
            "pipe" => FdKind::Pipe,
            "socket" => FdKind::Socket,
            "other" => FdKind::Other,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown descriptor kind {other:?}"
                )))
            }
        };
        out = Some(match out {
            None => FdKinds::only(k),
            Some(o) => o.with(k),
        });
    }
    out.ok_or_else(|| PyValueError::new_err("kinds must name at least one kind"))
}

fn kind_name(k: FdKind) -> &'static str {
    match k {
        FdKind::Other => "other",
        k => k.name(),
    }
}

/// The descriptors a received message carried: this process's own duplicates, closed by
/// `close()` (or a `with` block's end, or garbage collection) except those taken out
/// with `take(i)`, which the caller then owns (close it with `os.close`).
#[pyclass(module = "ferry._ferry", name = "Fds", frozen)]
pub struct PyFds {
    inner: Mutex<ferry::Fds>,
}

impl PyFds {
    pub(crate) fn new(fds: ferry::Fds) -> Self {
        PyFds {
            inner: Mutex::new(fds),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ferry::Fds> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyFds {
    fn __len__(&self) -> usize {
        self.lock().len()
    }

    /// Descriptor `i`'s number, still owned by this `Fds` (do not close it).
    fn __getitem__(&self, i: usize) -> PyResult<RawFd> {
        self.lock()
            .get(i)
            .map(|f| f.as_raw_fd())
            .ok_or_else(|| PyIndexError::new_err(format!("no descriptor {i} (or taken)")))
    }

    /// What descriptor `i` is: "memfd", "dma-buf", "sync_file", "eventfd", "pipe",
    /// "socket" or "other".
    fn kind(&self, i: usize) -> PyResult<&'static str> {
        self.lock()
            .kind(i)
            .map(kind_name)
            .ok_or_else(|| PyIndexError::new_err(format!("no descriptor {i}")))
    }

    /// Takes descriptor `i` out: the caller owns the returned number (close it with
    /// `os.close`, or wrap it with `os.fdopen`/`socket.socket(fileno=...)`).
    fn take(&self, i: usize) -> PyResult<RawFd> {
        self.lock()
            .take(i)
            .map(IntoRawFd::into_raw_fd)
            .ok_or_else(|| PyIndexError::new_err(format!("no descriptor {i} (or taken)")))
    }

    /// Closes every descriptor not taken out.
    fn close(&self) {
        drop(std::mem::take(&mut *self.lock()));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close();
    }

    fn __repr__(&self) -> String {
        let f = self.lock();
        let kinds: Vec<_> = (0..f.len())
            .map(|i| f.kind(i).map_or("?", kind_name))
            .collect();
        format!("<ferry.Fds {kinds:?}>")
    }
}
