//! Refuses the abi3 build (the default feature) for an interpreter older than CPython
//! 3.11, with the command that works, instead of an extension that fails to import:
//! asked by maturin for CPython 3.9 with `abi3-py311` on, pyo3 builds for the 3.11
//! stable ABI (symbols such as `_Py_IncRef` that 3.9 lacks) and maturin tags the wheel
//! cp39. The interpreter is the one maturin names in `PYO3_PYTHON`; a plain
//! `cargo build` names none and is not checked.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    if std::env::var_os("CARGO_FEATURE_ABI3").is_none() {
        return;
    }
    let Some(python) = std::env::var_os("PYO3_PYTHON") else {
        return;
    };
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys; print(sys.version_info[0], sys.version_info[1])",
        ])
        .output();
    let Ok(out) = out else { return };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    if out.status.success() && (major, minor) < (3, 11) {
        panic!(
            "ferry-py: CPython {major}.{minor} has no buffer protocol in the stable ABI (it came \
             in 3.11), so the default abi3 build cannot serve it. Build the per-version \
             extension instead: MATURIN_PEP517_ARGS=--no-default-features pip install \
             ./crates/ferry-py (or maturin build --no-default-features)"
        );
    }
}
