//! What both ends of a channel share: its settings and counters, the mapping of its
//! shared memory, the wake-up eventfds and the peer's pidfd.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::layout::{self, ChanHeader, Parts};
use super::ring::{Corrupt, RingCtl};
use crate::error::{BadDescriptor, Error, Result};
use crate::sys::fd::{exited, EventFd};
use crate::sys::futex;
use crate::sys::mem::Mapping;
use crate::until::Until;

/// How often an idle busy-polling sender or receiver checks, with one `poll(2)`, that its peer
/// still lives.
pub(super) const LIVENESS_PERIOD: Duration = Duration::from_millis(10);

/// Ring sizes of a new channel.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Messages the forward ring holds (a power of two, at most 65536).
    pub capacity: u32,
    /// Release tokens the reverse ring holds (a power of two, at most 65536). A release
    /// that does not fit goes to the channel's overflow area, which the sender collects
    /// by itself, so a receiver never has to run again for its releases to arrive (only
    /// a sender with more than 65536 messages out at once makes releases wait in the
    /// receiver, for its next receive call or drop).
    pub release_capacity: u32,
    /// A full forward ring loses its oldest message instead of refusing the new one: the
    /// sender takes the oldest queued message back (the receiver never sees it; its fbufs
    /// return to the sender like released ones) and sends the new one, so a send never
    /// waits and never fails with [`Error::Full`]. Counted in [`ChannelStats::evicted`].
    /// The receiver learns the mode from the channel's header. Default false.
    pub lossy: bool,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            capacity: 256,
            release_capacity: 1024,
            lossy: false,
        }
    }
}

/// Counters of one end of a channel (a [`Sender`](super::Sender) or [`Receiver`](super::Receiver)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Messages sent or received.
    pub messages: u64,
    /// Payload bytes described (not copied).
    pub bytes: u64,
    /// Bytes copied because a fragment was not in a shared lot (the plain fallback).
    pub copied_bytes: u64,
    /// Wake-ups this end sent to its peer (eventfd writes).
    pub wakeups: u64,
    /// Times this end blocked.
    pub sleeps: u64,
    /// Releases sent (receiver) or collected (sender).
    pub releases: u64,
    /// Descriptors or releases from the peer that failed validation.
    pub bad_from_peer: u64,
    /// Queued messages the sender took back unread because the ring was full (lossy
    /// channels only; see [`ChannelConfig::lossy`]). Zero at the receiver.
    pub evicted: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) messages: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) copied: AtomicU64,
    pub(super) wakeups: AtomicU64,
    pub(super) sleeps: AtomicU64,
    pub(super) releases: AtomicU64,
    pub(super) bad: AtomicU64,
    pub(super) evicted: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> ChannelStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChannelStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            copied_bytes: l(&self.copied),
            wakeups: l(&self.wakeups),
            sleeps: l(&self.sleeps),
            releases: l(&self.releases),
            bad_from_peer: l(&self.bad),
            evicted: l(&self.evicted),
        }
    }
    pub(super) fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds `n` to a counter that only one thread writes at a time (under the endpoint's
    /// lock, or through `&mut` of the endpoint): a plain load and store, so that the
    /// message path runs no locked instruction for its statistics.
    pub(super) fn bump(a: &AtomicU64, n: u64) {
        a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// What both ends share: the mapping, the wake-up fds and the peer's pidfd.
pub(super) struct Link {
    // Keeps `parts` valid.
    pub(super) _map: Mapping,
    pub(super) parts: Parts,
    /// The receiver sleeps on this one.
    pub(super) rx_efd: EventFd,
    /// The sender sleeps on this one for room in the forward ring.
    pub(super) tx_efd: EventFd,
    /// The sender's domain sleeps on this one for releases (see `arm_sources`).
    pub(super) rel_efd: EventFd,
    pub(super) peer_pid: u32,
    pub(super) pidfd: OwnedFd,
    pub(super) _chan_fd: OwnedFd,
}

// SAFETY: `parts` points into `map`, which the Link owns; the memory is shared memory
// accessed through atomics and the ring protocol.
unsafe impl Send for Link {}
// SAFETY: as above.
unsafe impl Sync for Link {}

impl Link {
    /// Overflow slot `i` (`i < OVERFLOW_SLOTS`).
    pub(super) fn overflow(&self, i: usize) -> &AtomicU64 {
        assert!(i < layout::OVERFLOW_SLOTS);
        // SAFETY: the overflow area holds OVERFLOW_SLOTS words inside `map`, which lives
        // as long as `self`; both ends use it only through atomics.
        unsafe { &*self.parts.overflow.as_ptr().add(i) }
    }

    pub(super) fn header(&self) -> &ChanHeader {
        // SAFETY: `parts.header` points into `map`, which lives as long as `self`; the
        // header's shared fields are atomics.
        unsafe { self.parts.header.as_ref() }
    }

    /// The forward ring's control words (the sender reads the consumer's sleeping flag
    /// here outside its state lock, after a fence shared by several channels).
    pub(super) fn fwd_ctl(&self) -> &RingCtl {
        // SAFETY: `parts.fwd_ctl` points into `map`, which lives as long as `self`; the
        // ring's control words are atomics, shared by design.
        unsafe { self.parts.fwd_ctl.as_ref() }
    }

    pub(super) fn peer_exited(&self) -> bool {
        exited(self.pidfd.as_fd())
    }

    /// Waits on the header's ready word until `done` takes what it holds (`Some`), the
    /// peer dies ([`Error::PeerGone`]) or `until` gives up (its error). Between two looks
    /// a futex wait of at most 20 ms: a peer that dies or a deadline that passes without
    /// a store to the word is still seen soon.
    pub(super) fn wait_ready_word<T>(
        &self,
        until: &mut Until<'_>,
        mut done: impl FnMut(u32) -> Option<Result<T>>,
    ) -> Result<T> {
        let ready = &self.header().rx_ready;
        loop {
            // SYNC: pairs with the Release stores of the word (the receiver's RX_READY,
            // the sender's RX_LISTED).
            let now = ready.load(Ordering::Acquire);
            if let Some(out) = done(now) {
                return out;
            }
            if self.peer_exited() {
                return Err(Error::PeerGone { pid: self.peer_pid });
            }
            until.check()?;
            futex::wait(ready, now, until.slice().min(Duration::from_millis(20)));
        }
    }
}

pub(super) fn corrupt(_: Corrupt) -> Error {
    Error::BadDescriptor(BadDescriptor::Malformed("ring index out of range"))
}

pub(super) fn check_config(c: &ChannelConfig) -> Result<()> {
    let ok = |n: u32| n.is_power_of_two() && (2..=layout::MAX_CAP).contains(&n);
    if !ok(c.capacity) || !ok(c.release_capacity) {
        return Err(Error::InvalidArgument(
            "ring sizes must be powers of two in 2..=65536",
        ));
    }
    Ok(())
}
