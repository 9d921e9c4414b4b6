//! The two ends of a channel, and how they meet.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::desc::{self, Lots, RawDesc, RawFrag, RawRef, BLOCK_BYTES};
use super::layout::{self, ChanHeader, Parts};
use super::ring::{self, Consumer, Corrupt, Producer, Push};
use crate::error::{BadDescriptor, Error, Result};
use crate::iodata::{Fragment, IoData};
use crate::region::domain::{DomainInner, LotRef, PendingReleases, ReleaseSource, SETTLE_PERIOD};
use crate::region::group::{
    DomainId, OFFER_FREE, OFFER_OPEN, OFFER_TAKEN, OFFER_WRITING, SLOT_LIVE,
};
use crate::region::{PathAllocator, PathConfig};
use crate::segment::{Keep, LotId, LotSpan, Segment};
use crate::sys::fd::{dup_from, exited, memfd, wait_readable, EventFd};
use crate::sys::futex;
use crate::sys::mem::{Access, Mapping};

/// How often an idle busy-polling endpoint checks, with one `poll(2)`, that its peer
/// still lives.
const LIVENESS_PERIOD: Duration = Duration::from_millis(10);

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
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            capacity: 256,
            release_capacity: 1024,
        }
    }
}

/// Counters of one endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Messages sent or received.
    pub messages: u64,
    /// Payload bytes described (not copied).
    pub bytes: u64,
    /// Bytes copied because a fragment was not in a shared lot (the plain fallback).
    pub copied_bytes: u64,
    /// Wake-ups this endpoint sent to its peer (eventfd writes).
    pub wakeups: u64,
    /// Times this endpoint blocked.
    pub sleeps: u64,
    /// Releases sent (receiver) or collected (sender).
    pub releases: u64,
    /// Descriptors or releases from the peer that failed validation.
    pub bad_from_peer: u64,
}

#[derive(Default)]
struct Counters {
    messages: AtomicU64,
    bytes: AtomicU64,
    copied: AtomicU64,
    wakeups: AtomicU64,
    sleeps: AtomicU64,
    releases: AtomicU64,
    bad: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ChannelStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChannelStats {
            messages: l(&self.messages),
            bytes: l(&self.bytes),
            copied_bytes: l(&self.copied),
            wakeups: l(&self.wakeups),
            sleeps: l(&self.sleeps),
            releases: l(&self.releases),
            bad_from_peer: l(&self.bad),
        }
    }
    fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
}

/// What both ends share: the mapping, the wake-up fds and the peer's pidfd.
struct Link {
    // Keeps `parts` valid.
    _map: Mapping,
    parts: Parts,
    /// The receiver sleeps on this one.
    rx_efd: EventFd,
    /// The sender sleeps on this one for room in the forward ring.
    tx_efd: EventFd,
    /// The sender's domain sleeps on this one for releases (see `arm_sources`).
    rel_efd: EventFd,
    peer_pid: u32,
    pidfd: OwnedFd,
    _chan_fd: OwnedFd,
}

// SAFETY: `parts` points into `map`, which the Link owns; the memory is shared memory
// accessed through atomics and the ring protocol.
unsafe impl Send for Link {}
// SAFETY: as above.
unsafe impl Sync for Link {}

impl Link {
    /// Overflow slot `i` (`i < OVERFLOW_SLOTS`).
    fn overflow(&self, i: usize) -> &AtomicU64 {
        assert!(i < layout::OVERFLOW_SLOTS);
        // SAFETY: the overflow area holds OVERFLOW_SLOTS words inside `map`, which lives
        // as long as `self`; both ends use it only through atomics.
        unsafe { &*self.parts.overflow.as_ptr().add(i) }
    }

    fn header(&self) -> &ChanHeader {
        // SAFETY: `parts.header` points into `map`, which lives as long as `self`; the
        // header's shared fields are atomics.
        unsafe { self.parts.header.as_ref() }
    }

    fn peer_exited(&self) -> bool {
        exited(self.pidfd.as_fd())
    }
}

fn corrupt(_: Corrupt) -> Error {
    Error::BadDescriptor(BadDescriptor::Malformed("ring index out of range"))
}

/// Fragments a dead peer held that no domain of this process could quarantine.
static ORPHANS: Mutex<Vec<Fragment>> = Mutex::new(Vec::new());

struct InFlight {
    generation: u32,
    /// Its position in the forward ring, to tell whether the receiver took it.
    pos: u64,
    data: Option<(IoData, Option<Segment>)>,
}

struct SendState {
    fwd: Producer<RawDesc>,
    rev: Consumer<u64>,
    /// Threads asleep waiting for releases (`ReleaseSource::arm`) and for room in the
    /// forward ring (`send`). Several threads of a domain may sleep on one sender (a
    /// stage's main thread and another receiving thread both arm it): the last one to
    /// wake clears the ring's flag and drains the eventfd, so that no sleeper loses the
    /// wake-up another consumed.
    rel_sleepers: u32,
    tx_sleepers: u32,
    inflight: Vec<InFlight>,
    free_tokens: Vec<u32>,
    last_check: Instant,
}

struct SendCore {
    link: Link,
    /// Weak: a closed sender parked in its domain must not keep the domain alive.
    domain: std::sync::Weak<DomainInner>,
    peer: DomainId,
    meta: PathAllocator,
    state: Mutex<SendState>,
    gone: AtomicBool,
    stats: Counters,
}

impl SendCore {
    fn lock(&self) -> std::sync::MutexGuard<'_, SendState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drains the reverse ring; returns fbufs of released messages.
    fn drain(&self, st: &mut SendState) -> Result<u64> {
        let mut n = 0;
        let mut done = Vec::new();
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
        let mut spilled = spilled.into_iter();
        loop {
            let token = match spilled.next() {
                Some(t) => t,
                None => match st.rev.try_pop().map_err(corrupt)? {
                    Some((t, w)) => {
                        wake |= w;
                        t
                    }
                    None => break,
                },
            };
            let idx = (token & 0xffff_ffff) as usize;
            let generation = (token >> 32) as u32;
            match st.inflight.get_mut(idx) {
                Some(f) if f.generation == generation && f.data.is_some() => {
                    done.push(f.data.take());
                    st.free_tokens.push(idx as u32);
                    n += 1;
                }
                _ => Counters::add(&self.stats.bad, 1),
            }
        }
        // The receiver closed its end and released what it left in the ring; messages
        // pushed after that (our check of `rx_closed` raced with its close) will never be
        // taken: they come back here.
        if self.link.header().rx_closed.load(Ordering::Acquire) == layout::RX_DRAINED {
            let head = st.fwd.consumed().map_err(corrupt)?;
            for (i, f) in st.inflight.iter_mut().enumerate() {
                if f.data.is_some() && f.pos >= head {
                    done.push(f.data.take());
                    st.free_tokens.push(i as u32);
                    n += 1;
                }
            }
        }
        Counters::add(&self.stats.releases, n);
        if wake {
            // The receiver has releases that did not fit and sleeps until there is room.
            Counters::add(&self.stats.wakeups, 1);
            self.link.rx_efd.notify();
        }
        drop(done);
        Ok(n)
    }

    /// The receiver died: what it held comes back once no live domain holds it. It may
    /// have forwarded some of it, so the fragments go to the domain's quarantine, which
    /// lets each go when the group's ledgers show nobody holding it (at once, usually).
    /// The continuation blocks only the dead receiver read go at once.
    fn reclaim_all(&self, st: &mut SendState) {
        self.gone.store(true, Ordering::Release);
        let all: Vec<_> = st
            .inflight
            .iter_mut()
            .filter_map(|f| f.data.take())
            .collect();
        st.free_tokens = (0..st.inflight.len() as u32).collect();
        let domain = self.domain.upgrade();
        let mut frags = Vec::new();
        for (data, meta) in all {
            drop(meta);
            frags.extend(data.fragments().iter().cloned());
        }
        match &domain {
            Some(d) => d.quarantine(self.peer, frags),
            // This process dropped its domain and so cannot read the ledgers any more.
            // Releasing could let an owner reuse spans a domain downstream of the dead
            // peer still reads: keep them until this process exits instead.
            None => ORPHANS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(frags),
        }
        if let Some(d) = domain {
            d.forget_dead_peers();
        }
    }

    fn check_peer(&self, st: &mut SendState, force: bool) -> Result<()> {
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

    fn in_flight(&self) -> usize {
        self.lock()
            .inflight
            .iter()
            .filter(|f| f.data.is_some())
            .count()
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

/// The sending end of a channel.
pub struct Sender {
    core: Arc<SendCore>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("peer", &self.core.peer)
            .finish()
    }
}

impl Sender {
    /// Sends `data` if the ring has room, never blocking. The receiver gets an `IoData`
    /// over the same memory; fragments not in a shared lot are copied into an fbuf first
    /// (counted in [`ChannelStats::copied_bytes`]).
    ///
    /// # Errors
    /// [`Error::Full`] if the ring is full, [`Error::PeerGone`] if the receiver died,
    /// [`Error::Disconnected`] if it closed its end.
    pub fn try_send(&self, data: &IoData) -> Result<()> {
        let c = &*self.core;
        let mut st = c.lock();
        // No liveness probe here: that would be a system call per message. A dead
        // receiver stops consuming, the ring fills, and the probe below (or the blocking
        // wait in `send`, or an allocator collecting releases) notices.
        if c.gone.load(Ordering::Acquire) {
            return Err(Error::PeerGone {
                pid: c.link.peer_pid,
            });
        }
        if c.link.header().rx_closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Disconnected);
        }
        c.drain(&mut st)?;
        // Make sure every fragment lies in a lot the receiver can map.
        let data = self.shareable(data)?;
        let frags: Vec<RawFrag> = data
            .fragments()
            .iter()
            .map(|f| {
                let s = f
                    .lot_span()
                    .expect("shareable() put every fragment in a lot");
                RawFrag {
                    slot: s.lot.slot,
                    pad: 0,
                    generation: s.lot.generation,
                    offset: s.offset,
                    len: f.len() as u64,
                }
            })
            .collect();
        if frags.len() as u64 > desc::MAX_FRAGS {
            return Err(Error::InvalidArgument("too many fragments for one message"));
        }
        for f in data.fragments() {
            f.segment().on_send()?;
        }
        let nblocks = desc::blocks_needed(frags.len());
        let mut meta = None;
        let (idx, generation) = match st.free_tokens.pop() {
            Some(i) => (i, st.inflight[i as usize].generation.wrapping_add(1)),
            None => {
                st.inflight.push(InFlight {
                    generation: 0,
                    pos: 0,
                    data: None,
                });
                (st.inflight.len() as u32 - 1, 0)
            }
        };
        let token = (generation as u64) << 32 | idx as u64;
        let entry = if nblocks > 0 {
            let mut m = self.core.meta.alloc_segment(nblocks * BLOCK_BYTES)?;
            let span = m.lot_span().expect("meta fbufs live in our lot");
            let at = RawRef {
                slot: span.lot.slot,
                pad: 0,
                generation: span.lot.generation,
                offset: span.offset,
            };
            let bytes = m.as_mut_slice().expect("fresh fbufs are writable");
            let e = desc::encode(token, &frags, bytes, at);
            m.freeze();
            meta = Some(m);
            e
        } else {
            desc::encode(token, &frags, &mut [], RawRef::NONE)
        };
        let pos = st.fwd.position();
        match st.fwd.try_push(entry).map_err(corrupt)? {
            Push::Full(_) => {
                st.free_tokens.push(idx);
                c.check_peer(&mut st, true)?;
                Err(Error::Full)
            }
            Push::Done { wake } => {
                st.inflight[idx as usize] = InFlight {
                    generation,
                    pos,
                    data: Some((data.clone(), meta)),
                };
                drop(st);
                Counters::add(&c.stats.messages, 1);
                Counters::add(&c.stats.bytes, data.len() as u64);
                if wake {
                    Counters::add(&c.stats.wakeups, 1);
                    c.link.rx_efd.notify();
                }
                Ok(())
            }
        }
    }

    /// Copies fragments that are not in any lot into one fbuf (the fallback path).
    fn shareable(&self, data: &IoData) -> Result<IoData> {
        if data.fragments().iter().all(|f| f.lot_span().is_some()) {
            return Ok(data.clone());
        }
        let mut out = IoData::new();
        for f in data.fragments() {
            if f.lot_span().is_some() {
                out.append(IoData::from_fragments([f.clone()]));
            } else {
                let mut m = self.core.meta.alloc(f.len())?;
                m.write_at(0, f.as_slice());
                Counters::add(&self.core.stats.copied, f.len() as u64);
                out.append(m.freeze());
            }
        }
        Ok(out)
    }

    /// Sends `data`, waiting while the ring is full. The receiver wakes this sender when
    /// the ring drains to half.
    pub fn send(&self, data: &IoData) -> Result<()> {
        self.send_timeout(data, None)
    }

    /// Like [`send`](Self::send), giving up with [`Error::Timeout`] after `timeout`.
    pub fn send_timeout(&self, data: &IoData, timeout: Option<Duration>) -> Result<()> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.try_send(data) {
                Err(Error::Full) => {}
                other => return other,
            }
            let left = match deadline {
                Some(d) => Some(
                    d.checked_duration_since(Instant::now())
                        .ok_or(Error::Timeout)?,
                ),
                None => None,
            };
            let c = &*self.core;
            let sleep = {
                let mut st = c.lock();
                let sleep = st.fwd.prepare_wait().map_err(corrupt)?;
                if !sleep && st.tx_sleepers > 0 {
                    // Finding room cleared the ring's flag under another sleeper, whose
                    // wake-up may not come now: wake it to look again.
                    c.link.tx_efd.notify();
                }
                st.tx_sleepers += sleep as u32;
                sleep
            };
            if sleep {
                Counters::add(&c.stats.sleeps, 1);
                let fds = [c.link.tx_efd.as_fd(), c.link.pidfd.as_fd()];
                let woke = wait_readable(&fds, left);
                {
                    // As in `ReleaseSource::disarm`: the last sleeper clears and drains.
                    let mut st = c.lock();
                    st.tx_sleepers -= 1;
                    if st.tx_sleepers == 0 {
                        st.fwd.cancel_wait();
                        c.link.tx_efd.drain();
                    }
                }
                if woke? == Some(1) {
                    let mut st = c.lock();
                    c.reclaim_all(&mut st);
                    return Err(Error::PeerGone {
                        pid: c.link.peer_pid,
                    });
                }
            }
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

    /// Pushes a raw descriptor, bypassing every check: for tests of how receivers treat
    /// a faulty or hostile sender. Not part of the supported API.
    #[doc(hidden)]
    pub fn __push_raw(&self, d: RawDesc) -> Result<()> {
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

    /// This endpoint's counters.
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

/// Keeps a received message's memory mapped, and releases it to the sender on drop.
struct Hold {
    token: u64,
    /// The lot of the first fragment, and any others the message spans.
    _lot: LotRef,
    _more_lots: Vec<LotRef>,
    /// Ledger entries of the forwarded fragments (those not in the sender's lot).
    ledger: Vec<u32>,
    /// Last: dropped after the lots, so that if this was the channel's last message,
    /// `RecvCore::drop` finds them unused and unmaps those of dead peers.
    core: Arc<RecvCore>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Unrecord first: once released, the sender may let the owner reuse the span.
        if !self.ledger.is_empty() {
            self.core.domain.unhold(&self.ledger);
        }
        self.core.release(self.token);
    }
}

impl Keep for Hold {}

/// A fragment mapped for this one transfer (the uncached baseline); unmapped on drop,
/// before the hold releases the fbuf.
struct MappedKeep {
    _map: Mapping,
    _hold: Arc<Hold>,
}
impl Keep for MappedKeep {}

struct RelState {
    rev: Producer<u64>,
    pending: Vec<u64>,
}

struct RecvCore {
    link: Link,
    domain: Arc<DomainInner>,
    /// The sending domain: fragments in its lot are its own; others were forwarded.
    sender: DomainId,
    /// Our ledger entry for this channel, until the sender can send no more and the ring
    /// is empty (see `region::ledger`).
    inbound: Mutex<Option<u32>>,
    rel: Mutex<RelState>,
    /// True while `rel.pending` holds releases the reverse ring had no room for.
    has_pending: AtomicBool,
    stats: Counters,
    /// The sender's lot, mapped when the channel is accepted: messages stay readable
    /// even if the sender exits before we receive them.
    sender_lot: Option<LotRef>,
}

impl Drop for RecvCore {
    fn drop(&mut self) {
        self.end_inbound();
        drop(self.sender_lot.take());
        // Nothing received on this channel is alive any more: unmap lots of dead peers.
        self.domain.forget_dead_peers();
    }
}

impl RecvCore {
    fn release(&self, token: u64) {
        let mut r = self.rel.lock().unwrap_or_else(|p| p.into_inner());
        r.pending.push(token);
        Self::flush(&mut r, &self.stats, &self.link);
        self.has_pending
            .store(!r.pending.is_empty(), Ordering::Release);
    }

    /// Sends releases that did not fit before, if any (one atomic load if none).
    fn flush_pending(&self) {
        if !self.has_pending.load(Ordering::Acquire) {
            return;
        }
        let mut r = self.rel.lock().unwrap_or_else(|p| p.into_inner());
        Self::flush(&mut r, &self.stats, &self.link);
        self.has_pending
            .store(!r.pending.is_empty(), Ordering::Release);
    }

    /// Prepares to sleep with releases still pending: `Some(true)` once the sender will
    /// wake us (through `rx_efd`) when it makes room, `Some(false)` if room appeared
    /// (flush instead of sleeping), `None` if nothing is pending.
    fn wait_for_room(&self) -> Option<bool> {
        if !self.has_pending.load(Ordering::Acquire) {
            return None;
        }
        let mut r = self.rel.lock().unwrap_or_else(|p| p.into_inner());
        Self::flush(&mut r, &self.stats, &self.link);
        self.has_pending
            .store(!r.pending.is_empty(), Ordering::Release);
        if r.pending.is_empty() {
            return None;
        }
        // A ring the sender broke (Corrupt) will never have room: sleep without a wake-up.
        Some(r.rev.prepare_wait().unwrap_or(true))
    }

    fn cancel_wait_for_room(&self) {
        self.rel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rev
            .cancel_wait();
    }

    /// The sender can send no more and the ring is empty: drop our ledger entry.
    fn end_inbound(&self) {
        if let Some(i) = self
            .inbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            self.domain.remove_inbound(i);
        }
    }

    /// Sends pending releases: through the reverse ring while it has room, then into
    /// the overflow area (the sender collects those itself). What fits neither (a token
    /// index beyond the area, or a ring the sender broke) stays pending.
    fn flush(r: &mut RelState, stats: &Counters, link: &Link) {
        let mut sent = 0;
        let mut spilled = false;
        let mut i = 0;
        while i < r.pending.len() {
            let t = r.pending[i];
            match r.rev.try_push(t) {
                Ok(Push::Done { wake }) => {
                    sent += 1;
                    r.pending.swap_remove(i);
                    if wake {
                        Counters::add(&stats.wakeups, 1);
                        link.rel_efd.notify();
                    }
                }
                Ok(Push::Full(_)) if ((t & 0xffff_ffff) as usize) < layout::OVERFLOW_SLOTS => {
                    link.overflow((t & 0xffff_ffff) as usize)
                        .store(t.wrapping_add(1), Ordering::Relaxed);
                    // SYNC: Release: the slot written above is visible to a sender that
                    // sees the count (its swap is AcqRel).
                    link.header().overflow.fetch_add(1, Ordering::Release);
                    sent += 1;
                    spilled = true;
                    r.pending.swap_remove(i);
                }
                // Full beyond the overflow area: keep it for later. Corrupt: the sender
                // broke its ring; it will learn nothing more from us.
                _ => i += 1,
            }
        }
        if spilled {
            // The sender may be asleep waiting for releases: the ring being full means it
            // has some to drain, but it may have drained it just before we spilled.
            Counters::add(&stats.wakeups, 1);
            link.rel_efd.notify();
        }
        Counters::add(&stats.releases, sent);
    }
}

impl PendingReleases for RecvCore {
    fn flush(&self) {
        self.flush_pending();
    }
}

/// Resolves descriptor lots through the domain, remembering what it mapped.
struct DomainLots<'a> {
    domain: &'a DomainInner,
    /// The receiver's cache of lots it has resolved, kept across messages.
    seen: &'a mut Vec<((u16, u32), LotRef)>,
}

impl DomainLots<'_> {
    fn get(&mut self, slot: u16, generation: u32) -> Result<&LotRef, BadDescriptor> {
        let key = (slot, generation);
        let at = match self.seen.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                // A slot reused by a new domain: forget its old lot first, so the domain
                // can unmap it and map the new one at the same address.
                self.seen.retain(|(k, _)| k.0 != slot);
                let l = self
                    .domain
                    .resolve(LotId { slot, generation })
                    .map_err(|_| BadDescriptor::UnknownLot { slot, generation })?;
                self.seen.push((key, l));
                self.seen.len() - 1
            }
        };
        Ok(&self.seen[at].1)
    }
}

impl Lots for DomainLots<'_> {
    fn check(
        &mut self,
        slot: u16,
        generation: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), BadDescriptor> {
        let l = self.get(slot, generation)?;
        desc::check_span(l.len() as u64, slot, offset, len)
    }

    fn read(&mut self, slot: u16, generation: u32, offset: u64, out: &mut [u8]) {
        let base = self
            .seen
            .iter()
            .find(|(k, _)| *k == (slot, generation))
            .expect("read only after check")
            .1
            .base();
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: `check` verified `offset..offset+out.len()` lies inside the lot's
            // mapping, which `seen` keeps alive. The owner may write concurrently, so
            // read each byte volatile into our own buffer and validate that copy.
            *b = unsafe { base.add(offset as usize + i).read_volatile() };
        }
    }
}

/// The receiving end of a channel. Its [`AsFd`] is an eventfd that turns readable when
/// a message arrives for a receiver that [armed](Self::arm) it, so it works with epoll
/// and async runtimes.
pub struct Receiver {
    core: Arc<RecvCore>,
    fwd: Consumer<RawDesc>,
    last_check: Instant,
    map_per_transfer: bool,
    /// Lots resolved so far, so the data path takes no lock to find them. Cleared when
    /// the sender is found dead and on drop, so dead peers' lots can be unmapped.
    lots: Vec<((u16, u32), LotRef)>,
    /// Decoded fragments of the message being received (reused).
    frags: Vec<RawFrag>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("peer_pid", &self.core.link.peer_pid)
            .finish()
    }
}

impl Receiver {
    /// Takes the next message if one is ready, never blocking.
    ///
    /// Returns `Ok(None)` when the ring is empty. About every 10 ms of emptiness it also
    /// checks (one `poll(2)`) that the sender lives, and reports [`Error::PeerGone`] once
    /// the sender died and every message it sent has been received.
    ///
    /// # Errors
    /// [`Error::BadDescriptor`] if the sender wrote a descriptor that fails validation
    /// (the message is dropped and released), [`Error::PeerGone`], or
    /// [`Error::Disconnected`] when the sender closed its end and the ring is empty.
    pub fn try_recv(&mut self) -> Result<Option<IoData>> {
        // Releases that did not fit the reverse ring go out on every receive call.
        self.core.flush_pending();
        let Some((d, wake)) = self.fwd.try_pop().map_err(corrupt)? else {
            return self.idle(false).map(|_| None);
        };
        let c = &self.core;
        if wake {
            Counters::add(&c.stats.wakeups, 1);
            c.link.tx_efd.notify();
        }
        let mut lots = DomainLots {
            domain: &c.domain,
            seen: &mut self.lots,
        };
        if let Err(e) = desc::decode_into(&d, &mut lots, &mut self.frags) {
            Counters::add(&c.stats.bad, 1);
            c.release(d.token);
            return Err(e.into());
        }
        if self.frags.is_empty() {
            c.release(d.token);
            Counters::add(&c.stats.messages, 1);
            return Ok(Some(IoData::new()));
        }
        let lot_of = |f: &RawFrag| {
            self.lots
                .iter()
                .find(|(k, _)| *k == (f.slot, f.generation))
                .map(|(_, l)| l.clone())
                .expect("decode resolved every lot")
        };
        let first = lot_of(&self.frags[0]);
        let mut more: Vec<LotRef> = Vec::new();
        for f in &self.frags[1..] {
            let l = lot_of(f);
            if l.base() != first.base() && !more.iter().any(|m| m.base() == l.base()) {
                more.push(l);
            }
        }
        // Record forwarded fragments (not in the sender's own lot) in our ledger before
        // anyone can read them, so that no death upstream gets them reused under us. If
        // the ledger is full, copy the fragment instead (counted in `copied_bytes`).
        let sender = (c.sender.slot, c.sender.generation);
        let mut ledger: Vec<u32> = Vec::new();
        let mut copies: Vec<usize> = Vec::new();
        for (i, f) in self.frags.iter().enumerate() {
            if (f.slot, f.generation) == sender {
                continue;
            }
            let lot = LotId {
                slot: f.slot,
                generation: f.generation,
            };
            match c.domain.hold(lot, f.offset, f.len) {
                Some(e) => ledger.push(e),
                None => copies.push(i),
            }
        }
        let hold = Arc::new(Hold {
            core: c.clone(),
            token: d.token,
            _lot: first,
            _more_lots: more,
            ledger,
        });
        let mut total = 0;
        let mut fragments = Vec::with_capacity(self.frags.len());
        for (i, f) in self.frags.iter().enumerate() {
            let base = lot_of(f);
            total += f.len;
            if copies.contains(&i) {
                let mut v = vec![0u8; f.len as usize];
                for (j, b) in v.iter_mut().enumerate() {
                    // SAFETY: decode checked the span lies inside the lot, which `base`
                    // keeps mapped; another process may write it, so read each byte
                    // volatile into our own buffer.
                    *b = unsafe { base.base().add(f.offset as usize + j).read_volatile() };
                }
                Counters::add(&c.stats.copied, f.len);
                fragments.push(Fragment::whole(Arc::new(Segment::from_vec(v))));
                continue;
            }
            let span = LotSpan {
                lot: LotId {
                    slot: f.slot,
                    generation: f.generation,
                },
                offset: f.offset,
            };
            let (ptr, keep): (*mut u8, Arc<dyn Keep>) = if self.map_per_transfer {
                let page = crate::sys::page_size() as u64;
                let start = f.offset / page * page;
                let len = crate::sys::round_up_pages((f.offset + f.len - start) as usize)
                    .expect("inside the lot");
                let map = Mapping::shared_at(base.fd(), start, len, Access::Read)?;
                let ptr = map.as_ptr().wrapping_add((f.offset - start) as usize);
                (
                    ptr,
                    Arc::new(MappedKeep {
                        _map: map,
                        _hold: hold.clone(),
                    }),
                )
            } else {
                (base.base().wrapping_add(f.offset as usize), hold.clone())
            };
            let ptr = NonNull::new(ptr).expect("mappings are non-null");
            // SAFETY: decode checked the span lies inside the lot, which `keep` keeps
            // mapped (the whole lot, or the pages of this fragment); the memory is not
            // writable through this segment.
            let seg = unsafe { Segment::from_raw(ptr, f.len as usize, Some(span), false, keep) };
            fragments.push(Fragment::whole(Arc::new(seg)));
        }
        let data = IoData::from_fragments(fragments);
        Counters::add(&c.stats.messages, 1);
        Counters::add(&c.stats.bytes, total);
        Ok(Some(data))
    }

    /// The ring was empty: check liveness now and then (or now if `force`).
    fn idle(&mut self, force: bool) -> Result<()> {
        // Nothing to receive: pass on releases of what this domain forwarded.
        self.core.domain.collect_releases();
        let h = self.core.link.header();
        if h.tx_closed.load(Ordering::Acquire) != 0 && !self.fwd.has_data().map_err(corrupt)? {
            self.lots.clear();
            self.core.end_inbound();
            return Err(Error::Disconnected);
        }
        let now = Instant::now();
        if force || now.duration_since(self.last_check) >= LIVENESS_PERIOD {
            self.last_check = now;
            if self.core.link.peer_exited() && !self.fwd.has_data().map_err(corrupt)? {
                self.lots.clear();
                self.core.end_inbound();
                self.core.domain.forget_dead_peers();
                return Err(Error::PeerGone {
                    pid: self.core.link.peer_pid,
                });
            }
        }
        Ok(())
    }

    /// Maps every received fragment afresh and unmaps it on release, instead of reading
    /// through the cached mapping of the sender's lot. This is the "uncached" baseline of
    /// the fbuf paper: it costs an `mmap`, page faults and an `munmap` per transfer, and
    /// fragments then sit at a different address than in the sender.
    pub fn set_map_per_transfer(&mut self, on: bool) {
        self.map_per_transfer = on;
    }

    /// Receives the next message, blocking until one arrives.
    pub fn recv(&mut self) -> Result<IoData> {
        self.recv_timeout(None)?.ok_or(Error::Timeout)
    }

    /// Receives the next message, blocking at most `timeout` (`None`: forever). Returns
    /// `Ok(None)` on timeout.
    pub fn recv_timeout(&mut self, timeout: Option<Duration>) -> Result<Option<IoData>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(d) = self.try_recv()? {
                return Ok(Some(d));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => Some(l),
                    None => return Ok(None),
                },
                None => None,
            };
            // Pass on releases of what this domain forwarded, and be woken by new ones
            // while asleep: upstream may be waiting for them. Be woken too when a peer
            // downstream dies holding what we forwarded, so that it comes back.
            let domain = self.core.domain.clone();
            domain.collect_releases();
            let Some(armed) = domain.arm_sources() else {
                continue;
            };
            let disarm = |armed: &[Arc<dyn ReleaseSource>]| armed.iter().for_each(|a| a.disarm());
            // Releases that did not fit: sleep until the sender makes room (it wakes us
            // through rx_efd), unless room appeared already.
            let room = self.core.wait_for_room();
            if room == Some(false) {
                disarm(&armed);
                continue;
            }
            if !self.fwd.prepare_sleep().map_err(corrupt)? {
                if room.is_some() {
                    self.core.cancel_wait_for_room();
                }
                disarm(&armed);
                continue;
            }
            Counters::add(&self.core.stats.sleeps, 1);
            let link = &self.core.link;
            let mut fds = vec![link.rx_efd.as_fd(), link.pidfd.as_fd()];
            for a in &armed {
                fds.push(a.wake_fd());
                fds.push(a.peer_fd());
            }
            // Fragments of a dead peer wait in quarantine: look at the ledgers again soon.
            let left = if domain.quarantined() > 0 {
                Some(left.map_or(SETTLE_PERIOD, |l| l.min(SETTLE_PERIOD)))
            } else {
                left
            };
            let woke = wait_readable(&fds, left);
            self.fwd.cancel_sleep();
            if room.is_some() {
                self.core.cancel_wait_for_room();
            }
            disarm(&armed);
            match woke? {
                Some(0) => link.rx_efd.drain(),
                Some(1) => self.idle(true)?,
                Some(i) if i % 2 == 1 => armed[(i - 2) / 2].peer_died(),
                _ => {}
            }
        }
    }

    /// Busy-polls for the next message (no system call while the sender is alive),
    /// giving up after `timeout`.
    pub fn recv_spin(&mut self, timeout: Duration) -> Result<Option<IoData>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self.try_recv()? {
                return Ok(Some(d));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::hint::spin_loop();
        }
    }

    /// Prepares to wait on this receiver's fd (epoll, async runtimes). Returns false if a
    /// message is already waiting (do not wait: call [`try_recv`](Self::try_recv)). After
    /// true, the fd becomes readable when the next message arrives.
    pub fn arm(&mut self) -> Result<bool> {
        self.core.link.rx_efd.drain();
        self.fwd.prepare_sleep().map_err(corrupt)
    }

    /// Releases waiting in this receiver because neither the reverse ring nor the
    /// overflow area could take them.
    pub fn pending_releases(&self) -> usize {
        self.core
            .rel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .len()
    }

    /// Process id of the sender.
    pub fn peer_pid(&self) -> u32 {
        self.core.link.peer_pid
    }

    /// This endpoint's counters.
    pub fn stats(&self) -> ChannelStats {
        self.core.stats.snapshot()
    }
}

impl AsFd for Receiver {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.link.rx_efd.as_fd()
    }
}

/// For event loops that take raw descriptors (such as tokio's `AsyncFd`).
impl AsRawFd for Receiver {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.core.link.rx_efd.as_raw_fd()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.lots.clear();
        // Nothing more is taken from the ring: what we took is in the ledger.
        self.core.end_inbound();
        let h = self.core.link.header();
        h.rx_closed.store(layout::RX_CLOSING, Ordering::SeqCst);
        // Messages still in the ring will never be read: release them, so the sender
        // gets its fbufs back. One pushed after this loop is taken back by the sender
        // itself once it sees RX_DRAINED (it compares its ring positions with our head).
        while let Ok(Some((d, _))) = self.fwd.try_pop() {
            self.core.release(d.token);
        }
        // SYNC: Release: our last head store is visible to a sender that sees this.
        h.rx_closed.store(layout::RX_DRAINED, Ordering::Release);
        self.core.link.tx_efd.notify();
    }
}

fn check_config(c: &ChannelConfig) -> Result<()> {
    let ok = |n: u32| n.is_power_of_two() && (2..=layout::MAX_CAP).contains(&n);
    if !ok(c.capacity) || !ok(c.release_capacity) {
        return Err(Error::InvalidArgument(
            "ring sizes must be powers of two in 2..=65536",
        ));
    }
    Ok(())
}

/// Opens a channel from `domain` to `peer`; see [`Domain::connect`](crate::Domain::connect).
pub(crate) fn connect(
    domain: &Arc<DomainInner>,
    peer: DomainId,
    config: ChannelConfig,
    timeout: Duration,
) -> Result<Sender> {
    check_config(&config)?;
    let group = &domain.group;
    if peer.slot as usize >= crate::region::group::MAX_SLOTS {
        return Err(Error::InvalidArgument("no such slot"));
    }
    let (peer_pid, pidfd) = group.peer_pidfd(peer)?;
    let size = layout::channel_bytes(config.capacity, config.release_capacity);
    let chan_fd = memfd("ferry-channel", size as u64)?;
    // The receiver maps it: fix its size, so that it cannot be shrunk under the mapping.
    crate::sys::seal::fix_size(chan_fd.as_fd())?;
    let map = Mapping::shared(chan_fd.as_fd(), size, Access::ReadWrite)?;
    let base = NonNull::new(map.as_ptr()).expect("mapping non-null");
    // SAFETY: the mapping is `channel_bytes(..)` long.
    let parts = unsafe { layout::parts(base, config.capacity, config.release_capacity) };
    let me = domain.lot.id;
    // SAFETY: nobody else has this fresh mapping yet; plain fields are written before
    // the offer is published (Release) and the receiver reads them after (Acquire).
    unsafe {
        let h = parts.header.as_ptr();
        (*h).version = layout::VERSION;
        (*h).fwd_cap = config.capacity;
        (*h).rev_cap = config.release_capacity;
        (*h).tx_slot = me.slot as u32;
        (*h).tx_generation = me.generation;
        (*h).rx_slot = peer.slot as u32;
        (*h).rx_generation = peer.generation;
        (*h).magic.store(layout::MAGIC, Ordering::Release);
    }
    let link = Link {
        _map: map,
        parts,
        rx_efd: EventFd::new()?,
        tx_efd: EventFd::new()?,
        rel_efd: EventFd::new()?,
        peer_pid,
        pidfd,
        _chan_fd: chan_fd,
    };

    // Offer it in our slot.
    let slot = group.slot(me.slot);
    let offer = slot
        .offers
        .iter()
        .find(|o| {
            o.state
                .compare_exchange(
                    OFFER_FREE,
                    OFFER_WRITING,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        })
        .ok_or(Error::InvalidArgument("too many channels offered at once"))?;
    offer.to_slot.store(peer.slot as u32, Ordering::Relaxed);
    offer
        .to_generation
        .store(peer.generation, Ordering::Relaxed);
    offer
        .chan_fd
        .store(link._chan_fd.as_raw_fd() as u32, Ordering::Relaxed);
    offer
        .rx_efd
        .store(link.rx_efd.as_raw_fd() as u32, Ordering::Relaxed);
    offer
        .tx_efd
        .store(link.tx_efd.as_raw_fd() as u32, Ordering::Relaxed);
    offer
        .rel_efd
        .store(link.rel_efd.as_raw_fd() as u32, Ordering::Relaxed);
    // SYNC: pairs with the acceptor's CAS (Acquire) on the offer state.
    offer.state.store(OFFER_OPEN, Ordering::Release);
    group.header().offer_seq.fetch_add(1, Ordering::AcqRel);
    futex::wake_all(&group.header().offer_seq);

    let deadline = Instant::now() + timeout;
    let accepted = loop {
        // SYNC: pairs with the receiver's Release store of rx_ready.
        if link.header().rx_ready.load(Ordering::Acquire) == 1 {
            break true;
        }
        let now = Instant::now();
        if now >= deadline || link.peer_exited() {
            break false;
        }
        futex::wait(
            &link.header().rx_ready,
            0,
            (deadline - now).min(Duration::from_millis(20)),
        );
    };
    if !accepted {
        // Withdraw the offer unless the peer took it at the last moment.
        if offer
            .state
            .compare_exchange(OFFER_OPEN, OFFER_FREE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Err(if link.peer_exited() {
                Error::PeerGone { pid: peer_pid }
            } else {
                Error::Timeout
            });
        }
        // Taken: wait a little more for rx_ready.
        let t = Instant::now() + Duration::from_secs(1);
        while link.header().rx_ready.load(Ordering::Acquire) != 1 {
            if Instant::now() > t || link.peer_exited() {
                offer.state.store(OFFER_FREE, Ordering::Release);
                return Err(Error::PeerGone { pid: peer_pid });
            }
            futex::wait(&link.header().rx_ready, 0, Duration::from_millis(10));
        }
    }
    offer.state.store(OFFER_FREE, Ordering::Release);

    // SAFETY: the rings lie inside the mapping `link` owns; we are the only producer
    // of the forward ring and the only consumer of the reverse ring.
    let (fwd, rev) = unsafe {
        (
            ring::producer(
                link.parts.fwd_ctl,
                link.parts.fwd_slots,
                config.capacity as u64,
            ),
            ring::consumer(
                link.parts.rev_ctl,
                link.parts.rev_slots,
                config.release_capacity as u64,
            ),
        )
    };
    let meta = PathAllocator::new(
        domain.lot.clone(),
        Arc::downgrade(domain),
        PathConfig::default(),
    );
    let core = Arc::new(SendCore {
        link,
        domain: Arc::downgrade(domain),
        peer,
        meta,
        state: Mutex::new(SendState {
            fwd,
            rev,
            inflight: Vec::new(),
            free_tokens: Vec::new(),
            last_check: Instant::now(),
            rel_sleepers: 0,
            tx_sleepers: 0,
        }),
        gone: AtomicBool::new(false),
        stats: Counters::default(),
    });
    let weak: std::sync::Weak<dyn ReleaseSource> = Arc::downgrade(&core) as _;
    domain.add_source(weak);
    Ok(Sender { core })
}

/// Waits for a channel offered to `domain`; see [`Domain::accept`](crate::Domain::accept).
pub(crate) fn accept(domain: &Arc<DomainInner>, timeout: Duration) -> Result<Receiver> {
    let group = &domain.group;
    let me = domain.lot.id;
    let deadline = Instant::now() + timeout;
    loop {
        let seq = group.header().offer_seq.load(Ordering::Acquire);
        for s in 0..crate::region::group::MAX_SLOTS as u16 {
            let slot = group.slot(s);
            if s == me.slot || slot.state.load(Ordering::Acquire) != SLOT_LIVE {
                continue;
            }
            for offer in &slot.offers {
                if offer.state.load(Ordering::Acquire) != OFFER_OPEN
                    || offer.to_slot.load(Ordering::Relaxed) != me.slot as u32
                    || offer.to_generation.load(Ordering::Relaxed) != me.generation
                {
                    continue;
                }
                if offer
                    .state
                    .compare_exchange(OFFER_OPEN, OFFER_TAKEN, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                let peer = DomainId {
                    slot: s,
                    generation: slot.generation.load(Ordering::Acquire),
                };
                match open_offer(domain, peer, offer) {
                    Ok(r) => return Ok(r),
                    // A broken or vanished offer: skip it, keep waiting for a good one.
                    Err(_) => continue,
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout);
        }
        futex::wait(
            &group.header().offer_seq,
            seq,
            (deadline - now).min(Duration::from_millis(50)),
        );
    }
}

fn open_offer(
    domain: &Arc<DomainInner>,
    peer: DomainId,
    offer: &crate::region::group::OfferRaw,
) -> Result<Receiver> {
    let (peer_pid, pidfd) = domain.group.peer_pidfd(peer)?;
    let get = |fd: &std::sync::atomic::AtomicU32| {
        dup_from(pidfd.as_fd(), fd.load(Ordering::Relaxed) as i32)
    };
    let chan_fd = get(&offer.chan_fd)?;
    let rx_efd = EventFd::from_owned(get(&offer.rx_efd)?);
    let tx_efd = EventFd::from_owned(get(&offer.tx_efd)?);
    let rel_efd = EventFd::from_owned(get(&offer.rel_efd)?);
    let len = crate::sys::fd::file_len(chan_fd.as_fd())? as usize;
    if len < layout::SLOTS || len > layout::channel_bytes(layout::MAX_CAP, layout::MAX_CAP) {
        return Err(Error::InvalidArgument("channel memory has a bad size"));
    }
    // Unsealed, the sender could truncate it under our mapping (SIGBUS on the next read).
    if crate::sys::seal::check_fixed_size(chan_fd.as_fd(), len as u64).is_err() {
        return Err(Error::InvalidArgument(
            "channel memory's size is not sealed",
        ));
    }
    let map = Mapping::shared(chan_fd.as_fd(), len, Access::ReadWrite)?;
    let base = NonNull::new(map.as_ptr()).expect("non-null");
    // SAFETY: at least the header lies inside the mapping (len >= SLOTS).
    let h = unsafe { &*base.as_ptr().cast::<ChanHeader>() };
    if h.magic.load(Ordering::Acquire) != layout::MAGIC || h.version != layout::VERSION {
        return Err(Error::InvalidArgument("not a ferry channel"));
    }
    let (fwd_cap, rev_cap) = (h.fwd_cap, h.rev_cap);
    let me = domain.lot.id;
    if check_config(&ChannelConfig {
        capacity: fwd_cap,
        release_capacity: rev_cap,
    })
    .is_err()
        || layout::channel_bytes(fwd_cap, rev_cap) != len
        || h.rx_slot != me.slot as u32
        || h.rx_generation != me.generation
        || h.tx_slot != peer.slot as u32
    {
        return Err(Error::InvalidArgument(
            "channel header does not match its offer",
        ));
    }
    // SAFETY: `len == channel_bytes(fwd_cap, rev_cap)`, checked above.
    let parts = unsafe { layout::parts(base, fwd_cap, rev_cap) };
    let link = Link {
        _map: map,
        parts,
        rx_efd,
        tx_efd,
        rel_efd,
        peer_pid,
        pidfd,
        _chan_fd: chan_fd,
    };
    // SAFETY: the rings lie in `link`'s mapping; we are the only consumer of the forward
    // ring and the only producer of the reverse ring.
    let (fwd, rev) = unsafe {
        (
            ring::consumer(link.parts.fwd_ctl, link.parts.fwd_slots, fwd_cap as u64),
            ring::producer(link.parts.rev_ctl, link.parts.rev_slots, rev_cap as u64),
        )
    };
    // Map the sender's lot now, while the sender surely lives.
    let sender_lot = domain.resolve(LotId {
        slot: peer.slot,
        generation: peer.generation,
    })?;
    // Record the channel in our ledger before the sender may send: from now until we have
    // taken its last message, a death upstream must not get forwarded spans reused.
    let inbound = domain.add_inbound(peer).ok_or(Error::InvalidArgument(
        "too many receiving channels in this domain",
    ))?;
    link.header()
        .rx_pid
        .store(std::process::id(), Ordering::Relaxed);
    // SYNC: pairs with the sender's Acquire load of rx_ready in `connect`.
    link.header().rx_ready.store(1, Ordering::Release);
    futex::wake_all(&link.header().rx_ready);
    let core = Arc::new(RecvCore {
        link,
        domain: domain.clone(),
        sender: peer,
        inbound: Mutex::new(Some(inbound)),
        rel: Mutex::new(RelState {
            rev,
            pending: Vec::new(),
        }),
        has_pending: AtomicBool::new(false),
        stats: Counters::default(),
        sender_lot: Some(sender_lot),
    });
    let weak: std::sync::Weak<dyn PendingReleases> = Arc::downgrade(&core) as _;
    domain.add_sink(weak);
    Ok(Receiver {
        core,
        fwd,
        last_check: Instant::now(),
        map_per_transfer: false,
        lots: Vec::new(),
        frags: Vec::new(),
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::region::Group;

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
        // Its drop would release the two again (they are in its ring): skip it.
        std::mem::forget(rx);
    }
}
