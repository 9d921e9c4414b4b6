//! Stop signals: SIGINT and SIGTERM set a flag so that the bridge withdraws its
//! services and closes its session before it exits.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT or SIGTERM once [`catch_stop_signals`] ran.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn note_stop_signal(_sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM set [`STOP`] instead of killing the process; with
/// `SA_RESETHAND`, so a second signal kills it as usual if the first was not heeded.
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
