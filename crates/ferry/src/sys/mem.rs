//! Memory mappings (`mmap(2)`, `munmap(2)`, `mprotect(2)`).

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::mm::{mmap, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};

use super::count;
use crate::error::{Error, Result};

/// Access a mapping grants.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

impl Access {
    fn prot(self) -> ProtFlags {
        match self {
            Access::Read => ProtFlags::READ,
            Access::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        }
    }
}

/// A shared file mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Unique in this process: the tokens of parts taken out ([`Stash`], [`Discarded`])
    /// name it, so that they go back only into the mapping they came from (not into a
    /// later one at the same address).
    #[cfg(feature = "semantics")]
    id: u64,
}

/// The next [`Mapping`]'s `id`.
#[cfg(feature = "semantics")]
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

// SAFETY: a `Mapping` is an owned address range; it gives out only raw pointers, and
// whoever dereferences them synchronises access.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes only the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from offset 0, `MAP_SHARED`, wherever the kernel chooses.
    pub fn shared(fd: BorrowedFd<'_>, len: usize, access: Access) -> io::Result<Self> {
        Self::shared_at(fd, 0, len, access)
    }

    /// Maps `len` bytes of `fd` from `offset` (a page multiple), `MAP_SHARED`, wherever
    /// the kernel chooses.
    pub fn shared_at(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        access: Access,
    ) -> io::Result<Self> {
        count();
        // SAFETY: a null hint without MAP_FIXED cannot replace any existing mapping.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                access.prot(),
                MapFlags::SHARED,
                fd,
                offset,
            )?
        };
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap never returns null"),
            len,
            #[cfg(feature = "semantics")]
            id: next_id(),
        })
    }

    /// Maps `len` bytes of `fd` from `offset` at exactly `addr`, `MAP_SHARED` with
    /// `MAP_FIXED_NOREPLACE`: if anything is mapped there already the call fails with
    /// [`Error::AddressInUse`] and nothing is replaced.
    pub fn fixed(
        addr: usize,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        count();
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the kernel
        // refuses with EEXIST instead.
        let r = unsafe {
            mmap(
                addr as *mut _,
                len,
                access.prot(),
                MapFlags::SHARED | MapFlags::FIXED_NOREPLACE,
                fd,
                offset,
            )
        };
        match r {
            Ok(p) if p as usize == addr => Ok(Mapping {
                ptr: NonNull::new(p.cast()).expect("non-null"),
                len,
                #[cfg(feature = "semantics")]
                id: next_id(),
            }),
            Ok(p) => {
                // A kernel that ignores MAP_FIXED_NOREPLACE treats it as a hint.
                // SAFETY: `p..p+len` is the mapping we just made and no one else knows it.
                let _ = unsafe { munmap(p, len) };
                Err(Error::AddressInUse { addr, len })
            }
            Err(rustix::io::Errno::EXIST) => Err(Error::AddressInUse { addr, len }),
            Err(e) => Err(e.into()),
        }
    }

    /// First byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The address of byte `offset`, once it is checked (a panic otherwise) that
    /// `offset..offset+len` lies inside the mapping.
    fn range(&self, offset: usize, len: usize) -> *mut std::ffi::c_void {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len));
        self.ptr.as_ptr().wrapping_add(offset).cast()
    }

    /// Changes the protection of the pages in `offset..offset+len` (`mprotect(2)`).
    /// Both must be page multiples inside the mapping.
    pub fn protect(&self, offset: usize, len: usize, access: Access) -> io::Result<()> {
        let at = self.range(offset, len);
        let flags = match access {
            Access::Read => MprotectFlags::READ,
            Access::ReadWrite => MprotectFlags::READ | MprotectFlags::WRITE,
        };
        count();
        // SAFETY: the range lies inside our own mapping (asserted above). Making pages
        // read-only can make later writes fault, which is the point; no Rust reference to
        // them is writable while the owner has frozen them.
        unsafe { mprotect(at, len, flags)? };
        Ok(())
    }
}

impl Mapping {
    /// Collapses `offset..offset+len` (whole 2 MiB pages at 2 MiB-aligned addresses) into
    /// transparent huge pages, mapped here with 2 MiB entries (`madvise(MADV_COLLAPSE)`,
    /// which works whatever `shmem_enabled` says). A 2 MiB page of which nothing is
    /// populated cannot be collapsed, so one byte of each is read first (a shmem read
    /// fault allocates the page; nothing is written). Other mappings of the file at
    /// 2 MiB-aligned addresses then map the huge pages with 2 MiB entries when they fault.
    pub fn collapse(&self, offset: usize, len: usize) -> io::Result<()> {
        const HUGE: usize = 2 << 20;
        let at = self.range(offset, len);
        if at as usize % HUGE != 0 || len % HUGE != 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        for c in (0..len).step_by(HUGE) {
            // SAFETY: inside our own mapping (asserted by `range`), which is readable
            // (every mapping grants at least read access; the caller collapses ranges it
            // has not made inaccessible). A volatile read changes nothing.
            unsafe { at.cast::<u8>().add(c).read_volatile() };
        }
        count();
        // SAFETY: MADV_COLLAPSE changes how the range is backed, never its contents.
        if unsafe { libc::madvise(at, len, libc::MADV_COLLAPSE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Taking pages out of a mapping, putting them back and replacing them: what Genie's
/// semantics do to the regions they hide and move and to the pages TCOW copies.
#[cfg(feature = "semantics")]
impl Mapping {
    /// Drops the pages at `offset..offset+len` from this mapping and leaves the range
    /// inaccessible: an anonymous `PROT_NONE` placeholder is mapped over it
    /// (`mmap(MAP_FIXED)`, one step), so any access faults and, unlike a `munmap` hole,
    /// no other `mmap` in this process can land there meanwhile (the mapping's own drop
    /// unmaps its whole range, which then holds only what is ours). The returned
    /// [`Discarded`] brings the file's pages back ([`restore`](Self::restore)).
    ///
    /// # Safety
    /// No reference into the range may be used until it is restored.
    pub unsafe fn discard(&self, offset: usize, len: usize) -> io::Result<Discarded> {
        let at = self.range(offset, len);
        count();
        // SAFETY: the range lies inside our own mapping (asserted) and the caller promises
        // nothing uses it; MAP_FIXED replaces it in one step.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                at,
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
            )?
        };
        debug_assert_eq!(p, at);
        Ok(Discarded {
            map: self.id,
            from: at as usize,
            len,
        })
    }

    /// Maps `fd` from `file_offset` back over the placeholder that
    /// [`discard`](Self::discard) left, as many bytes as it covers (`MAP_SHARED |
    /// MAP_FIXED`, one step).
    pub fn restore(
        &self,
        d: Discarded,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        access: Access,
    ) -> io::Result<()> {
        assert_eq!(
            d.map, self.id,
            "a discarded range goes back to its own mapping"
        );
        let offset = self.offset_of(d.from, d.len);
        // SAFETY: `d` is proof that `discard` put a placeholder over exactly this range of
        // this mapping (checked: its id), and it is consumed here: nothing refers to the
        // range.
        unsafe { self.map_over(offset, fd, file_offset, d.len, access, MapFlags::SHARED) }
    }

    /// The offset of `addr..addr+len` inside this mapping; panics if it lies outside.
    fn offset_of(&self, addr: usize, len: usize) -> usize {
        let offset = addr.wrapping_sub(self.ptr.as_ptr() as usize);
        let _ = self.range(offset, len);
        offset
    }

    /// Moves the pages at `offset..offset+len` out of this mapping, page tables and all
    /// (`mremap(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP)` onto an address
    /// reserved for them, at the same place within a 2 MiB table so that whole tables
    /// move), and makes the emptied range inaccessible (`mprotect(PROT_NONE)`, cheap on a
    /// range with no page table entries left): any access through this mapping's range
    /// faults until [`move_back`](Self::move_back). The range stays mapped, so no other
    /// `mmap` in this process can land there meanwhile. The pages stay populated where
    /// they went, and nothing in this process knows that address but the returned
    /// [`Stash`], which unmaps them if dropped.
    ///
    /// Why not `munmap` or `mprotect(PROT_NONE)` of the pages: both visit every page
    /// table entry of the range (and the way back, a refault or `mprotect` read-write,
    /// visits them again), while a move hands over whole 2 MiB tables: at 64 MiB about
    /// 30 – 85 µs out and 17 – 45 µs back (docs/semantics.md), against 1.3 ms for
    /// `mprotect(PROT_NONE)`, 5.2 ms for read-write again and 2.4 – 9 ms for `munmap`.
    /// Leaving the range mapped (`DONTUNMAP`, then `PROT_NONE`) costs about what claiming
    /// a hole again on the way back used to (measured in C, 4 KiB – 64 MiB).
    ///
    /// # Safety
    /// No reference into the range may be used until it is moved back.
    pub unsafe fn move_out(&self, offset: usize, len: usize) -> io::Result<Stash> {
        // SAFETY: the caller's promise covers more than `move_tables_out` asks.
        let stash = unsafe { self.move_tables_out(offset, len)? };
        count();
        // SAFETY: inside our own mapping, which nothing uses (the caller's promise).
        if let Err(e) = unsafe { mprotect(stash.from as *mut _, len, MprotectFlags::empty()) } {
            // Put the pages back over the (still accessible) emptied range; if even that
            // fails, dropping the stash unmaps them and the range refaults from the file.
            let _ = self.move_back(stash);
            return Err(e.into());
        }
        Ok(stash)
    }

    /// Moves the page table entries of `offset..offset+len` out of this mapping onto an
    /// address only the returned [`Stash`] knows (`mremap(MREMAP_DONTUNMAP)`, whole 2 MiB
    /// tables where the kernel can), and leaves the range mapped and accessible but empty:
    /// an access refaults the file's page, as after reclaim. TCOW uses this to
    /// write-protect a large run of a view cheaply (an empty range takes userfaultfd
    /// markers, not per-page changes), then [`move_back_parts`](Self::move_back_parts).
    ///
    /// Fails (changing nothing) if the range is not one whole mapping of the kernel's
    /// (for instance a page of it was replaced by `mmap(MAP_FIXED)`).
    ///
    /// # Safety
    /// Every page of the range must be a `MAP_SHARED` page of the file (never a private
    /// copy, which the move would take away): then what refaults is the same bytes, and
    /// references into the range stay valid.
    pub unsafe fn move_tables_out(&self, offset: usize, len: usize) -> io::Result<Stash> {
        const TABLE: usize = 2 << 20;
        let at = self.range(offset, len);
        count();
        // SAFETY: a fresh reservation chosen by the kernel (no address given): it
        // replaces nothing.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len + TABLE,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        } as usize;
        let stash = Stash {
            base,
            total: len + TABLE,
            // Congruent to the source modulo a table, inside the reservation.
            at: base + (at as usize).wrapping_sub(base) % TABLE,
            len,
            from: at as usize,
            map: self.id,
        };
        count();
        // SAFETY: the source lies inside our own mapping (asserted by `range`) and holds
        // shared file pages (the caller's promise), so it refaults the same bytes; the
        // destination lies inside the reservation just made (at most `TABLE - 1` past its
        // start, `len` long), which only `stash` knows, so replacing it loses nothing.
        // DONTUNMAP leaves the source mapped, empty.
        unsafe {
            rustix::mm::mremap_fixed(
                at,
                len,
                len,
                rustix::mm::MremapFlags::MAYMOVE | DONTUNMAP,
                stash.at as *mut std::ffi::c_void,
            )?
        };
        Ok(stash)
    }

    /// Moves back the parts (byte ranges from the stash's start, page multiples, in
    /// order, disjoint) of a [`Stash`] made by
    /// [`move_tables_out`](Self::move_tables_out) or [`move_out`](Self::move_out) over
    /// the range they came from
    /// (`mremap(MREMAP_FIXED)`, each replacing whatever the range maps there now), and
    /// unmaps the rest of the stash. Returns the parts that could not go back, each with
    /// its error (their range of this mapping keeps what it maps now).
    ///
    /// # Safety
    /// Each part's range of this mapping must map the same file pages the stash holds for
    /// it, or nothing (a refault would show the same bytes): what it maps is replaced.
    pub unsafe fn move_back_parts(
        &self,
        stash: Stash,
        parts: &[std::ops::Range<usize>],
    ) -> Vec<(std::ops::Range<usize>, io::Error)> {
        assert_eq!(stash.map, self.id, "a stash goes back to its own mapping");
        let _ = self.offset_of(stash.from, stash.len);
        let mut failed = Vec::new();
        let mut gone = 0; // the stash is moved back or unmapped below this offset
        let unmap = |from: usize, to: usize| {
            if to > from {
                count();
                // SAFETY: part of the stash's pages, inside its reservation, which only
                // the stash knows.
                let _ = unsafe { munmap((stash.at + from) as *mut _, to - from) };
            }
        };
        for r in parts {
            assert!(
                r.start >= gone && r.end <= stash.len,
                "parts in order, inside"
            );
            unmap(gone, r.start);
            gone = r.end;
            if r.is_empty() {
                continue;
            }
            count();
            // SAFETY: the source is part of the stash's own range; the destination is the
            // range it came from in this mapping (checked above), which maps the same
            // pages or nothing (the caller's promise).
            let moved = unsafe {
                rustix::mm::mremap_fixed(
                    (stash.at + r.start) as *mut std::ffi::c_void,
                    r.len(),
                    r.len(),
                    rustix::mm::MremapFlags::MAYMOVE,
                    (stash.from + r.start) as *mut std::ffi::c_void,
                )
            };
            if let Err(e) = moved {
                unmap(r.start, r.end);
                failed.push((r.clone(), e.into()));
            }
        }
        unmap(gone, stash.len);
        stash.release_remnants();
        failed
    }

    /// Moves a [`Stash`]'s pages back to where [`move_out`](Self::move_out) took them
    /// from, over the inaccessible range it left: `mremap(MREMAP_FIXED)`, one step. If that
    /// fails the pages are dropped and the range stays inaccessible.
    pub fn move_back(&self, stash: Stash) -> io::Result<()> {
        let whole = 0..stash.len;
        // SAFETY: the destination is the range of this mapping (checked there: its id and
        // bounds) that `move_out` emptied and left inaccessible, so it maps nothing that
        // could differ from the stash's pages.
        match unsafe { self.move_back_parts(stash, std::slice::from_ref(&whole)) }.pop() {
            None => Ok(()),
            Some((_, e)) => Err(e),
        }
    }

    /// Replaces the pages at `offset..offset+len` of this mapping by `len` bytes of `fd`
    /// from `file_offset`, `MAP_SHARED | MAP_FIXED` (`mmap(2)`), in one step: there is no
    /// moment at which the range is unmapped.
    ///
    /// # Safety
    /// Whatever the range showed before is gone for this process; the caller must hold
    /// the range and know that no reference relies on its old contents.
    pub unsafe fn replace(
        &self,
        offset: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        len: usize,
        access: Access,
    ) -> io::Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.map_over(offset, fd, file_offset, len, access, MapFlags::SHARED) }
    }

    /// Maps `len` bytes of `fd` from `file_offset` privately (copy-on-write) over
    /// `offset..offset+len` of this mapping, read-write, `MAP_PRIVATE | MAP_FIXED`
    /// (`mmap(2)`), in one step. Works on a read-only descriptor: writes go to private
    /// copies, never to the file.
    ///
    /// # Safety
    /// As [`replace`](Self::replace).
    pub unsafe fn replace_private(
        &self,
        offset: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        len: usize,
    ) -> io::Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            self.map_over(
                offset,
                fd,
                file_offset,
                len,
                Access::ReadWrite,
                MapFlags::PRIVATE,
            )
        }
    }

    /// `mmap(MAP_FIXED | kind)` of `fd` over part of this mapping.
    ///
    /// # Safety
    /// As [`replace`](Self::replace).
    unsafe fn map_over(
        &self,
        offset: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        len: usize,
        access: Access,
        kind: MapFlags,
    ) -> io::Result<()> {
        let at = self.range(offset, len);
        count();
        // SAFETY: the range lies inside our own mapping (asserted) and the caller owns it.
        let p = unsafe {
            mmap(
                at,
                len,
                access.prot(),
                kind | MapFlags::FIXED,
                fd,
                file_offset,
            )?
        };
        debug_assert_eq!(p, at);
        Ok(())
    }

    /// Locks `offset..offset+len` in memory (`mlock(2)`), or unlocks it (`munlock(2)`).
    pub fn lock_range(&self, offset: usize, len: usize, locked: bool) -> io::Result<()> {
        let p = self.range(offset, len);
        count();
        // SAFETY: (un)locking pages of our own mapping (asserted) changes no contents.
        unsafe {
            if locked {
                rustix::mm::mlock(p, len)?;
            } else {
                rustix::mm::munlock(p, len)?;
            }
        }
        Ok(())
    }
}

/// `MREMAP_DONTUNMAP` (Linux 5.7; `linux/mman.h`): rustix names it only in its raw-syscall
/// backend, not in the libc one (used under Miri, for instance).
#[cfg(feature = "semantics")]
const DONTUNMAP: rustix::mm::MremapFlags = rustix::mm::MremapFlags::from_bits_retain(4);

/// Pages moved out of a [`Mapping`] by [`Mapping::move_out`], at an address reserved for
/// them that only this value knows. Dropped, it unmaps its reservation (and the pages, if
/// they were not moved back).
#[cfg(feature = "semantics")]
#[derive(Debug)]
pub struct Stash {
    /// The reservation: `total` bytes from `base`.
    base: usize,
    total: usize,
    /// Where the pages are, inside the reservation.
    at: usize,
    len: usize,
    /// Where they came from (an inaccessible range of the mapping until they go back).
    from: usize,
    /// That mapping's `id`.
    map: u64,
}

/// Proof that [`Mapping::discard`] left an inaccessible placeholder over `from..from+len`
/// of a mapping; [`Mapping::restore`] consumes it.
#[cfg(feature = "semantics")]
#[derive(Debug)]
#[must_use = "a discarded range stays inaccessible until it is restored"]
pub struct Discarded {
    map: u64,
    from: usize,
    len: usize,
}

#[cfg(feature = "semantics")]
impl Stash {
    /// After the pages went back: unmaps what is left of the reservation around their
    /// old place (not that place itself, which is no longer ours), and forgets it.
    fn release_remnants(self) {
        let this = std::mem::ManuallyDrop::new(self);
        let end = this.base + this.total;
        for (from, to) in [(this.base, this.at), (this.at + this.len, end)] {
            if to > from {
                count();
                // SAFETY: a remnant of our own reservation, still `PROT_NONE` and ours.
                let _ = unsafe { munmap(from as *mut std::ffi::c_void, to - from) };
            }
        }
    }
}

#[cfg(feature = "semantics")]
impl Drop for Stash {
    fn drop(&mut self) {
        count();
        // SAFETY: the reservation is ours alone (made by `move_out`, its address known
        // only to this value) and still holds the pages moved there (a stash whose pages
        // went back is released by `release_remnants`, not dropped): unmapping the whole
        // range drops them.
        let _ = unsafe { munmap(self.base as *mut std::ffi::c_void, self.total) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        count();
        // SAFETY: we own this range, and all of it: parts taken out (`discard`,
        // `move_out`) stay mapped inaccessible, never holes another mapping could take.
        // Everything pointing into it holds an Arc that keeps this Mapping alive, so
        // nothing refers to it any more.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(all(test, feature = "semantics"))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    const PG: usize = 4096;

    /// A shared mapping of a fresh memfd of `pages` pages, page `i` filled with `i + 1`.
    fn filled(pages: usize) -> (std::os::fd::OwnedFd, Mapping) {
        let fd = crate::sys::fd::memfd("ferry-mem-test", (pages * PG) as u64).unwrap();
        let m = Mapping::shared(fd.as_fd(), pages * PG, Access::ReadWrite).unwrap();
        for i in 0..pages {
            // SAFETY: inside our own fresh read-write mapping.
            unsafe { std::ptr::write_bytes(m.as_ptr().add(i * PG), i as u8 + 1, PG) };
        }
        (fd, m)
    }

    /// Whether anything else could map a page at `addr` now (a claim with
    /// `MAP_FIXED_NOREPLACE`, undone at once).
    fn claimable(addr: usize) -> bool {
        // SAFETY: MAP_FIXED_NOREPLACE replaces nothing; a page it made is unmapped.
        match unsafe {
            rustix::mm::mmap_anonymous(
                addr as *mut _,
                PG,
                ProtFlags::READ,
                MapFlags::PRIVATE | MapFlags::FIXED_NOREPLACE,
            )
        } {
            Ok(p) => {
                // SAFETY: the page just made, which nothing uses.
                let _ = unsafe { munmap(p, PG) };
                true
            }
            Err(e) => {
                assert_eq!(e, rustix::io::Errno::EXIST);
                false
            }
        }
    }

    fn byte_at(m: &Mapping, off: usize) -> u8 {
        // SAFETY: inside the mapping, and mapped readable where the tests read.
        unsafe { m.as_ptr().add(off).read_volatile() }
    }

    #[test]
    fn a_discarded_range_stays_reserved_and_comes_back_with_the_files_bytes() {
        let (fd, m) = filled(8);
        // SAFETY: nothing refers to pages 2..5.
        let d = unsafe { m.discard(2 * PG, 3 * PG) }.unwrap();
        assert!(!claimable(m.as_ptr() as usize + 3 * PG));
        m.restore(d, fd.as_fd(), 2 * PG as u64, Access::ReadWrite)
            .unwrap();
        assert_eq!((byte_at(&m, 2 * PG), byte_at(&m, 5 * PG - 1)), (3, 5));
    }

    #[test]
    fn moved_out_pages_leave_their_range_reserved_and_come_back() {
        let (_fd, m) = filled(8);
        // SAFETY: nothing refers to pages 1..7.
        let s = unsafe { m.move_out(PG, 6 * PG) }.unwrap();
        assert!(!claimable(m.as_ptr() as usize + 4 * PG));
        // The pages outside the range are untouched.
        assert_eq!((byte_at(&m, 0), byte_at(&m, 7 * PG)), (1, 8));
        m.move_back(s).unwrap();
        assert_eq!((byte_at(&m, PG), byte_at(&m, 7 * PG - 1)), (2, 7));
    }

    #[test]
    fn moved_tables_leave_the_range_readable_and_parts_come_back() {
        let (fd, m) = filled(8);
        // SAFETY: pages 1..7 are shared pages of the file.
        let s = unsafe { m.move_tables_out(PG, 6 * PG) }.unwrap();
        // The emptied range stays mapped and refaults the file's bytes.
        assert!(!claimable(m.as_ptr() as usize + 4 * PG));
        assert_eq!((byte_at(&m, 2 * PG), byte_at(&m, 7 * PG - 1)), (3, 7));
        // Page 3 is replaced meanwhile (as TCOW does): it must not be moved back over.
        let other = crate::sys::fd::memfd("ferry-mem-test2", PG as u64).unwrap();
        // SAFETY: nothing refers to page 3.
        unsafe { m.replace(3 * PG, other.as_fd(), 0, PG, Access::ReadWrite) }.unwrap();
        // SAFETY: the parts' ranges map the same pages (refaulted) or nothing.
        let failed = unsafe { m.move_back_parts(s, &[0..2 * PG, 3 * PG..6 * PG]) };
        assert!(failed.is_empty());
        assert_eq!(byte_at(&m, 3 * PG), 0, "the replacement stays");
        for i in [1, 2, 4, 5, 6] {
            assert_eq!(byte_at(&m, i * PG + 7), i as u8 + 1);
        }
        // Writes through the mapping reach the file again.
        // SAFETY: inside the read-write mapping.
        unsafe { m.as_ptr().add(5 * PG).write_volatile(0xee) };
        let mut b = [0u8; 1];
        rustix::io::pread(&fd, &mut b, 5 * PG as u64).unwrap();
        assert_eq!(b[0], 0xee);
    }

    #[test]
    #[should_panic(expected = "its own mapping")]
    fn a_token_goes_back_only_to_its_own_mapping() {
        let (_fa, a) = filled(4);
        let (fb, b) = filled(4);
        // SAFETY: nothing refers to page 1 of `a`.
        let d = unsafe { a.discard(PG, PG) }.unwrap();
        let _ = b.restore(d, fb.as_fd(), PG as u64, Access::ReadWrite);
    }
}
