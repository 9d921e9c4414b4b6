//! Owned-buffer io_uring driver (being written).
