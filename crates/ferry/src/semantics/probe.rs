//! What `ferry calibrate` times of the semantics layer, one mechanism at a time and
//! outside any channel: moving a region's pages out of a mapping and back
//! ([`MoveProbe`]), and the sender's side of an output ([`prepare_output`]). Their costs
//! are the primitives of the [`Calibration`](super::Calibration) the thresholds come from.

use std::ops::Range;

use super::{AppBuffer, Passing, Semantics};
use crate::error::Result;
use crate::iodata::IoData;

/// The sender's side of an output of `range` of `buf` under `s`, without the send: what
/// the receiver would be handed (`None` when the semantics copies), as
/// [`Passing::send_app`] prepares it (for emulated copy: the pages write-protected
/// through the TCOW engine and described). Dropping the result releases it as a
/// receiver's release would.
///
/// # Errors
/// As [`Passing::send_app`], without its channel errors.
pub fn prepare_output(
    passing: &Passing,
    buf: &AppBuffer,
    range: Range<usize>,
    s: Semantics,
) -> Result<Option<IoData>> {
    passing.prepare_output(buf, range, s)
}

/// `ferry calibrate`'s probe of the mechanism: a written region inside a larger shared
/// memfd mapping (a page on either side, as an fbuf lies inside its lot's mapping), whose
/// pages are moved out and back as move and emulated move do it.
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
