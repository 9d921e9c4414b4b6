//! The two suites `ferry calibrate` needs; the others are in `ferry-bench`.

pub mod calibrate;
pub mod genie;
