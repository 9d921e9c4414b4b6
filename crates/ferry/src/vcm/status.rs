//! Status words: one 64-bit word per command, written by the endpoint when it reaps a
//! completion and read by the application without a system call.
//!
//! ```text
//!  63    60 59                32 31                       0
//! +--------+--------------------+---------------------------+
//! | state  | sequence (28 bits) | value: length or errno    |
//! +--------+--------------------+---------------------------+
//! ```
//!
//! The sequence counts completions of the command, so a loop command's application can
//! tell a new result from the previous one even when both carry the same length.
//!
//! ```
//! use ferry::vcm::Status;
//! let w = Status::Done(512).encode(7);
//! assert_eq!(Status::decode(w), (Status::Done(512), 7));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// What a command's status word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not activated (a dormant loop command, or a free slot).
    Idle,
    /// Handed to the kernel; no result yet.
    Pending,
    /// Completed; the value is the number of bytes sent or received (0 for accept-stop).
    Done(u32),
    /// A datagram arrived that was larger than the buffer; the value is the datagram's
    /// full length (`MSG_TRUNC`). The buffer holds its first bytes; the rest is lost.
    Truncated(u32),
    /// The kernel (or the endpoint) refused or failed the command; the value is an errno
    /// (`ECANCELED` for a command whose linked predecessor failed).
    Failed(i32),
    /// A loop command removed by accept-stop.
    Stopped,
}

const IDLE: u64 = 0;
const PENDING: u64 = 1;
const DONE: u64 = 2;
const TRUNCATED: u64 = 3;
const FAILED: u64 = 4;
const STOPPED: u64 = 5;
const SEQ_MASK: u64 = (1 << 28) - 1;

impl Status {
    /// Packs the status with a completion sequence number (taken modulo 2^28).
    pub fn encode(self, seq: u32) -> u64 {
        let (state, value) = match self {
            Status::Idle => (IDLE, 0),
            Status::Pending => (PENDING, 0),
            Status::Done(n) => (DONE, n),
            Status::Truncated(n) => (TRUNCATED, n),
            Status::Failed(e) => (FAILED, e as u32),
            Status::Stopped => (STOPPED, 0),
        };
        (state << 60) | ((u64::from(seq) & SEQ_MASK) << 32) | u64::from(value)
    }

    /// Unpacks a word written by [`Status::encode`]. An unknown state reads as `Idle`.
    pub fn decode(w: u64) -> (Status, u32) {
        let value = w as u32;
        let seq = ((w >> 32) & SEQ_MASK) as u32;
        let s = match w >> 60 {
            PENDING => Status::Pending,
            DONE => Status::Done(value),
            TRUNCATED => Status::Truncated(value),
            FAILED => Status::Failed(value as i32),
            STOPPED => Status::Stopped,
            _ => Status::Idle,
        };
        (s, seq)
    }

    /// True once the command has a result (anything but `Idle` and `Pending`).
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Idle | Status::Pending)
    }
}

/// One command's status word.
///
/// The endpoint stores with `Release` after it has finished writing the command's buffer
/// bookkeeping (SYNC POINT: pairs with the `Acquire` in [`StatusWord::load`]).
#[derive(Debug, Default)]
pub struct StatusWord(AtomicU64);

impl StatusWord {
    /// Reads the status and its completion sequence. A plain load: no system call.
    pub fn load(&self) -> (Status, u32) {
        // SYNC POINT: pairs with the Release store in `StatusWord::store`.
        Status::decode(self.0.load(Ordering::Acquire))
    }

    /// The raw word, for applications that poll it directly.
    pub fn raw(&self) -> &AtomicU64 {
        &self.0
    }

    pub(crate) fn store(&self, s: Status, seq: u32) {
        // SYNC POINT: pairs with the Acquire load in `StatusWord::load`.
        self.0.store(s.encode(seq), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips() {
        for s in [
            Status::Idle,
            Status::Pending,
            Status::Done(0),
            Status::Done(u32::MAX),
            Status::Truncated(2048),
            Status::Failed(libc::ECANCELED),
            Status::Stopped,
        ] {
            for seq in [0, 1, (1 << 28) - 1] {
                assert_eq!(Status::decode(s.encode(seq)), (s, seq));
            }
        }
        // The sequence wraps instead of spilling into the state bits.
        assert_eq!(Status::decode(Status::Done(3).encode(1 << 28)).1, 0);
    }

    #[test]
    fn word_publishes_what_was_stored() {
        let w = StatusWord::default();
        assert_eq!(w.load(), (Status::Idle, 0));
        w.store(Status::Truncated(9), 4);
        assert_eq!(w.load(), (Status::Truncated(9), 4));
        assert!(w.load().0.is_final());
        assert!(!Status::Pending.is_final());
    }
}
