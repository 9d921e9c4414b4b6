//! Moving bytes between descriptors inside the kernel: `sendfile(2)` and `splice(2)`,
//! plus `pipe2(2)`, `lseek(2)` and `fstat(2)` to classify a descriptor.
//! (`copy_file_range(2)` is not used: between a memfd and ext4 it fails with `EXDEV`.)
//!
//! Man pages: [sendfile(2)](https://man7.org/linux/man-pages/man2/sendfile.2.html),
//! [splice(2)](https://man7.org/linux/man-pages/man2/splice.2.html).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{FileType, SeekFrom};
use rustix::pipe::{PipeFlags, SpliceFlags};

use super::count;

/// What kind of object a descriptor refers to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FdKind {
    /// A regular file (including memfds).
    File,
    /// A pipe or FIFO.
    Pipe,
    /// A socket.
    Socket,
    /// Anything else (character device, directory, ...).
    Other,
}

/// Identity and shape of the file behind a descriptor, from one `fstat(2)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// Kind of object.
    pub kind: FdKind,
    /// Size in bytes (meaningful for regular files).
    pub size: u64,
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

/// Classifies `fd` (`fstat(2)`).
pub fn identify(fd: BorrowedFd<'_>) -> io::Result<FileInfo> {
    count();
    let st = rustix::fs::fstat(fd)?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => FdKind::File,
        FileType::Fifo => FdKind::Pipe,
        FileType::Socket => FdKind::Socket,
        _ => FdKind::Other,
    };
    Ok(FileInfo {
        kind,
        size: st.st_size as u64,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Sets the file position of `fd` to `offset` (`lseek(2)` with `SEEK_SET`).
pub fn seek_to(fd: BorrowedFd<'_>, offset: u64) -> io::Result<()> {
    count();
    rustix::fs::seek(fd, SeekFrom::Start(offset))?;
    Ok(())
}

/// Copies up to `len` bytes from `input` to `out` in the kernel (`sendfile(2)`).
///
/// With `in_offset` given, reads from there and advances it (the file position of
/// `input` is untouched); otherwise reads from and advances the file position. Writes at
/// the file position of `out`. Returns the bytes moved; 0 means end of input. When `input`
/// is a memfd and `out` a socket, the kernel references the pages rather than copying them.
pub fn sendfile(
    out: BorrowedFd<'_>,
    input: BorrowedFd<'_>,
    mut in_offset: Option<&mut u64>,
    len: usize,
) -> io::Result<usize> {
    loop {
        count();
        match rustix::fs::sendfile(out, input, in_offset.as_deref_mut(), len) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Moves up to `len` bytes between `input` and `out` (`splice(2)`); one of them must be a
/// pipe. An offset given for a non-pipe end is used and advanced instead of the file
/// position. Returns the bytes moved; 0 means end of input. Splicing a memfd into a pipe
/// lends the memfd's pages to the pipe; splicing a pipe into a memfd copies.
pub fn splice(
    input: BorrowedFd<'_>,
    mut in_offset: Option<&mut u64>,
    out: BorrowedFd<'_>,
    mut out_offset: Option<&mut u64>,
    len: usize,
) -> io::Result<usize> {
    loop {
        count();
        match rustix::pipe::splice(
            input,
            in_offset.as_deref_mut(),
            out,
            out_offset.as_deref_mut(),
            len,
            SpliceFlags::MOVE,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// A new pipe, close-on-exec (`pipe2(2)`); returns (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    count();
    Ok(rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?)
}
