//! Futex waits and wakes on words in shared memory (`futex(2)`), used for rare
//! rendezvous events (channel offers and acceptance), not on the data path.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Waits while `*word == expected`, for at most `timeout`. Returns on wake, on timeout,
/// on a value change or on a signal; callers re-check their condition.
///
/// Calls `futex(FUTEX_WAIT)` without `FUTEX_PRIVATE_FLAG`, so it works on memory shared
/// between processes. See <https://man7.org/linux/man-pages/man2/futex.2.html>.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    super::count();
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // EAGAIN (value changed), ETIMEDOUT and EINTR are all "re-check and go on".
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every waiter on `word` (`futex(FUTEX_WAKE)`, shared).
pub fn wake_all(word: &AtomicU32) {
    super::count();
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}
