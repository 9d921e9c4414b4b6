//! Region hiding, for emulated move.
//!
//! Emulated move keeps move's promise (after output the sender can neither read nor
//! write the region) without unmapping it: the region's pages, page tables and all, are
//! moved out of the sender's lot mapping to an address only ferry knows
//! (`Mapping::move_out` (in the crate's `sys::mem`), an `mremap`), so any access
//! through the buffer's address faults (`SIGSEGV`). When the receiver releases the region
//! it goes, still hidden, to this domain's queue of hidden regions; the next
//! system-allocated buffer of its size class (an allocation for output, or a received
//! buffer made writable) reinstates it (moved back, still populated) instead of taking a
//! fresh span.
//!
//! Why a move and not `mprotect(PROT_NONE)`: `mprotect` visits every page table entry of
//! the range both ways (docs/semantics.md: 5.9–8.3 µs at 4 KiB and 40–57 µs at 1 MiB,
//! 1.3 ms to hide 64 MiB and 5.2 ms to make it read-write again), while the move hands
//! over whole 2 MiB tables (64 MiB: 30 – 85 µs out, 17 – 45 µs back). The pages it moves
//! stay readable and writable at their private address, which no pointer of the
//! application's can reach. A fixed cost remains (a reservation and two `mremap` calls,
//! tens of µs), so emulated move keeps a threshold
//! ([`Thresholds::emulated_move`](super::Thresholds)): below it, it copies into a fresh
//! fbuf and hands that over instead.

use crate::segment::Segment;
use crate::sys::mem::Stash;

/// A region hidden at output, released by its receivers, waiting for reuse.
pub(crate) struct Hidden {
    /// The fbuf (whole size class).
    pub seg: Segment,
    /// Where its first `len` bytes went.
    pub stash: Stash,
}

/// Hides `pages` pages from the start of `seg` (an fbuf of `lot`'s own mapping).
pub(crate) fn hide(
    lot: &crate::region::lot::Lot,
    seg: &Segment,
    pages: usize,
) -> std::io::Result<Stash> {
    let off = seg.lot_span().expect("fbufs live in the lot").offset as usize;
    // SAFETY: the caller gave the region up (the `SysBuffer` was consumed) and nothing in
    // this process reads it until it is reinstated.
    unsafe { lot.mapping().move_out(off, pages * crate::sys::page_size()) }
}

/// Makes a hidden region readable and writable again (its pages moved back): the fbuf,
/// or, if that failed, the fbuf to keep out of circulation for good.
pub(crate) fn reinstate(
    lot: &crate::region::lot::Lot,
    h: Hidden,
) -> std::result::Result<Segment, Segment> {
    match lot.mapping().move_back(h.stash) {
        Ok(()) => Ok(h.seg),
        Err(_) => Err(h.seg),
    }
}
