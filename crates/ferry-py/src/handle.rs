//! A closable slot: what every Python object of the binding holds.
//!
//! Python decides when an object dies; `close()` (and leaving a `with` block) lets the
//! program decide instead. After that the object raises `ValueError`, as a closed file
//! does.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

/// `Some` until closed.
pub(crate) struct Handle<T> {
    slot: Mutex<Option<T>>,
    what: &'static str,
}

impl<T> Handle<T> {
    pub(crate) fn new(what: &'static str, value: T) -> Self {
        Handle {
            slot: Mutex::new(Some(value)),
            what,
        }
    }

    /// The lock over the slot (poisoning is ignored: the slot holds no invariant).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the value, or raises `ValueError` if closed.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> PyResult<R>) -> PyResult<R> {
        match self.lock().as_mut() {
            Some(v) => f(v),
            None => Err(self.closed()),
        }
    }

    /// Takes the value out (closing the handle); `None` if already closed.
    pub(crate) fn take(&self) -> Option<T> {
        self.lock().take()
    }

    /// Whether `close` ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The error for using a closed handle.
    pub(crate) fn closed(&self) -> pyo3::PyErr {
        PyValueError::new_err(format!("{} is closed", self.what))
    }
}

impl<T: Clone> Handle<T> {
    /// A clone of the value, or `ValueError` if closed.
    pub(crate) fn get(&self) -> PyResult<T> {
        self.lock().clone().ok_or_else(|| self.closed())
    }
}

/// `#[pymethods]` for a class whose state is a [`Handle`] in its field `inner`, plus the
/// lifecycle every such class has: `close()`, `closed`, and the context-manager protocol
/// (leaving a `with` block closes the object).
macro_rules! closable {
    ($ty:ident { $($body:tt)* }) => {
        #[pyo3::pymethods]
        impl $ty {
            $($body)*

            /// Closes this object now rather than when Python collects it. Messages
            /// already received stay readable; a closed sender or publisher makes its
            /// peers see `Disconnected` once they drained what it sent. The GIL is
            /// released meanwhile (closing a service joins its thread).
            fn close(&self, py: pyo3::Python<'_>) {
                let value = self.inner.take();
                py.detach(move || drop(value));
            }

            /// Whether `close` ran.
            #[getter]
            fn closed(&self) -> bool {
                self.inner.is_closed()
            }

            fn __enter__(slf: pyo3::Py<Self>) -> pyo3::Py<Self> {
                slf
            }

            fn __exit__(
                &self,
                py: pyo3::Python<'_>,
                _t: Option<pyo3::Bound<'_, pyo3::PyAny>>,
                _v: Option<pyo3::Bound<'_, pyo3::PyAny>>,
                _tb: Option<pyo3::Bound<'_, pyo3::PyAny>>,
            ) {
                self.close(py);
            }
        }
    };
}
pub(crate) use closable;
