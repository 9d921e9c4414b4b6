//! The rendezvous: how a domain hands a peer the descriptors of a new channel through the
//! group's control block, with no daemon.
//!
//! Each slot of the control block has [`MAX_OFFERS`] offer entries, written only by the
//! slot's owner. An entry goes through four states:
//!
//! ```text
//!   FREE --(owner claims it)--> WRITING --(fields written, Release)--> OPEN
//!   OPEN --(the peer it names, CAS)--> TAKEN --(owner, when done)--> FREE
//!   OPEN --(owner withdraws it, CAS)--> FREE
//!   TAKEN --(the peer, that could not use it, CAS)--> REFUSED --(owner)--> FREE
//! ```
//!
//! A peer that refuses an offer writes why (a [`Refusal`]) before it says so, so that the
//! offering domain can tell its caller what was wrong instead of waiting out its timeout.
//!
//! Publishing an offer bumps the header's `offer_seq` and wakes its futex, on which
//! acceptors sleep. An acceptor that took an offer duplicates the listed descriptors from
//! the offering process with `pidfd_getfd`; what those descriptors are and how the two ends
//! agree that the channel is ready is the channel's business (`channel::handshake`). The
//! offering domain frees its entry when the handshake ends, whichever way.
//!
//! A member of the group can write any offer entry (it runs as the same user); acceptors
//! check everything they obtain through one before using it.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::group::{DomainId, Group};
use super::layout::{OfferRaw, MAX_OFFERS, MAX_SLOTS, OFFER_FREE, SLOT_LIVE};
use crate::error::{Error, Result};
use crate::sys::futex;
use crate::until::Until;

const OFFER_WRITING: u32 = 1;
const OFFER_OPEN: u32 = 2;
const OFFER_TAKEN: u32 = 3;
const OFFER_REFUSED: u32 = 4;

/// Why a peer refused an offer, as written in the entry (a code and an argument).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The offering domain's lot descriptor is not a sealed memfd of the lot's size.
    LotFile,
    /// The channel's memory or eventfds are not what they should be.
    ChannelFiles,
    /// The peer still maps the lot of an earlier domain of the offering domain's slot
    /// (this generation) where the offering domain's lot goes.
    AddressHeld(u32),
    /// Anything else.
    Other,
}

impl Refusal {
    /// The refusal that fits the error opening an offer failed with.
    pub fn of(e: &Error) -> Refusal {
        use crate::error::BadDescriptor;
        match e {
            Error::BadDescriptor(BadDescriptor::PeerFile { what: "lot", .. }) => Refusal::LotFile,
            Error::BadDescriptor(BadDescriptor::PeerFile { .. }) | Error::BadChannel(_) => {
                Refusal::ChannelFiles
            }
            Error::LotAddressHeld { held, .. } => Refusal::AddressHeld(*held),
            _ => Refusal::Other,
        }
    }

    fn encode(self) -> (u32, u32) {
        match self {
            Refusal::LotFile => (1, 0),
            Refusal::ChannelFiles => (2, 0),
            Refusal::AddressHeld(g) => (3, g),
            Refusal::Other => (4, 0),
        }
    }

    fn decode(code: u32, arg: u32) -> Refusal {
        match code {
            1 => Refusal::LotFile,
            2 => Refusal::ChannelFiles,
            3 => Refusal::AddressHeld(arg),
            _ => Refusal::Other,
        }
    }

    /// What the offering domain `me` tells its caller.
    pub fn describe(self, me: DomainId) -> String {
        match self {
            Refusal::LotFile => format!(
                "this domain's ({me}) lot descriptor is not a memfd sealed against resizing of the lot's size"
            ),
            Refusal::ChannelFiles => {
                "the channel's memory or eventfds are not what they should be".into()
            }
            Refusal::AddressHeld(g) => format!(
                "it still holds messages of {}.{g}, an earlier domain of slot {}, whose lot is mapped where this domain's ({me}) goes",
                me.slot, me.slot
            ),
            Refusal::Other => "it could not open it".into(),
        }
    }
}

impl OfferRaw {
    /// Frees the entry: called by a process claiming the slot, whose previous owner's
    /// offers mean nothing now.
    pub fn reset(&self) {
        self.state.store(OFFER_FREE, Ordering::Relaxed);
    }
}

/// The descriptors of a channel, as numbers in the offering process.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct OfferFds {
    /// The channel's shared memory.
    pub chan: RawFd,
    /// The eventfd the receiver sleeps on.
    pub rx: RawFd,
    /// The eventfd the sender sleeps on for room.
    pub tx: RawFd,
    /// The eventfd the sender's domain sleeps on for releases.
    pub rel: RawFd,
}

/// An offer this domain published. Dropping it frees the entry.
#[derive(Debug)]
pub(crate) struct Offer<'g> {
    raw: &'g OfferRaw,
}

impl Offer<'_> {
    /// Why the peer refused the offer, if it did.
    pub fn refusal(&self) -> Option<Refusal> {
        // SYNC: pairs with the Release CAS of the refusing peer, after it wrote why.
        (self.raw.state.load(Ordering::Acquire) == OFFER_REFUSED).then(|| {
            Refusal::decode(
                self.raw.why.load(Ordering::Relaxed),
                self.raw.why_arg.load(Ordering::Relaxed),
            )
        })
    }

    /// Takes the offer back unless the peer took it meanwhile. True if withdrawn (the
    /// peer never saw it); false if the peer holds it and may still finish its side.
    pub fn withdraw(&self) -> bool {
        self.raw
            .state
            .compare_exchange(OFFER_OPEN, OFFER_FREE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

impl Drop for Offer<'_> {
    fn drop(&mut self) {
        // SYNC: the next owner of the entry claims it with an AcqRel CAS.
        self.raw.state.store(OFFER_FREE, Ordering::Release);
    }
}

impl Group {
    /// Publishes, in slot `from`'s entries, an offer of `fds` to domain `to`, and wakes
    /// acceptors.
    ///
    /// # Errors
    /// [`Error::TableFull`] if all of the slot's entries are in use.
    pub(crate) fn offer(&self, from: u16, to: DomainId, fds: OfferFds) -> Result<Offer<'_>> {
        let raw = self
            .slot(from)
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
            .ok_or(Error::TableFull {
                table: "offer table",
            })?;
        let put = |a: &AtomicU32, v: u32| a.store(v, Ordering::Relaxed);
        put(&raw.to_slot, to.slot as u32);
        put(&raw.to_generation, to.generation);
        put(&raw.chan_fd, fds.chan as u32);
        put(&raw.rx_efd, fds.rx as u32);
        put(&raw.tx_efd, fds.tx as u32);
        put(&raw.rel_efd, fds.rel as u32);
        // SYNC: pairs with the acceptor's CAS (Acquire) on the entry's state.
        raw.state.store(OFFER_OPEN, Ordering::Release);
        self.header().offer_seq.fetch_add(1, Ordering::AcqRel);
        futex::wake_all(&self.header().offer_seq);
        Ok(Offer { raw })
    }

    /// Waits up to `timeout` for an offer to domain `me` (from slot `from` only, if
    /// given: a domain waiting for one peer's channel leaves the others' offers alone),
    /// takes it and calls `open` with the offering domain and its descriptor numbers. An
    /// offer `open` fails on is refused, telling the offering domain why (see
    /// [`Refusal`]); waiting for any peer, the wait goes on.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no offer could be opened in time; waiting for one peer
    /// (`from`), the error `open` failed with on that peer's offer; the error of `open`
    /// at once if it ran this process out of descriptors or memory (`EMFILE`, `ENFILE`,
    /// `ENOMEM`), which no other offer or later try would get past.
    pub(crate) fn take_offer_from<T>(
        &self,
        me: DomainId,
        from: Option<u16>,
        mut until: Until<'_>,
        mut open: impl FnMut(DomainId, OfferFds) -> Result<T>,
    ) -> Result<T> {
        loop {
            let seq = self.header().offer_seq.load(Ordering::Acquire);
            for s in 0..MAX_SLOTS as u16 {
                let slot = self.slot(s);
                if s == me.slot
                    || from.is_some_and(|f| f != s)
                    || slot.state.load(Ordering::Acquire) != SLOT_LIVE
                {
                    continue;
                }
                for offer in &slot.offers[..MAX_OFFERS] {
                    let mine = offer.state.load(Ordering::Acquire) == OFFER_OPEN
                        && offer.to_slot.load(Ordering::Relaxed) == me.slot as u32
                        && offer.to_generation.load(Ordering::Relaxed) == me.generation;
                    if !mine
                        || offer
                            .state
                            .compare_exchange(
                                OFFER_OPEN,
                                OFFER_TAKEN,
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_err()
                    {
                        continue;
                    }
                    let peer = DomainId {
                        slot: s,
                        generation: slot.generation.load(Ordering::Acquire),
                    };
                    let get = |a: &AtomicU32| a.load(Ordering::Relaxed) as RawFd;
                    let fds = OfferFds {
                        chan: get(&offer.chan_fd),
                        rx: get(&offer.rx_efd),
                        tx: get(&offer.tx_efd),
                        rel: get(&offer.rel_efd),
                    };
                    match open(peer, fds) {
                        Ok(v) => return Ok(v),
                        Err(e) => {
                            let (code, arg) = Refusal::of(&e).encode();
                            offer.why.store(code, Ordering::Relaxed);
                            offer.why_arg.store(arg, Ordering::Relaxed);
                            // SYNC: pairs with the owner's Acquire load in `refusal`.
                            let _ = offer.state.compare_exchange(
                                OFFER_TAKEN,
                                OFFER_REFUSED,
                                Ordering::Release,
                                Ordering::Relaxed,
                            );
                            // Out of descriptors or memory here: no other offer would
                            // open either, and waiting would turn it into a timeout.
                            if from.is_some() || local_shortage(&e) {
                                return Err(e);
                            }
                        }
                    }
                }
            }
            until.check()?;
            futex::wait(
                &self.header().offer_seq,
                seq,
                until.slice().min(Duration::from_millis(50)),
            );
        }
    }
}

/// Whether `e` is this process running out of a resource (descriptors, memory) rather
/// than something the offering peer did.
fn local_shortage(e: &Error) -> bool {
    matches!(e, Error::Io(io) if matches!(
        io.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(std::mem::size_of::<OfferRaw>(), 36);
    }
}
