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
    /// Makes `offset..offset+len` inaccessible (`mprotect(PROT_NONE)`): any access
    /// through this mapping faults (`SIGSEGV`) until [`protect`](Self::protect) gives it
    /// back. Region hiding, for emulated move.
    ///
    /// # Safety
    /// No reference into the range may be read or written while it is hidden.
    pub unsafe fn hide(&self, offset: usize, len: usize) -> io::Result<()> {
        let at = self.range(offset, len);
        count();
        // SAFETY: inside our own mapping (asserted); the caller promises nothing reads it.
        unsafe { mprotect(at, len, MprotectFlags::empty())? };
        Ok(())
    }

    /// Unmaps `offset..offset+len` of this mapping (`munmap(2)` of part of it), leaving a
    /// hole that [`remap_hole`](Self::remap_hole) can fill again. The whole range is still
    /// unmapped on drop (unmapping a hole is harmless).
    ///
    /// # Safety
    /// No reference into the range may be used while it is unmapped.
    pub unsafe fn unmap_range(&self, offset: usize, len: usize) -> io::Result<()> {
        let at = self.range(offset, len);
        count();
        // SAFETY: inside our own mapping (asserted); the caller promises nothing uses it.
        unsafe { munmap(at, len)? };
        Ok(())
    }

    /// Maps `len` bytes of `fd` from `file_offset` into the hole at `offset` that
    /// [`unmap_range`](Self::unmap_range) left, `MAP_SHARED | MAP_FIXED_NOREPLACE`: fails
    /// rather than replace anything.
    pub fn remap_hole(
        &self,
        offset: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        len: usize,
        access: Access,
    ) -> Result<()> {
        let m = Mapping::fixed(
            self.range(offset, len) as usize,
            fd,
            file_offset,
            len,
            access,
        )?;
        // Now part of this mapping: unmapped when it is.
        std::mem::forget(m);
        Ok(())
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

impl Drop for Mapping {
    fn drop(&mut self) {
        count();
        // SAFETY: we own this range; everything pointing into it holds an Arc that keeps
        // this Mapping alive, so nothing refers to it any more.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
