//! File seals on memfds and hole punching: `fcntl(2)` `F_ADD_SEALS`/`F_GET_SEALS`
//! (see [memfd_create(2)](https://man7.org/linux/man-pages/man2/memfd_create.2.html)) and
//! `fallocate(2)` with `FALLOC_FL_PUNCH_HOLE`.

use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::FallocateFlags;
pub use rustix::fs::SealFlags;

use super::count;

/// Adds `seals` to the memfd behind `fd` (`fcntl(F_ADD_SEALS)`).
///
/// `F_SEAL_WRITE` fails with `EBUSY` while any writable shared mapping of the file exists
/// or while its pages are pinned (by a pipe, for example); any seal fails with `EPERM`
/// once `F_SEAL_SEAL` is set, and with `EINVAL` on a file that is not a memfd.
pub fn add_seals(fd: BorrowedFd<'_>, seals: SealFlags) -> io::Result<()> {
    count();
    Ok(rustix::fs::fcntl_add_seals(fd, seals)?)
}

/// The seals set on the file behind `fd` (`fcntl(F_GET_SEALS)`); `EINVAL` if the file
/// does not support sealing (it is not a memfd or other shmem file).
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<SealFlags> {
    count();
    Ok(rustix::fs::fcntl_get_seals(fd)?)
}

/// Frees the pages of `offset..offset+len` so they read as zeros again, keeping the file
/// size (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`).
pub fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    count();
    Ok(rustix::fs::fallocate(
        fd,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )?)
}
