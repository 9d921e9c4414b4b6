//! Fill: a file, pipe or socket deposits data into a pallet that stays unmapped here.

use std::os::fd::{AsFd, BorrowedFd};

use super::Container;
use crate::error::{Error, Result};
use crate::sys::{self, splice::FdKind};

/// Bytes moved per `splice` through the private pipe when filling from a socket (the
/// default pipe capacity).
const SOCKET_CHUNK: usize = 64 * 1024;

impl Container {
    /// Fills pallet `index` from `src`, writing from the start of the pallet, until `len`
    /// bytes (capped at the pallet size) have arrived or `src` reaches end of input. The
    /// valid range becomes `0..n`, and `n` is returned. The pallet is never mapped in this
    /// process. Blocking follows `src`: a blocking pipe or socket with a live writer waits
    /// for more data; a non-blocking one that runs dry returns `WouldBlock` as
    /// [`Error::Io`] (the valid range then covers what arrived).
    ///
    /// The call depends on what `src` is (found with `fstat`):
    /// - **regular file**: `sendfile(memfd <- file)`, reading from the file's current
    ///   position and advancing it, like `read(2)`. (`copy_file_range` would take explicit
    ///   offsets, but between a memfd and ext4 it fails with `EXDEV`.)
    /// - **pipe**: `splice(pipe -> memfd)`. The kernel copies the bytes into the pallet.
    /// - **socket**: a socket cannot be spliced straight into a file, and `read` into the
    ///   pallet would need a mapping, so ferry splices socket -> a private pipe -> memfd
    ///   (`splice` twice per 64 KiB; the second one copies).
    ///
    /// A lent pallet first gets a fresh memfd (no copy: the fill replaces the data), so the
    /// fill never changes bytes that a pipe or socket still holds. A fresh memfd reads as
    /// zeros, so a fill needs no cleansing pass before or after. Bytes past `n` keep their
    /// earlier contents on a reused pallet; see [`cleanse`](Container::cleanse).
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let f = tempfile_with(b"some file data")?;
    /// let mut c = ferry::containers::Container::alloc(&[4096])?;
    /// assert_eq!(c.fill(0, &f, 4096)?, 14);
    /// assert_eq!(c.pallet(0)?.valid(), 0..14);
    /// # Ok(()) }
    /// # fn tempfile_with(b: &[u8]) -> std::io::Result<std::fs::File> {
    /// #     use std::io::{Seek, Write};
    /// #     let p = std::env::temp_dir().join(format!("ferry-doc-fill-{}", std::process::id()));
    /// #     let mut f = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&p)?;
    /// #     std::fs::remove_file(&p)?;
    /// #     f.write_all(b)?; f.rewind()?; Ok(f)
    /// # }
    /// ```
    pub fn fill(&mut self, index: usize, src: impl AsFd, len: usize) -> Result<usize> {
        let p = self.pallet_mut(index)?;
        if p.unloaded {
            return Err(Error::PalletUnloaded { pallet: index });
        }
        if p.sealed {
            return Err(Error::Sealed { pallet: index });
        }
        p.unlend(false)?;
        let want = len.min(p.size);
        let src = src.as_fd();
        let kind = sys::splice::identify(src)?.kind;
        let mut done = 0usize;
        let r = match kind {
            FdKind::File => fill_file(p.fd.as_fd(), src, want, &mut done),
            FdKind::Pipe => fill_pipe(p.fd.as_fd(), src, want, &mut done),
            FdKind::Socket => fill_socket(p.fd.as_fd(), src, want, &mut done),
            FdKind::Other => Err(Error::InvalidArgument(
                "fill source must be a file, pipe or socket",
            )),
        };
        p.valid = 0..done;
        r.map(|()| done)
    }
}

fn fill_file(
    pallet: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    want: usize,
    done: &mut usize,
) -> Result<()> {
    sys::splice::seek_to(pallet, 0)?;
    while *done < want {
        let n = sys::splice::sendfile(pallet, src, None, want - *done)?;
        if n == 0 {
            break;
        }
        *done += n;
    }
    Ok(())
}

fn fill_pipe(
    pallet: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    want: usize,
    done: &mut usize,
) -> Result<()> {
    while *done < want {
        let mut off = *done as u64;
        let n = sys::splice::splice(src, None, pallet, Some(&mut off), want - *done)?;
        if n == 0 {
            break;
        }
        *done += n;
    }
    Ok(())
}

fn fill_socket(
    pallet: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    want: usize,
    done: &mut usize,
) -> Result<()> {
    let (pr, pw) = sys::splice::pipe()?;
    while *done < want {
        let chunk = (want - *done).min(SOCKET_CHUNK);
        let got = sys::splice::splice(src, None, pw.as_fd(), None, chunk)?;
        if got == 0 {
            break;
        }
        let mut moved = 0;
        while moved < got {
            let mut off = (*done + moved) as u64;
            let n = sys::splice::splice(pr.as_fd(), None, pallet, Some(&mut off), got - moved)?;
            if n == 0 {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "private pipe ran dry",
                )));
            }
            moved += n;
        }
        *done += got;
    }
    Ok(())
}
