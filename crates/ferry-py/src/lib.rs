//! Python bindings of ferry: the `ferry._ferry` extension module.
//!
//! The Python package (`python/ferry`) re-exports these classes and adds the exception
//! hierarchy (`ferry.errors`) and asyncio helpers (`ferry.aio`). Build it with maturin
//! (`pip install ./crates/ferry-py`; `test.sh` does that in a venv and runs pytest). A
//! plain `cargo build --workspace` builds the same cdylib, which links no libpython
//! (pyo3's `extension-module`), so the workspace builds and lints it like any crate.
//!
//! The buffer protocol needs the stable ABI of Python 3.11 (`Py_buffer` entered the
//! limited API there), so the default (feature `abi3`) wheel is for CPython 3.11 and later;
//! built without that feature the extension serves the one interpreter that builds it,
//! CPython 3.9 and 3.10 included.
//!
//! `unsafe` is confined to the `buffer` module and the `__getbuffer__` methods that call it,
//! and to `fds`, which duplicates the descriptor numbers a send is given.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod buffer;
mod channel;
mod errors;
// Borrows the descriptor numbers a send is given, for one duplication each.
#[allow(unsafe_code)]
mod fds;
mod handle;
mod loan;
#[allow(unsafe_code)]
mod message;
mod path;
mod region;
mod service;
mod wait;

use pyo3::prelude::*;

/// The compiled part of the `ferry` package.
#[pymodule]
fn _ferry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<region::PyGroup>()?;
    m.add_class::<region::PyDomain>()?;
    m.add_class::<path::PyPath>()?;
    m.add_class::<message::PyBuffer>()?;
    m.add_class::<message::PyMessage>()?;
    m.add_class::<message::PyFragment>()?;
    m.add_class::<channel::PySender>()?;
    m.add_class::<channel::PyReceiver>()?;
    m.add_class::<loan::PyLoan>()?;
    m.add_class::<fds::PyFds>()?;
    m.add_class::<service::PyPublisher>()?;
    m.add_class::<service::PySubscriber>()?;
    m.add_class::<service::PyServer>()?;
    m.add_class::<service::PyClient>()?;
    m.add_class::<service::PyRequest>()?;
    m.add_function(wrap_pyfunction!(message::copy_stats, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_FDS", ferry::MAX_FDS)?;
    Ok(())
}
