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

/// `ferry calibrate`'s probe of the mechanism: a written region inside a larger shared
/// memfd mapping (a page on either side, as an fbuf lies inside its lot's mapping), whose
/// pages are moved out and back as move and emulated move do it. Not part of the
/// supported API: reached through `testing::MoveProbe`.
#[cfg(feature = "testing")]
pub struct MoveProbe {
    fd: std::os::fd::OwnedFd,
    map: crate::sys::mem::Mapping,
    len: usize,
    /// Taken out as move does it (small regions unmapped and mapped again, see
    /// `takeout::MOVE_FROM`), or always moved, as hiding does.
    as_move: bool,
    /// While the region is out: how it went.
    out: Option<super::takeout::Out>,
}

#[cfg(feature = "testing")]
impl MoveProbe {
    /// A region of `len` bytes (a page multiple), every page written once, taken out as
    /// emulated move hides it.
    pub fn new(len: usize) -> crate::Result<MoveProbe> {
        Self::make(len, false)
    }

    /// As [`new`](Self::new), taken out as move's output does it.
    pub fn for_move(len: usize) -> crate::Result<MoveProbe> {
        Self::make(len, true)
    }

    fn make(len: usize, as_move: bool) -> crate::Result<MoveProbe> {
        let pg = crate::sys::page_size();
        assert!(len > 0 && len % pg == 0, "a whole number of pages");
        let fd = crate::sys::fd::memfd("ferry-move-probe", (len + 2 * pg) as u64)?;
        let map = crate::sys::mem::Mapping::shared(
            std::os::fd::AsFd::as_fd(&fd),
            len + 2 * pg,
            crate::sys::mem::Access::ReadWrite,
        )?;
        let p = MoveProbe {
            fd,
            map,
            len,
            as_move,
            out: None,
        };
        p.dirty();
        Ok(p)
    }

    /// Writes one byte in every page of the region (its entries present and dirty, as an
    /// application leaves a buffer it output). Does nothing while it is out.
    pub fn dirty(&self) {
        if self.out.is_some() {
            return;
        }
        let pg = crate::sys::page_size();
        for off in (pg..pg + self.len).step_by(pg) {
            // SAFETY: inside our own read-write mapping, which is mapped here (not taken
            // out); nothing else refers to it.
            unsafe { self.map.as_ptr().add(off).write_volatile(0x5b) };
        }
    }

    /// Takes the region's pages out (what hiding and move's output cost).
    pub fn move_out(&mut self) -> crate::Result<()> {
        assert!(self.out.is_none(), "taken out already");
        let pg = crate::sys::page_size();
        self.out = Some(if self.as_move {
            // SAFETY: no reference into the region exists (only `dirty` writes it, and it
            // does nothing while the region is out).
            unsafe { super::takeout::take_out(&self.map, pg, self.len)? }
        } else {
            // SAFETY: as above.
            let stash = unsafe { self.map.move_out(pg, self.len)? };
            super::takeout::Out::Moved(stash)
        });
        Ok(())
    }

    /// Brings them back (what reinstating and move's release cost).
    pub fn move_back(&mut self) -> crate::Result<()> {
        let out = self.out.take().expect("taken out first");
        let fd = std::os::fd::AsFd::as_fd(&self.fd);
        super::takeout::put_back(&self.map, fd, crate::sys::page_size() as u64, out)?;
        Ok(())
    }
}
