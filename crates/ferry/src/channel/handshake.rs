//! How the two ends meet: the sender makes the channel's memory and eventfds and offers
//! them through the group's control block; the receiver takes the offer, checks what it
//! was given, maps it and says it is ready.

use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::layout::{self, ChanHeader};
use super::link::{check_config, ChannelConfig, Counters, Link};
use super::receiver::{Receiver, RecvCore, RelState};
use super::ring;
use super::sender::{SendCore, SendState, Sender};
use crate::error::{BadDescriptor, Error, Result};
use crate::region::activity::Entry;
use crate::region::domain::{DomainInner, PendingReleases, ReleaseSource};
use crate::region::group::DomainId;
use crate::region::rendezvous::{Offer, OfferFds, Refusal};
use crate::region::{Domain, PathAllocator, PathConfig};
use crate::segment::LotId;
use crate::sys::fd::{check_eventfd, check_memfd, dup_from, memfd, EventFd};
use crate::sys::futex;
use crate::sys::mem::{Access, Mapping};
use crate::until::Until;

/// The two ends of a channel are made through a domain: the sender connects, the receiver
/// accepts.
impl Domain {
    /// Opens a channel to `peer` and waits (up to `timeout`) for it to accept.
    pub fn connect(&self, peer: DomainId, timeout: Duration) -> Result<Sender> {
        connect(
            &self.inner,
            peer,
            ChannelConfig::default(),
            Until::timeout(timeout),
        )
    }

    /// Like [`connect`](Self::connect), with ring sizes and options.
    pub fn connect_with(
        &self,
        peer: DomainId,
        config: ChannelConfig,
        timeout: Duration,
    ) -> Result<Sender> {
        connect(&self.inner, peer, config, Until::timeout(timeout))
    }

    /// Like [`connect_with`](Self::connect_with), waiting as `until` says: up to its
    /// deadline (none: for as long as it takes), and only while its stop check lets it
    /// ([`Error::Interrupted`]; the offer is withdrawn as on a timeout).
    pub fn connect_until(
        &self,
        peer: DomainId,
        config: ChannelConfig,
        until: Until<'_>,
    ) -> Result<Sender> {
        connect(&self.inner, peer, config, until)
    }

    /// Waits (up to `timeout`) for a peer to connect to this domain.
    pub fn accept(&self, timeout: Duration) -> Result<Receiver> {
        accept(&self.inner, None, Until::timeout(timeout))
    }

    /// Like [`accept`](Self::accept), waiting as `until` says (see
    /// [`connect_until`](Self::connect_until)).
    pub fn accept_until(&self, until: Until<'_>) -> Result<Receiver> {
        accept(&self.inner, None, until)
    }

    /// Waits (up to `timeout`) for `peer` to connect to this domain, leaving channels
    /// other domains offer meanwhile for a later [`accept`](Self::accept).
    ///
    /// # Errors
    /// [`Error::Timeout`] if `peer` offered nothing in time, [`Error::PeerGone`] if it is
    /// not a live member.
    pub fn accept_from(&self, peer: DomainId, timeout: Duration) -> Result<Receiver> {
        self.accept_from_until(peer, Until::timeout(timeout))
    }

    /// Like [`accept_from`](Self::accept_from), waiting as `until` says (see
    /// [`connect_until`](Self::connect_until)).
    pub fn accept_from_until(&self, peer: DomainId, until: Until<'_>) -> Result<Receiver> {
        if !self.inner.group.domain_live(LotId {
            slot: peer.slot,
            generation: peer.generation,
        }) {
            return Err(Error::PeerGone { pid: 0 });
        }
        accept(&self.inner, Some(peer), until)
    }
}

/// Opens a channel from `domain` to `peer`; see [`Domain::connect`](crate::Domain::connect).
fn connect(
    domain: &Arc<DomainInner>,
    peer: DomainId,
    config: ChannelConfig,
    mut until: Until<'_>,
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
        (*h).flags = if config.lossy { layout::FLAG_LOSSY } else { 0 };
        (*h).magic.store(layout::MAGIC, Ordering::Release);
    }
    let link = Link {
        _map: map,
        parts,
        rx_efd: EventFd::new_shared()?,
        tx_efd: EventFd::new_shared()?,
        rel_efd: EventFd::new_shared()?,
        peer_pid,
        pidfd,
        _chan_fd: chan_fd,
    };

    // Offer it in our slot, and wait for the peer to map it and say so.
    let offer = group.offer(
        me.slot,
        peer,
        OfferFds {
            chan: link._chan_fd.as_raw_fd(),
            rx: link.rx_efd.as_raw_fd(),
            tx: link.tx_efd.as_raw_fd(),
            rel: link.rel_efd.as_raw_fd(),
        },
    )?;
    let refused = |why: Refusal| Error::Refused {
        pid: peer_pid,
        why: why.describe(DomainId {
            slot: me.slot,
            generation: me.generation,
        }),
    };
    match wait_ready(&link, &offer, &mut until) {
        Ok(Ready::Yes) => {}
        Ok(Ready::Refused(why)) => return Err(refused(why)),
        Err(gave_up) => {
            if offer.withdraw() {
                return Err(if link.peer_exited() {
                    Error::PeerGone { pid: peer_pid }
                } else {
                    gave_up
                });
            }
            // The peer took it at the last moment: give it a little longer (not to be
            // interrupted: the peer is mapping the channel).
            let mut grace = Until::timeout(Duration::from_secs(1));
            match wait_ready(&link, &offer, &mut grace) {
                Ok(Ready::Yes) => {}
                Ok(Ready::Refused(why)) => return Err(refused(why)),
                Err(_) => {
                    return Err(if link.peer_exited() {
                        Error::PeerGone { pid: peer_pid }
                    } else {
                        Error::Timeout
                    })
                }
            }
        }
    }
    drop(offer);

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
    let meta = PathAllocator::unlisted(
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
            out: 0,
            free_tokens: Vec::new(),
            last_check: Instant::now(),
            rev_corrupt: false,
            undrained: 0,
            by_pos: vec![0; config.capacity as usize],
            rel_sleepers: 0,
            tx_sleepers: 0,
        }),
        gone: AtomicBool::new(false),
        lossy: config.lossy,
        stats: Counters::default(),
        entry: Entry::channel(domain.group.clone(), domain.lot.id.slot, peer),
    });
    let weak: std::sync::Weak<dyn ReleaseSource> = Arc::downgrade(&core) as _;
    domain.add_source(weak);
    Ok(Sender::new(core))
}

/// How the receiver answered.
enum Ready {
    /// It mapped the channel.
    Yes,
    /// It took the offer and refused it.
    Refused(Refusal),
}

/// Waits until the receiver says (in the channel header) that it mapped the channel, or
/// (in the offer) that it refused it. An error: `until` gave up or the receiver died.
fn wait_ready(link: &Link, offer: &Offer<'_>, until: &mut Until<'_>) -> Result<Ready> {
    link.wait_ready_word(until, |now| {
        if now == layout::RX_READY {
            Some(Ok(Ready::Yes))
        } else {
            offer.refusal().map(|why| Ok(Ready::Refused(why)))
        }
    })
}

/// Waits for a channel offered to `domain`; see [`Domain::accept`](crate::Domain::accept).
fn accept(domain: &Arc<DomainInner>, from: Option<DomainId>, until: Until<'_>) -> Result<Receiver> {
    let me = domain.lot.id;
    let me = DomainId {
        slot: me.slot,
        generation: me.generation,
    };
    domain
        .group
        .take_offer_from(me, from.map(|f| f.slot), until, |peer, fds| {
            if from.is_some_and(|f| f != peer) {
                return Err(Error::PeerGone { pid: 0 });
            }
            open_offer(domain, peer, fds)
        })
}

fn open_offer(domain: &Arc<DomainInner>, peer: DomainId, fds: OfferFds) -> Result<Receiver> {
    let (peer_pid, pidfd) = domain.group.peer_pidfd(peer)?;
    let bad = |what: &'static str, why: String| {
        Error::BadDescriptor(BadDescriptor::PeerFile {
            slot: peer.slot,
            generation: peer.generation,
            pid: peer_pid,
            what,
            why,
        })
    };
    // pidfd_getfd opens nothing, so taking them cannot block; each is checked before
    // anything reads, writes or maps it.
    let get = |fd| dup_from(pidfd.as_fd(), fd);
    let chan_fd = get(fds.chan)?;
    let len = check_memfd(chan_fd.as_fd()).map_err(|why| bad("channel memory", why))? as usize;
    let mut efds = [fds.rx, fds.tx, fds.rel].into_iter().map(|n| {
        let fd = get(n)?;
        check_eventfd(fd.as_fd()).map_err(|why| bad("eventfd", why))?;
        Ok::<_, Error>(EventFd::from_owned(fd))
    });
    let mut next = || efds.next().expect("three eventfds");
    let (rx_efd, tx_efd, rel_efd) = (next()?, next()?, next()?);
    if len < layout::SLOTS || len > layout::channel_bytes(layout::MAX_CAP, layout::MAX_CAP) {
        return Err(Error::BadChannel("its memory has a bad size"));
    }
    // Unsealed, the sender could truncate it under our mapping (SIGBUS on the next read).
    if crate::sys::seal::check_fixed_size(chan_fd.as_fd(), len as u64).is_err() {
        return Err(Error::BadChannel("its memory's size is not sealed"));
    }
    let map = Mapping::shared(chan_fd.as_fd(), len, Access::ReadWrite)?;
    let base = NonNull::new(map.as_ptr()).expect("non-null");
    // SAFETY: at least the header lies inside the mapping (len >= SLOTS).
    let h = unsafe { &*base.as_ptr().cast::<ChanHeader>() };
    if h.magic.load(Ordering::Acquire) != layout::MAGIC || h.version != layout::VERSION {
        return Err(Error::BadChannel("bad magic or version"));
    }
    let (fwd_cap, rev_cap, flags) = (h.fwd_cap, h.rev_cap, h.flags);
    let me = domain.lot.id;
    if check_config(&ChannelConfig {
        capacity: fwd_cap,
        release_capacity: rev_cap,
        lossy: false,
    })
    .is_err()
        || flags & !layout::FLAG_LOSSY != 0
        || layout::channel_bytes(fwd_cap, rev_cap) != len
        || h.rx_slot != me.slot as u32
        || h.rx_generation != me.generation
        || h.tx_slot != peer.slot as u32
    {
        return Err(Error::BadChannel("its header does not match its offer"));
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
            ring::consumer(link.parts.fwd_ctl, link.parts.fwd_slots, fwd_cap as u64)
                .with_lossy(flags & layout::FLAG_LOSSY != 0),
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
    let inbound = domain.add_inbound(peer).ok_or(Error::TableFull {
        table: "inbound-channel ledger",
    })?;
    link.header()
        .rx_pid
        .store(std::process::id(), Ordering::Relaxed);
    // SYNC: pairs with the sender's Acquire load of rx_ready in `connect`.
    link.header()
        .rx_ready
        .store(layout::RX_READY, Ordering::Release);
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
        wait: super::receiver::wait_set(&core.link)?,
        core,
        fwd,
        last_check: Instant::now(),
        map_per_transfer: false,
        lots: Vec::new(),
        frags: Vec::new(),
        recheck: false,
        idle_polls: 0,
        out: Vec::new(),
        spin: Duration::ZERO,
        fd_kinds: super::fds::FdKinds::default(),
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::region::layout::MAX_OFFERS;
    use crate::region::Group;

    /// Memory offered as a channel that is not one is refused with `BadChannel` (accept
    /// skips such offers, so this opens them directly), and a domain that offers more
    /// channels at once than its slot has entries for gets `TableFull`.
    #[test]
    fn foreign_memory_is_refused_and_offers_run_out() {
        let g = Group::open(&format!("unit-badchan-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let efd = EventFd::new().unwrap();
        let size = layout::channel_bytes(4, 4) as u64;
        let unsealed = memfd("not-a-channel", size).unwrap();
        let sealed = memfd("not-a-channel", size).unwrap();
        crate::sys::seal::fix_size(sealed.as_fd()).unwrap();
        let fds = |chan: &std::os::fd::OwnedFd| OfferFds {
            chan: chan.as_raw_fd(),
            rx: efd.as_raw_fd(),
            tx: efd.as_raw_fd(),
            rel: efd.as_raw_fd(),
        };
        for (chan, why) in [(&unsealed, "sealed"), (&sealed, "magic")] {
            let r = open_offer(&b.inner, a.id(), fds(chan));
            assert!(
                matches!(&r, Err(Error::BadChannel(w)) if w.contains(why)),
                "{r:?}"
            );
        }
        let group = &a.inner.group;
        let offers: Vec<_> = (0..MAX_OFFERS)
            .map(|_| group.offer(a.id().slot, b.id(), fds(&sealed)).unwrap())
            .collect();
        let r = group.offer(a.id().slot, b.id(), fds(&sealed));
        assert!(
            matches!(
                r,
                Err(Error::TableFull {
                    table: "offer table"
                })
            ),
            "{:?}",
            r.err()
        );
        // Withdrawn offers free their entries.
        drop(offers);
        drop(group.offer(a.id().slot, b.id(), fds(&sealed)).unwrap());
    }

    /// Descriptors that are not what an offer promises are refused, naming the peer and
    /// what each one is, before anything reads, writes, maps or opens them: a pipe or a
    /// blocking eventfd as an eventfd, a FIFO or an eventfd as the channel's memory.
    #[test]
    fn offered_descriptors_of_the_wrong_kind_are_refused() {
        use rustix::event::{eventfd, EventfdFlags};
        let g = Group::open(&format!("unit-badfds-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let efd = EventFd::new().unwrap();
        let chan = memfd("chan", layout::channel_bytes(4, 4) as u64).unwrap();
        crate::sys::seal::fix_size(chan.as_fd()).unwrap();
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        let blocking = eventfd(0, EventfdFlags::CLOEXEC).unwrap();
        let cases: [(i32, i32, &str, &str); 4] = [
            (
                chan.as_raw_fd(),
                pipe_r.as_raw_fd(),
                "eventfd",
                "a FIFO, not an eventfd",
            ),
            (
                chan.as_raw_fd(),
                blocking.as_raw_fd(),
                "eventfd",
                "blocking mode",
            ),
            (
                pipe_r.as_raw_fd(),
                efd.as_raw_fd(),
                "channel memory",
                "a FIFO, not a memfd",
            ),
            (
                efd.as_raw_fd(),
                efd.as_raw_fd(),
                "channel memory",
                "an anonymous inode",
            ),
        ];
        for (c, e, what, why) in cases {
            let fds = OfferFds {
                chan: c,
                rx: e,
                tx: efd.as_raw_fd(),
                rel: efd.as_raw_fd(),
            };
            let r = open_offer(&b.inner, a.id(), fds);
            let want = format!(
                "peer {} (pid {}): its {what} descriptor is",
                a.id(),
                std::process::id()
            );
            let msg = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                matches!(r, Err(Error::BadDescriptor(BadDescriptor::PeerFile { .. })))
                    && msg.contains(&want)
                    && msg.contains(why),
                "{msg}"
            );
        }
    }

    /// The receiver checks the sender's flags like the rest of the header: a flag it
    /// does not know is refused, the lossy flag is taken.
    #[test]
    fn unknown_header_flags_are_refused() {
        let g = Group::open(&format!("unit-flags-{}", std::process::id())).unwrap();
        let (a, b) = (g.join().unwrap(), g.join().unwrap());
        let efd = EventFd::new().unwrap();
        let size = layout::channel_bytes(4, 4);
        let chan = memfd("flags", size as u64).unwrap();
        crate::sys::seal::fix_size(chan.as_fd()).unwrap();
        let map = Mapping::shared(chan.as_fd(), size, Access::ReadWrite).unwrap();
        let fds = OfferFds {
            chan: chan.as_raw_fd(),
            rx: efd.as_raw_fd(),
            tx: efd.as_raw_fd(),
            rel: efd.as_raw_fd(),
        };
        let (tx, rx) = (a.inner.lot.id, b.inner.lot.id);
        for (flags, ok) in [(2, false), (1 << 31, false), (layout::FLAG_LOSSY, true)] {
            // SAFETY: the header lies at the start of this fresh mapping, which only this
            // test writes; the receiver reads it after the Release store of `magic`.
            unsafe {
                let h = map.as_ptr().cast::<ChanHeader>();
                (*h).version = layout::VERSION;
                (*h).fwd_cap = 4;
                (*h).rev_cap = 4;
                (*h).tx_slot = tx.slot as u32;
                (*h).tx_generation = tx.generation;
                (*h).rx_slot = rx.slot as u32;
                (*h).rx_generation = rx.generation;
                (*h).flags = flags;
                (*h).magic.store(layout::MAGIC, Ordering::Release);
            }
            let r = open_offer(&b.inner, a.id(), fds);
            if ok {
                assert!(r.is_ok(), "{:?}", r.err());
            } else {
                assert!(
                    matches!(&r, Err(Error::BadChannel(w)) if w.contains("header")),
                    "flags {flags:#x}: {:?}",
                    r.err()
                );
            }
        }
    }
}
