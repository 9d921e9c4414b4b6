//! Paths: fbuf allocators of a domain.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::raise;
use crate::message::PyBuffer;

/// A per-path fbuf allocator.
#[pyclass(module = "ferry._ferry", name = "Path", frozen)]
pub struct PyPath {
    pub(crate) inner: ferry::PathAllocator,
}

#[pymethods]
impl PyPath {
    /// A writable fbuf of `size` bytes in its write phase. Fill it through the buffer
    /// protocol (`memoryview(buf)`, `numpy.frombuffer(buf, ...)`) or `write`, then
    /// `freeze()` it into a `Message`. Raises `QuotaExceeded` when the path's receivers
    /// hold its quota.
    fn alloc(&self, size: usize) -> PyResult<PyBuffer> {
        let m = self.inner.alloc(size).map_err(raise)?;
        Ok(PyBuffer::new(m))
    }

    /// Bytes allocated on this path and not yet returned.
    #[getter]
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }

    /// The path's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("allocs", s.allocs)?;
        d.set_item("cached", s.cached)?;
        d.set_item("quota_refusals", s.quota_refusals)?;
        d.set_item("outstanding", s.outstanding)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<ferry.Path outstanding={}>", self.inner.outstanding())
    }
}
