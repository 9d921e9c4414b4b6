//! The benchmark suites, one folder each: its plan (what to run, on the
//! [`crate::harness`]), its worker role where it has its own, and its report text.
//!
//! | suite | command | worker role |
//! |---|---|---|
//! | [`fbufs`] | `ferry-bench fbufs` | the chain's ([`crate::harness::chain::roles`]) |
//! | [`fbufs_path`] | `ferry-bench fbufs-path` | the chain's |
//! | [`container`] | `ferry-bench container` | [`container::domain`] |
//! | [`xlate`] | `ferry-bench xlate` | none: one process |
//! | [`vcm`] | `ferry-bench vcm` | [`vcm::echo`] |
//! | [`services`] | `ferry-bench services` | `ferry-bench __drain` ([`services::sub`]) |
//! | [`genie`] | `ferry-bench genie` | [`genie::worker`] (source and sink) |
//! | [`calibrate`] | `ferry-bench calibrate`, `ferry calibrate` (both through `ferry-measure`) | none: one process, plus the chain's for the hand-over |
//! | [`python`] | `ferry-bench python` | none: Python processes (`crates/ferry-py/bench`) |
//! | [`handover`] | `ferry-bench handover` | [`handover::worker`] |
//! | [`hugepages`] | `ferry-bench hugepages` | `ferry-bench __huge` ([`hugepages::recv`]) |
//! | [`adc`] | `ferry-bench adc` | none: threads in two network namespaces |
//! | [`bridge`] | `ferry-bench bridge` | `ferry-bench __bridge` ([`bridge::worker`]): bridges, members and zenoh's reference, each a process in its host's namespace |
//! | [`frames`] | `ferry-bench frames` | `ferry-bench __frames` ([`frames::worker_main`]) |
//!
//! Adding a benchmark: write `suites/<name>/mod.rs` with
//! `pub const BENCH: BenchDef = BenchDef { name, about, run }`, where `run`
//! measures through [`crate::harness::chain`] (or its own workers) and returns a
//! [`crate::harness::BenchOutput`]; then list it in [`BENCHES`]. `ferry-bench <name>`,
//! `ferry-bench all` and the report pick it up from there.

pub mod adc;
pub mod bridge;
pub mod container;
pub mod fbufs;
pub mod fbufs_path;
#[allow(unsafe_code)]
pub mod frames;
pub mod genie;
#[allow(unsafe_code)]
pub mod handover;
pub mod hugepages;
pub mod python;
#[allow(unsafe_code)]
pub mod services;
pub mod vcm;
pub mod xlate;

pub use ferry_measure::suites::calibrate;

use crate::harness::BenchDef;

/// Every benchmark, in the order `all` runs them.
pub const BENCHES: &[BenchDef] = &[
    fbufs::BENCH,
    fbufs_path::BENCH,
    container::BENCH,
    xlate::BENCH,
    vcm::BENCH,
    services::BENCH,
    calibrate::BENCH,
    genie::BENCH,
    python::BENCH,
    handover::BENCH,
    hugepages::BENCH,
    adc::BENCH,
    bridge::BENCH,
    frames::BENCH,
];
