//! Generates `include/ferry.h` from `src/lib.rs` with cbindgen.
//!
//! The header is committed so that C users need no Rust tooling to read it; this
//! rewrites it only when the exported API changed (cbindgen leaves an identical file
//! alone), and a test checks that the committed copy is current.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read src/lib.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("ferry.h");
    bindings.write_to_file(&out);
    bindings.write_to_file(dir.join("include/ferry.h"));
}
