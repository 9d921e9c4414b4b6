//! The few operating-system calls the tool makes itself: descriptors handed from
//! `ferry pipeline` to its stage processes (the same helpers as the measuring workers',
//! from ferry-measure), and the stop signals.
//!
//! This is the only module of the CLI that contains `unsafe` code.
#![allow(unsafe_code)]

use std::io;

pub use ferry_measure::sys::{inheritable, inherited_fd};

/// The SIGINT or SIGTERM that asked this process to stop (0: none yet).
static STOP_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_stop_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP_SIGNAL.store(sig, std::sync::atomic::Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM set a flag ([`stop_signal`]) instead of killing the process,
/// so that its loops can end and its destructors run (leaving a group, removing a
/// temporary file). The handler is installed without `SA_RESTART`, so a blocking read
/// returns `EINTR` at once, and with `SA_RESETHAND`, so a second signal kills the
/// process as usual if the first one was not heeded.
pub fn catch_stop_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags) that is
        // filled in below before use.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = note_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND;
        // SAFETY: `sa.sa_mask` is a valid, initialised signal set owned by this frame.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: `sa` is fully initialised and its handler only does an atomic store,
        // which is async-signal-safe; the old action is not asked for (null).
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that asked this process to stop, once [`catch_stop_signals`] caught one.
pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}
