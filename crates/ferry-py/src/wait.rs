//! Blocking calls that honour Ctrl-C.
//!
//! Every call that can wait goes through [`interruptible`]: the library call runs with
//! the GIL released and gets a [`ferry::Until`] whose stop check takes the GIL back
//! between sleeps of at most [`ferry::Until::CHECK_EVERY`] (100 ms) and runs Python's
//! signal handlers. When one raises (`KeyboardInterrupt` from SIGINT), the library call
//! gives up as on a timeout, undoing what it had set up, and the exception is raised.
//!
//! The stop check takes the GIL, so it must never run while the waiting thread holds
//! a lock that a thread holding the GIL may wait for: that thread would wait for the
//! lock with the GIL, and the check for the GIL with the lock. The binding's endpoint
//! locks are taken with the GIL held by their cheap methods (`stats`, `try_recv`, ...),
//! so waits under such a lock are cut into slices ([`blocking`]): the lock is taken for
//! each slice and released before the check.

use std::time::{Duration, Instant};

use ferry::Until;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::raise;

/// Converts a timeout in seconds (`None`: no limit) to a duration.
pub(crate) fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, not {s}"
        ))),
    }
}

/// The deadline `seconds` from now (`None`: no limit; so is a timeout too long to add).
pub(crate) fn deadline(seconds: Option<f64>) -> PyResult<Option<Instant>> {
    Ok(timeout(seconds)?.and_then(|t| Instant::now().checked_add(t)))
}

/// Runs `call` with the GIL released, waiting until `deadline` (`None`: no limit) and
/// while no signal handler raised (see the module's docs). Raises what the handler
/// raised (`KeyboardInterrupt`) even if `call` finished meanwhile: its result is
/// dropped. `call` must not run the stop check while it holds a lock that is taken
/// with the GIL held.
pub(crate) fn interruptible_until<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    call: impl FnOnce(Until<'_>) -> ferry::Result<T> + Send,
) -> PyResult<T> {
    let (got, raised) = py.detach(|| {
        let mut raised: Option<PyErr> = None;
        let got = {
            let mut stop = || {
                Python::attach(|py| match py.check_signals() {
                    Ok(()) => false,
                    Err(e) => {
                        raised = Some(e);
                        true
                    }
                })
            };
            call(Until::deadline(deadline).with_stop(&mut stop))
        };
        (got, raised)
    });
    match raised {
        Some(e) => Err(e),
        None => got.map_err(raise),
    }
}

/// [`interruptible_until`] for `seconds` from now (`None`: no limit).
pub(crate) fn interruptible<T: Send>(
    py: Python<'_>,
    seconds: Option<f64>,
    call: impl FnOnce(Until<'_>) -> ferry::Result<T> + Send,
) -> PyResult<T> {
    interruptible_until(py, deadline(seconds)?, call)
}

/// Runs `step(slice)` until it returns anything but `Err(Timeout)`, in slices of at
/// most 100 ms with the GIL released, looking for signals between slices; raises
/// `Timeout` once `seconds` (`None`: no limit) have passed. `step` must have no effect
/// when it times out; it may take locks, which it releases before it returns.
pub(crate) fn blocking<T: Send>(
    py: Python<'_>,
    seconds: Option<f64>,
    step: impl FnMut(Duration) -> ferry::Result<T> + Send,
) -> PyResult<T> {
    interruptible(py, seconds, |until| until.sliced(step))
}
