//! ferry's errors as Python exceptions.
//!
//! The exception classes are defined in Python (`ferry/errors.py`), where multiple
//! inheritance is natural (`Timeout` is both a `FerryError` and a `TimeoutError`); this
//! module looks them up once and raises them with the fields of the Rust error set as
//! attributes.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Builds an instance of `ferry.errors.<class>` with `message` and sets `attrs` on it.
fn make(py: Python<'_>, class: &str, message: String, attrs: &[(&str, u64)]) -> PyResult<PyErr> {
    let module = ERRORS.get_or_try_init(py, || {
        PyModule::import(py, "ferry.errors").map(Bound::unbind)
    })?;
    let exc = module.bind(py).getattr(class)?.call1((message,))?;
    for (k, v) in attrs {
        exc.setattr(*k, *v)?;
    }
    Ok(PyErr::from_value(exc))
}

/// The Python exception for a ferry error. A failed system call is an `OSError` (with
/// its errno), as for Python's own I/O; everything else derives from `FerryError`.
pub(crate) fn raise(e: ferry::Error) -> PyErr {
    Python::attach(|py| {
        let e = match e {
            ferry::Error::Io(io) => return PyErr::from(io),
            other => other,
        };
        let msg = e.to_string();
        let made = match &e {
            ferry::Error::PeerGone { pid } => make(py, "PeerGone", msg, &[("pid", *pid as u64)]),
            ferry::Error::Disconnected => make(py, "Disconnected", msg, &[]),
            ferry::Error::QuotaExceeded { outstanding, quota } => make(
                py,
                "QuotaExceeded",
                msg,
                &[
                    ("outstanding", *outstanding as u64),
                    ("quota", *quota as u64),
                ],
            ),
            ferry::Error::LotExhausted { requested } => {
                make(py, "LotExhausted", msg, &[("requested", *requested as u64)])
            }
            ferry::Error::GroupFull => make(py, "GroupFull", msg, &[]),
            ferry::Error::BadGroup(_) => make(py, "BadGroup", msg, &[]),
            ferry::Error::AddressInUse { addr, len } => make(
                py,
                "AddressInUse",
                msg,
                &[("addr", *addr as u64), ("len", *len as u64)],
            ),
            ferry::Error::BadDescriptor(_) => make(py, "BadDescriptor", msg, &[]),
            ferry::Error::Full => make(py, "Full", msg, &[]),
            ferry::Error::Timeout => make(py, "Timeout", msg, &[]),
            ferry::Error::InvalidArgument(_) => make(py, "InvalidArgument", msg, &[]),
            ferry::Error::ServiceExists { .. } => make(py, "ServiceExists", msg, &[]),
            ferry::Error::NoSuchService { .. } => make(py, "NoSuchService", msg, &[]),
            ferry::Error::ServiceTableFull => make(py, "ServiceTableFull", msg, &[]),
            ferry::Error::ServiceFull { .. } => make(py, "ServiceFull", msg, &[]),
            ferry::Error::AlreadyMember { .. } => make(py, "AlreadyMember", msg, &[]),
            ferry::Error::BadServiceTable(_) => make(py, "BadServiceTable", msg, &[]),
            ferry::Error::RequestFailed { status } => {
                make(py, "RequestFailed", msg, &[("status", *status as u64)])
            }
            ferry::Error::TooManyFds { count, max } => make(
                py,
                "TooManyFds",
                msg,
                &[("count", *count as u64), ("max", *max as u64)],
            ),
            ferry::Error::FdRefused { index, .. } => {
                make(py, "FdRefused", msg, &[("index", *index as u64)])
            }
            ferry::Error::FdsLost { pid } => make(py, "FdsLost", msg, &[("pid", *pid as u64)]),
            _ => make(py, "FerryError", msg, &[]),
        };
        made.unwrap_or_else(|lookup| {
            PyRuntimeError::new_err(format!(
                "{e} (and ferry.errors could not be loaded: {lookup})"
            ))
        })
    })
}
