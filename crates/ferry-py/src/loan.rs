//! Loans: a message written in place through a memoryview, sent when its `with` block
//! ends normally (`Sender.loan`, `Publisher.loan`).

use std::sync::Mutex;

use ferry::IoData;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;

use crate::message::PyBuffer;

/// Where a loan's memoryview stands.
enum LoanView {
    /// Not entered yet.
    Unused,
    /// Entered: the memoryview handed out.
    Lent(Py<PyMemoryView>),
    /// Left (sent or discarded).
    Done,
}

/// Where a loan's message goes when its block ends: a channel's receiver (`Sender.loan`)
/// or every subscriber of a publisher (`Publisher.loan`). Dropped when the block ends,
/// however it ends, or with a loan never entered.
pub(crate) trait Deliver: Send + Sync {
    /// Sends `data`, waiting at most `timeout` seconds (`None`: no limit) for room while
    /// honouring Ctrl-C; returns how many receivers were handed it.
    fn deliver(&self, py: Python<'_>, data: &IoData, timeout: Option<f64>) -> PyResult<usize>;
}

/// A message being written in place for a `Sender` (`Sender.loan`) or a `Publisher`
/// (`Publisher.loan`): a context manager whose `__enter__` gives a writable memoryview
/// over its fbuf and whose `__exit__` sends it, or gives it back if the block raised.
///
/// Unlike Rust's `Sender::loan`, it does not reserve the ring place at the loan: that
/// holds the sender's lock until the send, and Python code in the block that used the
/// same sender (or blocked in its domain) would wait for itself. The place is taken at
/// the send instead.
#[pyclass(module = "ferry._ferry", name = "Loan", frozen)]
pub struct PyLoan {
    /// `None` once the block ended.
    to: Mutex<Option<Box<dyn Deliver>>>,
    buffer: Py<PyBuffer>,
    view: Mutex<LoanView>,
    timeout: Option<f64>,
    /// Receivers handed the message, once sent.
    delivered: Mutex<Option<usize>>,
}

impl PyLoan {
    /// A loan of `data` (an fbuf fresh from a path) for `to`; `timeout` bounds the wait for
    /// room at the send.
    pub(crate) fn new(
        py: Python<'_>,
        to: Box<dyn Deliver>,
        data: ferry::IoDataMut,
        timeout: Option<f64>,
    ) -> PyResult<PyLoan> {
        Ok(PyLoan {
            to: Mutex::new(Some(to)),
            buffer: Py::new(py, PyBuffer::new(data))?,
            view: Mutex::new(LoanView::Unused),
            timeout,
            delivered: Mutex::new(None),
        })
    }
}

#[pymethods]
impl PyLoan {
    /// The message's size in bytes.
    fn __len__(&self) -> usize {
        self.buffer.get().__len__()
    }

    fn __enter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMemoryView>> {
        let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*v, LoanView::Unused) {
            return Err(PyValueError::new_err("a loan can be entered once"));
        }
        let mv = PyMemoryView::from(self.buffer.bind(py).as_any())?;
        *v = LoanView::Lent(mv.clone().unbind());
        Ok(mv)
    }

    /// Sends the message if the block ended normally, else gives the fbuf back; never
    /// swallows the block's exception.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let view = {
            let mut v = self.view.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *v, LoanView::Done)
        };
        let LoanView::Lent(view) = view else {
            return Err(PyValueError::new_err("the loan was not entered"));
        };
        // Taken now, so that a publisher's next loan is allowed once this block is over,
        // however it ends.
        let to = self.to.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Released even when the block raised, so that the view is unusable after it.
        let released = view.bind(py).call_method0("release");
        let buffer = self.buffer.get();
        if exc_type.is_some() {
            // The fbuf goes back now, or with the last view of it that the block left.
            let _ = buffer.close();
            return Ok(false);
        }
        if let Err(e) = released {
            let _ = buffer.close();
            return Err(PyBufferError::new_err(format!(
                "the loan was not sent: views of its buffer remain ({e}); delete them \
                 (del arr) before the end of the with block"
            )));
        }
        let data = buffer.freeze()?.data()?;
        let Some(to) = to else {
            return Err(PyValueError::new_err("the loan was already sent"));
        };
        let delivered = to.deliver(py, &data, self.timeout)?;
        *self.delivered.lock().unwrap_or_else(|p| p.into_inner()) = Some(delivered);
        Ok(false)
    }

    /// How many receivers were handed the message: `None` until it is sent (and for a
    /// loan discarded by an exception), 1 for a `Sender`'s loan, the subscribers reached
    /// for a `Publisher`'s.
    #[getter]
    fn delivered(&self) -> Option<usize> {
        *self.delivered.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn __repr__(&self) -> String {
        let state = match &*self.view.lock().unwrap_or_else(|p| p.into_inner()) {
            LoanView::Unused => "not entered",
            LoanView::Lent(_) => "being written",
            LoanView::Done => "done",
        };
        format!("<ferry.Loan {} bytes, {state}>", self.__len__())
    }
}
