//! File seals on memfds and hole punching: `fcntl(2)` `F_ADD_SEALS`/`F_GET_SEALS`
//! (see [memfd_create(2)](https://man7.org/linux/man-pages/man2/memfd_create.2.html)) and
//! `fallocate(2)` with `FALLOC_FL_PUNCH_HOLE`.

use std::io;
use std::os::fd::BorrowedFd;

#[cfg(feature = "containers")]
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

/// The seals that fix a memfd's size: shared memory another process maps must carry
/// both, or its owner could shrink it under the mapping (the reader then takes `SIGBUS`).
pub const FIXED_SIZE: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// Fixes the size of the memfd behind `fd` (adds [`FIXED_SIZE`]).
pub fn fix_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    add_seals(fd, FIXED_SIZE)
}

/// Checks, before mapping memory another process owns, that the file behind `fd` is a
/// memfd whose size is sealed and is exactly `len` bytes. `EPERM` if a seal is missing,
/// `EINVAL` if it is not a sealable file, `EMSGSIZE` if the size differs.
pub fn check_fixed_size(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    if !seals(fd)?.contains(FIXED_SIZE) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    if super::fd::file_len(fd)? != len {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(())
}

/// Frees the pages of `offset..offset+len` so they read as zeros again, keeping the file
/// size (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`).
#[cfg(feature = "containers")]
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// What a peer checks before mapping another process's memory: an unsealed memfd, a
    /// sealed one of the wrong size, and a file that is not a memfd are all refused.
    #[test]
    fn only_size_sealed_memfds_of_the_right_size_pass() {
        let fd = crate::sys::fd::memfd("t", 8192).unwrap();
        assert!(check_fixed_size(fd.as_fd(), 8192).is_err(), "unsealed");
        add_seals(fd.as_fd(), SealFlags::SHRINK).unwrap();
        assert!(check_fixed_size(fd.as_fd(), 8192).is_err(), "shrink only");
        fix_size(fd.as_fd()).unwrap();
        check_fixed_size(fd.as_fd(), 8192).unwrap();
        assert!(check_fixed_size(fd.as_fd(), 4096).is_err(), "wrong size");
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(check_fixed_size(file.as_fd(), 4096).is_err(), "not a memfd");
    }
}
