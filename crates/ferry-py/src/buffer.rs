//! The buffer protocol: the only `unsafe` of the binding.
//!
//! Exporting ([`export`]) fills a `Py_buffer` over memory that the exporting object keeps
//! alive; `PyBuffer_FillInfo` stores a new reference to that object in the view, so the
//! memory cannot go away while any view (or a view of a view) exists. Importing
//! ([`Borrowed`]) takes a contiguous buffer from another object for the length of one
//! copy.

use std::ffi::c_int;
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::handle::Handle;

/// Fills `view` with a one-dimensional byte buffer of `len` bytes at `ptr`, owned by
/// `owner`. Refuses a writable request when `readonly` (BufferError), as
/// `PyBuffer_FillInfo` does.
///
/// # Safety
/// `view` is the pointer CPython passed to `__getbuffer__`, and `ptr..ptr+len` stays
/// valid (and, unless `readonly`, writable) for as long as `owner` lives.
pub(crate) unsafe fn export(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    owner: &Bound<'_, PyAny>,
    ptr: *const u8,
    len: usize,
    readonly: bool,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no view to fill"));
    }
    let ptr = if len == 0 {
        NonNull::<u8>::dangling().as_ptr().cast_const()
    } else {
        ptr
    };
    // SAFETY: `view` is CPython's and non-null; the caller vouches for the memory and its
    // owner. FillInfo takes a new reference to `owner` in `view->obj`, which keeps the
    // memory alive until the view is released.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            ptr.cast_mut().cast(),
            len as ffi::Py_ssize_t,
            c_int::from(readonly),
            flags,
        )
    };
    if rc != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// A contiguous buffer taken from another Python object, released on drop.
pub(crate) struct Borrowed {
    view: Box<ffi::Py_buffer>,
}

impl Borrowed {
    /// Takes a C-contiguous buffer of `obj`, writable if asked.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Borrowed> {
        let mut view = Box::new(ffi::Py_buffer::new());
        let flags = ffi::PyBUF_C_CONTIGUOUS
            | if writable {
                ffi::PyBUF_WRITABLE
            } else {
                ffi::PyBUF_SIMPLE
            };
        // SAFETY: `obj` is a live object (we hold the GIL and a reference); `view` points
        // to a zeroed Py_buffer that we own.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Borrowed { view })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.view.len as usize
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: a successful C-contiguous GetBuffer gives `len` readable bytes at `buf`,
        // valid until PyBuffer_Release in drop.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.len()) }
    }

    /// The bytes, writable (only for a buffer taken with `writable`).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(self.view.readonly == 0, "buffer was taken read-only");
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, and the exporter granted PyBUF_WRITABLE. Other Python
        // code may alias it (as with any buffer); we hold the GIL while writing.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), self.len()) }
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released
        // once; PyBuffer_Release needs the GIL, which every holder of a `Borrowed` has
        // (it is never sent out of a GIL-holding scope).
        unsafe { ffi::PyBuffer_Release(&mut *self.view) }
    }
}

/// How many views of an object exist: counted up (under the object's lock) before
/// exporting, down when CPython releases a view, so that `freeze`/`release` can refuse to
/// pull the memory from under a view.
#[derive(Default)]
pub(crate) struct Exports(std::sync::atomic::AtomicUsize);

impl Exports {
    /// Counts a view about to be exported.
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A view was released (`__releasebuffer__`).
    pub(crate) fn remove(&self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Views alive now.
    pub(crate) fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Exports a view of `len` bytes of the value in `inner`, at the address `locate`
    /// finds in it. The view is counted under `inner`'s lock, so a `freeze`/`release` in
    /// another thread (which takes the value under that lock) sees it, and uncounted if
    /// the export fails.
    ///
    /// # Safety
    /// As for [`export`], with `owner` the object holding `inner` and this count: the
    /// address stays valid while the value stays in `inner`, which the owner refuses to
    /// give up while views are counted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn export_from<T>(
        &self,
        inner: &Handle<T>,
        locate: impl FnOnce(&mut T) -> PyResult<*const u8>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
        owner: &Bound<'_, PyAny>,
        len: usize,
        readonly: bool,
    ) -> PyResult<()> {
        let ptr = inner.with(|v| {
            let p = locate(v)?;
            self.add();
            Ok(p)
        })?;
        // SAFETY: the caller's promise, passed on.
        let r = unsafe { export(view, flags, owner, ptr, len, readonly) };
        if r.is_err() {
            self.remove();
        }
        r
    }
}
