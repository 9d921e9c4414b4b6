//! Buffers in their write phase, messages and fragments, all exported through the
//! buffer protocol.
//!
//! - A [`PyBuffer`] is a writable fbuf. `freeze()` turns it into a [`PyMessage`] and is
//!   refused (`BufferError`) while any writable view of it exists, the way `bytearray`
//!   refuses to resize while exported; after freezing, the buffer exports nothing. So
//!   no writable view survives the freeze.
//! - A [`PyMessage`] exports read-only views. Each view holds a reference to the message,
//!   so the message's fbufs (and the mapping of a peer's lot under them) stay until the
//!   last view is released; `release()` is refused while views exist.
//! - Copies into one contiguous buffer (`to_bytes`, `copy_into`) are explicit and
//!   counted in [`copy_stats`].

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry::{Fragment, IoData, IoDataMut};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PySlice, PySliceMethods};

use crate::buffer::{export, Borrowed, Exports};
use crate::handle::Handle;

static COPIES: AtomicU64 = AtomicU64::new(0);
static COPIED_BYTES: AtomicU64 = AtomicU64::new(0);

fn count_copy(n: usize) {
    COPIES.fetch_add(1, Ordering::Relaxed);
    COPIED_BYTES.fetch_add(n as u64, Ordering::Relaxed);
}

/// Explicit copies made by this process (`Message.to_bytes`, `Message.copy_into`):
/// `{"copies": n, "bytes": n}`.
#[pyfunction]
pub fn copy_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("copies", COPIES.load(Ordering::Relaxed))?;
    d.set_item("bytes", COPIED_BYTES.load(Ordering::Relaxed))?;
    Ok(d)
}

/// A writable fbuf in its write phase.
#[pyclass(module = "ferry._ferry", name = "Buffer", frozen)]
pub struct PyBuffer {
    inner: Handle<IoDataMut>,
    len: usize,
    exports: Exports,
}

impl PyBuffer {
    pub(crate) fn new(m: IoDataMut) -> Self {
        PyBuffer {
            len: m.len(),
            inner: Handle::new("Buffer (frozen)", m),
            exports: Exports::default(),
        }
    }
}

#[pymethods]
impl PyBuffer {
    pub(crate) fn __len__(&self) -> usize {
        self.len
    }

    /// Writable views while the buffer is in its write phase.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let locate = |m: &mut IoDataMut| {
            let mut frags = m.fragments_mut();
            let p = frags
                .next()
                .map_or(std::ptr::null_mut(), |f| f.as_mut_ptr());
            if frags.next().is_some() {
                return Err(PyBufferError::new_err(
                    "buffer spans several fbufs; write it with write()",
                ));
            }
            Ok(p.cast_const())
        };
        // SAFETY: `ptr..ptr+len` is the fbuf the IoDataMut in `inner` owns; it stays
        // mapped and writable while the IoDataMut lives, and `freeze`/`close` refuse to
        // take it while `exports` is non-zero. The view holds a reference to `slf`.
        unsafe {
            me.exports
                .export_from(&me.inner, locate, view, flags, slf.as_any(), me.len, false)
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.remove();
    }

    /// Copies `data` (any bytes-like object) into the buffer at `offset`.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, data: &Bound<'_, PyAny>, offset: usize) -> PyResult<()> {
        let src = Borrowed::get(data, false)?;
        let n = src.len();
        if offset.checked_add(n).map_or(true, |end| end > self.len) {
            return Err(PyIndexError::new_err(format!(
                "write of {n} bytes at {offset} past the end of {} bytes",
                self.len
            )));
        }
        self.inner.with(|m| {
            m.write_at(offset, src.as_slice());
            Ok(())
        })
    }

    /// Number of live views (memoryviews, arrays) of this buffer.
    #[getter]
    fn exports(&self) -> usize {
        self.exports.count()
    }

    /// Whether the buffer was frozen (or closed).
    #[getter]
    fn frozen(&self) -> bool {
        self.inner.is_closed()
    }

    /// Ends the write phase: returns an immutable `Message` over the same pages.
    ///
    /// Raises `BufferError` while any writable view (memoryview, numpy array) of the
    /// buffer exists: release them first (`del arr`, `mv.release()`), so that nothing
    /// can write to the message after it is frozen. After freezing, the buffer exports
    /// nothing (`BufferError`) and `write` raises `ValueError`.
    pub(crate) fn freeze(&self) -> PyResult<PyMessage> {
        let mut slot = self.inner.lock();
        let n = self.exports.count();
        if n > 0 {
            return Err(PyBufferError::new_err(format!(
                "cannot freeze: {n} writable view(s) of this buffer exist; release them first"
            )));
        }
        let m = slot.take().ok_or_else(|| self.inner.closed())?;
        Ok(PyMessage::new(m.freeze()))
    }

    /// Gives the fbuf back unsent (refused while views exist).
    pub(crate) fn close(&self) -> PyResult<()> {
        let mut slot = self.inner.lock();
        if self.exports.count() > 0 {
            return Err(PyBufferError::new_err(
                "cannot close: writable views of this buffer exist",
            ));
        }
        drop(slot.take());
        Ok(())
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.is_closed() {
            "frozen"
        } else {
            "writable"
        };
        format!("<ferry.Buffer {} bytes, {state}>", self.len)
    }
}

/// An immutable message (ferry's `IoData`): one or more read-only fragments.
#[pyclass(module = "ferry._ferry", name = "Message", frozen)]
pub struct PyMessage {
    inner: Handle<IoData>,
    len: usize,
    exports: Exports,
}

impl PyMessage {
    pub(crate) fn new(d: IoData) -> Self {
        PyMessage {
            len: d.len(),
            inner: Handle::new("Message (released)", d),
            exports: Exports::default(),
        }
    }

    /// The message's data (a cheap clone: fragments are shared).
    pub(crate) fn data(&self) -> PyResult<IoData> {
        self.inner.get()
    }
}

#[pymethods]
impl PyMessage {
    /// A message over a private copy of `data` (any bytes-like object), for sending
    /// bytes that are not in an fbuf; the channel copies it into one (counted in the
    /// sender's `copied_bytes`).
    #[new]
    fn py_new(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let b = Borrowed::get(data, false)?;
        Ok(PyMessage::new(IoData::from_vec(b.as_slice().to_vec())))
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// Read-only views of a message of at most one fragment (BufferError otherwise: use
    /// `fragments()` or `to_bytes()`).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let locate = |d: &mut IoData| {
            match d.fragments() {
            [] => Ok(std::ptr::null()),
            [f] => Ok(f.as_slice().as_ptr()),
            many => Err(PyBufferError::new_err(format!(
                "message has {} fragments: use fragments() for zero-copy views or to_bytes() to copy",
                many.len()
            ))),
        }
        };
        // SAFETY: the fragment's segment lives as long as the IoData in `inner`, which
        // `release` refuses to drop while `exports` is non-zero; the view holds a
        // reference to `slf`. Exported read-only: PyBuffer_FillInfo refuses writers.
        unsafe {
            me.exports
                .export_from(&me.inner, locate, view, flags, slf.as_any(), me.len, true)
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.remove();
    }

    /// Number of live views of the whole message.
    #[getter]
    fn exports(&self) -> usize {
        self.exports.count()
    }

    /// Number of fragments.
    #[getter]
    fn num_fragments(&self) -> PyResult<usize> {
        self.inner.with(|d| Ok(d.num_fragments()))
    }

    /// The fragments, each a read-only buffer over the shared pages (no copy).
    fn fragments(&self) -> PyResult<Vec<PyFragment>> {
        self.inner.with(|d| {
            Ok(d.fragments()
                .iter()
                .map(|f| PyFragment { frag: f.clone() })
                .collect())
        })
    }

    /// A message over bytes `start..stop` of this one (no copy).
    fn slice(&self, range: &Bound<'_, PySlice>) -> PyResult<PyMessage> {
        let idx = range.indices(self.len as isize)?;
        if idx.step != 1 {
            return Err(PyValueError::new_err("slice step must be 1"));
        }
        let (a, b) = (idx.start as usize, (idx.stop.max(idx.start)) as usize);
        self.inner.with(|d| Ok(PyMessage::new(d.slice(a..b))))
    }

    /// A message of this one's fragments followed by `other`'s (no copy).
    fn __add__(&self, other: &Bound<'_, PyMessage>) -> PyResult<PyMessage> {
        let a = self.inner.get()?;
        let b = other.get().data()?;
        Ok(PyMessage::new(a.concat(&b)))
    }

    /// Copies the whole message into a new `bytes` (an explicit copy, counted in
    /// `copy_stats()`).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let d = self.inner.get()?;
        let out = PyBytes::new_with(py, d.len(), |buf| {
            d.copy_range_to_slice(.., buf);
            Ok(())
        })?;
        count_copy(d.len());
        Ok(out)
    }

    /// Copies the message into `target`, a writable C-contiguous buffer of at least
    /// `len(self)` bytes (bytearray, numpy array, memoryview, another fbuf). Returns the
    /// bytes copied (counted in `copy_stats()`).
    fn copy_into(&self, target: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut dst = Borrowed::get(target, true)?;
        let d = self.inner.get()?;
        if dst.len() < d.len() {
            return Err(PyValueError::new_err(format!(
                "target holds {} bytes, the message {}",
                dst.len(),
                d.len()
            )));
        }
        d.copy_range_to_slice(.., &mut dst.as_mut_slice()[..d.len()]);
        count_copy(d.len());
        Ok(d.len())
    }

    /// Address of the first byte (for checking where the data lies), or 0 if empty.
    #[getter]
    fn address(&self) -> PyResult<usize> {
        self.inner.with(|d| {
            Ok(d.fragments()
                .first()
                .map_or(0, |f| f.as_slice().as_ptr() as usize))
        })
    }

    /// Whether every fragment lies in a lot of the group (as received messages and
    /// frozen fbufs do); a message built from bytes does not.
    #[getter]
    fn in_lot(&self) -> PyResult<bool> {
        self.inner
            .with(|d| Ok(d.fragments().iter().all(|f| f.lot_span().is_some())))
    }

    /// Drops this message's hold on its fbufs now (the receiver's release travels back
    /// to the sender). Refused with `BufferError` while views of it exist.
    fn release(&self) -> PyResult<()> {
        let mut slot = self.inner.lock();
        let n = self.exports.count();
        if n > 0 {
            return Err(PyBufferError::new_err(format!(
                "cannot release: {n} view(s) of this message exist"
            )));
        }
        drop(slot.take());
        Ok(())
    }

    /// Whether `release` ran.
    #[getter]
    fn released(&self) -> bool {
        self.inner.is_closed()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = self.inner.get()?;
        if let Ok(m) = other.cast::<PyMessage>() {
            return Ok(d == m.get().data()?);
        }
        match Borrowed::get(other, false) {
            Ok(b) => Ok(d.eq_bytes(b.as_slice())),
            Err(_) => Ok(false),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block releases the message (it raises if views remain).
    fn __exit__(
        &self,
        _t: Option<Bound<'_, PyAny>>,
        _v: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.release()
    }

    fn __repr__(&self) -> String {
        match self.inner.get() {
            Ok(d) => format!(
                "<ferry.Message {} bytes in {} fragment(s)>",
                d.len(),
                d.num_fragments()
            ),
            Err(_) => "<ferry.Message (released)>".into(),
        }
    }
}

/// One fragment of a message: a read-only buffer over shared pages.
#[pyclass(module = "ferry._ferry", name = "Fragment", frozen)]
pub struct PyFragment {
    frag: Fragment,
}

#[pymethods]
impl PyFragment {
    fn __len__(&self) -> usize {
        self.frag.len()
    }

    /// Read-only views of the fragment.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let s = slf.get().frag.as_slice();
        // SAFETY: the fragment holds its segment (and the mapping under it) for as long
        // as this object lives, and the view holds a reference to the object.
        unsafe { export(view, flags, slf.as_any(), s.as_ptr(), s.len(), true) }
    }

    /// Address of the first byte.
    #[getter]
    fn address(&self) -> usize {
        self.frag.as_slice().as_ptr() as usize
    }

    /// Where the fragment lies: `(slot, generation, offset)` of its lot, or `None` for
    /// private memory.
    #[getter]
    fn lot_span(&self) -> Option<(u16, u32, u64)> {
        self.frag
            .lot_span()
            .map(|s| (s.lot.slot, s.lot.generation, s.offset))
    }

    fn __repr__(&self) -> String {
        format!("<ferry.Fragment {} bytes>", self.frag.len())
    }
}
