//! Taking a region's pages out of a mapping and putting them back, as move does: the
//! step that move's output ([`regions`](super::regions)) and `ferry calibrate`'s probe of
//! it ([`MoveProbe`](super::probe::MoveProbe)) share.

use std::os::fd::BorrowedFd;

use crate::sys::mem::{Access, Discarded, Mapping, Stash};

/// From this size on, move moves a region's pages out of the mapping; below it, it
/// unmaps them: a reservation and a move cost more than `munmap` up to about 256 KiB and
/// far less above (docs/semantics.md, "Page-table moves"; most of the small sizes' cost is
/// the reservation's `mmap`).
pub(crate) const MOVE_FROM: usize = 256 << 10;

/// How move took a region out of the sender's mapping.
pub(crate) enum Out {
    /// Dropped, a placeholder over the span: mapped again from the lot's memfd at release
    /// (small regions).
    Discarded(Discarded),
    /// Moved, page tables and all, to where the stash says (see [`MOVE_FROM`]).
    Moved(Stash),
}

/// Takes `offset..offset+len` out of `map` as move does: moved out from [`MOVE_FROM`] on,
/// dropped below it.
///
/// # Safety
/// No reference into the range may be used until [`put_back`] brought it back.
pub(crate) unsafe fn take_out(map: &Mapping, offset: usize, len: usize) -> std::io::Result<Out> {
    if len >= MOVE_FROM {
        // SAFETY: the caller's promise.
        Ok(Out::Moved(unsafe { map.move_out(offset, len)? }))
    } else {
        // SAFETY: as above.
        Ok(Out::Discarded(unsafe { map.discard(offset, len)? }))
    }
}

/// Brings back what [`take_out`] took from `map`: the pages moved back, or the lot's
/// memfd `fd` (which `map` maps from offset 0) mapped again over the placeholder, from
/// `offset`, where the region lies in both.
pub(crate) fn put_back(
    map: &Mapping,
    fd: BorrowedFd<'_>,
    offset: u64,
    out: Out,
) -> std::io::Result<()> {
    match out {
        Out::Moved(stash) => map.move_back(stash),
        Out::Discarded(d) => map.restore(d, fd, offset, Access::ReadWrite),
    }
}
