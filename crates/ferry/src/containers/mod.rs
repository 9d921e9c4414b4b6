//! Container shipping: containers of memfd pallets, passed between domains as
//! capabilities and mapped only where someone reads them.
//!
//! A [`Container`] is an ordered set of [`Pallet`]s. Each pallet is a page-multiple memfd
//! with a valid-data range. The data moves in and out through the kernel without being
//! mapped in the calling process ([`Container::fill`], [`Container::empty`]); a domain that
//! wants to look at the bytes maps one pallet ([`Container::unload`]) and unmaps it again
//! when the guard drops (reload). [`Container::ship`] sends the memfds over a Unix socket
//! with `SCM_RIGHTS` and consumes the container, so the sender keeps neither descriptor nor
//! mapping; [`Container::receive`] checks what arrives before trusting it.
//!
//! ```
//! use std::os::unix::net::UnixStream;
//! use ferry::containers::Container;
//!
//! # fn main() -> ferry::Result<()> {
//! let (a, b) = UnixStream::pair()?;
//! let mut c = Container::alloc(&[4096, 8192])?;   // two pallets, reading as zeros
//! {
//!     let mut p = c.unload(0)?;                   // mmap, read-write
//!     p.as_mut_slice()[..5].copy_from_slice(b"hello");
//!     p.reload(0..5)?;                            // munmap; valid data is 0..5
//! }
//! c.seal()?;                                      // F_SEAL_WRITE | SHRINK | GROW
//! c.ship(&a)?;                                    // fds travel; `c` is gone
//!
//! let mut got = Container::receive(&b)?;
//! assert!(got.is_sealed()?);                      // nobody can change these bytes now
//! let v = got.view(0)?;                           // read-only mapping
//! assert_eq!(&v.as_slice()[v.valid()], b"hello");
//! # Ok(()) }
//! ```
//!
//! How each operation maps onto the kernel:
//!
//! | operation | call |
//! |---|---|
//! | alloc | `memfd_create` + `ftruncate`, then `F_SEAL_SHRINK \| F_SEAL_GROW` |
//! | fill from a file | `sendfile(memfd <- file)` (copy_file_range gives `EXDEV` between memfd and ext4) |
//! | fill from a pipe | `splice(pipe -> memfd)` (the kernel copies into the pallet) |
//! | fill from a socket | `splice(socket -> private pipe)`, then `splice(pipe -> memfd)` |
//! | empty to a file | `sendfile(file <- memfd)` |
//! | empty to a pipe | `splice(memfd -> pipe)`: lends the pages, the pallet becomes *lent* |
//! | empty to a socket | `sendfile(socket <- memfd)`: lends the pages, the pallet becomes *lent* |
//! | unload / reload | `mmap` (at last time's address, `MAP_FIXED_NOREPLACE`) / `munmap` |
//! | ship / receive | `sendmsg` / `recvmsg` with `SCM_RIGHTS`, `fstat` + `F_GET_SEALS` checks |
//! | seal | `F_ADD_SEALS` `F_SEAL_WRITE \| F_SEAL_SHRINK \| F_SEAL_GROW` |
//! | cleanse | `fallocate(PUNCH_HOLE)` outside the valid range |
//!
//! **Lent pages.** `sendfile` and `splice` out of a memfd put references to its pages in
//! the pipe or socket, and nothing reports when the reader has consumed them. ferry marks
//! such a pallet *lent*. The next [`fill`](Container::fill) or writable
//! [`unload`](Container::unload) does not write to those pages: it first swaps the pallet
//! to a fresh memfd (an unload copies the valid bytes across in the kernel; a fill needs
//! no copy, because it replaces the data). Bytes already in flight stay what they were.
//! The lent mark travels with a shipped container.
//!
//! **Recirculation.** Each pallet remembers where it was last mapped, and the process keeps
//! a small table from memfd identity (device, inode) to that address, so a container that
//! comes back from another domain is mapped where it was before when the range is still
//! free. [`Container::map_stats`] and [`map_stats`] count the hits.

// The type and the module share the name on purpose: one concept per file.
#[allow(clippy::module_inception)]
mod container;
mod empty;
mod fill;
mod pallet;
mod ship;
// Hands out slices over a pallet's mapping (three sites, each with its argument).
#[allow(unsafe_code)]
mod unload;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use container::{Container, ContainerInfo, PalletInfo, MAX_PALLETS};
pub use pallet::Pallet;
pub use ship::ShipError;
pub use unload::{Unloaded, View};

/// How unloads found their addresses: the recirculation mapping cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MapStats {
    /// Mapped at the same address as the last time.
    pub hits: u64,
    /// There was an address from last time, but it was taken; mapped elsewhere.
    pub misses: u64,
    /// First mapping of this memfd in this process; no address to reuse.
    pub cold: u64,
}

impl MapStats {
    /// Hits as a fraction of unloads that had an address to try (0 when none had).
    pub fn hit_rate(&self) -> f64 {
        let tried = self.hits + self.misses;
        if tried == 0 {
            0.0
        } else {
            self.hits as f64 / tried as f64
        }
    }
}

static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static COLD: AtomicU64 = AtomicU64::new(0);

/// Process-wide recirculation statistics: every unload of every container so far.
pub fn map_stats() -> MapStats {
    MapStats {
        hits: HITS.load(Ordering::Relaxed),
        misses: MISSES.load(Ordering::Relaxed),
        cold: COLD.load(Ordering::Relaxed),
    }
}

/// Most memfds whose last address the process remembers; the table is cleared when full.
const ADDRESS_CACHE_ENTRIES: usize = 4096;

static ADDRESSES: Mutex<Option<HashMap<(u64, u64), usize>>> = Mutex::new(None);

fn cached_address(id: (u64, u64)) -> Option<usize> {
    let g = ADDRESSES.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().and_then(|m| m.get(&id).copied())
}

fn remember_address(id: (u64, u64), addr: usize) {
    let mut g = ADDRESSES.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    if m.len() >= ADDRESS_CACHE_ENTRIES && !m.contains_key(&id) {
        m.clear();
    }
    m.insert(id, addr);
}
