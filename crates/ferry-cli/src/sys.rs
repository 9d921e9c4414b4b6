//! The few operating-system calls the tool makes itself: descriptors handed from
//! `ferry pipeline` to its stage processes.
//!
//! This is the only module of the CLI that contains `unsafe` code.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

use rustix::io::FdFlags;

/// Lets the next spawned child inherit `fd` by clearing `FD_CLOEXEC`.
///
/// Call it right before spawning the one child that should get `fd`, and
/// drop the parent's copy right after: every spawn happens on the spawning process's
/// main thread, so no other child can inherit it in between.
pub fn inheritable(fd: impl AsFd) -> io::Result<()> {
    rustix::io::fcntl_setfd(fd, FdFlags::empty())?;
    Ok(())
}

/// Takes ownership of a descriptor that this process inherited from its parent.
///
/// Fails, rather than claiming a number that nothing holds, if `fd` is not open.
pub fn inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is a standard stream, not an inherited endpoint"),
        ));
    }
    std::fs::symlink_metadata(format!("/proc/self/fd/{fd}"))
        .map_err(|e| io::Error::new(e.kind(), format!("inherited fd {fd} is not open: {e}")))?;
    // SAFETY: `fd` is open (checked above) and was placed in this process by
    // the parent, which passes each inherited number to exactly one
    // argument; this process claims each number once, so nothing else in this
    // process owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
