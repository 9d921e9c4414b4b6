//! System-allocated buffers ([`SysBuffer`]) and plain move.
//!
//! The system-allocated forms take a buffer the application gives up at output and return
//! a new one at input. A `SysBuffer` on the sending side is an fbuf of this domain's lot
//! (a whole size class, so any cached region of that class can serve a later
//! allocation); on the receiving side it is the sender's pages, read in place through
//! the read-only mapping of the sender's lot, with no copy whatever the size (the
//! size-independent win of every form with no per-byte work).
//!
//! **Move** makes the promise real at the memory level, not only through Rust ownership:
//! at output the region's pages leave the sender's lot mapping, so no pointer the sender
//! kept can read or write them (an access faults). From 256 KiB (`MOVE_FROM`) on they
//! leave by moving, page tables and all, to an address only ferry knows (`mremap`, see
//! `Mapping::move_out` (in the crate's `sys::mem`)): `munmap(2)` of the span
//! visits every page (2.4 – 9 ms at 64 MiB, against 30 – 85 µs for the move); smaller
//! regions are dropped (`Mapping::discard`: an inaccessible placeholder mapped over them),
//! which is cheaper there. Either way the span stays mapped, inaccessible, so no other
//! `mmap` of this process can land in it. Its lot offsets stay reserved until the receiver
//! releases it, and only then are its pages moved back or mapped again from the lot over
//! the placeholder, and the span returned to the path's free list. That is Genie's "unmap
//! at output, map a fresh region
//! at input" on today's Linux; emulated move ([`hide`](super::hide)) moves the pages out the
//! same way but keeps them out until the region is reused, and emulated weak move
//! ([`cache`](super::cache)) moves nothing.
//!
//! Between two domains of one process the receiver reads the sender's pages through the
//! sender's own mapping, so they cannot be taken from the sender alone: move and emulated
//! move then copy instead and count [`Fallback::SameProcess`](super::Fallback).

use std::sync::Arc;

use super::hide::Hidden;
use super::takeout::{put_back, take_out, Out};
use super::Regions;
use crate::error::Result;
use crate::iodata::{Fragment, IoData};
use crate::region::lot::Lot;
use crate::segment::{Keep, Segment};
use crate::sys::mem::Stash;
use crate::sys::page_size;

/// A system-allocated buffer: made by [`Passing::sys_buffer`](super::Passing::sys_buffer)
/// for output (writable), or returned by [`Passing::recv_sys`](super::Passing::recv_sys)
/// (the sender's pages, read-only).
pub struct SysBuffer {
    pub(crate) kind: SysKind,
}

pub(crate) enum SysKind {
    /// An fbuf of this domain's lot, in its write phase: `seg` spans the whole size class.
    Local { seg: Segment, len: usize },
    /// Received data, read in place.
    Received(IoData),
}

impl std::fmt::Debug for SysBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let local = matches!(self.kind, SysKind::Local { .. });
        f.debug_struct("SysBuffer")
            .field("len", &self.len())
            .field("local", &local)
            .finish()
    }
}

impl SysBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.kind {
            SysKind::Local { len, .. } => *len,
            SysKind::Received(d) => d.len(),
        }
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, if they are contiguous (always, for buffers ferry made; a message of
    /// several fragments from a foreign sender is read through [`data`](Self::data)).
    pub fn as_slice(&self) -> Option<&[u8]> {
        match &self.kind {
            SysKind::Local { seg, len } => Some(&seg.as_slice()[..*len]),
            SysKind::Received(d) => match d.fragments() {
                [] => Some(&[]),
                [f] => Some(f.as_slice()),
                _ => None,
            },
        }
    }

    /// The bytes, writable: only a buffer this domain allocated and has not output.
    /// Received buffers are the sender's pages, read-only.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.kind {
            SysKind::Local { seg, len } => Some(&mut seg.as_mut_slice()?[..*len]),
            SysKind::Received(_) => None,
        }
    }

    /// Sets the length (at most the capacity of a local buffer).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) past the capacity,
    /// [`Error::ReceivedBuffer`](crate::Error::ReceivedBuffer) on a received buffer.
    pub fn set_len(&mut self, new: usize) -> Result<()> {
        match &mut self.kind {
            SysKind::Local { seg, len } if new <= seg.len() => {
                *len = new;
                Ok(())
            }
            SysKind::Local { .. } => Err(crate::Error::InvalidArgument(
                "length past the buffer's capacity",
            )),
            SysKind::Received(_) => Err(crate::Error::ReceivedBuffer),
        }
    }

    /// The data as an [`IoData`] (received buffers: the sender's pages, no copy).
    pub fn data(&self) -> IoData {
        match &self.kind {
            SysKind::Local { seg, len } => IoData::from_vec(seg.as_slice()[..*len].to_vec()),
            SysKind::Received(d) => d.clone(),
        }
    }
}

/// What happens to an output region when the receiver releases it.
pub(crate) enum Afterwards {
    /// Move: bring the span's pages back (from where they went, or mapped again from
    /// the lot), and free it.
    Remap(Out),
    /// Emulated move: keep it hidden (its pages where they went) in the domain's queue,
    /// reinstate on reuse.
    Hide(Stash),
    /// Weak move: free it (the path's free list).
    Free,
    /// Emulated weak move: queue it, still mapped, for reuse.
    Cache,
    /// Emulated move over a socket (the kernel needed the pages mapped until now): hide
    /// it (its first `pages` pages, the ones output), then queue it as `Hide` does.
    #[cfg(feature = "uring")]
    HideThenQueue {
        /// Pages output.
        pages: usize,
    },
}

/// Keeps an output region's span reserved until every receiver released it, then does
/// what its semantics says. The lot is the one `regions` holds (one reference counted per
/// output, not two: each clone is a locked instruction before the hand-over).
pub(crate) struct RegionGuard {
    pub seg: Option<Segment>,
    pub then: Afterwards,
    pub regions: Arc<Regions>,
}

impl Keep for RegionGuard {}

impl Drop for RegionGuard {
    fn drop(&mut self) {
        let Some(seg) = self.seg.take() else { return };
        let off = seg.lot_span().expect("fbufs live in the lot").offset;
        let lot = &*self.regions.lot;
        match std::mem::replace(&mut self.then, Afterwards::Free) {
            Afterwards::Remap(out) => {
                let fd = std::os::fd::AsFd::as_fd(lot.fd());
                let ok = put_back(lot.mapping(), fd, off, out).is_ok();
                self.regions.keep_or_lose(seg, ok);
            }
            Afterwards::Hide(stash) => self.regions.hidden(Hidden { seg, stash }),
            Afterwards::Free => drop(seg),
            Afterwards::Cache => self.regions.cache(seg),
            #[cfg(feature = "uring")]
            Afterwards::HideThenQueue { pages } => {
                if let Ok(stash) = super::hide::hide(lot, &seg, pages) {
                    self.regions.count_hidden();
                    self.regions.hidden(Hidden { seg, stash });
                }
            }
        }
    }
}

/// Builds the `IoData` that describes `len` bytes of an output region to the receiver,
/// kept alive (and the span reserved) by `guard`.
pub(crate) fn describe(guard: RegionGuard, len: usize) -> IoData {
    let seg = guard.seg.as_ref().expect("a new guard holds its region");
    let ptr = std::ptr::NonNull::new(seg.as_ptr() as *mut u8).expect("non-null");
    let span = seg.lot_span();
    // SAFETY: the span stays reserved (not reused) while `guard` lives. After move or
    // emulated move its pages are unmapped or hidden in this process: nothing here reads
    // them, since the channel only reads the descriptor's lot span, and a receiver in this
    // same process is refused before hiding (`Fallback::SameProcess`).
    let out = unsafe { Segment::from_raw(ptr, len, span, false, Arc::new(guard)) };
    // One fragment: no list to build.
    IoData::from_fragment(Fragment::whole(Arc::new(out)))
}

/// Takes the first `pages` pages of `seg` (an fbuf of `lot`) out of `lot`'s mapping in
/// this process, for move: from [`MOVE_FROM`](super::takeout::MOVE_FROM) on their page tables move to an address
/// only the returned [`Stash`] knows
/// (`Mapping::move_out` (in the crate's `sys::mem`)), below it they are
/// dropped; either way the buffer's range is inaccessible (and still reserved).
pub(crate) fn unmap(lot: &Lot, seg: &Segment, pages: usize) -> std::io::Result<Out> {
    let off = seg.lot_span().expect("fbufs live in the lot").offset as usize;
    // SAFETY: the application gave the region up (its `SysBuffer` was consumed); the only
    // references left are the descriptor's, which this process does not read (the
    // receiver is another process: `Passing::send_sys` checks before this).
    unsafe { take_out(lot.mapping(), off, pages * page_size()) }
}
