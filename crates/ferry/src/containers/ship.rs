//! Ship and receive: a container's memfds cross to another domain over a Unix socket with
//! `SCM_RIGHTS`, together with a small header.
//!
//! Wire format, all integers little-endian:
//!
//! ```text
//! header   "FERRYCT1" (8 bytes) | pallet count: u32 | cargo count: u32
//! pallet*  size: u64 | valid start: u64 | valid end: u64 | flags: u64 (bit 0 sealed, bit 1 lent)
//! ```
//!
//! The descriptors, one per pallet in order and then the cargo's (see
//! [`Container::ship_with_fds`]), ride on the first byte of the header. A receiver that
//! predates cargo refuses a non-zero cargo count as reserved bits set.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::container::MAX_PALLETS;
use super::pallet::Pallet;
use super::{Container, MapStats};
use crate::error::{BadDescriptor, Error, Result};
use crate::sys;
use crate::sys::fds::{FdKinds, Fds};

const MAGIC: &[u8; 8] = b"FERRYCT1";
const HEAD: usize = 16;
const ENTRY: usize = 32;
const FLAG_SEALED: u64 = 1;
const FLAG_LENT: u64 = 2;
const KNOWN_FLAGS: u64 = FLAG_SEALED | FLAG_LENT;

/// Why [`Container::ship`] failed. When nothing was sent, the container comes back in
/// `container` unchanged; when the descriptors had already left, it is `None` (the peer may
/// hold them) and this side keeps nothing.
#[derive(Debug)]
pub struct ShipError {
    /// What went wrong.
    pub error: Error,
    /// The container, if it never left.
    pub container: Option<Container>,
}

impl fmt::Display for ShipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ship failed: {}", self.error)
    }
}

impl std::error::Error for ShipError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<ShipError> for Error {
    fn from(e: ShipError) -> Self {
        e.error
    }
}

/// Encodes the header a container ships with, with `cargo` descriptors besides.
fn encode(c: &Container, cargo: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + ENTRY * c.pallets.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(c.pallets.len() as u32).to_le_bytes());
    out.extend_from_slice(&(cargo as u32).to_le_bytes());
    for p in &c.pallets {
        let flags = if p.sealed { FLAG_SEALED } else { 0 } | if p.lent { FLAG_LENT } else { 0 };
        for v in [
            p.size as u64,
            p.valid.start as u64,
            p.valid.end as u64,
            flags,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads exactly `buf.len()` bytes, keeping any descriptors that come along (at most
/// `max_fds` in all; more is an error).
fn read_exact(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    max_fds: usize,
) -> Result<()> {
    let mut at = 0;
    while at < buf.len() {
        let room = max_fds.saturating_sub(fds.len());
        let r = sys::scm::recv_fds(sock, &mut buf[at..], room)?;
        let extra = r.fds.len();
        fds.extend(r.fds);
        if r.truncated || fds.len() > max_fds || (room == 0 && extra > 0) {
            return Err(BadDescriptor::TooManyFragments(fds.len() as u64).into());
        }
        if r.len == 0 {
            return Err(if at == 0 && fds.is_empty() {
                Error::Disconnected
            } else {
                BadDescriptor::Malformed("container message cut short").into()
            });
        }
        at += r.len;
    }
    Ok(())
}

impl Container {
    /// Ships the container over `sock`: every pallet's memfd goes with `SCM_RIGHTS`,
    /// preceded by a header with the count, sizes, valid ranges and flags
    /// (`sendmsg(2)`). The container is consumed and its fds closed here, so afterwards
    /// this domain holds neither descriptor nor mapping (unless someone dup'ed a fd
    /// through [`Pallet::as_fd`](super::Pallet::as_fd): seal the container when the
    /// receiver must not trust that).
    ///
    /// Fails, giving the container back, with [`Error::PalletUnloaded`] if a pallet is
    /// still mapped (a leaked unload guard); while a guard is alive the borrow checker
    /// already forbids the call. A container can be shipped back to the domain that
    /// allocated it, which maps its pallets at their old addresses when it unloads them.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// use std::os::unix::net::UnixStream;
    /// use ferry::containers::Container;
    /// let (a, b) = UnixStream::pair()?;
    /// let c = Container::alloc(&[4096, 4096])?;
    /// c.ship(&a)?;
    /// let back = Container::receive(&b)?;
    /// assert_eq!(back.len(), 2);
    /// back.ship(&b)?;                       // and home again
    /// assert_eq!(Container::receive(&a)?.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn ship(self, sock: &UnixStream) -> std::result::Result<(), ShipError> {
        self.ship_with_fds(sock, &[])
    }

    /// Like [`ship`](Self::ship), with `cargo` descriptors besides the pallets' (a
    /// dma-buf, a sync_file fence, an eventfd, ...): the receiver gets its own, through
    /// the same `SCM_RIGHTS` message, from [`receive_with_fds`](Self::receive_with_fds).
    /// The caller keeps its descriptors. At most [`MAX_FDS`](crate::MAX_FDS), and at
    /// most 253 (the kernel's limit per message) with the pallets'.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// use std::os::fd::AsFd;
    /// use std::os::unix::net::UnixStream;
    /// use ferry::containers::Container;
    /// let (a, b) = UnixStream::pair()?;
    /// let (r, _w) = std::io::pipe()?;
    /// Container::alloc(&[4096])?.ship_with_fds(&a, &[r.as_fd()])?;
    /// let (c, fds) = Container::receive_with_fds(&b, ferry::FdKinds::default())?;
    /// assert_eq!((c.len(), fds.kind(0)), (1, Some(ferry::FdKind::Pipe)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`ship`](Self::ship); [`Error::TooManyFds`] past the limit (the container comes
    /// back).
    pub fn ship_with_fds(
        self,
        sock: &UnixStream,
        cargo: &[BorrowedFd<'_>],
    ) -> std::result::Result<(), ShipError> {
        if let Some(i) = self.pallets.iter().position(|p| p.unloaded) {
            return Err(ShipError {
                error: Error::PalletUnloaded { pallet: i },
                container: Some(self),
            });
        }
        let max = sys::fds::MAX_FDS.min(sys::scm::MAX_FDS - self.pallets.len());
        if cargo.len() > max {
            return Err(ShipError {
                error: Error::TooManyFds {
                    count: cargo.len(),
                    max,
                },
                container: Some(self),
            });
        }
        let header = encode(&self, cargo.len());
        let fds: Vec<BorrowedFd<'_>> = self
            .pallets
            .iter()
            .map(|p| p.fd.as_fd())
            .chain(cargo.iter().copied())
            .collect();
        let sent = match sys::scm::send_fds(sock.as_fd(), &header, &fds) {
            Ok(n) => n,
            Err(e) => {
                drop(fds);
                return Err(ShipError {
                    error: e.into(),
                    container: Some(self),
                });
            }
        };
        drop(fds);
        // The descriptors are on their way; from here on the container is the peer's.
        let mut at = sent;
        while at < header.len() {
            match sys::scm::send_fds(sock.as_fd(), &header[at..], &[]) {
                Ok(n) => at += n,
                Err(e) => {
                    return Err(ShipError {
                        error: e.into(),
                        container: None,
                    })
                }
            }
        }
        drop(self);
        Ok(())
    }

    /// Receives a container shipped over `sock` (`recvmsg(2)`) and checks it before use:
    /// the header's magic and count (at most [`MAX_PALLETS`]), one descriptor per pallet,
    /// each a memfd (a regular file that supports seals) of exactly the stated size, a
    /// nonzero page multiple, with the valid range inside it, and sealed if the header says
    /// so. Each pallet's size is then pinned with `F_SEAL_SHRINK | F_SEAL_GROW`, so no
    /// other holder can truncate it under a mapping of ours.
    ///
    /// Bad input is [`Error::BadDescriptor`]; every descriptor that came with it is closed.
    /// A peer that closed the socket gives [`Error::Disconnected`].
    pub fn receive(sock: &UnixStream) -> Result<Container> {
        // Cargo nobody asked for is closed here, unexamined.
        Self::receive_inner(sock, None).map(|(c, _)| c)
    }

    /// Like [`receive`](Self::receive), and takes the cargo descriptors that came with
    /// the container (see [`ship_with_fds`](Self::ship_with_fds)), each checked to be
    /// of one of `kinds` as [`Receiver::set_fd_kinds`](crate::Receiver::set_fd_kinds)
    /// says.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// use std::os::fd::AsFd;
    /// use std::os::unix::net::UnixStream;
    /// use ferry::{containers::Container, FdKind, FdKinds};
    /// let (a, b) = UnixStream::pair()?;
    /// let (r, _w) = std::io::pipe()?;
    /// Container::alloc(&[4096])?.ship_with_fds(&a, &[r.as_fd()])?;
    /// let refused = Container::receive_with_fds(&b, FdKinds::only(FdKind::Memfd));
    /// assert!(matches!(refused, Err(ferry::Error::FdRefused { index: 0, kind: FdKind::Pipe })));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`receive`](Self::receive); [`Error::FdRefused`] for a kind not in `kinds`
    /// (the container and every descriptor are closed).
    pub fn receive_with_fds(sock: &UnixStream, kinds: FdKinds) -> Result<(Container, Fds)> {
        Self::receive_inner(sock, Some(kinds))
    }

    fn receive_inner(sock: &UnixStream, kinds: Option<FdKinds>) -> Result<(Container, Fds)> {
        let sock = sock.as_fd();
        let mut fds = Vec::new();
        let mut head = [0u8; HEAD];
        read_exact(sock, &mut head, &mut fds, sys::scm::MAX_FDS)?;
        if &head[..8] != MAGIC {
            return Err(BadDescriptor::Malformed("not a ferry container message").into());
        }
        let count = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
        if count > MAX_PALLETS {
            return Err(BadDescriptor::TooManyFragments(count as u64).into());
        }
        let ncargo = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes")) as usize;
        if ncargo > sys::fds::MAX_FDS || count + ncargo > sys::scm::MAX_FDS {
            return Err(
                BadDescriptor::Malformed("more cargo descriptors than a message carries").into(),
            );
        }
        let mut entries = vec![0u8; count * ENTRY];
        read_exact(sock, &mut entries, &mut fds, count + ncargo)?;
        if fds.len() != count + ncargo {
            return Err(BadDescriptor::CountMismatch {
                expected: (count + ncargo) as u64,
                found: fds.len() as u64,
            }
            .into());
        }
        let cargo = fds.split_off(count);
        let cargo = match kinds {
            Some(kinds) => Fds::checked(cargo, kinds)?,
            None => Fds::default(),
        };
        // Named in errors about its descriptors; 0 if the socket cannot tell.
        let pid = rustix::net::sockopt::socket_peercred(sock)
            .ok()
            .and_then(|c| u32::try_from(c.pid.as_raw_nonzero().get()).ok())
            .unwrap_or(0);
        let mut pallets = Vec::with_capacity(count);
        for (i, fd) in fds.into_iter().enumerate() {
            let e = &entries[i * ENTRY..(i + 1) * ENTRY];
            let (size, start, end, flags) =
                (u64_at(e, 0), u64_at(e, 8), u64_at(e, 16), u64_at(e, 24));
            if flags & !KNOWN_FLAGS != 0 {
                return Err(BadDescriptor::Malformed("unknown pallet flags").into());
            }
            pallets.push(Pallet::adopt(
                i,
                pid,
                fd,
                size,
                start..end,
                flags & FLAG_SEALED != 0,
                flags & FLAG_LENT != 0,
            )?);
        }
        Ok((
            Container {
                pallets,
                stats: MapStats::default(),
            },
            cargo,
        ))
    }
}
