//! The raw layout of a group's control block: the header, its slots and their offer
//! entries, the reference ledgers, the service area and the activity areas. Plain
//! `#[repr(C)]` structs of atomics and their sizes, shared by the modules that read and
//! write them (`group`, `rendezvous`, `ledger`, `activity`, `lot`); this file uses none
//! of those modules, so the layout sits below all of them.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Domains a group can hold.
pub const MAX_SLOTS: usize = 64;
/// Channels one domain can have offered and not yet accepted at once.
pub const MAX_OFFERS: usize = 8;

/// Address windows per slot (see the `group` module docs).
pub const LOT_WINDOWS: usize = 4;

/// Slot states.
pub(crate) const SLOT_FREE: u32 = 0;
pub(crate) const SLOT_CLAIMING: u32 = 1;
pub(crate) const SLOT_LIVE: u32 = 2;

/// One domain's entry.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SlotRaw {
    pub state: AtomicU32,
    pub generation: AtomicU32,
    pub pid: AtomicU32,
    pub lot_fd: AtomicU32,
    pub start_time: AtomicU64,
    /// Which of the slot's address windows the lot uses (see the `group` module docs).
    pub window: AtomicU32,
    pub offers: [OfferRaw; MAX_OFFERS],
}

/// The control block's header. Plain fields are written once by the creator before it
/// publishes `magic` with Release; joiners read them after an Acquire load of `magic`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct GroupHeader {
    pub magic: AtomicU64,
    pub version: u32,
    pub max_slots: u32,
    pub base_addr: u64,
    pub lot_stride: u64,
    pub lot_size: u64,
    /// Bumped and futex-woken whenever a channel is offered.
    pub offer_seq: AtomicU32,
    /// What pages back the lots (`Pages::raw`).
    pub pages: u32,
    pub slots: [SlotRaw; MAX_SLOTS],
    /// Each slot's reference ledger (see [`super::ledger`]), written only by its owner.
    pub ledgers: [LedgerRaw; MAX_SLOTS],
    /// The service table: words this module reserves and `crate::service` lays out.
    pub services: ServiceArea,
    /// Each slot's published paths and sending channels (see [`super::activity`]),
    /// written only by its owner.
    pub activity: [ActivityRaw; MAX_SLOTS],
}

/// 32-bit words of the control block reserved for the service table (32 KiB).
pub const SERVICE_WORDS: usize = 8 * 1024;

/// The control block's service area: plain atomic words, so that the module that owns
/// the table's layout (`crate::service`, above this layer) needs no `unsafe` to use it,
/// and so that any bit pattern a hostile member writes is a valid value to read.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct ServiceArea(pub [AtomicU32; SERVICE_WORDS]);

/// The offer entry's states.
pub(crate) const OFFER_FREE: u32 = 0;

/// One offer entry in the control block: whom it is for and the descriptor numbers the
/// acceptor duplicates.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct OfferRaw {
    pub(super) state: AtomicU32,
    pub(super) to_slot: AtomicU32,
    pub(super) to_generation: AtomicU32,
    pub(super) chan_fd: AtomicU32,
    pub(super) rx_efd: AtomicU32,
    pub(super) tx_efd: AtomicU32,
    pub(super) rel_efd: AtomicU32,
    /// Why the peer refused it ([`Refusal`], encoded), once `state` is REFUSED.
    pub(super) why: AtomicU32,
    pub(super) why_arg: AtomicU32,
}

/// Forwarded fragments one domain can record at once; beyond this, receivers copy.
pub const HOLDS: usize = 4096;
/// Channels one domain can receive on at once.
pub const INBOUND: usize = 256;

/// One recorded hold. `key` is 0 when free; otherwise it packs the lot and a version
/// that changes on every reuse, so a reader can tell an entry rewritten under it.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct HoldRaw {
    pub(super) key: AtomicU64,
    pub(super) offset: AtomicU64,
    pub(super) len: AtomicU64,
}

/// One domain's ledger, in the group's control block.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct LedgerRaw {
    /// Senders of open channels: `pack(slot, generation)`, 0 when free.
    pub(super) inbound: [AtomicU64; INBOUND],
    /// Entries of `holds` ever used since the slot was claimed: readers scan this many.
    pub(super) high: AtomicU32,
    /// The generation of the slot's previous owner if it held nothing when the slot was
    /// claimed again (anything else otherwise), so that a quarantine can still tell that
    /// a dead domain whose ledger is gone had nothing of it.
    pub(super) clean: AtomicU32,
    pub(super) holds: [HoldRaw; HOLDS],
}

/// Paths one domain can list in the control block; more are counted as unlisted.
pub const MAX_PATHS: usize = 32;
/// Sending channels one domain can list in the control block; more are counted as
/// unlisted.
pub const MAX_CHANNELS: usize = 64;

/// A free entry.
pub(crate) const FREE: u32 = 0;
/// An entry being filled in (readers skip it).
pub(crate) const BUSY: u32 = 0x4255_5359;
/// A path entry in use.
pub(crate) const PATH: u32 = 0x5041_5448;
/// A channel entry in use.
pub(crate) const CHANNEL: u32 = 0x4348_414e;

/// One entry: a tag, a word fixed when the entry is taken (a path's quota, a channel's
/// peer), and two counters (a path's outstanding bytes and fbufs, a channel's messages
/// in flight and sent).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct EntryRaw {
    pub(super) tag: AtomicU32,
    /// A path's pages: `Pages::raw` in the low byte, its collapse fallbacks (saturated)
    /// above.
    pub(super) pages: AtomicU32,
    pub(super) fixed: AtomicU64,
    pub(super) first: AtomicU64,
    pub(super) second: AtomicU64,
}

/// One domain's activity entries in the control block.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct ActivityRaw {
    pub(super) unlisted_paths: AtomicU32,
    pub(super) unlisted_channels: AtomicU32,
    pub(super) paths: [EntryRaw; MAX_PATHS],
    pub(super) channels: [EntryRaw; MAX_CHANNELS],
}

/// Byte offset and length of slot `i`'s activity area inside the control memfd.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn activity_span(i: u16) -> (usize, usize) {
    (
        std::mem::offset_of!(GroupHeader, activity)
            + i as usize * std::mem::size_of::<ActivityRaw>(),
        std::mem::size_of::<ActivityRaw>(),
    )
}

/// Byte offset and length of the service area inside the control memfd.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn service_area_span() -> (usize, usize) {
    (
        std::mem::offset_of!(GroupHeader, services),
        std::mem::size_of::<ServiceArea>(),
    )
}
