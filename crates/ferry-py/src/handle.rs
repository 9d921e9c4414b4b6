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
