//! Groups: a named set of domains that find each other through a control block in
//! `/dev/shm`, with no daemon.
//!
//! ```text
//! /dev/shm/ferry.<name>
//! +--------------------------------------------------------------+
//! | GroupHeader: magic, version, base address, lot size/stride,  |
//! |              offer sequence (futex word)                     |
//! | SlotRaw[0]:  state, generation, pid, start time, lot fd,     |
//! |              OfferRaw[MAX_OFFERS] (channels offered by slot) |
//! | SlotRaw[1] ...                                               |
//! +--------------------------------------------------------------+
//! ```
//! Slot `i`'s lot lives at `base_addr + i * lot_stride` in every process of the group.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ledger::LedgerRaw;
use crate::error::{Error, Result};
use crate::segment::LotId;
use crate::sys::fd::{pidfd, process_start_time};
use crate::sys::mem::{Access, Mapping};

/// Domains a group can hold.
pub const MAX_SLOTS: usize = 64;
/// Channels one domain can have offered and not yet accepted at once.
pub const MAX_OFFERS: usize = 8;

const MAGIC: u64 = u64::from_le_bytes(*b"FERRYGRP");
const VERSION: u32 = 3;

/// Slot states.
pub(crate) const SLOT_FREE: u32 = 0;
pub(crate) const SLOT_CLAIMING: u32 = 1;
pub(crate) const SLOT_LIVE: u32 = 2;

/// Offer states.
pub(crate) const OFFER_FREE: u32 = 0;
pub(crate) const OFFER_WRITING: u32 = 1;
pub(crate) const OFFER_OPEN: u32 = 2;
pub(crate) const OFFER_TAKEN: u32 = 3;

/// A channel one domain offers to another: the descriptor numbers the acceptor
/// duplicates with `pidfd_getfd`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct OfferRaw {
    pub state: AtomicU32,
    pub to_slot: AtomicU32,
    pub to_generation: AtomicU32,
    pub chan_fd: AtomicU32,
    pub rx_efd: AtomicU32,
    pub tx_efd: AtomicU32,
    pub rel_efd: AtomicU32,
}

/// One domain's entry.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SlotRaw {
    pub state: AtomicU32,
    pub generation: AtomicU32,
    pub pid: AtomicU32,
    pub lot_fd: AtomicU32,
    pub start_time: AtomicU64,
    pub offers: [OfferRaw; MAX_OFFERS],
}

/// The control block's header. Plain fields are written once by the creator before it
/// publishes `magic` with Release; joiners read them after an Acquire load of `magic`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct GroupHeader {
    pub magic: AtomicU64,
    pub version: u32,
    pub max_slots: u32,
    pub base_addr: u64,
    pub lot_stride: u64,
    pub lot_size: u64,
    /// Bumped and futex-woken whenever a channel is offered.
    pub offer_seq: AtomicU32,
    pub _pad: u32,
    pub slots: [SlotRaw; MAX_SLOTS],
    /// Each slot's reference ledger (see [`super::ledger`]), written only by its owner.
    pub ledgers: [LedgerRaw; MAX_SLOTS],
}

/// How a group lays out its lots. Only the creator's configuration counts; joiners
/// adopt what the control block says.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Address of slot 0's lot in every process; it must be free in all of them. `None`
    /// picks one from a hash of the group's name, so that one process can belong to
    /// several groups.
    pub base_addr: Option<usize>,
    /// Size of each domain's lot, a page multiple. Lots are sparse memfds: untouched
    /// pages cost nothing.
    pub lot_size: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            base_addr: None,
            lot_size: 1 << 30,
        }
    }
}

/// Where groups place their lots when no base address is given: 64 TiB of address space
/// below where position-independent executables and the mmap area usually sit.
const REGION_START: u64 = 0x1000_0000_0000;
const REGION_LEN: u64 = 0x4000_0000_0000;

/// The default base address of group `name` whose lots are `lot_size` bytes.
fn default_base(name: &str, lot_size: u64) -> u64 {
    let span = lot_size * MAX_SLOTS as u64;
    let buckets = (REGION_LEN / span).max(1);
    // FNV-1a: stable across processes and builds, unlike std's randomised hasher.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    REGION_START + (h % buckets) * span
}

/// Identifies a domain within its group: its slot and the slot's generation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainId {
    /// Slot index.
    pub slot: u16,
    /// Generation of the slot (bumped each time a domain claims it).
    pub generation: u32,
}

impl std::fmt::Display for DomainId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.slot, self.generation)
    }
}

impl std::str::FromStr for DomainId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (a, b) = s
            .split_once('.')
            .ok_or(Error::InvalidArgument("domain id is SLOT.GENERATION"))?;
        Ok(DomainId {
            slot: a.parse().map_err(|_| Error::InvalidArgument("bad slot"))?,
            generation: b
                .parse()
                .map_err(|_| Error::InvalidArgument("bad generation"))?,
        })
    }
}

/// A live member of a group, as seen in its control block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The domain.
    pub id: DomainId,
    /// Its process id.
    pub pid: u32,
}

/// An open group: a mapping of its control block.
///
/// Create or join one with [`Group::open`], then make this process a member with
/// [`Group::join`](crate::Group::join).
#[derive(Debug)]
pub struct Group {
    name: String,
    path: PathBuf,
    map: Mapping,
    _file: File,
}

impl Group {
    /// Opens the group `name`, creating it with the default configuration if it does not
    /// exist. The control block lives in `/dev/shm/ferry.<name>`.
    pub fn open(name: &str) -> Result<Arc<Group>> {
        Self::open_with(name, GroupConfig::default())
    }

    /// Opens the group `name`, creating it with `config` if it does not exist.
    pub fn open_with(name: &str, config: GroupConfig) -> Result<Arc<Group>> {
        if name.is_empty() || name.contains('/') || name.len() > 200 {
            return Err(Error::InvalidArgument(
                "group name must be 1..200 chars, no '/'",
            ));
        }
        if config.lot_size == 0 || config.lot_size % crate::sys::page_size() != 0 {
            return Err(Error::InvalidArgument(
                "lot size must be a non-zero page multiple",
            ));
        }
        let path = PathBuf::from(format!("/dev/shm/ferry.{name}"));
        let size = std::mem::size_of::<GroupHeader>();
        crate::sys::count();
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path);
        let (file, fresh) = match created {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                crate::sys::count();
                (
                    OpenOptions::new().read(true).write(true).open(&path)?,
                    false,
                )
            }
            Err(e) => return Err(e.into()),
        };
        if fresh {
            crate::sys::count();
            file.set_len(size as u64)?;
        } else {
            // The creator may not have sized it yet.
            let deadline = Instant::now() + Duration::from_secs(2);
            while crate::sys::fd::file_len(file.as_fd())? < size as u64 {
                if Instant::now() > deadline {
                    return Err(Error::BadGroup(format!("{} is too small", path.display())));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let map = Mapping::shared(file.as_fd(), size, Access::ReadWrite)?;
        let g = Group {
            name: name.to_owned(),
            path,
            map,
            _file: file,
        };
        let h = g.header_ptr();
        if fresh {
            // SAFETY: we created the file and nobody reads the plain fields before we
            // publish `magic`; the mapping is at least `size` bytes and page aligned.
            unsafe {
                (*h).version = VERSION;
                (*h).max_slots = MAX_SLOTS as u32;
                (*h).base_addr = match config.base_addr {
                    Some(a) => a as u64,
                    None => default_base(name, config.lot_size as u64),
                };
                (*h).lot_size = config.lot_size as u64;
                (*h).lot_stride = config.lot_size as u64;
            }
            // SYNC: pairs with the Acquire load of `magic` by joiners below.
            g.header().magic.store(MAGIC, Ordering::Release);
        } else {
            let deadline = Instant::now() + Duration::from_secs(2);
            // SYNC: pairs with the creator's Release store of `magic`.
            while g.header().magic.load(Ordering::Acquire) != MAGIC {
                if Instant::now() > deadline {
                    return Err(Error::BadGroup(format!(
                        "{} has no ferry header",
                        g.path.display()
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let h = g.header();
            if h.version != VERSION || h.max_slots as usize != MAX_SLOTS {
                return Err(Error::BadGroup(format!(
                    "version {} (want {VERSION})",
                    h.version
                )));
            }
            let end = (h.base_addr as u128) + (h.lot_stride as u128) * MAX_SLOTS as u128;
            if h.lot_size == 0 || h.lot_stride < h.lot_size || end > (1u128 << 47) {
                return Err(Error::BadGroup("lot geometry out of range".into()));
            }
        }
        Ok(Arc::new(g))
    }

    fn header_ptr(&self) -> *mut GroupHeader {
        self.map.as_ptr().cast()
    }

    pub(crate) fn header(&self) -> &GroupHeader {
        // SAFETY: the mapping is at least size_of::<GroupHeader>() bytes, page aligned,
        // lives as long as `self`, and other processes change only its atomic fields
        // (plain fields are set once before `magic` is published).
        unsafe { &*self.header_ptr() }
    }

    pub(crate) fn slot(&self, i: u16) -> &SlotRaw {
        &self.header().slots[i as usize]
    }

    /// Slot `i`'s reference ledger.
    pub(crate) fn ledger(&self, i: u16) -> &LedgerRaw {
        &self.header().ledgers[i as usize]
    }

    /// True if domain `id` is a member now: its slot is live, of that generation, and
    /// owned by a running process.
    pub(crate) fn domain_live(&self, id: LotId) -> bool {
        if id.slot as usize >= MAX_SLOTS {
            return false;
        }
        let s = self.slot(id.slot);
        s.state.load(Ordering::Acquire) == SLOT_LIVE
            && s.generation.load(Ordering::Acquire) == id.generation
            && self.pid_alive(
                s.pid.load(Ordering::Relaxed),
                s.start_time.load(Ordering::Relaxed),
            )
    }

    /// Slots whose state says live (their processes may have died since).
    pub(crate) fn live_slots(&self) -> impl Iterator<Item = u16> + '_ {
        (0..MAX_SLOTS as u16).filter(|&i| self.slot(i).state.load(Ordering::Acquire) == SLOT_LIVE)
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the control block.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Size of every lot in the group.
    pub fn lot_size(&self) -> usize {
        self.header().lot_size as usize
    }

    /// Address of slot `i`'s lot in every process of the group.
    pub fn lot_addr(&self, i: u16) -> usize {
        let h = self.header();
        (h.base_addr + h.lot_stride * i as u64) as usize
    }

    /// The live members, as recorded in the control block (dead ones are skipped).
    pub fn members(&self) -> Vec<Member> {
        (0..MAX_SLOTS as u16)
            .filter_map(|i| {
                let s = self.slot(i);
                if s.state.load(Ordering::Acquire) != SLOT_LIVE {
                    return None;
                }
                let pid = s.pid.load(Ordering::Relaxed);
                let generation = s.generation.load(Ordering::Relaxed);
                self.pid_alive(pid, s.start_time.load(Ordering::Relaxed))
                    .then_some(Member {
                        id: DomainId {
                            slot: i,
                            generation,
                        },
                        pid,
                    })
            })
            .collect()
    }

    /// True if `pid` is a running process with start time `start` (pid reuse check).
    pub(crate) fn pid_alive(&self, pid: u32, start: u64) -> bool {
        pid != 0 && process_start_time(pid).is_ok_and(|t| t == start)
    }

    /// Claims a slot for this process: a free one, or one whose domain died. Returns the
    /// slot index and its new generation; the slot is left in `SLOT_CLAIMING`.
    pub(crate) fn claim_slot(&self) -> Result<(u16, u32)> {
        let me = std::process::id();
        let start = process_start_time(me)?;
        for i in 0..MAX_SLOTS as u16 {
            let s = self.slot(i);
            let st = s.state.load(Ordering::Acquire);
            let got = match st {
                SLOT_FREE => s
                    .state
                    .compare_exchange(
                        SLOT_FREE,
                        SLOT_CLAIMING,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok(),
                SLOT_LIVE => {
                    let pid = s.pid.load(Ordering::Relaxed);
                    if self.pid_alive(pid, s.start_time.load(Ordering::Relaxed)) {
                        false
                    } else {
                        // The owner died without leaving: take the slot over.
                        s.state
                            .compare_exchange(
                                SLOT_LIVE,
                                SLOT_CLAIMING,
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                    }
                }
                _ => false,
            };
            if got {
                let generation = s.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                s.pid.store(me, Ordering::Relaxed);
                s.start_time.store(start, Ordering::Relaxed);
                for o in &s.offers {
                    o.state.store(OFFER_FREE, Ordering::Relaxed);
                }
                // A dead previous owner's holds and channels mean nothing now.
                self.ledger(i).clear();
                return Ok((i, generation));
            }
        }
        Err(Error::GroupFull)
    }

    /// Publishes a claimed slot as live with its lot descriptor.
    pub(crate) fn publish_slot(&self, i: u16, lot_fd: i32) {
        let s = self.slot(i);
        s.lot_fd.store(lot_fd as u32, Ordering::Relaxed);
        // SYNC: pairs with the Acquire loads of `state` by peers mapping this lot.
        s.state.store(SLOT_LIVE, Ordering::Release);
    }

    /// Gives a slot back. If no live member remains, removes the control block.
    pub(crate) fn release_slot(&self, i: u16, generation: u32) {
        let s = self.slot(i);
        if s.generation.load(Ordering::Acquire) == generation
            && s.pid.load(Ordering::Relaxed) == std::process::id()
        {
            s.pid.store(0, Ordering::Relaxed);
            s.state.store(SLOT_FREE, Ordering::Release);
        }
        if self.members().is_empty() {
            crate::sys::count();
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// A pidfd for the live domain `id`, or `PeerGone`/`UnknownLot` if it is not live.
    pub(crate) fn peer_pidfd(&self, id: DomainId) -> Result<(u32, std::os::fd::OwnedFd)> {
        let s = self.slot(id.slot);
        if s.state.load(Ordering::Acquire) != SLOT_LIVE
            || s.generation.load(Ordering::Acquire) != id.generation
        {
            return Err(Error::PeerGone {
                pid: s.pid.load(Ordering::Relaxed),
            });
        }
        let pid = s.pid.load(Ordering::Relaxed);
        let fd = pidfd(pid).map_err(|_| Error::PeerGone { pid })?;
        // Re-check after opening: the pidfd must name the process that owns the slot.
        if !self.pid_alive(pid, s.start_time.load(Ordering::Relaxed))
            || s.generation.load(Ordering::Acquire) != id.generation
        {
            return Err(Error::PeerGone { pid });
        }
        Ok((pid, fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(std::mem::size_of::<OfferRaw>(), 28);
        assert_eq!(std::mem::size_of::<SlotRaw>(), 24 + 28 * MAX_OFFERS);
        assert_eq!(std::mem::offset_of!(GroupHeader, offer_seq), 40);
        assert_eq!(std::mem::offset_of!(GroupHeader, slots), 48);
        assert_eq!(std::mem::align_of::<GroupHeader>(), 8);
        // Sparse: the ledgers' pages cost memory only once written.
        assert!(std::mem::size_of::<GroupHeader>() < 8 << 20);
    }

    #[test]
    fn domain_id_round_trips() {
        let id = DomainId {
            slot: 3,
            generation: 17,
        };
        assert_eq!(id.to_string().parse::<DomainId>().unwrap(), id);
        assert!("3".parse::<DomainId>().is_err());
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(matches!(Group::open("a/b"), Err(Error::InvalidArgument(_))));
        assert!(matches!(Group::open(""), Err(Error::InvalidArgument(_))));
    }
}
