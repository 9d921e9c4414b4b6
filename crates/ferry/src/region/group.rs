//! Groups: a named set of domains that find each other through `/dev/shm`, with no
//! daemon.
//!
//! The state members share, the control block, lives in a memfd sealed against
//! shrinking and growing, so no one can truncate it under the others' mappings (a named
//! file cannot be sealed: truncating one SIGBUSes every process that maps it). The named
//! file only bootstraps: it holds *doors*, the processes that have the group open and
//! the descriptor number of their copy of the control memfd. It is read and written
//! with `pread`/`pwrite` under `flock`, never mapped.
//!
//! ```text
//!  /dev/shm/ferry.<name>  (read and written under flock(LOCK_EX), never mapped)
//! +--------------------------------------------------------------+
//! | TableHead: magic "FERRYDOR", version, door count (16 bytes)  |
//! | Door[0]:   pid, fd number of its control memfd, start time   |
//! | Door[1] ...                      (pid 0: free; DOORS in all) |
//! +--------------------------------------------------------------+
//!          | pidfd_getfd(pidfd_open(pid), fd)
//!          v
//!  control memfd "ferry.<name>"   (F_SEAL_SHRINK | GROW | SEAL, mapped by every member)
//! +--------------------------------------------------------------+
//! | GroupHeader: magic, version, base address, lot size/stride,  |
//! |              offer sequence (futex word)                     |
//! | SlotRaw[0]:  state, generation, pid, start time, lot fd,     |
//! |              OfferRaw[MAX_OFFERS] (channels offered by slot) |
//! | SlotRaw[1] ...                                               |
//! | LedgerRaw[MAX_SLOTS]: each domain's holds and inbound        |
//! |              channels (see `ledger.rs`), sparse              |
//! | ServiceArea: SERVICE_WORDS words that the `service` module   |
//! |              lays out (named services and their members)     |
//! | ActivityRaw[MAX_SLOTS]: each domain's paths (fbufs out) and  |
//! |              sending channels (messages in flight), see      |
//! |              `activity.rs`                                   |
//! +--------------------------------------------------------------+
//! ```
//! Each slot has [`LOT_WINDOWS`] address windows, `lot_stride` apart: window `w` of slot
//! `i` starts at `base_addr + (i * LOT_WINDOWS + w) * lot_stride`. A domain's lot lives in
//! one of its slot's windows, the same in every process of the group, recorded in the
//! slot. Each new domain of a slot takes the window after its predecessor's, so that a
//! process still holding messages of a domain that left (its lot stays mapped there until
//! they are dropped) can map the lot of the slot's next domain.
//!
//! Opening: open the named file without following a symbolic link, or create it
//! exclusively with the access policy's mode and group (see [`super::access`]: mode
//! 0600 by default), and check it with `fstat` (a regular file with one link, owned by
//! this user or shared with an admitted Unix group, no permission beyond the policy);
//! anything else is refused and left as it is. Lock it, and check that the file locked
//! is still the one at the path (a last member may have unlinked it meanwhile: then
//! start over). Read the door table; for each door whose process is alive and runs as
//! a user the group admits, duplicate its descriptor with `pidfd_getfd` and check it: a
//! shmem memfd named `ferry.<name>`, sealed against shrinking and growing (and not
//! against writing), of exactly the control block's size, and with a header of this
//! version and sane geometry. The first that passes is the group. If there are live
//! doors and none passes, opening fails, naming the first and why: starting a second
//! group of the same name would split the group silently (its services invisible to
//! half the processes). With no live door, create a new control memfd, size it, seal
//! it and initialise its header. Then write this process's own door into a free or dead
//! entry (with the table full the process still works, but is no door) and unlock. A
//! named file of length 0 is a table being created; any other that does not validate is
//! unlinked and opening starts over if this user owns it (no one writes into a file an
//! older ferry may have mapped), and refused if another user does.
//!
//! Leaving: when a [`Group`] is dropped it locks the file, clears its door and, if no
//! other door and no slot of the control block belongs to a live process, unlinks the
//! file. A process that exits normally does the same for every group it still has open
//! (an `atexit` hook), after giving up its own slots, so that two members exiting at
//! once do not each leave the file to the other. A process is alive if `pidfd_open` succeeds, its start time still matches the
//! one recorded (pid reuse), and the pidfd is not readable yet: a zombie is dead.
//!
//! What a hostile member can do (it runs as an admitted user): write anything into the
//! control memfd it maps, as before (peers validate every value they read from it),
//! and truncate, scribble or hold the lock on the named file. That stops new joins (new
//! openers fail, or start a new group if the table no longer names a live door), but
//! existing members keep working, since they map the memfd, not the file. It cannot
//! resize the memfd, seal it against writing, or hand a joiner an unsealed or hugetlb
//! memfd: those are refused. Nor can it make a peer wait by putting something else
//! behind its lot's descriptor number (a FIFO, whose open waits for a writer; a socket, a
//! directory, a device, a file on a file system another process serves; an unsealed
//! memfd it resizes): peers resolve the number with `O_PATH`, which opens nothing, and
//! check that it is a memfd on shmem before they open it (non-blocking) and check its
//! seals and size (see `lot.rs`); anything else is refused with an error that names the
//! member and what the descriptor is. Another user can only squat the name (its file is
//! refused, with a clear error) or plant a link (never followed).
//!
//! Looking without touching (`ferry stat`, [`Group::inspect`]) opens the file
//! read-only without following links, takes no lock, and maps the control block
//! read-only; see [`super::inspect`].

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{Duration, Instant};

use super::access::{open_named, refused, Admission, GroupAccess, Ids};
use super::layout::{ActivityRaw, GroupHeader, LedgerRaw};
pub(crate) use super::layout::{SlotRaw, SLOT_CLAIMING, SLOT_FREE, SLOT_LIVE};
pub use super::layout::{LOT_WINDOWS, MAX_SLOTS, SERVICE_WORDS};
use super::pages::{Pages, HUGE_PAGE};
use crate::error::{Error, Result};
use crate::segment::LotId;
use crate::sys::fd::{
    dup_from, exited, file_len, is_shmem, memfd, memfd_name, pidfd, process_start_time, read_at,
    same_file, try_lock, unlock, write_at,
};
use crate::sys::mem::{Access, Mapping};
use crate::sys::seal::{add_seals, seals, SealFlags};

const MAGIC: u64 = u64::from_le_bytes(*b"FERRYGRP");
const VERSION: u32 = 7;

/// How a group lays out its lots. Only the creator's configuration counts; joiners
/// adopt what the control block says.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Start of the lots' address range in every process: `MAX_SLOTS` (64 member slots) ×
    /// `LOT_WINDOWS` (4) windows of `lot_size` bytes from here must be free in all of them.
    /// `None` picks one from a hash of the group's name, so that one process can belong
    /// to several groups.
    pub base_addr: Option<usize>,
    /// Size of each domain's lot, a page multiple. Lots are sparse memfds: untouched
    /// pages cost nothing.
    pub lot_size: usize,
    /// Who may open the group's named file and be a member: this user only (the
    /// default), or also a Unix group. Unlike the layout, every opener's own policy
    /// counts: a file whose mode or group goes beyond it is refused.
    pub access: GroupAccess,
    /// Join a group whose named file another user owns (and whose doors lead to that
    /// user's processes). Off by default, so that a process (root included) never joins
    /// another user's group, or a squatter's file, without asking to.
    pub allow_foreign_owner: bool,
    /// What pages back every member's lot: 4 KiB shmem pages (the default), the same
    /// collapsed into transparent huge pages for every path that does not say otherwise
    /// ([`PathConfig::pages`](super::PathConfig)), or hugetlb lots of 2 MiB pages from
    /// the reserved pool. The two huge kinds need `lot_size` (and `base_addr`, if given)
    /// to be a multiple of 2 MiB. See [`Pages`].
    pub pages: Pages,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            base_addr: None,
            lot_size: 1 << 30,
            access: GroupAccess::Owner,
            allow_foreign_owner: false,
            pages: Pages::Normal,
        }
    }
}

/// Where groups place their lots when no base address is given: 64 TiB of address space
/// below where position-independent executables and the mmap area usually sit.
const REGION_START: u64 = 0x1000_0000_0000;
const REGION_LEN: u64 = 0x4000_0000_0000;

/// The default base address of group `name` whose lots are `lot_size` bytes.
fn default_base(name: &str, lot_size: u64) -> u64 {
    let span = lot_size * (MAX_SLOTS * LOT_WINDOWS) as u64;
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
    /// This process's copy of the control memfd; its number is in our door.
    _ctl: OwnedFd,
    /// The named file, kept open to clear our door when the group is dropped.
    file: File,
    /// Our entry in the door table, if the table had room.
    door: Option<(usize, Door)>,
    /// Who may be a door or a peer.
    admission: Admission,
    /// Opened to be looked at ([`super::inspect`]): the control block is mapped
    /// read-only, and dropping it writes nothing.
    read_only: bool,
    /// What pages back the lots, read once when the control block was adopted (checked
    /// there): a member that rewrites the header later cannot make this process accept
    /// lots of another kind.
    pages: Pages,
}

/// Size of the control memfd: the header, rounded up to whole pages.
fn control_len() -> usize {
    crate::sys::round_up_pages(std::mem::size_of::<GroupHeader>()).expect("header fits")
}

/// Name of group `name`'s control memfd (checked by joiners, so that a door whose
/// descriptor number was reused for another group's control block is refused).
fn control_name(name: &str) -> String {
    format!("ferry.{name}")
}

/// How long opening waits for the named file's lock before giving up.
const OPEN_PATIENCE: Duration = Duration::from_secs(10);
/// How long dropping a group waits for the lock; past it the door is left (it dies
/// with this process) and the file is not removed.
const DROP_PATIENCE: Duration = Duration::from_secs(2);
/// How often opening starts over because the named file was replaced under it.
const OPEN_TRIES: usize = 100;

impl Group {
    /// Opens the group `name`, creating it with the default configuration if it does not
    /// exist. Its door table lives in `/dev/shm/ferry.<name>`.
    pub fn open(name: &str) -> Result<Arc<Group>> {
        Self::open_with(name, GroupConfig::default())
    }

    /// Opens the group `name`, creating it with `config` if it does not exist.
    ///
    /// The named file `/dev/shm/ferry.<name>` is never followed if it is a symbolic
    /// link, and is checked after it is opened against `config.access` (and
    /// `config.allow_foreign_owner`); a new one gets the policy's mode and group.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a named file that is a link, not a regular file, has
    /// several links, is another user's (unless allowed), grants more than the policy,
    /// or is another user's garbage; also when the live member a door leads to runs as
    /// a user the policy does not admit. [`Error::BadGroup`] if the table names live
    /// members but none of their control blocks can be taken (for instance
    /// `pidfd_getfd` needs ptrace rights over the member: the same user with
    /// `kernel.yama.ptrace_scope` 0, or `CAP_SYS_PTRACE`): opening never starts a second
    /// group of the same name beside a live one.
    pub fn open_with(name: &str, config: GroupConfig) -> Result<Arc<Group>> {
        if name.is_empty() || name.contains('/') || name.contains('\0') || name.len() > 200 {
            return Err(Error::InvalidArgument(
                "group name must be 1..200 chars, no '/'",
            ));
        }
        if config.lot_size == 0 || config.lot_size % crate::sys::page_size() != 0 {
            return Err(Error::InvalidArgument(
                "lot size must be a non-zero page multiple",
            ));
        }
        if config.pages != Pages::Normal
            && (config.lot_size % HUGE_PAGE != 0
                || config.base_addr.is_some_and(|a| a % HUGE_PAGE != 0))
        {
            return Err(Error::InvalidArgument(
                "huge-page lots (Pages::Transparent, Pages::HugeTlb) need a lot size and a \
                 base address that are multiples of 2 MiB",
            ));
        }
        let path = named_path(name);
        let me = Door {
            pid: std::process::id(),
            fd: 0,
            start: process_start_time(std::process::id())?,
        };
        let ids = Ids::mine()?;
        for _ in 0..OPEN_TRIES {
            let named = open_named(&path, &ids, config.access, config.allow_foreign_owner)?;
            let file = File::from(named.fd);
            let Some(lock) = Locked::take(&file, OPEN_PATIENCE)? else {
                return Err(Error::BadGroup(format!(
                    "{} stayed locked for {} s (another process holds its flock)",
                    path.display(),
                    OPEN_PATIENCE.as_secs()
                )));
            };
            if !same_file(file.as_fd(), &path)? {
                // A last member unlinked it after we opened it: open what is there now.
                continue;
            }
            let (mut doors, fresh) = match read_table(file.as_fd())? {
                DoorTable::Valid(doors) => (doors, false),
                DoorTable::Empty => (vec![Door::default(); DOORS], true),
                DoorTable::Invalid if named.st.st_uid == ids.uid => {
                    // Ours, but not a door table: maybe garbage, maybe a control block an
                    // older ferry maps. Leave its inode alone and start a new file.
                    crate::sys::count();
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                DoorTable::Invalid => {
                    return Err(refused(
                        &path,
                        format!(
                            "it is not a ferry door table ({} bytes) and belongs to uid {}, \
                             so it is not ours to remove",
                            named.st.st_size, named.st.st_uid
                        ),
                    ))
                }
            };
            let admission = Admission {
                me: ids.uid,
                owner: named.st.st_uid,
                gid: match config.access {
                    GroupAccess::Owner => None,
                    GroupAccess::UnixGroup(g) => Some(g),
                },
            };
            let (found, spare, failed) = find_control(&doors, name, &admission, Access::ReadWrite);
            let (ctl, map) = match (found, failed) {
                (Some(v), _) => v,
                (None, Some(why)) => {
                    return Err(Error::BadGroup(format!(
                        "{}: {why}; not starting a second group of the same name",
                        path.display()
                    )))
                }
                (None, None) => match create(name, &config) {
                    Ok(v) => v,
                    Err(e) => {
                        // Out of descriptors or memory, say. A file that we found empty
                        // (or made) holds no one's door, and under its lock no one is
                        // writing one: leave no litter. An opener waiting for the lock
                        // finds the path unlinked and starts over.
                        if fresh {
                            crate::sys::count();
                            let _ = std::fs::remove_file(&path);
                        }
                        return Err(e);
                    }
                },
            };
            let mine = Door {
                fd: ctl.as_raw_fd() as u32,
                ..me
            };
            let door = spare.and_then(|i| {
                doors[i] = mine;
                let written = if fresh {
                    write_table(file.as_fd(), &doors)
                } else {
                    write_door(file.as_fd(), i, mine)
                };
                written.ok().map(|()| (i, mine))
            });
            drop(lock);
            let g = Arc::new(Group {
                name: name.to_owned(),
                path,
                pages: Pages::from_raw(header_of(&map).pages).unwrap_or_default(),
                map,
                _ctl: ctl,
                file,
                door,
                admission,
                read_only: false,
            });
            register_open(&g);
            return Ok(g);
        }
        Err(Error::BadGroup(format!(
            "{} was replaced {OPEN_TRIES} times while opening",
            path.display()
        )))
    }

    pub(crate) fn header(&self) -> &GroupHeader {
        header_of(&self.map)
    }

    /// Opens the group behind the named file `file` read-only, for looking at: the
    /// control block of the first live, admitted door is mapped read-only. No lock is
    /// taken and nothing is written, now or on drop. `Ok(None)` if no door is live.
    pub(crate) fn look(
        name: &str,
        path: PathBuf,
        file: File,
        admission: Admission,
    ) -> std::result::Result<Option<Group>, String> {
        // Read without the lock: a writer may be midway; a table that does not parse, or
        // a door that leads nowhere, is read again a few times.
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let doors = match read_table(file.as_fd()) {
                Ok(DoorTable::Valid(doors)) => doors,
                Ok(_) => {
                    last = "it is not a door table".to_owned();
                    continue;
                }
                Err(e) => return Err(format!("cannot read it: {e}")),
            };
            match find_control(&doors, name, &admission, Access::Read) {
                (Some((ctl, map)), _, _) => {
                    return Ok(Some(Group {
                        name: name.to_owned(),
                        path,
                        pages: Pages::from_raw(header_of(&map).pages).unwrap_or_default(),
                        map,
                        _ctl: ctl,
                        file,
                        door: None,
                        admission,
                        read_only: true,
                    }))
                }
                (None, _, Some(why)) => last = why,
                (None, _, None) => return Ok(None),
            }
        }
        Err(last)
    }

    /// Ok if process `pid` runs as a user this group admits; [`Error::Untrusted`] if not.
    pub(crate) fn admit(&self, pid: u32) -> Result<()> {
        self.admission
            .check(pid)
            .map_err(|why| refused(&self.path, format!("member pid {pid}: {why}")))
    }

    /// True if this group was opened to be looked at: its control block is mapped
    /// read-only.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn slot(&self, i: u16) -> &SlotRaw {
        &self.header().slots[i as usize]
    }

    /// Slot `i`'s reference ledger.
    pub(crate) fn ledger(&self, i: u16) -> &LedgerRaw {
        &self.header().ledgers[i as usize]
    }

    /// Slot `i`'s activity area (its paths and sending channels).
    pub(crate) fn activity_area(&self, i: u16) -> &ActivityRaw {
        &self.header().activity[i as usize]
    }

    /// The words of the control block's service area (laid out by `crate::service`).
    pub(crate) fn service_words(&self) -> &[AtomicU32; SERVICE_WORDS] {
        &self.header().services.0
    }

    /// The live domain in slot `slot` whose generation's low 24 bits are `gen24`, if
    /// there is one (service members are recorded with 24 bits of generation).
    pub(crate) fn live_domain_like(&self, slot: u16, gen24: u32) -> Option<Member> {
        if slot as usize >= MAX_SLOTS {
            return None;
        }
        let s = self.slot(slot);
        let generation = s.generation.load(Ordering::Acquire);
        let id = LotId { slot, generation };
        (generation & 0x00ff_ffff == gen24 && self.domain_live(id)).then(|| Member {
            id: DomainId { slot, generation },
            pid: s.pid.load(Ordering::Relaxed),
        })
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
            && pid_alive(
                s.pid.load(Ordering::Relaxed),
                s.start_time.load(Ordering::Relaxed),
            )
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Path of the group's named file, `/dev/shm/ferry.<name>`: the door table through
    /// which processes find the control block (itself a memfd, with no path).
    pub fn file_path(&self) -> &std::path::Path {
        &self.path
    }

    /// Size of every lot in the group.
    pub fn lot_size(&self) -> usize {
        self.header().lot_size as usize
    }

    /// What pages back the group's lots (its creator's [`GroupConfig::pages`]).
    pub fn pages(&self) -> Pages {
        self.pages
    }

    /// Address of slot `i`'s lot in every process of the group: the slot's window that
    /// its current (or last) domain uses.
    pub fn lot_addr(&self, i: u16) -> usize {
        let w = self.slot(i).window.load(Ordering::Acquire) as usize % LOT_WINDOWS;
        self.window_addr(i, w)
    }

    /// Address of window `w` of slot `i`.
    pub(crate) fn window_addr(&self, i: u16, w: usize) -> usize {
        let h = self.header();
        (h.base_addr + h.lot_stride * (i as usize * LOT_WINDOWS + w) as u64) as usize
    }

    /// The addresses all windows of slot `i` span.
    pub fn slot_range(&self, i: u16) -> std::ops::Range<usize> {
        self.window_addr(i, 0)..self.window_addr(i + 1, 0)
    }

    /// The addresses all lots of the group may occupy.
    pub fn lots_range(&self) -> std::ops::Range<usize> {
        self.window_addr(0, 0)..self.window_addr(MAX_SLOTS as u16, 0)
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
                pid_alive(pid, s.start_time.load(Ordering::Relaxed)).then_some(Member {
                    id: DomainId {
                        slot: i,
                        generation,
                    },
                    pid,
                })
            })
            .collect()
    }

    /// Claims a slot for this process: a free one, or one whose domain died. Returns the
    /// slot index, its new generation and the window to try first for its lot (the one
    /// after the previous domain's); the slot is left in `SLOT_CLAIMING`.
    pub(crate) fn claim_slot(&self) -> Result<(u16, u32, usize)> {
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
                    if pid_alive(pid, s.start_time.load(Ordering::Relaxed)) {
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
                // Before the generation moves on, note whether the previous owner died
                // holding forwarded fragments: a quarantine elsewhere may still ask.
                let old = s.generation.load(Ordering::Acquire);
                self.ledger(i).note_previous(old);
                let generation = s.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                s.pid.store(me, Ordering::Relaxed);
                s.start_time.store(start, Ordering::Relaxed);
                for o in &s.offers {
                    o.reset();
                }
                // A dead previous owner's holds and channels mean nothing now.
                self.ledger(i).clear();
                self.activity_area(i).clear();
                let next = (s.window.load(Ordering::Acquire) as usize + 1) % LOT_WINDOWS;
                return Ok((i, generation, next));
            }
        }
        Err(Error::GroupFull)
    }

    /// Publishes a claimed slot as live with its lot descriptor and window.
    pub(crate) fn publish_slot(&self, i: u16, lot_fd: i32, window: usize) {
        let s = self.slot(i);
        s.lot_fd.store(lot_fd as u32, Ordering::Relaxed);
        s.window.store(window as u32, Ordering::Relaxed);
        // SYNC: pairs with the Acquire loads of `state` by peers mapping this lot.
        s.state.store(SLOT_LIVE, Ordering::Release);
    }

    /// Gives a slot back. The named file goes when the last [`Group`] holding a door or
    /// a live slot is dropped (see [`Drop`] for `Group`), not here: this process may
    /// still hold the group and join it again.
    pub(crate) fn release_slot(&self, i: u16, generation: u32) {
        let s = self.slot(i);
        if s.generation.load(Ordering::Acquire) == generation
            && s.pid.load(Ordering::Relaxed) == std::process::id()
        {
            s.pid.store(0, Ordering::Relaxed);
            s.state.store(SLOT_FREE, Ordering::Release);
        }
    }

    /// True if some slot of the control block belongs to a live process.
    fn any_slot_held(&self) -> bool {
        self.header().slots.iter().any(|s| {
            s.state.load(Ordering::Acquire) != SLOT_FREE
                && pid_alive(
                    s.pid.load(Ordering::Relaxed),
                    s.start_time.load(Ordering::Relaxed),
                )
        })
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
        let fd = match live_pidfd(pid, s.start_time.load(Ordering::Relaxed)) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Err(Error::PeerGone { pid }),
            Err(e) => return Err(e.into()),
        };
        // Re-check after opening: the pidfd must name the process that owns the slot.
        if s.generation.load(Ordering::Acquire) != id.generation
            || s.pid.load(Ordering::Relaxed) != pid
        {
            return Err(Error::PeerGone { pid });
        }
        // Its descriptors are taken through this pidfd, so they are this process's:
        // it must run as a user the group admits.
        self.admit(pid)?;
        Ok((pid, fd))
    }
}

impl Drop for Group {
    /// Clears this process's door and, if no other door and no slot belongs to a live
    /// process, removes the named file.
    fn drop(&mut self) {
        self.leave(false);
    }
}

/// Groups open in this process, for [`leave_at_exit`].
static OPEN_GROUPS: Mutex<Vec<Weak<Group>>> = Mutex::new(Vec::new());

/// Remembers `g` so that this process leaves it when it exits.
fn register_open(g: &Arc<Group>) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: atexit(3) takes a plain `extern "C" fn()` with no preconditions; the
        // handler only takes a lock and makes system calls.
        unsafe {
            libc::atexit(leave_at_exit);
        }
    });
    let mut v = OPEN_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
    v.retain(|w| w.strong_count() > 0);
    v.push(Arc::downgrade(g));
}

/// Runs when this process exits normally (returning from `main` or `exit(3)`), where no
/// destructor runs: leaves every group still open here, as if its domains had died, so
/// that the last member to go removes the named file even when two members exit at the
/// same moment and each saw the other still alive while leaving. A process killed by a
/// signal cannot do this; the next process to open the group then finds the stale file.
extern "C" fn leave_at_exit() {
    let groups: Vec<Arc<Group>> = OPEN_GROUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for g in groups {
        g.leave(true);
    }
}

impl Group {
    /// Clears this process's door and, if no other door and no slot belongs to a live
    /// process, removes the named file. With `exiting`, this process is about to exit:
    /// its own slots are given up first (they would be dead in a moment anyway).
    fn leave(&self, exiting: bool) {
        if self.read_only {
            return;
        }
        let Ok(Some(_lock)) = Locked::take(&self.file, DROP_PATIENCE) else {
            return;
        };
        if exiting {
            let me = std::process::id();
            for s in &self.header().slots {
                if s.state.load(Ordering::Acquire) == SLOT_LIVE
                    && s.pid.load(Ordering::Relaxed) == me
                {
                    s.pid.store(0, Ordering::Relaxed);
                    s.state.store(SLOT_FREE, Ordering::Release);
                }
            }
        }
        let mut doors = match read_table(self.file.as_fd()) {
            Ok(DoorTable::Valid(doors)) => doors,
            _ => Vec::new(),
        };
        if let Some((i, mine)) = self.door {
            // Only if it is still ours: a table someone rewrote may hold another there.
            if doors.get(i) == Some(&mine) {
                doors[i] = Door::default();
                let _ = write_door(self.file.as_fd(), i, Door::default());
            }
        }
        if !same_file(self.file.as_fd(), &self.path).unwrap_or(false) {
            // The path names another group's file now (or none): not ours to remove.
            return;
        }
        // Another user's file (a group shared with us, or joined with
        // `allow_foreign_owner`) is theirs to remove: left stale, it is reused by the next
        // opener, or removed by its owner's `ferry clean`.
        if self.admission.owner != self.admission.me {
            return;
        }
        let other_door = doors.iter().any(|d| pid_alive(d.pid, d.start));
        if !other_door && !self.any_slot_held() {
            crate::sys::count();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A pidfd for the process recorded as `pid` with start time `start` if it is alive,
/// `Ok(None)` if it is dead: `pidfd_open` fails with `ESRCH` once it has been reaped; a
/// start time that differs means the pid now names another process; a readable pidfd
/// means it has exited, so a zombie nobody reaped yet is dead. `Err` if that cannot be
/// told (out of descriptors, say): callers then treat it as alive, so that no live
/// member loses its slot or its group's file to a failed call.
///
/// This is the one liveness test for everything recorded in a group: slots, doors, and
/// the peers whose lots are mapped here.
pub(crate) fn live_pidfd(pid: u32, start: u64) -> io::Result<Option<OwnedFd>> {
    if pid == 0 {
        return Ok(None);
    }
    let gone = |e: &io::Error| {
        e.kind() == io::ErrorKind::NotFound
            // EINVAL: the number names a thread now, not a process.
            || matches!(e.raw_os_error(), Some(libc::ESRCH | libc::EINVAL))
    };
    let fd = match pidfd(pid) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    // The start time is read after the pidfd is open, so the pidfd names the process
    // whose start time we compare (the pid cannot have been reused in between without
    // the start time changing).
    match process_start_time(pid) {
        Ok(t) if t == start => {}
        Ok(_) => return Ok(None),
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    }
    if exited(fd.as_fd()) {
        return Ok(None);
    }
    Ok(Some(fd))
}

/// False only if the process recorded as (`pid`, `start`) is known to be dead; see
/// [`live_pidfd`].
pub(crate) fn pid_alive(pid: u32, start: u64) -> bool {
    !matches!(live_pidfd(pid, start), Ok(None))
}

/// The group header at the start of a control block mapping.
fn header_of(map: &Mapping) -> &GroupHeader {
    debug_assert!(map.len() >= std::mem::size_of::<GroupHeader>());
    // SAFETY: every control block mapping is `control_len()` bytes, at least
    // size_of::<GroupHeader>(), page aligned, and lives as long as the borrow; other
    // processes change only its atomic fields (plain fields are set once before `magic`
    // is published, and the memfd is sealed against shrinking, so the pages stay).
    unsafe { &*map.as_ptr().cast::<GroupHeader>() }
}

/// Maps a control memfd after checking what the seals promise: a shmem memfd named for
/// group `name`, sealed against shrinking and growing and not against writing, of
/// exactly `control_len()` bytes. Seals are checked before the size, since only they
/// keep the size from changing afterwards.
fn map_control(fd: BorrowedFd<'_>, name: &str, access: Access) -> Result<Mapping> {
    let bad = |why: &str| Error::BadGroup(format!("control block of {name}: {why}"));
    let sealed = seals(fd).map_err(|_| bad("not a memfd"))?;
    if !sealed.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(bad("not sealed against resizing"));
    }
    if sealed.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
        return Err(bad("sealed against writing"));
    }
    if !is_shmem(fd)? {
        return Err(bad("not on shmem"));
    }
    if memfd_name(fd)?.as_deref() != Some(control_name(name).as_str()) {
        return Err(bad("memfd of another name"));
    }
    let len = control_len();
    if file_len(fd)? != len as u64 {
        return Err(bad("wrong size"));
    }
    Ok(Mapping::shared(fd, len, access)?)
}

/// Creates, seals and initialises a new control block for group `name`.
fn create(name: &str, config: &GroupConfig) -> Result<(OwnedFd, Mapping)> {
    let fd = memfd(&control_name(name), control_len() as u64)?;
    add_seals(
        fd.as_fd(),
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    let map = map_control(fd.as_fd(), name, Access::ReadWrite)?;
    let h = map.as_ptr().cast::<GroupHeader>();
    // SAFETY: the memfd is new and not yet in any door, so no other process can see it;
    // the mapping is control_len() >= size_of::<GroupHeader>() bytes, page aligned, and
    // reads as zeros (a valid GroupHeader: all atomics and integers). Plain fields are
    // written before `magic` is published.
    unsafe {
        (*h).version = VERSION;
        (*h).max_slots = MAX_SLOTS as u32;
        (*h).base_addr = match config.base_addr {
            Some(a) => a as u64,
            None => default_base(name, config.lot_size as u64),
        };
        (*h).lot_size = config.lot_size as u64;
        (*h).lot_stride = config.lot_size as u64;
        (*h).pages = config.pages.raw();
    }
    // SYNC: pairs with the Acquire load of `magic` in `adopt`.
    header_of(&map).magic.store(MAGIC, Ordering::Release);
    Ok((fd, map))
}

/// Looks through `doors` for the group's control block: the first live door whose
/// process the group admits and whose descriptor is a valid control block of `name`,
/// mapped with `access`. Returns it, the first dead (free) door, and, if no door led to
/// a control block but some door is (or may be) live, why the first such failed.
#[allow(clippy::type_complexity)]
fn find_control(
    doors: &[Door],
    name: &str,
    admission: &Admission,
    access: Access,
) -> (Option<(OwnedFd, Mapping)>, Option<usize>, Option<String>) {
    let mut found = None;
    let mut spare = None;
    let mut failed = None;
    for (i, d) in doors.iter().enumerate() {
        if found.is_some() && spare.is_some() {
            break;
        }
        match live_pidfd(d.pid, d.start) {
            Ok(None) => {
                spare.get_or_insert(i);
            }
            Ok(Some(pfd)) if found.is_none() => {
                let got = admission
                    .check(d.pid)
                    .and_then(|()| adopt(pfd.as_fd(), d.fd, name, access).map_err(explain));
                match got {
                    Ok(v) => found = Some(v),
                    Err(why) => {
                        failed.get_or_insert(format!(
                            "its live member pid {} (door {i}) cannot be joined: {why}",
                            d.pid
                        ));
                    }
                }
            }
            // Alive or not known dead: not ours to overwrite.
            Err(e) if found.is_none() => {
                failed.get_or_insert(format!(
                    "cannot tell whether member pid {} (door {i}) is alive: {e}",
                    d.pid
                ));
            }
            _ => {}
        }
    }
    if found.is_some() {
        failed = None;
    }
    (found, spare, failed)
}

/// Why adopting a door's control block failed, with a hint where the cause is the
/// usual one.
fn explain(e: Error) -> String {
    match &e {
        Error::Io(io) if io.raw_os_error() == Some(libc::EPERM) => format!(
            "{e} (taking its descriptor with pidfd_getfd needs ptrace rights over it: the \
             same user with kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE)"
        ),
        _ => e.to_string(),
    }
}

/// Path of group `name`'s named file.
pub(crate) fn named_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ferry.{name}"))
}

/// Takes descriptor `target` of the door process behind `pidfd` and maps it (with
/// `access`) if it is a valid control block of group `name`.
fn adopt(
    pidfd: BorrowedFd<'_>,
    target: u32,
    name: &str,
    access: Access,
) -> Result<(OwnedFd, Mapping)> {
    let fd = dup_from(pidfd, target as i32)?;
    let map = map_control(fd.as_fd(), name, access)?;
    let h = header_of(&map);
    // SYNC: pairs with the creator's Release store of `magic` in `create`.
    if h.magic.load(Ordering::Acquire) != MAGIC {
        return Err(Error::BadGroup(format!("{name} has no ferry header")));
    }
    if h.version != VERSION || h.max_slots as usize != MAX_SLOTS {
        return Err(Error::BadGroup(format!(
            "version {} (want {VERSION})",
            h.version
        )));
    }
    let end = (h.base_addr as u128) + (h.lot_stride as u128) * (MAX_SLOTS * LOT_WINDOWS) as u128;
    if h.lot_size == 0 || h.lot_stride < h.lot_size || end > (1u128 << 47) {
        return Err(Error::BadGroup("lot geometry out of range".into()));
    }
    let huge = HUGE_PAGE as u64;
    match Pages::from_raw(h.pages) {
        None => return Err(Error::BadGroup(format!("unknown page kind {}", h.pages))),
        Some(Pages::Normal) => {}
        Some(_)
            if h.base_addr % huge != 0 || h.lot_stride % huge != 0 || h.lot_size % huge != 0 =>
        {
            return Err(Error::BadGroup(
                "huge-page lots whose geometry is not 2 MiB-aligned".into(),
            ))
        }
        Some(_) => {}
    }
    Ok((fd, map))
}

// ---------------------------------------------------------------- the door table

const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"FERRYDOR");
const TABLE_VERSION: u32 = 1;
/// Doors in a table: the table fills one 4 KiB file.
pub(crate) const DOORS: usize = 255;
const TABLE_HEAD: usize = 16;
const DOOR_LEN: usize = 16;
pub(crate) const TABLE_LEN: usize = TABLE_HEAD + DOORS * DOOR_LEN;

/// One door: a process that has the group open, and the descriptor number of its copy
/// of the control memfd. Stored as pid (u32), fd (u32), start time (u64), native endian.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Door {
    pub pid: u32,
    pub fd: u32,
    pub start: u64,
}

impl Door {
    fn encode(self) -> [u8; DOOR_LEN] {
        let mut b = [0u8; DOOR_LEN];
        b[0..4].copy_from_slice(&self.pid.to_ne_bytes());
        b[4..8].copy_from_slice(&self.fd.to_ne_bytes());
        b[8..16].copy_from_slice(&self.start.to_ne_bytes());
        b
    }

    fn decode(b: &[u8]) -> Door {
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Door {
            pid: u32_at(0),
            fd: u32_at(4),
            start: u64::from_ne_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }
}

/// What a named file holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DoorTable {
    /// A door table.
    Valid(Vec<Door>),
    /// Nothing yet: a file just created.
    Empty,
    /// Anything else: wrong size, magic, version or door count.
    Invalid,
}

/// Decodes the bytes of a named file.
pub(crate) fn parse_table(b: &[u8]) -> DoorTable {
    if b.is_empty() {
        return DoorTable::Empty;
    }
    if b.len() != TABLE_LEN
        || b[0..8] != TABLE_MAGIC.to_ne_bytes()
        || b[8..12] != TABLE_VERSION.to_ne_bytes()
        || b[12..16] != (DOORS as u32).to_ne_bytes()
    {
        return DoorTable::Invalid;
    }
    DoorTable::Valid(
        b[TABLE_HEAD..]
            .chunks_exact(DOOR_LEN)
            .map(Door::decode)
            .collect(),
    )
}

/// Reads the named file open as `fd` (`pread`; one byte more than a table, to notice a
/// longer file).
pub(crate) fn read_table(fd: BorrowedFd<'_>) -> io::Result<DoorTable> {
    let mut buf = vec![0u8; TABLE_LEN + 1];
    let n = read_at(fd, &mut buf, 0)?;
    Ok(parse_table(&buf[..n]))
}

/// Writes a whole table holding `doors` (`pwrite`, then `ftruncate` to its size).
fn write_table(fd: BorrowedFd<'_>, doors: &[Door]) -> io::Result<()> {
    let mut b = Vec::with_capacity(TABLE_LEN);
    b.extend_from_slice(&TABLE_MAGIC.to_ne_bytes());
    b.extend_from_slice(&TABLE_VERSION.to_ne_bytes());
    b.extend_from_slice(&(DOORS as u32).to_ne_bytes());
    for d in doors.iter().take(DOORS) {
        b.extend_from_slice(&d.encode());
    }
    b.resize(TABLE_LEN, 0);
    write_at(fd, &b, 0)?;
    crate::sys::count();
    rustix::fs::ftruncate(fd, TABLE_LEN as u64)?;
    Ok(())
}

/// Writes door `i` of the table (`pwrite`).
fn write_door(fd: BorrowedFd<'_>, i: usize, door: Door) -> io::Result<()> {
    write_at(fd, &door.encode(), (TABLE_HEAD + i * DOOR_LEN) as u64)
}

/// The named file's `flock`, held until dropped.
pub(crate) struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    /// Takes the lock, retrying for up to `patience`; `None` if someone held it that long.
    pub(crate) fn take(file: &'a File, patience: Duration) -> io::Result<Option<Self>> {
        let deadline = Instant::now() + patience;
        loop {
            if try_lock(file.as_fd())? {
                return Ok(Some(Locked(file)));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        unlock(self.0.as_fd());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(
            std::mem::size_of::<SlotRaw>(),
            (28 + std::mem::size_of::<super::super::layout::OfferRaw>()
                * super::super::layout::MAX_OFFERS)
                .next_multiple_of(8)
        );
        assert_eq!(std::mem::offset_of!(GroupHeader, offer_seq), 40);
        assert_eq!(std::mem::offset_of!(GroupHeader, slots), 48);
        // The service area is cache-line aligned, and so the header (its mapping is
        // page-aligned).
        assert_eq!(std::mem::align_of::<GroupHeader>(), 64);
        assert_eq!(std::mem::offset_of!(GroupHeader, services) % 64, 0);
        assert_eq!(
            std::mem::size_of::<super::super::layout::ServiceArea>(),
            SERVICE_WORDS * std::mem::size_of::<AtomicU32>()
        );
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

    /// A memfd dressed up as a control block: `len` bytes, created with memfd name
    /// `mname`, a valid header whose lots start at `base`, then `seal`ed.
    fn fake_control(mname: &str, len: usize, seal: SealFlags, base: u64) -> OwnedFd {
        use std::mem::offset_of;
        let fd = memfd(mname, len as u64).unwrap();
        let put = |off: usize, b: &[u8]| write_at(fd.as_fd(), b, off as u64).unwrap();
        put(offset_of!(GroupHeader, version), &VERSION.to_ne_bytes());
        put(
            offset_of!(GroupHeader, max_slots),
            &(MAX_SLOTS as u32).to_ne_bytes(),
        );
        put(offset_of!(GroupHeader, base_addr), &base.to_ne_bytes());
        put(
            offset_of!(GroupHeader, lot_stride),
            &(1u64 << 30).to_ne_bytes(),
        );
        put(
            offset_of!(GroupHeader, lot_size),
            &(1u64 << 30).to_ne_bytes(),
        );
        put(offset_of!(GroupHeader, magic), &MAGIC.to_ne_bytes());
        if !seal.is_empty() {
            add_seals(fd.as_fd(), seal).unwrap();
        }
        fd
    }

    /// True if a memfd with the inode of `fd` is mapped in this process.
    fn mapped(fd: BorrowedFd<'_>) -> bool {
        let ino = rustix::fs::fstat(fd).unwrap().st_ino.to_string();
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .any(|l| l.contains("/memfd:") && l.split_whitespace().nth(4) == Some(&ino))
    }

    fn me() -> Door {
        Door {
            pid: std::process::id(),
            fd: 0,
            start: process_start_time(std::process::id()).unwrap(),
        }
    }

    fn write_named(path: &std::path::Path, doors: &[Door]) {
        use std::os::unix::fs::OpenOptionsExt;
        let f = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        write_table(f.as_fd(), doors).unwrap();
    }

    /// Doors (of a live process: this one) that lead to control blocks which are not
    /// sealed, of the wrong size, another group's, on another file system, or not
    /// there at all are refused and never stay mapped; with no valid door, opening
    /// fails (naming the first door) rather than start a second group beside a live
    /// member. A valid door after them is found.
    #[test]
    fn doors_to_bad_control_blocks_are_refused() {
        let name = format!("unit-doors-{}", std::process::id());
        let path = PathBuf::from(format!("/dev/shm/ferry.{name}"));
        let (len, right, p) = (control_len(), control_name(&name), crate::sys::page_size());
        let ok = SealFlags::SHRINK | SealFlags::GROW;
        let base = |k: u64| 0x2000_0000_0000 + (k << 40);
        let plain = path.with_file_name(format!("ferry-unit-plain-{}", std::process::id()));
        let plain_file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&plain)
            .unwrap();
        plain_file.set_len(len as u64).unwrap();
        std::fs::remove_file(&plain).unwrap();
        let fakes: Vec<(&str, OwnedFd)> = vec![
            (
                "unsealed",
                fake_control(&right, len, SealFlags::empty(), base(0)),
            ),
            (
                "shrink-only",
                fake_control(&right, len, SealFlags::SHRINK, base(1)),
            ),
            ("a page long", fake_control(&right, len + p, ok, base(2))),
            ("a page short", fake_control(&right, len - p, ok, base(3))),
            (
                "another group's",
                fake_control("ferry.other", len, ok, base(4)),
            ),
            (
                "write-sealed",
                fake_control(&right, len, ok | SealFlags::FUTURE_WRITE, base(5)),
            ),
            ("tmpfs file", plain_file.into()),
        ];
        let mut doors: Vec<Door> = fakes
            .iter()
            .map(|(_, fd)| Door {
                fd: fd.as_raw_fd() as u32,
                ..me()
            })
            .collect();
        // A descriptor number that is not open, and doors of processes that are gone.
        doors.push(Door {
            fd: 999_999,
            ..me()
        });
        doors.push(Door {
            pid: u32::MAX,
            ..me()
        });
        doors.push(Door {
            start: me().start + 1,
            ..me()
        });
        write_named(&path, &doors);
        let before = std::fs::read(&path).unwrap();
        let err = Group::open(&name).unwrap_err().to_string();
        assert!(
            err.contains(&format!("member pid {} (door 0)", std::process::id()))
                && err.contains("not starting a second group"),
            "{err}"
        );
        for (what, fd) in &fakes {
            assert!(!mapped(fd.as_fd()), "{what} control block is mapped");
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the table was written"
        );

        // The same doors with a valid one last (made like the fakes): that one is the
        // group.
        let good = fake_control(&right, len, ok, base(6));
        doors.push(Door {
            fd: good.as_raw_fd() as u32,
            ..me()
        });
        write_named(&path, &doors);
        let g = Group::open(&name).unwrap();
        assert_eq!(g.lot_addr(0), base(6) as usize, "the valid door was missed");
        for (what, fd) in &fakes {
            assert!(!mapped(fd.as_fd()), "{what} control block is mapped");
        }
        drop(g);
        // Our fake doors name this live process, so dropping the group left the file.
        std::fs::remove_file(&path).unwrap();
    }

    /// Doors with a valid table head but garbage entries, some naming this process's
    /// real descriptors (stdio, test harness files), are survived without a crash or a
    /// mapping: opening fails, since a live process's door leads nowhere.
    #[test]
    fn garbage_doors_are_refused() {
        let name = format!("unit-garbage-doors-{}", std::process::id());
        let path = PathBuf::from(format!("/dev/shm/ferry.{name}"));
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut doors: Vec<Door> = (0..64).map(|fd| Door { fd, ..me() }).collect();
        doors.extend((0..DOORS - 64).map(|_| Door {
            pid: next() as u32,
            fd: next() as u32,
            start: next(),
        }));
        write_named(&path, &doors);
        let err = Group::open(&name).unwrap_err().to_string();
        assert!(err.contains("cannot be joined"), "{err}");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.contains(&format!("memfd:ferry.{name}")), "{maps}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn door_tables_round_trip_and_garbage_is_invalid() {
        assert_eq!(parse_table(&[]), DoorTable::Empty);
        let mut rng = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for len in [
            1,
            15,
            16,
            17,
            TABLE_LEN - 1,
            TABLE_LEN,
            TABLE_LEN + 1,
            20_000,
        ] {
            for _ in 0..20 {
                let b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                assert_eq!(parse_table(&b), DoorTable::Invalid, "{len} garbage bytes");
            }
        }
        let doors: Vec<Door> = (0..DOORS)
            .map(|_| Door {
                pid: next() as u32,
                fd: next() as u32,
                start: next(),
            })
            .collect();
        let fd = memfd("unit-table", 0).unwrap();
        write_table(fd.as_fd(), &doors).unwrap();
        assert_eq!(file_len(fd.as_fd()).unwrap(), TABLE_LEN as u64);
        assert_eq!(
            read_table(fd.as_fd()).unwrap(),
            DoorTable::Valid(doors.clone())
        );
        write_door(fd.as_fd(), 7, Door::default()).unwrap();
        let DoorTable::Valid(back) = read_table(fd.as_fd()).unwrap() else {
            panic!("table lost")
        };
        assert_eq!(back[7], Door::default());
        assert_eq!(back[8], doors[8]);
        // A table with a byte more, or less, is not a table.
        rustix::fs::ftruncate(&fd, TABLE_LEN as u64 + 1).unwrap();
        assert_eq!(read_table(fd.as_fd()).unwrap(), DoorTable::Invalid);
        rustix::fs::ftruncate(&fd, TABLE_LEN as u64 - 1).unwrap();
        assert_eq!(read_table(fd.as_fd()).unwrap(), DoorTable::Invalid);
    }

    #[test]
    fn control_block_is_sealed_and_sized() {
        let name = format!("unit-sealed-{}", std::process::id());
        let (fd, map) = create(&name, &GroupConfig::default()).unwrap();
        let s = seals(fd.as_fd()).unwrap();
        assert!(s.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert_eq!(file_len(fd.as_fd()).unwrap(), control_len() as u64);
        assert_eq!(map.len() % crate::sys::page_size(), 0);
        assert!(map.len() >= std::mem::size_of::<GroupHeader>());
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }

    /// Only shmem memfds pass as control blocks: a hugetlb memfd's faults can fail
    /// (SIGBUS when no huge page is free). Its size cannot match a control block's
    /// either, so this checks the test itself.
    #[test]
    fn hugetlb_memfds_are_not_shmem() {
        use rustix::fs::{memfd_create, MemfdFlags};
        let small = memfd("unit-shmem", 4096).unwrap();
        assert!(is_shmem(small.as_fd()).unwrap());
        let huge = match memfd_create("unit-huge", MemfdFlags::HUGETLB) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("skipped: no hugetlb memfds ({e})");
                return;
            }
        };
        assert!(!is_shmem(huge.as_fd()).unwrap());
    }

    #[test]
    fn zombies_and_strangers_are_not_alive() {
        let me = me();
        assert!(pid_alive(me.pid, me.start));
        assert!(!pid_alive(me.pid, me.start + 1), "pid reuse");
        assert!(!pid_alive(0, 0));
        assert!(!pid_alive(u32::MAX, 0));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = process_start_time(pid).unwrap();
        // Wait for it to exit without reaping it.
        let pfd = pidfd(pid).unwrap();
        crate::sys::fd::wait_readable(&[pfd.as_fd()], Some(Duration::from_secs(10))).unwrap();
        assert_eq!(process_start_time(pid).unwrap(), start, "still a zombie");
        assert!(!pid_alive(pid, start), "a zombie counts as alive");
        child.wait().unwrap();
        assert!(!pid_alive(pid, start));
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(matches!(Group::open("a/b"), Err(Error::InvalidArgument(_))));
        assert!(matches!(Group::open(""), Err(Error::InvalidArgument(_))));
    }
}
