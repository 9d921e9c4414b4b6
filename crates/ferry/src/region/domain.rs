//! Domains: this process's membership of a group.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::group::{DomainId, Group};
use super::ledger::{Held, Ledger};
use super::lot::{Lot, PeerLot};
use crate::error::{BadDescriptor, Error, Result};
use crate::segment::{LotId, LotSpan, Segment};
use crate::sync::lock;

/// A lot that descriptors may point into, resolved in this process.
#[derive(Clone, Debug)]
pub(crate) enum LotRef {
    Own(Arc<Lot>),
    Peer(Arc<PeerLot>),
}

impl LotRef {
    pub fn base(&self) -> *mut u8 {
        match self {
            LotRef::Own(l) => l.base(),
            LotRef::Peer(l) => l.base(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            LotRef::Own(l) => l.len(),
            LotRef::Peer(l) => l.len(),
        }
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            LotRef::Own(l) => l.fd().as_fd(),
            LotRef::Peer(l) => l.fd().as_fd(),
        }
    }
}

/// Something the domain must poll for releases (a sending channel).
pub(crate) trait ReleaseSource: Send + Sync {
    /// Drains pending releases. Returns false once the source is finished with and can
    /// be forgotten.
    fn collect(&self) -> bool;
    /// Prepares to sleep until a release arrives: `None` if nothing is outstanding,
    /// `Some(false)` if releases are already waiting (collect instead of sleeping),
    /// `Some(true)` once armed: [`wake_fd`](Self::wake_fd) turns readable on the next one.
    fn arm(&self) -> Option<bool>;
    /// Undoes [`arm`](Self::arm).
    fn disarm(&self);
    /// The eventfd that a release wakes while armed.
    fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_>;
    /// The receiving peer's pidfd, readable once it died.
    fn peer_fd(&self) -> std::os::fd::BorrowedFd<'_>;
    /// The peer's pidfd turned readable: take back what it held now.
    fn peer_died(&self);
}

/// Something holding releases that did not fit its reverse ring (a receiving channel).
pub(crate) trait PendingReleases: Send + Sync {
    /// Sends what fits now.
    fn flush(&self);
}

/// Fragments a dead peer held, kept until no live domain holds them (see
/// [`super::ledger`]).
#[derive(Debug)]
struct Quarantined {
    /// The dead peer that held it.
    dead: LotId,
    lot: LotId,
    offset: u64,
    len: u64,
    _keep: Arc<Segment>,
}

/// How often a domain with quarantined fragments looks at the ledgers again.
pub(crate) const SETTLE_PERIOD: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub(crate) struct DomainInner {
    pub group: Arc<Group>,
    pub lot: Arc<Lot>,
    /// Peers' lots mapped here. Weak: a lot is unmapped as soon as nothing here uses it
    /// (channels keep their sender's lot, receivers the lots their messages name), so the
    /// lot of a peer that died after we stopped reading it never lingers.
    peers: Mutex<HashMap<LotId, Weak<PeerLot>>>,
    sources: Mutex<Vec<Weak<dyn ReleaseSource>>>,
    /// Closed senders whose receivers still hold fbufs; kept until those come back.
    parked: Mutex<Vec<Arc<dyn ReleaseSource>>>,
    /// Receiving channels, for flushing releases that did not fit their rings.
    sinks: Mutex<Vec<Weak<dyn PendingReleases>>>,
    /// This domain's writer of its ledger in the control block.
    ledger: Mutex<Ledger>,
    /// What dead peers held, until no live domain holds it.
    quarantine: Mutex<Vec<Quarantined>>,
    quarantined: AtomicUsize,
    last_settle: Mutex<Instant>,
    /// Held from joining a service to taking its owner's channel: an owner's services
    /// connect to this domain in any order, and a channel names only its peer, so two
    /// joins at once to services of one owner could each take the other's.
    pub joining: Mutex<()>,
}

impl std::fmt::Debug for dyn ReleaseSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReleaseSource")
    }
}

impl DomainInner {
    /// Resolves the lot named by a descriptor, mapping a peer's lot on first use.
    pub fn resolve(&self, id: LotId) -> Result<LotRef> {
        if id == self.lot.id {
            return Ok(LotRef::Own(self.lot.clone()));
        }
        if id.slot == self.lot.id.slot || id.slot as usize >= super::group::MAX_SLOTS {
            return Err(BadDescriptor::UnknownLot {
                slot: id.slot,
                generation: id.generation,
            }
            .into());
        }
        if let Some(l) = super::lot::local_lot(&self.group, id) {
            return Ok(LotRef::Own(l));
        }
        let mut peers = lock(&self.peers);
        // Another domain of this process may have it mapped: share that mapping.
        if let Some(p) = super::lot::mapped_peer_lot(&self.group, id) {
            peers.insert(id, Arc::downgrade(&p));
            return Ok(LotRef::Peer(p));
        }
        peers.retain(|_, w| w.strong_count() > 0);
        // An earlier lot of the slot whose last user here just let go may still be being
        // unmapped on another thread: wait for its address a little. One still in use
        // here keeps its window: say so.
        let mut tries = 0;
        let p = loop {
            match PeerLot::map(&self.group, id) {
                Err(Error::AddressInUse { addr, len }) => {
                    // Another domain of this process mapped this very lot since the
                    // look-up above (its services admit on their own threads): share it.
                    if let Some(p) = super::lot::mapped_peer_lot(&self.group, id) {
                        peers.insert(id, Arc::downgrade(&p));
                        return Ok(LotRef::Peer(p));
                    }
                    if let Some(held) = super::lot::peer_lot_at(&self.group, id.slot, addr)
                        .filter(|held| *held != id)
                    {
                        let s = self.group.slot(id.slot);
                        return Err(Error::LotAddressHeld {
                            slot: id.slot,
                            generation: id.generation,
                            pid: s.pid.load(Ordering::Relaxed),
                            held: held.generation,
                            addr,
                        });
                    }
                    if tries >= 1000 {
                        return Err(Error::AddressInUse { addr, len });
                    }
                    tries += 1;
                    std::thread::yield_now();
                }
                other => break Arc::new(other?),
            }
        };
        peers.insert(id, Arc::downgrade(&p));
        super::lot::note_peer_lot(&self.group, &p);
        Ok(LotRef::Peer(p))
    }

    /// Records in the ledger that this domain holds `len` bytes at `offset` of `lot`,
    /// which it received from a domain other than the lot's owner. `None` if the ledger is
    /// full (the caller copies instead).
    pub fn hold(&self, lot: LotId, offset: u64, len: u64) -> Option<u32> {
        let raw = self.group.ledger(self.lot.id.slot);
        lock(&self.ledger).hold(raw, lot, offset, len)
    }

    /// Clears holds recorded by [`hold`](Self::hold).
    pub fn unhold(&self, entries: &[u32]) {
        let raw = self.group.ledger(self.lot.id.slot);
        let mut l = lock(&self.ledger);
        for &i in entries {
            l.unhold(raw, i);
        }
    }

    /// Records a channel from `sender` (before it may send); `None` if there are too many.
    pub fn add_inbound(&self, sender: DomainId) -> Option<u32> {
        let raw = self.group.ledger(self.lot.id.slot);
        let id = LotId {
            slot: sender.slot,
            generation: sender.generation,
        };
        lock(&self.ledger).add_inbound(raw, id)
    }

    /// Clears a channel entry once its sender can send no more and its ring is empty.
    pub fn remove_inbound(&self, i: u32) {
        let raw = self.group.ledger(self.lot.id.slot);
        lock(&self.ledger).remove_inbound(raw, i);
    }

    /// Takes what a dead peer held: each fragment goes once no live domain holds it.
    /// Each piece is the segment that keeps it alive, where the piece starts in its lot,
    /// and its length.
    pub fn quarantine(
        &self,
        dead: DomainId,
        data: impl IntoIterator<Item = (Arc<Segment>, LotSpan, u64)>,
    ) {
        let dead = LotId {
            slot: dead.slot,
            generation: dead.generation,
        };
        {
            let mut q = lock(&self.quarantine);
            for (keep, span, len) in data {
                q.push(Quarantined {
                    dead,
                    lot: span.lot,
                    offset: span.offset,
                    len,
                    _keep: keep,
                });
            }
            self.quarantined.store(q.len(), Ordering::Release);
        }
        self.settle_quarantine(true);
    }

    /// Fragments of dead peers still held by someone.
    pub fn quarantined(&self) -> usize {
        self.quarantined.load(Ordering::Acquire)
    }

    /// Lets go of quarantined fragments no live domain holds any more. Reads the ledgers
    /// of every live domain (and asks the kernel whether each lives), so it runs at most
    /// every [`SETTLE_PERIOD`] unless `force`.
    pub fn settle_quarantine(&self, force: bool) {
        if self.quarantined.load(Ordering::Acquire) == 0 {
            return;
        }
        {
            let mut last = lock(&self.last_settle);
            if !force && last.elapsed() < SETTLE_PERIOD {
                return;
            }
            *last = Instant::now();
        }
        let g = &self.group;
        let live: Vec<u16> = g.members().iter().map(|m| m.id.slot).collect();
        // A live domain that has not yet taken every message a dead sender left in a ring
        // may still record holds of them: wait for it, if that sender may have had any of
        // what we keep (it is one of the peers whose death put it here, or its ledger says
        // it held some, or its slot was claimed again and we cannot tell).
        {
            let q = lock(&self.quarantine);
            let mut theirs = Vec::new();
            let tainted = |x: LotId, theirs: &mut Vec<Held>| {
                if q.iter().any(|f| f.dead == x) {
                    return true;
                }
                let gen = &g.slot(x.slot).generation;
                if gen.load(Ordering::Acquire) == x.generation {
                    theirs.clear();
                    g.ledger(x.slot).holds(theirs);
                    if gen.load(Ordering::Acquire) == x.generation {
                        return theirs
                            .iter()
                            .any(|h| q.iter().any(|f| h.overlaps(f.lot, f.offset, f.len)));
                    }
                }
                // The slot has a new owner: its claimer noted whether X held anything.
                !g.ledger(x.slot).was_clean(x.generation)
            };
            for &i in &live {
                for sender in g.ledger(i).inbound() {
                    // No receiver records a slot the group cannot have: garbage, skip it.
                    if (sender.slot as usize) < super::group::MAX_SLOTS
                        && !g.domain_live(sender)
                        && tainted(sender, &mut theirs)
                    {
                        return;
                    }
                }
            }
        }
        let mut held: Vec<Held> = Vec::new();
        for &i in &live {
            g.ledger(i).holds(&mut held);
        }
        let gone: Vec<Quarantined> = {
            let mut q = lock(&self.quarantine);
            let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut *q)
                .into_iter()
                .partition(|f| held.iter().any(|h| h.overlaps(f.lot, f.offset, f.len)));
            *q = keep;
            self.quarantined.store(q.len(), Ordering::Release);
            gone
        };
        // Dropped outside the lock: a foreign fragment's last reference sends a release.
        drop(gone);
    }

    /// Registers a receiving channel whose pending releases collecting should flush.
    pub fn add_sink(&self, s: Weak<dyn PendingReleases>) {
        let mut v = lock(&self.sinks);
        v.retain(|w| w.strong_count() > 0);
        v.push(s);
    }

    /// Registers a sending channel whose releases allocators should drain.
    pub fn add_source(&self, s: Weak<dyn ReleaseSource>) {
        let mut v = lock(&self.sources);
        v.retain(|w| w.strong_count() > 0);
        v.push(s);
    }

    /// Drains releases from every sending channel of this domain, flushes releases its
    /// receivers could not send yet, and settles the quarantine now and then.
    pub fn collect_releases(&self) {
        // Under the lock and with no allocation, as below: this runs on every idle receive
        // and every allocation that finds its free list empty, and flushing takes only the
        // receiver's release lock.
        for s in lock(&self.sinks).iter().filter_map(Weak::upgrade) {
            s.flush();
        }
        self.settle_quarantine(false);
        // Collected under the lock, with no allocation: dropping released fbufs takes
        // only path and release-ring locks, never this one.
        for s in lock(&self.sources).iter() {
            if let Some(s) = s.upgrade() {
                s.collect();
            }
        }
        if lock(&self.parked).is_empty() {
            return;
        }
        let parked: Vec<_> = std::mem::take(&mut *lock(&self.parked));
        let keep: Vec<_> = parked.into_iter().filter(|s| s.collect()).collect();
        lock(&self.parked).extend(keep);
    }

    /// Arms every sender of this domain that waits for releases, so that a thread about
    /// to sleep (in a receive) is woken when one arrives: a stage that forwards fbufs
    /// holds its upstream's buffers until its downstream lets go, and must pass those
    /// releases on even while it waits for input. Returns the armed senders, or `None`
    /// if releases are already waiting (collect them instead of sleeping).
    pub fn arm_sources(&self) -> Option<Vec<Arc<dyn ReleaseSource>>> {
        let mut all: Vec<Arc<dyn ReleaseSource>> = lock(&self.sources)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        all.extend(lock(&self.parked).iter().cloned());
        let mut armed = Vec::new();
        for s in all {
            match s.arm() {
                None => {}
                Some(true) => armed.push(s),
                Some(false) => {
                    armed
                        .iter()
                        .for_each(|a: &Arc<dyn ReleaseSource>| a.disarm());
                    return None;
                }
            }
        }
        Some(armed)
    }

    /// Keeps a closed sender alive until its receiver has released everything.
    pub fn park(&self, s: Arc<dyn ReleaseSource>) {
        lock(&self.parked).push(s);
    }

    /// Closed senders still waiting for releases.
    pub fn parked(&self) -> usize {
        lock(&self.parked).len()
    }

    /// Forgets table entries of lots no longer mapped (they unmap themselves as soon as
    /// nothing here uses them).
    pub fn forget_dead_peers(&self) {
        let mut peers = lock(&self.peers);
        peers.retain(|_, p| p.strong_count() > 0);
    }

    /// Number of peer lots mapped in this process.
    pub fn mapped_peers(&self) -> usize {
        let peers = lock(&self.peers);
        peers.values().filter(|p| p.strong_count() > 0).count()
    }
}

/// This process's membership of a group: a slot, and the lot it owns.
///
/// ```no_run
/// # fn main() -> ferry::Result<()> {
/// let group = ferry::Group::open("example")?;
/// let domain = group.join()?;
/// let path = domain.path(ferry::PathConfig::default())?;
/// let mut buf = path.alloc(4096)?;
/// buf.write_at(0, b"hello");
/// let data = buf.freeze();
/// assert_eq!(&data.to_vec()[..5], b"hello");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

impl Group {
    /// Makes this process a member: claims a slot (a free one, or one whose owner died)
    /// and creates its lot at the slot's group-wide address.
    ///
    /// # Errors
    /// [`Error::AddressInUse`] if that address is already mapped in this process (ferry
    /// never maps elsewhere), [`Error::GroupFull`] if no slot is free.
    pub fn join(self: &Arc<Self>) -> Result<Domain> {
        let lot = Lot::create(self.clone())?;
        Ok(Domain {
            inner: Arc::new(DomainInner {
                group: self.clone(),
                lot,
                peers: Mutex::new(HashMap::new()),
                sources: Mutex::new(Vec::new()),
                parked: Mutex::new(Vec::new()),
                sinks: Mutex::new(Vec::new()),
                ledger: Mutex::new(Ledger::new()),
                quarantine: Mutex::new(Vec::new()),
                quarantined: AtomicUsize::new(0),
                last_settle: Mutex::new(Instant::now()),
                joining: Mutex::new(()),
            }),
        })
    }
}

impl Domain {
    /// This domain's id, to hand to peers that want to connect.
    pub fn id(&self) -> DomainId {
        self.inner.lot.domain_id()
    }

    /// The group.
    pub fn group(&self) -> &Arc<Group> {
        &self.inner.group
    }

    /// Address of this domain's lot (the same in every process of the group).
    pub fn lot_addr(&self) -> usize {
        self.inner.lot.base() as usize
    }

    /// Drains pending releases of every channel this domain sends on, returning fbufs to
    /// their free lists. Allocators do this on their own when a free list runs dry.
    pub fn collect_releases(&self) {
        self.inner.collect_releases()
    }

    /// Tidies the table of peers' lots. A peer's lot is unmapped on its own as soon as
    /// nothing here reads it any more (no channel from it, no message naming it), whether
    /// the peer lives or died; this only drops the table entries of such lots.
    pub fn forget_dead_peers(&self) {
        self.inner.forget_dead_peers()
    }

    /// Number of other domains' lots mapped in this process.
    pub fn mapped_peers(&self) -> usize {
        self.inner.mapped_peers()
    }

    /// Closed senders still waiting for their receivers to release fbufs.
    pub fn parked_senders(&self) -> usize {
        self.inner.parked()
    }

    /// Fragments that dead peers held and that this domain keeps until no live domain
    /// holds them any more (another domain may still read a span a dead peer forwarded
    /// to it). Collecting releases lets them go once the group's ledgers show them free.
    pub fn quarantined(&self) -> usize {
        self.inner.quarantined()
    }
}
