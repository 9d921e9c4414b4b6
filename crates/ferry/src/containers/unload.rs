//! Unload and reload: mapping one pallet into this process and unmapping it again, at the
//! same address as last time where possible.

use std::ops::Range;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use super::pallet::Pallet;
use super::{cached_address, remember_address, Container, MapStats, COLD, HITS, MISSES};
use crate::error::{Error, Result};
use crate::sys::mem::{Access, Mapping};

/// Maps `p` whole, first trying the address it had last time (`MAP_FIXED_NOREPLACE`, so
/// nothing already mapped there is ever replaced), then anywhere.
fn map_pallet(p: &mut Pallet, stats: &mut MapStats, access: Access) -> Result<Mapping> {
    let hint = p.hint.or_else(|| cached_address(p.id));
    let m = match hint {
        Some(addr) => match Mapping::fixed(addr, p.fd.as_fd(), 0, p.size, access) {
            Ok(m) => {
                stats.hits += 1;
                HITS.fetch_add(1, Ordering::Relaxed);
                m
            }
            Err(_) => {
                stats.misses += 1;
                MISSES.fetch_add(1, Ordering::Relaxed);
                Mapping::shared(p.fd.as_fd(), p.size, access)?
            }
        },
        None => {
            stats.cold += 1;
            COLD.fetch_add(1, Ordering::Relaxed);
            Mapping::shared(p.fd.as_fd(), p.size, access)?
        }
    };
    p.unloaded = true;
    Ok(m)
}

/// Unmaps (by dropping `m`) and remembers where the pallet was.
fn unmap_pallet(p: &mut Pallet, m: Mapping) {
    let addr = m.as_ptr() as usize;
    drop(m);
    p.hint = Some(addr);
    remember_address(p.id, addr);
    p.unloaded = false;
}

impl Container {
    /// Unloads pallet `index`: maps it read-write (`mmap(MAP_SHARED)`) and returns a guard
    /// holding its bytes and valid range. Dropping the guard reloads the pallet (`munmap`)
    /// and keeps the guard's valid range; [`Unloaded::reload`] sets a new one.
    ///
    /// A lent pallet is first moved to a fresh memfd with its valid bytes copied (in the
    /// kernel), so writes here never reach pages a pipe or socket still holds. Fails with
    /// [`Error::Sealed`] on a sealed pallet (use [`view`](Container::view)).
    ///
    /// While the guard lives the container is borrowed, so it cannot be shipped or sealed;
    /// if the guard is leaked with `mem::forget`, the pallet stays marked unloaded and
    /// [`ship`](Container::ship) and [`seal`](Container::seal) refuse.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let mut c = ferry::containers::Container::alloc(&[4096])?;
    /// let mut p = c.unload(0)?;
    /// assert!(p.as_slice().iter().all(|&b| b == 0)); // fresh pallets read as zeros
    /// p.as_mut_slice()[100..103].copy_from_slice(b"abc");
    /// p.reload(100..103)?;
    /// assert_eq!(c.pallet(0)?.valid(), 100..103);
    /// # Ok(()) }
    /// ```
    pub fn unload(&mut self, index: usize) -> Result<Unloaded<'_>> {
        let p = mappable(&mut self.pallets, index)?;
        if p.sealed {
            return Err(Error::Sealed { pallet: index });
        }
        p.unlend(true)?;
        let map = map_pallet(p, &mut self.stats, Access::ReadWrite)?;
        let valid = p.valid.clone();
        Ok(Unloaded {
            pallet: p,
            map: Some(map),
            valid,
        })
    }

    /// Unloads every pallet read-write at once; see [`unload`](Container::unload).
    pub fn unload_all(&mut self) -> Result<Vec<Unloaded<'_>>> {
        if let Some(i) = self.pallets.iter().position(|p| p.unloaded) {
            return Err(Error::PalletUnloaded { pallet: i });
        }
        if let Some(i) = self.pallets.iter().position(|p| p.sealed) {
            return Err(Error::Sealed { pallet: i });
        }
        let stats = &mut self.stats;
        let mut out = Vec::with_capacity(self.pallets.len());
        for p in self.pallets.iter_mut() {
            p.unlend(true)?;
            let map = map_pallet(p, stats, Access::ReadWrite)?;
            let valid = p.valid.clone();
            out.push(Unloaded {
                pallet: p,
                map: Some(map),
                valid,
            });
        }
        Ok(out)
    }

    /// Maps pallet `index` read-only (`mmap(PROT_READ, MAP_SHARED)`), the way a receiver
    /// reads a sealed pallet; unmapped when the guard drops. Lent pallets need no copy here.
    ///
    /// ```
    /// # fn main() -> ferry::Result<()> {
    /// let mut c = ferry::containers::Container::alloc(&[4096])?;
    /// c.seal()?;
    /// let v = c.view(0)?;
    /// assert_eq!(v.as_slice().len(), 4096);
    /// # Ok(()) }
    /// ```
    pub fn view(&mut self, index: usize) -> Result<View<'_>> {
        let p = mappable(&mut self.pallets, index)?;
        let map = map_pallet(p, &mut self.stats, Access::Read)?;
        Ok(View {
            pallet: p,
            map: Some(map),
        })
    }
}

/// A pallet unloaded read-write: its whole mapping and a valid range to edit. Dropping it
/// reloads the pallet (unmaps it) and stores the valid range.
#[derive(Debug)]
pub struct Unloaded<'a> {
    pallet: &'a mut Pallet,
    map: Option<Mapping>,
    valid: Range<usize>,
}

impl Unloaded<'_> {
    fn map(&self) -> &Mapping {
        self.map.as_ref().expect("mapped until drop")
    }

    /// The whole pallet, read-only.
    pub fn as_slice(&self) -> &[u8] {
        let m = self.map();
        // SAFETY: the mapping covers `len` bytes and lives until this guard drops; `&self`
        // forbids a simultaneous `&mut` from this guard. Another holder of the memfd (a
        // domain that kept the fd) could write concurrently; bytes have no invalid values,
        // and an unsealed pallet promises no more than that.
        unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) }
    }

    /// The whole pallet, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let m = self.map();
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference from this
        // process, since the pallet is mapped only through this guard.
        unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) }
    }

    /// The valid range as it stands (set at unload, changed by [`set_valid`](Self::set_valid)).
    pub fn valid(&self) -> Range<usize> {
        self.valid.clone()
    }

    /// The valid bytes.
    pub fn valid_bytes(&self) -> &[u8] {
        &self.as_slice()[self.valid.clone()]
    }

    /// Address of the mapping (to observe recirculation).
    pub fn addr(&self) -> usize {
        self.map().as_ptr() as usize
    }

    /// Changes the valid range that reload will store.
    pub fn set_valid(&mut self, valid: Range<usize>) -> Result<()> {
        if valid.start > valid.end || valid.end > self.pallet.size {
            return Err(Error::InvalidArgument("valid range outside the pallet"));
        }
        self.valid = valid;
        Ok(())
    }

    /// Reloads the pallet: unmaps it and sets its valid range to `valid`. On a bad range
    /// the pallet is still reloaded, with its valid range unchanged from the unload.
    pub fn reload(mut self, valid: Range<usize>) -> Result<()> {
        let r = self.set_valid(valid);
        if r.is_err() {
            self.valid = self.pallet.valid.clone();
        }
        r
    }
}

impl Drop for Unloaded<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
            self.pallet.valid = self.valid.clone();
            unmap_pallet(self.pallet, m);
        }
    }
}

/// A pallet mapped read-only; unmapped when dropped.
#[derive(Debug)]
pub struct View<'a> {
    pallet: &'a mut Pallet,
    map: Option<Mapping>,
}

impl View<'_> {
    /// The whole pallet.
    pub fn as_slice(&self) -> &[u8] {
        let m = self.map.as_ref().expect("mapped until drop");
        // SAFETY: the mapping covers `len` bytes and lives until this guard drops. If the
        // pallet is sealed no one can write it; otherwise see `Unloaded::as_slice`.
        unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) }
    }

    /// The pallet's valid range.
    pub fn valid(&self) -> Range<usize> {
        self.pallet.valid.clone()
    }

    /// The valid bytes.
    pub fn valid_bytes(&self) -> &[u8] {
        &self.as_slice()[self.pallet.valid.clone()]
    }

    /// Address of the mapping.
    pub fn addr(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.as_ptr() as usize)
    }
}

impl Drop for View<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
            unmap_pallet(self.pallet, m);
        }
    }
}

/// Pallet `index`, if it exists and is not mapped already.
fn mappable(pallets: &mut [Pallet], index: usize) -> Result<&mut Pallet> {
    let count = pallets.len();
    let p = pallets
        .get_mut(index)
        .ok_or(Error::NoSuchPallet { index, count })?;
    if p.unloaded {
        return Err(Error::PalletUnloaded { pallet: index });
    }
    Ok(p)
}
