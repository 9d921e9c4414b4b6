//! Lots: one memfd per domain, mapped read-write in its owner and read-only everywhere
//! else, at the same address in every process of the group: one of its slot's address
//! windows (see `group.rs`), the one after the previous domain's of the slot, so that a
//! process still holding a departed domain's messages can map its successor's lot.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::group::{DomainId, Group, LOT_WINDOWS};
pub(crate) use super::pages::{Pages, HUGE_PAGE};
use crate::error::{BadDescriptor, Error, Result};
use crate::segment::LotId;
use crate::sync::lock;
use crate::sys::fd::{memfd, memfd_huge, open_peer_memfd, PeerOpen};
use crate::sys::mem::{Access, Mapping};
use crate::sys::page_size;

/// Number of size classes: class `k` holds spans of `2^k` pages.
pub(crate) const CLASSES: usize = 40;

/// The smallest size class a lot of `pages` serves: a hugetlb lot cannot be split (nor
/// protected) below 2 MiB.
pub(crate) fn min_class(pages: Pages) -> usize {
    match pages {
        Pages::HugeTlb => (HUGE_PAGE / page_size()).trailing_zeros() as usize,
        _ => 0,
    }
}

/// The size class holding `len` bytes, and that class's span size in bytes.
pub(crate) fn class_of(len: usize) -> (usize, usize) {
    let pages = len.div_ceil(page_size()).max(1);
    let k = pages.next_power_of_two().trailing_zeros() as usize;
    (k, page_size() << k)
}

/// Lots owned by domains of this process, by (group path, slot, generation): a second
/// domain in the same process reads them through the owner's mapping, since the
/// group-wide address is already taken by it here.
type LocalLots = Mutex<HashMap<(std::path::PathBuf, LotId), Weak<Lot>>>;

fn local_lots() -> &'static LocalLots {
    static LOTS: OnceLock<LocalLots> = OnceLock::new();
    LOTS.get_or_init(Default::default)
}

/// The lot `id` of `group` if a domain of this process owns it.
pub(crate) fn local_lot(group: &Group, id: LotId) -> Option<Arc<Lot>> {
    let m = lock(local_lots());
    m.get(&(group.file_path().to_owned(), id))
        .and_then(Weak::upgrade)
}

/// Peers' lots mapped in this process, by (group path, slot, generation): every domain
/// of the process reads a peer's lot through one mapping, since the group-wide address
/// can be mapped only once here.
type PeerLots = Mutex<HashMap<(std::path::PathBuf, LotId), Weak<PeerLot>>>;

fn peer_lots() -> &'static PeerLots {
    static LOTS: OnceLock<PeerLots> = OnceLock::new();
    LOTS.get_or_init(Default::default)
}

/// Lot `id` of `group` if a domain of this process has it mapped already.
pub(crate) fn mapped_peer_lot(group: &Group, id: LotId) -> Option<Arc<PeerLot>> {
    lock(peer_lots())
        .get(&(group.file_path().to_owned(), id))
        .and_then(Weak::upgrade)
}

/// The lot of slot `slot` of `group` this process has mapped at `addr`, if any: an
/// earlier domain's of that slot, whose window a new one cannot share.
pub(crate) fn peer_lot_at(group: &Group, slot: u16, addr: usize) -> Option<LotId> {
    lock(peer_lots())
        .iter()
        .filter(|((path, id), _)| path == group.file_path() && id.slot == slot)
        .filter_map(|(_, w)| w.upgrade())
        .find(|p| p.base() as usize == addr)
        .map(|p| p.id)
}

/// Records a peer lot this process mapped, for its other domains.
pub(crate) fn note_peer_lot(group: &Group, lot: &Arc<PeerLot>) {
    let mut m = lock(peer_lots());
    m.retain(|_, w| w.strong_count() > 0);
    m.insert((group.file_path().to_owned(), lot.id), Arc::downgrade(lot));
}

/// Carves a lot into power-of-two spans: a bump pointer plus a free list per class.
#[derive(Debug, Default)]
struct Spans {
    bump: u64,
    free: Vec<Vec<u64>>,
}

/// This domain's own lot. Dropping it (after every fbuf is gone) unmaps it and frees the
/// group slot.
#[derive(Debug)]
pub(crate) struct Lot {
    pub group: Arc<Group>,
    pub id: LotId,
    map: Mapping,
    // Kept open so peers can reopen it read-only through /proc/PID/fd.
    fd: OwnedFd,
    spans: Mutex<Spans>,
    /// The group's setting: [`Pages::HugeTlb`] for a hugetlbfs memfd.
    pages: Pages,
}

impl Lot {
    /// Claims a slot in `group` and creates its lot in one of the slot's address windows:
    /// the one after the previous domain's, or the next free here after it.
    pub fn create(group: Arc<Group>) -> Result<Arc<Lot>> {
        let (slot, generation, first) = group.claim_slot()?;
        let pages = group.pages();
        let made = (|| {
            let len = group.lot_size();
            let fd = if pages == Pages::HugeTlb {
                memfd_huge("ferry-lot", len as u64)?
            } else {
                memfd("ferry-lot", len as u64)?
            };
            // Peers map it: fix its size, so that not even we can shrink it under them.
            crate::sys::seal::fix_size(fd.as_fd())?;
            let mut last = None;
            for k in 0..LOT_WINDOWS {
                let w = (first + k) % LOT_WINDOWS;
                let addr = group.window_addr(slot, w);
                match Mapping::fixed(addr, fd.as_fd(), 0, len, Access::ReadWrite) {
                    Ok(map) => return Ok::<_, Error>((fd, map, w)),
                    // This process still maps an earlier lot of the slot there.
                    Err(e @ Error::AddressInUse { .. }) => last = Some(e),
                    // A shared hugetlb mapping reserves its pages from the pool up front.
                    Err(Error::Io(e))
                        if pages == Pages::HugeTlb && e.raw_os_error() == Some(libc::ENOMEM) =>
                    {
                        return Err(Error::NoHugePages {
                            lot_size: len,
                            free: crate::sys::fd::free_huge_pages(),
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(last.expect("at least one window"))
        })();
        let (fd, map, window) = match made {
            Ok(v) => v,
            Err(e) => {
                group.release_slot(slot, generation);
                return Err(e);
            }
        };
        group.publish_slot(slot, fd.as_raw_fd(), window);
        let id = LotId { slot, generation };
        let key = (group.file_path().to_owned(), id);
        let lot = Arc::new(Lot {
            group,
            id,
            map,
            fd,
            spans: Mutex::new(Spans {
                bump: 0,
                free: vec![Vec::new(); CLASSES],
            }),
            pages,
        });
        let mut m = lock(local_lots());
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(key, Arc::downgrade(&lot));
        Ok(lot)
    }

    /// The domain that owns this lot.
    pub fn domain_id(&self) -> DomainId {
        DomainId {
            slot: self.id.slot,
            generation: self.id.generation,
        }
    }

    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// The group's page setting this lot was made with.
    pub fn pages(&self) -> Pages {
        self.pages
    }

    /// Takes a span of class `k` from the lot, or `None` if the lot is exhausted. With
    /// `huge_aligned`, the span starts at a 2 MiB-aligned address (so that it can be
    /// collapsed into huge pages); the bytes skipped to get there go to the free lists.
    pub fn take(&self, k: usize, huge_aligned: bool) -> Option<u64> {
        let page = page_size() as u64;
        let size = page << k;
        let base = self.base() as u64;
        let huge = HUGE_PAGE as u64;
        let fits = |off: u64| !huge_aligned || (base + off) % huge == 0;
        let mut s = lock(&self.spans);
        if let Some(i) = s.free[k].iter().rposition(|&o| fits(o)) {
            return Some(s.free[k].swap_remove(i));
        }
        let mut off = s.bump;
        if huge_aligned {
            off += (huge - (base + off) % huge) % huge;
        }
        let end = off.checked_add(size)?;
        if end > self.len() as u64 {
            return None;
        }
        // The skipped bytes, as power-of-two spans (spans need no alignment of their own).
        let (mut at, mut pages) = (s.bump, (off - s.bump) / page);
        while pages > 0 {
            let j = 63 - pages.leading_zeros() as usize;
            s.free[j].push(at);
            at += page << j;
            pages -= 1 << j;
        }
        s.bump = end;
        Some(off)
    }

    /// Gives spans of class `k` back to the lot.
    pub fn give(&self, k: usize, offs: impl IntoIterator<Item = u64>) {
        let mut s = lock(&self.spans);
        s.free[k].extend(offs);
    }
}

impl Drop for Lot {
    fn drop(&mut self) {
        self.group.release_slot(self.id.slot, self.id.generation);
    }
}

/// Another domain's lot, mapped read-only at the group-wide address.
#[derive(Debug)]
pub(crate) struct PeerLot {
    pub id: LotId,
    map: Mapping,
    /// The read-only descriptor, for receivers that map per transfer.
    fd: OwnedFd,
}

impl PeerLot {
    /// Maps the lot of domain `id` read-only, in the window its slot records. The
    /// descriptor is reopened through `/proc/PID/fd/N` with `O_RDONLY`, so this process
    /// could not map it writable even if it tried; before that, it is checked to be a
    /// memfd on shmem (see [`open_peer_memfd`]), so that nothing the peer put behind the
    /// number can make this wait, and then that it is sealed against resizing and of the
    /// lot's size.
    ///
    /// # Errors
    /// [`BadDescriptor::PeerFile`] naming the peer and what its lot descriptor is
    /// instead; [`Error::AddressInUse`] if the window is mapped here already;
    /// [`Error::PeerGone`] if the peer is gone.
    pub fn map(group: &Group, id: LotId) -> Result<PeerLot> {
        use std::sync::atomic::Ordering;
        let unknown = || {
            Error::BadDescriptor(BadDescriptor::UnknownLot {
                slot: id.slot,
                generation: id.generation,
            })
        };
        let live = |s: &super::group::SlotRaw| {
            s.state.load(Ordering::Acquire) == super::group::SLOT_LIVE
                && s.generation.load(Ordering::Acquire) == id.generation
        };
        // The slot number comes from another process: check it before indexing.
        if id.slot as usize >= super::group::MAX_SLOTS {
            return Err(unknown());
        }
        let s = group.slot(id.slot);
        if !live(s) {
            return Err(unknown());
        }
        let pid = s.pid.load(Ordering::Relaxed);
        let start = s.start_time.load(Ordering::Relaxed);
        let window = s.window.load(Ordering::Relaxed) as usize;
        let lot_fd = s.lot_fd.load(Ordering::Relaxed);
        if window >= LOT_WINDOWS {
            return Err(unknown());
        }
        if !super::group::pid_alive(pid, start) {
            return Err(Error::PeerGone { pid });
        }
        // The lot is opened through its process's descriptor table: it must run as a
        // user the group admits.
        group.admit(pid)?;
        let bad = |why: String| {
            Error::BadDescriptor(BadDescriptor::PeerFile {
                slot: id.slot,
                generation: id.generation,
                pid,
                what: "lot",
                why,
            })
        };
        let len = group.lot_size();
        let fd = match open_peer_memfd(pid, lot_fd as i32, group.pages() == Pages::HugeTlb) {
            Ok(PeerOpen::Opened(fd)) => fd,
            Ok(PeerOpen::NotMemfd(why)) => return Err(bad(why)),
            Err(_) if !super::group::pid_alive(pid, start) => return Err(Error::PeerGone { pid }),
            Err(e) => {
                return Err(bad(format!(
                    "number {lot_fd}, which cannot be opened ({e})"
                )))
            }
        };
        // A lot whose size is not sealed could be truncated under our mapping (SIGBUS on
        // the next read): refuse it.
        match crate::sys::seal::check_fixed_size(fd.as_fd(), len as u64) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                return Err(bad(format!("a memfd of the wrong size (not {len} bytes)")))
            }
            Err(_) => {
                return Err(bad(
                    "a memfd not sealed against growing and shrinking".into()
                ))
            }
        }
        let map = Mapping::fixed(
            group.window_addr(id.slot, window),
            fd.as_fd(),
            0,
            len,
            Access::Read,
        )?;
        // The slot must still belong to the same domain, or we may have opened a new
        // owner's descriptor of the same number.
        if !live(s)
            || s.pid.load(Ordering::Relaxed) != pid
            || s.start_time.load(Ordering::Relaxed) != start
        {
            return Err(unknown());
        }
        Ok(PeerLot { id, map, fd })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two_pages() {
        let p = page_size();
        assert_eq!(class_of(1), (0, p));
        assert_eq!(class_of(p), (0, p));
        assert_eq!(class_of(p + 1), (1, 2 * p));
        assert_eq!(class_of(3 * p), (2, 4 * p));
        assert_eq!(class_of(64 << 20), (14, 64 << 20));
        assert_eq!(class_of(0), (0, p));
    }
}
