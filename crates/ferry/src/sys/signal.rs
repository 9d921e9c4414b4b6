//! Stop signals for programs built on ferry: SIGINT and SIGTERM noted in a flag
//! instead of killing the process, so that its loops can end and its destructors run
//! (its members leave their groups, a bridge withdraws its services, a temporary file
//! is removed). A process killed by a signal runs none of that; the group's other
//! members only find it dead later. `ferry`, `ferry-bridge` and a program of yours use
//! the same three calls:
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! ferry::stop::catch_signals()?;
//! while ferry::stop::signal().is_none() {
//!     // publish, receive with a timeout, ...: the loop looks between its steps
//! #   break;
//! }
//! # Ok(()) }
//! ```

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The SIGINT or SIGTERM that asked this process to stop (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The same as a flag, for loops that take an `&AtomicBool` to stop on.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn note_stop_signal(sig: libc::c_int) {
    // Async-signal-safe: atomic stores only.
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM note themselves ([`signal`], [`flag`]) instead of
/// killing the process, so that its loops can end and its destructors run. The handler
/// is installed without `SA_RESTART`, so a blocking read returns `EINTR` at once, and
/// with `SA_RESETHAND`, so a second signal kills the process as usual if the first one
/// was not heeded.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// ferry::stop::catch_signals()?;
/// assert_eq!(ferry::stop::signal(), None); // none came yet
/// # Ok(()) }
/// ```
///
/// # Errors
/// `sigaction(2)`'s.
pub fn catch_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: an all-zero `sigaction` is a valid value (empty mask, no flags) that is
        // filled in below before use.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = note_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND;
        // SAFETY: `sa.sa_mask` is a valid, initialised signal set owned by this frame.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        super::count();
        // SAFETY: `sa` is fully initialised and its handler only does atomic stores,
        // which are async-signal-safe; the old action is not asked for (null).
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal that asked this process to stop, once [`catch_signals`] caught one.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// ferry::stop::catch_signals()?;
/// # // SAFETY: raise(3) on this thread, with the handler installed above.
/// # unsafe { libc::raise(libc::SIGTERM) };
/// assert_eq!(ferry::stop::signal(), Some(libc::SIGTERM));
/// # Ok(()) }
/// ```
pub fn signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// A flag set when [`catch_signals`] caught a stop signal: for loops that take an
/// `&AtomicBool` to stop on.
///
/// ```
/// use std::sync::atomic::Ordering;
/// # fn main() -> std::io::Result<()> {
/// ferry::stop::catch_signals()?;
/// assert!(!ferry::stop::flag().load(Ordering::Relaxed));
/// # Ok(()) }
/// ```
pub fn flag() -> &'static AtomicBool {
    &STOP
}
