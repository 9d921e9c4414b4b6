//! Empty: a pallet's valid data goes out to a file, pipe or socket, unmapped here.

use std::io;
use std::os::fd::AsFd;

use super::Container;
use crate::error::{Error, Result};
use crate::sys::{self, splice::FdKind};

impl Container {
    /// Writes the valid bytes of pallet `index`, and nothing else, to `dst`; returns how
    /// many (all of them unless an error intervenes). The pallet is never mapped in this
    /// process, and its valid range is left as it is.
    ///
    /// The call depends on what `dst` is (found with `fstat`):
    /// - **regular file**: `sendfile(file <- memfd)`, writing at the file's current
    ///   position like `write(2)`. The file gets its own copy of the bytes.
    /// - **pipe**: `splice(memfd -> pipe)`. The pipe holds references to the pallet's pages.
    /// - **socket**: `sendfile(socket <- memfd)`. The socket may hold references too.
    ///
    /// After a pipe or socket the pallet is marked *lent* ([`Pallet::is_lent`]): the
    /// kernel gives no notice when the reader is done with those pages, so the next fill
    /// or writable unload moves the pallet to a fresh memfd instead of writing over them.
    /// Bytes already in the pipe or socket therefore never change.
    ///
    /// [`Pallet::is_lent`]: super::Pallet::is_lent
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// use std::io::Read;
    /// let (r, w) = rustix::pipe::pipe().map_err(std::io::Error::from)?;
    /// let mut c = ferry::containers::Container::alloc(&[4096])?;
    /// {
    ///     let mut p = c.unload(0)?;
    ///     p.as_mut_slice()[..3].copy_from_slice(b"abc");
    ///     p.reload(1..3)?;
    /// }
    /// assert_eq!(c.empty(0, &w)?, 2);        // only the valid bytes
    /// assert!(c.pallet(0)?.is_lent());
    /// drop(w);
    /// let mut out = Vec::new();
    /// std::fs::File::from(r).read_to_end(&mut out)?;
    /// assert_eq!(out, b"bc");
    /// # Ok(()) }
    /// ```
    pub fn empty(&mut self, index: usize, dst: impl AsFd) -> Result<usize> {
        let p = self.pallet_mut(index)?;
        if p.unloaded {
            return Err(Error::PalletUnloaded { pallet: index });
        }
        let dst = dst.as_fd();
        let kind = sys::splice::identify(dst)?.kind;
        if kind == FdKind::Other {
            return Err(Error::InvalidArgument(
                "empty destination must be a file, pipe or socket",
            ));
        }
        let mut off = p.valid.start as u64;
        let end = p.valid.end as u64;
        while off < end {
            let left = (end - off) as usize;
            // Mark before the call: a call that fails part-way may already have lent pages.
            if kind != FdKind::File {
                p.lent = true;
            }
            let n = match kind {
                FdKind::Pipe => sys::splice::splice(p.fd.as_fd(), Some(&mut off), dst, None, left)?,
                _ => sys::splice::sendfile(dst, p.fd.as_fd(), Some(&mut off), left)?,
            };
            if n == 0 {
                return Err(Error::Io(io::ErrorKind::WriteZero.into()));
            }
        }
        Ok(p.valid.len())
    }
}
