//! The receiving end: taking descriptors off the ring, checking them, turning them into
//! IoData over the sender's pages, and sending releases back.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::desc::{self, Lots, RawDesc, RawFrag};
use super::fds::{self, FdKinds, Fds};
use super::layout;
use super::link::{corrupt, ChannelStats, Counters, Link, LIVENESS_PERIOD};
use super::ring::{Consumer, Producer, Push};
use crate::error::{BadDescriptor, Error, Result};
use crate::iodata::{Fragment, IoData};
use crate::region::domain::{DomainInner, LotRef, PendingReleases, ReleaseSource, SETTLE_PERIOD};
use crate::region::group::DomainId;
use crate::segment::{Keep, LotId, LotSpan, Segment};
use crate::sync::lock;
use crate::sys::fd::wait_readable;
use crate::sys::mem::{Access, Mapping};

/// Keeps a received message's memory mapped, and releases it to the sender on drop.
pub(super) struct Hold {
    pub(super) token: u64,
    /// The lots the message spans, other than the sender's own (which `core` keeps
    /// mapped for as long as the channel lives).
    pub(super) _more_lots: Vec<LotRef>,
    /// Ledger entries of the forwarded fragments (those not in the sender's lot).
    pub(super) ledger: Vec<u32>,
    /// Last: dropped after the lots, so that if this was the channel's last message,
    /// `RecvCore::drop` finds them unused and unmaps those of dead peers.
    pub(super) core: Arc<RecvCore>,
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

/// A message of one fragment in the sender's own lot (the common case) needs no [`Hold`]:
/// its segment is tagged with the token and keeps the channel's end, which keeps the
/// sender's lot mapped and releases the token when the segment goes.
impl Keep for RecvCore {
    fn segment_dropped(&self, token: u64) {
        self.release(token);
    }
}

/// A fragment mapped for this one transfer (the uncached baseline); unmapped on drop,
/// before the hold releases the fbuf.
pub(super) struct MappedKeep {
    pub(super) _map: Mapping,
    pub(super) _hold: Arc<Hold>,
}
impl Keep for MappedKeep {}

pub(super) struct RelState {
    pub(super) rev: Producer<u64>,
    pub(super) pending: Vec<u64>,
}

pub(super) struct RecvCore {
    pub(super) link: Link,
    pub(super) domain: Arc<DomainInner>,
    /// The sending domain: fragments in its lot are its own; others were forwarded.
    pub(super) sender: DomainId,
    /// Our ledger entry for this channel, until the sender can send no more and the ring
    /// is empty (see `region::ledger`).
    pub(super) inbound: Mutex<Option<u32>>,
    pub(super) rel: Mutex<RelState>,
    /// True while `rel.pending` holds releases the reverse ring had no room for.
    pub(super) has_pending: AtomicBool,
    pub(super) stats: Counters,
    /// The sender's lot, mapped when the channel is accepted: messages stay readable
    /// even if the sender exits before we receive them.
    pub(super) sender_lot: Option<LotRef>,
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
    pub(super) fn release(&self, token: u64) {
        let mut r = lock(&self.rel);
        r.pending.push(token);
        self.send_pending(&mut r);
    }

    /// Sends releases that did not fit before, if any (one atomic load if none).
    pub(super) fn flush_pending(&self) {
        if !self.has_pending.load(Ordering::Acquire) {
            return;
        }
        self.send_pending(&mut lock(&self.rel));
    }

    /// Prepares to sleep with releases still pending: `Some(true)` once the sender will
    /// wake us (through `rx_efd`) when it makes room, `Some(false)` if room appeared
    /// (flush instead of sleeping), `None` if nothing is pending.
    pub(super) fn wait_for_room(&self) -> Option<bool> {
        if !self.has_pending.load(Ordering::Acquire) {
            return None;
        }
        let mut r = lock(&self.rel);
        self.send_pending(&mut r);
        if r.pending.is_empty() {
            return None;
        }
        // A ring the sender broke (Corrupt) will never have room: sleep without a wake-up.
        Some(r.rev.prepare_wait().unwrap_or(true))
    }

    pub(super) fn cancel_wait_for_room(&self) {
        lock(&self.rel).rev.cancel_wait();
    }

    /// The sender can send no more and the ring is empty: drop our ledger entry.
    pub(super) fn end_inbound(&self) {
        if let Some(i) = lock(&self.inbound).take() {
            self.domain.remove_inbound(i);
        }
    }

    /// Sends pending releases: through the reverse ring while it has room, then into
    /// the overflow area (the sender collects those itself). What fits neither (a token
    /// index beyond the area, or a ring the sender broke) stays pending, and
    /// `has_pending` says so.
    fn send_pending(&self, r: &mut RelState) {
        let (stats, link) = (&self.stats, &self.link);
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
        if sent > 0 {
            // Under the release lock: the only writer.
            Counters::bump(&stats.releases, sent);
        }
        self.has_pending
            .store(!r.pending.is_empty(), Ordering::Release);
    }
}

impl PendingReleases for RecvCore {
    fn flush(&self) {
        self.flush_pending();
    }
}

/// Resolves descriptor lots through the domain, remembering what it mapped.
pub(super) struct DomainLots<'a> {
    pub(super) domain: &'a DomainInner,
    /// The receiver's cache of lots it has resolved, kept across messages.
    pub(super) seen: &'a mut Vec<((u16, u32), LotRef)>,
}

impl DomainLots<'_> {
    pub(super) fn get(&mut self, slot: u16, generation: u32) -> Result<&LotRef, BadDescriptor> {
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
        // SAFETY: `check` verified `offset..offset+out.len()` lies inside the lot's
        // mapping, which `seen` keeps alive.
        unsafe { copy_shared(base.add(offset as usize), out) };
    }
}

/// Copies `out.len()` bytes from `src`, memory another process may be writing: each byte
/// is read volatile into our own buffer, and only that copy is used.
///
/// # Safety
/// `src..src+out.len()` must be mapped and readable for the whole call.
unsafe fn copy_shared(src: *const u8, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: the caller vouches for the whole range.
        *b = unsafe { src.add(i).read_volatile() };
    }
}

/// The receiving end of a channel (see [`Sender`](crate::Sender)): every descriptor the
/// sender writes is validated before use, and the data received is the sender's pages,
/// read in place through a read-only mapping; dropping it sends the release back.
///
/// Its [`AsFd`] is a descriptor (an epoll set over the
/// channel's eventfd and the sender's pidfd) that turns readable when a message arrives
/// for a receiver that [armed](Self::arm) it, when the sender closes its end, and when
/// the sender dies, so it works with any epoll loop and with async runtimes.
pub struct Receiver {
    pub(super) core: Arc<RecvCore>,
    pub(super) fwd: Consumer<RawDesc>,
    pub(super) last_check: Instant,
    pub(super) map_per_transfer: bool,
    /// Lots resolved so far, so the data path takes no lock to find them. Cleared when
    /// the sender is found dead and on drop, so dead peers' lots can be unmapped.
    pub(super) lots: Vec<((u16, u32), LotRef)>,
    /// Decoded fragments of the message being received (reused).
    pub(super) frags: Vec<RawFrag>,
    /// What [`AsFd`] hands out: an epoll set over `rx_efd` and the sender's pidfd.
    pub(super) wait: OwnedFd,
    /// [`arm`](Self::arm) saw the sender dead: the next idle receive checks liveness
    /// at once instead of waiting for the period.
    pub(super) recheck: bool,
    /// Empty polls since the last message (see [`Receiver::idle`]).
    pub(super) idle_polls: u32,
    /// The fragments of the message being built (reused, always left empty).
    pub(super) out: Vec<Fragment>,
    /// How long a blocking receive busy-polls before it sleeps (see
    /// [`Receiver::set_spin`]); zero: not at all.
    pub(super) spin: Duration,
    /// The kinds of descriptor accepted as cargo (see [`Receiver::set_fd_kinds`]).
    pub(super) fd_kinds: FdKinds,
}

/// The epoll set a receiver's [`AsFd`] stands for: the channel's eventfd (a message, a
/// closed sender, room for releases) and the sender's pidfd (its death).
pub(super) fn wait_set(link: &Link) -> Result<OwnedFd> {
    Ok(crate::sys::fd::wait_set(&[
        link.rx_efd.as_fd(),
        link.pidfd.as_fd(),
    ])?)
}

/// A busy-polling receiver does the idle work (collect releases, check the clock) once
/// every this many empty polls.
const IDLE_EVERY: u32 = 64;

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("peer_pid", &self.core.link.peer_pid)
            .finish()
    }
}

impl Receiver {
    /// Waits until the sender says that its owner lists it
    /// ([`Sender::confirm_listed`](super::Sender)): a subscriber's open returns only once
    /// its publisher sends to it, so that every message published after the open
    /// returned reaches it.
    ///
    /// # Errors
    /// `until`'s, [`Error::PeerGone`] if the sender died first, and a malformed-state
    /// error if the word holds what no sender writes.
    pub(crate) fn wait_listed(&self, until: &mut crate::until::Until<'_>) -> Result<()> {
        self.core.link.wait_ready_word(until, |now| match now {
            layout::RX_LISTED => Some(Ok(())),
            layout::RX_READY => None,
            _ => Some(Err(Error::BadDescriptor(BadDescriptor::Malformed(
                "the channel's ready word holds no known state",
            )))),
        })
    }

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
        self.take(None, FdKinds::ANY)
    }

    /// Like [`try_recv`](Self::try_recv), and takes the message's descriptors too (an
    /// empty [`Fds`] if it carried none).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-try-recv-fds-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// assert!(rx.try_recv_with_fds()?.is_none());
    /// let path = a.path(ferry::PathConfig::default())?;
    /// tx.send(&path.alloc(8)?.freeze())?;
    /// let (data, fds) = rx.try_recv_with_fds()?.expect("sent above");
    /// assert_eq!((data.len(), fds.len()), (8, 0));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`try_recv`](Self::try_recv); and, the message then dropped with none of its
    /// descriptors kept: [`Error::FdRefused`] for a kind not in
    /// [`fd_kinds`](Self::fd_kinds), [`Error::FdsLost`] if the sender died before they
    /// were taken, [`Error::BadDescriptor`] for a descriptor table that fails validation,
    /// [`Error::Io`] if this process has no descriptor numbers left (`EMFILE`).
    pub fn try_recv_with_fds(&mut self) -> Result<Option<(IoData, Fds)>> {
        let mut fds = Fds::default();
        let kinds = self.fd_kinds;
        Ok(self.take(Some(&mut fds), kinds)?.map(|d| (d, fds)))
    }

    /// Like [`recv`](Self::recv), and takes the message's descriptors too (see
    /// [`try_recv_with_fds`](Self::try_recv_with_fds)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use std::os::fd::AsFd;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-recv-fds-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// let (r, _w) = std::io::pipe()?;
    /// let path = a.path(ferry::PathConfig::default())?;
    /// tx.send_with_fds(&path.alloc(8)?.freeze(), &[r.as_fd()])?;
    /// let (_, fds) = rx.recv_with_fds()?;
    /// assert_eq!(fds.kind(0), Some(ferry::FdKind::Pipe));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`try_recv_with_fds`](Self::try_recv_with_fds).
    pub fn recv_with_fds(&mut self) -> Result<(IoData, Fds)> {
        let mut fds = Fds::default();
        let d = self.recv_until(None, Some(&mut fds))?;
        Ok((d, fds))
    }

    /// Like [`recv_timeout`](Self::recv_timeout), and takes the message's descriptors too
    /// (see [`try_recv_with_fds`](Self::try_recv_with_fds)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-recv-fds-to-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// assert!(matches!(
    ///     rx.recv_with_fds_timeout(Duration::from_millis(10)),
    ///     Err(ferry::Error::Timeout)
    /// ));
    /// # drop(tx);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`recv_timeout`](Self::recv_timeout) and
    /// [`try_recv_with_fds`](Self::try_recv_with_fds).
    pub fn recv_with_fds_timeout(&mut self, timeout: Duration) -> Result<(IoData, Fds)> {
        let mut fds = Fds::default();
        let d = self.recv_until(Some(Instant::now() + timeout), Some(&mut fds))?;
        Ok((d, fds))
    }

    /// Sets the kinds of descriptor this receiver accepts as cargo; a message carrying
    /// another is refused with [`Error::FdRefused`] by the receive calls that take
    /// descriptors. The default accepts all but [`FdKind::Other`](crate::FdKind::Other).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-fd-kinds-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// use ferry::{FdKind, FdKinds};
    /// rx.set_fd_kinds(FdKinds::only(FdKind::Memfd));
    /// assert_eq!(rx.fd_kinds(), FdKinds::only(FdKind::Memfd));
    /// # drop(tx);
    /// # Ok(()) }
    /// ```
    pub fn set_fd_kinds(&mut self, kinds: FdKinds) {
        self.fd_kinds = kinds;
    }

    /// The kinds of descriptor this receiver accepts (see
    /// [`set_fd_kinds`](Self::set_fd_kinds)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-fd-kinds2-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// assert_eq!(rx.fd_kinds(), ferry::FdKinds::default());
    /// # drop(tx);
    /// # Ok(()) }
    /// ```
    pub fn fd_kinds(&self) -> FdKinds {
        self.fd_kinds
    }

    /// Takes the next message if one is ready; with `cargo`, its descriptors too, of
    /// `kinds` only. A message's descriptors that nobody asked for are never duplicated
    /// here: the sender closes its copies when the message is released.
    pub(crate) fn take(
        &mut self,
        cargo: Option<&mut Fds>,
        kinds: FdKinds,
    ) -> Result<Option<IoData>> {
        // Releases that did not fit the reverse ring go out on every receive call.
        self.core.flush_pending();
        let Some((d, wake)) = self.fwd.try_pop().map_err(corrupt)? else {
            return self.idle(false).map(|_| None);
        };
        let c = &self.core;
        self.idle_polls = 0;
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
        if d.nfds != 0 {
            if let Some(out) = cargo {
                let pidfd = c.link.pidfd.as_fd();
                match fds::take(&d, &mut lots, c.sender, pidfd, c.link.peer_pid, kinds) {
                    Ok(f) => *out = f,
                    Err(e) => {
                        if matches!(e, Error::BadDescriptor(_)) {
                            Counters::add(&c.stats.bad, 1);
                        }
                        c.release(d.token);
                        return Err(e);
                    }
                }
            }
        }
        if self.frags.is_empty() {
            c.release(d.token);
            Counters::bump(&c.stats.messages, 1);
            return Ok(Some(IoData::new()));
        }
        let lots = &self.lots;
        let lot_of = |f: &RawFrag| -> &LotRef {
            lots.iter()
                .find(|(k, _)| *k == (f.slot, f.generation))
                .map(|(_, l)| l)
                .expect("decode resolved every lot")
        };
        // Fragments in the sender's own lot (most, usually all) need no reference of
        // their own: the channel keeps that lot mapped while any message is held.
        let sender = (c.sender.slot, c.sender.generation);
        let mut more: Vec<LotRef> = Vec::new();
        for f in self
            .frags
            .iter()
            .filter(|f| (f.slot, f.generation) != sender)
        {
            let l = lot_of(f);
            if !more.iter().any(|m| m.base() == l.base()) {
                more.push(l.clone());
            }
        }
        // Record forwarded fragments (not in the sender's own lot) in our ledger before
        // anyone can read them, so that no death upstream gets them reused under us. If
        // the ledger is full, copy the fragment instead (counted in `copied_bytes`).
        if self.frags.len() == 1 && more.is_empty() && !self.map_per_transfer {
            return Ok(Some(self.one_fragment(d.token)));
        }
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
            _more_lots: more,
            ledger,
        });
        let mut total = 0;
        // Reused: building the message allocates no fragment vector.
        let mut fragments = std::mem::take(&mut self.out);
        fragments.clear();
        for (i, f) in self.frags.iter().enumerate() {
            let base = lot_of(f);
            total += f.len;
            if copies.contains(&i) {
                let mut v = vec![0u8; f.len as usize];
                // SAFETY: decode checked the span lies inside the lot, which `base` keeps
                // mapped.
                unsafe { copy_shared(base.base().add(f.offset as usize), &mut v) };
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
        let data = IoData::from_fragments(fragments.drain(..));
        self.out = fragments;
        // Only `try_recv` (through `&mut self`) counts messages and bytes.
        Counters::bump(&c.stats.messages, 1);
        Counters::bump(&c.stats.bytes, total);
        Ok(Some(data))
    }

    /// The message `token` of one fragment in the sender's lot, as one segment tagged
    /// with the token (one allocation; see `impl Keep for RecvCore`).
    fn one_fragment(&mut self, token: u64) -> IoData {
        let c = &self.core;
        let f = self.frags[0];
        let base = self
            .lots
            .iter()
            .find(|(k, _)| *k == (f.slot, f.generation))
            .map(|(_, l)| l.base())
            .expect("decode resolved every lot");
        let span = LotSpan {
            lot: LotId {
                slot: f.slot,
                generation: f.generation,
            },
            offset: f.offset,
        };
        let ptr =
            NonNull::new(base.wrapping_add(f.offset as usize)).expect("mappings are non-null");
        // The message's first line is what a reader most often reads first (a header),
        // and it is in the sender's cache: ask for it now, so that its transfer overlaps
        // the making of the segment below instead of following it.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint; it never faults (and `ptr` is inside the mapped
        // lot, as decode checked).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                ptr.as_ptr().cast::<i8>().cast_const(),
            )
        };
        let keep: Arc<dyn Keep> = c.clone();
        // SAFETY: decode checked the span lies inside the sender's lot, which the channel
        // (`keep`) keeps mapped for as long as it lives; the memory is read-only here.
        let seg = unsafe { Segment::from_raw_tagged(ptr, f.len as usize, Some(span), keep, token) };
        // Only `try_recv` (through `&mut self`) counts messages and bytes.
        Counters::bump(&c.stats.messages, 1);
        Counters::bump(&c.stats.bytes, f.len);
        IoData::from_fragment(Fragment::whole(Arc::new(seg)))
    }

    /// The ring was empty: check liveness now and then (or now if `force`).
    ///
    /// A busy-polling receiver calls this between every two looks at the ring, so only
    /// the closed flag (one load of a line that rarely changes) is read on every call;
    /// the rest (collecting the domain's releases, which takes its locks, and reading the
    /// clock for the liveness period) runs on the first empty poll after a message and then
    /// on every [`IDLE_EVERY`]th, so that the poll loop stays short and a message is seen
    /// soon after it lands, while a "receive until empty, then wait" loop still passes the
    /// domain's releases on before it waits.
    pub(super) fn idle(&mut self, force: bool) -> Result<()> {
        let h = self.core.link.header();
        if h.tx_closed.load(Ordering::Acquire) != 0 && !self.fwd.has_data().map_err(corrupt)? {
            self.core.domain.collect_releases();
            self.lots.clear();
            self.core.end_inbound();
            return Err(Error::Disconnected);
        }
        let force = force || std::mem::take(&mut self.recheck);
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if !force && self.idle_polls % IDLE_EVERY != 1 {
            return Ok(());
        }
        // Nothing to receive: pass on releases of what this domain forwarded.
        self.core.domain.collect_releases();
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
    /// fragments then sit at a different address than in the sender. For
    /// `testing::set_map_per_transfer`, a benchmark baseline.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn set_map_per_transfer(&mut self, on: bool) {
        self.map_per_transfer = on;
    }

    /// Receives the next message, blocking until one arrives.
    ///
    /// # Errors
    /// As [`try_recv`](Self::try_recv); never [`Error::Timeout`].
    pub fn recv(&mut self) -> Result<IoData> {
        self.recv_until(None, None)
    }

    /// Receives the next message, blocking at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` passes with no message; otherwise as
    /// [`try_recv`](Self::try_recv).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<IoData> {
        self.recv_until(Some(Instant::now() + timeout), None)
    }

    /// Makes [`recv`](Self::recv) and [`recv_timeout`](Self::recv_timeout) busy-poll
    /// for up to `spin` (never past their timeout) before they sleep: spin, then block.
    /// A consumer with a CPU of its own then takes a message that comes within `spin`
    /// without the sender's wake-up system call and its own return from sleep (each some
    /// microseconds, tens on a virtual machine), at the price of that CPU's time while it
    /// spins. Zero (the default) sleeps at once. Each call spins once, at its start.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-set-spin-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// rx.set_spin(Duration::from_micros(50));
    /// assert_eq!(rx.spin(), Duration::from_micros(50));
    /// let path = a.path(ferry::PathConfig::default())?;
    /// tx.send(&path.alloc(8)?.freeze())?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(5))?.len(), 8);
    /// # Ok(()) }
    /// ```
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Asks a sender that wakes several sleeping receivers after one message (a
    /// publisher with several subscribers) to wake this one after those that did not ask
    /// the same: for a receiver that only relays messages elsewhere (a bridge to other
    /// hosts), so that it does not delay the wake-ups of the consumers on this host.
    /// Off by default; it changes only the order of the wake-ups.
    pub fn set_wake_last(&mut self, last: bool) {
        self.fwd.set_wake_last(last);
    }

    /// How long a blocking receive busy-polls before it sleeps (see
    /// [`set_spin`](Self::set_spin)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn main() -> ferry::Result<()> {
    /// # let group = ferry::Group::open(&format!("doc-spin-{}", std::process::id()))?;
    /// # let (a, b) = (group.join()?, group.join()?);
    /// # let (a2, to) = (a.clone(), b.id());
    /// # let connecting = std::thread::spawn(move || a2.connect(to, Duration::from_secs(5)));
    /// # let mut rx = b.accept(Duration::from_secs(5))?;
    /// # let tx = connecting.join().unwrap()?;
    /// assert_eq!(rx.spin(), Duration::ZERO);   // sleeps at once by default
    /// # drop(tx);
    /// # Ok(()) }
    /// ```
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Blocks until a message arrives or `deadline` (`None`: never) passes, after
    /// busy-polling for [`spin`](Self::spin).
    /// With `cargo`, the message's descriptors too (see
    /// [`try_recv_with_fds`](Self::try_recv_with_fds)).
    fn recv_until(
        &mut self,
        deadline: Option<Instant>,
        mut cargo: Option<&mut Fds>,
    ) -> Result<IoData> {
        let kinds = if cargo.is_some() {
            self.fd_kinds
        } else {
            FdKinds::ANY
        };
        if !self.spin.is_zero() {
            let until = Instant::now()
                .checked_add(self.spin)
                .map_or(deadline, |s| Some(deadline.map_or(s, |d| d.min(s))));
            match self.spin_until(until, cargo.as_deref_mut()) {
                Err(Error::Timeout) => {}
                done => return done,
            }
        }
        loop {
            if let Some(d) = self.take(cargo.as_deref_mut(), kinds)? {
                return Ok(d);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => Some(l),
                    None => return Err(Error::Timeout),
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

    /// True if a message is queued, so that the next receive returns at once; no system
    /// call, nothing taken. For a consumer that busy-polls and then hands the receive to
    /// code that blocks (such as the semantics layer's input calls).
    ///
    /// # Errors
    /// [`Error::BadDescriptor`] if the ring's shared indices are corrupt.
    pub fn has_message(&mut self) -> Result<bool> {
        self.fwd.has_data().map_err(corrupt)
    }

    /// Busy-polls for the next message (no system call while the sender is alive),
    /// giving up after `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when `timeout` passes with no message; otherwise as
    /// [`try_recv`](Self::try_recv).
    pub fn recv_spin(&mut self, timeout: Duration) -> Result<IoData> {
        self.spin_until(Instant::now().checked_add(timeout), None)
    }

    /// Busy-polls until a message arrives or `deadline` (`None`: never) passes; polls
    /// at least once. With `cargo`, the message's descriptors too.
    fn spin_until(
        &mut self,
        deadline: Option<Instant>,
        mut cargo: Option<&mut Fds>,
    ) -> Result<IoData> {
        let kinds = self.fd_kinds;
        loop {
            if let Some(d) = self.take(cargo.as_deref_mut(), kinds)? {
                return Ok(d);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout);
            }
            std::hint::spin_loop();
        }
    }

    /// Prepares to wait on this receiver's fd (epoll, async runtimes). Returns false if
    /// there is something for [`try_recv`](Self::try_recv) to do (do not wait: call it):
    /// a message is waiting, the sender closed its end or died (`try_recv` then reports
    /// it), or releases that did not fit the reverse ring found room. After true, the fd
    /// becomes readable when the next message arrives, the sender closes or dies, or
    /// the sender makes room for pending releases.
    ///
    /// The loop is: `try_recv` until `Ok(None)`, `arm`, wait for the fd only if `arm`
    /// returned true, repeat. Arming costs a `read` of the eventfd and a `poll` of the
    /// sender's pidfd.
    pub fn arm(&mut self) -> Result<bool> {
        // About to wait: pass on releases of what this domain forwarded first (upstream
        // may be waiting for them), as the blocking receive does before it sleeps.
        self.core.domain.collect_releases();
        let link = &self.core.link;
        link.rx_efd.drain();
        // What the drain may have swallowed, or what never notifies: a closed or dead
        // sender. Let try_recv look (and, for a death, at once).
        if link.header().tx_closed.load(Ordering::Acquire) != 0 {
            return Ok(false);
        }
        if link.peer_exited() {
            self.recheck = true;
            return Ok(false);
        }
        // Releases that did not fit: be woken (through rx_efd) when the sender makes
        // room, unless room appeared already.
        let room = self.core.wait_for_room();
        if room == Some(false) {
            return Ok(false);
        }
        let sleep = self.fwd.prepare_sleep().map_err(corrupt)?;
        if !sleep && room.is_some() {
            self.core.cancel_wait_for_room();
        }
        Ok(sleep)
    }

    /// Releases waiting in this receiver because neither the reverse ring nor the
    /// overflow area could take them.
    pub fn pending_releases(&self) -> usize {
        lock(&self.core.rel).pending.len()
    }

    /// Process id of the sender.
    pub fn peer_pid(&self) -> u32 {
        self.core.link.peer_pid
    }

    /// This receiver's counters.
    pub fn stats(&self) -> ChannelStats {
        self.core.stats.snapshot()
    }
}

impl AsFd for Receiver {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wait.as_fd()
    }
}

/// For event loops that take raw descriptors (such as tokio's `AsyncFd`).
impl AsRawFd for Receiver {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.wait.as_raw_fd()
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
