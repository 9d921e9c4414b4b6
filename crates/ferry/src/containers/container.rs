//! The container: an ordered set of pallets, with alloc, free, info, seal and cleanse.

use std::ops::Range;
use std::os::fd::AsFd;

use super::pallet::{Pallet, IMMUTABLE};
use super::MapStats;
use crate::error::{Error, Result};
use crate::sys;

/// Most pallets one container may hold (a shipped container's fds travel in one
/// `SCM_RIGHTS` message, whose kernel limit is 253).
pub const MAX_PALLETS: usize = 250;

/// An ordered set of [`Pallet`]s, owned by one domain at a time.
///
/// Dropping a container frees it: its memfds are closed (the memory goes once no other
/// domain holds them). [`ship`](Container::ship) consumes it, so using a container after
/// shipping it, or shipping it twice, does not compile:
///
/// ```compile_fail
/// # use std::os::unix::net::UnixStream;
/// # use ferry::containers::Container;
/// # let (a, _b) = UnixStream::pair().unwrap();
/// let c = Container::alloc(&[4096]).unwrap();
/// c.ship(&a).unwrap();
/// c.ship(&a).unwrap(); // error: use of moved value `c`
/// ```
#[derive(Debug)]
pub struct Container {
    pub(crate) pallets: Vec<Pallet>,
    pub(crate) stats: MapStats,
}

/// What [`Container::info`] reports about one pallet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PalletInfo {
    /// Size in bytes.
    pub size: usize,
    /// Valid-data range.
    pub valid: Range<usize>,
    /// The kernel reports `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW`.
    pub sealed: bool,
    /// Pages may still be referenced by a pipe or socket.
    pub lent: bool,
    /// Mapped in this process right now.
    pub unloaded: bool,
}

/// What [`Container::info`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInfo {
    /// One entry per pallet, in order.
    pub pallets: Vec<PalletInfo>,
}

impl ContainerInfo {
    /// Sum of the pallet sizes.
    pub fn capacity(&self) -> usize {
        self.pallets.iter().map(|p| p.size).sum()
    }

    /// Sum of the valid-data lengths.
    pub fn valid_bytes(&self) -> usize {
        self.pallets.iter().map(|p| p.valid.len()).sum()
    }
}

impl Container {
    /// Allocates a container with one fresh pallet per entry of `sizes`, each rounded up to
    /// a page multiple (at least one page). Pallets read as zeros and have empty valid
    /// ranges. One `memfd_create`, `ftruncate`, `F_ADD_SEALS` and `fstat` per pallet.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let c = ferry::containers::Container::alloc(&[1, 4096, 10_000])?;
    /// let page = ferry::stats::page_size();
    /// assert_eq!(c.pallet(0)?.size(), page);
    /// assert_eq!(c.info()?.pallets[2].valid, 0..0);
    /// # Ok(()) }
    /// ```
    pub fn alloc(sizes: &[usize]) -> Result<Self> {
        if sizes.len() > MAX_PALLETS {
            return Err(Error::InvalidArgument("more pallets than MAX_PALLETS"));
        }
        let pallets = sizes
            .iter()
            .map(|&s| Pallet::new(s))
            .collect::<Result<Vec<_>>>()?;
        Ok(Container {
            pallets,
            stats: MapStats::default(),
        })
    }

    /// Allocates a container whose pallets have the sizes of `prototype`'s (fresh memfds,
    /// zeros, empty valid ranges).
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// use ferry::containers::Container;
    /// let a = Container::alloc(&[8192, 4096])?;
    /// let b = Container::alloc_like(&a)?;
    /// assert_eq!(b.len(), 2);
    /// assert_eq!(b.pallet(0)?.size(), a.pallet(0)?.size());
    /// # Ok(()) }
    /// ```
    pub fn alloc_like(prototype: &Container) -> Result<Self> {
        let sizes: Vec<usize> = prototype.pallets.iter().map(|p| p.size).collect();
        Self::alloc(&sizes)
    }

    /// Number of pallets.
    pub fn len(&self) -> usize {
        self.pallets.len()
    }

    /// True for a container with no pallets.
    pub fn is_empty(&self) -> bool {
        self.pallets.is_empty()
    }

    /// Pallet `index`.
    pub fn pallet(&self, index: usize) -> Result<&Pallet> {
        let count = self.pallets.len();
        self.pallets
            .get(index)
            .ok_or(Error::NoSuchPallet { index, count })
    }

    pub(crate) fn pallet_mut(&mut self, index: usize) -> Result<&mut Pallet> {
        let count = self.pallets.len();
        self.pallets
            .get_mut(index)
            .ok_or(Error::NoSuchPallet { index, count })
    }

    /// All pallets, in order.
    pub fn pallets(&self) -> &[Pallet] {
        &self.pallets
    }

    /// Sizes, valid ranges and flags of every pallet. Asks the kernel for the seals
    /// (one `fcntl(F_GET_SEALS)` per pallet).
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let c = ferry::containers::Container::alloc(&[4096, 4096])?;
    /// let info = c.info()?;
    /// assert_eq!(info.capacity(), 8192);
    /// assert!(!info.pallets[0].sealed);
    /// # Ok(()) }
    /// ```
    pub fn info(&self) -> Result<ContainerInfo> {
        let pallets = self
            .pallets
            .iter()
            .map(|p| {
                Ok(PalletInfo {
                    size: p.size,
                    valid: p.valid.clone(),
                    sealed: p.is_sealed()?,
                    lent: p.lent,
                    unloaded: p.unloaded,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ContainerInfo { pallets })
    }

    /// Sets the valid-data range of pallet `index` without touching its bytes (for data
    /// written through [`Pallet::as_fd`] by other means).
    pub fn set_valid(&mut self, index: usize, valid: Range<usize>) -> Result<()> {
        let p = self.pallet_mut(index)?;
        if p.unloaded {
            return Err(Error::PalletUnloaded { pallet: index });
        }
        if valid.start > valid.end || valid.end > p.size {
            return Err(Error::InvalidArgument("valid range outside the pallet"));
        }
        p.valid = valid;
        Ok(())
    }

    /// Seals every pallet with `F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW`, so that no
    /// holder of the memfds, the producer included, can change the bytes again.
    ///
    /// Fails with [`Error::PalletUnloaded`] while any pallet is mapped here, and with an
    /// `EBUSY` [`Error::Io`] if another holder still has a writable mapping or a pipe still
    /// pins pages of a lent pallet. Pallets sealed before the failure stay sealed.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let mut c = ferry::containers::Container::alloc(&[4096])?;
    /// c.seal()?;
    /// assert!(c.is_sealed()?);
    /// assert!(c.unload(0).is_err()); // no writable mapping of a sealed pallet
    /// # Ok(()) }
    /// ```
    pub fn seal(&mut self) -> Result<()> {
        if let Some(i) = self.pallets.iter().position(|p| p.unloaded) {
            return Err(Error::PalletUnloaded { pallet: i });
        }
        for p in &mut self.pallets {
            if !p.sealed {
                sys::seal::add_seals(p.fd.as_fd(), IMMUTABLE)?;
                p.sealed = true;
            }
        }
        Ok(())
    }

    /// True if the kernel reports every pallet sealed (`F_GET_SEALS` on each). A receiver
    /// checks this before trusting bytes from a producer that may have kept the fds.
    pub fn is_sealed(&self) -> Result<bool> {
        for p in &self.pallets {
            if !p.is_sealed()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Frees the pages of pallet `index` outside its valid range, so they read as zeros
    /// (`fallocate(FALLOC_FL_PUNCH_HOLE)`): the explicit cleansing pass for a pallet that
    /// is about to leave the domain with stale bytes around its valid data. A fresh pallet
    /// never needs it. Only whole pages are freed; the partial pages at the edges of the
    /// valid range keep their stale bytes.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let mut c = ferry::containers::Container::alloc(&[3 * 4096])?;
    /// c.unload(0)?.as_mut_slice().fill(7);
    /// c.set_valid(0, 4096..8192)?;
    /// c.cleanse(0)?;
    /// let v = c.view(0)?;
    /// assert_eq!(v.as_slice()[0], 0);
    /// assert_eq!(v.as_slice()[4096], 7);
    /// # Ok(()) }
    /// ```
    pub fn cleanse(&mut self, index: usize) -> Result<()> {
        let p = self.pallet_mut(index)?;
        if p.unloaded {
            return Err(Error::PalletUnloaded { pallet: index });
        }
        if p.sealed {
            return Err(Error::Sealed { pallet: index });
        }
        let page = sys::page_size();
        // With an empty valid range everything goes.
        let (head, tail) = if p.valid.is_empty() {
            (p.size, p.size)
        } else {
            let tail = sys::round_up_pages(p.valid.end).unwrap_or(p.size);
            (p.valid.start & !(page - 1), tail.min(p.size))
        };
        sys::seal::punch_hole(p.fd.as_fd(), 0, head as u64)?;
        sys::seal::punch_hole(p.fd.as_fd(), tail as u64, (p.size - tail) as u64)?;
        Ok(())
    }

    /// This container's recirculation statistics: how its unloads found their addresses.
    pub fn map_stats(&self) -> MapStats {
        self.stats
    }
}
