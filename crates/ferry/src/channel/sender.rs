//! The sending end: descriptors out on the forward ring, releases in from the reverse
//! ring (and the overflow area), and what happens to a dead receiver's fbufs.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::desc::{self, RawDesc, RawFrag, RawRef, BLOCK_BYTES};
use super::layout;
use super::link::{corrupt, ChannelStats, Counters, Link, LIVENESS_PERIOD};
use super::ring::{Consumer, Corrupt, Producer, Push, Reserved};
use crate::error::{Error, Result};
use crate::iodata::{IoData, IoDataMut};
use crate::region::activity::Entry;
use crate::region::domain::{DomainInner, ReleaseSource};
use crate::region::group::DomainId;
use crate::region::PathAllocator;
use crate::segment::{LotSpan, Segment};
use crate::sync::lock;
use crate::sys::fd::wait_readable;

/// Fragments a dead peer held that no domain of this process could quarantine.
static ORPHANS: Mutex<Vec<(Arc<Segment>, LotSpan, u64)>> = Mutex::new(Vec::new());

pub(super) struct InFlight {
    pub(super) generation: u32,
    /// Its position in the forward ring, to tell whether the receiver took it.
    pub(super) pos: u64,
    pub(super) data: Option<Kept>,
    /// Claimed by [`Sender::claim`] and not on record yet: the message may already be
    /// published, and so taken and released before `Sender::record_claimed` runs.
    pub(super) claimed: bool,
    /// A claimed message's release came first: its record lets it go at once.
    pub(super) early: bool,
}

/// What a message in flight keeps until it is released: its data, its continuation
/// blocks, and its cargo.
pub(super) type Kept = (IoData, Option<Segment>, Option<Box<SentFds>>);

/// A message's cargo at the sender: this process's own duplicates of the descriptors,
/// whose numbers the receiver reads from `table` (in our lot) and takes with
/// `pidfd_getfd`. Dropped, hence closed, when the message is released, evicted, or
/// reclaimed from a dead receiver.
pub(super) struct SentFds {
    _table: Segment,
    _fds: Vec<OwnedFd>,
}

/// A message's name between the two ends: its entry in the sender's table of messages in
/// flight and that entry's generation (bumped at each reuse, so that a stale release is
/// told apart). It travels as one word, the descriptor's token and the release the
/// receiver sends back: [`word`](Self::word) is the only encoder of that word and
/// [`from_word`](Self::from_word) its decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) idx: u32,
    pub(super) generation: u32,
}

impl Token {
    /// The word on the wire: the generation in the high half, the index in the low.
    #[inline]
    pub(super) fn word(self) -> u64 {
        (self.generation as u64) << 32 | self.idx as u64
    }

    /// The token a release word names (not yet checked against the table).
    #[inline]
    pub(super) fn from_word(w: u64) -> Token {
        Token {
            idx: (w & 0xffff_ffff) as u32,
            generation: (w >> 32) as u32,
        }
    }
}

pub(super) struct SendState {
    pub(super) fwd: Producer<RawDesc>,
    pub(super) rev: Consumer<u64>,
    /// Threads asleep waiting for releases (`ReleaseSource::arm`) and for room in the
    /// forward ring (`send`). Several threads of a domain may sleep on one sender (a
    /// stage's main thread and another receiving thread both arm it): the last one to
    /// wake clears the ring's flag and drains the eventfd, so that no sleeper loses the
    /// wake-up another consumed.
    pub(super) rel_sleepers: u32,
    pub(super) tx_sleepers: u32,
    pub(super) inflight: Vec<InFlight>,
    /// Entries of `inflight` holding a message, kept as a count so that neither a send
    /// (which publishes it in the activity entry) nor `in_flight` has to count them.
    pub(super) out: u64,
    pub(super) free_tokens: Vec<u32>,
    pub(super) last_check: Instant,
    /// The receiver broke the reverse ring: every later send fails.
    pub(super) rev_corrupt: bool,
    /// Sends since the reverse ring was last drained (see [`DRAIN_EVERY`]).
    pub(super) undrained: u32,
    /// The token of the message at each forward ring position, indexed by position
    /// modulo the ring's capacity: an evicted position finds its message at once
    /// (kept on lossy channels only, the only ones that evict).
    pub(super) by_pos: Vec<u32>,
}

/// A message just pushed, for [`Sender::finish_send`] to put on record.
pub(super) struct Sent {
    pub(super) token: Token,
    /// Its ring position.
    pub(super) pos: u64,
    pub(super) data: IoData,
    /// Its continuation blocks, if it has any.
    pub(super) meta: Option<Segment>,
    /// Its cargo, if it carries descriptors.
    pub(super) fds: Option<Box<SentFds>>,
    /// A message evicted to make room (lossy channels), given back after the lock.
    pub(super) evicted: Option<Option<Kept>>,
}

impl SendState {
    /// A free token, or a new one (the vector grows only while the number of messages
    /// out grows past any before).
    pub(super) fn take_token(&mut self) -> Token {
        match self.free_tokens.pop() {
            Some(idx) => Token {
                idx,
                generation: self.inflight[idx as usize].generation.wrapping_add(1),
            },
            None => {
                self.inflight.push(InFlight {
                    generation: 0,
                    pos: 0,
                    data: None,
                    claimed: false,
                    early: false,
                });
                Token {
                    idx: self.inflight.len() as u32 - 1,
                    generation: 0,
                }
            }
        }
    }

    /// Gives back a token taken for a message that was not sent.
    pub(super) fn untake_token(&mut self, t: Token) {
        self.free_tokens.push(t.idx);
    }
}

/// A send drains the reverse ring only every this many sends: each drain reads cache
/// lines the receiver wrote (a transfer between cores), and one drain then pays for many
/// releases at once. Releases that arrive meanwhile are collected by the next drain, or
/// by whatever collects first: the domain's allocators when a path runs short, a wait
/// for releases (`arm`), a blocking receive in the domain, [`Domain::collect_releases`],
/// [`Sender::collect_releases`], [`Sender::in_flight`], a dropped sender.
///
/// [`Domain::collect_releases`]: crate::region::Domain::collect_releases
pub(super) const DRAIN_EVERY: u32 = 16;

/// Releases a drain copies out of the reverse ring before it lets any go (see
/// `SendCore::drain`).
const RELEASE_BATCH: usize = 64;

pub(super) struct SendCore {
    pub(super) link: Link,
    /// Weak: a closed sender parked in its domain must not keep the domain alive.
    pub(super) domain: std::sync::Weak<DomainInner>,
    pub(super) peer: DomainId,
    pub(super) meta: PathAllocator,
    pub(super) state: Mutex<SendState>,
    pub(super) gone: AtomicBool,
    /// The forward ring is lossy: a full ring loses its oldest message (see
    /// `ChannelConfig::lossy`).
    pub(super) lossy: bool,
    pub(super) stats: Counters,
    /// Where this sender publishes its messages in flight in the control block.
    pub(super) entry: Entry,
}

impl SendCore {
    /// Wakes the receiver (it said it sleeps, and this sender took its flag), counted.
    fn wake(&self) {
        Counters::add(&self.stats.wakeups, 1);
        self.link.rx_efd.notify();
    }

    /// Publishes messages in flight and sent (two relaxed stores; under the state lock).
    fn publish(&self, st: &SendState) {
        self.entry
            .set(st.out, self.stats.messages.load(Ordering::Relaxed));
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, SendState> {
        lock(&self.state)
    }

    /// Drains the reverse ring; returns fbufs of released messages.
    pub(super) fn drain(&self, st: &mut SendState) -> Result<u64> {
        st.undrained = 0;
        let mut n = 0;
        let mut wake = false;
        let mut spilled = Vec::new();
        // SYNC: pairs with the receiver's Release increment after it wrote a slot.
        let count = &self.link.header().overflow;
        // A plain load first: the swap would take the line from the receiver every time.
        if count.load(Ordering::Relaxed) != 0 && count.swap(0, Ordering::AcqRel) != 0 {
            for i in 0..st.inflight.len().min(layout::OVERFLOW_SLOTS) {
                let v = self.link.overflow(i).swap(0, Ordering::AcqRel);
                if v != 0 {
                    spilled.push(v.wrapping_sub(1));
                }
            }
        }
        let SendState {
            rev,
            inflight,
            free_tokens,
            ..
        } = &mut *st;
        let mut bad = 0;
        let mut take = |token: u64| {
            let t = Token::from_word(token);
            match inflight.get_mut(t.idx as usize) {
                Some(f) if f.generation == t.generation && f.data.is_some() => {
                    // Returns its fbufs to their paths now.
                    drop(f.data.take());
                    free_tokens.push(t.idx);
                    n += 1;
                }
                // Published by `Sender::publish_claimed`, taken and released before its
                // `record_claimed`, which then lets it go.
                Some(f) if f.generation == t.generation && f.claimed && !f.early => {
                    f.early = true;
                }
                _ => bad += 1,
            }
        };
        spilled.into_iter().for_each(&mut take);
        // One head store and one fence for the whole batch, not one per release. The
        // releases are copied out first and let go after: letting one go drops
        // references (locked instructions), and each locked instruction would hold back
        // the loads of the slots after it, so that their cache lines (written by the
        // receiver's core) would come over one after another instead of together.
        let mut batch = [0u64; RELEASE_BATCH];
        loop {
            let mut k = 0;
            let (_, w) = rev
                .pop_batch(RELEASE_BATCH, |t| {
                    batch[k] = t;
                    k += 1;
                })
                .map_err(corrupt)?;
            wake |= w;
            batch[..k].iter().for_each(|&t| take(t));
            if k < RELEASE_BATCH {
                break;
            }
        }
        if bad > 0 {
            Counters::add(&self.stats.bad, bad);
        }
        // The receiver closed its end and released what it left in the ring; messages
        // pushed after that (our check of `rx_closed` raced with its close) will never be
        // taken: they come back here.
        if self.link.header().rx_closed.load(Ordering::Acquire) == layout::RX_DRAINED {
            let head = st.fwd.consumed().map_err(corrupt)?;
            for (i, f) in st.inflight.iter_mut().enumerate() {
                if f.data.is_some() && f.pos >= head {
                    drop(f.data.take());
                    st.free_tokens.push(i as u32);
                    n += 1;
                }
            }
        }
        if n > 0 {
            // Under the state lock: the only writer.
            Counters::bump(&self.stats.releases, n);
            st.out = st.out.saturating_sub(n);
            self.publish(st);
        }
        if wake {
            // The receiver has releases that did not fit and sleeps until there is room.
            self.wake();
        }
        Ok(n)
    }

    /// The receiver died: what it held comes back once no live domain holds it. It may
    /// have forwarded some of it, so the fragments go to the domain's quarantine, which
    /// lets each go when the group's ledgers show nobody holding it (at once, usually).
    /// The continuation blocks only the dead receiver read go at once.
    pub(super) fn reclaim_all(&self, st: &mut SendState) {
        self.gone.store(true, Ordering::Release);
        let all: Vec<_> = st
            .inflight
            .iter_mut()
            .filter_map(|f| {
                f.claimed = false;
                f.early = false;
                f.data.take()
            })
            .collect();
        st.free_tokens = (0..st.inflight.len() as u32).collect();
        st.out = 0;
        self.publish(st);
        let domain = self.domain.upgrade();
        let mut frags = Vec::new();
        for (data, meta, fds) in all {
            drop(meta);
            // Our copies of the descriptors: the dead receiver took its own or none.
            drop(fds);
            frags.extend(
                data.fragments()
                    .iter()
                    .filter_map(|f| Some((f.segment().clone(), f.lot_span()?, f.len() as u64))),
            );
        }
        match &domain {
            Some(d) => d.quarantine(self.peer, frags),
            // This process dropped its domain and so cannot read the ledgers any more.
            // Releasing could let an owner reuse spans a domain downstream of the dead
            // peer still reads: keep them until this process exits instead.
            None => lock(&ORPHANS).extend(frags),
        }
        if let Some(d) = domain {
            d.forget_dead_peers();
        }
    }

    pub(super) fn check_peer(&self, st: &mut SendState, force: bool) -> Result<()> {
        if self.gone.load(Ordering::Acquire) {
            return Err(Error::PeerGone {
                pid: self.link.peer_pid,
            });
        }
        let now = Instant::now();
        if force || now.duration_since(st.last_check) >= LIVENESS_PERIOD {
            st.last_check = now;
            if self.link.peer_exited() {
                self.reclaim_all(st);
                return Err(Error::PeerGone {
                    pid: self.link.peer_pid,
                });
            }
        }
        Ok(())
    }

    /// Takes back the message at ring position `pos`, which `evict_oldest` just took
    /// from the receiver: its token is free again and its fbufs go back (when the caller
    /// drops what this returns, after unlocking) as if it had been released.
    fn take_evicted(&self, st: &mut SendState, pos: u64) -> Option<Kept> {
        let i = st.by_pos[(pos % st.by_pos.len() as u64) as usize] as usize;
        let f = st.inflight.get(i)?;
        if f.data.is_none() || f.pos != pos {
            return None;
        }
        st.free_tokens.push(i as u32);
        st.out = st.out.saturating_sub(1);
        Counters::add(&self.stats.evicted, 1);
        st.inflight[i].data.take()
    }

    pub(super) fn in_flight(&self) -> usize {
        let mut st = self.lock();
        // Releases not collected yet (see `DRAIN_EVERY`) are not in flight. A broken
        // reverse ring is reported by the next send.
        let _ = self.drain(&mut st);
        debug_assert_eq!(
            st.out as usize,
            st.inflight.iter().filter(|f| f.data.is_some()).count()
        );
        st.out as usize
    }
}

impl ReleaseSource for SendCore {
    fn arm(&self) -> Option<bool> {
        let mut st = self.lock();
        self.drain(&mut st).ok()?;
        if self.gone.load(Ordering::Acquire) || !st.inflight.iter().any(|f| f.data.is_some()) {
            return None;
        }
        match st.rev.prepare_sleep() {
            Ok(true) => {
                st.rel_sleepers += 1;
                Some(true)
            }
            Ok(false) => {
                if st.rel_sleepers > 0 {
                    // As in `send_timeout`: the flag was cleared under another sleeper.
                    self.link.rel_efd.notify();
                }
                Some(false)
            }
            Err(_) => None,
        }
    }

    fn disarm(&self) {
        let mut st = self.lock();
        st.rel_sleepers = st.rel_sleepers.saturating_sub(1);
        // Another thread still sleeps on this sender: leave the flag and the eventfd as
        // they are, so that it wakes too (it drains the eventfd when it disarms).
        if st.rel_sleepers == 0 {
            st.rev.cancel_sleep();
            self.link.rel_efd.drain();
        }
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.link.rel_efd.as_fd()
    }

    fn peer_fd(&self) -> BorrowedFd<'_> {
        self.link.pidfd.as_fd()
    }

    fn peer_died(&self) {
        let mut st = self.lock();
        let _ = self.check_peer(&mut st, true);
    }

    fn collect(&self) -> bool {
        // try_lock: allocation inside `send` may land here while we hold the lock.
        let Ok(mut st) = self.state.try_lock() else {
            return true;
        };
        let Ok(released) = self.drain(&mut st) else {
            return false;
        };
        let waiting = st.inflight.iter().any(|f| f.data.is_some());
        // Probe liveness (a system call, at most every 10 ms) only when releases have
        // stopped coming while messages are still out.
        if waiting && released == 0 && self.check_peer(&mut st, false).is_err() {
            return false;
        }
        waiting && !self.gone.load(Ordering::Acquire)
    }
}

/// Most senders one [`Sender::fan_out`] call serves (its state is on the stack).
pub(crate) const FAN: usize = 16;

/// How a send ends: with its own fence and wake-up check, or leaving both to
/// [`Sender::wake_after_unfenced`] (and then perhaps collecting releases whatever the
/// count, see [`Sender::try_send_unfenced`]).
#[derive(Clone, Copy)]
pub(super) enum Fence {
    Fenced,
    Unfenced { collect: bool },
}

impl Fence {
    fn collects(self) -> bool {
        matches!(self, Fence::Unfenced { collect: true })
    }
}

/// The sending end of a channel: a shared-memory ring pair between two domains that
/// carries descriptors of [`IoData`](crate::IoData), never payload, with releases flowing
/// back on a reverse ring.
///
/// A `Sender` is made by [`Domain::connect`](crate::Domain::connect), its
/// [`Receiver`](crate::Receiver) by [`Domain::accept`](crate::Domain::accept). Sending pins
/// the message's fbufs in the sender until the receiver drops every fragment; the drop
/// pushes a release on the reverse ring, and the sender returns the fbufs to their path's
/// free list the next time it sends or allocates (or at
/// [`collect_releases`](Self::collect_releases)). When either process dies the other
/// learns it through a pidfd, and the sender reclaims everything the dead receiver held.
pub struct Sender {
    pub(super) core: Arc<SendCore>,
    /// The path [`Sender::loan_slice`] allocates from, made at its first use.
    path: OnceLock<PathAllocator>,
}

impl Sender {
    /// Tells the receiver that this sender is now in its owner's list of senders (a
    /// publisher's subscribers), so that everything its owner publishes from here on
    /// reaches it: the receiver's [`Receiver::wait_listed`](super::Receiver) returns.
    pub(crate) fn confirm_listed(&self) {
        let ready = &self.core.link.header().rx_ready;
        // SYNC: pairs with the receiver's Acquire load in `wait_listed`.
        ready.store(layout::RX_LISTED, Ordering::Release);
        crate::sys::futex::wake_all(ready);
    }

    pub(super) fn new(core: Arc<SendCore>) -> Sender {
        Sender {
            core,
            path: OnceLock::new(),
        }
    }
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("peer", &self.core.peer)
            .finish()
    }
}

/// A [`Sender`] held for one message (see [`Sender::reserve`]): the ring has room and
/// the channel was open when it was taken; nothing is sent unless [`send`](Self::send)
/// is called.
#[must_use = "a reservation sends nothing until `send` is called"]
pub struct SendSlot<'a> {
    pub(super) tx: &'a Sender,
    pub(super) st: std::sync::MutexGuard<'a, SendState>,
}

impl std::fmt::Debug for SendSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendSlot").field("sender", self.tx).finish()
    }
}

impl SendSlot<'_> {
    /// Sends `data` in the reserved place, as [`Sender::try_send`] does.
    ///
    /// # Errors
    /// [`Error::PeerGone`] if the receiver died or [`Error::Disconnected`] if it closed
    /// meanwhile; [`Error::InvalidArgument`] for more fragments than a message holds;
    /// allocation errors of the copying fallback.
    pub fn send(self, data: &IoData) -> Result<()> {
        self.tx.open(&self.st)?;
        self.tx
            .send_locked(self.st, data, &[], Fence::Fenced)
            .map(drop)
    }

    /// Makes `data`'s descriptor now, before its payload is written, and stores it in the
    /// reserved ring place, unpublished, if the fast path can take the message: one
    /// segment (what a path allocates) in a lot and without a send hook, on a channel
    /// that is not lossy. The message's token is taken. `None` leaves the message to
    /// [`send`](Self::send).
    ///
    /// The [`Prepared`] is then either published by
    /// [`publish_prepared`](Self::publish_prepared) or given back by
    /// [`unprepare`](Self::unprepare) (a later push writes the slot again).
    #[inline]
    pub(super) fn prepare(&mut self, data: &IoDataMut) -> Option<Prepared> {
        if self.tx.core.lossy {
            return None;
        }
        // One segment: the only form checked cheaply at publication.
        let (seg, frag) = sole_fragment(data)?;
        // The ring place: the slot was reserved with room, so there is one (a faulty
        // receiver that moved its position back leaves the message to `send`).
        let place = self.st.fwd.reserve().ok().flatten()?;
        let token = self.st.take_token();
        let d: RawDesc = desc::encode(token.word(), frag.as_slice(), &mut [], RawRef::NONE);
        // Stored now, published later: the receiver does not read the slot before then,
        // and a later push (after `unprepare`, or `send` instead) writes the slot again.
        // SAFETY: reserved just above, under the state lock this slot holds.
        unsafe { Producer::write_reserved(&place, d) };
        Some(Prepared {
            place,
            token,
            len: data.len(),
            seg,
            #[cfg(debug_assertions)]
            core: Arc::as_ptr(&self.tx.core),
        })
    }

    /// Gives back a prepared message's token: it will not be published.
    pub(super) fn unprepare(&mut self, p: Prepared) {
        self.st.untake_token(p.token);
    }

    /// Publishes the descriptor `p` stored (one store: its ring slot's sequence number),
    /// before anything of the sender's state is touched, since the application's writes
    /// since `prepare` may have pushed that state out of the caches and the TLB; then
    /// freezes `data` and puts it on record, as [`send`](Self::send) does.
    ///
    /// # Safety
    /// `p` was made by [`prepare`](Self::prepare) on this slot, and nothing was pushed on
    /// it since (no other `Prepared` published, no `send`).
    #[inline]
    pub(super) unsafe fn publish_prepared(mut self, p: Prepared, data: IoDataMut) {
        #[cfg(debug_assertions)]
        assert!(std::ptr::eq(p.core, Arc::as_ptr(&self.tx.core)));
        debug_assert!(p.describes(&data));
        let pos = p.place.position();
        // SAFETY: the place was reserved, and the descriptor written there, by `prepare`
        // under this slot's state lock, held since, and nothing was pushed in between
        // (the caller's contract).
        unsafe { self.st.fwd.publish_written(p.place) };
        let sent = Sent {
            token: p.token,
            pos,
            data: data.freeze(),
            meta: None,
            fds: None,
            evicted: None,
        };
        self.tx.finish_send(self.st, sent, Fence::Fenced);
    }
}

/// `data`'s one segment and the fragment that describes it (none if the message is
/// empty); `None` unless it is one segment in a lot.
#[inline]
fn sole_fragment(data: &IoDataMut) -> Option<(*const Segment, Option<RawFrag>)> {
    let seg = data.sole_segment()?;
    let frag = match data.frozen_spans().next() {
        Some((span, len)) => {
            let s = span?;
            Some(RawFrag::new(
                s.lot.slot,
                s.lot.generation,
                s.offset,
                len as u64,
            ))
        }
        None => None,
    };
    Some((seg, frag))
}

/// A ring place that [`Sender::claim`] took for a message, its token taken, the
/// descriptor not yet written: [`publish`](Self::publish) writes and publishes it.
///
/// It does not keep its sender: whoever holds it keeps that sender alive (and so its
/// ring mapped) until the claim is published and recorded, or given back, and passes it
/// to [`record`](Self::record) and [`unclaim`](Self::unclaim).
pub(crate) struct Claimed {
    place: Reserved<RawDesc>,
    token: Token,
    /// The descriptor, made at the claim (in the publisher's own memory, so that the
    /// send only copies it into the slot).
    desc: RawDesc,
    /// As in [`Prepared`]: what the descriptor describes.
    len: usize,
    seg: *const Segment,
}

impl Claimed {
    /// Whether the descriptor still describes `data`: same length, same one segment.
    #[inline]
    pub(crate) fn describes(&self, data: &IoDataMut) -> bool {
        self.len == data.len() && data.sole_segment() == Some(self.seg)
    }

    /// Writes the claimed descriptor into its ring slot and publishes it: stores into
    /// that slot's first cache line alone (a one-fragment descriptor and its mark),
    /// nothing of the sender's state read or written (the application's writes since the
    /// claim may have pushed it out of the caches and the TLB). The descriptor is written
    /// here rather than at the claim: the slot's line is the receiver's (it polls that
    /// slot's mark while it waits), so a write at the claim would cost a transfer between
    /// cores that the next locked instruction waits for, one claim after another, and the
    /// publication then a second one; written here, the publisher's stores to its
    /// subscribers' slots are pending together and their transfers overlap. It is made
    /// at the claim, in the publisher's own memory, so that the send only copies it.
    ///
    /// The receiver may take the message at once; [`record`](Self::record) must follow
    /// (a release that comes first waits for it, see `SendCore::drain`). Publishing a
    /// claim twice, or after another push on its sender, garbles that ring's marks,
    /// which the receiver checks as it checks anything a peer writes.
    ///
    /// The caller keeps the claim's sender alive (its ring mapped).
    #[inline]
    pub(crate) fn publish(&self) {
        // Written without the state lock the claim held: no thread touches a forward
        // slot under that lock except to push, and only the claim's owner pushes (a
        // publisher, through its loan); the receiver reads the slot only after the mark's
        // Release store below, paired with its Acquire load of the mark (loom model
        // `claimed_place_written_later_is_seen_whole`).
        // SAFETY: the place was reserved and claimed by `Sender::claim` and neither
        // published nor given back since (the caller's contract), so its slot is ours to
        // write and the receiver does not read it before the mark below; the ring is
        // mapped while the claim's sender lives, which the caller keeps.
        unsafe {
            Producer::write_reserved(&self.place, self.desc);
            Producer::publish_claimed(&self.place);
        }
    }

    /// Puts the message, just [`publish`](Self::publish)ed, on record under its token as
    /// [`Sender::try_send_unfenced`] does (the caller then calls
    /// [`Sender::wake_after_unfenced`] for every sender that returned `Ok`). `tx` is the
    /// sender it was claimed on. A receiver that died meanwhile had everything
    /// reclaimed: the message is not kept ([`Error::PeerGone`]). One that closed
    /// meanwhile gets it on record all the same, so that it comes back as messages
    /// pushed after a close do ([`Error::Disconnected`]).
    pub(crate) fn record(&self, tx: &Sender, data: &IoData) -> Result<()> {
        let c = &*tx.core;
        let mut st = c.lock();
        if c.gone.load(Ordering::Acquire) {
            // `reclaim_all` freed every token, this one included.
            return Err(Error::PeerGone {
                pid: c.link.peer_pid,
            });
        }
        let idx = self.token.idx as usize;
        st.inflight[idx].claimed = false;
        if std::mem::take(&mut st.inflight[idx].early) {
            // Taken and released already (a drain saw its release first): nothing to
            // keep, the token is free again.
            st.free_tokens.push(self.token.idx);
            // Under the state lock: the only writer.
            Counters::bump(&c.stats.messages, 1);
            Counters::bump(&c.stats.bytes, data.len() as u64);
            Counters::bump(&c.stats.releases, 1);
            c.publish(&st);
            return Ok(());
        }
        let sent = Sent {
            token: self.token,
            pos: self.place.position(),
            data: data.clone(),
            meta: None,
            fds: None,
            evicted: None,
        };
        tx.finish_send(st, sent, Fence::Unfenced { collect: false });
        if c.link.header().rx_closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Disconnected);
        }
        Ok(())
    }

    /// Gives back a claim that was not published (`tx` is the sender it was claimed on):
    /// its ring place and its token.
    pub(crate) fn unclaim(&self, tx: &Sender) {
        let c = &*tx.core;
        let mut st = c.lock();
        if c.gone.load(Ordering::Acquire) {
            // `reclaim_all` freed every token already.
            return;
        }
        st.fwd.unclaim(&self.place);
        st.inflight[self.token.idx as usize].claimed = false;
        st.untake_token(self.token);
    }
}

// SAFETY: `seg` is an address compared, never dereferenced; `place` points into the
// ring's shared mapping, which the claim's holder keeps mapped, and is written only by
// `publish`.
unsafe impl Send for Claimed {}
// SAFETY: as above (a shared `Claimed` writes `place` only through `publish`, whose
// contract allows one call).
unsafe impl Sync for Claimed {}

/// A message's descriptor made and stored in its ring place ahead of the payload (see
/// [`SendSlot::prepare`]), not yet published.
pub(super) struct Prepared {
    /// The ring place; the descriptor is written there, unpublished.
    place: Reserved<RawDesc>,
    token: Token,
    /// The length the descriptor gives, and the segment it names: a message written
    /// shorter since, or replaced by another, is not the one described.
    len: usize,
    seg: *const Segment,
    /// The sender it was made for (compared in debug builds only: the loan's hot path
    /// stores nothing it does not need).
    #[cfg(debug_assertions)]
    core: *const SendCore,
}

impl Prepared {
    /// Whether the descriptor still describes `data`: same length, same one segment.
    #[inline]
    pub(super) fn describes(&self, data: &IoDataMut) -> bool {
        self.len == data.len() && data.sole_segment() == Some(self.seg)
    }
}

// SAFETY: `seg` and `core` are addresses compared, never dereferenced; `place` points
// into the ring's shared mapping, which outlives the slot that made it (the slot borrows
// the sender), and is written only by `prepare` and `publish_prepared`, under the
// sender's state lock that slot holds throughout.
unsafe impl Send for Prepared {}
// SAFETY: as above (a shared `Prepared` gives no access to `place`).
unsafe impl Sync for Prepared {}

impl Sender {
    /// Sends `data` if the ring has room, never blocking. The receiver gets an `IoData`
    /// over the same memory; fragments not in a shared lot are copied into an fbuf first
    /// (counted in [`ChannelStats::copied_bytes`]).
    ///
    /// # Errors
    /// [`Error::Full`] if the ring is full, [`Error::PeerGone`] if the receiver died,
    /// [`Error::Disconnected`] if it closed its end.
    pub fn try_send(&self, data: &IoData) -> Result<()> {
        self.try_send_evicting(data).map(drop)
    }

    /// Like [`try_send`](Self::try_send), and says whether the channel lost its oldest
    /// queued message to make room (only a [lossy](super::ChannelConfig::lossy) channel
    /// does; the others return [`Error::Full`] instead).
    ///
    /// # Errors
    /// As [`try_send`](Self::try_send); a lossy channel is never full.
    pub fn try_send_evicting(&self, data: &IoData) -> Result<bool> {
        self.send_now(data, &[], Fence::Fenced)
    }

    /// [`try_send_evicting`](Self::try_send_evicting) as one step of a fan-out: the
    /// message is published but the receiver is not yet woken if it sleeps. After a run
    /// of these (to several channels), [`wake_after_unfenced`](Self::wake_after_unfenced)
    /// must be called with every sender that returned `Ok`: one fence then serves them
    /// all instead of one per channel. (Each send's lock still waits for its ring slot's
    /// cache line to come from the receiver's core, so what this saves is the fences'
    /// own cost: a few percent of a publish.)
    ///
    /// `collect` also collects this sender's releases (all of them, with one fence)
    /// once the message is out, whatever the count since the last collection: a
    /// publisher asks it of one subscriber's sender per publish, in turn, so that each
    /// publish pays for about one release per subscriber and none for many (see
    /// [`DRAIN_EVERY`]). The first of the releases' cache lines is then loaded right
    /// after the descriptor's store, so that the two transfers between cores overlap.
    pub(crate) fn try_send_unfenced(
        &self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
        collect: bool,
    ) -> Result<bool> {
        let st = self.core.lock();
        self.open(&st)?;
        self.send_locked(st, data, fds, Fence::Unfenced { collect })
    }

    /// Finishes the sends of [`try_send_unfenced`](Self::try_send_unfenced): one
    /// SeqCst fence, then each receiver that said it sleeps is woken.
    pub(crate) fn wake_after_unfenced<'a>(senders: impl IntoIterator<Item = &'a Sender>) {
        // Dekker, as in `Producer::try_push`: every publication before this fence, every
        // load of a consumer's `sleeping` after it.
        crate::sync::fence(crate::sync::Ordering::SeqCst);
        // Two passes: consumers that relay elsewhere (asked to be woken last) wait for the
        // wake-up system calls of those that consume here.
        let mut last: [Option<&Sender>; FAN] = [None; FAN];
        let mut n_last = 0;
        for tx in senders {
            let ctl = tx.core.link.fwd_ctl();
            if ctl.take_sleeper_first() {
                tx.core.wake();
            } else if ctl.sleeps() {
                if n_last < FAN {
                    last[n_last] = Some(tx);
                    n_last += 1;
                } else if ctl.take_sleeper() {
                    tx.core.wake();
                }
            }
        }
        for tx in last.iter().flatten() {
            if tx.core.link.fwd_ctl().take_sleeper() {
                tx.core.wake();
            }
        }
    }

    /// [`try_send_unfenced`](Self::try_send_unfenced) to each of `senders` (at most
    /// [`FAN`]), `out[i]` getting `senders[i]`'s outcome, with the descriptors' stores
    /// kept together: every sender's lock is taken, its ring place reserved, its token
    /// taken and `data` cloned first; then the descriptors are stored one after another,
    /// with no locked instruction between them; then the messages go on record and the
    /// locks are let go. A locked instruction (a lock, a reference count) waits for
    /// every store still pending, and each descriptor's store waits for its slot's cache
    /// line to come from that receiver's core: stored together, those transfers overlap
    /// instead of following one another. A sender whose ring is full (or a message that
    /// is not one run of inline fragments) takes the one-by-one path after the others.
    /// [`wake_after_unfenced`](Self::wake_after_unfenced) must follow, with every sender
    /// whose outcome is `Ok`.
    pub(crate) fn fan_out(senders: &[&Sender], data: &IoData, out: &mut [Result<bool>]) {
        assert!(senders.len() <= FAN && out.len() == senders.len());
        let n = data.num_fragments();
        let mut frags = [RawFrag::default(); desc::INLINE_FRAGS];
        let fast = n <= desc::INLINE_FRAGS
            && data.fragments().iter().zip(&mut frags).all(|(f, raw)| {
                let Some(s) = f.lot_span() else {
                    return false;
                };
                *raw = RawFrag::new(s.lot.slot, s.lot.generation, s.offset, f.len() as u64);
                true
            });
        // Once per message, not per sender: a hook (securing an fbuf) acts once. One
        // that fails is left to the one-by-one path, which reports it.
        if !fast
            || data
                .fragments()
                .iter()
                .any(|f| f.segment().on_send().is_err())
        {
            for (tx, o) in senders.iter().zip(out.iter_mut()) {
                *o = tx.try_send_unfenced(data, &[], false);
            }
            return;
        }
        let frags = &frags[..n];
        let mut guards: [Option<std::sync::MutexGuard<'_, SendState>>; FAN] = [const { None }; FAN];
        let mut places: [Option<Reserved<RawDesc>>; FAN] = [const { None }; FAN];
        let mut tokens = [Token {
            idx: 0,
            generation: 0,
        }; FAN];
        let mut later = 0u32;
        for (i, tx) in senders.iter().enumerate() {
            let mut st = tx.core.lock();
            if let Err(e) = tx.open(&st) {
                out[i] = Err(e);
                continue;
            }
            match st.fwd.reserve() {
                Ok(Some(place)) => {
                    tokens[i] = st.take_token();
                    places[i] = Some(place);
                    guards[i] = Some(st);
                }
                // Full (or a ring the receiver broke): after the others, one by one.
                _ => later |= 1 << i,
            }
        }
        // The clones (locked increments) before any descriptor is stored.
        let mut clones: [Option<IoData>; FAN] = [const { None }; FAN];
        for (c, g) in clones.iter_mut().zip(&guards) {
            if g.is_some() {
                *c = Some(data.clone());
            }
        }
        for ((g, p), t) in guards.iter_mut().zip(&mut places).zip(&tokens) {
            if let (Some(st), Some(place)) = (g.as_mut(), p.take()) {
                let d = desc::encode(t.word(), frags, &mut [], RawRef::NONE);
                // SAFETY: reserved above under this lock, held since, nothing pushed since.
                unsafe { st.fwd.publish_reserved(place, d) };
            }
        }
        let len = data.len() as u64;
        for i in 0..senders.len() {
            let Some(mut st) = guards[i].take() else {
                continue;
            };
            let c = &*senders[i].core;
            let t = tokens[i];
            let pos = st.fwd.position().wrapping_sub(1);
            st.inflight[t.idx as usize] = InFlight {
                generation: t.generation,
                pos,
                data: clones[i].take().map(|d| (d, None, None)),
                claimed: false,
                early: false,
            };
            st.out += 1;
            if c.lossy {
                // Only eviction looks a message up by its position.
                let slots = st.by_pos.len() as u64;
                st.by_pos[(pos % slots) as usize] = t.idx;
            }
            // Under the state lock: the only writer.
            Counters::bump(&c.stats.messages, 1);
            Counters::bump(&c.stats.bytes, len);
            c.publish(&st);
            out[i] = Ok(false);
        }
        for (i, tx) in senders.iter().enumerate() {
            if later & 1 << i != 0 {
                out[i] = tx.try_send_unfenced(data, &[], false);
            }
        }
    }

    /// Claims this ring's next place and a token for `data`, before its payload is
    /// written (see [`Producer::claim`]): a publisher's loan does this for every
    /// subscriber, so that its send then only writes and publishes each descriptor
    /// ([`Claimed::publish`]) before it touches anything else. Unlike
    /// [`SendSlot::prepare`], the state lock is not held until then: only the owner of
    /// this sender pushes on it (a publisher, which its loan borrows), and what other
    /// threads do under the lock (collect releases, reclaim a dead receiver's messages)
    /// does not push.
    ///
    /// `None` (nothing claimed) unless the fast path can take the message: one segment
    /// in a lot and without a send hook, a channel that is open, not lossy, and has room.
    /// The claim then ends in exactly one of [`Claimed::publish`] followed by
    /// [`Claimed::record`], or [`Claimed::unclaim`], with nothing pushed on this sender
    /// in between, and the caller keeps this sender alive until then.
    pub(crate) fn claim(&self, data: &IoDataMut) -> Option<Claimed> {
        let c = &*self.core;
        if c.lossy {
            return None;
        }
        let (seg, frag) = sole_fragment(data)?;
        let mut st = c.lock();
        self.open(&st).ok()?;
        let place = st.fwd.reserve().ok().flatten()?;
        let token = st.take_token();
        let f = &mut st.inflight[token.idx as usize];
        f.generation = token.generation;
        f.claimed = true;
        f.early = false;
        st.fwd.claim(&place);
        Some(Claimed {
            place,
            token,
            desc: desc::encode(token.word(), frag.as_slice(), &mut [], RawRef::NONE),
            len: data.len(),
            seg,
        })
    }

    /// Collects this sender's releases now (all of them, with one fence) unless another
    /// thread holds its state (then that thread's send or wait collects them). A
    /// broken reverse ring is reported by the next send.
    pub(crate) fn collect_some(&self) {
        let c = &*self.core;
        let Ok(mut st) = c.state.try_lock() else {
            return;
        };
        if c.drain(&mut st).is_err() {
            st.rev_corrupt = true;
        }
    }

    /// Moves this sender's next collection of releases `by` sends earlier (modulo
    /// [`DRAIN_EVERY`]): a publisher staggers its subscribers' senders so that their
    /// collections, each every `DRAIN_EVERY` sends, fall on different publishes instead
    /// of all on the same one.
    pub(crate) fn stagger_collection(&self, by: u32) {
        self.core.lock().undrained = by % DRAIN_EVERY;
    }

    /// Holds this sender for one message: checks that the channel is open and that its
    /// ring has room, and keeps both true until [`SendSlot::send`]. Reserve before
    /// writing the payload's last bytes (as iceoryx2's loan), and the send that follows
    /// publishes the descriptor before any locked instruction of its own: such an
    /// instruction waits for every store still pending (the payload lines the receiver
    /// read last, the ring slot), which costs a transfer between cores each; published
    /// first, those stores travel together. The reservation holds the sender's state
    /// lock: on this sender, other threads' sends and waits for releases wait until it
    /// is sent or dropped. So keep it short, and do not block in this sender's domain
    /// while holding it (a blocking receive arms the domain's senders for releases,
    /// which takes this lock and would wait for itself). Dropping it sends nothing.
    ///
    /// # Errors
    /// [`Error::Full`] if the ring has no room (a lossy channel makes room when the
    /// message is sent instead), [`Error::PeerGone`], [`Error::Disconnected`].
    pub fn reserve(&self) -> Result<SendSlot<'_>> {
        let c = &*self.core;
        let mut st = c.lock();
        self.open(&st)?;
        if !c.lossy && !st.fwd.has_room().map_err(corrupt)? {
            c.drain(&mut st)?;
            c.check_peer(&mut st, true)?;
            return Err(Error::Full);
        }
        Ok(SendSlot { tx: self, st })
    }

    /// Takes `data` (freshly allocated, not yet written or partly written) as a message
    /// for this sender and reserves its place (see [`reserve`](Self::reserve)); the
    /// descriptor is made now and stored in the place, unpublished, so that
    /// [`Loan::send`](super::Loan::send) only publishes it.
    /// iceoryx2's loan, with the buffer from a [`PathAllocator`] of this domain:
    ///
    /// ```no_run
    /// # fn demo(tx: &ferry::Sender, path: &ferry::PathAllocator) -> ferry::Result<()> {
    /// let mut loan = tx.loan(path.alloc(4096)?)?;
    /// let frame = loan.as_mut_slice().expect("an fbuf from a path is one run");
    /// frame[..7].copy_from_slice(b"frame 1");
    /// loan.send()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); `data` is dropped (its fbufs go back).
    pub fn loan(&self, data: IoDataMut) -> Result<super::Loan<'_>> {
        Ok(super::Loan::new(self.reserve()?, data))
    }

    /// A loan of a fresh fbuf of `len` bytes from this sender's own path
    /// ([`path`](Self::path)): [`loan`](Self::loan) without a path of the caller's.
    /// Never waits: a full ring refuses it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-loan-slice-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let mut loan = tx.loan_slice(4096)?;
    /// let frame = loan.as_mut_slice().expect("an fbuf is one run");
    /// frame[..7].copy_from_slice(b"frame 1");
    /// loan.send()?;
    /// assert!(rx.recv()?.slice(0..7).eq_bytes(b"frame 1"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve), and the path's allocation errors
    /// ([`Error::QuotaExceeded`] when receivers hold its quota).
    pub fn loan_slice(&self, len: usize) -> Result<super::Loan<'_>> {
        self.loan(self.path().alloc(len)?)
    }

    /// Like [`loan`](Self::loan), waiting for room in a full ring until `deadline`
    /// (`None`: for as long as it takes). For callers that hold an optional limit, such
    /// as the C and Python bindings.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-loan-until-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let path = a.path(ferry::PathConfig::default())?;
    /// let deadline = std::time::Instant::now() + Duration::from_secs(1);
    /// let mut loan = tx.loan_until(path.alloc(64)?, Some(deadline))?;
    /// loan.data().fill_from(&[7; 64]);
    /// loan.send()?;
    /// assert!(rx.recv()?.eq_bytes(&[7; 64]));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`loan`](Self::loan), but [`Error::Timeout`] instead of [`Error::Full`] once
    /// `deadline` has passed.
    pub fn loan_until(
        &self,
        data: IoDataMut,
        deadline: Option<Instant>,
    ) -> Result<super::Loan<'_>> {
        loop {
            match self.reserve() {
                Ok(slot) => return Ok(super::Loan::new(slot, data)),
                Err(Error::Full) => self.wait_for_room(deadline)?,
                Err(e) => return Err(e),
            }
        }
    }

    /// The path [`loan_slice`](Self::loan_slice) allocates from: this sender's own, on
    /// its domain's lot, made at the first call (with the default
    /// [`PathConfig`](crate::PathConfig)). Its counters show the loans' fbufs.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-sender-path-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// drop(tx.loan_slice(100)?);                // dropped unsent
    /// assert_eq!(tx.path().outstanding(), 0);  // its fbuf is back
    /// # drop(rx);
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &PathAllocator {
        self.path.get_or_init(|| {
            PathAllocator::new(
                self.core.meta.lot().clone(),
                self.core.domain.clone(),
                crate::PathConfig::default(),
            )
        })
    }

    /// Whether a send may go ahead: the receiver neither died nor closed, and its
    /// reverse ring is sound.
    fn open(&self, st: &SendState) -> Result<()> {
        let c = &*self.core;
        // No liveness probe here: that would be a system call per message. A dead
        // receiver stops consuming, the ring fills, and the probe in `send_locked` (or
        // the blocking wait in `send`, or an allocator collecting releases) notices.
        if c.gone.load(Ordering::Acquire) {
            return Err(Error::PeerGone {
                pid: c.link.peer_pid,
            });
        }
        if c.link.header().rx_closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Disconnected);
        }
        if st.rev_corrupt {
            return Err(corrupt(Corrupt));
        }
        Ok(())
    }

    /// Sends if the ring has room.
    fn send_now(&self, data: &IoData, fds: &[BorrowedFd<'_>], how: Fence) -> Result<bool> {
        let st = self.core.lock();
        self.open(&st)?;
        self.send_locked(st, data, fds, how)
    }

    /// The send itself, under the state lock, the channel checked open. Until the
    /// descriptor is published it runs no locked instruction (no reference count taken,
    /// nothing allocated on the usual path; see [`reserve`](Self::reserve) for why):
    /// `data` is kept (cloned) only once the receiver can see it, still under the lock,
    /// so no release can be drained before its message is on record.
    fn send_locked(
        &self,
        mut st: std::sync::MutexGuard<'_, SendState>,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
        how: Fence,
    ) -> Result<bool> {
        let c = &*self.core;
        super::fds::check_count(fds.len())?;
        // Make sure every fragment lies in a lot the receiver can map (else the copying
        // fallback makes an aggregate that does).
        let copied;
        let data = if data.fragments().iter().all(|f| f.lot_span().is_some()) {
            data
        } else {
            copied = self.shareable(data)?;
            &copied
        };
        let n = data.num_fragments();
        if n as u64 > desc::MAX_FRAGS {
            return Err(Error::InvalidArgument("too many fragments for one message"));
        }
        let raw = data.fragments().iter().map(|f| {
            let s = f
                .lot_span()
                .expect("every fragment is in a lot (checked above)");
            RawFrag::new(s.lot.slot, s.lot.generation, s.offset, f.len() as u64)
        });
        // Messages that fit the ring entry (most) describe their fragments on the stack:
        // a send allocates nothing.
        let mut inline = [RawFrag::default(); desc::INLINE_FRAGS];
        let many: Vec<RawFrag>;
        let frags: &[RawFrag] = if n <= desc::INLINE_FRAGS {
            for (slot, f) in inline.iter_mut().zip(raw) {
                *slot = f;
            }
            &inline[..n]
        } else {
            many = raw.collect();
            &many
        };
        for f in data.fragments() {
            f.segment().on_send()?;
        }
        let nblocks = desc::blocks_needed(frags.len());
        let mut meta = None;
        // Our copies of the cargo, kept until the release, and where their numbers are.
        let cargo = if fds.is_empty() {
            None
        } else {
            Some(self.cargo(fds)?)
        };
        let token = st.take_token();
        let mut entry = if nblocks > 0 {
            let mut m = match self.core.meta.alloc_segment(nblocks * BLOCK_BYTES) {
                Ok(m) => m,
                Err(e) => {
                    st.untake_token(token);
                    return Err(e);
                }
            };
            let span = m.lot_span().expect("meta fbufs live in our lot");
            let at = RawRef {
                slot: span.lot.slot,
                pad: 0,
                generation: span.lot.generation,
                offset: span.offset,
            };
            let bytes = m.as_mut_slice().expect("fresh fbufs are writable");
            let e = desc::encode(token.word(), frags, bytes, at);
            m.freeze();
            meta = Some(m);
            e
        } else {
            desc::encode(token.word(), frags, &mut [], RawRef::NONE)
        };
        let cargo = cargo.map(|(kept, at)| {
            entry.nfds = fds.len() as u16;
            entry.cargo = at;
            kept
        });
        let pos = st.fwd.position();
        let mut evicted = None;
        let pushed = loop {
            // Unfenced: the wake-up check's fence comes after the message is on record.
            match st.fwd.try_push_unfenced(entry).map_err(corrupt)? {
                Push::Full(_) if c.lossy && evicted.is_none() => {
                    // A receiver that died stops taking messages: without this probe (a
                    // system call at most every 10 ms while the ring stays full) a lossy
                    // sender would evict its messages for ever.
                    c.check_peer(&mut st, false)?;
                    if let Some(old) = st.fwd.evict_oldest().map_err(corrupt)? {
                        evicted = Some(c.take_evicted(&mut st, old));
                    }
                }
                other => break other,
            }
        };
        match pushed {
            Push::Full(_) => {
                st.untake_token(token);
                c.drain(&mut st)?;
                c.check_peer(&mut st, true)?;
                Err(Error::Full)
            }
            Push::Done { .. } => {
                if how.collects() {
                    st.rev.touch();
                }
                let sent = Sent {
                    token,
                    pos,
                    data: data.clone(),
                    meta,
                    fds: cargo,
                    evicted,
                };
                Ok(self.finish_send(st, sent, how))
            }
        }
    }

    /// What follows a push, once the descriptor is out (from here on locked
    /// instructions cost the receiver nothing): the message goes on record under its
    /// token, the receiver is woken if it sleeps (unless the send is unfenced, see
    /// [`wake_after_unfenced`](Self::wake_after_unfenced)), releases are drained every
    /// [`DRAIN_EVERY`] sends (or now, if asked), and the counters move. Returns whether a message was
    /// evicted to make room.
    pub(super) fn finish_send(
        &self,
        mut st: std::sync::MutexGuard<'_, SendState>,
        sent: Sent,
        how: Fence,
    ) -> bool {
        let c = &*self.core;
        let len = sent.data.len() as u64;
        st.inflight[sent.token.idx as usize] = InFlight {
            generation: sent.token.generation,
            pos: sent.pos,
            data: Some((sent.data, sent.meta, sent.fds)),
            claimed: false,
            early: false,
        };
        st.out += 1;
        if c.lossy {
            // Only eviction looks a message up by its position.
            let slots = st.by_pos.len() as u64;
            st.by_pos[(sent.pos % slots) as usize] = sent.token.idx;
        }
        // Dekker, as in `Producer::try_push`: publication, fence, then the consumer's
        // `sleeping` flag (unfenced sends leave both to `wake_after_unfenced`).
        let wake = matches!(how, Fence::Fenced) && {
            crate::sync::fence(crate::sync::Ordering::SeqCst);
            c.link.fwd_ctl().take_sleeper()
        };
        // Releases are collected after the descriptor is out, not before: the reverse
        // ring's lines are the receiver's, and reading one can cost a transfer between
        // cores that the hand-over need not wait for. And only every `DRAIN_EVERY` sends
        // (so the token list outgrows what is really out by at most that many). A broken
        // reverse ring is reported by the next send (this one went out).
        st.undrained += 1;
        if (st.undrained >= DRAIN_EVERY || how.collects()) && c.drain(&mut st).is_err() {
            st.rev_corrupt = true;
        }
        // Under the state lock: the only writer.
        Counters::bump(&c.stats.messages, 1);
        Counters::bump(&c.stats.bytes, len);
        c.publish(&st);
        drop(st);
        // The evicted message's fbufs go back here, outside the lock.
        let lost = sent.evicted.is_some();
        drop(sent.evicted);
        if wake {
            c.wake();
        }
        lost
    }

    /// Duplicates `fds` for a message and writes their numbers into a table in our lot:
    /// what the message keeps, and the table's offset for the ring entry.
    fn cargo(&self, fds: &[BorrowedFd<'_>]) -> Result<(Box<SentFds>, u64)> {
        let copies = fds
            .iter()
            .map(|f| crate::sys::fd::dup(*f))
            .collect::<std::io::Result<Vec<OwnedFd>>>()?;
        let mut table = self.core.meta.alloc_segment(4 * copies.len())?;
        let at = table.lot_span().expect("meta fbufs live in our lot").offset;
        let bytes = table.as_mut_slice().expect("fresh fbufs are writable");
        for (b, f) in bytes.chunks_exact_mut(4).zip(&copies) {
            b.copy_from_slice(&f.as_raw_fd().to_le_bytes());
        }
        table.freeze();
        Ok((
            Box::new(SentFds {
                _table: table,
                _fds: copies,
            }),
            at,
        ))
    }

    /// Copies fragments that are not in any lot into one fbuf (the fallback path).
    pub(super) fn shareable(&self, data: &IoData) -> Result<IoData> {
        let (data, copied) = data.in_lots(&self.core.meta)?;
        Counters::add(&self.core.stats.copied, copied as u64);
        Ok(data)
    }

    /// Sends `data`, waiting while the ring is full. The receiver wakes this sender when
    /// the ring drains to half.
    pub fn send(&self, data: &IoData) -> Result<()> {
        self.send_until(data, &[], None)
    }

    /// Like [`send`](Self::send), giving up with [`Error::Timeout`] after `timeout`.
    pub fn send_timeout(&self, data: &IoData, timeout: Duration) -> Result<()> {
        self.send_until(data, &[], Some(Instant::now() + timeout))
    }

    /// Like [`send`](Self::send), with `fds` as cargo: the receiver gets its own
    /// duplicates of them (see [`Receiver::recv_with_fds`](super::Receiver::recv_with_fds)
    /// and [`Fds`](super::Fds)). The caller keeps its descriptors; this sender keeps
    /// duplicates until the receiver releases the message (or dies, or closes its end).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-send-fds-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let (r, w) = std::io::pipe()?;
    /// let path = a.path(ferry::PathConfig::default())?;
    /// tx.send_with_fds(&path.alloc(16)?.freeze(), &[r.as_fd(), w.as_fd()])?;
    /// let (_, fds) = rx.recv_with_fds()?;
    /// assert_eq!(fds.len(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`send`](Self::send); [`Error::TooManyFds`] past [`MAX_FDS`](crate::MAX_FDS).
    pub fn send_with_fds(&self, data: &IoData, fds: &[BorrowedFd<'_>]) -> Result<()> {
        self.send_until(data, fds, None)
    }

    /// Like [`send_with_fds`](Self::send_with_fds), never blocking, as
    /// [`try_send`](Self::try_send).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-try-send-fds-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let (r, _w) = std::io::pipe()?;
    /// let path = a.path(ferry::PathConfig::default())?;
    /// let too_many = vec![r.as_fd(); ferry::MAX_FDS + 1];
    /// assert!(matches!(
    ///     tx.try_send_with_fds(&path.alloc(1)?.freeze(), &too_many),
    ///     Err(ferry::Error::TooManyFds { .. })
    /// ));
    /// tx.try_send_with_fds(&path.alloc(1)?.freeze(), &[r.as_fd()])?;
    /// # drop(rx);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`try_send`](Self::try_send); [`Error::TooManyFds`].
    pub fn try_send_with_fds(&self, data: &IoData, fds: &[BorrowedFd<'_>]) -> Result<()> {
        self.send_now(data, fds, Fence::Fenced).map(drop)
    }

    /// Like [`send_with_fds`](Self::send_with_fds), waiting for room until `deadline`
    /// (`None`: for as long as it takes), then [`Error::Timeout`]. For callers that hold
    /// an optional limit, such as the C and Python bindings.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use std::os::fd::AsFd;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-send-fds-until-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let (r, _w) = std::io::pipe()?;
    /// let path = a.path(ferry::PathConfig::default())?;
    /// let deadline = Some(Instant::now() + Duration::from_secs(1));
    /// tx.send_with_fds_until(&path.alloc(1)?.freeze(), &[r.as_fd()], deadline)?;
    /// assert_eq!(rx.recv_with_fds()?.1.len(), 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`send_with_fds`](Self::send_with_fds); [`Error::Timeout`].
    pub fn send_with_fds_until(
        &self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.send_until(data, fds, deadline)
    }

    /// Sends, with `fds` as cargo, waiting for room until `deadline` (`None`: for ever).
    pub(crate) fn send_until(
        &self,
        data: &IoData,
        fds: &[BorrowedFd<'_>],
        deadline: Option<Instant>,
    ) -> Result<()> {
        loop {
            match self.send_now(data, fds, Fence::Fenced).map(drop) {
                Err(Error::Full) => self.wait_for_room(deadline)?,
                other => return other,
            }
        }
    }

    /// After a send found the ring full: sleeps until the receiver makes room (or may
    /// have: the caller tries again), the receiver dies ([`Error::PeerGone`]) or
    /// `deadline` passes ([`Error::Timeout`]).
    fn wait_for_room(&self, deadline: Option<Instant>) -> Result<()> {
        let left = match deadline {
            Some(d) => Some(
                d.checked_duration_since(Instant::now())
                    .ok_or(Error::Timeout)?,
            ),
            None => None,
        };
        if self.begin_room_wait()? {
            let woke = wait_readable(&self.room_fds(), left);
            self.end_room_wait();
            if woke? == Some(1) {
                return Err(self.peer_died());
            }
        }
        Ok(())
    }

    /// Prepares to wait for room in a full ring: true once registered as a sleeper (the
    /// receiver notifies the first of [`room_fds`](Self::room_fds) when the ring
    /// drains to half; call [`end_room_wait`](Self::end_room_wait) after the wait),
    /// false if room appeared (try again instead of waiting).
    pub(crate) fn begin_room_wait(&self) -> Result<bool> {
        let c = &*self.core;
        let mut st = c.lock();
        let sleep = st.fwd.prepare_wait().map_err(corrupt)?;
        if !sleep && st.tx_sleepers > 0 {
            // Finding room cleared the ring's flag under another sleeper, whose
            // wake-up may not come now: wake it to look again.
            c.link.tx_efd.notify();
        }
        st.tx_sleepers += sleep as u32;
        if sleep {
            Counters::add(&c.stats.sleeps, 1);
        }
        Ok(sleep)
    }

    /// Ends a wait that [`begin_room_wait`](Self::begin_room_wait) began.
    pub(crate) fn end_room_wait(&self) {
        let c = &*self.core;
        // As in `ReleaseSource::disarm`: the last sleeper clears and drains.
        let mut st = c.lock();
        st.tx_sleepers -= 1;
        if st.tx_sleepers == 0 {
            st.fwd.cancel_wait();
            c.link.tx_efd.drain();
        }
    }

    /// What a wait for room sleeps on: the eventfd the receiver notifies, and the
    /// receiver's pidfd (readable once it died).
    pub(crate) fn room_fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.core.link.tx_efd.as_fd(), self.core.link.pidfd.as_fd()]
    }

    /// The receiver died: reclaims everything it held; the error to report.
    pub(crate) fn peer_died(&self) -> Error {
        let c = &*self.core;
        c.reclaim_all(&mut c.lock());
        Error::PeerGone {
            pid: c.link.peer_pid,
        }
    }

    /// Drains pending releases now (sending and allocating do this too).
    pub fn collect_releases(&self) -> Result<()> {
        let mut st = self.core.lock();
        self.core.drain(&mut st).map(|_| ())
    }

    /// Messages sent and not yet released by the receiver.
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// Checks now, with one `poll(2)`, whether the receiver still lives; if it died,
    /// reclaims everything it held and returns [`Error::PeerGone`].
    ///
    /// # Errors
    /// [`Error::PeerGone`] if it died, [`Error::Disconnected`] if it closed its end.
    pub fn check_peer(&self) -> Result<()> {
        let mut st = self.core.lock();
        self.core.check_peer(&mut st, true)?;
        if self.core.link.header().rx_closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Disconnected);
        }
        Ok(())
    }

    /// True once the receiver closed its end (read from the channel's memory: no
    /// system call). A receiver that died is found by [`check_peer`](Self::check_peer).
    pub fn is_closed(&self) -> bool {
        self.core.link.header().rx_closed.load(Ordering::Acquire) != 0
    }

    /// Pushes a raw descriptor, bypassing every check: `testing::push_raw`.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn push_raw(&self, d: RawDesc) -> Result<()> {
        let mut st = self.core.lock();
        match st.fwd.try_push(d).map_err(corrupt)? {
            Push::Full(_) => Err(Error::Full),
            Push::Done { wake } => {
                if wake {
                    self.core.link.rx_efd.notify();
                }
                Ok(())
            }
        }
    }

    /// The receiving domain.
    pub fn peer(&self) -> DomainId {
        self.core.peer
    }

    /// Process id of the receiver.
    pub fn peer_pid(&self) -> u32 {
        self.core.link.peer_pid
    }

    /// This sender's counters.
    pub fn stats(&self) -> ChannelStats {
        self.core.stats.snapshot()
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let c = &self.core;
        c.link.header().tx_closed.store(1, Ordering::Release);
        c.link.rx_efd.notify();
        if c.collect() {
            // The receiver still holds some of our fbufs: keep the channel until it lets go.
            if let Some(d) = c.domain.upgrade() {
                d.park(self.core.clone());
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::channel::Receiver;
    use crate::region::{Group, PathConfig};

    /// A message pushed after the receiver closed and released what was in its ring
    /// (the sender's check of `rx_closed` raced with the close) comes back to the sender
    /// by itself: it compares its ring positions with the receiver's head.
    #[test]
    fn messages_pushed_after_the_receiver_drained_come_back() {
        let g = Group::open(&format!("unit-stranded-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let (a2, bid) = (a.clone(), b.id());
        let t = std::thread::spawn(move || a2.connect(bid, Duration::from_secs(5)).unwrap());
        let mut rx = b.accept(Duration::from_secs(5)).unwrap();
        let tx = t.join().unwrap();
        let path = a.path(PathConfig::default()).unwrap();
        for _ in 0..3 {
            tx.send(&path.alloc(100).unwrap().freeze()).unwrap();
        }
        let taken = rx.recv().unwrap();
        // As if the receiver had drained and closed before the last two were pushed.
        tx.core
            .link
            .header()
            .rx_closed
            .store(layout::RX_DRAINED, Ordering::Release);
        tx.collect_releases().unwrap();
        assert_eq!(tx.in_flight(), 1, "the message it took is still out");
        drop(taken);
        tx.collect_releases().unwrap();
        assert_eq!(tx.in_flight(), 0);
        assert_eq!(path.outstanding(), 0);
        // Its drop releases the two again (they are still in its ring): the sender
        // counts those as bad releases and changes nothing else.
        drop(rx);
        tx.collect_releases().unwrap();
        assert_eq!(tx.stats().bad_from_peer, 2);
        assert_eq!(tx.in_flight(), 0);
    }

    /// A sender and its receiver between two domains of a new group.
    fn pair(name: &str) -> (Arc<Group>, Arc<Sender>, Receiver, PathAllocator) {
        let g = Group::open(&format!("unit-{name}-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let (a2, bid) = (a.clone(), b.id());
        let t = std::thread::spawn(move || a2.connect(bid, Duration::from_secs(5)).unwrap());
        let rx = b.accept(Duration::from_secs(5)).unwrap();
        let tx = Arc::new(t.join().unwrap());
        let path = a.path(PathConfig::default()).unwrap();
        (g, tx, rx, path)
    }

    /// A claimed message that the receiver takes and releases before the sender records
    /// it (another thread of the sender's domain drained the release in between) is let
    /// go when recorded: nothing stays in flight, no release counts as bad.
    #[test]
    fn a_claimed_message_released_before_its_record_is_let_go() {
        let (_g, tx, mut rx, path) = pair("claim-early");
        let m = path.alloc(100).unwrap();
        let cl = tx.claim(&m).expect("an open channel with room");
        let data = m.freeze();
        cl.publish();
        // The descriptor, written at the publication, names the message.
        assert_eq!(rx.try_recv().unwrap().expect("published").len(), 100);
        tx.collect_releases().unwrap();
        cl.record(&tx, &data).unwrap();
        drop(data);
        assert_eq!(tx.stats().bad_from_peer, 0);
        assert_eq!(tx.in_flight(), 0);
        assert_eq!(path.outstanding(), 0);
        // The token and the ring go on as usual.
        tx.send(&path.alloc(7).unwrap().freeze()).unwrap();
        assert_eq!(rx.try_recv().unwrap().expect("sent").len(), 7);
    }

    /// A claim given back leaves the ring as it was: the next message takes its place
    /// and the receiver gets it, and nothing is in flight for the claim.
    #[test]
    fn an_unclaimed_place_is_taken_by_the_next_message() {
        let (_g, tx, mut rx, path) = pair("unclaim");
        let m = path.alloc(100).unwrap();
        let cl = tx.claim(&m).expect("an open channel with room");
        assert!(
            rx.try_recv().unwrap().is_none(),
            "a claim publishes nothing"
        );
        cl.unclaim(&tx);
        drop(m);
        tx.send(&path.alloc(5).unwrap().freeze()).unwrap();
        let got = rx.try_recv().unwrap().expect("sent");
        assert_eq!(got.len(), 5);
        assert_eq!(tx.in_flight(), 1);
        drop(got);
        assert_eq!(tx.in_flight(), 0);
        assert_eq!(tx.stats().bad_from_peer, 0);
    }
}
