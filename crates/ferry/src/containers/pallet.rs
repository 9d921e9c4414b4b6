//! One pallet: a page-multiple memfd with a valid-data range.
//!
//! ```text
//!  memfd of `size` bytes (a page multiple, F_SEAL_SHRINK | F_SEAL_GROW from birth)
//!  +--------------+=====================+----------------+
//!  | unspecified  |     valid data      |  unspecified   |
//!  +--------------+=====================+----------------+
//!  0          valid.start          valid.end          size
//! ```
//!
//! Bytes outside the valid range are zeros on a fresh pallet and earlier contents of the
//! same pallet otherwise; only valid bytes are ever emptied.

use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{BadDescriptor, Error, Result};
use crate::sys::{self, seal::SealFlags, splice::FdKind};

/// Seals every ferry pallet carries from birth: its size never changes, so a mapping of
/// it can never fault with `SIGBUS` because another holder truncated it.
pub(crate) const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// Seals that make a pallet immutable ([`Container::seal`](super::Container::seal)).
pub(crate) const IMMUTABLE: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW);

/// A page-multiple memfd with a valid-data range: the unit a container is made of.
///
/// Pallets live inside a [`Container`](super::Container); get at one with
/// [`Container::pallet`](super::Container::pallet).
#[derive(Debug)]
pub struct Pallet {
    pub(crate) fd: OwnedFd,
    pub(crate) size: usize,
    pub(crate) valid: Range<usize>,
    /// Sealed with [`IMMUTABLE`] (as far as this process knows; see [`Pallet::is_sealed`]).
    pub(crate) sealed: bool,
    /// Its pages were handed to a pipe or socket by reference and may still be there.
    pub(crate) lent: bool,
    /// A mapping of it exists right now (an unload guard is alive, or was forgotten).
    pub(crate) unloaded: bool,
    /// Where it was mapped last time in this process.
    pub(crate) hint: Option<usize>,
    /// (device, inode): identity of the memfd, key of the address cache.
    pub(crate) id: (u64, u64),
}

impl Pallet {
    /// A fresh pallet of `size` bytes (rounded up to pages), reading as zeros.
    pub(crate) fn new(size: usize) -> Result<Self> {
        let size = sys::round_up_pages(size.max(1))
            .ok_or(Error::InvalidArgument("pallet size overflows"))?;
        let fd = sys::fd::memfd("ferry-pallet", size as u64)?;
        sys::seal::add_seals(fd.as_fd(), SIZE_SEALS)?;
        let info = sys::splice::identify(fd.as_fd())?;
        Ok(Pallet {
            fd,
            size,
            valid: 0..0,
            sealed: false,
            lent: false,
            unloaded: false,
            hint: None,
            id: (info.dev, info.ino),
        })
    }

    /// Adopts a descriptor that arrived from another domain (process `pid`, 0 if
    /// unknown), after checking it: a memfd on shmem (see
    /// [`check_memfd`](sys::fd::check_memfd): nothing about it can block or fault),
    /// exactly `size` bytes, `size` a nonzero page
    /// multiple, `valid` inside it, and sealed if the sender said so. Its size is then
    /// pinned with `F_SEAL_SHRINK | F_SEAL_GROW` (refused if the sender sealed the seals
    /// without them).
    pub(crate) fn adopt(
        index: usize,
        pid: u32,
        fd: OwnedFd,
        size: u64,
        valid: Range<u64>,
        claims_sealed: bool,
        lent: bool,
    ) -> Result<Self> {
        let slot = u16::try_from(index).unwrap_or(u16::MAX);
        let bad = |what| Error::BadDescriptor(BadDescriptor::Malformed(what));
        let page = sys::page_size() as u64;
        if size == 0 || size % page != 0 || usize::try_from(size).is_err() {
            return Err(bad("pallet size is not a nonzero page multiple"));
        }
        if valid.start > valid.end || valid.end > size {
            return Err(BadDescriptor::OutOfBounds {
                slot,
                offset: valid.start,
                len: valid.end.wrapping_sub(valid.start),
            }
            .into());
        }
        // Checked first: a file of another kind, or on another file system, is not even
        // examined further.
        sys::fd::check_memfd(fd.as_fd()).map_err(|why| {
            Error::BadDescriptor(BadDescriptor::PeerFile {
                slot,
                generation: 0,
                pid,
                what: "pallet",
                why,
            })
        })?;
        let info = sys::splice::identify(fd.as_fd())?;
        if info.kind != FdKind::File {
            return Err(bad("pallet descriptor is not a regular file"));
        }
        let seals = sys::seal::seals(fd.as_fd()).map_err(|_| bad("pallet is not a memfd"))?;
        if info.size != size {
            return Err(bad("pallet memfd size differs from the header"));
        }
        if claims_sealed && !seals.contains(IMMUTABLE) {
            return Err(bad("pallet claimed sealed but is not"));
        }
        if !seals.contains(SIZE_SEALS) {
            sys::seal::add_seals(fd.as_fd(), SIZE_SEALS)
                .map_err(|_| bad("pallet size cannot be pinned"))?;
        }
        Ok(Pallet {
            fd,
            size: size as usize,
            valid: valid.start as usize..valid.end as usize,
            sealed: seals.contains(IMMUTABLE),
            lent,
            unloaded: false,
            hint: None,
            id: (info.dev, info.ino),
        })
    }

    /// Size in bytes (a page multiple).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The valid-data range: only these bytes are emptied or shipped as meaningful.
    pub fn valid(&self) -> Range<usize> {
        self.valid.clone()
    }

    /// Asks the kernel whether the memfd carries `F_SEAL_WRITE | F_SEAL_SHRINK |
    /// F_SEAL_GROW` (`fcntl(F_GET_SEALS)`). A receiver checks this before trusting bytes
    /// that a producer still holding the fd could otherwise change.
    pub fn is_sealed(&self) -> Result<bool> {
        Ok(sys::seal::seals(self.fd.as_fd())?.contains(IMMUTABLE))
    }

    /// True if the pallet's pages were lent to a pipe or socket by an
    /// [`empty`](super::Container::empty) and may still be referenced there. The next
    /// fill or writable unload first moves the pallet to a fresh memfd.
    pub fn is_lent(&self) -> bool {
        self.lent
    }

    /// True while the pallet is mapped (unloaded) in this process.
    pub fn is_unloaded(&self) -> bool {
        self.unloaded
    }

    /// The memfd, borrowed. Writing through it bypasses the valid-range bookkeeping.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Replaces a lent pallet's memfd with a fresh one so that later writes cannot reach
    /// pages a pipe or socket still references. With `keep_valid`, the valid bytes are
    /// copied across first (`sendfile(2)` memfd to memfd); otherwise the new pallet reads
    /// as zeros and the valid range becomes empty.
    pub(crate) fn unlend(&mut self, keep_valid: bool) -> Result<()> {
        if !self.lent {
            return Ok(());
        }
        let mut fresh = Pallet::new(self.size)?;
        fresh.hint = self.hint;
        if keep_valid && !self.valid.is_empty() {
            sys::splice::seek_to(fresh.fd.as_fd(), self.valid.start as u64)?;
            let mut off = self.valid.start as u64;
            let end = self.valid.end as u64;
            while off < end {
                let left = (end - off) as usize;
                let n =
                    sys::splice::sendfile(fresh.fd.as_fd(), self.fd.as_fd(), Some(&mut off), left)?;
                if n == 0 {
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "pallet shorter than its valid range",
                    )));
                }
            }
            fresh.valid = self.valid.clone();
        }
        *self = fresh;
        Ok(())
    }
}
