//! Region hiding, for emulated move.
//!
//! Emulated move keeps move's promise (after output the sender can neither read nor
//! write the region) without unmapping it: the region's pages are made inaccessible in the
//! sender's lot mapping with `mprotect(PROT_NONE)`, so any access faults (`SIGSEGV`). When
//! the receiver releases the region it goes, still hidden, to this domain's queue of
//! hidden regions; the next system-allocated buffer of its size class (an allocation for
//! output, or a received buffer made writable) reinstates it (`mprotect` read-write)
//! instead of taking a fresh span.
//!
//! Why: no userfaultfd read-protect exists, so hiding is `mprotect` (GENIE.md: hide and
//! reinstate cost 5.9–8.3 µs at 4 KiB and 40–57 µs at 1 MiB, anonymous or memfd alike).
//! That per-page cost is why emulated move has a threshold like TCOW's
//! ([`Thresholds::emulated_move`](super::Thresholds), 1 MiB by default): below it,
//! emulated move copies into a fresh fbuf and hands that over instead.

use crate::segment::Segment;

/// A region hidden at output, released by its receivers, waiting for reuse.
pub(crate) struct Hidden {
    /// The fbuf (whole size class).
    pub seg: Segment,
    /// Pages hidden from its start.
    pub pages: usize,
}

/// Hides `pages` pages from the start of `seg` (an fbuf of `lot`'s own mapping).
pub(crate) fn hide(
    lot: &crate::region::lot::Lot,
    seg: &Segment,
    pages: usize,
) -> std::io::Result<()> {
    let off = seg.lot_span().expect("fbufs live in the lot").offset as usize;
    // SAFETY: the caller gave the region up (the `SysBuffer` was consumed) and nothing in
    // this process reads it until it is reinstated.
    unsafe { lot.mapping().hide(off, pages * crate::sys::page_size()) }
}

/// Makes a hidden region readable and writable again.
pub(crate) fn reinstate(lot: &crate::region::lot::Lot, h: &Hidden) -> std::io::Result<()> {
    let off = h.seg.lot_span().expect("fbufs live in the lot").offset as usize;
    lot.mapping().protect(
        off,
        h.pages * crate::sys::page_size(),
        crate::sys::mem::Access::ReadWrite,
    )
}
