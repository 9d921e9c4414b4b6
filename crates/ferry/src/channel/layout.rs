//! Layout of a channel's shared memory (one memfd, mapped read-write by both ends).
//!
//! ```text
//! offset 0     ChanHeader (256 bytes): magic, ring sizes, the two domains,
//!              rx_ready (futex word), closed flags
//! offset 256   RingCtl of the forward ring (descriptors, sender -> receiver)
//! offset 512   RingCtl of the reverse ring (release tokens, receiver -> sender)
//! offset 1024  [Slot<RawDesc>; fwd_cap]   (128 bytes each: mark + descriptor)
//! then         [Slot<u64>; rev_cap]       (16 bytes each)
//! page-aligned [AtomicU64; OVERFLOW_SLOTS] release tokens that did not fit the reverse
//!              ring, at the index of their token (token + 1; 0 = empty): the sender
//!              collects them itself, so a receiver never has to run again to release
//! ```

use std::ptr::NonNull;

use super::desc::RawDesc;
use super::ring::{RingCtl, Slot};
use std::sync::atomic::{AtomicU32, AtomicU64};

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"FERRYCHN");
pub(crate) const VERSION: u32 = 2;
pub(crate) const MAX_CAP: u32 = 1 << 16;

#[repr(C)]
#[derive(Debug)]
pub(crate) struct ChanHeader {
    pub magic: AtomicU64,
    pub version: u32,
    pub fwd_cap: u32,
    pub rev_cap: u32,
    pub tx_slot: u32,
    pub tx_generation: u32,
    pub rx_slot: u32,
    pub rx_generation: u32,
    /// Set to [`RX_READY`] (and futex-woken) by the receiver once it has mapped the
    /// channel; then, by a publisher, to [`RX_LISTED`] once it sends to this receiver.
    pub rx_ready: AtomicU32,
    pub tx_closed: AtomicU32,
    /// 0 while the receiver is open, then [`RX_CLOSING`] and [`RX_DRAINED`].
    pub rx_closed: AtomicU32,
    pub rx_pid: AtomicU32,
    /// Tokens written to the overflow area since the sender last looked.
    pub overflow: AtomicU32,
    /// Written by the sender before the offer: [`FLAG_LOSSY`] or 0.
    pub flags: u32,
}

/// The forward ring is lossy: the sender may evict its oldest entry (see `ring`).
pub(crate) const FLAG_LOSSY: u32 = 1;

/// `rx_ready`: the receiver mapped the channel.
pub(crate) const RX_READY: u32 = 1;
/// `rx_ready`: a publisher listed the channel among its subscribers' (see
/// `Receiver::wait_listed`).
pub(crate) const RX_LISTED: u32 = 2;

/// The receiver closed its end and is releasing the messages left in the ring.
pub(crate) const RX_CLOSING: u32 = 1;
/// The receiver closed its end, released what was in the ring, and takes nothing more.
pub(crate) const RX_DRAINED: u32 = 2;

/// Token indices the overflow area covers; a release of a higher index waits in the
/// receiver for room in the reverse ring.
pub(crate) const OVERFLOW_SLOTS: usize = 1 << 16;

pub(crate) const FWD_CTL: usize = 256;
pub(crate) const REV_CTL: usize = 512;
pub(crate) const SLOTS: usize = 1024;

/// Total size of a channel with these ring sizes, rounded to pages.
pub(crate) fn channel_bytes(fwd_cap: u32, rev_cap: u32) -> usize {
    overflow_offset(fwd_cap, rev_cap) + OVERFLOW_SLOTS * 8
}

fn overflow_offset(fwd_cap: u32, rev_cap: u32) -> usize {
    let raw = SLOTS
        + fwd_cap as usize * std::mem::size_of::<Slot<RawDesc>>()
        + rev_cap as usize * std::mem::size_of::<Slot<u64>>();
    crate::sys::round_up_pages(raw).expect("bounded sizes")
}

/// Pointers into a mapped channel.
pub(crate) struct Parts {
    pub header: NonNull<ChanHeader>,
    pub fwd_ctl: NonNull<RingCtl>,
    pub rev_ctl: NonNull<RingCtl>,
    pub fwd_slots: NonNull<Slot<RawDesc>>,
    pub rev_slots: NonNull<Slot<u64>>,
    pub overflow: NonNull<AtomicU64>,
}

/// Splits a channel mapping.
///
/// # Safety
/// `base` must point to at least `channel_bytes(fwd_cap, rev_cap)` mapped, page-aligned
/// bytes.
pub(crate) unsafe fn parts(base: NonNull<u8>, fwd_cap: u32, rev_cap: u32) -> Parts {
    let at = |off: usize| {
        // SAFETY: every offset used below lies inside the mapping the caller vouches for.
        unsafe { NonNull::new_unchecked(base.as_ptr().add(off)) }
    };
    Parts {
        header: at(0).cast(),
        fwd_ctl: at(FWD_CTL).cast(),
        rev_ctl: at(REV_CTL).cast(),
        fwd_slots: at(SLOTS).cast(),
        rev_slots: at(SLOTS + fwd_cap as usize * std::mem::size_of::<Slot<RawDesc>>()).cast(),
        overflow: at(overflow_offset(fwd_cap, rev_cap)).cast(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn header_fits() {
        assert!(std::mem::size_of::<ChanHeader>() <= FWD_CTL);
        assert_eq!(std::mem::offset_of!(ChanHeader, rx_ready), 36);
        assert_eq!(std::mem::offset_of!(ChanHeader, flags), 56);
        assert!(std::mem::size_of::<RingCtl>() <= REV_CTL - FWD_CTL);
        assert!(REV_CTL + std::mem::size_of::<RingCtl>() <= SLOTS);
        assert_eq!(channel_bytes(256, 1024) % 4096, 0);
        assert_eq!(overflow_offset(256, 1024) % 4096, 0);
    }
}
